"""gcodec codecs as numcodecs codecs, and as a zarr v3 array-to-bytes codec.

This lets you store compressed gradient snapshots, optimizer states or checkpoints in zarr arrays
(or anything else that speaks numcodecs) with any gcodec codec, and read them back with nothing
but the stored bytes: every chunk is a complete, self-describing, checksummed gcodec payload.

numcodecs
    :class:`GcodecNumcodec` (codec id ``"gcodec"``) wraps any registered gcodec codec::

        import numcodecs, gcodec.numcodecs  # the import registers "gcodec"
        c = numcodecs.get_codec({"id": "gcodec", "codec": "uniform", "bits": 8, "group_size": 64})
        buf = c.encode(x)        # a gcodec payload (bytes)
        y = c.decode(buf)        # float array of x's dtype and shape

    ``encode`` takes a float32/float16/bfloat16/float64 array, so in zarr format 2 use it as a
    *filter* (it sees the chunk as an array), not as a compressor (which sees raw bytes).
    Installing gcodec also declares the ``numcodecs.codecs`` entry point, so
    ``numcodecs.get_codec({"id": "gcodec", ...})`` works without importing this module first.

zarr v3
    :class:`GcodecZarrCodec` (zarr codec name ``"gcodec"``) is an array-to-bytes codec: it takes
    the place of zarr's ``bytes`` serializer, and compressors may follow it::

        import zarr
        from gcodec.numcodecs import GcodecZarrCodec
        z = zarr.create_array(store, shape=(1024, 1024), chunks=(256, 1024), dtype="float32",
                              serializer=GcodecZarrCodec(codec="uniform", bits=8))

    It is defined only when zarr 3 is importable, and zarr finds it through the ``zarr.codecs``
    entry point when it reopens such an array.

Lossy codecs stay lossy: what you read back is what ``gcodec.decode`` gives, not the input.
Stochastic codecs (stochastic rounding, Random-K) draw a fresh random stream per chunk unless
you pass ``step=`` in the config, which pins the stream for every chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numcodecs.abc import Codec as _NumcodecsCodec
from numcodecs.compat import ensure_contiguous_ndarray_like, ndarray_copy
from numcodecs.registry import register_codec as _register_numcodec

from .api import decode as _decode
from .arrays import DTYPES, as_numpy
from .codecs.base import Codec
from .codecs.registry import get_codec
from .errors import ConfigError

__all__ = ["GcodecNumcodec", "GcodecZarrCodec"]

_RESERVED = ("id", "codec", "checksum", "step")


def _build(codec: str, params: dict[str, Any]) -> Codec:
    clash = [k for k in params if k in _RESERVED]
    if clash:
        raise ConfigError(f"gcodec numcodec: parameter name(s) {clash} are reserved by the adapter")
    return get_codec(codec, **params)


def _decode_payload(buf: Any) -> np.ndarray:
    arr = _decode(buf)
    if isinstance(arr, dict):
        raise ConfigError("gcodec numcodec: the buffer holds a bundle payload, not a single tensor")
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
        self._codec = _build(codec, params)
        self.codec = codec
        self.checksum = bool(checksum)
        self.step = step
        self._params = self._codec.params

    def encode(self, buf: Any) -> bytes:
        arr = as_numpy(buf)
        return bytes(self._codec.encode(arr, step=self.step, checksum=self.checksum))

    def decode(self, buf: Any, out: Any = None) -> Any:
        src = ensure_contiguous_ndarray_like(buf)
        if out is not None:
            o = out
            if isinstance(o, np.ndarray) and o.dtype in DTYPES.values() and o.flags.c_contiguous and o.flags.writeable:
                try:
                    _decode(src, out=o)
                    return out
                except ConfigError:
                    pass  # out= of another shape or size: fall back to copying
            return ndarray_copy(_decode_payload(src), out)
        return _decode_payload(src)

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


# ---------------------------------------------------------------------------------------------
# zarr v3

try:  # zarr 3 is optional
    from dataclasses import dataclass

    from zarr.abc.codec import ArrayBytesCodec as _ArrayBytesCodec
    from zarr.core.common import parse_named_configuration as _parse_named
    from zarr.registry import register_codec as _register_zarr
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_ZARR = False
else:
    _HAVE_ZARR = True

if _HAVE_ZARR:

    @dataclass(frozen=True)
    class GcodecZarrCodec(_ArrayBytesCodec):  # type: ignore[misc]
        """zarr v3 array-to-bytes codec: each chunk is stored as one gcodec payload.

        Args are those of :class:`GcodecNumcodec`. In the array metadata it reads
        ``{"name": "gcodec", "configuration": {"codec": ..., "checksum": ..., **params}}``.
        """

        is_fixed_size = False

        codec: str
        checksum: bool
        step: int | None
        params: tuple[tuple[str, Any], ...]

        def __init__(
            self, *, codec: str = "fp16", checksum: bool = True, step: int | None = None, **params: Any
        ) -> None:
            built = _build(codec, params)
            object.__setattr__(self, "codec", codec)
            object.__setattr__(self, "checksum", bool(checksum))
            object.__setattr__(self, "step", step)
            object.__setattr__(self, "params", tuple(sorted(built.params.items())))

        @property
        def _gcodec(self) -> Codec:
            return get_codec(self.codec, **dict(self.params))

        @classmethod
        def from_dict(cls, data: dict[str, Any]) -> GcodecZarrCodec:
            _, cfg = _parse_named(data, "gcodec", require_configuration=False)
            kwargs: dict[str, Any] = dict(cfg or {})
            return cls(**kwargs)

        def to_dict(self) -> dict[str, Any]:
            cfg: dict[str, Any] = {"codec": self.codec, "checksum": self.checksum, **dict(self.params)}
            if self.step is not None:
                cfg["step"] = self.step
            return {"name": "gcodec", "configuration": cfg}

        def validate(self, *, shape: Any, dtype: Any, chunk_grid: Any) -> None:
            native = dtype.to_native_dtype()
            if np.dtype(native).newbyteorder("=") not in DTYPES.values():
                raise ValueError(f"gcodec stores float32/float16/bfloat16/float64 arrays, not {native}")

        def compute_encoded_size(self, input_byte_length: int, chunk_spec: Any) -> int:
            raise NotImplementedError  # variable: depends on the codec and the data

        async def _encode_single(self, chunk_array: Any, chunk_spec: Any) -> Any:
            arr = np.ascontiguousarray(chunk_array.as_numpy_array())
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            payload = self._gcodec.encode(arr, step=self.step, checksum=self.checksum)
            return chunk_spec.prototype.buffer.from_bytes(bytes(payload))

        async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            arr = _decode_payload(chunk_bytes.as_numpy_array())
            want = np.dtype(chunk_spec.dtype.to_native_dtype())
            if arr.shape != tuple(chunk_spec.shape):
                raise ConfigError(f"gcodec chunk decodes to shape {arr.shape}, the array expects {chunk_spec.shape}")
            if arr.dtype != want:
                arr = arr.astype(want)
            return chunk_spec.prototype.nd_buffer.from_numpy_array(arr)

    _register_zarr("gcodec", GcodecZarrCodec)
