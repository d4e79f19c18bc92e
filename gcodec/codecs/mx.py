"""``mx``: OCP Microscaling (MX v1.0) blocks: 32 elements sharing one power-of-two scale (specs/codecs/mx.md).

Open Compute Project, "OCP Microscaling Formats (MX) Specification", version 1.0 (2023). A block of 32
consecutive elements shares the E8M0 scale ``X = 2^(floor(log2(amax)) - emax_elem)``; its elements
are ``v / X`` in one of six formats: FP8 E4M3 and E5M2 (MXFP8), FP6 E2M3 and E3M2 (MXFP6), FP4 E2M1
(MXFP4) and 8-bit integers with an implicit ``2^-6`` (MXINT8). The specification leaves values
beyond an element's range to the implementation; gcodec saturates them to the largest finite value,
as Microsoft's microxcaling library and torchao do, so a block's largest elements never become NaN.
MXFP4 costs 4.25 bits per element, MXFP6 6.25, MXFP8 and MXINT8 8.25.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..layout.minifloat import SCALE_E8M0, BlockLayout
from .base import Aggregation, Param
from .minifloat import ROUNDING_PARAM, SEED_PARAM, BlockFloat
from .registry import register_codec

__all__ = ["MX", "MX_BLOCK"]

#: Elements per shared scale: OCP MX v1.0 defines k = 32 for every concrete format.
MX_BLOCK = 32


@register_codec
class MX(BlockFloat):
    """OCP MX v1.0: blocks of 32 elements with a shared E8M0 scale.

    Parameters:
        element: ``"e4m3"``, ``"e5m2"`` (MXFP8), ``"e3m2"``, ``"e2m3"`` (MXFP6), ``"e2m1"`` (MXFP4,
            the default: 4.25 bits per element) or ``"int8"`` (MXINT8). Fewer bits need error feedback.
        rounding: ``"nearest"`` (ties to even) or ``"stochastic"`` (unbiased below saturation; one
            16-bit Philox draw per element).
        seed: Philox key for stochastic rounding (recorded in the header).
    """

    codec_id = "mx"
    aggregation = Aggregation.GATHER
    rule_prefix = "MX"
    padding_rule = "MX2"
    elements_rule = "MX3"
    PARAMS = {
        "element": Param(str, "e2m1", "element type", choices=("e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8")),
        "rounding": ROUNDING_PARAM,
        "seed": SEED_PARAM,
    }

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> BlockLayout:
        return BlockLayout(params["element"], MX_BLOCK, SCALE_E8M0, params["rounding"] == "stochastic")
