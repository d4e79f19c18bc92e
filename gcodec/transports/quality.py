"""Sampled quality telemetry inside the protocols (see :mod:`gcodec.telemetry`).

On a sampled step, before a key's exchange, this rank's tensor (plus its error-feedback residual)
is encoded once more with a copy of the key's codec state (PowerSGD's warm-start Q included) and
decoded: the record is what this rank's payload carries at that step, and no stream, residual or
warm start of the real exchange moves. Between samples, and with ``telemetry=None``, nothing runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs.state import CodecState
from ..telemetry import measure
from .state import TransportState

__all__ = ["sample_quality"]


def _residual(state: TransportState, key: str) -> np.ndarray | None:
    if key in state.lowrank_residuals:
        return state.lowrank_residuals[key]
    ef = state.worker
    if ef is None:
        return None
    e = ef.residual(key)
    if e is not None:
        return e
    chunks = [k for k in ef.keys() if k.startswith(key + "[")]
    chunks.sort(key=lambda k: int(k[len(key) + 1 :].split("/")[0]))
    if not chunks:
        return None
    return np.concatenate([ef.residual(k).reshape(-1) for k in chunks])  # type: ignore[union-attr]


def _codec_state_copy(state: TransportState, key: str) -> CodecState:
    """``key``'s arrays (a warm start), from whichever of the transport's and error feedback's codec
    states encodes it, copied: the trial encode must not move the real exchange's state."""
    cs = state.codec_state.copy_key(key)
    return cs if state.worker is None else state.worker.codec_state.copy_key(key, cs)


def sample_quality(state: TransportState, key: str, step: int, x: np.ndarray) -> dict[str, Any] | None:
    """Measure and record ``key``'s quality at ``step`` if ``state.telemetry`` samples it."""
    t = state.telemetry
    if t is None or not t.due(step):
        return None
    res = _residual(state, key)
    if res is not None and res.size != x.size:
        res = None  # a residual of another layout (after a rebuild): measure without it
    rec = measure(x, state.codec, residual=res, key=key, step=step, state=_codec_state_copy(state, key))
    if res is None and state.error_feedback:
        rec["residual_norm"] = 0.0
    return t.observe(key, step, rec)
