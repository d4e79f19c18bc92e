"""NVFP4's tensor pass (gcodec.kernels.cpu.minifloat.tensor_group_amax): the tensor's largest
magnitude (nvfp4.md §3 step 1) and, kept for the block pass, every block of 16's largest
magnitude as binary32 bits, which the block scales are computed from (step 3). Checked against
NumPy on sizes around the 16-block batches and the kernel's 64 Ki-element chunks."""

from __future__ import annotations

import numpy as np
import pytest

from gcodec.kernels.cpu.minifloat import tensor_amax, tensor_group_amax


def _reference(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32) & np.uint32(0x7FFFFFFF)
    pad = np.zeros(-(-x.size // 16) * 16, np.uint32)
    pad[: x.size] = bits
    return pad.reshape(-1, 16).max(axis=1)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 255, 256, 257, 4111, 65535, 65536, 65537, 3 * 65536 + 40])
def test_blocks_largest_magnitudes_and_the_tensors(n: int) -> None:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    x[: min(n, 16)] = -0.0  # a block of negative zeros: its maximum is +0
    if n > 40:
        x[20] = np.float32(-3e38)
        x[33] = np.float32(1e-45)  # the smallest subnormal
    amax, finite, gmax = tensor_group_amax(x)
    ref = _reference(x)
    assert finite
    assert np.array_equal(gmax, ref)
    assert amax == float(np.abs(x).max()) == tensor_amax(x)[0]


def test_a_nan_or_an_infinity_makes_the_tensor_not_finite() -> None:
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones(70_000, np.float32)
        x[66_000] = bad
        amax, finite, gmax = tensor_group_amax(x)
        assert not finite and amax == 0.0
        assert gmax[66_000 // 16] >= 0x7F800000
