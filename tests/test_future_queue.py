"""The torch queue's hold on a protocol's collectives (:class:`gcodec.torch.comm.FutureQueue`).

In-process, with works that complete when the test says so (no process group: what is tested is
which thread drops a collective's last reference). The real gloo runs of the DDP hook are in
test_transport_torch.py and the transport_ranks programs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from gcodec.torch.comm import FutureQueue  # noqa: E402
from gcodec.transports import Work  # noqa: E402

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
        yield g
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
