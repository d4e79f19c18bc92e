"""What ``decode(out=...)`` accepts: exactly what the kernels write into, or a ConfigError.

The kernels write ``numel`` elements through a flat, C-contiguous, aligned, native-endian view of
``out``. Anything else (a subclass whose ``reshape(-1)`` is not flat, like ``np.matrix``; a strided
view; a read-only or foreign-endian array) would make them write the wrong elements or past the end,
so it is refused here, before anything is decoded. An ndarray subclass is decoded through a plain
ndarray view of its memory and returned as it was given.

An ``out`` whose memory overlaps the payload's bytes (or, in a bundle, another entry's ``out``) is
refused too: decoding would overwrite sections it still has to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .arrays import DTYPES, backend_of, torch_view
from .errors import ConfigError

__all__ = ["flat_out", "refuse_overlaps"]


def flat_out(out: Any, numel: int, shape: tuple[int, ...], where: str = "out=") -> np.ndarray:
    """The flat plain-ndarray view of ``out`` that the kernels write, after every check. A CPU torch
    tensor is written through a zero-copy view of its memory (bfloat16 included).

    A device ``out`` (CuPy, torch CUDA, Numba device array) becomes its backend's flat view."""
    backend = backend_of(out)
    if backend != "cpu":
        return _flat_device_out(out, numel, shape, where, backend)
    if type(out).__module__.startswith("torch"):  # a CPU tensor: decode into its memory, return it
        out = torch_view(out)
    if not isinstance(out, np.ndarray):
        raise ConfigError(f"{where} must be a numpy array, got {type(out).__name__}")
    if out.size != numel:
        raise ConfigError(f"{where} has {out.size} elements; the payload's tensor has shape {list(shape)}")
    if out.dtype not in DTYPES.values():
        raise ConfigError(f"{where} dtype {out.dtype.str} is not one of native float32/float16/bfloat16/float64")
    if not out.flags.c_contiguous:
        raise ConfigError(f"{where} must be C-contiguous")
    if not out.flags.writeable:
        raise ConfigError(f"{where} must be writeable")
    if not out.flags.aligned:
        raise ConfigError(f"{where} must be aligned to its element size")
    flat = out.view(np.ndarray).reshape(-1)
    if flat.ndim != 1 or flat.shape[0] != numel:
        raise ConfigError(f"{where} cannot be viewed as a flat array of {numel} elements")
    return flat


def _flat_device_out(out: Any, numel: int, shape: tuple[int, ...], where: str, backend: str) -> Any:
    from . import kernels  # a device backend is imported only when a device out= is given

    dev = kernels.get(backend).view(out)
    if int(dev.size) != numel:
        raise ConfigError(f"{where} has {dev.size} elements; the payload's tensor has shape {list(shape)}")
    if np.dtype(dev.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ConfigError(f"{where} on the device must be float32 or float64, not {dev.dtype}")
    if not dev.is_c_contiguous():
        raise ConfigError(f"{where} must be C-contiguous")
    return dev.reshape(numel)


def refuse_overlaps(payload: np.ndarray, outs: Sequence[tuple[str, np.ndarray]]) -> None:
    """ConfigError when an output overlaps the payload buffer or another output (memory bounds)."""
    outs = [(n, o) for n, o in outs if isinstance(o, np.ndarray)]  # device memory never overlaps host bytes
    for i, (name, o) in enumerate(outs):
        if o.size and np.may_share_memory(o, payload):
            raise ConfigError(f"{name} overlaps the payload buffer; decode into memory of its own")
        for other, o2 in outs[:i]:
            if o.size and o2.size and np.may_share_memory(o, o2):
                raise ConfigError(f"{name} and {other} overlap; give each tensor memory of its own")
