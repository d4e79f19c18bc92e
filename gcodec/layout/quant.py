"""Layout of the group-scaled integer codecs (``uniform``, ``qsgd``, ``terngrad``) and ``sign``.

Every group of ``G`` consecutive elements gets one scale chosen by a *rule* (specs/codecs/
uniform.md, qsgd.md, terngrad.md, sign.md); codes are ``w``-bit two's complement in a little-endian
bit stream. Sums over a group (L2 norm, mean |x|, standard deviation) are taken per block of
:data:`RBLOCK` elements in a fixed order (qsgd.md §3), on every backend.
"""

from __future__ import annotations

import dataclasses

__all__ = ["RBLOCK", "RULE_ABSMAX", "RULE_L2", "RULE_MAX", "RULE_MEANABS", "QuantLayout"]

RBLOCK = 1 << 16  # sums over longer ranges are taken per block of this many elements (spec)

RULE_ABSMAX = 0  # s = absmax / qmax                       (uniform)
RULE_L2 = 1  # s = float32(sqrt(sum v^2)) / levels          (qsgd)
RULE_MAX = 2  # s = absmax, or min(absmax, c * sigma)       (terngrad)
RULE_MEANABS = 3  # s = float32(sum |v| / count)             (sign)


@dataclasses.dataclass(frozen=True)
class QuantLayout:
    """How a scaled-quantizer payload's params map onto the kernels: one value per wire fact."""

    group_size: int  # 0: one group for the whole tensor
    width: int  # bits per code, 2..8
    qmax: int  # codes lie in [-qmax, qmax]
    rule: int  # RULE_*
    stochastic: bool
    clip: float = 0.0
    scale_f16: bool = False

    def ngroups(self, n: int) -> int:
        if n == 0:
            return 0
        return 1 if self.group_size == 0 else (n + self.group_size - 1) // self.group_size

    def sections(self, n: int) -> list[tuple[str, str, int]]:
        ng = self.ngroups(n)
        scales = ("scales", "f2", 2 * ng) if self.scale_f16 else ("scales", "f4", 4 * ng)
        return [scales, ("codes", "u1", (n * self.width + 7) // 8)]
