"""Zero-copy views between CPU torch tensors and NumPy arrays (bfloat16 included)."""

from __future__ import annotations

import numpy as np
import torch

from ..arrays import BFLOAT16
from ..errors import ConfigError

__all__ = ["to_numpy", "to_tensor"]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view sharing ``t``'s memory (writes go to the tensor).

    ``t`` must be a contiguous CPU tensor. NumPy has no bfloat16, and DLPack exchange of bf16 is
    not supported by NumPy either, so a bf16 tensor is viewed as int16 and then reinterpreted as
    ml_dtypes' bfloat16, the dtype gcodec encodes and decodes.
    """
    if t.device.type != "cpu":
        raise ConfigError(f"gcodec.torch handles CPU tensors (got {t.device}); GPU kernels come with the CUDA backend")
    if not t.is_contiguous():
        raise ConfigError("gcodec.torch needs a contiguous tensor")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return np.from_dlpack(t.view(torch.int16)).view(BFLOAT16)
    return np.from_dlpack(t)


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (bfloat16 arrays come back as torch.bfloat16)."""
    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
