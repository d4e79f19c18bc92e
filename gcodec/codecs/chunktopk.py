"""``chunktopk``: the top k of every chunk of C elements (specs/codecs/chunktopk.md).

The flat tensor is cut into chunks of ``chunk`` consecutive elements (the last may be shorter) and
each chunk keeps its ``k`` largest magnitudes, ties to the lowest index (SparseLoCo: top-64 of
each 4096-element chunk, 2-bit values, with error feedback). Unlike global ``topk`` every chunk
contributes, the payload size hardly depends on the data, and a chunk's indices fit in
``bitlength(chunk - 1)`` bits.

In-chunk indices travel as

* ``index_coding="gap"`` (default): the chunk's sorted gaps bit-packed at the width of its largest
  gap, one width byte per chunk. For 64 of 4096 random positions the largest gap usually needs 8-9
  bits: ~9.1 bits per index with the width byte;
* ``index_coding="packed"``: every index in ``bitlength(chunk - 1)`` bits (12 for 4096), the
  fixed-width layout SparseLoCo ships.

Values are raw in the tensor's dtype or go through a nested codec as for ``topk``
(specs/codecs/hybrid.md): ``values={"id": "uniform", "bits": 2, "group_size": 64}`` gives one
scale per chunk (group = k). Train with :class:`gcodec.ErrorFeedback` (SparseLoCo uses a decay of
0.95: ``ErrorFeedback(codec, decay=0.95)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import alloc, kernels
from ..arrays import dtype_name as _dtype_name
from ..errors import HeaderError, PayloadValueError
from ..layout import sparse as slayout
from ..sections import SectionSpec, TensorEntry, numel
from . import compose
from .base import Aggregation, EncodeContext, EncodePlan, Param
from .registry import register_codec
from .sparse import (
    ValuesHost,
    check_nested,
    check_nested_values_finite,
    decode_values,
    expected_values,
    kept_feedback_plan,
    key_bits,
    nested_overflow,
    nested_overflow_key,
    plan_values,
)

__all__ = ["ChunkTopK", "kept_count"]

_NONE = type(None)
MAX_CHUNK = 1 << 24  # spec §1: chunk lengths up to 2^24 (in-chunk indices below 2^24)


def kept_count(n: int, chunk: int, k: int) -> int:
    """How many elements a tensor of ``n`` elements keeps: ``min(k, length)`` per chunk (spec §1)."""
    full, rest = divmod(n, chunk)
    return full * min(k, chunk) + min(k, rest)


def index_width(chunk: int) -> int:
    """Bits of a packed in-chunk index: ``bitlength(chunk - 1)`` (spec §4)."""
    return (chunk - 1).bit_length()


def _max_gap_bytes(n: int, chunk: int, k: int) -> int:
    """The most index bytes a gap-coded payload can need: every chunk at its widest width (spec CK1)."""
    full, rest = divmod(n, chunk)
    kf = min(k, chunk)
    out = full * ((kf * index_width(chunk) + 7) // 8)
    if rest:
        out += (min(k, rest) * index_width(rest) + 7) // 8
    return out


@register_codec
class ChunkTopK(ValuesHost):
    """The top ``k`` magnitudes of every chunk of ``chunk`` elements of the flattened tensor.

    Parameters:
        chunk: elements per chunk, 1 to 2**24 (default 4096, SparseLoCo's). The last chunk may be
            shorter; it keeps ``min(k, its length)``.
        k: elements kept per chunk, 1 to ``chunk`` (default 64: 1/64 of the elements).
        index_coding: ``"gap"`` (default: sorted in-chunk gaps at the width of each chunk's largest
            gap, ~9.1 bits per index at 64 of 4096) or ``"packed"`` (``bitlength(chunk - 1)`` bits
            per index: 12 at 4096, the same for every payload).
        values: ``None`` keeps the values in the input dtype; a codec config such as
            ``{"id": "uniform", "bits": 2, "group_size": 64}`` (one scale per chunk) or
            ``{"id": "sign"}`` encodes them with that codec (specs/codecs/hybrid.md).

    NaN or infinite input raises :class:`~gcodec.PayloadValueError`, as for ``topk``, and so does a
    kept value that the nested value codec would decode to ±inf.
    """

    codec_id = "chunktopk"
    aggregation = Aggregation.GATHER
    NESTED_ROLES = ("values",)
    RULE = "CK"
    PARAMS = {
        "chunk": Param(int, 4096, "elements per chunk", min=1, max=MAX_CHUNK),
        "k": Param(int, 64, "elements kept per chunk", min=1, max=MAX_CHUNK),
        "index_coding": Param(str, "gap", "how in-chunk indices are stored", choices=("gap", "packed")),
        "values": Param((dict, str, _NONE), None, "codec config for the kept values, or None for raw"),
    }
    WIRE = {
        "chunk": Param(int, 4096, "elements per chunk", min=1, max=MAX_CHUNK),
        "k": Param(int, 64, "elements kept per chunk", min=1, max=MAX_CHUNK),
        "index_coding": Param(str, "gap", "index coding", choices=("gap", "packed")),
        "index_bytes": Param(int, 0, "bytes of the indices section", min=0),
        "values": Param((dict, _NONE), None, "nested value codec, or nil for raw values"),
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        nested = compose.nested_codec_from_config("values", self._params["values"], self.codec_id)
        self._nested = nested
        self._params["values"] = None if nested is None else nested.get_config()

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return cls.WIRE

    @classmethod
    def _check_config(cls, params: dict[str, Any], err: type[Exception], where: str) -> None:
        if err is not HeaderError and params["k"] > params["chunk"]:  # a header's k is rule CK1
            raise err(f"{where}k={params['k']} exceeds chunk={params['chunk']}")

    @property
    def encoding_unit(self) -> int | None:
        """A chunk keeps its own top k (``dct``: of its own coefficients); values through a nested
        codec stay within their chunk when that codec works element by element or in groups that
        divide k (a full chunk keeps exactly k), else they depend on other chunks' values."""
        if self.reads_shape:
            return None
        inner = None if self._nested is None else self._nested.encoding_unit
        if self._nested is not None and (inner is None or self._params["k"] % inner):
            return None
        return int(self._params["chunk"])

    # ---- what a subclass that selects from another array changes (``dct``'s coefficients) -------
    @classmethod
    def _layout_len(cls, shape: tuple[int, ...], params: dict[str, Any]) -> int:
        """Elements of the array the chunks cut, for a tensor of ``shape``: the tensor itself."""
        return numel(shape)

    @classmethod
    def _raw_values_dtype(cls, dtype: str) -> str:
        """The dtype of raw values for a tensor of ``dtype``: its own."""
        return dtype

    @classmethod
    def _value_entry(cls, entry: TensorEntry) -> TensorEntry:
        """The record as the value sections see it (its dtype decides raw and nested value types)."""
        return entry

    def _extra_wire(self) -> dict[str, Any]:
        """Header params besides the layout's (none here)."""
        return {}

    # ---- encoding --------------------------------------------------------------------------
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        return self._plan_flat(x.reshape(-1), ctx)[0]

    def plan_feedback(self, x: Any, residual: Any, new_residual: Any, ctx: EncodeContext) -> EncodePlan | None:
        """Error feedback without a decode of the whole tensor
        (:func:`gcodec.codecs.sparse.kept_feedback_plan`): only the kept elements' residuals differ
        from the corrected tensor."""
        return kept_feedback_plan(self, x, residual, new_residual, lambda c: self._plan_flat(c, ctx))

    def _plan_flat(self, flat: np.ndarray, ctx: EncodeContext) -> tuple[EncodePlan, Any]:
        """Select from the flat array ``flat`` (of the layout length) and plan every section; the
        plan and the kept indices into ``flat``."""
        dname = _dtype_name(flat.dtype)
        n = flat.shape[0]
        chunk, k = self._params["chunk"], self._params["k"]
        coding = self._params["index_coding"]
        total = kept_count(n, chunk, k)
        bits, mask, infkey = key_bits(flat, dname)
        K = kernels.of(bits)
        idx = K.memory.empty(total, np.int64)
        vbits = K.memory.empty(total, bits.dtype)
        if n:
            if K.chunked.select(bits, mask, infkey, chunk, k, idx, vbits):
                bad = K.sparse.count_nonfinite(bits, mask, infkey)
                raise PayloadValueError(
                    f"{self.codec_id}: input has NaN or infinite values ({bad} found); "
                    f"see specs/codecs/{self.codec_id}.md section 2"
                )
        nchunks = (n + chunk - 1) // chunk
        sections: list[SectionSpec] = []
        if coding == "gap":
            widths = K.memory.empty(nchunks, np.uint8)
            nbytes = int(K.chunked.gap_widths(idx, chunk, k, n, widths)) if nchunks else 0
            sections += [SectionSpec("index_widths", "u1", nchunks), SectionSpec("indices", "u1", nbytes)]
        else:
            width = index_width(chunk)
            nbytes = (total * width + 7) // 8
            sections.append(SectionSpec("indices", "u1", nbytes))
        if self._nested is not None:
            self._refuse_nested_overflow(bits, mask, infkey, vbits, dname, ctx)
        vwire, vsections, vfill = plan_values(self._nested, flat, idx, dname, ctx, vbits)
        sections += vsections
        params = {**self._extra_wire(), "chunk": chunk, "k": k, "index_coding": coding, "index_bytes": nbytes}
        params["values"] = vwire

        def fill(views: Mapping[str, np.ndarray]) -> None:
            if coding == "gap":
                K.memory.copy(views["index_widths"], widths)
                if nchunks:
                    K.chunked.gap_pack(idx, chunk, k, n, widths, views["indices"])
            elif total:
                K.chunked.packed_pack(idx, chunk, index_width(chunk), views["indices"])
            vfill(views)

        return EncodePlan(params, sections, fill), idx

    def _refuse_nested_overflow(
        self, bits: Any, mask: Any, infkey: Any, vbits: Any, dtype_name: str, ctx: EncodeContext
    ) -> None:
        """Refuse kept values the nested codec would decode to ±infinity: CK4 refuses them on
        decode (specs/codecs/hybrid.md §3.1)."""
        assert self._nested is not None
        kt = nested_overflow_key(self._nested, dtype_name)
        if kt is None or vbits.shape[0] == 0:
            return
        over, _ = kernels.of(vbits).sparse.count_ge(vbits, mask, infkey, bits.dtype.type(kt))
        if over:
            raise nested_overflow(
                self.codec_id, f"{self.RULE}4", self._nested, over, "kept value(s)", kt, dtype_name, ctx.key
            )

    # ---- header ----------------------------------------------------------------------------
    @classmethod
    def _check_wire_shape(cls, params: dict[str, Any], shape: tuple[int, ...]) -> int:
        """Rule CK1 against the shape; returns the kept count."""
        r = cls.RULE
        chunk, k = params["chunk"], params["k"]
        n = cls._layout_len(shape, params)
        if k > chunk:
            raise HeaderError(f"{r}1: k={k} exceeds chunk={chunk}")
        total = kept_count(n, chunk, k)
        nb = params["index_bytes"]
        if params["index_coding"] == "packed":
            want = (total * index_width(chunk) + 7) // 8
            if nb != want:
                raise HeaderError(
                    f"{r}1: index_bytes={nb} but {total} packed indices of {index_width(chunk)} bits take {want}"
                )
        elif nb > _max_gap_bytes(n, chunk, k):
            raise HeaderError(f"{r}1: index_bytes={nb} is more than the gaps of {total} kept elements can take")
        return total

    @classmethod
    def expected_sections(
        cls, params: dict[str, Any], shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[tuple[str, str, int]]:
        """Sections of a payload; raw values depend on the tensor dtype (default float32)."""
        total = cls._check_wire_shape(params, shape)
        n = cls._layout_len(shape, params)
        out: list[tuple[str, str, int]] = []
        if params["index_coding"] == "gap":
            out.append(("index_widths", "u1", (n + params["chunk"] - 1) // params["chunk"]))
        out.append(("indices", "u1", params["index_bytes"]))
        return out + expected_values(params, cls._raw_values_dtype(dtype), total)

    @classmethod
    def _entry_sections(cls, params: dict[str, Any], entry: TensorEntry) -> list[tuple[str, str, int]]:
        return cls.expected_sections(params, entry.shape, dtype=entry.dtype)

    @classmethod
    def check_entry(cls, entry: TensorEntry, where: str, *, strict: bool = True) -> dict[str, Any]:
        raw = entry.params.get("values")
        if raw is not None:  # the nested declaration first, so the section list can be computed
            compose.parse_nested(raw, f"{where}.params.values", strict=strict)
        params = super(ValuesHost, cls).check_entry(entry, where, strict=strict)
        if params["values"] is not None:
            check_nested(cls._value_entry(entry), {"values": cls._total(params, entry)}, where, strict)
        return params

    @classmethod
    def _total(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        return kept_count(cls._layout_len(entry.shape, params), params["chunk"], params["k"])

    # ---- decoding --------------------------------------------------------------------------
    @classmethod
    def _decode_indices(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        chunk, k = params["chunk"], params["k"]
        n = cls._layout_len(entry.shape, params)
        r = cls.RULE
        total = cls._total(params, entry)
        idx = alloc.empty(f"{cls.codec_id} indices", total, np.int64)
        packed = views["indices"]
        KP = kernels.of(packed).chunked
        if params["index_coding"] == "packed":
            if total == 0:
                return idx
            code, where = KP.packed_unpack(packed, chunk, k, index_width(chunk), n, total, idx)
            if code == slayout.ERR_RANGE:
                raise PayloadValueError(f"{r}3: index {where} is not below the length of its chunk")
            if code == slayout.ERR_ORDER:
                raise PayloadValueError(f"{r}3: index {where} is not above the one before it in its chunk")
            if code == slayout.ERR_PAD:
                raise PayloadValueError(f"{r}2: unused bits at the end of the indices are not zero")
            return idx
        widths = views["index_widths"]
        if widths.shape[0] == 0:
            return idx
        got = int(KP.gap_bytes(widths, chunk, k, n))
        if got < 0:
            c = -1 - got
            raise PayloadValueError(f"{r}2: chunk {c} has index width {int(widths[c])}, more than its length allows")
        if got != params["index_bytes"]:
            raise PayloadValueError(
                f"{r}2: index widths imply {got} index bytes; index_bytes is {params['index_bytes']}"
            )
        code, where = KP.gap_unpack(packed, widths, chunk, k, n, idx)
        if code == slayout.ERR_RANGE:
            raise PayloadValueError(f"{r}3: index {where} is not below the length of its chunk")
        if code == slayout.ERR_NOT_MINIMAL:
            raise PayloadValueError(
                f"{r}2: chunk {where} has width {int(widths[where])}, not the bit length of its largest gap"
            )
        if code == slayout.ERR_PAD:
            raise PayloadValueError(f"{r}2: unused bits at the end of chunk {where}'s indices are not zero")
        if code != slayout.OK:  # pragma: no cover - gap_bytes agreed with index_bytes
            raise PayloadValueError(f"{r}2: index bytes do not match the widths")
        return idx

    @classmethod
    def values_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """V(total) of specs/format.md §9.1, in the value entry's dtype (``dct``: binary32, so its raw
        values are read in place and nested ones decode to 4 bytes, whatever the tensor's dtype)."""
        total = cls._total(params, entry)
        if params["values"] is not None:
            return compose.nested_scratch_bytes(params["values"], cls._value_entry(entry), total)
        return 4 * total if cls._raw_values_dtype(entry.dtype) in ("float16", "bfloat16") else 0

    @classmethod
    def decode_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """The kept count's int64 indices and the values."""
        return 8 * cls._total(params, entry) + cls.values_scratch_bytes(params, entry)

    @classmethod
    def _values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        vals = decode_values(params, cls._value_entry(entry), views, cls._total(params, entry))
        if params["values"] is not None:
            check_nested_values_finite(vals, f"{cls.RULE}4")
        else:
            bad = kernels.of(vals).sparse.count_nonfinite_values(vals)
            if bad:
                raise PayloadValueError(f"{cls.RULE}4: {bad} value(s) are NaN or infinite")
        return vals

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        cls._decode_indices(params, entry, views)
        compose.check_role_values(params, "values", cls._value_entry(entry), views, cls._total(params, entry))
        cls._values(params, entry, views)

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
        if not accumulate:
            K.memory.zero(out, 0, out.shape[0])
        K.sparse.scatter(idx, vals, out, accumulate)
