"""``terngrad``: ternary gradients {-1, 0, +1} times a scale (specs/codecs/terngrad.md).

Wen, Xu, Yan, Wu, Wang, Chen, Li, "TernGrad: Ternary Gradients to Reduce Communication in
Distributed Deep Learning", NeurIPS 2017. With scale ``s = max |x|`` (per tensor, as in the paper,
or per group) each element becomes ``s * sign(x) * b`` with ``b ~ Bernoulli(|x| / s)``: unbiased,
at 2 bits per element.

The paper's gradient clipping is optional: with ``clip=c > 0`` the scale is ``min(max |x|, c * sigma)``
(sigma: the standard deviation of the tensor or group), and values beyond the scale are sent as
``+-s``. That lowers the variance a lot (the paper uses c = 2.5) but makes the estimate biased
toward zero for the clipped values; error feedback returns what clipping removes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..layout import quant as qlayout
from .base import Aggregation, Param
from .quantizer import QuantLayout, ScaledQuantizer
from .registry import register_codec
from .seeds import PER_WORKER_SEED

__all__ = ["TernGrad"]


@register_codec
class TernGrad(ScaledQuantizer):
    """TernGrad: 2-bit codes in {-1, 0, +1}, one scale per tensor or per group, stochastic rounding.

    Parameters:
        group_size: elements sharing one scale; 0 (default) is one scale for the whole tensor, as
            in the paper. Groups (e.g. 512) follow outliers more closely for 32/group_size more bits.
        clip: c of the paper's clipping (scale = min(max|x|, c * sigma)); 0 (default) turns it off
            and keeps the codec unbiased. The paper uses 2.5.
        seed: Philox key. Give each worker its own seed so that rounding errors average out.

    The header records ``stream`` too: the encode call's ``step``, or the codec's per-key counter.
    """

    codec_id = "terngrad"
    aggregation = Aggregation.GATHER
    rule_prefix = "TG"
    PARAMS = {
        "group_size": Param(int, 0, "elements per scale (0: whole tensor)", min=0, max=1 << 24),
        "clip": Param(float, 0.0, "clip at c * standard deviation (0: off)", min=0.0, max=1e6),
        "seed": PER_WORKER_SEED,
    }

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> QuantLayout:
        return QuantLayout(
            group_size=params["group_size"],
            width=2,
            qmax=1,
            rule=qlayout.RULE_MAX,
            stochastic=True,
            clip=float(params["clip"]),
        )
