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

import gc
import os
import signal
import sys
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
    """This process's resident memory (kB), threads, open file descriptors and the blocks Python's
    object allocator holds (after a full collection: what is still reachable or leaked)."""
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    gc.collect()
    return {
        "rss_kb": rss,
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "blocks": sys.getallocatedblocks(),
    }


#: Resident memory may grow by this much from the reference point to the end of a soak (a few
#: pages of allocator slack: measured 24-40 kB over 1,800 warm DDP-hook steps, 12 kB over 1,400
#: warm allreduce pairs).
SOAK_RSS_KB = 2048
#: Python's allocator may hold this many more blocks per measured step at the end (measured:
#: 0.06-0.07 per step, NumPy's own caches). Anything a step leaks that Python can see, an array, a
#: tensor, a future, a dict of residuals, is at least one block per step, so it fails this check
#: whatever its size: the check that catches small leaks, where resident memory catches large ones.
SOAK_BLOCKS_PER_STEP = 0.5


def soak(steps: int, step: Callable[[], None], what: str, check: Callable[[str, bool, str], None]) -> None:
    """Run ``step`` ``steps`` times and compare the process at 40 % of the steps (allocator pools
    and caches are warm by then: resident memory of both soaks was flat from 700 steps on) with the
    end: resident memory within :data:`SOAK_RSS_KB` (a leak of 1.4 kB per step over 1,500 measured
    steps fails it), Python's allocated blocks within :data:`SOAK_BLOCKS_PER_STEP` per step (a leak
    of one object per step fails it), the same threads and file descriptors."""
    start: dict[str, int] = {}
    ref = (steps * 2) // 5
    for i in range(steps):
        step()
        if i == ref:
            start = resources()
    end = resources()
    measured = steps - 1 - ref
    grew = end["rss_kb"] - start["rss_kb"]
    check(f"soak: {what} hold resident memory flat", grew < SOAK_RSS_KB, f"{start} -> {end}")
    leaked = end["blocks"] - start["blocks"]
    ok = leaked < SOAK_BLOCKS_PER_STEP * measured
    check(f"soak: {what} leak no Python objects", ok, f"{leaked} blocks over {measured} steps: {start} -> {end}")
    same = (start["threads"], start["fds"]) == (end["threads"], end["fds"])
    check("soak: no leaked threads or file descriptors", same, f"{start} -> {end}")
