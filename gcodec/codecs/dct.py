"""``dct``: the top k DCT coefficients of every chunk of C elements (specs/codecs/dct.md).

DeMo's transform (Peng et al. 2024, "Decoupled Momentum Optimization"): each chunk of ``chunk``
consecutive elements of the flattened tensor (the last one padded with zeros) goes through the
orthonormal DCT-II; the ``k`` coefficients of largest magnitude per chunk are kept, exactly as
``chunktopk`` keeps elements (the same index codings and value sections), and the decoder applies the
inverse transform to them. Gradients whose energy sits in few frequencies survive this with far fewer
kept numbers than plain sparsification; values can go through a nested codec, ``{"id": "sign"}``
giving DeMo's 1 bit per kept coefficient (times a scale).

The reconstruction is fixed to the bit (spec §6): a float32 basis table (``gcodec.layout.dct``),
exact float32 x float32 products accumulated in float64 in increasing order and rounded once, so every
rank, every backend and a stranger's decoder produce the same float32 values. ``dims=1`` transforms
chunks of the flattened tensor; ``dims=2`` transforms s x s tiles of its matrix view along both
dimensions (DeMo's layout).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..arrays import backend_of
from ..arrays import dtype_name as _dtype_name
from ..errors import ConfigError, PayloadValueError
from ..layout import dct as dlayout
from ..sections import TensorEntry
from .base import EncodeContext, EncodePlan, Param
from .chunktopk import ChunkTopK
from .registry import register_codec
from .sparse import key_bits, smallest_key

__all__ = ["Dct"]

_NONE = type(None)
#: Inputs must stay below this magnitude (spec §2): then every coefficient is below 2^106 and every
#: value and reconstruction stays finite (rule DC5's 2^118 with room for any nested rounding).
INPUT_LIMIT = 2.0**100
VALUE_LIMIT = 2.0**118


@register_codec
class Dct(ChunkTopK):
    """Top-k DCT-II coefficients of every chunk of ``chunk`` elements.

    Parameters:
        chunk: elements per chunk, a power of two up to 256 (default 64); with ``dims=2`` the
            elements of an s x s tile, s = 2 .. 64 (DeMo: 64 x 64 tiles, ``chunk=4096``).
        dims: 1 (default) transforms chunks of the flattened tensor; 2 transforms s x s tiles of the
            tensor's matrix view (``shape[0]`` rows) along both dimensions.
        k: coefficients kept per chunk, 1 to ``chunk`` (default 4).
        index_coding: ``"gap"`` (default) or ``"packed"``, as in ``chunktopk``.
        values: ``None`` sends the kept coefficients as float32; a codec config such as
            ``{"id": "sign", "group_size": 4}`` (1 bit and a scale per chunk) encodes them with it.

    The transform works in binary32: float16 and bfloat16 tensors are converted exactly, float64
    tensors rounded to binary32 first (a float64 tensor decodes to the binary32 reconstruction).
    NaN, infinite or huge (``|x| >= 2**100``) input raises :class:`~gcodec.PayloadValueError`.
    """

    codec_id = "dct"
    RULE = "DC"
    PARAMS = {
        "chunk": Param(
            int,
            64,
            "elements per chunk: a power of two up to 256 (dims=1), s*s for s = 2..64 (dims=2)",
            choices=dlayout.ALL_CHUNKS,
        ),
        "dims": Param(int, 1, "1: chunks of the flat tensor; 2: s x s tiles of its matrix view", choices=(1, 2)),
        "k": Param(int, 4, "coefficients kept per chunk", min=1, max=256),
        "index_coding": Param(str, "gap", "how in-chunk indices are stored", choices=("gap", "packed")),
        "values": Param((dict, str, _NONE), None, "codec config for the kept coefficients, or None for float32"),
    }
    WIRE = {
        "chunk": Param(int, 64, "elements per chunk", choices=dlayout.ALL_CHUNKS),
        "dims": Param(int, 1, "1-D chunks or 2-D tiles", choices=(1, 2)),
        "k": Param(int, 4, "coefficients kept per chunk", min=1, max=256),
        "index_coding": Param(str, "gap", "index coding", choices=("gap", "packed")),
        "index_bytes": Param(int, 0, "bytes of the indices section", min=0),
        "values": Param((dict, _NONE), None, "nested value codec, or nil for float32 coefficients"),
    }

    @classmethod
    def _check_config(cls, params: dict[str, Any], err: type[Exception], where: str) -> None:
        super()._check_config(params, err, where)
        allowed = dlayout.CHUNKS if params["dims"] == 1 else dlayout.CHUNKS_2D
        if params["chunk"] not in allowed:
            raise err(f"{where}chunk={params['chunk']} is not one of {list(allowed)} for dims={params['dims']}")

    @property
    def reads_shape(self) -> bool:
        """``dims=2`` transforms tiles of the tensor's matrix view (spec §1): never a flat group."""
        return bool(self._params["dims"] == 2)

    @classmethod
    def _layout_len(cls, shape: tuple[int, ...], params: dict[str, Any]) -> int:
        """The coefficients: every chunk (tile) full, short ones padded with zeros."""
        chunk = params["chunk"]
        if params["dims"] == 1:
            return -(-math.prod(shape) // chunk) * chunk
        s = dlayout.side(chunk)
        rows, cols = dlayout.matrix_view(shape)
        return -(-rows // s) * -(-cols // s) * chunk

    @classmethod
    def _raw_values_dtype(cls, dtype: str) -> str:
        return "float32"

    def _extra_wire(self) -> dict[str, Any]:
        return {"dims": self._params["dims"]}

    @classmethod
    def _value_entry(cls, entry: TensorEntry) -> TensorEntry:
        """Coefficients are binary32 whatever the tensor's dtype, a nested codec's included (spec §1)."""
        return entry if entry.dtype != "float64" else dataclasses.replace(entry, dtype="float32")

    # ---- encoding --------------------------------------------------------------------------
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        dname = _dtype_name(flat.dtype)
        chunk = self._params["chunk"]
        bits, mask, infkey = key_bits(flat, dname)
        K = kernels.of(bits)
        # the key of 2^100 (binary16 never reaches it)
        lim = {"float32": 0x71800000, "float64": 0x4630000000000000, "float16": 0x7C00, "bfloat16": 0x7180}[dname]
        big, bad = K.sparse.count_ge(bits, mask, infkey, bits.dtype.type(min(lim, int(infkey))))
        if bad or big:
            raise PayloadValueError(
                f"dct: input has NaN or infinite values ({bad} found) or magnitudes >= 2**100 "
                f"({big - bad} found); see specs/codecs/dct.md section 2"
            )
        if dname == "float32":
            x32 = flat
        elif backend_of(flat) == "cpu":
            x32 = flat.astype(np.float32)  # exact for 16-bit inputs, nearest even for float64
        else:
            raise ConfigError(f"dct: device tensors must be float32 (got {dname}); cast on the device first")
        n = flat.shape[0]
        shape = tuple(int(d) for d in x.shape)
        coef = K.memory.empty(self._layout_len(shape, self._params), np.float32)
        if self._params["dims"] == 1:
            K.dct.forward(x32, chunk, self._table(K, chunk), coef)
        elif coef.shape[0]:
            s = dlayout.side(chunk)
            rows, cols = dlayout.matrix_view(shape)
            K.dct.forward2(x32, rows, cols, s, self._table(K, s), coef)
        plan = self._plan_flat(coef, ctx)[0]  # refuses values the nested codec would overflow (DC4)
        if self._nested is not None and n:
            self._refuse_large_values(K, coef)
        return plan

    def plan_feedback(self, x: Any, residual: Any, new_residual: Any, ctx: EncodeContext) -> EncodePlan | None:
        """None: the coefficients are selected, the residual is kept in the tensor's own domain, so
        error feedback takes the generic path (encode, decode, subtract)."""
        return None

    def _refuse_large_values(self, K: Any, coef: Any) -> None:
        """Refuse coefficients the nested codec might decode to 2**118 or more (rule DC5 refuses
        them on decode): its magnitude bound decides, as for overflow (specs/codecs/hybrid.md §3.1)."""
        assert self._nested is not None
        nested, total = self._nested, coef.shape[0] // self._params["chunk"] * self._params["k"]
        kt = smallest_key("float32", lambda v: nested.magnitude_bound(v, total) >= VALUE_LIMIT)
        cb, cm, ci = key_bits(coef, "float32")
        over, _ = K.sparse.count_ge(cb, cm, ci, cb.dtype.type(min(kt, int(ci))))
        if over:
            raise PayloadValueError(
                f"dct: {over} coefficient(s) could decode through the nested {nested.codec_id!r} codec to "
                "2**118 or more, which rule DC5 refuses; scale the tensor down"
            )

    @staticmethod
    def _table(K: Any, chunk: int) -> Any:
        """The basis table in the memory of backend ``K`` (kept there per chunk length)."""
        return K.dct.table(dlayout.basis(chunk))

    # ---- header ----------------------------------------------------------------------------
    @classmethod
    def decode_work(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """k multiply-adds per element, dims 1 and 2 alike (specs/format.md §9.1)."""
        return entry.numel * params["k"]

    # ---- decoding --------------------------------------------------------------------------
    @classmethod
    def _values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        vals = super()._values(params, entry, views)
        big = int(np.count_nonzero(np.abs(vals) >= np.float32(VALUE_LIMIT))) if vals.shape[0] else 0
        if big:
            raise PayloadValueError(f"DC5: {big} value(s) have magnitude >= 2**118")
        return vals

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        # Every check runs before ``out`` is touched; the only temporaries are kept-count sized.
        idx = cls._decode_indices(params, entry, views)
        vals = cls._values(params, entry, views)
        K = kernels.of(out)
        chunk = params["chunk"]
        if params["dims"] == 1:
            K.dct.inverse(idx, vals, chunk, params["k"], cls._table(K, chunk), out, accumulate)
        elif out.shape[0]:
            s = dlayout.side(chunk)
            rows, cols = dlayout.matrix_view(entry.shape)
            K.dct.inverse2(idx, vals, rows, cols, s, params["k"], cls._table(K, s), out, accumulate)

    def magnitude_bound(self, max_abs: float, count: int) -> float:  # pragma: no cover - a host never nests
        return math.inf
