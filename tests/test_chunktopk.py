"""``chunktopk`` (specs/codecs/chunktopk.md): selection per chunk, both index codings, and every rule."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases.chunked import (
    EXAMPLE,
    INVALID,
    pack_gap,
    pack_packed,
    select,
    unpack_gap,
    unpack_packed,
)

import gcodec
from gcodec.api import _checked
from gcodec.arrays import BFLOAT16
from gcodec.codecs.chunktopk import kept_count

from .rules import assert_refused


def reference(x: np.ndarray, chunk: int, k: int) -> np.ndarray:
    """The spec's selection (§2), by sorting each chunk: global indices, chunk after chunk."""
    a = np.abs(x.astype(np.float64).reshape(-1))
    out = []
    for s in range(0, a.size, chunk):
        seg = a[s : s + chunk]
        order = np.lexsort((np.arange(seg.size), -seg))[: min(k, seg.size)]
        out.append(s + np.sort(order))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def indices_of(buf) -> np.ndarray:
    p, checked = _checked(buf, None, full=True)
    e, cls, params = checked[0]
    return cls._decode_indices(params, e, p.views(e))


def sections(buf) -> dict[str, bytes]:
    p, checked = _checked(buf, None, full=True)
    return {n: bytes(v) for n, v in p.views(checked[0][0]).items()}


def _input(n: int, seed: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "ties":
        x = np.round(x * 2).astype(np.float32) / 2
    elif kind == "zeros":
        x = np.where(np.arange(n) % 3 == 0, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    elif kind == "ascending":  # every element beats the ones before it
        x = np.arange(n, dtype=np.float32)
    elif kind == "descending":
        x = np.arange(n, 0, -1).astype(np.float32)
    elif kind == "heavy":
        x = (rng.standard_t(2, n) * 1e3).astype(np.float32)
    return x


@pytest.mark.parametrize("kind", ["normal", "ties", "zeros", "ascending", "descending", "heavy"])
@pytest.mark.parametrize("n, chunk, k", [(1000, 64, 5), (4096 * 3 + 5, 4096, 64), (257, 16, 15), (37, 8, 1), (9, 4, 4)])
@pytest.mark.parametrize("coding", ["gap", "packed"])
def test_selection_is_the_top_k_of_every_chunk(kind, n, chunk, k, coding):
    """§2: each chunk keeps its min(k, L) largest magnitudes, ties to the lowest index, and the values
    are the kept elements bit for bit."""
    x = _input(n, n + k, kind)
    buf = gcodec.get_codec("chunktopk", chunk=chunk, k=k, index_coding=coding).encode(x)
    want = reference(x, chunk, k)
    np.testing.assert_array_equal(indices_of(buf), want)
    y = gcodec.decode(buf)
    expect = np.zeros(n, np.float32)
    expect[want] = x[want]
    np.testing.assert_array_equal(y.view(np.uint32), expect.view(np.uint32))


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float64])
def test_every_dtype_keeps_its_values_bit_for_bit(dtype):
    x = _input(500, 3, "heavy").astype(dtype)
    buf = gcodec.get_codec("chunktopk", chunk=64, k=6).encode(x)
    want = reference(x.astype(np.float64), 64, 6)
    np.testing.assert_array_equal(indices_of(buf), want)
    y = gcodec.decode(buf)
    assert y.dtype == dtype
    assert (y.view(np.uint8).reshape(500, -1)[want] == x.view(np.uint8).reshape(500, -1)[want]).all()


@pytest.mark.parametrize("n, chunk, k", [(1000, 64, 5), (300, 7, 3), (50, 1, 1), (100, 100, 100), (4096 + 1, 4096, 64)])
def test_both_codings_match_the_pure_python_reference(n, chunk, k):
    """§3 and §4 written a second time (tools/vector_cases/chunked.py) give the same bytes both ways."""
    x = _input(n, 7, "ties")
    kept = select(x, chunk, k)
    gap = sections(gcodec.get_codec("chunktopk", chunk=chunk, k=k).encode(x))
    widths, packed = pack_gap(kept)
    assert (gap["index_widths"], gap["indices"]) == (widths, packed)
    assert unpack_gap(widths, packed, n, chunk, k) == kept
    fixed = sections(gcodec.get_codec("chunktopk", chunk=chunk, k=k, index_coding="packed").encode(x))
    assert fixed["indices"] == pack_packed(kept, chunk)
    assert unpack_packed(fixed["indices"], n, chunk, k) == kept


def test_worked_example():
    """§10: widths 01 00 00, index byte 03; packed 4d 04."""
    gap = sections(gcodec.get_codec("chunktopk", chunk=4, k=2).encode(EXAMPLE))
    assert gap["index_widths"] == b"\x01\x00\x00" and gap["indices"] == b"\x03"
    fixed = sections(gcodec.get_codec("chunktopk", chunk=4, k=2, index_coding="packed").encode(EXAMPLE))
    assert fixed["indices"] == b"\x4d\x04"
    y = gcodec.decode(gcodec.get_codec("chunktopk", chunk=4, k=2).encode(EXAMPLE))
    np.testing.assert_array_equal(y, [0, -3, 0, 2, -2, 2, 0, 0, 1.5, -1])


@pytest.mark.parametrize(
    "n, chunk, k, want", [(0, 8, 2, 0), (10, 4, 2, 6), (8, 4, 4, 8), (4097, 4096, 64, 65), (5, 1, 1, 5)]
)
def test_kept_count(n, chunk, k, want):
    assert kept_count(n, chunk, k) == want


@pytest.mark.parametrize("params", [{"k": 0}, {"chunk": 0}, {"k": 9, "chunk": 8}, {"chunk": 2**24 + 1}, {"k": 2.0}])
def test_bad_configuration_is_refused(params):
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("chunktopk", **params)


def test_values_cannot_be_a_host():
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("chunktopk", values={"id": "topk"})
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("topk", values={"id": "chunktopk"})


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize(
    "where", [0, 63, 64, 99]
)  # a selecting chunk, its end, the start of the next, the short last one
def test_non_finite_input_is_refused(special, where):
    x = _input(100, 1, "normal")
    x[where] = special
    for k in (3, 36):  # the last chunk (36 elements) keeps everything with k = 36
        with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
            gcodec.get_codec("chunktopk", chunk=64, k=k).encode(x)


def test_nested_fp16_overflow_is_refused_on_encode():
    x = _input(200, 2, "normal")
    x[150] = 1e6
    with pytest.raises(gcodec.PayloadValueError, match="CK4"):
        gcodec.get_codec("chunktopk", chunk=50, k=4, values={"id": "fp16"}).encode(x)


def test_two_bit_values_get_one_scale_per_chunk():
    """hybrid.md §2 with group_size = k: one scale per chunk, the last chunk's group its own."""
    x = _input(4096 * 2 + 100, 4, "normal")
    c = gcodec.get_codec("chunktopk", chunk=4096, k=64, values={"id": "uniform", "bits": 2, "group_size": 64})
    s = sections(c.encode(x))
    assert len(s["values.scales"]) == 4 * 3
    assert len(s["values.codes"]) == (64 * 2 + 64) * 2 // 8


def test_sparseloco_setting_is_146x_smaller_than_float32():
    """The design target, measured with everything counted (header, widths, scales) on 4 Mi
    Gaussian elements (the ratio of 64 Mi differs only by the header's share: 1/1024 of it)."""
    x = np.random.default_rng(0).standard_normal(4 << 20, dtype=np.float32)
    u2 = {"id": "uniform", "bits": 2, "group_size": 64}
    gap = len(gcodec.get_codec("chunktopk", chunk=4096, k=64, values=u2).encode(x))
    packed = len(gcodec.get_codec("chunktopk", chunk=4096, k=64, values=u2, index_coding="packed").encode(x))
    assert x.nbytes / gap >= 146
    # packed: 96 index + 16 code + 4 scale bytes per 16384-byte chunk (141.2x), plus the header and
    # section padding (a few hundred bytes: 140.8x at 4 Mi); the indices and codes alone are 146.3x
    assert 140 <= x.nbytes / packed < 146.3


def test_decode_accumulates():
    x = _input(300, 5, "normal")
    buf = gcodec.get_codec("chunktopk", chunk=32, k=3).encode(x)
    out = np.ones(300, np.float32)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, 1 + gcodec.decode(buf))


@pytest.mark.parametrize("name, make, error, rule", INVALID, ids=[c[0] for c in INVALID])
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)
