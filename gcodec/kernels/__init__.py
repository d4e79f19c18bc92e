"""Hot loops, one folder per backend, behind one small dispatch.

A codec never names a backend's modules. It asks for the kernels of the array it works on::

    K = kernels.of(x)          # the backend's kernel package
    K.quant.scaled_decode(...)

Every backend package (``gcodec.kernels.cpu``, ``gcodec.kernels.cuda``) exposes the same modules
(``cast``, ``quant``, ``sign``, ``sparse``, ``lowrank``, ``philox``, ``feedback``, ``memory``) with the same
functions, plus ``threads_for(n)``, the context in which a tensor of ``n`` elements is processed, and
``view(x)``, the array as the backend's kernels take it (no copy). A new backend is one more folder here and
one more entry in :data:`BACKENDS`; the codecs do not change. Wire-layout facts the kernels share
with the codecs live in :mod:`gcodec.layout`, not here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from ..arrays import backend_of
from ..errors import ConfigError

__all__ = ["BACKENDS", "get", "of"]

#: Backend name -> the package holding its kernels (imported on first use).
BACKENDS: dict[str, str] = {"cpu": "gcodec.kernels.cpu", "cuda": "gcodec.kernels.cuda"}
_loaded: dict[str, ModuleType] = {}


def get(backend: str) -> ModuleType:
    """The kernel package of ``backend``; ConfigError when gcodec has none for it."""
    mod = _loaded.get(backend)
    if mod is not None:
        return mod
    name = BACKENDS.get(backend)
    if name is None:
        raise ConfigError(
            f"gcodec has no kernels for {backend!r} arrays (backends: {sorted(BACKENDS)}); "
            "copy the array to host memory first (e.g. tensor.cpu(), cupy.asnumpy)"
        )
    try:
        mod = importlib.import_module(name)
    except ImportError as e:  # the backend's optional dependencies (numba-cuda for "cuda")
        raise ConfigError(
            f"gcodec has no kernels for {backend!r} arrays here: {e} (pip install 'gcodec[{backend}]')"
        ) from None
    _loaded[backend] = mod
    return mod


def of(x: Any) -> ModuleType:
    """The kernel package for the backend where array ``x`` lives."""
    return get(backend_of(x))
