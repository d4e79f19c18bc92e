"""``topk``: keep the k largest magnitudes exactly (specs/codecs/topk.md).

Top-K sends the k elements of largest ``|x|`` and their indices; everything else decodes as zero.
It is biased (small values never get through), so train with :class:`gcodec.ErrorFeedback`,
which adds what was dropped to the next step's gradient (Stich et al. 2018, "Sparsified SGD with
memory"; Lin et al. 2018, "Deep Gradient Compression").

Selection is exact: the k largest magnitudes, ties broken by the lowest index, non-finite input
rejected. It runs in one pass over the input after a sampled threshold estimate (see
:mod:`gcodec.kernels.cpu.sparse`). Indices are sorted and delta-coded in blocks of 64 gaps, each
block bit-packed at the width of its largest gap: about 9.5 bits per kept index at 1 % density,
against 32 for raw uint32 indices.

This module also holds what ``threshold`` shares with it (index coding, value sections).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..errors import ConfigError, HeaderError, PayloadValueError
from ..layout import sparse as slayout
from ..sections import SectionSpec, TensorEntry, numel
from . import compose
from .base import Aggregation, Codec, EncodeContext, EncodePlan, Param
from .kcount import check_ratio_k, k_for
from .registry import register_codec

__all__ = ["SparseIndexCodec", "TopK", "key_bits", "values_section_code"]

_NONE = type(None)

#: Element type of a raw value section for each tensor dtype (bfloat16 travels as its bits).
VALUE_CODES = {"float32": "f4", "float64": "f8", "float16": "f2", "bfloat16": "u2"}
_ITEMSIZE = {"f4": 4, "f8": 8, "f2": 2, "u2": 2}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_INF_KEY = {"float32": 0x7F800000, "float64": 0x7FF0000000000000, "float16": 0x7C00, "bfloat16": 0x7F80}


def values_section_code(dtype_name: str) -> str:
    return VALUE_CODES[dtype_name]


def key_bits(flat: np.ndarray, dtype_name: str) -> tuple[np.ndarray, Any, Any]:
    """(bits view, magnitude mask, infinity key) of a flat float array, for the selection kernels."""
    ut = _UINT[flat.dtype.itemsize]
    nb = 8 * flat.dtype.itemsize
    return flat.view(ut), ut((1 << (nb - 1)) - 1), ut(_INF_KEY[dtype_name])


_SCRATCH = threading.local()


def _scratch(cap: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread selection scratch (candidate indices, their bits, a radix histogram), kept and
    grown between calls: re-allocating a few MB per encode costs page faults comparable to the
    selecting pass itself."""
    st = _SCRATCH.__dict__
    cand = st.get("cand")
    if cand is None or cand.shape[0] < cap:
        cand = st["cand"] = np.empty(max(cap, 1), np.int64)
    key = f"bits{np.dtype(dtype).itemsize}"
    cbits = st.get(key)
    if cbits is None or cbits.shape[0] < cap:
        cbits = st[key] = np.empty(max(cap, 1), dtype)
    hist = st.get("hist")
    if hist is None:
        hist = st["hist"] = np.empty(1 << 16, np.int64)
    return cand, cbits.view(dtype), hist


# --------------------------------------------------------------------------------------------
# values: raw in the input dtype, or through a nested codec (role "values")


def plan_values(
    nested: Codec | None,
    flat: np.ndarray,
    idx: np.ndarray,
    dtype_name: str,
    ctx: EncodeContext,
    vbits: np.ndarray | None = None,
) -> tuple[Any, list[SectionSpec], Any]:
    """(header ``values`` entry, sections, fill) for the values at ``idx`` of ``flat``.

    ``vbits``, when given, already holds those values' bit patterns (unsigned view of the dtype).
    """
    k = idx.shape[0]
    if vbits is None:
        ut = _UINT[flat.dtype.itemsize]
        vbits = np.empty(k, ut)
        kernels.of(flat.view(ut)).sparse.gather(flat.view(ut), idx, vbits)
    if nested is None:
        code = VALUE_CODES[dtype_name]

        def fill(views: Mapping[str, np.ndarray]) -> None:
            views["values"].view(vbits.dtype)[:] = vbits

        return None, [SectionSpec("values", code, k * _ITEMSIZE[code])], fill
    wd = np.float64 if dtype_name == "float64" else np.float32
    vals = vbits.view(flat.dtype).astype(wd)
    return compose.plan_nested("values", nested, vals, ctx)


def expected_values(params: dict[str, Any], dtype_name: str, k: int) -> list[tuple[str, str, int]]:
    raw = params["values"]
    if raw is None:
        code = VALUE_CODES[dtype_name]
        return [("values", code, k * _ITEMSIZE[code])]
    return compose.nested_expected_sections("values", compose.parse_nested(raw, "values", strict=False), k)


def decode_values(params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray], k: int) -> np.ndarray:
    """The k values as float32 or float64 (a zero-copy view when stored raw as f4/f8)."""
    raw = params["values"]
    if raw is not None:
        spec = compose.parse_nested(raw, "values", strict=False)
        wd = np.float64 if entry.dtype == "float64" else np.float32
        return compose.decode_nested("values", spec, entry, views, k, wd)
    v = views["values"]
    if v.dtype == np.float16:
        out = np.empty(k, np.float32)
        kernels.of(v.view(np.uint16)).cast.decode_f16(v.view(np.uint16), out, False)
        return out
    if v.dtype == np.uint16:
        out = np.empty(k, np.float32)
        kernels.of(v).cast.decode_bf16(v, out, False)
        return out
    return v


def check_nested(entry: TensorEntry, roles_counts: dict[str, int], where: str, strict: bool) -> None:
    for role, count in roles_counts.items():
        raw = entry.params.get(role)
        if raw is not None:
            spec = compose.parse_nested(raw, f"{where}.params.{role}", strict=strict)
            compose.check_nested_entry(role, spec, entry, count, where, strict)


def check_nested_values_finite(vals: np.ndarray, rule: str) -> None:
    """Values decoded by a nested codec must be finite: a nested fp16/bf16 may carry NaN or ±inf,
    which the host codec refuses on encode and so must refuse on decode."""
    bad = kernels.of(vals).sparse.count_nonfinite_values(vals)
    if bad:
        raise PayloadValueError(f"{rule}: {bad} value(s) decoded by the nested codec are NaN or infinite")


class ValuesHost(Codec):
    """Base of the codecs that send ``k`` values of the tensor (``topk``, ``threshold``, ``randomk``):
    raw in the tensor's dtype, or through the nested codec declared in ``params["values"]``."""

    @classmethod
    def values_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """The k decoded values: none for raw float32/float64 (a view), float32 for raw 16-bit
        values, the nested codec's output (and its own temporaries) otherwise."""
        k = params["k"]
        if params["values"] is not None:
            return compose.nested_scratch_bytes(params["values"], entry, k)
        return 4 * k if entry.dtype in ("float16", "bfloat16") else 0

    @classmethod
    def _entry_sections(cls, params: dict[str, Any], entry: TensorEntry) -> list[tuple[str, str, int]]:
        return cls.expected_sections(params, entry.shape, dtype=entry.dtype)  # type: ignore[call-arg]

    @classmethod
    def check_entry(cls, entry: TensorEntry, where: str, *, strict: bool = True) -> dict[str, Any]:
        raw = entry.params.get("values")
        if raw is not None:  # the nested declaration first, so the section list can be computed
            compose.parse_nested(raw, f"{where}.params.values", strict=strict)
        params = super().check_entry(entry, where, strict=strict)
        if params["values"] is not None:
            check_nested(entry, {"values": params["k"]}, where, strict)
        return params


# --------------------------------------------------------------------------------------------
# the shared base of topk and threshold: increasing indices + values


class SparseIndexCodec(ValuesHost):
    """Base of the codecs that send explicit indices (``topk``, ``threshold``)."""

    aggregation = Aggregation.GATHER
    NESTED_ROLES = ("values",)
    RULE = "T"  # rule prefix in error messages

    def _init_values(self) -> None:
        nested = compose.nested_codec_from_config("values", self._params["values"], self.codec_id)
        self._nested = nested
        self._params["values"] = None if nested is None else nested.get_config()

    # ---- encoding helpers ----------------------------------------------------------------
    def _plan_selected(
        self,
        flat: np.ndarray,
        dtype_name: str,
        idx: np.ndarray,
        extra: dict[str, Any],
        ctx: EncodeContext,
        vbits: np.ndarray | None = None,
    ) -> EncodePlan:
        """Plan the index sections for ``idx`` and the value sections; ``vbits`` may hold the selected
        elements' bit patterns already (the selection kernels collect them on the way)."""
        k = idx.shape[0]
        n = flat.shape[0]
        coding = self._params["index_coding"]
        sections: list[SectionSpec] = []
        if coding == "delta":
            widths = np.empty((k + slayout.GAP_BLOCK - 1) // slayout.GAP_BLOCK, np.uint8)
            nbytes = int(kernels.of(idx).sparse.delta_widths(idx, widths))
            sections += [SectionSpec("index_widths", "u1", widths.shape[0]), SectionSpec("indices", "u1", nbytes)]
        else:
            if n > 1 << 32:
                raise ConfigError(f"{self.codec_id}: index_coding='raw' holds indices below 2**32; tensor has {n}")
            nbytes = 4 * k
            sections.append(SectionSpec("indices", "u4", nbytes))
        vwire, vsections, vfill = plan_values(self._nested, flat, idx, dtype_name, ctx, vbits)
        sections += vsections
        params = {**extra, "k": k, "index_coding": coding, "index_bytes": nbytes, "values": vwire}

        def fill(views: Mapping[str, np.ndarray]) -> None:
            if coding == "delta":
                views["index_widths"][:] = widths
                kernels.of(idx).sparse.delta_pack(idx, widths, views["indices"])
            else:
                views["indices"][:] = idx
            vfill(views)

        return EncodePlan(params, sections, fill)

    # ---- header ----------------------------------------------------------------------------
    @classmethod
    def _check_wire_shape(cls, params: dict[str, Any], shape: tuple[int, ...]) -> None:
        r = cls.RULE
        n = numel(shape)
        k = params["k"]
        if k > n:
            raise HeaderError(f"{r}1: k={k} exceeds the tensor's {n} elements")
        if params["index_coding"] == "raw":
            if params["index_bytes"] != 4 * k:
                raise HeaderError(f"{r}1: index_bytes={params['index_bytes']} but raw indices of k={k} take {4 * k}")
            if n > 1 << 32:
                raise HeaderError(f"{r}1: raw indices cannot address {n} elements (at most 2**32)")
        elif params["index_bytes"] > (k * slayout.MAX_WIDTH + 7) // 8 + k // slayout.GAP_BLOCK + 1:
            raise HeaderError(f"{r}1: index_bytes={params['index_bytes']} is more than k={k} gaps can take")

    @classmethod
    def expected_sections(
        cls, params: dict[str, Any], shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[tuple[str, str, int]]:
        """Sections of a payload; raw values depend on the tensor dtype (default float32)."""
        cls._check_wire_shape(params, shape)
        k = params["k"]
        if params["index_coding"] == "delta":
            nblocks = (k + slayout.GAP_BLOCK - 1) // slayout.GAP_BLOCK
            out = [("index_widths", "u1", nblocks), ("indices", "u1", params["index_bytes"])]
        else:
            out = [("indices", "u4", params["index_bytes"])]
        return out + expected_values(params, dtype, k)

    # ---- values -----------------------------------------------------------------------------
    @classmethod
    def _decode_indices(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        r = cls.RULE
        k = params["k"]
        n = entry.numel
        idx = np.empty(k, np.int64)
        if params["index_coding"] == "raw":
            code, where = kernels.of(views["indices"]).sparse.check_raw_indices(views["indices"], n)
            if code == slayout.ERR_ORDER:
                raise PayloadValueError(f"{r}3: raw index {where} is not greater than the one before it")
            if code == slayout.ERR_RANGE:
                raise PayloadValueError(f"{r}3: index {where} is {int(views['indices'][where])}, not below numel {n}")
            idx[:] = views["indices"]
            return idx
        widths = views["index_widths"]
        maxw = min(slayout.MAX_WIDTH, max(n - 1, 0).bit_length())
        total = kernels.of(widths).sparse.delta_bytes(widths, k, maxw)
        if total < 0:
            b = -1 - total
            raise PayloadValueError(f"{r}2: index block {b} has width {int(widths[b])}; at most {maxw} for numel {n}")
        if total != params["index_bytes"]:
            raise PayloadValueError(
                f"{r}2: index widths imply {total} index bytes; index_bytes is {params['index_bytes']}"
            )
        code, where = kernels.of(views["indices"]).sparse.delta_unpack(views["indices"], widths, k, n, idx)
        if code == slayout.ERR_RANGE:
            raise PayloadValueError(f"{r}3: index {where} is not below numel {n}")
        if code == slayout.ERR_NOT_MINIMAL:
            raise PayloadValueError(
                f"{r}2: index block {where} has width {int(widths[where])}, not the bit length of its largest gap"
            )
        if code == slayout.ERR_PAD:
            raise PayloadValueError(f"{r}2: unused bits at the end of index block {where} are not zero")
        if code != slayout.OK:
            raise PayloadValueError(f"{r}2: index bytes do not match the widths")
        return idx

    @classmethod
    def _check_decoded_values(cls, params: dict[str, Any], vals: np.ndarray) -> None:
        """Codec-specific value rules for raw values (overridden)."""

    @classmethod
    def decode_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """k int64 indices and the values."""
        return 8 * params["k"] + cls.values_scratch_bytes(params, entry)

    @classmethod
    def _values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        vals = decode_values(params, entry, views, params["k"])
        if params["values"] is None:
            cls._check_decoded_values(params, vals)
        else:
            check_nested_values_finite(vals, f"{cls.RULE}4")
        return vals

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        cls._decode_indices(params, entry, views)
        compose.check_role_values(params, "values", entry, views, params["k"])
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
        # Every check runs before ``out`` is touched; the only temporaries are k-sized.
        idx = cls._decode_indices(params, entry, views)
        vals = cls._values(params, entry, views)
        if not accumulate:
            out[:] = 0
        kernels.of(idx).sparse.scatter(idx, vals, out, accumulate)


@register_codec
class TopK(SparseIndexCodec):
    """Exact Top-K by magnitude.

    Parameters:
        ratio: fraction of elements to keep, ``k = max(1, floor(ratio * numel))`` (at most numel).
            0.01 (1 %) is the usual setting with error feedback; 0.001 still trains many models.
        k: keep exactly this many (capped at numel) instead of a ratio. Give ``ratio`` or ``k``.
        index_coding: ``"delta"`` (default: sorted gaps bit-packed per block of 64, ~9.5 bits per
            index at 1 %) or ``"raw"`` (uint32 indices, 32 bits each, trivially parallel to decode).
        values: ``None`` keeps the values in the input dtype; a codec config such as
            ``{"id": "uniform", "bits": 8}`` or ``{"id": "fp16"}`` encodes them with that codec
            (a hybrid, specs/codecs/hybrid.md).

    NaN or infinite input raises :class:`~gcodec.PayloadValueError` (a non-finite gradient means
    training has diverged; ranking it, or dropping it as zero, would hide that).
    """

    codec_id = "topk"
    PARAMS = {
        "ratio": Param((float, _NONE), 0.01, "fraction of elements kept"),
        "k": Param((int, _NONE), None, "number of elements kept (instead of ratio)"),
        "index_coding": Param(str, "delta", "how indices are stored", choices=("delta", "raw")),
        "values": Param((dict, str, _NONE), None, "codec config for the kept values, or None for raw"),
    }
    WIRE = {
        "k": Param(int, 0, "number of kept elements", min=0),
        "index_coding": Param(str, "delta", "index coding", choices=("delta", "raw")),
        "index_bytes": Param(int, 0, "bytes of the indices section", min=0),
        "values": Param((dict, _NONE), None, "nested value codec, or nil for raw values"),
    }

    def __init__(self, **params: Any) -> None:
        if params.get("k") is not None and "ratio" not in params:
            params["ratio"] = None
        super().__init__(**params)
        self._init_values()

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return cls.WIRE

    @classmethod
    def _check_config(cls, params: dict[str, Any], err: type[Exception], where: str) -> None:
        check_ratio_k(params, err, where)

    def k_for(self, n: int) -> int:
        """The number of elements kept from a tensor of ``n`` elements."""
        return k_for(self._params, n)

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        from ..arrays import dtype_name as _dn

        flat = x.reshape(-1)
        dname = _dn(flat.dtype)
        n = flat.shape[0]
        k = self.k_for(n)
        bits, mask, infkey = key_bits(flat, dname)
        idx = np.empty(k, np.int64)
        vbits = np.empty(k, bits.dtype)
        cand, cbits, hist = _scratch(int(kernels.of(bits).sparse.candidate_capacity(n, k)), bits.dtype)
        bad = kernels.of(bits).sparse.topk_select(bits, mask, infkey, k, idx, vbits, cand, cbits, hist)
        if bad:
            raise PayloadValueError(
                f"topk: input has NaN or infinite values ({bad} found); see specs/codecs/topk.md section 2"
            )
        return self._plan_selected(flat, dname, idx, {}, ctx, vbits)

    @classmethod
    def _check_decoded_values(cls, params: dict[str, Any], vals: np.ndarray) -> None:
        bad = kernels.of(vals).sparse.count_nonfinite_values(vals)
        if bad:
            raise PayloadValueError(f"T4: {bad} value(s) are NaN or infinite")
