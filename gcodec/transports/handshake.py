"""Agreement on what an exchange does: fingerprints, and their full comparison.

Before the first exchange of a key, and whenever the digests of an exchange's BEGIN differ
(:mod:`gcodec.transports.control`), every rank all-gathers a small JSON *fingerprint* of what it is
about to do: the key, the codec config, the tensor's shape and dtype, the resolved mode, the
reduction op and whether error feedback is on. A rank whose fingerprint differs would otherwise
send payloads of another size or kind, and the collective would hang or return a wrong sum. Since
every rank receives every fingerprint, every rank sees the same difference and raises the same
:class:`~gcodec.ConfigError`, naming the fields and the ranks.

The same exchange carries facts that are not compared: the host name, from which each rank learns
how many ranks share its machine (for :mod:`gcodec.transports.threads`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["Agreement", "compare_fingerprints", "fingerprint"]


def fingerprint(**fields: Any) -> dict[str, Any]:
    """A JSON-safe dict of the compared fields (sorted keys make the comparison order-free)."""
    return json.loads(json.dumps(fields, sort_keys=True, default=str))


class Agreement:
    """What one handshake established: the peers' host names and so the local rank count."""

    def __init__(self, hosts: list[str], rank: int) -> None:
        self.hosts = hosts
        self.local_ranks = sum(h == hosts[rank] for h in hosts)


def _describe(diffs: Mapping[str, list[Any]]) -> str:
    parts = []
    for field, values in diffs.items():
        by_value: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            by_value.setdefault(json.dumps(v, sort_keys=True), []).append(r)
        parts.append(f"{field}: " + "; ".join(f"rank(s) {rs} have {v}" for v, rs in by_value.items()))
    return " | ".join(parts)


def compare_fingerprints(parts: Sequence[np.ndarray], rank: int, key: Any) -> Agreement:
    """Compare the all-gathered ``{"fp": ..., "host": ...}`` JSON of every rank; raise ConfigError
    (the same on every rank, since every rank compares the same bytes) when any field differs."""
    try:
        got = [json.loads(bytes(p).decode()) for p in parts]
        fps = [g["fp"] for g in got]
        hosts = [str(g["host"]) for g in got]
        if not all(isinstance(f, dict) for f in fps):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ConfigError("handshake: a rank sent an unreadable fingerprint (not a gcodec transport?)") from None
    fields = sorted({k for f in fps for k in f})
    diffs = {k: [f.get(k) for f in fps] for k in fields if any(f.get(k) != fps[0].get(k) for f in fps)}
    if diffs:
        raise ConfigError(f"handshake for key {key!r}: ranks disagree on {_describe(diffs)}")
    return Agreement(hosts, rank)
