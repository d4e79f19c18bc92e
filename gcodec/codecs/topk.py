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
from typing import Any

import numpy as np

from .. import kernels
from ..errors import PayloadValueError
from .base import Param
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

    def _select(self, flat: np.ndarray, dname: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """The k largest magnitudes' indices (increasing) and bit patterns; PayloadValueError on
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
        return idx, vbits, {}

    @classmethod
    def _check_decoded_values(cls, params: dict[str, Any], vals: np.ndarray) -> None:
        bad = kernels.of(vals).sparse.count_nonfinite_values(vals)
        if bad:
            raise PayloadValueError(f"T4: {bad} value(s) are NaN or infinite")
