"""``qsgd``: QSGD stochastic quantization with a norm per bucket (specs/codecs/qsgd.md).

Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding", NeurIPS 2017. Each bucket of ``bucket_size`` elements is scaled by its
L2 norm and every element is rounded stochastically to one of ``levels`` magnitudes
``norm * l / levels``, so the decoded tensor is an unbiased estimate of the input with variance at
most ``min(d / s**2, sqrt(d) / s) * ||bucket||**2`` (d = bucket size, s = levels).

Each code holds the sign and the level as one two's complement integer in ``[-levels, levels]`` of
``1 + bit_length(levels)`` bits, the fewest that hold ``2 * levels + 1`` values when ``levels`` is
``2**k - 1``; the stream of codes is packed without gaps. The payload stores the per-bucket step
``norm / levels``, so decoding is one multiply per element, the same kernel as ``uniform``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..layout import quant as qlayout
from .base import Aggregation, Param
from .quantizer import QuantLayout, ScaledQuantizer
from .registry import register_codec
from .seeds import PER_WORKER_SEED

__all__ = ["QSGD", "code_width"]


def code_width(levels: int) -> int:
    """Bits per code: a sign bit plus the bits of ``levels``."""
    return 1 + int(levels).bit_length()


@register_codec
class QSGD(ScaledQuantizer):
    """QSGD: per-bucket L2 scaling, ``levels`` magnitudes, stochastic (unbiased) rounding.

    Parameters:
        levels: s, the number of non-zero magnitudes (1 .. 127). Codes take ``1 + bit_length(s)``
            bits: s=1 is ternary at 2 bits, s=7 4 bits, s=15 5 bits (default), s=127 8 bits.
            Variance falls as 1/s**2 while s**2 < sqrt(d); use 2**k - 1 to fill the code bits.
        bucket_size: elements sharing one norm (default 512, as in the paper's experiments; 0 means
            the whole tensor). Smaller buckets lower the variance bound (it grows with sqrt(d)) and
            cost 32 bits per bucket.
        seed: Philox key. Give each worker its own seed so that rounding errors average out.

    The header records ``stream`` too: the encode call's ``step``, or the codec's per-key counter.
    """

    codec_id = "qsgd"
    aggregation = Aggregation.GATHER
    rule_prefix = "Q"
    PARAMS = {
        "levels": Param(int, 15, "number of non-zero magnitude levels s", min=1, max=127),
        "bucket_size": Param(int, 512, "elements per norm (0: whole tensor)", min=0, max=1 << 24),
        "seed": PER_WORKER_SEED,
    }

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> QuantLayout:
        s = params["levels"]
        return QuantLayout(
            group_size=params["bucket_size"],
            width=code_width(s),
            qmax=s,
            rule=qlayout.RULE_L2,
            stochastic=True,
        )
