"""The fp16 / bf16 cast kernels against a NumPy transcription of the spec tables (fp16.md, bf16.md §3-4).

Every binary16 / bfloat16 pattern is decoded, and float32 patterns are encoded densely around every
case boundary and binary16 rounding point plus a random sample. (The rewrite of the kernels was
also checked against the previous implementation over all 2**32 float32 patterns.)
"""

from __future__ import annotations

import numpy as np
import pytest

from gcodec.kernels.cpu import cast as cast_cpu
from gcodec.kernels.cpu import simd

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


def pos_nan(c: np.ndarray) -> np.ndarray:
    """specs/format.md §10's NaN rule on a float array of sums: every NaN made positive (sign bit
    cleared; the payload is left as NumPy's addition gave it, and is not compared)."""
    c = c.copy()
    nan = np.isnan(c)
    c[nan] = np.abs(c[nan])
    return c


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


@pytest.fixture(params=["scalar", "vector"])
def f16_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through the scalar binary16 kernels and through the 16-lane ones that use the
    CPU's conversion instructions (kernels/cpu/simd.py); the same bits are required of both."""
    if request.param == "vector" and not simd.HAS_F16:
        pytest.skip("this CPU has no binary16 conversion instructions (x86 F16C, AArch64)")
    monkeypatch.setattr(simd, "HAS_F16", request.param == "vector")
    return str(request.param)


@pytest.mark.parametrize(
    "kernel, ref", [(cast_cpu.encode_f16, ref_f16), (cast_cpu.encode_bf16, ref_bf16)], ids=["fp16", "bf16"]
)
def test_encode_matches_spec(patterns: np.ndarray, kernel, ref, f16_path: str) -> None:
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
def test_decode_every_pattern(accumulate: bool, f16_path: str) -> None:
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
        if accumulate:  # a NaN sum is a positive NaN (format.md §10), its payload unspecified
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(out), nan)
            assert not (out.view(U32)[nan] >> U32(31)).any()
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
def test_lengths(n: int, f16_path: str) -> None:
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


def _ref_sum(a: np.ndarray, b: np.ndarray, kind: str) -> np.ndarray:
    """The pair sum's bits from the spec tables: each operand widened, added in float32 from +0,
    rounded once (aggregate.sum_pair)."""
    if kind == "f16":
        fa, fb = ref_f16_decode(a), ref_f16_decode(b)
    else:
        fa, fb = ((x.astype(U32) << 16).view(np.float32) for x in (a, b))
    with np.errstate(invalid="ignore", over="ignore"):
        s = pos_nan((np.float32(0) + fa) + fb)  # a NaN sum is +NaN (format.md §10)
    return (ref_f16 if kind == "f16" else ref_bf16)(s.view(U32))


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("n", [1 << 16, 15, 16, 17, 1000, cast_cpu.CHUNK + 33])
def test_pair_sums_and_their_widening(kind: str, n: int, f16_path: str) -> None:
    """sum2 (bits) and sum2_widen (their float32, one pass) against the spec tables' sum, every
    16-bit pattern against a permutation of them, lengths with a tail off the 16-lane blocks, in
    place into the first operand too; both count the sums that are infinite or NaN."""
    rng = np.random.default_rng(n)
    a = (np.arange(n, dtype=np.uint32) * 40503).astype(np.uint16)  # every pattern when n = 2**16
    b = rng.permutation(a)
    want = _ref_sum(a, b, kind)
    exp = 0x7C00 if kind == "f16" else 0x7F80
    nan = (want & 0x7FFF) > exp
    want_bad = int(((want & exp) == exp).sum())
    assert want_bad > 0 or n < 1000  # the inputs reach infinity and NaN
    got = np.empty_like(a)
    assert getattr(cast_cpu, f"sum2_{kind}")(a, b, got) == want_bad
    # NaN sums are the positive quiet NaN, exactly: 0x7E00 / 0x7FC0 (format.md §10)
    assert (want[nan] == (0x7E00 if kind == "f16" else 0x7FC0)).all() and (nan.any() or n < 1000)
    assert got.tolist() == want.tolist()
    wide = np.full(n + 1, 1.5, np.float32)
    assert getattr(cast_cpu, f"sum2_widen_{kind}")(a, b, wide[:n]) == want_bad
    want_wide = ref_f16_decode(want) if kind == "f16" else (want.astype(U32) << 16).view(np.float32)
    assert (want_wide.view(U32)[nan] == 0x7FC00000).all() and wide[n] == 1.5
    assert wide[:n].view(U32).tolist() == want_wide.view(U32).tolist()
    inplace = a.copy()
    getattr(cast_cpu, f"sum2_{kind}")(inplace, b, inplace)
    assert inplace.tolist() == want.tolist()
    # -0 + -0 is +0, as an accumulator that starts at +0 sums (17: a 16-lane block and a tail)
    neg0 = np.full(17, 0x8000, np.uint16)
    getattr(cast_cpu, f"sum2_{kind}")(neg0, neg0.copy(), got[:17])
    getattr(cast_cpu, f"sum2_widen_{kind}")(neg0, neg0, wide[:17])
    assert not got[:17].any() and not wide[:17].view(U32).any()


def test_strided_arrays_take_the_scalar_kernels() -> None:
    """A strided view is not what the 16-lane kernels are typed for: it goes through the scalar
    kernels (same bits), never a copy and never a typing error."""
    x = np.linspace(-70000, 70000, 2001, dtype=np.float32)[::2]
    out = np.empty(x.size, np.uint16)
    cast_cpu.encode_f16(x, out)
    assert out.tolist() == ref_f16(x.view(U32)).tolist()
    y = np.zeros(2 * x.size, np.float32)[::2]
    cast_cpu.decode_f16(out, y, False)
    assert y.view(U32).tolist() == ref_f16_decode(out).view(U32).tolist()


@pytest.mark.parametrize(
    "kernel, ref, dec",
    [
        (cast_cpu.encode_f16_feedback, ref_f16, cast_cpu.decode_f16),
        (cast_cpu.encode_bf16_feedback, ref_bf16, cast_cpu.decode_bf16),
    ],
    ids=["fp16", "bf16"],
)
@pytest.mark.parametrize("with_residual", [True, False])
def test_feedback_kernels_are_the_sum_the_spec_rounding_and_the_exact_residual(
    patterns: np.ndarray, kernel, ref, dec, with_residual: bool, f16_path: str
) -> None:
    """encode_*_feedback on every pattern of the encode test as x and a shuffled copy as e: the bits
    are the spec's rounding of the float32 sum c = x + e (x alone without a residual), the residual
    is c minus the decoded bits in float32, and the count is how many residuals are infinite or NaN
    (NumPy's float32 arithmetic is the reference, a NaN sum made positive as format.md §10 says;
    a NaN residual's payload is not compared)."""
    x = patterns.view(np.float32)
    e = np.random.default_rng(5).permutation(x) if with_residual else None
    with np.errstate(all="ignore"):
        c = pos_nan(x + e) if e is not None else x.copy()
        want_bits = ref(c.view(np.uint32))
        widened = np.empty(c.size, np.float32)
        dec(want_bits, widened, False)
        want_res = c - widened
    bits, res = np.empty(x.size, np.uint16), np.empty(x.size, np.float32)
    bad = kernel(x, e, bits, res)
    assert np.array_equal(bits, want_bits)
    nan = np.isnan(want_res)
    assert np.array_equal(np.isnan(res), nan)
    assert np.array_equal(res[~nan].view(np.uint32), want_res[~nan].view(np.uint32))
    assert bad == int(np.count_nonzero(~np.isfinite(want_res)))
