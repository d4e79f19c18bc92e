"""``dct`` (specs/codecs/dct.md): the basis table, the exact transforms, selection, and every rule."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases.dct import INVALID, basis_exact

import gcodec
from gcodec.api import _checked
from gcodec.layout.dct import CHUNKS, basis

from .rules import assert_refused


@pytest.mark.parametrize("chunk", CHUNKS)
def test_basis_table_is_the_correctly_rounded_one_far_from_midpoints(chunk):
    """§3: every entry, evaluated to 40 digits, lies strictly between the two binary32 rounding
    midpoints around the table's value (so the table is the correct rounding), and at least a relative
    2^-40 away from either (so a binary64 evaluation, accurate to a few 2^-52, rounds the same)."""
    pytest.importorskip("mpmath")
    exact, worst = basis_exact(chunk, 40)
    np.testing.assert_array_equal(exact.view(np.uint32), basis(chunk).view(np.uint32))
    assert worst > 2.0**-40
    assert (basis(chunk) != 0).all()


def _forward_reference(x: np.ndarray, chunk: int) -> np.ndarray:
    """§2.2 written with NumPy: per chunk and u, the binary64 sum over increasing i of exact products."""
    n = x.size
    m = -(-n // chunk) * chunk
    xp = np.zeros(m, np.float64)
    xp[:n] = x.astype(np.float32)
    xs = xp.reshape(-1, chunk)
    B = basis(chunk).astype(np.float64)
    acc = np.zeros((m // chunk, chunk))
    for i in range(chunk):  # increasing i; each product exact
        acc += xs[:, i : i + 1] * B[:, i][None, :]
    return acc.astype(np.float32).reshape(-1)


def _inverse_reference(idx: np.ndarray, vals: np.ndarray, n: int, chunk: int, k: int) -> np.ndarray:
    B = basis(chunk).astype(np.float64)
    nch = -(-n // chunk)
    acc = np.zeros((nch, chunk))
    u = (idx.reshape(nch, k) - (np.arange(nch) * chunk)[:, None]).astype(np.int64)
    v = vals.astype(np.float64).reshape(nch, k)
    for j in range(k):  # increasing coefficient index within each chunk
        acc += B[u[:, j]] * v[:, j : j + 1]
    return acc.astype(np.float32).reshape(-1)[:n]


def _parts(buf):
    p, checked = _checked(buf, None, full=True)
    e, cls, params = checked[0]
    views = p.views(e)
    return cls._decode_indices(params, e, views), cls._values(params, e, views)


@pytest.mark.parametrize("n, chunk, k", [(1000, 64, 5), (300, 256, 40), (37, 8, 8), (100, 16, 1), (5, 1, 1)])
@pytest.mark.parametrize("coding", ["gap", "packed"])
def test_selection_and_reconstruction_follow_the_spec_bit_for_bit(n, chunk, k, coding):
    rng = np.random.default_rng(n * chunk + k)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    buf = gcodec.get_codec("dct", chunk=chunk, k=k, index_coding=coding).encode(x)
    coef = _forward_reference(x, chunk)
    idx, vals = _parts(buf)
    # the top k magnitudes of every chunk of coefficients, ties to the lowest index
    a = np.abs(coef.astype(np.float64))
    want = np.concatenate(
        [s + np.sort(np.lexsort((np.arange(chunk), -a[s : s + chunk]))[:k]) for s in range(0, a.size, chunk)]
    )
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(vals.view(np.uint32), coef[want].view(np.uint32))
    y = gcodec.decode(buf)
    np.testing.assert_array_equal(y.view(np.uint32), _inverse_reference(idx, vals, n, chunk, k).view(np.uint32))


def test_keeping_every_coefficient_reconstructs_the_input():
    """With k = C the inverse of the forward transform is the identity up to the table's rounding:
    each entry is within 2^-24 relative of the orthonormal basis, so |y - x| <= ~C 2^-23 max|x|."""
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float32)
    for chunk in (8, 64, 256):
        y = gcodec.decode(gcodec.get_codec("dct", chunk=chunk, k=chunk).encode(x))
        assert np.abs(y - x).max() <= chunk * 2.0**-23 * np.abs(x).max()


def test_smooth_signals_need_few_coefficients():
    """A slowly varying chunk keeps most of its energy in its low frequencies: 4 of 64 coefficients
    reconstruct a sampled sine of period 256 (a quarter period per chunk) within 5 % (measured 2.8 %),
    where keeping 4 of 64 elements (chunktopk) leaves over 90 % of the norm behind."""
    x = np.sin(np.arange(4096) * 2 * np.pi / 256).astype(np.float32)
    y = gcodec.decode(gcodec.get_codec("dct", chunk=64, k=4).encode(x))
    assert np.linalg.norm(y - x) <= 0.05 * np.linalg.norm(x)
    t = gcodec.decode(gcodec.get_codec("chunktopk", chunk=64, k=4).encode(x))
    assert np.linalg.norm(t - x) >= 0.9 * np.linalg.norm(x)


def test_input_dtypes():
    x = np.random.default_rng(2).standard_normal(200)
    for dt in (np.float16, np.float64):
        buf = gcodec.get_codec("dct", chunk=16, k=16).encode(x.astype(dt))
        y = gcodec.decode(buf)
        assert y.dtype == dt
        ref = gcodec.decode(gcodec.get_codec("dct", chunk=16, k=16).encode(x.astype(dt).astype(np.float32)))
        np.testing.assert_array_equal(y, ref.astype(dt))  # float64 is rounded to binary32 first


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 2.0**100, -(2.0**101)])
def test_non_finite_and_huge_input_is_refused(bad):
    x = np.ones(100, np.float32)
    x[57] = bad
    with pytest.raises(gcodec.PayloadValueError, match="dct: input has"):
        gcodec.get_codec("dct", chunk=16, k=2).encode(x)


def test_nested_overflow_is_refused():
    x = np.full(64, 3e4, np.float32)  # coefficient 0 of a chunk of 8 is 8.5e4 > 65520
    with pytest.raises(gcodec.PayloadValueError, match="DC4"):
        gcodec.get_codec("dct", chunk=8, k=1, values={"id": "fp16"}).encode(x)


def test_sign_values_cost_one_bit_per_kept_coefficient():
    x = np.random.default_rng(3).standard_normal(1 << 16).astype(np.float32)
    c = gcodec.get_codec("dct", chunk=64, k=8, values={"id": "sign", "group_size": 8})
    info = gcodec.validate(c.encode(x))
    sec = {s[0]: s[3] for s in info.tensors[0].sections}
    assert sec["values.bits"] == (1 << 16) // 64 * 8 // 8


@pytest.mark.parametrize("params", [{"chunk": 6}, {"chunk": 512}, {"chunk": 8, "k": 9}, {"k": 0}])
def test_bad_configuration_is_refused(params):
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("dct", **params)


@pytest.mark.parametrize("name, make, error, rule", INVALID, ids=[c[0] for c in INVALID])
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)


def _forward2_reference(x2: np.ndarray, s: int) -> np.ndarray:
    """§2 with dims = 2: columns then rows, each a binary64 sum of exact products in increasing order."""
    rows, cols = x2.shape
    ntr, ntc = -(-rows // s), -(-cols // s)
    pad = np.zeros((ntr * s, ntc * s), np.float64)
    pad[:rows, :cols] = x2.astype(np.float32)
    B = basis(s).astype(np.float64)
    out = np.empty(ntr * ntc * s * s, np.float32)
    for tr in range(ntr):
        for tc in range(ntc):
            tile = pad[tr * s : tr * s + s, tc * s : tc * s + s]
            T = np.zeros((s, s))
            for i in range(s):
                T += B[:, i : i + 1] * tile[i : i + 1, :]
            T = T.astype(np.float32).astype(np.float64)
            Y = np.zeros((s, s))
            for j in range(s):
                Y += T[:, j : j + 1] * B[:, j][None, :]
            t = tr * ntc + tc
            out[t * s * s : (t + 1) * s * s] = Y.astype(np.float32).reshape(-1)
    return out


@pytest.mark.parametrize(
    "shape, chunk, k", [((10, 13), 16, 3), ((9, 5, 8), 64, 6), ((37,), 4, 4), ((70, 90), 4096, 32)]
)
def test_tiles_follow_the_spec_bit_for_bit(shape, chunk, k):
    """dims = 2: the coefficients, their top k per tile, and the reconstruction with the binary32
    2-D basis entries b = fl32(B[p][i] B[q][j]), against NumPy written from §2 and §6."""
    rng = np.random.default_rng(len(shape) + chunk)
    x = rng.standard_normal(shape).astype(np.float32)
    s = int(np.sqrt(chunk))
    rows = shape[0] if len(shape) >= 2 else 1
    x2 = x.reshape(rows, -1)
    buf = gcodec.get_codec("dct", chunk=chunk, k=k, dims=2).encode(x)
    coef = _forward2_reference(x2, s)
    idx, vals = _parts(buf)
    a = np.abs(coef.astype(np.float64))
    want = np.concatenate(
        [c + np.sort(np.lexsort((np.arange(chunk), -a[c : c + chunk]))[:k]) for c in range(0, a.size, chunk)]
    )
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(vals.view(np.uint32), coef[want].view(np.uint32))
    B = basis(s)
    ntc = -(-x2.shape[1] // s)
    y = np.zeros(x2.shape, np.float32)
    for t in range(a.size // chunk):
        r0, c0 = (t // ntc) * s, (t % ntc) * s
        pq = idx[t * k : t * k + k] - t * chunk
        v = vals[t * k : t * k + k].astype(np.float64)
        for i in range(min(s, x2.shape[0] - r0)):
            for j in range(min(s, x2.shape[1] - c0)):
                b = (B[pq // s, i] * B[pq % s, j]).astype(np.float32)  # binary32 products
                acc = 0.0
                for bl, vl in zip(b.astype(np.float64), v):
                    acc += bl * vl
                y[r0 + i, c0 + j] = np.float32(acc)
    np.testing.assert_array_equal(gcodec.decode(buf).reshape(x2.shape).view(np.uint32), y.view(np.uint32))


def test_smooth_matrices_need_few_tile_coefficients():
    """A smooth 2-D field (a product of slow sines): 4 of 64 coefficients per 8 x 8 tile keep it
    within 2 % (measured 0.5 %), the 1-D chunks of 64 along the rows within 5 %."""
    r = np.arange(128)[:, None]
    c = np.arange(128)[None, :]
    x = (np.sin(r * 2 * np.pi / 256) * np.cos(c * 2 * np.pi / 256)).astype(np.float32)
    y = gcodec.decode(gcodec.get_codec("dct", chunk=64, k=4, dims=2).encode(x))
    assert np.linalg.norm(y - x) <= 0.02 * np.linalg.norm(x)


@pytest.mark.parametrize(
    "params", [{"dims": 2, "chunk": 8}, {"dims": 2, "chunk": 1}, {"dims": 1, "chunk": 1024}, {"dims": 3}]
)
def test_chunk_sizes_follow_dims(params):
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("dct", **params)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0,), (0, 3, 4), (3, 0, 4), (2, 3, 0)])
@pytest.mark.parametrize(
    "params",
    [
        {"dims": 2, "chunk": 16, "k": 2},
        {"dims": 2, "chunk": 4096, "k": 64, "index_coding": "packed"},
        {"dims": 1, "chunk": 64, "k": 4},
        {"dims": 2, "chunk": 4, "k": 1, "values": {"id": "uniform", "bits": 2, "group_size": 8}},
        {"dims": 2, "chunk": 16, "k": 3, "values": {"id": "nvfp4"}},
    ],
    ids=["tiles", "tiles_packed", "flat", "tiles_u2", "tiles_nvfp4"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_empty_tensors_have_no_chunks_and_round_trip(shape, params, dtype):
    """Spec §1, "Empty tensors": with shape[0] = 0 (R = 0), another zero dimension (Q = 0) or a 1-d
    [0], nchunks = 0 with either dims: index_bytes 0, index and raw value sections of 0 bytes (a
    nested codec's sections for 0 elements), and the payload validates and decodes (also into an
    out= buffer, accumulating) to an empty array of its shape and dtype; the decoder written from
    the spec agrees."""
    from . import spec_decoder as sd

    buf = bytes(gcodec.get_codec("dct", **params).encode(np.zeros(shape, dtype)))
    info = gcodec.validate(buf)
    rec = info.tensors[0]
    assert rec.params["index_bytes"] == 0 and rec.shape == shape
    nested = {"values.tensor_scale": 4}  # nvfp4 writes its tensor scale for 0 elements too (nvfp4.md §2)
    assert all(s[3] == nested.get(s[0], 0) for s in rec.sections), rec.sections
    y = gcodec.decode(buf)
    assert y.shape == shape and y.dtype == dtype
    out = np.zeros(shape, dtype)
    assert gcodec.decode(buf, out=out, accumulate=True) is out
    _, checked = _checked(buf, None, full=False)
    e, cls, p = checked[0]
    assert cls._total(p, e) == 0
    if params.get("values", {}).get("id") != "nvfp4":  # the independent decoder nests fp16/bf16/uniform
        assert sd.same(sd.read(buf), y)
