"""Launch geometry, device-array adoption and the few float helpers every CUDA kernel module shares.

Kernels use grid-stride loops, so any grid covers any size: on a GPU the grid is sized to the work
(256 threads a block); under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), where every
simulated thread is a Python thread, it is kept to a few small blocks.

**Streams.** Every launch goes on the *current stream* of this thread (:func:`stream`): when gcodec
takes in a torch CUDA tensor it is ``torch.cuda.current_stream()``, for a CuPy array
``cupy.cuda.get_current_stream()``, each wrapped with ``numba.cuda.external_stream`` (no sync, no
copy); Numba device arrays leave it as it is (Numba's default stream until a torch or CuPy array was
taken in on this thread); :func:`use_stream` sets it for a block of code. Values read back on the
host (:func:`host`) are copied on that stream and the stream is synchronised: the only waits.

Float steps whose rounding the spec fixes go through :func:`mul32` / :func:`mul64` / :func:`sub64`:
on a GPU they are libdevice's ``__fmul_rn`` / ``__dmul_rn`` / ``__dsub_rn``, which the compiler never
contracts into a fused multiply-add (it contracts ``a * b + c`` by default); in the simulator they are
plain operators (NumPy never fuses). Every sum a kernel writes goes through :func:`pos_nan`, the NaN
rule of specs/format.md §10 (a NaN sum is a positive NaN; :mod:`gcodec.kernels.scalar`'s, the CPU
backend's too).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from numba import cuda

from ...errors import ConfigError
from .. import scalar

__all__ = [
    "SIM",
    "adopt",
    "device",
    "grid",
    "host",
    "is_device",
    "mul32",
    "mul64",
    "one",
    "pos_nan",
    "stream",
    "sub64",
    "transferred",
    "upload",
    "use_stream",
]

SIM: bool = bool(cuda.simulator_enabled) if hasattr(cuda, "simulator_enabled") else False
try:  # the simulator's module has no libdevice
    from numba.cuda import libdevice as _ld
except ImportError:  # pragma: no cover - simulator
    _ld = None
if _ld is None or type(getattr(cuda, "device_array", None)).__module__.startswith("numba.cuda.simulator"):
    SIM = True
if getattr(cuda.to_device, "__module__", "").startswith("numba.cuda.simulator"):
    SIM = True

THREADS = 32 if SIM else 256
MAX_BLOCKS = 2 if SIM else 65535


_LOCAL = threading.local()


def stream() -> Any:
    """This thread's current stream for gcodec's launches and copies (0: Numba's default stream)."""
    return getattr(_LOCAL, "stream", 0)


def _set_stream(s: Any) -> None:
    _LOCAL.stream = s


def transferred() -> int:
    """Bytes this thread has copied between host and device memory through gcodec (both ways):
    the transports' ``host_bytes`` statistic is the change of this count over an exchange."""
    return int(getattr(_LOCAL, "moved", 0))


def _count(nbytes: int) -> None:
    _LOCAL.moved = getattr(_LOCAL, "moved", 0) + int(nbytes)


@contextlib.contextmanager
def use_stream(s: Any) -> Iterator[None]:
    """Queue gcodec's device work on Numba stream ``s`` (e.g. ``numba.cuda.stream()``, or
    ``numba.cuda.external_stream(ptr)``) inside the block."""
    old = stream()
    _set_stream(s)
    try:
        yield
    finally:
        _set_stream(old)


def _caller_stream(x: Any) -> Any:  # pragma: no cover - needs a GPU
    """The current stream of the library that owns ``x`` (torch, CuPy), as a Numba stream; None
    when ``x`` belongs to neither."""
    mod = type(x).__module__
    try:
        if mod.startswith("torch"):
            import torch

            ptr = int(torch.cuda.current_stream(x.device).cuda_stream)
        elif mod.startswith("cupy"):
            import cupy

            ptr = int(cupy.cuda.get_current_stream().ptr)
        else:
            return None
    except Exception:
        return None
    return cuda.external_stream(ptr) if ptr else 0


def grid(n: int, max_blocks: int = MAX_BLOCKS) -> tuple[Any, ...]:
    """Launch configuration for ``n`` independent work items: (blocks, threads[, stream]), grid-stride
    loops covering the rest, on this thread's current stream."""
    blocks = max(1, min(max_blocks, MAX_BLOCKS, (max(int(n), 1) + THREADS - 1) // THREADS))
    s = stream()
    return (blocks, THREADS, s) if s else (blocks, THREADS)


def one() -> tuple[Any, ...]:
    """Launch configuration of a one-thread kernel (serial steps), on the current stream."""
    s = stream()
    return (1, 1, s) if s else (1, 1)


def host(a: Any) -> np.ndarray:
    """A host copy of device ``a``, copied on the current stream after the work queued there."""
    _count(a.size * a.dtype.itemsize)
    s = stream()
    if not s:
        return np.asarray(a.copy_to_host())
    h = a.copy_to_host(stream=s)
    s.synchronize()
    return np.asarray(h)


def upload(h: np.ndarray) -> Any:
    """A device copy of host ``h``, queued on the current stream."""
    h = np.ascontiguousarray(h)
    _count(h.nbytes)
    s = stream()
    return cuda.to_device(h, stream=s) if s else cuda.to_device(h)


if SIM:

    @cuda.jit(device=True)
    def mul32(a, b):  # pragma: no cover - device
        return np.float32(np.float32(a) * np.float32(b))

    @cuda.jit(device=True)
    def mul64(a, b):  # pragma: no cover - device
        return np.float64(a) * np.float64(b)

    @cuda.jit(device=True)
    def sub64(a, b):  # pragma: no cover - device
        return np.float64(a) - np.float64(b)

else:  # pragma: no cover - needs a GPU

    @cuda.jit(device=True)
    def mul32(a, b):
        return _ld.fmul_rn(np.float32(a), np.float32(b))

    @cuda.jit(device=True)
    def mul64(a, b):
        return _ld.dmul_rn(np.float64(a), np.float64(b))

    @cuda.jit(device=True)
    def sub64(a, b):
        return _ld.dsub_rn(np.float64(a), np.float64(b))


#: specs/format.md §10's NaN rule, compiled for the device: ``pos_nan(a + b)`` is the sum, a NaN one
#: with its sign bit cleared (a GPU's NaN sums are positive already; the simulator's are NumPy's).
pos_nan = cuda.jit(device=True)(scalar.pos_nan)


def is_device(a: Any) -> bool:
    """Whether ``a`` is a Numba device array (real or simulated)."""
    return cuda.is_cuda_array(a) if not SIM else type(a).__name__ == "FakeCUDAArray"


def adopt(x: Any) -> Any:
    """A Numba device array viewing ``x`` (CuPy, torch CUDA tensor, ``__cuda_array_interface__``
    object, Numba device array) without a copy."""
    if type(x).__module__.startswith("numba.cuda"):
        return x
    if not SIM and not cuda.is_available():
        raise ConfigError(
            f"gcodec has no kernels for 'cuda' arrays here: numba.cuda finds no usable GPU or driver "
            f"for this {type(x).__name__} (docs/gpu.md)"
        )
    if not SIM:  # pragma: no cover - needs a GPU
        s = _caller_stream(x)
        if s is not None:
            _set_stream(s)
    if SIM:  # the simulator has no foreign device memory
        raise ConfigError(f"the CUDA simulator cannot adopt {type(x).__name__}; pass a numba.cuda device array")
    if hasattr(x, "__cuda_array_interface__"):  # pragma: no cover - needs a GPU
        return cuda.as_cuda_array(x)
    if hasattr(x, "__dlpack__"):  # pragma: no cover - needs a GPU
        try:
            import cupy

            return cuda.as_cuda_array(cupy.from_dlpack(x))
        except ImportError:
            pass
    raise ConfigError(f"cannot view {type(x).__name__} as a CUDA array without a copy")  # pragma: no cover


def device(a: Any) -> Any:
    """``a`` in device memory: device arrays as they are, host arrays copied (decoding host bytes)."""
    if type(a).__module__.startswith("numba.cuda"):
        return a
    if isinstance(a, np.ndarray):
        return upload(a)
    return adopt(a)


def missing(module: str, name: str) -> Exception:
    """The error for a kernel this backend does not have yet (a module-level ``__getattr__``)."""
    if name.startswith("__"):
        return AttributeError(name)
    return ConfigError(
        f"gcodec's CUDA backend has no {module}.{name} kernel yet (docs/gpu.md lists what runs on the device); "
        "copy the array to host memory first (tensor.cpu(), cupy.asnumpy, device_array.copy_to_host())"
    )
