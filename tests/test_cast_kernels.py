"""The fp16 / bf16 cast kernels against a NumPy transcription of the spec tables (fp16.md, bf16.md §3-4).

Every binary16 / bfloat16 pattern is decoded, and float32 patterns are encoded densely around every
case boundary and binary16 rounding point plus a random sample. (The rewrite of the kernels was
also checked against the previous implementation over all 2**32 float32 patterns.)
"""

from __future__ import annotations

import numpy as np
import pytest

from gcodec.kernels.cpu import cast as cast_cpu

U32 = np.uint32


def ref_f16(u: np.ndarray) -> np.ndarray:
    """specs/codecs/fp16.md §3 step 2, on float32 bit patterns."""
    u = u.astype(np.uint32)
    sign = (u >> U32(16)) & U32(0x8000)
    a = u & U32(0x7FFFFFFF)
    normal = (a - U32(0x38000000) + U32(0x0FFF) + ((a >> U32(13)) & U32(1))) >> U32(13)
    small = np.where(a < U32(0x38800000), a, U32(0)).view(np.float32).astype(np.float64)
    sub = np.rint(small * 2.0**24).astype(np.uint32)  # exact in float64, rint is half-even
    h = np.where(a < U32(0x38800000), sub, normal)
    h = np.where(a >= U32(0x477FF000), U32(0x7C00), h)
    h = np.where(a > U32(0x7F800000), U32(0x7E00), h)
    return (h | sign).astype(np.uint16)


def ref_bf16(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.uint32)
    r = (u + U32(0x7FFF) + ((u >> U32(16)) & U32(1))) >> U32(16)
    nan = ((u >> U32(16)) & U32(0x8000)) | U32(0x7FC0)
    return np.where((u & U32(0x7FFFFFFF)) > U32(0x7F800000), nan, r).astype(np.uint16)


def ref_f16_decode(h: np.ndarray) -> np.ndarray:
    hu = h.astype(np.uint32)
    sign = (hu & U32(0x8000)) << U32(16)
    em = hu & U32(0x7FFF)
    bits = np.where(em >= U32(0x7C00), (em << U32(13)) + U32(0x70000000), (em << U32(13)) + U32(0x38000000))
    sub = (em.astype(np.float64) * 2.0**-24).astype(np.float32).view(np.uint32)
    bits = np.where(em < U32(0x0400), sub, bits)
    return (bits | sign).view(np.float32)


def _patterns() -> np.ndarray:
    """float32 patterns around every boundary of the spec tables and every binary16 rounding point."""
    rng = np.random.default_rng(7)
    # every binary16 value, the points halfway between neighbours, and up to 2 float32 ulps either side
    half = np.arange(0x7C01, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    mid = ((half[:-1].astype(np.float64) + half[1:]) / 2).astype(np.float32)
    pts = np.concatenate([half, mid]).view(np.uint32)
    pts = np.concatenate([pts + d for d in (U32(0), U32(1), U32(2))] + [pts[pts > 2] - d for d in (U32(1), U32(2))])
    edges = np.array(
        [
            0x38800000,
            0x477FF000,
            0x47800000,
            0x7F7F8000,
            0x7F800000,
            0x7F800001,
            0x7FC00000,
            0x7FFFFFFF,
            0x33000000,
            0x33800000,
            0x00000001,
            0x007FFFFF,
            0x00008000,
            0x00018000,
        ],
        dtype=np.int64,
    )
    near = (edges[:, None] + np.arange(-3, 4)).reshape(-1).clip(0, 0x7FFFFFFF).astype(np.uint32)
    bf = (np.arange(1 << 16, dtype=np.uint32) << U32(16))[:, None] + np.array([0, 0x7FFF, 0x8000, 0x8001], U32)
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    u = np.concatenate([pts, near, bf.reshape(-1), rand]) & U32(0x7FFFFFFF)
    return np.concatenate([u, u | U32(0x80000000)])


@pytest.fixture(scope="module")
def patterns() -> np.ndarray:
    return _patterns()


@pytest.mark.parametrize(
    "kernel, ref", [(cast_cpu.encode_f16, ref_f16), (cast_cpu.encode_bf16, ref_bf16)], ids=["fp16", "bf16"]
)
def test_encode_matches_spec(patterns: np.ndarray, kernel, ref) -> None:
    out = np.empty(patterns.size, np.uint16)
    kernel(patterns.view(np.float32), out)
    want = ref(patterns)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, [(hex(patterns[i]), hex(out[i]), hex(want[i])) for i in bad[:5]]
    # float64 input is rounded to float32 first (spec step 1)
    with np.errstate(invalid="ignore"):
        x64 = patterns.view(np.float32).astype(np.float64)
    out64 = np.empty(x64.size, np.uint16)
    kernel(x64, out64)
    assert np.array_equal(out64, out)


def test_encode_f16_matches_numpy(patterns: np.ndarray) -> None:
    x = patterns.view(np.float32)
    out = np.empty(x.size, np.uint16)
    cast_cpu.encode_f16(x, out)
    ok = ~np.isnan(x)
    with np.errstate(over="ignore"):
        assert np.array_equal(out[ok], x[ok].astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("accumulate", [False, True])
def test_decode_every_pattern(accumulate: bool) -> None:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    start = np.random.default_rng(3).standard_normal(h.size).astype(np.float32)
    for kernel, ref in (
        (cast_cpu.decode_f16, ref_f16_decode(h)),
        (cast_cpu.decode_bf16, (h.astype(U32) << 16).view(np.float32)),
    ):
        out = start.copy() if accumulate else np.empty(h.size, np.float32)
        kernel(h, out, accumulate)
        with np.errstate(invalid="ignore"):
            want = start + ref if accumulate else ref
        if accumulate:
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(out), nan)
            assert np.array_equal(out.view(U32)[~nan], want.view(U32)[~nan])
        else:
            assert np.array_equal(out.view(U32), want.view(U32))  # NaN payloads too


def test_roundtrip_identity() -> None:
    """decode then encode gives back every non-NaN pattern; NaNs become the canonical quiet NaN."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for enc, dec, exp_mask, qnan in (
        (cast_cpu.encode_f16, cast_cpu.decode_f16, 0x7C00, 0x7E00),
        (cast_cpu.encode_bf16, cast_cpu.decode_bf16, 0x7F80, 0x7FC0),
    ):
        y = np.empty(h.size, np.float32)
        dec(h, y, False)
        back = np.empty(h.size, np.uint16)
        enc(y, back)
        nan = ((h & exp_mask) == exp_mask) & ((h & (0x7FFF ^ exp_mask)) != 0)
        assert np.array_equal(back[~nan], h[~nan])
        assert np.array_equal(back[nan], (h[nan] & 0x8000) | qnan)


@pytest.mark.parametrize(
    "n", [0, 1, 7, 8, 9, cast_cpu.CHUNK - 1, cast_cpu.CHUNK, cast_cpu.CHUNK + 9, 3 * cast_cpu.CHUNK + 5]
)
def test_lengths(n: int) -> None:
    rng = np.random.default_rng(n)
    u = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    for enc, dec, ref in (
        (cast_cpu.encode_f16, cast_cpu.decode_f16, ref_f16),
        (cast_cpu.encode_bf16, cast_cpu.decode_bf16, ref_bf16),
    ):
        out = np.full(n + 1, 0xABCD, np.uint16)
        enc(u.view(np.float32), out[:n])
        assert np.array_equal(out[:n], ref(u)) and out[n] == 0xABCD
        y = np.full(n + 1, 1.5, np.float32)
        dec(out[:n], y[:n], True)
        assert y[n] == 1.5
