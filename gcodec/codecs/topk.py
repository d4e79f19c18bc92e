"""``topk``: keep the k largest magnitudes exactly (specs/codecs/topk.md).

Top-K sends the k elements of largest ``|x|`` and their indices; everything else decodes as zero.
It is biased (small values never get through), so train with :class:`gcodec.ErrorFeedback`,
which adds what was dropped to the next step's gradient (Stich et al. 2018, "Sparsified SGD with
memory"; Lin et al. 2018, "Deep Gradient Compression").

Selection is exact: the k largest magnitudes, ties broken by the lowest index, non-finite input
rejected. It runs in one pass over the input after a sampled threshold estimate (see
:mod:`gcodec.kernels.cpu.sparse`). Indices are sorted and delta-coded in blocks of 64 gaps, each
block bit-packed at the width of its largest gap (:mod:`gcodec.codecs.sparse`): about 9.5 bits per
kept index at 1 % density, against 32 for raw uint32 indices.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..arrays import backend_of
from ..errors import PayloadValueError
from .base import EncodeContext, EncodePlan, Param
from .registry import register_codec
from .sparse import SparseIndexCodec, check_ratio_k, k_for, key_bits

__all__ = ["TopK"]

_NONE = type(None)

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
    training has diverged; ranking it, or dropping it as zero, would hide that), and so does a kept
    value that the nested value codec would decode to ±inf (``fp16`` values: ``|x| >= 65520``).
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
        idx, vbits = self._select(flat, dname)
        return self._plan_selected(flat, dname, idx, {}, ctx, vbits)

    def _select(self, flat: np.ndarray, dname: str) -> tuple[np.ndarray, np.ndarray]:
        """The kept indices (increasing) and their elements' bit patterns; PayloadValueError on
        non-finite input (section 2 of the spec)."""
        n = flat.shape[0]
        k = self.k_for(n)
        bits, mask, infkey = key_bits(flat, dname)
        K = kernels.of(bits)
        idx = K.memory.empty(k, np.int64)
        vbits = K.memory.empty(k, bits.dtype)
        cand, cbits, hist = _scratch(int(K.sparse.candidate_capacity(n, k)), bits.dtype)
        bad = K.sparse.topk_select(bits, mask, infkey, k, idx, vbits, cand, cbits, hist)
        if bad:
            raise PayloadValueError(
                f"topk: input has NaN or infinite values ({bad} found); see specs/codecs/topk.md section 2"
            )
        return idx, vbits

    def plan_feedback(self, x: Any, residual: Any, new_residual: Any, ctx: EncodeContext) -> EncodePlan | None:
        """Error feedback without decoding (:class:`gcodec.ErrorFeedback`'s fused path): with raw
        float32 values a kept element decodes to itself, so the new residual is ``c = x + residual``
        with the kept elements set to +0 (what ``c - decode(c)`` gives: ``c - c`` is +0 for a finite
        ``c``, ``c - 0`` is ``c``, -0 included). ``c`` is written into ``new_residual`` and the
        selection reads it there; the kept elements are zeroed after the payload's values are
        written. The generic path's three passes over the tensor after the encode (zeroing a
        scratch array, scattering the decoded values into it, subtracting) become one write of k
        zeros. Host float32 work with raw values only (None otherwise: the generic path)."""
        if self._nested is not None or backend_of(x) != "cpu":
            return None
        flat = x.reshape(-1)
        out_e = new_residual.reshape(-1)
        if flat.dtype != np.float32 or out_e.dtype != np.float32:
            return None
        if residual is None:
            np.copyto(out_e, flat)
        else:
            e = residual.reshape(-1)
            if e.dtype != np.float32:
                return None
            np.add(flat, e, out=out_e)  # the generic path's float32 addition, element for element
        with kernels.of(flat).threads_for(flat.shape[0]):  # as the API runs a plan: small tensors on this thread
            idx, vbits = self._select(out_e, "float32")
            plan = self._plan_selected(out_e, "float32", idx, {}, ctx, vbits)
        inner = plan.fill

        def fill(views: Mapping[str, np.ndarray]) -> None:
            inner(views)
            out_e[idx] = 0.0

        return EncodePlan(plan.params, plan.sections, fill)

    @classmethod
    def _check_decoded_values(cls, params: dict[str, Any], vals: np.ndarray) -> None:
        bad = kernels.of(vals).sparse.count_nonfinite_values(vals)
        if bad:
            raise PayloadValueError(f"T4: {bad} value(s) are NaN or infinite")
