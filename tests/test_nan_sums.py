"""The NaN rule of every addition gcodec defines (specs/format.md §10, "NaN sums"): where the IEEE
sum is NaN (an operand is NaN, or +inf + -inf), the result is a positive NaN, whatever the operands'
signs, payloads and order. IEEE 754 leaves that NaN to the implementation (x86 keeps the first
operand's NaN and makes inf + -inf a negative NaN; compilers may swap the operands), so each test
feeds NaN pairs in both orders, with both signs, quiet and signalling, with differing payloads, and
checks the exact bits: binary16 0x7E00 and bfloat16 0x7FC0 for 16-bit results, the sign bit clear
for float32 and float64 ones (their payload is not specified).

The CUDA kernels are checked against the same rule under the simulator (tests/test_gpu_sim.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec import aggregate, xp
from gcodec.arrays import BFLOAT16
from gcodec.kernels.cpu import cast as cast_cpu
from gcodec.kernels.cpu import feedback as feedback_cpu
from gcodec.kernels.cpu import memory as memory_cpu
from gcodec.kernels.cpu import simd

U32, U64 = np.uint32, np.uint64

#: float32 NaNs: quiet and signalling, both signs, with and without payloads
NANS32 = [0x7FC00000, 0xFFC00000, 0x7FDA8000, 0xFFCB6DEF, 0x7F800001, 0xFF800123, 0x7FFFFFFF, 0xFFFFFFFF]
#: what they meet: infinities, signed zeros, finite numbers of both signs
OTHERS32 = [0x7F800000, 0xFF800000, 0x00000000, 0x80000000, 0x3FC00000, 0xBFC00000]
NANS64 = [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF4000000000123, 0xFFFC00000000ABCD, 0xFFFFFFFFFFFFFFFF]
OTHERS64 = [0x7FF0000000000000, 0xFFF0000000000000, 0x0, 0x8000000000000000, 0x3FF8000000000000, 0xBFF8000000000000]
#: binary16 and bfloat16: NaNs (quiet, signalling, payloads, both signs), infinities, zeros, +-1.5
NANS16 = {
    "f16": [0x7E00, 0xFE00, 0x7D01, 0xFC01, 0x7FFF, 0xFFFF],
    "bf16": [0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF],
}
OTHERS16 = {
    "f16": [0x7C00, 0xFC00, 0x0000, 0x8000, 0x3E00, 0xBE00],
    "bf16": [0x7F80, 0xFF80, 0x0000, 0x8000, 0x3FC0, 0xBFC0],
}
QNAN16 = {"f16": 0x7E00, "bf16": 0x7FC0}


def nan_pairs(nans: list[int], others: list[int], dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (a, b) of the patterns whose IEEE sum is NaN: a NaN on either side (so
    both orders of each pair), +inf + -inf and -inf + +inf."""
    pats = nans + others
    pairs = [(a, b) for a in pats for b in pats if a in nans or b in nans]
    inf, ninf = others[0], others[1]
    pairs += [(inf, ninf), (ninf, inf)]
    ut = np.uint64 if np.dtype(dtype).itemsize == 8 else np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint16
    a = np.array([p[0] for p in pairs], ut)
    b = np.array([p[1] for p in pairs], ut)
    return (a.view(dtype), b.view(dtype)) if np.dtype(dtype).kind == "f" else (a, b)


def assert_positive_nans(v: np.ndarray) -> None:
    v = np.asarray(v)
    bits = v.view(U64 if v.dtype.itemsize == 8 else U32)
    sign = U64(1 << 63) if v.dtype.itemsize == 8 else U32(1 << 31)
    assert np.isnan(v).all()
    bad = np.flatnonzero(bits & sign)
    assert bad.size == 0, [hex(int(bits[i])) for i in bad[:8]]


def widen16(h: np.ndarray, kind: str) -> np.ndarray:
    out = np.empty(h.size, np.float32)
    getattr(cast_cpu, f"decode_{kind}")(h, out, False)
    return out


@pytest.fixture(params=["scalar", "vector"])
def f16_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The scalar binary16 kernels and the 16-lane ones (the CPU's conversion instructions)."""
    if request.param == "vector" and not simd.HAS_F16:
        pytest.skip("this CPU has no binary16 conversion instructions (x86 F16C, AArch64)")
    monkeypatch.setattr(simd, "HAS_F16", request.param == "vector")
    return str(request.param)


def tiled(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` repeated to ``n`` elements: whole 16-lane blocks and a tail, for the 16-lane kernels."""
    return np.ascontiguousarray(np.resize(a, n))


# ---- error feedback's corrected input c = x + e (x + fl(decay * e)) -------------------------------


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_fused_16_bit_feedback_encodes_a_nan_sum_as_the_positive_quiet_nan(kind: str, f16_path: str) -> None:
    x, e = nan_pairs(NANS32, OTHERS32, np.float32)
    x, e = tiled(x, 16 * 11 + 5), tiled(e, 16 * 11 + 5)
    for a, b in ((x, e), (e, x)):  # the pairs hold both orders already; and x, e swapped whole
        bits, res = np.empty(a.size, np.uint16), np.empty(a.size, np.float32)
        bad = getattr(cast_cpu, f"encode_{kind}_feedback")(a, b, bits, res)
        assert bits.tolist() == [QNAN16[kind]] * a.size
        assert bad == a.size and np.isnan(res).all()  # the residuals are refused by the caller
    # without a residual there is no sum: a NaN input keeps its sign, as the plain encode does
    bits, res = np.empty(x.size, np.uint16), np.empty(x.size, np.float32)
    getattr(cast_cpu, f"encode_{kind}_feedback")(x, None, bits, res)
    plain = np.empty(x.size, np.uint16)
    getattr(cast_cpu, f"encode_{kind}")(x, plain)
    assert bits.tolist() == plain.tolist() and (plain & 0x8000).any()


@pytest.mark.parametrize("dtype, nans, others", [(np.float32, NANS32, OTHERS32), (np.float64, NANS64, OTHERS64)])
@pytest.mark.parametrize("decay", [1.0, 0.5, 0.95])
def test_feedback_sums_are_positive_nans(dtype, nans, others, decay: float) -> None:
    """``add`` (x + e, the generic path's corrected input) and ``add_decayed`` (x + fl(decay * e))."""
    x, e = nan_pairs(nans, others, dtype)
    x, e = tiled(x, 1000), tiled(e, 1000)
    c = np.empty_like(x)
    feedback_cpu.add(c, x, e)
    assert_positive_nans(c)
    d = x.copy()
    feedback_cpu.add_decayed(d, e, decay)
    assert_positive_nans(d)
    d = e.copy()  # the other order
    feedback_cpu.add_decayed(d, x, decay)
    assert_positive_nans(d)


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize("decay", [1.0, 0.9])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_generic_feedback_path_encodes_a_nan_sum_as_the_positive_quiet_nan(codec: str, decay: float, dtype) -> None:
    """ErrorFeedback's generic path (``encode_values``: the corrected input, its values, then the
    residual's check) writes the same bits as the fused kernels for a NaN sum, and refuses it
    (float16 input: widened exactly to the float32 work type first, its NaNs keeping their signs)."""
    if dtype == np.float16:
        a, b = nan_pairs(NANS16["f16"], OTHERS16["f16"], np.float16)
        cases = [(a, b.astype(np.float32))]
    else:
        a, b = nan_pairs(*((NANS64, OTHERS64) if dtype == np.float64 else (NANS32, OTHERS32)), dtype)
        cases = [(a, b), (b, a)]
    for x, e in cases:
        ef = gcodec.ErrorFeedback(codec, decay=decay)
        ef.set_residual("k", e.copy())
        out = np.zeros(x.size, np.uint16)
        with pytest.raises(gcodec.PayloadValueError):
            ef.encode_values(x, "k", out)
        assert out.tolist() == [QNAN16[codec.replace("fp", "f")]] * x.size


def test_generic_feedback_path_of_a_strided_input() -> None:
    x, e = nan_pairs(NANS32, OTHERS32, np.float32)
    wide = np.zeros(2 * x.size, np.float32)
    wide[::2] = x
    ef = gcodec.ErrorFeedback("fp16")
    ef.set_residual("k", e.copy())
    out = np.zeros(x.size, np.uint16)
    with pytest.raises(gcodec.PayloadValueError):
        ef.encode_values(wide[::2], "k", out)
    assert out.tolist() == [0x7E00] * x.size


# ---- accumulating decodes: out = out + y --------------------------------------------------------


def _accumulate_cases(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(out start values as float32, 16-bit payload values): the out NaN with every payload value,
    every out value with a payload NaN, and +inf + -inf in both roles."""
    h_all = NANS16[kind] + OTHERS16[kind]
    o_all = NANS32 + OTHERS32
    pairs = [(o, h) for o in o_all for h in h_all if o in NANS32 or h in NANS16[kind]]
    inf32, ninf32 = OTHERS32[0], OTHERS32[1]
    inf16, ninf16 = OTHERS16[kind][0], OTHERS16[kind][1]
    pairs += [(inf32, ninf16), (ninf32, inf16)]
    o = np.array([p[0] for p in pairs], U32).view(np.float32)
    h = np.array([p[1] for p in pairs], np.uint16)
    return o, h


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float64])
def test_accumulating_16_bit_decodes_make_nan_sums_positive(kind: str, out_dtype, f16_path: str) -> None:
    o, h = _accumulate_cases(kind)
    n = 16 * 9 + 7
    o, h = tiled(o, n), tiled(h, n)
    with np.errstate(invalid="ignore"):
        out = o.astype(out_dtype)
    getattr(cast_cpu, f"decode_{kind}")(h, out, True)
    assert_positive_nans(out)


@pytest.mark.parametrize("codec, kind", [("fp16", "f16"), ("bf16", "bf16")])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float64, np.float16, BFLOAT16])
def test_accumulate_decode_through_the_api(codec: str, kind: str, out_dtype) -> None:
    """gcodec.decode(..., accumulate=True) of a payload that carries NaNs of both signs into an
    ``out`` holding NaNs of both signs and infinities (16-bit outputs: summed in float32 and rounded
    once, the positive NaN staying positive)."""
    o, h = _accumulate_cases(kind)
    y = widen16(h, kind)  # the encoder keeps the NaNs' signs: 0xFE00 stays 0xFE00
    buf = gcodec.encode(y, codec)
    with np.errstate(invalid="ignore"):
        out = o.astype(out_dtype)
    gcodec.decode(buf, out=out, accumulate=True)
    if out.dtype.itemsize == 2:  # the float32 sum rounded once: a positive NaN, its payload unspecified
        assert np.isnan(out.astype(np.float32)).all() and not (out.view(np.uint16) & 0x8000).any()
    else:
        assert_positive_nans(out)


# ---- the binary16 / bfloat16 pair sums -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_pair_sums_of_nans_are_the_positive_quiet_nan(kind: str, f16_path: str) -> None:
    a, b = nan_pairs(NANS16[kind], OTHERS16[kind], np.uint16)
    n = 16 * 5 + 3
    a, b = tiled(a, n), tiled(b, n)
    q = QNAN16[kind]
    for p, r in ((a, b), (b, a)):
        out = np.empty(n, np.uint16)
        assert getattr(cast_cpu, f"sum2_{kind}")(p, r, out) == n
        assert out.tolist() == [q] * n
        inplace = p.copy()
        getattr(cast_cpu, f"sum2_{kind}")(inplace, r, inplace)
        assert inplace.tolist() == [q] * n
        wide = np.empty(n, np.float32)
        assert getattr(cast_cpu, f"sum2_widen_{kind}")(p, r, wide) == n
        assert wide.view(U32).tolist() == [0x7FC00000] * n


def test_aggregate_sums_of_nans_are_positive() -> None:
    """aggregate.sum_pair and add_values (float32 and float64 values: the host's NumPy path) and
    xp.add, as a device sums them."""
    for dtype, nans, others in ((np.float32, NANS32, OTHERS32), (np.float64, NANS64, OTHERS64)):
        a, b = nan_pairs(nans, others, dtype)
        for p, r in ((a, b), (b, a)):
            out = np.empty_like(p)
            assert aggregate.sum_pair(p, r, out) == p.size
            assert_positive_nans(out)
            acc = p.copy()
            aggregate.add_values(r, acc)
            assert_positive_nans(acc)
    for kind, dt in (("f16", np.float16), ("bf16", BFLOAT16)):
        a, b = nan_pairs(NANS16[kind], OTHERS16[kind], np.uint16)
        out = np.empty(a.size, np.uint16)
        aggregate.sum_pair(a.view(dt), b.view(dt), out.view(dt))
        assert out.tolist() == [QNAN16[kind]] * a.size


@pytest.mark.parametrize(
    "dst_dtype, src_dtype",
    [(np.float32, np.float32), (np.float64, np.float64), (np.float64, np.float32), (np.float32, np.float64)],
)
def test_memory_accumulate_makes_nan_sums_positive(dst_dtype, src_dtype) -> None:
    nans, others = (NANS64, OTHERS64) if np.dtype(src_dtype).itemsize == 8 else (NANS32, OTHERS32)
    a, b = nan_pairs(nans, others, src_dtype)
    for p, r in ((a, b), (b, a)):
        with np.errstate(invalid="ignore"):
            dst = p.astype(dst_dtype)
        memory_cpu.copy(dst, r, True)
        assert_positive_nans(dst)
        with np.errstate(invalid="ignore"):
            dst = p.astype(dst_dtype)
        xp.add(dst, r)
        assert_positive_nans(dst)


def test_xp_add_into_16_bit_values() -> None:
    """xp.add of float32 into float16 or bfloat16 values (NumPy's promotion, rounded once): a NaN
    sum is the positive quiet NaN of the 16-bit type."""
    for kind, dt in (("f16", np.float16), ("bf16", BFLOAT16)):
        a, _ = nan_pairs(NANS16[kind], OTHERS16[kind], np.uint16)
        _, b = nan_pairs(NANS32[: len(NANS16[kind])], OTHERS32, np.float32)
        dst = a.copy().view(dt)
        with np.errstate(invalid="ignore"):
            xp.add(dst, b)
        bits = dst.view(np.uint16)
        assert np.isnan(dst.astype(np.float32)).all() and not (bits & 0x8000).any()


# ---- codecs whose decoded values are finite: a NaN already in out --------------------------------

DENSE = [
    {"id": "uniform", "bits": 8},
    {"id": "uniform", "bits": 4, "group_size": 16},
    {"id": "uniform", "bits": 8, "scale_dtype": "float16"},
    {"id": "qsgd", "levels": 15, "seed": 1},
    {"id": "terngrad", "seed": 2},
    {"id": "sign"},
    {"id": "sign", "group_size": 48},
    {"id": "fp8"},
    {"id": "mx", "element": "e2m1"},
    {"id": "mx", "element": "e3m2"},
    {"id": "nvfp4"},
    {"id": "dct", "chunk": 64, "k": 8},
]
SPARSE = [
    ({"id": "topk", "k": 37}, 37),
    ({"id": "randomk", "k": 50, "seed": 3}, 50),
    ({"id": "chunktopk", "chunk": 64, "k": 4}, None),
]


def _negative_nans(n: int, dtype) -> np.ndarray:
    if np.dtype(dtype).itemsize == 8:
        return np.resize(np.array([n_ for n_ in NANS64 if n_ >> 63], U64), n).view(np.float64)
    return np.resize(np.array([n_ for n_ in NANS32 if n_ >> 31], U32), n).view(np.float32)


@pytest.mark.parametrize("cfg", DENSE, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accumulating_into_a_negative_nan_gives_a_positive_nan(cfg: dict, dtype) -> None:
    """Decoded values of these codecs are finite, so a NaN sum only comes from a NaN already in
    ``out``: a single NaN, which a CPU's addition passes on with its sign; the rule makes it positive."""
    x = np.random.default_rng(7).standard_normal(320).astype(dtype)
    buf = gcodec.encode(x, cfg)
    out = _negative_nans(x.size, dtype)
    gcodec.decode(buf, out=out, accumulate=True)
    assert_positive_nans(out)


def test_powersgd_accumulate_into_a_negative_nan() -> None:
    x = np.random.default_rng(8).standard_normal((24, 20)).astype(np.float32)
    buf = gcodec.encode(x, {"id": "powersgd", "rank": 2, "seed": 1})
    out = _negative_nans(x.size, np.float32).reshape(x.shape)
    gcodec.decode(buf, out=out, accumulate=True)
    assert_positive_nans(out)


@pytest.mark.parametrize("cfg, k", SPARSE, ids=lambda c: c["id"] if isinstance(c, dict) else str(c))
def test_sparse_accumulate_makes_the_listed_nan_sums_positive(cfg: dict, k: int | None) -> None:
    """Sparse codecs add only at the listed indices: those NaN sums become positive, the other
    elements of ``out`` are left exactly as they were."""
    x = np.random.default_rng(9).standard_normal(640).astype(np.float32)
    buf = gcodec.encode(x, cfg)
    listed = gcodec.decode(buf) != 0  # every kept value of this input is nonzero
    before = _negative_nans(x.size, np.float32)
    out = before.copy()
    gcodec.decode(buf, out=out, accumulate=True)
    assert_positive_nans(out[listed])
    assert out.view(U32)[~listed].tolist() == before.view(U32)[~listed].tolist()
    assert int(listed.sum()) == (k if k is not None else 4 * 640 // 64)
