"""gcodec codecs as a zarr v3 array-to-bytes codec: every chunk is one gcodec payload.

:class:`GcodecZarrCodec` (zarr codec name ``"gcodec"``) takes the place of zarr's ``bytes``
serializer, and compressors may follow it::

    import zarr
    from gcodec.interop.zarr import GcodecZarrCodec
    z = zarr.create_array(store, shape=(1024, 1024), chunks=(256, 1024), dtype="float32",
                          serializer=GcodecZarrCodec(codec="uniform", bits=8))

zarr finds it through the ``zarr.codecs`` entry point when it reopens such an array. Importing this
module needs zarr 3.

zarr's codecs are frozen and rebuilt freely (once per chunk, per array open), so the random streams
of stochastic codecs cannot live in the codec object: they live in one :class:`~gcodec.CodecState`
per codec configuration in this process (:func:`stream_state`), so that successive chunks take
successive streams. Pass ``step=`` to pin one stream for every chunk instead.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.abc.codec import ArrayBytesCodec as _ArrayBytesCodec
from zarr.core.common import parse_named_configuration as _parse_named
from zarr.registry import register_codec as _register_zarr

from ..api import encode as _encode
from ..arrays import DTYPES
from ..codecs.base import Codec
from ..codecs.registry import get_codec
from ..codecs.state import CodecState
from ..errors import ConfigError
from .numcodecs import build_codec, decode_payload

__all__ = ["GcodecZarrCodec", "stream_state"]

_STATES: dict[str, CodecState] = {}
_STATES_LOCK = threading.Lock()


def stream_state(codec: Codec) -> CodecState:
    """The state every zarr chunk encoded with this codec configuration shares (one per process)."""
    key = json.dumps(codec.get_config(), sort_keys=True)
    with _STATES_LOCK:
        st = _STATES.get(key)
        if st is None:
            st = _STATES[key] = CodecState()
        return st


@dataclass(frozen=True)
class GcodecZarrCodec(_ArrayBytesCodec):  # type: ignore[misc]
    """zarr v3 array-to-bytes codec: each chunk is stored as one gcodec payload.

    Args are those of :class:`gcodec.interop.numcodecs.GcodecNumcodec`. In the array metadata it
    reads ``{"name": "gcodec", "configuration": {"codec": ..., "checksum": ..., **params}}``.
    """

    is_fixed_size = False

    codec: str
    checksum: bool
    step: int | None
    params: tuple[tuple[str, Any], ...]

    def __init__(self, *, codec: str = "fp16", checksum: bool = True, step: int | None = None, **params: Any) -> None:
        built = build_codec(codec, params)
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
        c = self._gcodec
        payload = _encode(arr, c, step=self.step, state=stream_state(c), checksum=self.checksum)
        return chunk_spec.prototype.buffer.from_bytes(bytes(payload))

    async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        arr = decode_payload(chunk_bytes.as_numpy_array())
        want = np.dtype(chunk_spec.dtype.to_native_dtype())
        if arr.shape != tuple(chunk_spec.shape):
            raise ConfigError(f"gcodec chunk decodes to shape {arr.shape}, the array expects {chunk_spec.shape}")
        if arr.dtype != want:
            arr = arr.astype(want)
        return chunk_spec.prototype.nd_buffer.from_numpy_array(arr)


_register_zarr("gcodec", GcodecZarrCodec)
