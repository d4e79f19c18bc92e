"""gcodec.xp on host memory: the operations the protocols use, as NumPy computes them (the device
side of each runs in tests/test_device_protocols.py under the simulator)."""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec import xp
from gcodec.arrays import BFLOAT16


def test_host_arrays_stay_numpy_and_move_nothing():
    a = np.arange(6, dtype=np.float32)
    assert xp.backend(a) == "cpu" and not xp.on_device(a)
    before = xp.transferred()
    z = xp.zeros(a, 4, np.float64)
    assert isinstance(z, np.ndarray) and z.dtype == np.float64 and not z.any()
    assert xp.empty(a, 3, np.uint8).shape == (3,)
    assert xp.to_host(a) is a and xp.from_host(a, a) is a
    assert xp.transferred() == before  # host memory: nothing crosses


def test_as_bytes_views_without_copy():
    a = np.arange(4, dtype=np.float32)
    b = xp.as_bytes(a)
    assert b.dtype == np.uint8 and b.shape == (16,) and np.shares_memory(a, b)
    p = gcodec.encode(a, "fp16")
    assert bytes(xp.as_bytes(p)) == bytes(p)


def test_concat_copy_add_subtract_scale_fill():
    a, b = np.array([1, 2], np.float32), np.array([3], np.float32)
    c = xp.concat([a, b], a)
    assert c.tolist() == [1, 2, 3]
    assert xp.concat([a, b], a, np.float64).dtype == np.float64
    d = np.zeros(3, np.float32)
    xp.copy(d, c)
    xp.add(d, c)
    assert d.tolist() == [2, 4, 6]
    xp.subtract(d, c)
    assert d.tolist() == [1, 2, 3]
    xp.scale(d, d, 0.5)
    assert d.tolist() == [0.5, 1, 1.5]
    h = np.zeros(3, np.float16)
    xp.copy(h, np.array([1 / 3, 65520.0, -0.0], np.float32))  # rounds to nearest even, as astype
    assert (
        h.view(np.uint16).tolist()
        == np.array([1 / 3, 65520.0, -0.0], np.float32).astype(np.float16).view(np.uint16).tolist()
    )
    bits = np.zeros(2, np.uint16)
    xp.fill(bits, np.nan, BFLOAT16)  # a value written as bits of its number type
    assert np.isnan(bits.view(BFLOAT16).astype(np.float32)).all()


@pytest.mark.parametrize("dt", [np.float16, BFLOAT16])
def test_aggregate_takes_16_bit_values_as_bits(dt):
    from gcodec.aggregate import add_values, count_nonfinite, round_values, sum_pair

    v = np.array([1.5, -2.0, np.inf], np.float32).astype(dt)
    acc = np.zeros(3, np.float32)
    add_values(v.view(np.uint16), acc, dt)  # bits and their type, as device memory holds them
    assert acc[:2].tolist() == [1.5, -2.0] and np.isinf(acc[2])
    out = np.zeros(3, np.uint16)
    round_values(acc, out, dt)
    assert out.tolist() == v.view(np.uint16).tolist()
    s = np.zeros(3, np.uint16)
    assert sum_pair(v.view(np.uint16), v.view(np.uint16), s, dt) == 1
    assert count_nonfinite(s, dt) == 1
