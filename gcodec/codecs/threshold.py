"""``threshold``: keep every element with ``|x| >= t`` (specs/codecs/threshold.md).

The DGC-style sparsifier (Lin et al. 2018, "Deep Gradient Compression"; Strom 2015): no sort, no
selection, one counting pass and one collecting pass. The number of kept elements follows the
data, so payload sizes differ between steps and between workers; transports must gather
variable-size payloads (``allgatherv``), and the count is in the header (``k``). Indices and values
are coded exactly as in ``topk`` (delta-coded blocks, or raw uint32; values raw or through a nested
codec). Train with :class:`gcodec.ErrorFeedback`: what stays below the threshold accumulates in
the residual until it crosses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import kernels
from ..errors import PayloadValueError
from .base import Param
from .registry import register_codec
from .sparse import SparseIndexCodec, key_bits, smallest_key

__all__ = ["Threshold", "threshold_key"]

_NONE = type(None)


def threshold_key(t: float, dtype_name: str) -> int:
    """The smallest magnitude key whose value is >= t (float64 compare); the infinity key if none.

    Magnitude keys order like the values they encode, so ``|x| >= t`` iff ``key(x) >= threshold_key``
    for every non-NaN x.
    """
    return smallest_key(dtype_name, lambda v: v >= t)


@register_codec
class Threshold(SparseIndexCodec):
    """Keep all elements whose magnitude reaches ``threshold``.

    Parameters:
        threshold: keep ``|x| >= threshold`` (compared in float64). Pick it from the gradient
            scale: DGC samples ~0.1-1 % of a layer to find the value that keeps the target
            fraction. 0 keeps everything.
        index_coding: ``"delta"`` (default) or ``"raw"``, as in ``topk``.
        values: ``None`` (raw, input dtype) or a nested codec config, as in ``topk``.

    NaN or infinite input raises :class:`~gcodec.PayloadValueError`, and so does a kept value that
    the nested value codec would decode to ±inf (``fp16`` values: ``|x| >= 65520``).
    """

    codec_id = "threshold"
    RULE = "TH"
    PARAMS = {
        "threshold": Param(float, 1e-3, "keep |x| >= threshold", min=0.0),
        "index_coding": Param(str, "delta", "how indices are stored", choices=("delta", "raw")),
        "values": Param((dict, str, _NONE), None, "codec config for the kept values, or None for raw"),
    }
    WIRE = {
        "threshold": Param(float, 0.0, "the threshold used", min=0.0),
        "k": Param(int, 0, "number of kept elements", min=0),
        "index_coding": Param(str, "delta", "index coding", choices=("delta", "raw")),
        "index_bytes": Param(int, 0, "bytes of the indices section", min=0),
        "values": Param((dict, _NONE), None, "nested value codec, or nil for raw values"),
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._init_values()

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return cls.WIRE

    @property
    def encoding_unit(self) -> int | None:
        """Whether an element is kept depends on its own magnitude alone; its value too, raw or
        through a nested codec that works element by element (a nested codec with groups scales
        the kept values of the whole tensor together)."""
        return 1 if self._nested is None or self._nested.encoding_unit == 1 else None

    def _select(self, flat: np.ndarray, dname: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """The indices (increasing) and bit patterns of the elements at or above the threshold in
        magnitude; PayloadValueError on non-finite input."""
        t = self._params["threshold"]
        bits, mask, infkey = key_bits(flat, dname)
        kt = bits.dtype.type(threshold_key(t, dname))
        count, nan = kernels.of(bits).sparse.count_ge(bits, mask, infkey, kt)
        if nan:
            raise PayloadValueError(
                f"threshold: input has NaN or infinite values ({nan} found); see specs/codecs/threshold.md"
            )
        slack = 64  # the collecting pass writes whole blocks
        K = kernels.of(bits)
        idx = K.memory.empty(count + slack, np.int64)
        vbits = K.memory.empty(count + slack, bits.dtype)
        c = K.sparse.collect_ge(bits, mask, kt, idx, vbits)
        assert c == count
        return idx[:count], vbits[:count], {"threshold": t}

    @classmethod
    def _check_decoded_values(cls, params: dict[str, Any], vals: np.ndarray) -> None:
        j = kernels.of(vals).sparse.first_below(vals, params["threshold"])
        if j >= 0:
            raise PayloadValueError(
                f"TH4: value {j} ({vals[j]!r}) is not finite or lies below the threshold {params['threshold']!r}"
            )
