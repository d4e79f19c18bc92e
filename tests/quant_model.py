"""A plain NumPy model of the quantization specs, written from the spec pages, not from the kernels.

specs/codecs/uniform.md §6, qsgd.md, terngrad.md, sign.md and specs/rng.md. Every function returns
what the spec says the sections hold, so tests can compare payload bytes exactly. It is slow and
simple on purpose: loops over groups, one NumPy expression per spec step.
"""

from __future__ import annotations

import numpy as np

import gcodec
from gcodec.kernels.cpu import philox as rng

RBLOCK = 65536
F32 = np.float32


def as_f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).reshape(-1).astype(np.float32)


def lane_sum(terms: np.ndarray) -> float:
    """Spec lane sum of float64 terms (at most RBLOCK): 8 sequential lanes, then a fixed tree."""
    assert terms.size <= RBLOCK
    pad = (-terms.size) % 8
    t = np.concatenate([terms.astype(np.float64), np.zeros(pad)]).reshape(-1, 8)
    lanes = np.cumsum(t, axis=0)[-1] if t.size else np.zeros(8)  # cumsum is strictly sequential
    lanes = lanes + 0.0  # the lanes start at +0
    a = [float(v) for v in lanes]
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))


def group_sum(terms: np.ndarray) -> float:
    """Sum over a group: lane sums of RBLOCK-element blocks from the group start, added left to right."""
    total = None
    for lo in range(0, max(terms.size, 1), RBLOCK):
        s = lane_sum(terms[lo : lo + RBLOCK])
        total = s if total is None else total + s
    return float(total)


def groups(n: int, g: int) -> list[tuple[int, int]]:
    g = g if g > 0 else max(n, 1)
    return [(lo, min(lo + g, n)) for lo in range(0, n, g)]


def f16_round_up(s: np.float32) -> tuple[np.float32, int]:
    """The smallest float16 >= s (s finite, >= 0) as (float32 value, bits); bits 0x7C00 means overflow."""
    h = np.float32(s).astype(np.float16)
    if np.float32(h) < s:
        h = np.frombuffer(np.uint16(h.view(np.uint16) + 1).tobytes(), np.float16)[0]
    bits = int(h.view(np.uint16))
    return np.float32(h), bits


def rounding_draws(seed: int, stream: int, n: int) -> np.ndarray:
    """u_i = (2 r_i + 1) * 2**-17 as float32, r_i the 16-bit Philox draws."""
    r = rng.random_u16(seed, stream, n).astype(np.float32)
    return (r * F32(2) + F32(1)) * F32(2.0**-17)


def quantize(v: np.ndarray, s: np.float32, qmax: int, u: np.ndarray | None) -> np.ndarray:
    """Integer codes of one group: nearest (u is None) or stochastic, per the spec."""
    if s == 0:
        return np.zeros(v.size, np.int64)
    t = np.clip(v / s, F32(-qmax), F32(qmax)).astype(np.float32)
    if u is None:
        return np.rint(t).astype(np.int64)
    fl = np.floor(t)
    return fl.astype(np.int64) + (u < (t - fl)).astype(np.int64)


def pack(q: np.ndarray, w: int) -> bytes:
    """w-bit two's complement codes, element i at bits [i*w, (i+1)*w) of a little-endian stream."""
    n = q.size
    u = (q.astype(np.int64) & ((1 << w) - 1)).astype(np.uint64)
    bits = ((u[:, None] >> np.arange(w, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8).reshape(-1)
    bits = np.concatenate([bits, np.zeros((-bits.size) % 8, np.uint8)])
    return np.packbits(bits, bitorder="little").tobytes()[: (n * w + 7) // 8]


def unpack(codes: bytes, n: int, w: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(codes, np.uint8), bitorder="little")[: n * w].reshape(n, w).astype(np.int64)
    u = (bits << np.arange(w)).sum(axis=1)
    return np.where(u >= 1 << (w - 1), u - (1 << w), u)


def scaled_sections(
    x: np.ndarray,
    *,
    rule: str,
    group_size: int,
    width: int,
    qmax: int,
    stochastic: bool,
    seed: int = 0,
    stream: int = 0,
    clip: float = 0.0,
    scale_f16: bool = False,
) -> tuple[bytes, bytes]:
    """(scales bytes, codes bytes) of uniform ("absmax"), qsgd ("l2") or terngrad ("max")."""
    v = as_f32(x)
    n = v.size
    u = rounding_draws(seed, stream, n) if stochastic else None
    scales, q = [], np.zeros(n, np.int64)
    for lo, hi in groups(n, group_size):
        vg = v[lo:hi]
        vd = vg.astype(np.float64)
        if rule == "l2":
            s = F32(np.sqrt(group_sum(vd * vd))) / F32(qmax)
        else:
            amax = np.abs(vg).max()
            if rule == "absmax":
                s = F32(amax / F32(qmax))
            else:
                s = F32(amax)
                if clip > 0:
                    cnt = float(hi - lo)
                    mean = group_sum(vd) / cnt
                    var = max(group_sum(vd * vd) / cnt - mean * mean, 0.0)
                    s = min(s, F32(clip * np.sqrt(var)))
        bits = None
        if scale_f16:
            s, bits = f16_round_up(s)
        scales.append(bits if scale_f16 else s)
        q[lo:hi] = quantize(vg, s, qmax, None if u is None else u[lo:hi])
    sc = np.array(scales, np.uint16 if scale_f16 else np.float32).tobytes()
    return sc, pack(q, width)


def scaled_decode(scales: np.ndarray, codes: bytes, n: int, group_size: int, width: int) -> np.ndarray:
    q = unpack(codes, n, width).astype(np.float32)
    out = np.empty(n, np.float32)
    for k, (lo, hi) in enumerate(groups(n, group_size)):
        out[lo:hi] = q[lo:hi] * F32(scales[k])
    return out


def sign_sections(x: np.ndarray, group_size: int) -> tuple[bytes, bytes]:
    """(scales, bits) of the sign codec: mean |v| per group, bit 1 for v < 0."""
    v = as_f32(x)
    scales = [F32(group_sum(np.abs(v[lo:hi]).astype(np.float64)) / (hi - lo)) for lo, hi in groups(v.size, group_size)]
    bits = np.packbits((v < 0).astype(np.uint8), bitorder="little").tobytes()
    return np.array(scales, np.float32).tobytes(), bits


# --------------------------------------------------------------------------------------------
# helpers for the tests


def payload_sections(buf) -> tuple[dict, dict[str, np.ndarray]]:
    """(params, {section name: array copy}) of a single-tensor payload."""
    from gcodec.format.container import read_payload

    p = read_payload(buf)
    e = p.header.tensors[0]
    return dict(e.params), {k: v.copy() for k, v in p.views(e).items()}


def hoeffding_halfwidth(span: np.ndarray | float, k: int, n_tests: int, p_fail: float = 1e-9) -> np.ndarray:
    """t such that P(|mean of k independent draws in an interval of length span - its mean| >= t)
    <= p_fail / n_tests (Hoeffding: 2 exp(-2 k t^2 / span^2)), so a union bound over n_tests
    elements keeps the whole test's false-failure probability below p_fail."""
    return np.asarray(span) * np.sqrt(np.log(2 * n_tests / p_fail) / (2 * k))


def mean_decode_and_scales(codec, x: np.ndarray, k: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean of the decodes of ``k`` encodes of ``x`` at steps 0..k-1, each element's scale).

    The scales (float64, one per element) are those of the first payload; with a per-group absmax
    scale they are the same for every step."""
    acc = np.zeros(x.size)
    s = None
    for step in range(k):
        buf = codec.encode(x, step=step)
        acc += gcodec.decode(buf)
        if s is None:
            s = np.repeat(payload_sections(buf)[1]["scales"].astype(np.float64), group_size)[: x.size]
    return acc / k, s
