"""gcodec.torch.convert: zero-copy views of torch tensors for the kernels (CPU here; CUDA in
tests/test_gpu_sim.py's torch round trip on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import gcodec

torch = pytest.importorskip("torch")

from gcodec.torch.convert import as_array, as_tensor, to_numpy  # noqa: E402


def test_as_array_of_a_cpu_tensor_is_a_numpy_view():
    t = torch.arange(6, dtype=torch.float32)
    a = as_array(t)
    assert isinstance(a, np.ndarray) and np.shares_memory(a, to_numpy(t))
    a[0] = 7
    assert float(t[0]) == 7  # writes go to the tensor
    back = as_tensor(a)
    assert back.data_ptr() == t.data_ptr()


def test_to_numpy_points_device_tensors_at_as_array():
    t = torch.empty(4, device="meta")
    with pytest.raises(gcodec.ConfigError, match="as_array"):
        to_numpy(t)
    with pytest.raises(gcodec.ConfigError, match="meta"):
        as_array(t)  # no kernels for that device: refused, never copied
