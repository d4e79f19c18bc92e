"""``sign``: one bit per element plus a mean-|x| scale per group (specs/codecs/sign.md).

The scaled sign compressor of EF-SignSGD (Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback
Fixes SignSGD and other Gradient Compression Schemes", ICML 2019) and 1-bit Adam (Tang et al.,
2021), going back to 1-bit SGD (Seide, Fu, Droppo, Li, Yu, Interspeech 2014). Each element is sent
as its sign; the receiver multiplies by the group's mean absolute value. It is biased (it keeps
only the direction), so use it with :class:`gcodec.ErrorFeedback`; with feedback the codec has a
fused kernel that forms ``x + e``, encodes it and writes the new residual in one pass.

Zeros: bit 1 means ``v < 0``, so +0.0 and -0.0 are both sent as bit 0 and decode to ``+s``
(``+0.0`` when the whole group is zero, since then ``s = 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..errors import PayloadValueError
from ..sections import SectionSpec, TensorEntry, numel
from .base import Aggregation, Codec, EncodeContext, EncodePlan, Param, binary32
from .registry import register_codec
from .valuecheck import first_bad, host_value, last_byte

__all__ = ["Sign"]


def _sections(n: int, group_size: int) -> list[tuple[str, str, int]]:
    ng = 0 if n == 0 else (1 if group_size == 0 else (n + group_size - 1) // group_size)
    return [("scales", "f4", 4 * ng), ("bits", "u1", (n + 7) // 8)]


@register_codec
class Sign(Codec):
    """1-bit sign with a mean-|x| scale per group (EF-SignSGD / 1-bit Adam form).

    Parameters:
        group_size: elements sharing one scale (default 256: 1.125 bits per element). 0 means one
            scale for the whole tensor (the original EF-SignSGD scale ||x||_1 / n, 1 bit per
            element). Smaller groups follow the magnitude profile of a tensor more closely.

    Deterministic: no seed. Always use it with error feedback (``gcodec.ErrorFeedback``).
    """

    codec_id = "sign"
    aggregation = Aggregation.GATHER
    device_checks = True  # scales and the last bit byte checked on the backend
    PARAMS = {
        "group_size": Param(int, 256, "elements per scale (0: whole tensor)", min=0, max=1 << 24),
    }

    @property
    def encoding_unit(self) -> int | None:
        """A group's scale is the mean magnitude of its own elements; ``group_size=0``: the tensor's."""
        return int(self._params["group_size"]) or None

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        if flat.dtype != np.float32:  # the spec's first step; kernels are compiled for float32 only
            with np.errstate(over="ignore"):  # beyond float32: infinite, refused by the kernel
                flat = flat.astype(np.float32)
        gs = self._params["group_size"]

        def fill(views: Mapping[str, np.ndarray]) -> None:
            nbad = kernels.of(flat).sign.encode(flat, views["bits"], views["scales"], gs)
            if nbad:
                raise PayloadValueError(
                    f"sign: input has NaN or infinite values in {nbad} group(s); the codec cannot represent them"
                )

        return EncodePlan(dict(self._params), [SectionSpec(*s) for s in _sections(flat.size, gs)], fill)

    def plan_feedback(
        self, x: np.ndarray, residual: np.ndarray | None, new_residual: np.ndarray, ctx: EncodeContext
    ) -> EncodePlan | None:
        """A plan that encodes ``x + residual`` and writes ``new_residual = (x + residual) - decoded``.

        Used by :class:`gcodec.ErrorFeedback` for float32 work; None when the fused kernel does not
        apply (groups longer than a sub-block), and the caller then takes the generic path. The
        fill raises PayloadValueError, leaving ``new_residual`` to be discarded, on non-finite values.
        """
        gs = self._params["group_size"]
        flat = x.reshape(-1)
        n = flat.size
        K = kernels.of(flat)
        if not K.sign.fuses_feedback(n, gs) or flat.dtype != np.float32 or new_residual.dtype != np.float32:
            return None
        e = residual.reshape(-1) if residual is not None else np.empty(0, np.float32)
        if residual is not None and e.dtype != np.float32:
            return None
        out_e = new_residual.reshape(-1)

        def fill(views: Mapping[str, np.ndarray]) -> None:
            if n == 0:
                return
            nbad = K.sign.encode_feedback(flat, e, residual is not None, out_e, views["bits"], views["scales"], gs)
            if nbad:
                raise PayloadValueError(
                    f"sign: {nbad} group(s) or residual(s) of x + residual are NaN or infinite; "
                    "the residual was left unchanged"
                )

        return EncodePlan(dict(self._params), [SectionSpec(*s) for s in _sections(n, gs)], fill)

    def magnitude_bound(self, max_abs: float, count: int) -> float:
        """A decoded value is ±(the group's mean |v|), at most max|v| up to the rounding of the
        binary64 sum and of its binary32 quotient (sign.md §3)."""
        return binary32(max_abs) * (1 + 2.0**-20) + 2.0**-16

    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        return _sections(numel(shape), params["group_size"])

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        sc = views["scales"]
        g = first_bad(sc, "negative_or_nonfinite_f32")
        if g >= 0:
            raise PayloadValueError(f"S1: scale of group {g} is {host_value(sc, g)!r}; scales must be finite and >= +0")
        used = entry.numel % 8
        bits = views["bits"]
        if used and last_byte(bits) >> used:
            raise PayloadValueError(f"S2: unused high bits of the last bit byte {bits.size - 1} are not zero")

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        cls.check_values(params, entry, views)  # cheap: scales and one byte
        n = entry.numel
        if n:
            gs = params["group_size"]
            kernels.of(out).sign.sign_decode(views["bits"], views["scales"], out, gs if gs > 0 else n, accumulate)
