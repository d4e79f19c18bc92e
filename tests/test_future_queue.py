"""The queue that runs the torch engines' protocols behind futures (gcodec.torch.comm.FutureQueue):
submission order, ``start_here``: an idle queue runs a protocol on the calling thread up to its
first collective, the queue's thread the rest; a busy one runs it all on its thread, after the
protocols before it; and ``finish_here``: an idle queue runs it all on the calling thread. No
process group is needed: the works here are events the test sets."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("torch")

from gcodec.errors import ConfigError
from gcodec.torch.comm import FutureQueue
from gcodec.transports import Work


class Gate(Work):
    """A collective that completes when the test opens it."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log, self.event = name, log, threading.Event()

    def test(self) -> bool:
        return self.event.is_set()

    def wait(self) -> Any:
        assert self.event.wait(10), f"{self.name} never opened"
        return None

    def result(self) -> Any:
        return None


def _proto(name: str, gates: list[Gate], log: list[tuple[str, int]], value: Any = None) -> Any:
    log.append((f"{name} starts", threading.get_ident()))
    for g in gates:
        log.append((f"{name} issues {g.name}", threading.get_ident()))
        yield g
    log.append((f"{name} ends", threading.get_ident()))
    return value


def test_idle_queue_starts_the_protocol_on_the_calling_thread() -> None:
    """Everything before the first collective runs in submit(), on the caller's thread; the waits
    and what follows them on the queue's thread; the value reaches the future."""
    q, log = FutureQueue(), []
    try:
        a, b = Gate("a", log), Gate("b", log)
        fut = q.submit(_proto("p", [a, b], log, 42), start_here=True)
        me = threading.get_ident()
        assert log == [("p starts", me), ("p issues a", me)]  # before submit returned
        a.event.set()
        b.event.set()
        assert fut.wait() == 42
        assert [e for e, _ in log] == ["p starts", "p issues a", "p issues b", "p ends"]
        assert log[2][1] != me and log[3][1] != me
    finally:
        q.close(5)


def test_busy_queue_keeps_submission_order() -> None:
    """While an earlier protocol waits on a collective, a later one submitted with start_here runs
    nothing on the caller's thread: its first collective is issued only after the earlier
    protocol's last one, on the queue's thread."""
    q, log = FutureQueue(), []
    try:
        a1, a2, b1 = Gate("a1", log), Gate("a2", log), Gate("b1", log)
        fa = q.submit(_proto("A", [a1, a2], log, "A"), start_here=True)
        fb = q.submit(_proto("B", [b1], log, "B"), start_here=True)
        assert [e for e, _ in log] == ["A starts", "A issues a1"]  # B has not started anywhere
        for g in (a1, a2, b1):
            g.event.set()
        assert (fa.wait(), fb.wait()) == ("A", "B")
        order = [e for e, _ in log]
        assert order.index("A issues a2") < order.index("B starts")
        assert log[order.index("B starts")][1] != threading.get_ident()
    finally:
        q.close(5)


def test_started_protocol_errors_and_returns_reach_the_future() -> None:
    """A protocol that raises, or returns, before any collective completes its future the same way
    as when the queue's thread ran it, and the queue goes on with the next protocol."""

    def raises() -> Any:
        raise ConfigError("bad bucket")
        yield

    def returns() -> Any:
        return "nothing to send"
        yield

    q, log = FutureQueue(), []
    try:
        bad = q.submit(raises(), start_here=True)
        with pytest.raises(ConfigError, match="bad bucket"):
            bad.wait()
        assert q.submit(returns(), start_here=True).wait() == "nothing to send"
        g = Gate("g", log)
        g.event.set()
        assert q.submit(_proto("after", [g], log, 1), start_here=True).wait() == 1
    finally:
        q.close(5)


def test_finish_here_runs_the_whole_protocol_on_the_calling_thread() -> None:
    """An idle queue with finish_here runs the protocol to its end in submit(): every step on the
    caller's thread, the future completed before submit returns; its errors reach the future."""

    def raises_after(g: Gate) -> Any:
        yield g
        raise ConfigError("bad bucket")

    q, log = FutureQueue(), []
    try:
        a, b = Gate("a", log), Gate("b", log)
        a.event.set()
        b.event.set()
        fut = q.submit(_proto("p", [a, b], log, 42), start_here=True, finish_here=True)
        assert fut.done() and fut.wait() == 42
        me = threading.get_ident()
        assert [e for e, _ in log] == ["p starts", "p issues a", "p issues b", "p ends"]
        assert all(t == me for _, t in log)
        g = Gate("g", log)
        g.event.set()
        bad = q.submit(raises_after(g), finish_here=True)
        assert bad.done()
        with pytest.raises(ConfigError, match="bad bucket"):
            bad.wait()
    finally:
        q.close(5)


def test_finish_here_on_a_busy_queue_waits_its_turn_on_the_queues_thread() -> None:
    """finish_here does nothing on the caller's thread while an earlier protocol is unfinished:
    the protocol is queued (submit returns at once) and runs after the earlier one."""
    q, log = FutureQueue(), []
    try:
        a1, b1 = Gate("a1", log), Gate("b1", log)
        fa = q.submit(_proto("A", [a1], log, "A"), start_here=True)
        fb = q.submit(_proto("B", [b1], log, "B"), start_here=True, finish_here=True)
        assert not fb.done() and [e for e, _ in log] == ["A starts", "A issues a1"]
        a1.event.set()
        b1.event.set()
        assert (fa.wait(), fb.wait()) == ("A", "B")
        order = [e for e, _ in log]
        assert order.index("A ends") < order.index("B starts")
        assert log[order.index("B starts")][1] != threading.get_ident()
    finally:
        q.close(5)


def test_a_protocol_submitted_while_one_finishes_here_starts_after_it() -> None:
    """While a protocol runs to its end on another caller's thread (finish_here), a protocol
    submitted meanwhile, even with start_here, issues nothing until that one has ended: the
    collectives keep the submission order on every rank."""
    q, log = FutureQueue(), []
    try:
        a1, a2, c1 = Gate("a1", log), Gate("a2", log), Gate("c1", log)
        futs: dict[str, Any] = {}
        caller = threading.Thread(
            target=lambda: futs.setdefault("A", q.submit(_proto("A", [a1, a2], log, "A"), finish_here=True))
        )
        caller.start()
        for _ in range(1000):  # until A waits on its first collective, on the caller's thread
            if ("A issues a1", caller.ident) in log:
                break
            threading.Event().wait(0.01)
        fc = q.submit(_proto("C", [c1], log, "C"), start_here=True)
        assert "C starts" not in [e for e, _ in log]  # queued, not started here
        c1.event.set()
        a1.event.set()
        a2.event.set()
        caller.join(10)
        assert (futs["A"].wait(), fc.wait()) == ("A", "C")
        order = [e for e, _ in log]
        assert order.index("A ends") < order.index("C starts")
        assert all(t == caller.ident for e, t in log if e.startswith("A"))
    finally:
        q.close(5)
