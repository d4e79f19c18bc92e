"""Which zero each codec decodes to, with and without accumulate (specs/format.md §10 "Signed
zeros" and "Accumulate", and each codec's decoding section). One test per codec."""

from __future__ import annotations

import numpy as np
import pytest
from vector_cases import edit

import gcodec

X = np.float32([0.0, -0.0, 1.0, -1.0, 0.0, -0.0, 2.0, -2.0, 0.5, -0.5])


def bits(a: np.ndarray) -> np.ndarray:
    """The bit patterns (so +0 and -0 differ)."""
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def accumulate_into_negative_zeros(buf: bytes, dtype=np.float32) -> np.ndarray:
    out = np.full(X.shape, -0.0, dtype)
    gcodec.decode(buf, out=out, accumulate=True)
    return out


def assert_ieee_accumulate(buf: bytes) -> None:
    """out = out + y with one IEEE addition per element: -0 + -0 = -0, -0 + +0 = +0."""
    y = gcodec.decode(buf)
    for dt in (np.float32, np.float64, np.float16):
        want = (np.full(X.shape, -0.0, np.float64 if dt == np.float64 else np.float32) + y).astype(dt)
        np.testing.assert_array_equal(bits(accumulate_into_negative_zeros(buf, dt)), bits(want))


def zero_scales(buf: bytes) -> bytes:
    off, nb = next((s[2], s[3]) for s in gcodec.validate(buf).tensors[0].sections if s[0] == "scales")
    return edit(buf, data=lambda d: d.__setitem__(slice(off, off + nb), bytes(nb)))


@pytest.mark.parametrize("cid", ["fp16", "bf16"])
def test_casts_keep_the_sign_of_zero(cid):
    buf = bytes(gcodec.encode(X, gcodec.get_codec(cid)))
    np.testing.assert_array_equal(np.signbit(gcodec.decode(buf)), np.signbit(X))
    assert_ieee_accumulate(buf)


@pytest.mark.parametrize("cid", ["uniform", "qsgd", "terngrad"])
def test_quantizers_zero_code_is_plus_zero_and_zero_scale_follows_the_code(cid):
    buf = bytes(gcodec.encode(X, gcodec.get_codec(cid)))
    y = gcodec.decode(buf)
    assert not np.signbit(y[y == 0]).any()  # every zero code decodes to +0, -0.0 inputs included
    assert_ieee_accumulate(buf)
    z = zero_scales(buf)  # valid (a +0 scale is allowed): q x +0 is +0 or -0 by the sign of q
    np.testing.assert_array_equal(bits(gcodec.decode(z)), bits(y * np.float32(0)))
    assert_ieee_accumulate(z)


def test_sign_set_bit_with_zero_scale_is_minus_zero():
    buf = bytes(gcodec.encode(X, gcodec.get_codec("sign")))
    y = gcodec.decode(buf)
    assert (y != 0).all()
    z = zero_scales(buf)
    np.testing.assert_array_equal(
        bits(gcodec.decode(z)), bits(np.where(np.signbit(y), np.float32(-0.0), np.float32(0)))
    )
    assert_ieee_accumulate(z)


XS = np.float32([-0.0] * 4 + list(X))  # 14 elements; the first four and two more are -0


def _kept(cid: str) -> np.ndarray:
    """The listed elements, by each codec's selection rule."""
    if cid == "topk":  # k = 10: the six non-zeros, then the lowest-indexed zeros (the -0 at 0..3)
        order = np.lexsort((np.arange(XS.size), -np.abs(XS)))
        return np.isin(np.arange(XS.size), order[:10])
    if cid == "threshold":
        return np.abs(XS) >= 0.75
    return np.ones(XS.size, bool)  # randomk with k = numel


@pytest.mark.parametrize(
    "cid, params", [("topk", {"k": 10}), ("threshold", {"threshold": 0.75}), ("randomk", {"k": 14, "seed": 3})]
)
def test_sparse_codecs_plus_zero_where_unlisted_and_kept_values_bit_for_bit(cid, params):
    buf = bytes(gcodec.encode(XS, gcodec.get_codec(cid, **params)))
    y = gcodec.decode(buf)
    kept = _kept(cid)
    np.testing.assert_array_equal(bits(y[kept]), bits(XS[kept]))  # bit for bit, a kept -0 included
    assert (bits(y[~kept]) == 0).all()  # +0 where nothing is listed
    out = np.full(XS.shape, -0.0, np.float32)
    gcodec.decode(buf, out=out, accumulate=True)
    assert (bits(out[~kept]) == bits(np.float32(-0.0))).all()  # untouched
    np.testing.assert_array_equal(bits(out[kept]), bits(np.float32(-0.0) + y[kept]))  # -0 + -0 = -0


def test_powersgd_zero_sums_are_plus_zero():
    from vector_cases.sparse import _powersgd_payload

    p = np.float32([[0.0, -0.0], [1.0, 0.0], [-0.0, 2.0]])
    q = np.float32([[1.0, -1.0], [-0.0, 0.0], [2.0, -0.0]])  # p*q: products of +-0 of both signs
    buf = _powersgd_payload((3, 3), p, q)
    y = gcodec.decode(buf)
    assert not np.signbit(y[y == 0]).any()
    out = np.full((3, 3), -0.0, np.float32)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(bits(out), bits(np.float32(-0.0) + y))  # -0 + +0 = +0
    passthrough = bytes(gcodec.encode(X, gcodec.get_codec("powersgd")))
    np.testing.assert_array_equal(np.signbit(gcodec.decode(passthrough)), np.signbit(X))
