"""The torch queue's overlap of a protocol's last collective with the next protocol
(``FutureQueue.submit(..., more=True)`` and :class:`gcodec.transports.LastWork`).

In-process, with works that complete when the test says so (no process group: what is tested is
the queue's order of starting collectives, running local steps and completing futures). The real
gloo runs of the DDP hook with several buckets are in test_transport_torch.py and the
transport_ranks programs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from gcodec import GcodecError  # noqa: E402
from gcodec.torch.comm import FutureQueue  # noqa: E402
from gcodec.transports import LastWork, Work  # noqa: E402

WAIT_S = 20.0  # a bound for what must happen; a failure waits this long, a pass does not


class Gate(Work):
    """A collective that completes when ``open()`` is called, and records when it was started."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log
        self._done = threading.Event()
        log.append(f"start {name}")

    def open(self) -> None:
        self._done.set()

    def test(self) -> bool:
        return self._done.is_set()

    def wait(self) -> Any:
        if not self._done.wait(WAIT_S):
            raise TimeoutError(f"{self.name} never completed")
        return self.name

    def result(self) -> Any:
        return self.name


def _until(cond: Any) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > WAIT_S:
            return False
        time.sleep(0.001)
    return True


def test_the_next_protocol_starts_while_the_last_collective_travels_and_order_is_kept() -> None:
    log: list[str] = []
    gates: dict[str, Gate] = {}

    def bucket(name: str, n: int) -> Any:
        for i in range(n - 1):
            gates[f"{name}{i}"] = g = Gate(f"{name}{i}", log)
            yield g
        gates[f"{name}-last"] = g = Gate(f"{name}-last", log)
        yield LastWork(g)
        log.append(f"tail {name}")
        return name

    q = FutureQueue()
    try:
        f0 = q.submit(bucket("a", 1), more=True)
        assert _until(lambda: "start a-last" in log)
        f1 = q.submit(bucket("b", 2), more=False)
        # b's first collective starts while a's last one is still in flight ...
        assert _until(lambda: "start b0" in log)
        assert not f0.done() and "tail a" not in log
        # ... and b does not go on (nor a's future complete) before a's last collective is done
        gates["b0"].open()
        time.sleep(0.05)
        assert "start b-last" not in log and not f0.done()
        gates["a-last"].open()
        assert _until(lambda: "start b-last" in log)
        assert f0.wait() == "a" and log.index("tail a") < log.index("start b-last")
        gates["b-last"].open()
        assert f1.wait() == "b"
        assert log == ["start a-last", "start b0", "tail a", "start b-last", "tail b"]
    finally:
        for g in gates.values():
            g.open()
        q.close(WAIT_S)


def test_without_more_the_last_collective_is_waited_for_before_the_next_protocol() -> None:
    log: list[str] = []
    gates: dict[str, Gate] = {}

    def one(name: str) -> Any:
        gates[name] = g = Gate(name, log)
        yield LastWork(g)
        log.append(f"tail {name}")
        return name

    q = FutureQueue()
    try:
        f0 = q.submit(one("a"))  # more=False: a caller that waits (FSDP's run) is never parked
        assert _until(lambda: "start a" in log)
        f1 = q.submit(one("b"))
        time.sleep(0.05)
        assert log == ["start a"]
        gates["a"].open()
        assert f0.wait() == "a"
        assert _until(lambda: "start b" in log)
        gates["b"].open()
        assert f1.wait() == "b"
    finally:
        for g in gates.values():
            g.open()
        q.close(WAIT_S)


def test_a_parked_protocol_completes_when_no_next_protocol_comes() -> None:
    """``more`` is a promise the caller may break (backward raised before the next bucket): the
    parked protocol still finishes once its collective is done, from the queue's own polling."""
    log: list[str] = []
    g: list[Gate] = []

    def one() -> Any:
        g.append(Gate("a", log))
        yield LastWork(g[0])
        return "done"

    q = FutureQueue()
    try:
        fut = q.submit(one(), more=True)
        assert _until(lambda: bool(g))
        g[0].open()
        assert fut.wait() == "done"
    finally:
        if g:
            g[0].open()
        q.close(WAIT_S)


def test_a_collective_after_the_last_one_is_an_error_of_the_protocol() -> None:
    """It would start after the next protocol's first collective on one rank and before it on a
    rank where the next protocol came later: never run, the protocol fails instead."""
    log: list[str] = []
    gates: list[Gate] = []

    def liar() -> Any:
        gates.append(Gate("a", log))
        yield LastWork(gates[-1])
        gates.append(Gate("extra", log))
        yield gates[-1]

    def honest() -> Any:
        gates.append(Gate("b", log))
        yield LastWork(gates[-1])
        return "b"

    q = FutureQueue()
    try:
        f0 = q.submit(liar(), more=True)
        assert _until(lambda: "start a" in log)
        f1 = q.submit(honest())
        assert _until(lambda: "start b" in log)
        gates[0].open()
        with pytest.raises(GcodecError, match="after its LastWork"):
            f0.wait()
        next(x for x in gates if x.name == "b").open()
        assert f1.wait() == "b"
    finally:
        for x in gates:
            x.open()
        q.close(WAIT_S)


def test_close_finishes_a_parked_protocol() -> None:
    log: list[str] = []
    g: list[Gate] = []

    def one() -> Any:
        g.append(Gate("a", log))
        yield LastWork(g[0])
        log.append("tail")
        return 1

    q = FutureQueue()
    fut = q.submit(one(), more=True)
    assert _until(lambda: bool(g))
    closer = threading.Thread(target=q.close, args=(WAIT_S,))
    closer.start()
    time.sleep(0.05)
    assert not fut.done()  # the close waits for the collective, as for any protocol in flight
    g[0].open()
    closer.join(WAIT_S)
    assert fut.done() and fut.wait() == 1 and log == ["start a", "tail"]


def test_a_protocols_collectives_are_released_by_the_queue_after_the_next_protocol_completes() -> None:
    """The last reference to a completed collective is the queue's, dropped on its own thread one
    protocol later (or at close), never the caller's drop racing the transport's worker: a gloo
    work whose last holder is gloo's worker thread takes the GIL there to free its tensors, and a
    program that frees DDP's reducer (joining that worker with the GIL held) right after the last
    step hung that way."""
    import gc
    import weakref

    log: list[str] = []
    refs: list[weakref.ref[Gate]] = []

    def one(name: str) -> Any:
        g = Gate(name, log)
        g.open()
        refs.append(weakref.ref(g))
        yield LastWork(g)
        return name

    q = FutureQueue()
    try:
        assert q.submit(one("a")).wait() == "a"
        gc.collect()
        assert refs[0]() is not None  # held by the queue after its future completed
        assert q.submit(one("b")).wait() == "b"
        assert _until(lambda: (gc.collect(), refs[0]() is None)[1])  # released one protocol later
        assert refs[1]() is not None
    finally:
        q.close(WAIT_S)
    gc.collect()
    assert refs[1]() is None  # and the last at close
