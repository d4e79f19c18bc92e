"""``nvfp4``: NVIDIA's FP4: E2M1 elements, an E4M3 scale per 16, one binary32 tensor scale (specs/codecs/nvfp4.md).

The two-level scheme of NVIDIA's Blackwell NVFP4 format: the tensor scale ``amax / (448 * 6)`` maps
the tensor's largest magnitude onto the product of the largest E4M3 and E2M1 values; each block of
16 elements gets the E4M3 scale ``block_amax / 6 / tensor_scale`` (rounded to nearest-even,
saturating at 448), and its elements are ``v / (block_scale * tensor_scale)`` rounded to E2M1. A
finer block and a scale with a mantissa follow the data more closely than MXFP4's power of two,
at 4.5 bits per element.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..layout.minifloat import SCALE_E4M3, BlockLayout
from .base import Aggregation
from .minifloat import ROUNDING_PARAM, SEED_PARAM, BlockFloat
from .registry import register_codec

__all__ = ["NVFP4", "NV_BLOCK"]

#: Elements per E4M3 block scale.
NV_BLOCK = 16


@register_codec
class NVFP4(BlockFloat):
    """NVFP4: E2M1 elements in blocks of 16 with E4M3 block scales and a binary32 tensor scale.

    Parameters:
        rounding: ``"nearest"`` (ties to even) or ``"stochastic"`` (unbiased below saturation, one
            16-bit Philox draw per element; block scales are always rounded to nearest).
        seed: Philox key for stochastic rounding (recorded in the header).
    """

    codec_id = "nvfp4"
    aggregation = Aggregation.GATHER
    rule_prefix = "NV"
    padding_rule = "NV3"
    elements_rule = "NV3"  # every E2M1 code is a finite value: no element rule applies
    PARAMS = {"rounding": ROUNDING_PARAM, "seed": SEED_PARAM}

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> BlockLayout:
        return BlockLayout("e2m1", NV_BLOCK, SCALE_E4M3, params["rounding"] == "stochastic")
