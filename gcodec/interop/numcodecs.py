"""gcodec codecs as numcodecs codecs (zarr format 2 filters, and anything else that speaks numcodecs).

This lets you store compressed gradient snapshots, optimizer states or checkpoints in zarr arrays
(or anything else that speaks numcodecs) with any gcodec codec, and read them back with nothing
but the stored bytes: every chunk is a complete, self-describing, checksummed gcodec payload.

numcodecs
    :class:`GcodecNumcodec` (codec id ``"gcodec"``) wraps any registered gcodec codec::

        import numcodecs, gcodec.interop.numcodecs  # the import registers "gcodec"
        c = numcodecs.get_codec({"id": "gcodec", "codec": "uniform", "bits": 8, "group_size": 64})
        buf = c.encode(x)        # a gcodec payload (bytes)
        y = c.decode(buf)        # float array of x's dtype and shape

    ``encode`` takes a float32/float16/bfloat16/float64 array, so in zarr format 2 use it as a
    *filter* (it sees the chunk as an array), not as a compressor (which sees raw bytes).
    Installing gcodec also declares the ``numcodecs.codecs`` entry point, so
    ``numcodecs.get_codec({"id": "gcodec", ...})`` works without importing this module first.

Lossy codecs stay lossy: what you read back is what ``gcodec.decode`` gives, not the input.
Stochastic codecs (stochastic rounding, Random-K) draw a fresh random stream per chunk from the
adapter's own :class:`~gcodec.CodecState` unless you pass ``step=`` in the config, which pins the
stream for every chunk.

Memory order: numcodecs codecs see a chunk as its memory. A Fortran-ordered array is encoded as
that memory (its transpose, a C-ordered view with the shape reversed) and the payload's ``meta``
records ``{"order": "F"}``; decoding such a payload gives the original shape back as a
Fortran-ordered view, so the values, the shape and the memory order all round-trip and zarr's
``order="F"`` arrays read back as written.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numcodecs.abc import Codec as _NumcodecsCodec
from numcodecs.compat import ensure_contiguous_ndarray_like, ndarray_copy
from numcodecs.registry import register_codec as _register_numcodec

from ..api import decode as _decode
from ..api import encode as _encode
from ..api import inspect_header
from ..arrays import DTYPES, host_array
from ..codecs.base import Codec
from ..codecs.registry import get_codec
from ..codecs.state import CodecState
from ..errors import ConfigError

__all__ = ["GcodecNumcodec", "build_codec", "decode_payload", "memory_order_view"]

_RESERVED = ("id", "codec", "checksum", "step")


def build_codec(codec: str, params: dict[str, Any]) -> Codec:
    clash = [k for k in params if k in _RESERVED]
    if clash:
        raise ConfigError(f"gcodec numcodec: parameter name(s) {clash} are reserved by the adapter")
    return get_codec(codec, **params)


_F_ORDER = {"order": "F"}


def memory_order_view(x: Any) -> tuple[np.ndarray, dict[str, str] | None]:
    """``x`` as a C-contiguous host array with the same memory, and the payload meta that says so: a
    Fortran-ordered array becomes its transpose (a view) with ``{"order": "F"}``."""
    a = x if isinstance(x, np.ndarray) else host_array(x)
    if a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous:
        return a.T, _F_ORDER
    return np.ascontiguousarray(a), None


def decode_payload(buf: Any) -> np.ndarray:
    """Decode a single-tensor payload; one written from a Fortran-ordered array comes back as one."""
    arr = _decode(buf)
    if isinstance(arr, dict):
        raise ConfigError("gcodec numcodec: the buffer holds a bundle payload, not a single tensor")
    if arr.ndim > 1 and inspect_header(buf, verify_checksum=False).meta.get("order") == "F":
        return arr.T
    return arr


class GcodecNumcodec(_NumcodecsCodec):  # type: ignore[misc]
    """A numcodecs codec that encodes arrays as gcodec payloads.

    Args:
        codec: the gcodec codec id (``"fp16"``, ``"uniform"``, ...; see ``gcodec.list_codecs()``).
        checksum: keep the payload CRC32C (default). ``False`` saves 4 bytes and a pass over the
            data per chunk; the header stays checksummed.
        step: pins the random stream of stochastic codecs (the same for every chunk); ``None``
            lets the codec advance its own counter.
        **params: the gcodec codec's parameters, e.g. ``bits=4, group_size=64``.

    The config is flat and JSON-safe: ``{"id": "gcodec", "codec": "uniform", "checksum": true,
    "bits": 8, ...}`` with every parameter of the codec filled in.
    """

    codec_id = "gcodec"

    def __init__(self, codec: str = "fp16", checksum: bool = True, step: int | None = None, **params: Any) -> None:
        self._codec = build_codec(codec, params)
        self.codec = codec
        self.checksum = bool(checksum)
        self.step = step
        self._params = self._codec.params
        #: Stream counters of stochastic codecs: successive chunks get successive streams.
        self.state = CodecState()

    def encode(self, buf: Any) -> bytes:
        arr, meta = memory_order_view(buf)
        return bytes(_encode(arr, self._codec, step=self.step, state=self.state, checksum=self.checksum, meta=meta))

    def decode(self, buf: Any, out: Any = None) -> Any:
        src = ensure_contiguous_ndarray_like(buf)
        if out is not None:
            o = out
            c_order = inspect_header(src, verify_checksum=False).meta.get("order") != "F"
            if (
                c_order
                and isinstance(o, np.ndarray)
                and o.dtype in DTYPES.values()
                and o.flags.c_contiguous
                and o.flags.writeable
            ):
                try:
                    _decode(src, out=o)
                    return out
                except ConfigError:
                    pass  # out= of another shape or size: fall back to copying
            return ndarray_copy(decode_payload(src), out)
        return decode_payload(src)

    def get_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"id": self.codec_id, "codec": self.codec, "checksum": self.checksum}
        if self.step is not None:
            cfg["step"] = self.step
        cfg.update(self._params)
        return cfg

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GcodecNumcodec:
        cfg = dict(config)
        cfg.pop("id", None)
        return cls(**cfg)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"GcodecNumcodec({args})"


_register_numcodec(GcodecNumcodec)
