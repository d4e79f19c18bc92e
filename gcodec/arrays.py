"""Layer 1: array backends and dtypes.

Everything above this module works on NumPy arrays in host memory. This module turns what a user
hands in (NumPy, ml_dtypes bfloat16 arrays, torch tensors, anything with ``__array__`` or DLPack)
into a C-contiguous NumPy array without copying when it can, and names the four floating dtypes
the wire format knows.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import ConfigError

__all__ = [
    "BFLOAT16",
    "DTYPES",
    "as_numpy",
    "dtype_from_name",
    "dtype_name",
]

BFLOAT16: np.dtype = np.dtype(ml_dtypes.bfloat16)

#: Wire names of the tensor dtypes a payload may declare, and their NumPy dtypes.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
    "float64": np.dtype(np.float64),
}
_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: Any) -> str:
    """The wire name of a NumPy dtype, or ConfigError when it is not one of the four floats."""
    dt = np.dtype(dtype)
    try:
        return _NAMES[dt]
    except KeyError:
        raise ConfigError(f"unsupported dtype {dt}; gcodec encodes float32, float16, bfloat16 and float64") from None


def dtype_from_name(name: str) -> np.dtype:
    return DTYPES[name]


def _torch_to_numpy(x: Any) -> np.ndarray:
    import torch

    if getattr(x, "is_meta", False) or str(getattr(x, "device", "")) == "meta":
        raise ConfigError("cannot encode a torch meta tensor: it has no data")
    if getattr(x, "layout", torch.strided) != torch.strided:
        raise ConfigError(
            f"cannot encode a torch tensor of layout {x.layout}; gcodec encodes dense tensors (call .to_dense())"
        )
    if getattr(x, "is_quantized", False) or x.dtype not in _TORCH_FLOATS(torch):
        raise ConfigError(f"unsupported torch dtype {x.dtype}; gcodec encodes float32, float16, bfloat16 and float64")
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def _TORCH_FLOATS(torch: Any) -> tuple[Any, ...]:
    return (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def as_numpy(x: Any) -> np.ndarray:
    """A C-contiguous NumPy view (or, when unavoidable, copy) of ``x`` in host memory.

    ``np.matrix`` and masked arrays are refused (a matrix does not flatten, a mask would be lost);
    other ndarray subclasses (``np.memmap``, ...) are read through a plain ndarray view.
    """
    if isinstance(x, np.matrix):
        raise ConfigError("cannot encode np.matrix (it does not flatten); pass np.asarray(m)")
    if isinstance(x, np.ma.MaskedArray):
        raise ConfigError("cannot encode a masked array: the mask would be lost; pass m.filled(0) or m.data")
    if isinstance(x, np.ndarray):
        arr = x.view(np.ndarray) if type(x) is not np.ndarray else x
    elif type(x).__module__.startswith("torch"):
        arr = _torch_to_numpy(x)
    elif hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        arr = x.get()  # CuPy: device kernels arrive with the GPU issue; copy to host for now
    elif isinstance(x, np.generic):
        arr = np.asarray(x)
    elif hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        arr = np.asarray(x)
    elif hasattr(x, "__dlpack__"):
        arr = np.from_dlpack(x)
    else:
        raise ConfigError(f"cannot encode object of type {type(x).__name__}: expected an array")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr
