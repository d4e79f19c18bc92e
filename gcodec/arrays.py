"""The bottom layer: array intake, backends and dtypes.

:func:`intake` takes what a user hands in (NumPy, ml_dtypes bfloat16 arrays, torch tensors, CuPy,
anything with ``__array__``, ``__cuda_array_interface__`` or DLPack) without moving it, and says which
backend it lives on; :mod:`gcodec.kernels` picks that backend's kernels. This module also names the
four floating dtypes the wire format knows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

from .errors import ConfigError

__all__ = [
    "BFLOAT16",
    "DTYPES",
    "Intake",
    "backend_of",
    "dtype_from_name",
    "dtype_name",
    "host_array",
    "intake",
    "tensors_from_arrays",
    "torch_view",
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
    return torch_view(x.detach().contiguous())


def _TORCH_FLOATS(torch: Any) -> tuple[Any, ...]:
    return (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def torch_view(t: Any) -> np.ndarray:
    """A zero-copy NumPy view of a CPU torch tensor's memory, any dtype (bfloat16 through an int16
    view, as ml_dtypes ``bfloat16``); ConfigError when the tensor is not contiguous or has no memory
    NumPy can see."""
    import torch

    if getattr(t, "device", None) is None or t.device.type != "cpu":
        raise ConfigError(f"expected a CPU torch tensor, got one on {getattr(t, 'device', '?')}")
    if getattr(t, "layout", torch.strided) != torch.strided or getattr(t, "is_quantized", False):
        raise ConfigError("expected a dense, non-quantized torch tensor")
    if not t.is_contiguous():
        raise ConfigError("the torch tensor must be contiguous (call .contiguous())")
    d = t.detach()
    if d.dtype == torch.bfloat16:
        return d.view(torch.int16).numpy().view(BFLOAT16)
    try:
        return d.numpy()
    except TypeError as e:  # dtypes NumPy lacks (float8, ...)
        raise ConfigError(f"torch dtype {t.dtype} has no NumPy equivalent: {e}") from None


def backend_of(x: Any) -> str:
    """Where array ``x`` lives: ``"cpu"`` (host memory) or ``"cuda"`` (device memory). No copy, no
    CUDA initialisation."""
    if isinstance(x, (np.ndarray, np.generic)):
        return "cpu"
    if _is_torch(x):
        dev = getattr(getattr(x, "device", None), "type", "cpu")
        return "cpu" if dev == "cpu" else "cuda" if dev == "cuda" else str(dev)
    if getattr(type(x), "__gcodec_device_payload__", False):
        return "cuda"
    if type(x).__module__.startswith("numba.cuda") and hasattr(x, "copy_to_host"):
        return "cuda"  # Numba device arrays (the simulator's too, which lack __cuda_array_interface__)
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    if hasattr(x, "__dlpack_device__"):
        try:
            kind = int(x.__dlpack_device__()[0])
        except Exception:
            kind = 1
        # DLPack device types: 1 CPU, 3 CUDA host (pinned: host memory), 2 CUDA, 10 ROCm, 13 CUDA managed
        return "cpu" if kind in (1, 3) else "cuda" if kind in (2, 10, 13) else f"dlpack:{kind}"
    return "cpu"


@dataclasses.dataclass(frozen=True)
class Intake:
    """An array as gcodec takes it in: where it lives, and the array itself, not copied.

    ``array`` is a C-contiguous NumPy array for the ``"cpu"`` backend (a view of the caller's
    memory whenever that is already C-contiguous); for a device backend it is the caller's own
    object, untouched.
    """

    array: Any
    backend: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def host(self) -> np.ndarray:
        """The NumPy array of a ``"cpu"`` intake; ConfigError for device arrays (never a silent copy)."""
        if self.backend != "cpu":
            raise ConfigError(
                f"this operation needs a host array; the array lives on {self.backend!r} "
                "(copy it to host memory explicitly, e.g. tensor.cpu())"
            )
        return self.array


def intake(x: Any) -> Intake:
    """Take in any array gcodec encodes without moving it: NumPy (and ml_dtypes bfloat16), torch
    tensors, CuPy arrays, anything with ``__array__``, ``__cuda_array_interface__`` or DLPack.

    Host arrays become C-contiguous NumPy arrays (a view when possible; a copy only when the caller's
    array is strided). Device arrays are recognised and returned as they are.
    """
    backend = backend_of(x)
    if backend != "cpu":
        try:
            dt = np.dtype(str(x.dtype).replace("torch.", ""))
        except TypeError:
            dt = np.dtype(np.uint8) if "bfloat16" not in str(x.dtype) else BFLOAT16
        return Intake(x, backend, dt, tuple(int(d) for d in x.shape))
    if isinstance(x, np.matrix):
        raise ConfigError("cannot encode np.matrix (it does not flatten); pass np.asarray(m)")
    if isinstance(x, np.ma.MaskedArray):
        raise ConfigError("cannot encode a masked array: the mask would be lost; pass m.filled(0) or m.data")
    if isinstance(x, np.ndarray):  # other subclasses (np.memmap, ...) are read through a plain view
        arr = x.view(np.ndarray) if type(x) is not np.ndarray else x
    elif _is_torch(x):
        arr = _torch_to_numpy(x)
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
    return Intake(arr, "cpu", arr.dtype, tuple(int(d) for d in arr.shape))


def tensors_from_arrays(obj: Any) -> Any:
    """Every NumPy array in a nested dict/list as a CPU torch tensor (copied), the rest as it is: a
    checkpoint that ``torch.load(..., weights_only=True)`` accepts."""
    import torch

    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, dict):
        return {k: tensors_from_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [tensors_from_arrays(v) for v in obj]
    return obj


def host_array(x: Any) -> np.ndarray:
    """``intake(x).host``: a C-contiguous NumPy array in host memory, or ConfigError for device arrays."""
    return intake(x).host
