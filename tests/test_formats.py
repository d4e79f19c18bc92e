"""``fp8``, ``mx`` and ``nvfp4`` against independent references: ml_dtypes' and torch's casts.

Each reference below re-derives a payload's scales and element codes from the spec pages
(specs/codecs/fp8.md §4, mx.md §5, nvfp4.md §4) with ml_dtypes (and torch where it has the type)
doing the rounding into the element format, and checks gcodec's sections and decoded values bit for
bit. The element casts saturate first (``clip`` to the largest finite value), because ml_dtypes
turns an E4M3 overflow into NaN and an E5M2 overflow into infinity where the codecs saturate.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import gcodec
from gcodec.layout.minifloat import ELEMENTS, magnitude_value

F32 = np.float32
ML = {name: np.dtype(getattr(ml_dtypes, el.ml_dtypes_name)) for name, el in ELEMENTS.items() if el.ml_dtypes_name}
FLOATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")


# --------------------------------------------------------------------------------------------
# reading a payload's sections (format.md §6: offsets are relative to the data area)


def sections(buf) -> dict[str, np.ndarray]:
    info = gcodec.validate(buf)
    b = bytes(buf)
    d = (16 + info.header_nbytes + 7) // 8 * 8
    out = {}
    for name, et, off, nb in info.tensors[0].sections:
        out[name] = np.frombuffer(b, np.dtype("<" + et), nb // np.dtype(et).itemsize, d + off)
    return out


def unpack(codes: np.ndarray, n: int, bits: int) -> np.ndarray:
    """The first n ``bits``-wide fields of a little-endian bit stream (mx.md §4), as uint8."""
    if bits == 8:
        return codes[:n].astype(np.uint8)
    stream = np.unpackbits(codes, bitorder="little")[: n * bits].reshape(n, bits)
    return (stream.astype(np.uint16) << np.arange(bits, dtype=np.uint16)).sum(1).astype(np.uint8)


def ml_codes(t: np.ndarray, element: str) -> np.ndarray:
    """ml_dtypes' nearest-even codes of ``t`` (float64 or float32), saturated at the largest value."""
    el = ELEMENTS[element]
    if el.integer:
        q = np.clip(np.rint(np.asarray(t, np.float64) * 64), -127, 127).astype(np.int64)
        return (q & 0xFF).astype(np.uint8)
    top = el.max_value
    c = np.clip(t, -top, top).astype(ML[element]).view(np.uint8)
    return c & ((1 << el.bits) - 1)  # ml_dtypes keeps sub-byte codes in the low bits of a byte


def ml_values(codes: np.ndarray, element: str) -> np.ndarray:
    el = ELEMENTS[element]
    if el.integer:
        return (codes.view(np.int8).astype(np.float32) * F32(2.0**-6)).astype(F32)
    return codes.view(ML[element]).astype(F32)


def floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) for a > 0 (exact: frexp), and -inf's stand-in -10**6 for a == 0."""
    _, e = np.frexp(np.asarray(a, np.float64))
    return np.where(a > 0, e - 1, -(10**6))


# --------------------------------------------------------------------------------------------
# the references


def ref_fp8_f32(x: np.ndarray, element: str, g: int):
    el = ELEMENTS[element]
    n = x.size
    codes = np.zeros(n, np.uint8)
    scales = np.zeros(-(-n // g), F32)
    for gi in range(scales.size):
        v = x[gi * g : (gi + 1) * g]
        s = F32(np.abs(v).max()) / F32(el.max_value)
        scales[gi] = s
        if s == 0:
            codes[gi * g : gi * g + v.size] = np.signbit(v).astype(np.uint8) << 7
        else:
            codes[gi * g : gi * g + v.size] = ml_codes((v / s).astype(F32), element)
    y = (ml_values(codes, element) * np.repeat(scales, g)[:n]).astype(F32)
    return scales, codes, y


def ref_pow2(x: np.ndarray, element: str, g: int):
    el = ELEMENTS[element]
    n = x.size
    codes = np.zeros(n, np.uint8)
    sc = np.zeros(-(-n // g), np.uint8)
    for gi in range(sc.size):
        v = x[gi * g : (gi + 1) * g].astype(np.float64)
        k = max(int(floor_log2(np.abs(v).max())) - el.emax, -127)
        sc[gi] = k + 127
        codes[gi * g : gi * g + v.size] = ml_codes(v * 2.0**-k, element)  # exact: a power of two
    x_scale = np.array([2.0 ** (int(c) - 127) for c in sc], F32)
    y = (ml_values(codes, element) * np.repeat(x_scale, g)[:n]).astype(F32)
    return sc, codes, y


def ref_nvfp4(x: np.ndarray):
    n = x.size
    S = F32(F32(np.abs(x).max() if n else 0) / F32(2688.0))
    bcodes = np.zeros(-(-n // 16), np.uint8)
    codes = np.zeros(n, np.uint8)
    sbs = np.zeros(bcodes.size, F32)
    for b in range(bcodes.size):
        v = x[b * 16 : (b + 1) * 16]
        if S > 0:
            r = F32(F32(np.abs(v).max()) / F32(6.0)) / S
            bcodes[b] = ml_codes(np.array([r], F32), "e4m3")[0]
        sb = F32(ml_values(bcodes[b : b + 1], "e4m3")[0] * S)
        sbs[b] = sb
        if sb == 0:
            codes[b * 16 : b * 16 + v.size] = np.signbit(v).astype(np.uint8) << 3
        else:
            codes[b * 16 : b * 16 + v.size] = ml_codes((v / sb).astype(F32), "e2m1")
    y = (ml_values(codes, "e2m1") * np.repeat(sbs, 16)[:n]).astype(F32)
    return S, bcodes, codes, y


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a.view(np.uint8) == b.view(np.uint8)).all())


# --------------------------------------------------------------------------------------------
# inputs: every finite value, ties, subnormals, range edges


def all_finite_values(element: str) -> np.ndarray:
    """Every finite value of the format, both signs (+0 and -0), as float32."""
    el = ELEMENTS[element]
    if el.integer:
        return (np.arange(-127, 128) * 2.0**-6).astype(F32)
    mags = [magnitude_value(el, c) for c in range(el.maxcode + 1)]
    return np.array(mags + [-m for m in mags], F32)


def ties(element: str) -> np.ndarray:
    """The midpoints of neighbouring finite magnitudes (exact in float32): nearest-even decides each."""
    v = np.unique(np.abs(all_finite_values(element)).astype(np.float64))
    mid = (v[1:] + v[:-1]) / 2
    return np.concatenate([mid, -mid]).astype(F32)


def random_inputs(n: int, seed: int) -> np.ndarray:
    """Random binary32 values over a wide exponent range (binary32 subnormals included), with zeros."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 0x7F800000, n, dtype=np.uint32) | (rng.integers(0, 2, n, dtype=np.uint32) << 31)
    x = bits.view(F32)
    x = np.where(rng.random(n) < 0.5, rng.standard_normal(n).astype(F32) * F32(3.0), x)  # many groups of similar size
    x[rng.random(n) < 0.03] = 0.0
    return x.astype(F32)


def with_max_first(v: np.ndarray, element: str, g: int) -> np.ndarray:
    """``v`` in groups of ``g - 1`` values, each group led by the format's largest value, so that every
    scale is exactly 1 (float32 scales: max/max; E8M0: 2^(emax - emax))."""
    top = ELEMENTS[element].max_value
    k = g - 1
    pad = (-v.size) % k
    vv = np.concatenate([v, np.zeros(pad, F32)]).reshape(-1, k)
    return np.concatenate([np.full((vv.shape[0], 1), top, F32), vv], axis=1).reshape(-1)


# --------------------------------------------------------------------------------------------
# every finite value reproduces its own code


@pytest.mark.parametrize("element", [*FLOATS, "int8"])
def test_mx_every_finite_value_keeps_its_code(element):
    v = all_finite_values(element)
    x = with_max_first(v, element, 32)
    buf = gcodec.get_codec("mx", element=element).encode(x)
    s = sections(buf)
    assert (s["scales"] == 127).all()  # X = 2^0
    got = unpack(s["elements"], x.size, ELEMENTS[element].bits)
    assert (got == ml_codes(x, element)).all()
    y = gcodec.decode(buf)
    assert same_bits(y, x)  # signs of zero included


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_dtype", ["float32", "e8m0"])
def test_fp8_every_finite_value_keeps_its_code(element, scale_dtype):
    x = with_max_first(all_finite_values(element), element, 64)
    buf = gcodec.get_codec("fp8", element=element, group_size=64, scale_dtype=scale_dtype).encode(x)
    s = sections(buf)
    assert (s["scales"] == (1.0 if scale_dtype == "float32" else 127)).all()
    assert (s["elements"] == x.astype(ML[element]).view(np.uint8)).all()
    assert same_bits(gcodec.decode(buf), x)


@pytest.mark.parametrize("element", [*FLOATS, "int8"])
def test_ties_round_to_even_like_ml_dtypes(element):
    x = with_max_first(ties(element), element, 32)
    buf = gcodec.get_codec("mx", element=element).encode(x)
    got = unpack(sections(buf)["elements"], x.size, ELEMENTS[element].bits)
    want = ml_codes(x, element)
    assert (got == want).all()
    assert (got[1:32] & 1 == 0).sum() > 0  # ties exist and some went to the even neighbour


# --------------------------------------------------------------------------------------------
# random inputs against the references


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("g", [1, 7, 32, 128])
def test_fp8_float32_scales_match_ml_dtypes(element, g):
    # 16 whole groups at a time for g = 32 (simd.block_amax16, div_groups16; 70 001 elements: many
    # sub-blocks and a short last group), the per-group loops for the others
    x = random_inputs(3001 if g != 32 else 70_001, g)
    buf = gcodec.get_codec("fp8", element=element, group_size=g).encode(x)
    s = sections(buf)
    scales, codes, y = ref_fp8_f32(x, element, g)
    assert same_bits(s["scales"], scales)
    assert (s["elements"] == codes).all()
    assert same_bits(gcodec.decode(buf), y)


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("g", [3, 32, 100])
def test_fp8_e8m0_scales_match_ml_dtypes(element, g):
    x = random_inputs(2000, 10 + g)
    buf = gcodec.get_codec("fp8", element=element, group_size=g, scale_dtype="e8m0").encode(x)
    s = sections(buf)
    sc, codes, y = ref_pow2(x, element, g)
    assert (s["scales"] == sc).all()
    assert (s["elements"] == codes).all()
    assert same_bits(gcodec.decode(buf), y)


@pytest.mark.parametrize("element", [*FLOATS, "int8"])
@pytest.mark.parametrize("n", [1, 31, 33, 1000, 4099, 70_001])
def test_mx_matches_ml_dtypes(element, n):
    x = random_inputs(n, n)
    if n > 4096:  # 16 groups at a time (simd.round_groups16), with groups among them whose E8M0
        # power of two is not a normal binary32 number (MXINT8: a zero or tiny group), which send
        # the rest of their batch through the per-group loops
        x[32 * 5 : 32 * 6] = 0.0
        x[32 * 40 : 32 * 41] *= F32(1e-37)
        x[32 * 100 : 32 * 101] = F32(3e38)
    buf = gcodec.get_codec("mx", element=element).encode(x)
    s = sections(buf)
    sc, codes, y = ref_pow2(x, element, 32)
    assert (s["scales"] == sc).all()
    assert (unpack(s["elements"], n, ELEMENTS[element].bits) == codes).all()
    assert same_bits(gcodec.decode(buf), y)


def test_e8m0_scales_are_ml_dtypes_powers_of_two():
    """The scale byte is the float8_e8m0fnu pattern of X (ml_dtypes rounds other values to a power
    of two; a power of two converts exactly)."""
    x = random_inputs(32 * 200, 5)
    sc = sections(gcodec.get_codec("mx", element="e4m3").encode(x))["scales"]
    xs = np.array([2.0 ** (int(c) - 127) for c in sc], np.float64)
    assert (xs.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8) == sc).all()
    assert (sc.view(ml_dtypes.float8_e8m0fnu).astype(np.float64) == xs).all()


@pytest.mark.parametrize("n", [1, 15, 16, 17, 999, 4096, 70_001])
def test_nvfp4_matches_ml_dtypes(n):
    x = random_inputs(n, 100 + n)
    if n > 4096:  # whole zero blocks inside a batch of 16 (a zero scale: the signs alone)
        x[16 * 5 : 16 * 6] = 0.0
        x[16 * 40 : 16 * 41] = -0.0
    buf = gcodec.get_codec("nvfp4").encode(x)
    s = sections(buf)
    S, bcodes, codes, y = ref_nvfp4(x)
    assert same_bits(s["tensor_scale"], np.array([S], F32))
    assert (s["scales"] == bcodes).all()
    assert (unpack(s["elements"], n, 4) == codes).all()
    assert same_bits(gcodec.decode(buf), y)


def test_nvfp4_gaussian_blocks_use_the_e4m3_mantissa():
    x = np.random.default_rng(3).standard_normal(16 * 500).astype(F32)
    buf = gcodec.get_codec("nvfp4").encode(x)
    _, bcodes, _, y = ref_nvfp4(x)
    s = sections(buf)
    assert (s["scales"] == bcodes).all() and len(np.unique(bcodes & 7)) == 8
    assert same_bits(gcodec.decode(buf), y)


def test_range_edges_saturate_and_subnormals_round():
    """The largest finite value, values beyond it up to the block's power of two (they saturate),
    the smallest subnormal, half of it (a tie: to zero, the sign kept) and three quarters of it."""
    for element in FLOATS:
        el = ELEMENTS[element]
        top = el.max_value
        edge = float(np.nextafter(F32(2.0 ** (el.emax + 1)), F32(0)))  # the block's exponent stays emax
        tiny = magnitude_value(el, 1)
        x = np.array([top, top * 1.0625, edge, -edge, tiny, tiny / 2, tiny * 0.75, -tiny / 2, 0.0], F32)
        x = with_max_first(x, element, 32)  # x[j + 1] is the j-th value above
        buf = gcodec.get_codec("mx", element=element).encode(x)
        assert (sections(buf)["scales"] == 127).all()
        got = unpack(sections(buf)["elements"], x.size, el.bits)
        assert (got == ml_codes(x, element)).all(), element
        assert got[2] == got[3] == el.maxcode and got[4] == el.sign_bit | el.maxcode  # saturated, not NaN
        assert got[5] == 1 and got[6] == 0 and got[7] == 1 and got[8] == el.sign_bit


# --------------------------------------------------------------------------------------------
# torch's dtypes


try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is in the dev environment
    _torch = None

needs_torch = pytest.mark.skipif(_torch is None, reason="torch is not importable")


@needs_torch
@pytest.mark.parametrize("element,tdt", [("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2")])
def test_fp8_elements_match_torch(element, tdt):
    x = random_inputs(4000, 7)
    buf = gcodec.get_codec("fp8", element=element, group_size=64).encode(x)
    s = sections(buf)
    top = ELEMENTS[element].max_value
    sc = np.repeat(s["scales"], 64)[: x.size]
    t = np.where(sc > 0, x / np.where(sc > 0, sc, 1), 0).astype(F32)
    want = _torch.from_numpy(np.clip(t, -top, top)).to(getattr(_torch, tdt)).view(_torch.uint8).numpy()
    zero = sc == 0
    want = np.where(zero, np.signbit(x).astype(np.uint8) << 7, want)
    assert (s["elements"] == want).all()
    back = _torch.from_numpy(s["elements"].copy()).view(getattr(_torch, tdt)).to(_torch.float32).numpy()
    assert same_bits(gcodec.decode(buf), (back * sc).astype(F32))


@needs_torch
def test_e8m0_scales_match_torch():
    x = random_inputs(32 * 300, 8)
    sc = sections(gcodec.get_codec("mx", element="e5m2").encode(x))["scales"]
    xs = _torch.tensor([2.0 ** (int(c) - 127) for c in sc], dtype=_torch.float64).to(_torch.float32)
    assert (xs.to(_torch.float8_e8m0fnu).view(_torch.uint8).numpy() == sc).all()


@needs_torch
def test_fp4_packing_is_torch_float4_x2_layout():
    """torch.float4_e2m1fn_x2 holds two E2M1 codes per byte, the first element in the low nibble (the
    definition of PyTorch core's Float4_e2m1fn_x2, which ONNX's FLOAT4E2M1 shares). torch cannot
    convert that dtype on the CPU, so the check is the byte layout: a tensor of that dtype made from
    gcodec's elements section has n/2 items, and its low nibbles are the even elements' ml_dtypes codes."""
    x = with_max_first(all_finite_values("e2m1"), "e2m1", 32)
    el = sections(gcodec.get_codec("mx", element="e2m1").encode(x))["elements"]
    t = _torch.from_numpy(el.copy()).view(_torch.float4_e2m1fn_x2)
    assert t.element_size() == 1 and t.numel() == x.size // 2
    raw = t.view(_torch.uint8).numpy()
    assert (raw & 0xF == ml_codes(x[0::2], "e2m1")).all() and (raw >> 4 == ml_codes(x[1::2], "e2m1")).all()


# --------------------------------------------------------------------------------------------
# stochastic rounding


@pytest.mark.parametrize(
    "cid,params",
    [("mx", {"element": "e2m1"}), ("mx", {"element": "e4m3"}), ("fp8", {"element": "e5m2"}), ("nvfp4", {})],
)
def test_stochastic_rounding_is_unbiased(cid, params):
    """Each element rounds to one of its two neighbours ``lo < t < hi`` with P(hi) within 2^-17 of
    ``(t - lo) / (hi - lo)`` (specs/rng.md §4), so over K independent streams the mean decoded value
    m of an element differs from x by at most 2^-17 (hi - lo) in expectation, and its standard error
    is at most (hi - lo) / (2 sqrt(K)) (a two-point variable's variance is at most (hi - lo)^2 / 4).
    With K = 400 streams, |m - x| <= 6 standard errors + 2^-17 (hi - lo) for every element (a false
    failure has probability below 1e-8 per element); quanta come from the decoded neighbours."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(256).astype(F32)
    c = gcodec.get_codec(cid, rounding="stochastic", seed=5, **params)
    K = 400
    ys = np.stack([gcodec.decode(c.encode(x, step=s)) for s in range(K)]).astype(np.float64)
    lo, hi, sat = neighbours(gcodec.get_codec(cid, **params), x)
    assert ((ys == lo) | (ys == hi)).all()  # every draw lands on one of the two neighbours
    # beyond the largest finite value elements saturate (mx.md §5): always the largest, biased
    assert (lo[sat] == hi[sat]).all() and sat.mean() < 0.1
    q = hi - lo
    assert (q > 0).mean() > 0.85  # most elements lie between grid points
    err = np.abs(ys.mean(0) - x.astype(np.float64))
    slack = np.abs(x.astype(np.float64)) * 2.0**-22  # the binary32 quotient v / s of float scales
    ok = err <= 6 * q / (2 * math.sqrt(K)) + 2.0**-17 * q + slack
    assert ok[~sat].all()
    # and the average error is far below what nearest rounding makes (biased per element)
    near = gcodec.decode(gcodec.get_codec(cid, **params).encode(x)).astype(np.float64)
    assert err.mean() < 0.5 * np.abs(near - x).mean()


def neighbours(codec, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid points of each element's block just below and just above it (equal on the grid, and
    beyond the largest value, where the third array, "saturated", is True):
    the element format's finite values times the block's scale, as the payload of ``codec`` (nearest
    rounding: the scales do not depend on the rounding) states it."""
    buf = codec.encode(x)
    s = sections(buf)
    p = gcodec.validate(buf).params
    el = ELEMENTS[p.get("element", "e2m1")]
    if codec.codec_id == "nvfp4":
        g = 16
        sb = ml_values(s["scales"], "e4m3") * s["tensor_scale"][0]
    elif "scale_dtype" in p and p["scale_dtype"] == "float32":
        g, sb = p["group_size"], s["scales"]
    else:
        g = p.get("group_size", 32)
        sb = np.array([2.0 ** (int(k) - 127) for k in s["scales"]])
    scale = np.repeat(sb.astype(np.float64), g)[: x.size]
    grid = np.unique(all_finite_values(el.name).astype(np.float64))
    t = x.astype(np.float64) / scale
    f32 = scale.astype(F32)  # decoding multiplies in binary32
    lo = (grid[np.clip(np.searchsorted(grid, t, "right") - 1, 0, grid.size - 1)].astype(F32) * f32).astype(np.float64)
    hi = (grid[np.clip(np.searchsorted(grid, t, "left"), 0, grid.size - 1)].astype(F32) * f32).astype(np.float64)
    return lo, hi, np.abs(t) > grid[-1]


def test_stochastic_draws_follow_the_stream_and_seed():
    x = np.random.default_rng(2).standard_normal(100).astype(F32)
    c = gcodec.get_codec("mx", element="e2m1", rounding="stochastic", seed=3)
    a, b = bytes(c.encode(x, step=1)), bytes(c.encode(x, step=1))
    assert a == b and bytes(c.encode(x, step=2)) != a
    assert gcodec.validate(a).params["stream"] == 1


# --------------------------------------------------------------------------------------------
# the raw element codes, error feedback, nesting


@pytest.mark.parametrize(
    "cid,params,dtype",
    [
        ("fp8", {}, "float8_e4m3fn"),
        ("fp8", {"element": "e5m2"}, "float8_e5m2"),
        ("mx", {"element": "e4m3"}, "float8_e4m3fn"),
    ],
)
def test_element_codes_are_zero_copy_views_of_the_payload(cid, params, dtype):
    x = random_inputs(100, 4)
    buf = bytearray(gcodec.get_codec(cid, **params).encode(x))
    ec = gcodec.element_codes(buf)
    assert ec.elements.dtype == np.dtype(getattr(ml_dtypes, dtype)) and ec.elements.size == x.size
    assert np.shares_memory(ec.elements, np.frombuffer(buf, np.uint8))
    sc = ec.scales.astype(np.float32) if ec.scales.dtype != np.float32 else ec.scales
    y = ec.elements.astype(np.float32) * np.repeat(sc, ec.group_size)[: x.size]
    assert same_bits(y.astype(F32), gcodec.decode(buf))
    assert ec.safetensors_dtype == {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}[dtype]
    assert ec.dlpack_code == {"float8_e4m3fn": 10, "float8_e5m2": 12}[dtype]
    if _torch is not None:
        t = ec.torch()
        assert t.dtype == getattr(_torch, dtype) and t.numel() == x.size
        assert (t.view(_torch.uint8).numpy() == ec.elements.view(np.uint8)).all()


def test_element_codes_of_packed_and_two_level_payloads():
    x = random_inputs(50, 6)
    ec = gcodec.element_codes(gcodec.get_codec("nvfp4").encode(x))
    assert ec.elements.dtype == np.uint8 and ec.elements.size == 25 and ec.tensor_scale > 0
    assert ec.scales.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and ec.group_size == 16
    assert ec.safetensors_dtype == "F4" and ec.dlpack_code == 17
    ec = gcodec.element_codes(gcodec.get_codec("mx", element="e3m2").encode(x))
    assert ec.scales.dtype == np.dtype(ml_dtypes.float8_e8m0fnu) and ec.dlpack_code == 16
    with pytest.raises(gcodec.ConfigError):
        ec.torch()  # torch has no FP6 dtype
    with pytest.raises(gcodec.ConfigError):
        gcodec.element_codes(gcodec.get_codec("uniform").encode(x))


@pytest.mark.parametrize(
    "cid,params",
    [("fp8", {}), ("mx", {}), ("mx", {"element": "int8"}), ("nvfp4", {}), ("mx", {"rounding": "stochastic"})],
)
def test_error_feedback_carries_the_rounding_error(cid, params):
    """With error feedback the sum of decoded steps tracks the sum of inputs: the residual is the
    last step's error, so |sum(decoded) - sum(x)| stays within one step's error instead of growing."""
    rng = np.random.default_rng(1)
    ef = gcodec.ErrorFeedback(gcodec.get_codec(cid, **params))
    xs = [rng.standard_normal(500).astype(F32) for _ in range(30)]
    total = np.zeros(500)
    for s, x in enumerate(xs):
        total += gcodec.decode(ef.encode(x, key="w", step=s))
    gap = np.abs(total - np.sum(xs, axis=0)).max()
    one_step = np.abs(gcodec.decode(gcodec.get_codec(cid, **params).encode(xs[0], step=0)) - xs[0]).max()
    assert gap <= 2 * one_step + 1e-3


@pytest.mark.parametrize("cfg", [{"id": "fp8"}, {"id": "mx"}, {"id": "nvfp4"}, {"id": "mx", "element": "e5m2"}])
def test_nested_in_hybrids(cfg):
    x = random_inputs(400, 9)
    for host in (gcodec.get_codec("topk", k=40, values=cfg), gcodec.get_codec("randomk", ratio=0.1, values=cfg)):
        y = gcodec.decode(host.encode(x, step=0))
        assert y.shape == x.shape and np.isfinite(y).all()


def test_magnitude_bound_holds():
    x = random_inputs(4000, 12)
    m = float(np.abs(x).max())
    for cid, params in [
        ("fp8", {}),
        ("fp8", {"scale_dtype": "e8m0"}),
        ("mx", {}),
        ("mx", {"element": "int8"}),
        ("nvfp4", {}),
        ("nvfp4", {"rounding": "stochastic"}),
    ]:
        c = gcodec.get_codec(cid, **params)
        y = gcodec.decode(c.encode(x, step=1))
        assert float(np.abs(y).max()) <= c.magnitude_bound(m, x.size), (cid, params)


def test_inspect_names_the_element_dtypes():
    from gcodec.cli import _print_inspect, inspect_payload

    x = random_inputs(64, 13)
    for cid, params, st, dl in [
        ("fp8", {"element": "e5m2"}, "F8_E5M2", 12),
        ("mx", {}, "F4", 17),
        ("mx", {"element": "e2m3"}, "F6_E2M3", 15),
        ("nvfp4", {}, "F4", 17),
    ]:
        buf = np.frombuffer(bytes(gcodec.get_codec(cid, **params).encode(x)), np.uint8)
        el = inspect_payload(buf)["payload"]["tensors"][0]["elements"]
        assert (el["safetensors"], el["dlpack_code"]) == (st, dl)
        want = {"fp8": ("float32", "F32", 2), "mx": ("e8m0", "F8_E8M0", 14), "nvfp4": ("e4m3", "F8_E4M3", 10)}[cid]
        assert tuple(el["scales"].values()) == want
        if cid == "nvfp4":
            import io

            f = io.StringIO()
            _print_inspect("x.gcd", inspect_payload(buf), f)
            assert "elements: e2m1 (4 bits), safetensors dtype F4, DLPack type code 17" in f.getvalue()
            assert "scales: e4m3, safetensors dtype F8_E4M3, DLPack type code 10" in f.getvalue()
    buf = np.frombuffer(bytes(gcodec.get_codec("uniform").encode(x)), np.uint8)
    assert "elements" not in inspect_payload(buf)["payload"]["tensors"][0]


# --------------------------------------------------------------------------------------------
# what the encoders refuse, and the edges of the scale rules


def test_no_binary32_input_makes_a_scale_that_overflows():
    """E1 and NV2 refuse a scale whose largest element decodes to infinity, and the encoders check
    for it (fp8.md §4.1, nvfp4.md §3 step 6). With the divisors 448, 57344 and 448 * 6 no binary32
    input gets there: float32(float32(m / d) * d) is within two roundings of m, so only the largest
    few magnitudes could overflow, and none of the top 2^20 does (exhaustive)."""
    top = np.uint32(0x7F7FFFFF)
    m = np.arange(top - (1 << 20), top + 1, dtype=np.uint32).view(F32)
    with np.errstate(over="ignore"):
        for d in (448.0, 57344.0):
            assert not np.isinf((m / F32(d)).astype(F32) * F32(d)).any()
        S = (m / F32(2688.0)).astype(F32)
        assert not np.isinf((F32(448.0) * S).astype(F32) * F32(6.0)).any()
    x = np.array([3.4028235e38, 1.0, -2.0], F32)
    for params in ({}, {"element": "e5m2"}, {"scale_dtype": "e8m0"}):
        y = gcodec.decode(gcodec.get_codec("fp8", **params).encode(x))
        assert np.isfinite(y).all()
    assert gcodec.decode(gcodec.get_codec("fp8", scale_dtype="e8m0").encode(x))[0] == F32(448.0 * 2.0**119)


def test_nvfp4_near_the_largest_float_encodes_finite_or_is_refused():
    for top in (3.4028235e38, 3.0e38, 1e38):
        x = np.array([top, -top / 3, 1.0, 0.0] * 5, F32)
        try:
            y = gcodec.decode(gcodec.get_codec("nvfp4").encode(x))
        except gcodec.PayloadValueError as e:
            assert "overflows float32" in str(e)
        else:
            assert np.isfinite(y).all()


@pytest.mark.parametrize("cid", ["fp8", "mx", "nvfp4"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
def test_non_finite_inputs_are_refused(cid, bad):
    x = np.linspace(-1, 1, 70)
    x[33] = bad  # 1e300 in float64 is beyond binary32: infinite once rounded, refused too
    with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
        gcodec.get_codec(cid).encode(x)


def test_zero_and_tiny_blocks_get_the_smallest_scale():
    x = np.zeros(96, F32)
    x[32:64] = -0.0
    x[64:] = np.float32(1e-40)  # binary32 subnormals
    s = sections(gcodec.get_codec("mx").encode(x))
    assert (s["scales"] == 0).all()  # X = 2^-127
    codes = unpack(s["elements"], 96, 4)
    assert (codes[:32] == 0).all() and (codes[32:64] == 8).all()  # +0 and -0 codes
    y = gcodec.decode(gcodec.get_codec("mx").encode(x))
    assert same_bits(y[:64], x[:64]) and (y[64:] == 0).all()  # 1e-40 / 2^-127 ~ 0.017: rounds to 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_other_input_dtypes_go_through_binary32(dtype):
    from gcodec.arrays import DTYPES

    x = (np.random.default_rng(5).standard_normal(100) * 3).astype(DTYPES[dtype])
    x32 = x.astype(np.float64).astype(F32)
    for cid in ("fp8", "mx", "nvfp4"):
        c = gcodec.get_codec(cid)
        a, b = gcodec.element_codes(c.encode(x)), gcodec.element_codes(c.encode(x32))
        assert (a.elements.view(np.uint8) == b.elements.view(np.uint8)).all()
        assert (a.scales.view(np.uint8) == b.scales.view(np.uint8)).all() and a.tensor_scale == b.tensor_scale
        assert gcodec.decode(c.encode(x)).dtype == x.dtype


@pytest.mark.parametrize(
    "cid,params",
    [("fp8", {"group_size": 1000}), ("mx", {"rounding": "stochastic"}), ("mx", {"element": "e3m2"}), ("nvfp4", {})],
)
def test_bytes_do_not_depend_on_the_thread_count(cid, params):
    x = random_inputs(300_001, 21)  # several tiles, a short last one
    c = gcodec.get_codec(cid, **params)
    with gcodec.num_threads(1):
        one = bytes(c.encode(x, step=2))
        y1 = gcodec.decode(one)
    with gcodec.num_threads(2):
        assert bytes(c.encode(x, step=2)) == one
        assert same_bits(gcodec.decode(one), y1)


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_dtype", ["float32", "e8m0"])
def test_fp8_ties_round_to_even_like_ml_dtypes(element, scale_dtype):
    x = with_max_first(ties(element), element, 64)  # scale exactly 1 either way
    buf = gcodec.get_codec("fp8", element=element, group_size=64, scale_dtype=scale_dtype).encode(x)
    assert (sections(buf)["elements"] == ml_codes(x, element)).all()
    if _torch is not None:  # torch's cast agrees on every tie too
        t = _torch.from_numpy(x).to(getattr(_torch, ML[element].name)).view(_torch.uint8).numpy()
        assert (sections(buf)["elements"] == t).all()


# --------------------------------------------------------------------------------------------
# `stream` and the minor version (fp8.md, mx.md, nvfp4.md §1; uniform.md §9.1)


def _with_stream(buf: bytes, value, minor: int) -> bytes:
    """``buf`` with params.stream set to ``value`` (deleted for ``...``), under ``minor``."""
    from vector_cases import edit

    def f(h):
        params = h["tensors"][0]["params"]
        if value is ...:
            del params["stream"]
        else:
            params["stream"] = value

    return edit(buf, header=f, minor=minor)


@pytest.mark.parametrize("cid, params", [("fp8", {}), ("mx", {"element": "e3m2"}), ("nvfp4", {}), ("uniform", {})])
@pytest.mark.parametrize("value", [0, 7, 2**64 - 1, -1, "s", None, 1.5])
def test_a_nearest_payloads_stream_is_unknown_refused_under_minor_0_and_ignored_under_minor_1(cid, params, value):
    """`stream` is in a stochastic payload's parameter table only: in a nearest one it is a parameter
    the table does not list, refused (C1, HeaderError) under minor 0 whatever its value, and ignored
    under minor 1, the payload decoding as without it; the independent decoder agrees."""
    from . import spec_decoder as sd

    x = np.linspace(-3, 3, 45).astype(F32)
    base = bytes(gcodec.get_codec(cid, rounding="nearest", **params).encode(x))
    bad = _with_stream(base, value, 0)
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.HeaderError, match=r"^C1: .*unknown parameter\(s\) \['stream'\]"):
            fn(bad)
    with pytest.raises(sd.E) as ei:
        sd.read(bad)
    assert ei.value.cls == "HeaderError"
    newer = _with_stream(base, value, 1)
    gcodec.validate(newer)
    want = gcodec.decode(base)
    assert np.array_equal(gcodec.decode(newer).view(np.uint32), want.view(np.uint32))
    assert sd.same(sd.read(newer), want)


@pytest.mark.parametrize("cid, params", [("fp8", {}), ("mx", {"element": "e3m2"}), ("nvfp4", {}), ("uniform", {})])
@pytest.mark.parametrize("value", [..., -1, "s", None, 1.5, True])
@pytest.mark.parametrize("minor", [0, 1])
def test_a_stochastic_payload_needs_a_valid_stream_under_every_minor(cid, params, value, minor):
    """A stochastic payload without `stream`, or with one that is not an integer in [0, 2^64), is
    refused (C1, HeaderError) under minor 0 and minor 1 alike: §8 relaxes unknown parameters only."""
    from . import spec_decoder as sd

    x = np.linspace(-3, 3, 45).astype(F32)
    base = bytes(gcodec.get_codec(cid, rounding="stochastic", **params).encode(x, step=5))
    bad = _with_stream(base, value, minor)
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(gcodec.HeaderError, match=r"^C1: .*stream"):
            fn(bad)
    if cid != "uniform":  # the independent decoder implements deterministic uniform only
        with pytest.raises(sd.E) as ei:
            sd.read(bad)
        assert ei.value.cls == "HeaderError"


# --------------------------------------------------------------------------------------------
# nvfp4.md NV4: a payload of 0 elements has the tensor scale +0


def _set_f32_section(buf: bytes, name: str, bits: int) -> bytes:
    """``buf`` with the first binary32 of section ``name`` set to the pattern ``bits``."""
    from vector_cases import edit, header_of

    (off,) = [s[2] for s in header_of(buf)["tensors"][0]["sections"] if s[0] == name]

    def f(d):
        d[off : off + 4] = int(bits).to_bytes(4, "little")

    return edit(buf, data=f)


@pytest.mark.parametrize("shape", [(0,), (0, 16), (3, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_writes_a_zero_tensor_scale_for_an_empty_tensor(shape, dtype, rounding):
    """§2, §3 step 2: A = 0 when n = 0, so S = 0 / 2688 = +0, the pattern 00 00 00 00 (NV4)."""
    buf = bytes(gcodec.get_codec("nvfp4", rounding=rounding).encode(np.zeros(shape, dtype), step=2))
    assert sections(buf)["tensor_scale"].view(np.uint32).tolist() == [0]
    assert gcodec.decode(buf).shape == shape


@pytest.mark.parametrize(
    "bits, rule",
    [
        (0x3F800000, "NV4"),  # 1.0
        (0x00000001, "NV4"),  # the smallest subnormal
        (0x43E00000, "NV4"),  # 448
        (0x80000000, "NV1"),  # -0: NV1 refuses a set sign bit first, whatever n
        (0x7FC00000, "NV1"),  # NaN
        (0x7F800000, "NV1"),  # +infinity
        (0xBF800000, "NV1"),  # -1
    ],
)
def test_nvfp4_refuses_a_nonzero_tensor_scale_on_an_empty_tensor(bits, rule):
    """NV4: with n = 0 the tensor scale must be +0. A -0, NaN, infinite or negative one breaks NV1
    first (as it would with elements). gcodec's validate and decode and the independent decoder
    agree; +0 is the one accepted pattern."""
    from . import spec_decoder as sd
    from .rules import assert_refused

    buf = bytes(gcodec.get_codec("nvfp4").encode(np.zeros((0, 4), F32)))
    assert sd.read(buf).shape == (0, 4)
    bad = _set_f32_section(buf, "tensor_scale", bits)
    assert_refused(bad, "PayloadValueError", rule)
    with pytest.raises(sd.E) as ei:
        sd.read(bad)
    assert ei.value.cls == "PayloadValueError" and str(ei.value).split(": ", 1)[1] == rule


@pytest.mark.parametrize(
    "host", [{"codec": "topk", "k": 0}, {"codec": "dct", "dims": 2, "chunk": 16, "k": 2, "shape": (0, 5)}]
)
def test_a_nested_nvfp4_of_zero_values_is_held_to_nv4(host):
    """A host handing 0 values to a nested nvfp4 (topk with k = 0, an empty dct) writes its tensor
    scale +0, and a payload whose nested tensor scale is not +0 is refused by NV4 (hybrid.md: the
    nested codec's value rules apply)."""
    from .rules import assert_refused

    params = {k: v for k, v in host.items() if k not in ("codec", "shape")}
    x = np.zeros(host.get("shape", (40,)), F32)
    x[..., :1] = 1.0
    buf = bytes(gcodec.get_codec(host["codec"], values={"id": "nvfp4"}, **params).encode(x))
    assert sections(buf)["values.tensor_scale"].view(np.uint32).tolist() == [0]
    gcodec.decode(buf)
    assert_refused(_set_f32_section(buf, "values.tensor_scale", 0x3F800000), "PayloadValueError", "NV4")
