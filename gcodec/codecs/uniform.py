"""``uniform``: group-wise symmetric integer quantization (specs/codecs/uniform.md).

Each group of ``group_size`` consecutive elements gets its own scale ``absmax / qmax`` with
``qmax = 2**(bits-1) - 1``, so one outlier only coarsens its own group. Codes are ``v / scale``
rounded into ``[-qmax, qmax]``, stored as ``bits``-bit two's complement, packed little-end first.
8 bits with groups of 64 costs 8.5 bits per element and keeps the error of each element within
half its group's scale (nearest rounding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..layout import quant as qlayout
from .base import Aggregation, Param
from .quantizer import QuantLayout, ScaledQuantizer
from .registry import register_codec
from .seeds import PER_WORKER_SEED

__all__ = ["Uniform"]


@register_codec
class Uniform(ScaledQuantizer):
    """Group-wise symmetric integer quantization.

    Parameters:
        bits: 8, 4 or 2 bits per code. 8 keeps ~2 decimal digits per group; 4 and 2 need error
            feedback to train well.
        group_size: elements sharing one scale (default 64: 0.5 extra bits per element with
            float32 scales). Smaller groups follow outliers more closely at the cost of more scales.
        rounding: ``"nearest"`` (deterministic, ties to even: error <= scale/2, reproducible
            without a seed) or ``"stochastic"`` (unbiased: E[decode] = x, error < scale; draws one
            16-bit Philox number per element from ``seed`` and the call's stream).
        scale_dtype: ``"float32"`` (default) or ``"float16"`` (halves the scale overhead; the scale
            is rounded *up* to a float16, so the error bound holds for the stored scale; groups whose
            absmax / qmax exceeds 65504 cannot be encoded).
        seed: Philox key for stochastic rounding (recorded in the header; unused by ``"nearest"``).

    A stochastic payload's header also records ``stream``: the encode call's ``step``, or the
    codec's per-key call counter when no step is given.
    """

    codec_id = "uniform"
    aggregation = Aggregation.GATHER
    rule_prefix = "U"
    PARAMS = {
        "bits": Param(int, 8, "bits per code", choices=(8, 4, 2)),
        "group_size": Param(int, 64, "elements per scale", min=1, max=1 << 24),
        "rounding": Param(str, "nearest", "rounding rule", choices=("nearest", "stochastic")),
        "scale_dtype": Param(str, "float32", "element type of the scales", choices=("float32", "float16")),
        "seed": PER_WORKER_SEED,
    }

    @classmethod
    def _is_stochastic(cls, params: Mapping[str, Any]) -> bool:
        return params.get("rounding") == "stochastic"

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> QuantLayout:
        bits = params["bits"]
        return QuantLayout(
            group_size=params["group_size"],
            width=bits,
            qmax=(1 << (bits - 1)) - 1,
            rule=qlayout.RULE_ABSMAX,
            stochastic=params["rounding"] == "stochastic",
            scale_f16=params["scale_dtype"] == "float16",
        )
