"""The 16-group intrinsics of gcodec.kernels.cpu.simd against their scalar definitions.

All are exact (an unsigned integer max, an IEEE binary32 division or multiplication, nearest-even
rounding into an element format), so the check is bit for bit: any lane order mistake in the
transposing tree, any fast-math flag on the arithmetic or a wrong group offset shows as a
mismatch. The element codes are checked against ml_dtypes' casts, an implementation independent
of gcodec's."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from gcodec.kernels.cpu.simd import block_amax16, div_groups16, round_groups16
from gcodec.layout.minifloat import ELEMENTS
from tests.test_formats import ML, ml_codes

GROUPS = (16, 32, 64, 128)


def _amax_kernel(group: int):  # type: ignore[no-untyped-def]
    f = block_amax16(group)

    @njit
    def run(xb, i, mbuf, j):  # type: ignore[no-untyped-def]
        f(xb, np.uint64(i), mbuf, np.uint64(j))

    return run


def _div_kernel(group: int):  # type: ignore[no-untyped-def]
    f = div_groups16(group)

    @njit
    def run(x, i, s, g, t, j):  # type: ignore[no-untyped-def]
        f(x, np.uint64(i), s, np.uint64(g), t, np.uint64(j))

    return run


def _hostile_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random uint32 words with every sign, NaN and infinity patterns and the largest magnitudes
    planted, so the unsigned max of ``bits & 0x7FFFFFFF`` sees the top of its range."""
    w = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x7F7FFFFF, 1], np.uint32)
    at = rng.choice(n, n // 8, replace=False)
    w[at] = rng.choice(special, at.size)
    return w


@pytest.mark.parametrize("group", GROUPS)
def test_block_amax16_is_the_masked_max_of_each_group(group: int) -> None:
    rng = np.random.default_rng(group)
    off, dst = 5, 3  # unaligned source and destination offsets
    xb = _hostile_words(rng, off + 16 * group + 7)
    run = _amax_kernel(group)
    mbuf = np.full(dst + 16 + 2, 0xDEADBEEF, np.uint32)
    run(xb, off, mbuf, dst)
    want = (xb[off : off + 16 * group] & np.uint32(0x7FFFFFFF)).reshape(16, group).max(axis=1)
    np.testing.assert_array_equal(mbuf[dst : dst + 16], want)
    # nothing outside the 16 results is written
    assert (mbuf[:dst] == 0xDEADBEEF).all() and (mbuf[dst + 16 :] == 0xDEADBEEF).all()
    # one group holding the only large word: its lane alone carries it (catches a lane shuffle)
    for b in (0, 7, 15):
        xb2 = np.zeros_like(xb)
        xb2[off + b * group + group - 1] = 0xBF800000  # -1.0
        run(xb2, off, mbuf, dst)
        assert mbuf[dst : dst + 16].tolist() == [0x3F800000 if k == b else 0 for k in range(16)]


@pytest.mark.parametrize("group", GROUPS)
def test_div_groups16_is_the_ieee_quotient_or_the_sign_for_a_zero_scale(group: int) -> None:
    rng = np.random.default_rng(100 + group)
    off, soff, dst = 3, 2, 1
    x = rng.standard_normal(off + 16 * group + 5).astype(np.float32)
    x[off : off + 8] = np.array([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 1.1754944e-38, -2.0], np.float32)
    x[off + 8 : off + 8 + group // 2] *= np.float32(1e-38)  # subnormal quotients
    s = (rng.random(soff + 16 + 1) * 4).astype(np.float32)
    s[soff + 3] = 0.0  # zero scales: the element's sign alone
    s[soff + 9] = -0.0
    s[soff + 0] = np.float32(1e-40)  # a subnormal scale: large quotients, some infinite
    t = np.full(dst + 16 * group + 4, np.float32(7.0))
    _div_kernel(group)(x, off, s, soff, t, dst)
    xs = x[off : off + 16 * group].reshape(16, group)
    sg = s[soff : soff + 16, None]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        want = (xs / sg).astype(np.float32)
    zero = (sg == 0).ravel()
    want[zero] = np.copysign(np.float32(0.0), xs[zero])
    got = t[dst : dst + 16 * group]
    np.testing.assert_array_equal(got.view(np.uint32), want.ravel().view(np.uint32))
    assert (t[:dst] == 7.0).all() and (t[dst + 16 * group :] == 7.0).all()


def _round_kernel(group: int, divide: bool, element: str):  # type: ignore[no-untyped-def]
    el = ELEMENTS[element]
    maxbits = 0 if el.integer else int(np.float32(el.max_value).view(np.uint32))
    f = round_groups16(group, divide, el.mbits, el.emin, maxbits, el.bits, el.integer)

    @njit
    def run(x, i, s, g, out, j):  # type: ignore[no-untyped-def]
        f(x, np.uint64(i), s, np.uint64(g), out, np.uint64(j))

    return run


# MXINT8 has E8M0 scales only: its integer rounding is never divided
ROUND_ELEMENTS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8")
ROUND_CASES = [(e, d) for e in ROUND_ELEMENTS for d in (False, True) if e != "int8" or not d]


@pytest.mark.parametrize("group", (16, 32))
@pytest.mark.parametrize(("element", "divide"), ROUND_CASES)
def test_round_groups16_gives_ml_dtypes_codes_of_the_scaled_values(group: int, divide: bool, element: str) -> None:
    """t = v * s (an E8M0 scale's power of two) or v / s (a divided scale, the sign alone for a zero
    scale), rounded to nearest even and saturated: ml_dtypes' cast of t clamped to the largest
    value (MXINT8: rint(t) clamped to +-127, t holding a * 64)."""
    el = ELEMENTS[element]
    rng = np.random.default_rng(group + 7 * divide + 13 * len(element))
    off, soff, dst = 3, 2, 1
    n = 16 * group
    top = np.float32(el.max_value)
    x = (rng.standard_normal(off + n + 5) * top / 3).astype(np.float32)
    # ties of the format (midpoints of neighbouring values), both signs, the range edges, zeros
    vals = np.unique(np.abs(ml_values_all(element)))
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    k = min(mids.size, n // 2)
    x[off : off + k] = mids[:k] * rng.choice(np.array([-1, 1], np.float32), k)
    x[off + k : off + k + 6] = np.array([0.0, -0.0, top, -top, top * 2, -top * 1.5], np.float32)
    if el.integer:  # the integer rounding reads t as a * 64 (its quantum 2^-6 folded into the scale)
        x *= np.float32(64.0)
    if divide:
        s = rng.uniform(0.25, 4.0, soff + 17).astype(np.float32)
        s[soff + 0] = 1.0  # the ties stay ties
        s[soff + 3] = 0.0
        s[soff + 9] = -0.0
    else:
        s = np.exp2(rng.integers(-3, 4, soff + 17)).astype(np.float32)
        s[soff + 0] = 1.0
    out = np.full(dst + n + 4, 0xA5, np.uint8)
    _round_kernel(group, divide, element)(x, off, s, soff, out, dst)
    xs = x[off : off + n].reshape(16, group)
    sg = s[soff : soff + 16, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (xs / sg if divide else xs * sg).astype(np.float32)
    if divide:
        zero = (sg == 0).ravel()
        t[zero] = np.copysign(np.float32(0.0), xs[zero])
    want = ml_codes(t.ravel() / 64 if el.integer else t.ravel(), element)
    np.testing.assert_array_equal(out[dst : dst + n], want)
    assert (out[:dst] == 0xA5).all() and (out[dst + n :] == 0xA5).all()


def ml_values_all(element: str) -> np.ndarray:
    """Every finite value of the element format (MXINT8: its 255 codes times 2^-6)."""
    el = ELEMENTS[element]
    if el.integer:
        return np.arange(-127, 128, dtype=np.float32) / 64
    v = np.arange(1 << el.bits, dtype=np.uint8).view(ML[element]).astype(np.float32)
    return v[np.isfinite(v)]


@pytest.mark.parametrize("bad", [0, 8, 24, -16])
def test_group_sizes_that_are_not_positive_multiples_of_16_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        block_amax16(bad)
    with pytest.raises(ValueError, match="multiple of 16"):
        div_groups16(bad)
    with pytest.raises(ValueError, match="multiple of 16"):
        round_groups16(bad, False, 3, -6, 0x43E00000, 8, False)
