"""Zero-copy views between torch tensors and the arrays gcodec's kernels take: NumPy arrays for CPU
tensors (bfloat16 included), Numba device arrays for CUDA tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..arrays import BFLOAT16
from ..errors import ConfigError

__all__ = ["arrays_from_tensors", "as_array", "as_tensor", "to_numpy", "to_tensor"]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view sharing ``t``'s memory (writes go to the tensor).

    ``t`` must be a contiguous CPU tensor. NumPy has no bfloat16, and DLPack exchange of bf16 is
    not supported by NumPy either, so a bf16 tensor is viewed as int16 and then reinterpreted as
    ml_dtypes' bfloat16, the dtype gcodec encodes and decodes.
    """
    if t.device.type != "cpu":
        raise ConfigError(
            f"to_numpy takes CPU tensors (got one on {t.device}); for CUDA tensors use "
            "gcodec.torch.convert.as_array, a zero-copy device array"
        )
    if not t.is_contiguous():
        raise ConfigError("gcodec.torch needs a contiguous tensor")
    if t.requires_grad:
        t = t.detach()
    # Tensor.numpy() shares the memory as DLPack does, at a fraction of np.from_dlpack's cost
    # (a few microseconds a tensor, paid per gradient per step by the hook)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def as_array(t: torch.Tensor) -> Any:
    """``t``'s memory as the array gcodec's kernels take, without a copy: a NumPy view for a CPU
    tensor (:func:`to_numpy`), a Numba device array for a CUDA tensor (through its
    ``__cuda_array_interface__``; the launches then go on torch's current stream, docs/gpu.md).

    CUDA bfloat16 tensors have no Numba array type: ConfigError (gcodec's device codecs take
    float32 and float64 tensors; byte buffers are uint8).
    """
    if t.device.type == "cpu":
        return to_numpy(t)
    if t.device.type != "cuda":
        raise ConfigError(f"gcodec has no kernels for tensors on {t.device} (cpu and cuda)")
    if not t.is_contiguous():
        raise ConfigError("gcodec.torch needs a contiguous tensor")
    if t.dtype == torch.bfloat16:
        raise ConfigError("a CUDA bfloat16 tensor has no Numba device array; cast it to float32 first")
    from numba import cuda

    return cuda.as_cuda_array(t.detach())


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (bfloat16 arrays come back as torch.bfloat16)."""
    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def as_tensor(a: Any) -> torch.Tensor:
    """A tensor sharing the memory of ``a``: a CPU tensor for a NumPy array (:func:`to_tensor`), a
    CUDA tensor of the array's device for a device array (``__cuda_array_interface__``; torch
    views it without a copy)."""
    if isinstance(a, np.ndarray):
        return to_tensor(a)
    if getattr(type(a), "__gcodec_device_payload__", False):
        a = a.device
    if hasattr(a, "__cuda_array_interface__"):
        return torch.as_tensor(a)  # on the array's own device, no copy
    raise ConfigError(f"cannot view {type(a).__name__} as a torch tensor without a copy")


def arrays_from_tensors(obj: Any) -> Any:
    """Every tensor in a nested dict/list as a NumPy array (copied to host memory), the rest as it
    is: the inverse of :func:`gcodec.arrays.tensors_from_arrays`, for loading checkpoints."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()
    if isinstance(obj, dict):
        return {k: arrays_from_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [arrays_from_tensors(v) for v in obj]
    return obj
