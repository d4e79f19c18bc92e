"""Per-key, per-step transport statistics as plain dicts (what telemetry and cost models read).

For each key the last step's record and running totals are kept (never a growing history):

* ``raw_bytes``: bytes of the tensor as the caller handed it in;
* ``payload_bytes``: bytes of what this rank encoded (all its payloads or factors for the step);
* ``wire_bytes``: bytes this rank received from other ranks for the step (payloads of others, not
  its own), the figure to compare with ``2 (p-1)/p * n`` of a ring allreduce;
* ``encode_s``, ``comm_s``, ``decode_s``: seconds encoding, waiting on collectives (from start to
  observed completion), decoding and summing;
* ``host_bytes``: bytes gcodec copied between host and device memory for the step (both ways; 0 for
  host tensors). On a device path only sizes, error codes, control words and headers should cross,
  so this stays header-sized; a step that copied a tensor-sized buffer shows here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "DENSE",
    "FIELDS",
    "REPORT_FIELDS",
    "KeyRounds",
    "Stats",
    "StepReports",
    "StepStats",
    "ring_bytes",
    "scatter_bytes",
]

#: The mode of an exchange that sent its tensor uncompressed (statistics, switch records).
DENSE = "dense"


def ring_bytes(nbytes: int, p: int) -> int:
    """The bytes one rank sends (and receives) in a ring allreduce of ``nbytes`` on ``p`` ranks:
    2 (p-1)/p of them, a reduce-scatter and an all-gather."""
    return 2 * (p - 1) * nbytes // p


def scatter_bytes(nbytes: int, p: int) -> int:
    """The bytes one rank sends in a reduce-scatter of ``nbytes`` on ``p`` ranks: (p-1)/p of them."""
    return (p - 1) * nbytes // p


FIELDS = ("raw_bytes", "payload_bytes", "wire_bytes", "encode_s", "comm_s", "decode_s", "host_bytes")


class StepStats:
    """The figures of one exchange of one key, filled in as the protocol runs."""

    def __init__(self, key: str, step: int, mode: str, raw_bytes: int) -> None:
        self.key, self.step, self.mode = key, step, mode
        self.values: dict[str, float] = dict.fromkeys(FIELDS, 0)
        self.values["raw_bytes"] = raw_bytes

    def add(self, field: str, amount: float) -> None:
        self.values[field] += amount

    @contextmanager
    def timing(self, field: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.values[field] += time.perf_counter() - t0


class Stats:
    """Last record and totals per key. ``as_dict()`` is JSON-safe."""

    def __init__(self) -> None:
        self._last: dict[str, dict[str, Any]] = {}
        self._total: dict[str, dict[str, float]] = {}
        self._count: dict[str, int] = {}

    def record(self, s: StepStats) -> None:
        self._last[s.key] = {"step": s.step, "mode": s.mode, **s.values}
        tot = self._total.setdefault(s.key, dict.fromkeys(FIELDS, 0))
        for f in FIELDS:
            tot[f] += s.values[f]
        self._count[s.key] = self._count.get(s.key, 0) + 1

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{key: {"step", "mode", <fields of the last step>, "steps": count, "total": {<fields>}}}``."""
        return {k: {**last, "steps": self._count[k], "total": dict(self._total[k])} for k, last in self._last.items()}

    def reset(self) -> None:
        self._last.clear()
        self._total.clear()
        self._count.clear()


#: The fields of a :class:`StepReports` record (one engine step, every group of it together).
REPORT_FIELDS = (
    "raw_bytes",
    "payload_bytes",
    "wire_bytes",
    "dense_bytes",
    "dense_wire_bytes",
    "encode_s",
    "comm_s",
    "decode_s",
    "overhead_s",
    "held_s",
)


class StepReports:
    """Per-step totals of an engine (the DDP hook: every bucket of one iteration together).

    * ``raw_bytes``: bytes of every gradient of the step, compressed or not;
    * ``payload_bytes``, ``wire_bytes``: what the compressed exchanges encoded and received (the
      transports' :data:`FIELDS`); in a step that compressed nothing (a warm-up, a policy that
      keeps everything dense), the dense allreduces' bytes and the ring allreduce's ``2 (p-1)/p``
      of them, so that they always say what was sent;
    * ``dense_bytes``: in a step that compressed something, the bytes sent uncompressed beside it
      (biases, small tensors, what a policy keeps dense; a bucket, module or key sent dense as a
      whole counts here too), and ``dense_wire_bytes`` their share of the collective that carried
      them (a ring allreduce's ``2 (p-1)/p``, a reduce-scatter's ``(p-1)/p``); 0 in a step that
      compressed nothing;
    * ``encode_s``, ``comm_s``, ``decode_s``: the exchanges' seconds, dense allreduces' waits
      included;
    * ``held_s``: seconds from the start of each part's exchange (a bucket, a module, a call) to
      its end, summed: the time the engine held the tensors; ``overhead_s`` is what of it the
      three above do not account for (choosing codecs, planning, joining and scattering tensors,
      the agreement's control words, queueing). So ``encode_s + comm_s + decode_s + overhead_s ==
      held_s`` in every report.

    ``step`` is the engine's own step (the DDP hook's iteration, warm-up included), the same for
    every codec. The last finished step is kept, and the totals over all steps."""

    def __init__(self) -> None:
        self._open: dict[int, dict[str, float]] = {}
        self._parts: dict[int, int] = {}  # step -> adds so far
        self._last: dict[str, Any] | None = None
        self._total: dict[str, float] = dict.fromkeys(REPORT_FIELDS, 0)
        self._steps = 0

    def add(
        self,
        step: int,
        groups: list[StepStats],
        *,
        raw_bytes: int,
        held_s: float,
        dense_bytes: int = 0,
        dense_wire_bytes: int = 0,
        dense_comm_s: float = 0.0,
        last: bool = False,
        parts: int | None = None,
    ) -> None:
        """One part (a bucket, a module, a call) of ``step``: its exchanges' :class:`StepStats`
        (one of mode :data:`DENSE`: the part went uncompressed as a whole) and the dense tensors
        that rode beside them. ``last`` closes the step, or ``parts``: the step closes with its
        ``parts``-th add (FSDP2: one per module)."""
        r = self._open.setdefault(step, {**dict.fromkeys(REPORT_FIELDS, 0), "_whole": 0, "_whole_wire": 0})
        self._parts[step] = self._parts.get(step, 0) + 1
        last = last or (parts is not None and self._parts[step] >= parts)
        r["raw_bytes"] += raw_bytes
        for g in groups:
            for f in ("encode_s", "comm_s", "decode_s"):
                r[f] += g.values[f]
            if g.mode == DENSE:  # sent whole: payload or dense bytes, as the step turns out
                r["_whole"] += g.values["payload_bytes"]
                r["_whole_wire"] += g.values["wire_bytes"]
            else:
                r["payload_bytes"] += g.values["payload_bytes"]
                r["wire_bytes"] += g.values["wire_bytes"]
        r["dense_bytes"] += dense_bytes
        r["dense_wire_bytes"] += dense_wire_bytes
        r["comm_s"] += dense_comm_s
        r["held_s"] += held_s
        if last:
            self.close(step)

    def close(self, step: int) -> None:
        """End ``step`` (its report becomes the last one); steps before it still open are dropped
        (a step whose last part failed). Nothing happens for a step with no part."""
        done = self._open.pop(step, None)
        if done is not None:
            whole, whole_wire = done.pop("_whole"), done.pop("_whole_wire")
            compressed = done["payload_bytes"] > 0 or done["dense_bytes"] > 0
            done["dense_bytes" if compressed else "payload_bytes"] += whole
            done["dense_wire_bytes" if compressed else "wire_bytes"] += whole_wire
            done["overhead_s"] = done["held_s"] - done["encode_s"] - done["comm_s"] - done["decode_s"]
            for f in REPORT_FIELDS:
                self._total[f] += done[f]
            self._steps += 1
            self._last = {"step": step, **done}
        for s in [s for s in self._open if s < step]:
            del self._open[s]
        for s in [s for s in self._parts if s <= step]:
            del self._parts[s]

    def as_dict(self) -> dict[str, Any]:
        """``{"last": {"step", <fields>} or None, "steps": count, "total": {<fields>}}``."""
        return {
            "last": None if self._last is None else dict(self._last),
            "steps": self._steps,
            "total": dict(self._total),
        }

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


class KeyRounds(StepReports):
    """The :class:`StepReports` of an engine called one key at a time (``gcodec.mpi.allreduce``,
    ``gcodec.torch.all_reduce``), whose callers decide what a step is.

    A step is a *round*: each key exchanged once. It ends when a key comes back (that call opens
    the next round) or at :meth:`end_step`; ``step`` counts the rounds from 0. In a training loop
    that exchanges every tensor once per iteration this is the iteration, and each key's own step
    counter (its random streams) agrees with it; a key first exchanged later joins the round in
    progress. A call is one part: from its protocol's start to its end, codec choice included."""

    def __init__(self) -> None:
        super().__init__()
        self._round = 0
        self._keys: set[str] = set()

    def add_call(self, key: str, groups: list[StepStats], *, raw_bytes: int, held_s: float) -> None:
        """One call's exchange of ``key`` (its :class:`StepStats`, one of mode :data:`DENSE` when it
        went uncompressed)."""
        if key in self._keys:
            self.end_step()
        self._keys.add(key)
        self.add(self._round, groups, raw_bytes=raw_bytes, held_s=held_s)

    def end_step(self) -> None:
        """Close the round in progress now (the last iteration of a loop has no next call to close
        it); nothing happens when no key was exchanged since the last close."""
        if self._keys:
            self.close(self._round)
            self._round += 1
            self._keys.clear()
