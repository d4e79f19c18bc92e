"""What the sparse codecs share: how many elements they keep, their value sections, and index coding.

* :func:`k_for` / :func:`check_ratio_k`: ``ratio=`` or ``k=`` (``topk``, ``randomk``);
* value sections (:class:`ValuesHost`): the kept values raw in the tensor's dtype, or through a
  nested codec in role ``"values"`` (``topk``, ``threshold``, ``randomk``; specs/codecs/hybrid.md);
* :class:`SparseIndexCodec`: strictly increasing indices, delta-coded in blocks of
  ``layout.sparse.GAP_BLOCK`` gaps bit-packed at the width of each block's largest gap, or raw
  uint32 (``topk``, ``threshold``; specs/codecs/topk.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import alloc, kernels
from ..arrays import DTYPES, backend_of, dtype_name
from ..errors import ConfigError, HeaderError, PayloadValueError
from ..layout import sparse as slayout
from ..sections import SectionSpec, TensorEntry, numel
from . import compose
from .base import Aggregation, Codec, EncodeContext, EncodePlan

__all__ = [
    "SparseIndexCodec",
    "ValuesHost",
    "check_nested",
    "check_nested_values_finite",
    "check_ratio_k",
    "decode_values",
    "expected_values",
    "k_for",
    "key_bits",
    "nested_overflow",
    "nested_overflow_key",
    "plan_values",
    "smallest_key",
    "values_section_code",
]

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


def _key_value(key: int, dtype_name: str) -> float:
    dt = DTYPES[dtype_name]
    return float(np.array(key, _UINT[dt.itemsize]).view(dt).astype(np.float64))


def smallest_key(dtype_name: str, reaches: Callable[[float], bool]) -> int:
    """The smallest magnitude key of ``dtype_name`` whose value (in binary64) ``reaches``, for a test
    that is false and then true as magnitudes grow and true at infinity. Bisection over the keys
    [0, infinity key]: keys order like the magnitudes they encode."""
    lo, hi = 0, _INF_KEY[dtype_name]
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(_key_value(mid, dtype_name)):
            hi = mid
        else:
            lo = mid + 1
    return lo


@functools.lru_cache(maxsize=256)
def nested_overflow_key(nested: Codec, dtype_name: str) -> int | None:
    """The smallest finite magnitude key of ``dtype_name`` that ``nested`` may decode to ±infinity
    (its :meth:`~Codec.magnitude_bound` is infinite from there on); None when it decodes every
    finite value of that dtype finite. For ``fp16``: the key of 65520 for float32 input."""
    key = smallest_key(dtype_name, lambda v: math.isinf(nested.magnitude_bound(v, 1)))
    return None if key >= _INF_KEY[dtype_name] else key


def nested_overflow(
    host: str, rule: str, nested: Codec, count: int, what: str, key: int, dtype_name: str, tensor: str | None
) -> PayloadValueError:
    """The error of a host that refuses ``count`` values (``what``) that ``nested`` would decode to
    ±infinity: its rule ``rule`` refuses them on decode, so the encoder must not write them."""
    of = "" if tensor is None else f" of tensor {tensor!r}"
    return PayloadValueError(
        f"{host}: {count} {what}{of} lie beyond the range of the nested {nested.codec_id!r} codec: "
        f"|v| >= {_key_value(key, dtype_name):.6g} would decode to infinity, which rule {rule} refuses; "
        "use a value codec with a wider range, or scale the tensor down"
    )


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
    K = kernels.of(flat)
    if vbits is None:
        ut = _UINT[flat.dtype.itemsize]
        vbits = K.memory.empty(k, ut)
        K.sparse.gather(flat.view(ut), idx, vbits)
    if nested is None:
        code = VALUE_CODES[dtype_name]

        def fill(views: Mapping[str, np.ndarray]) -> None:
            K.memory.copy(views["values"].view(vbits.dtype), vbits)

        return None, [SectionSpec("values", code, k * _ITEMSIZE[code])], fill
    wd = np.float64 if dtype_name == "float64" else np.float32
    vals = vbits.view(flat.dtype)
    if vals.dtype != wd:  # 16-bit tensors (host only): the nested codec sees binary32
        vals = vals.astype(wd)
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
        out = alloc.empty("the decoded values of a sparse payload", k, np.float32)
        kernels.of(v.view(np.uint16)).cast.decode_f16(v.view(np.uint16), out, False)
        return out
    if v.dtype == np.uint16:
        out = alloc.empty("the decoded values of a sparse payload", k, np.float32)
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


def kept_feedback_plan(
    host: Codec, x: Any, residual: Any, new_residual: Any, plan_of: Callable[[np.ndarray], tuple[EncodePlan, Any]]
) -> EncodePlan | None:
    """The fused error-feedback plan of a codec that sends some elements' values and nothing else
    (:class:`gcodec.ErrorFeedback`'s fast path; ``topk``, ``threshold``, ``randomk``, ``chunktopk``):
    an element that is not kept decodes to +0, so the new residual is ``c = x + residual`` except at
    the kept elements, where it is ``c - v`` for the value ``v`` the receiver decodes there. Bit for
    bit what the generic path's ``c - decode(c)`` gives: ``c - 0`` is ``c`` (-0 included), and a
    kept element's difference is the same binary32 subtraction. Raw values decode to themselves,
    so that difference is +0 and the kept elements are zeroed; values through a nested codec are
    decoded from the payload just written (the receiver's own decode of the values section, ``k``
    elements). ``c`` is written into ``new_residual``; ``plan_of(c)`` plans the codec's encode of
    it and names the kept indices. The generic path's passes over the whole tensor after the encode
    (a copy of ``c``, zeroing a scratch array, scattering the decoded values into it, subtracting)
    become work on the ``k`` kept elements only. Host float32 work (None otherwise: the generic
    path)."""
    if backend_of(x) != "cpu":
        return None
    flat = x.reshape(-1)
    out_e = new_residual.reshape(-1)
    if flat.dtype != np.float32 or out_e.dtype != np.float32:
        return None
    e = None if residual is None else residual.reshape(-1)
    if e is not None and e.dtype != np.float32:
        return None
    K = kernels.of(flat)
    with K.threads_for(flat.shape[0]):  # as the API runs a plan: small tensors on this thread
        if e is None:
            np.copyto(out_e, flat)
        else:  # the generic path's float32 addition, element for element (format.md §10's NaN rule)
            K.feedback.add(out_e, flat, e)
        plan, idx = plan_of(out_e)
    inner = plan.fill
    nested = getattr(host, "_nested", None)

    def fill(views: Mapping[str, np.ndarray]) -> None:
        inner(views)
        if nested is None:
            out_e[idx] = 0.0
            return
        entry = TensorEntry(host.codec_id, host.version, "float32", (out_e.shape[0],), plan.params, ())
        kept = out_e[idx] - decode_values(plan.params, entry, views, idx.shape[0])
        bad = kernels.of(kept).sparse.count_nonfinite_values(kept)
        if bad:  # as the generic path refuses a residual it cannot keep
            raise PayloadValueError(
                f"{host.codec_id}: {bad} residual value(s) would be NaN or infinite (a kept value near the "
                "float32 limit); the residual was left unchanged"
            )
        out_e[idx] = kept

    return EncodePlan(plan.params, plan.sections, fill)


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

    # ---- encoding ----------------------------------------------------------------------------
    def _select(self, flat: np.ndarray, dtype_name: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """The kept indices (increasing), their elements' bit patterns and the header params the
        selection adds; PayloadValueError on non-finite input. Each codec's own."""
        raise NotImplementedError

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        dname = dtype_name(flat.dtype)
        idx, vbits, extra = self._select(flat, dname)
        return self._plan_selected(flat, dname, idx, extra, ctx, vbits)

    def plan_feedback(self, x: Any, residual: Any, new_residual: Any, ctx: EncodeContext) -> EncodePlan | None:
        """Error feedback without a decode of the whole tensor (:func:`kept_feedback_plan`)."""

        def plan_of(c: np.ndarray) -> tuple[EncodePlan, np.ndarray]:
            idx, vbits, extra = self._select(c, "float32")
            return self._plan_selected(c, "float32", idx, extra, ctx, vbits), idx

        return kept_feedback_plan(self, x, residual, new_residual, plan_of)

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
        K = kernels.of(flat)
        coding = self._params["index_coding"]
        sections: list[SectionSpec] = []
        if coding == "delta":
            widths = K.memory.empty((k + slayout.GAP_BLOCK - 1) // slayout.GAP_BLOCK, np.uint8)
            nbytes = int(K.sparse.delta_widths(idx, widths))
            sections += [SectionSpec("index_widths", "u1", widths.shape[0]), SectionSpec("indices", "u1", nbytes)]
        else:
            if n > 1 << 32:
                raise ConfigError(f"{self.codec_id}: index_coding='raw' holds indices below 2**32; tensor has {n}")
            nbytes = 4 * k
            sections.append(SectionSpec("indices", "u4", nbytes))
        if self._nested is not None:
            self._refuse_nested_overflow(flat, idx, dtype_name, ctx, vbits)
        vwire, vsections, vfill = plan_values(self._nested, flat, idx, dtype_name, ctx, vbits)
        sections += vsections
        params = {**extra, "k": k, "index_coding": coding, "index_bytes": nbytes, "values": vwire}

        def fill(views: Mapping[str, np.ndarray]) -> None:
            if coding == "delta":
                K.memory.copy(views["index_widths"], widths)
                K.sparse.delta_pack(idx, widths, views["indices"])
            else:
                K.memory.copy(views["indices"], idx)
            vfill(views)

        return EncodePlan(params, sections, fill)

    def _refuse_nested_overflow(
        self, flat: np.ndarray, idx: np.ndarray, dtype_name: str, ctx: EncodeContext, vbits: np.ndarray | None
    ) -> None:
        """Refuse kept values that the nested codec would decode to ±infinity (fp16 beyond its
        range): rule T4 / TH4 refuses them on decode (specs/codecs/hybrid.md §3.1)."""
        assert self._nested is not None
        kt = nested_overflow_key(self._nested, dtype_name)
        if kt is None or idx.shape[0] == 0:
            return
        K = kernels.of(flat)
        bits, mask, infkey = key_bits(flat, dtype_name)
        if vbits is None:
            vbits = K.memory.empty(idx.shape[0], bits.dtype)
            K.sparse.gather(bits, idx, vbits)
        over, _ = K.sparse.count_ge(vbits, mask, infkey, bits.dtype.type(kt))
        if over:
            raise nested_overflow(
                self.codec_id, f"{self.RULE}4", self._nested, over, "kept value(s)", kt, dtype_name, ctx.key
            )

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
        idx = alloc.empty(f"{cls.codec_id} indices", k, np.int64)
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
        K = kernels.of(out)  # a device ``out`` gets the host-checked indices and values copied once
        if not accumulate:
            K.memory.zero(out, 0, out.shape[0])
        K.sparse.scatter(idx, vals, out, accumulate)


# --------------------------------------------------------------------------------------------
# how many elements a sparsifier keeps


def check_ratio_k(params: dict[str, Any], err: type[Exception], where: str) -> None:
    """Exactly one of ``ratio`` (in (0, 1]) and ``k`` (>= 0) is given."""
    if "ratio" not in params:
        return
    ratio, k = params["ratio"], params["k"]
    if (ratio is None) == (k is None):
        raise err(f"{where}give exactly one of ratio= and k=")
    if ratio is not None and not (0.0 < ratio <= 1.0):
        raise err(f"{where}ratio={ratio!r} must lie in (0, 1]")
    if k is not None and k < 0:
        raise err(f"{where}k={k!r} must be >= 0")


def k_for(params: dict[str, Any], n: int) -> int:
    """The number of elements kept from a tensor of ``n`` elements: ``min(n, k)``, or
    ``min(n, max(1, floor(n * ratio)))`` (0 for an empty tensor)."""
    if params["k"] is not None:
        return min(n, params["k"])
    if n == 0:
        return 0
    return min(n, max(1, int(n * params["ratio"])))
