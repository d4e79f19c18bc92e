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

__all__ = ["FIELDS", "Stats", "StepStats"]

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
