"""Faults on purpose, shared by the MPI and gloo fault programs.

* :func:`dying` wraps a communicator so that its rank kills itself (SIGKILL, no clean-up, as an
  OOM kill or a lost node) just before it would start its ``n``-th collective: with ``n`` running
  over an exchange's collectives, the rank dies in each phase of each protocol;
* :func:`stopper` stops a peer (SIGSTOP) for a few seconds and lets it go on (SIGCONT), from a
  thread of a rank that keeps working meanwhile;
* :data:`PROTOCOLS` and :func:`exact_inputs` give exchanges whose exact result is known, so a
  result after a fault can be checked bit for bit, not just for running.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: name -> (codec, mode, collectives of one agreed exchange on 2 ranks). Summable: the control
#: message, the values' all-gather; gather: control with sizes, payloads, agreement; two-phase:
#: control with sizes, all-to-all, sizes of phase 2, all-gather, agreement; PowerSGD: control,
#: P's allreduce, Q's allreduce.
PROTOCOLS: dict[str, tuple[dict[str, Any], str, int]] = {
    "summable": ({"id": "fp16"}, "summable", 2),
    "gather": ({"id": "uniform", "bits": 8}, "gather", 3),
    "two_phase": ({"id": "uniform", "bits": 8}, "two_phase", 5),
    "powersgd": ({"id": "powersgd", "rank": 2}, "powersgd", 3),
}

SHAPE = (64, 128)


def exact_inputs(rank: int, step: int) -> np.ndarray:
    """Integers in [-127, 127], each group of 64 holding +-127: uniform 8 bits (scale 1) and fp16
    carry them exactly, and the mean of two ranks is a multiple of 1/2, exact too."""
    rng = np.random.default_rng(7919 * step + rank)
    x = rng.integers(-126, 127, size=SHAPE).astype(np.float32)
    x.reshape(-1, 64)[:, 0] = 127.0 * (1 - 2 * ((step + rank) % 2))
    return x


def within(proto: str, y: np.ndarray, step: int, size: int) -> tuple[bool, str]:
    """Whether ``y`` is the right mean of :func:`exact_inputs` at ``step``: summable and gather
    carry the inputs exactly; two-phase re-encodes the mean (half a step of max|group| / 127 <=
    127 / 127 / 2); PowerSGD is a rank-2 projection (finite; the callers check it is the same on
    every rank)."""
    m = np.mean([exact_inputs(r, step) for r in range(size)], axis=0)
    err = float(np.max(np.abs(y - m)))
    if proto in ("summable", "gather"):
        return err == 0.0, f"max err {err}"
    if proto == "two_phase":
        return err <= 0.5, f"max err {err}"
    return bool(np.all(np.isfinite(y))), "finite"


def stopped_run(
    rank: int, pids: list[int], proto: str, allreduce: Callable[[np.ndarray, str], np.ndarray]
) -> tuple[list[str], list[np.ndarray], float]:
    """40 exchanges of ``proto`` during which rank 0 stops rank 1 for 3 s: (the steps whose result
    was wrong, the results, the seconds the run took)."""
    t0, bad, ys = time.monotonic(), [], []
    for step in range(40):
        if rank == 0 and step == 5:  # rank 1 is stopped in one of the next exchanges
            stopper(pids[1], after=0.01, hold=3.0)
        y = allreduce(exact_inputs(rank, step), f"stop-{proto}")
        ok, detail = within(proto, y, step, len(pids))
        if not ok:
            bad.append(f"step {step}: {detail}")
        ys.append(y)
    return bad, ys, time.monotonic() - t0


def dying(base: type, target: int) -> type:
    """A subclass of communicator class ``base`` whose rank SIGKILLs itself before collective
    number ``target`` (counted from when :meth:`arm` is called)."""

    class Dying(base):  # type: ignore[misc,valid-type]
        count = -1

        def arm(self) -> None:
            self.count = 0

        def _tick(self) -> None:
            if self.count < 0:
                return
            if self.count == target:
                os.kill(os.getpid(), signal.SIGKILL)
            self.count += 1

        def allreduce(self, arr: Any, op: str = "sum") -> Any:
            self._tick()
            return super().allreduce(arr, op)

        def allgather(self, arr: Any) -> Any:
            self._tick()
            return super().allgather(arr)

        def allgatherv(self, buf: Any, counts: Any) -> Any:
            self._tick()
            return super().allgatherv(buf, counts)

        def alltoallv(self, bufs: Any, recv_counts: Any) -> Any:
            self._tick()
            return super().alltoallv(bufs, recv_counts)

    return Dying


def corrupting(base: type) -> type:
    """A subclass of communicator class ``base`` that, while ``armed``, flips a byte near the end of
    every payload-sized buffer it sends (a fault in flight that the CRC must catch)."""

    def flip(buf: Any) -> Any:
        buf = buf.copy()
        buf[-50] ^= 0xFF
        return buf

    class Corrupting(base):  # type: ignore[misc,valid-type]
        armed = False

        def allgatherv(self, buf: Any, counts: Any) -> Any:
            if self.armed and buf.shape[0] > 1000:
                buf = flip(buf)
            return super().allgatherv(buf, counts)

        def alltoallv(self, bufs: Any, recv_counts: Any) -> Any:
            if self.armed:
                bufs = [flip(b) if b.shape[0] > 1000 else b for b in bufs]
            return super().alltoallv(bufs, recv_counts)

    return Corrupting


def stopper(pid: int, after: float, hold: float) -> threading.Thread:
    """Start a thread that stops ``pid`` after ``after`` seconds for ``hold`` seconds."""

    def run() -> None:
        time.sleep(after)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(hold)
        os.kill(pid, signal.SIGCONT)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def resources() -> dict[str, int]:
    """This process's resident memory (kB), threads and open file descriptors."""
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return {"rss_kb": rss, "threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd"))}


def soak(steps: int, step: Callable[[], None], what: str, check: Callable[[str, bool, str], None]) -> None:
    """Run ``step`` ``steps`` times; check that resident memory grows under 1 % from the end of the
    first tenth (allocator pools and caches are warm by then) to the end, with the same threads
    and file descriptors."""
    start: dict[str, int] = {}
    for i in range(steps):
        step()
        if i == steps // 10:
            start = resources()
    end = resources()
    growth = (end["rss_kb"] - start["rss_kb"]) / start["rss_kb"]
    check(f"soak: {what} hold memory flat (< 1 % growth after the first tenth)", growth < 0.01, f"{start} -> {end}")
    same = (start["threads"], start["fds"]) == (end["threads"], end["fds"])
    check("soak: no leaked threads or file descriptors", same, f"{start} -> {end}")
