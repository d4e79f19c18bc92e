"""Elementwise error bounds of one encode/decode, derived from each codec's definition (specs/codecs/).

``bound(codec, v)[i]`` bounds ``|decode(encode(v))[i] - v[i]|`` for a flat float32 ``v``:

* fp16 / bf16: round to nearest: half an ulp, ``2^-11 |v|`` (``2^-8`` for bf16), plus half the
  smallest subnormal (fp16: ``2^-25``).
* uniform, nearest: ``s_g / 2`` with ``s_g = max_g |v| / qmax`` (one binary32 division, so a relative
  ``2^-23`` slack); stochastic: one step, ``s_g``.
* qsgd: one level, ``||v_bucket||_2 / levels``.
* terngrad (one scale): values are 0 or ``+-s`` with ``s = max |v| >= |v_i|``, so ``s``.
* sign: ``+-mean_g |v|`` against ``v_i``: ``|v_i| + mean_g |v|``.
* topk: kept values are exact; a dropped one is at most the largest dropped magnitude, so
  ``|v_i|`` where ``|v_i| <= T`` (T the (k+1)-th largest magnitude), else 0.
* threshold: values with ``|v| >= t`` are kept exactly; others are dropped: ``|v_i|`` where ``|v_i| < t``.
* randomk (independent indices per rank, gather modes): ``|v_i|``.

``envelope(codec, a)`` bounds the error of encoding *any* w with ``|w| <= a`` elementwise (used for
the two-phase owner's re-encode of a sum only known up to the first phase's error).
"""

from __future__ import annotations

import numpy as np

import gcodec

F32_EPS = 2.0**-23


def _groups(v: np.ndarray, g: int, fn) -> np.ndarray:  # type: ignore[no-untyped-def]
    if g == 0 or v.size == 0:
        return np.full(v.shape, fn(v) if v.size else 0.0)
    out = np.empty(v.shape)
    for lo in range(0, v.size, g):
        out[lo : lo + g] = fn(v[lo : lo + g])
    return out


def bound(codec: gcodec.Codec, v: np.ndarray) -> np.ndarray:
    a = np.abs(v.astype(np.float64))
    cid, prm = codec.codec_id, codec.params
    if cid == "fp16":
        return a * 2.0**-11 + 2.0**-25
    if cid == "bf16":
        return a * 2.0**-8 + 1e-38
    if cid == "uniform":
        qmax = 2 ** (prm["bits"] - 1) - 1
        s = _groups(a, prm["group_size"], np.max) / qmax * (1 + 4 * F32_EPS)
        return s / 2 if prm["rounding"] == "nearest" else s
    if cid == "qsgd":
        return _groups(a, prm["bucket_size"], lambda b: np.sqrt(np.sum(b * b))) / prm["levels"] * (1 + 1e-6)
    if cid == "terngrad":
        return _groups(a, prm["group_size"], np.max) * (1 + 1e-6)
    if cid == "sign":
        return a + _groups(a, prm["group_size"], np.mean) * (1 + 1e-6)
    if cid == "topk":
        k = codec.k_for(a.size)  # type: ignore[attr-defined]
        t = np.sort(a)[::-1][k] if k < a.size else -1.0
        return np.where(a <= t, a, 0.0)
    if cid == "threshold":
        return np.where(a < prm["threshold"], a, 0.0)
    if cid == "randomk":
        return a
    raise AssertionError(cid)


def envelope(codec: gcodec.Codec, a: np.ndarray) -> np.ndarray:
    """Bound for encoding any w with |w| <= a (monotone bounds; keep-exact claims dropped)."""
    if codec.codec_id in ("topk", "threshold", "randomk"):
        return a
    return bound(codec, a)
