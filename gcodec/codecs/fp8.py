"""``fp8``: FP8 elements (E4M3 or E5M2) with a scale per group (specs/codecs/fp8.md).

Each group of ``group_size`` consecutive elements gets a scale that maps its largest magnitude onto
the element format's largest finite value: a binary32 ``amax / 448`` (E4M3) or ``amax / 57344``
(E5M2), as the per-tensor and per-row FP8 recipes of torchao and Transformer Engine do, or a power
of two (an E8M0 code) chosen as the OCP Microscaling specification chooses its shared exponent.
Elements are rounded to nearest-even (or stochastically) and saturate at the largest finite value,
so no element is ever NaN or infinite. E4M3 with groups of 128 costs 8.25 bits per element.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..layout.minifloat import SCALE_E8M0, SCALE_F32, BlockLayout
from .base import Aggregation, Param
from .minifloat import ROUNDING_PARAM, SEED_PARAM, BlockFloat
from .registry import register_codec

__all__ = ["FP8"]


@register_codec
class FP8(BlockFloat):
    """FP8 elements under a scale per group.

    Parameters:
        element: ``"e4m3"`` (the OCP ``E4M3FN`` variant: no infinities, largest 448, 3 mantissa bits;
            the usual choice for gradients once scaled) or ``"e5m2"`` (largest 57344, 2 mantissa bits:
            more range, less precision).
        group_size: elements sharing one scale (default 128, as DeepSeek-V3's 1x128 activation tiles);
            smaller groups follow outliers more closely at 32 bits (float32) or 8 bits (e8m0) per scale.
        scale_dtype: ``"float32"`` (default: the group's largest magnitude maps exactly onto the
            element's largest value) or ``"e8m0"`` (one byte, a power of two ``2^(floor(log2 amax) -
            emax)`` as OCP MX: the largest values may then saturate; with group 32 this is MXFP8).
        rounding: ``"nearest"`` (ties to even, reproducible) or ``"stochastic"`` (unbiased below
            saturation, one 16-bit Philox draw per element from ``seed`` and the call's stream).
        seed: Philox key for stochastic rounding (recorded in the header).
    """

    codec_id = "fp8"
    aggregation = Aggregation.GATHER
    rule_prefix = "E"
    elements_rule = "E2"
    padding_rule = "E2"  # 8-bit elements fill their bytes: no padding rule applies
    PARAMS = {
        "element": Param(str, "e4m3", "FP8 element type", choices=("e4m3", "e5m2")),
        "group_size": Param(int, 128, "elements per scale", min=1, max=1 << 24),
        "scale_dtype": Param(str, "float32", "element type of the scales", choices=("float32", "e8m0")),
        "rounding": ROUNDING_PARAM,
        "seed": SEED_PARAM,
    }

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> BlockLayout:
        return BlockLayout(
            element=params["element"],
            group_size=params["group_size"],
            scale=SCALE_F32 if params["scale_dtype"] == "float32" else SCALE_E8M0,
            stochastic=params["rounding"] == "stochastic",
        )
