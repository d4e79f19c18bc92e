"""``fp16`` and ``bf16``: cast every element to a 16-bit float (specs/codecs/fp16.md, bf16.md).

These are the baseline codecs every data-parallel stack ships (torch's ``fp16_compress_hook``,
``bf16_compress_hook``): 2 bytes per element, deterministic, and *summable*: workers can add
their 16-bit values (in a wider accumulator) before anyone decodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..arrays import BFLOAT16
from ..errors import ConfigError, PayloadValueError
from ..sections import SectionSpec, TensorEntry, numel
from .base import PAYLOAD_HEADER_ROOM, Aggregation, Codec, EncodeContext, EncodePlan, binary32
from .registry import register_codec

__all__ = ["BF16", "FP16"]


def _as_kernel_input(x: np.ndarray) -> np.ndarray:
    """float32/float64 go to the kernels as they are; 16-bit inputs are widened (exactly)."""
    flat = x.reshape(-1)
    if flat.dtype in (np.float32, np.float64):
        return flat
    return flat.astype(np.float32)


def _bits(a: Any) -> Any:
    """A 16-bit values array as the uint16 bits the kernels read and write (no copy)."""
    return a if a.dtype == np.uint16 else a.view(np.uint16)


def _f32(bits: int) -> float:
    return float(np.array(bits, np.uint32).view(np.float32))


class _Cast16(Codec):
    PARAMS = {}
    aggregation = Aggregation.SUMMABLE
    fixed_size = True
    device_checks = True  # no value rules; the decode kernel reads the section where it lies
    carries_nonfinite = True  # NaN and ±infinity travel (docs/nonfinite.md)
    _encode_kernel: str  # names in each backend's ``cast`` module
    _feedback_kernel: str
    _decode_kernel: str
    _sum2_widen_kernel: str
    # The range of the 16-bit format, as its spec's encoding table gives it: binary32 magnitudes from
    # _overflow up round to infinity, and the largest finite value is _largest. Rounding to nearest
    # moves a value by at most half a unit in the last place: 2^-(_digits) of it among the normal
    # numbers, half the smallest subnormal (_tiny) below them.
    _overflow: float
    _largest: float
    _digits: int
    _tiny: float

    @property
    def encoding_unit(self) -> int | None:
        """Every element is cast on its own (spec §3)."""
        return 1

    def magnitude_bound(self, max_abs: float, count: int) -> float:
        """Infinite when the largest value overflows the 16-bit format (the input is rounded to
        binary32 first); otherwise that value rounded up by at most half a unit in the last place."""
        v = binary32(max_abs)
        if v >= self._overflow:
            return math.inf
        return min(self._largest, v * (1 + 2.0**-self._digits) + self._tiny)

    _values: np.dtype

    @property
    def values_dtype(self) -> np.dtype:
        return self._values

    def summable_values(self, shape: tuple[int, ...], dtype: Any) -> tuple[int, np.dtype]:
        return math.prod(shape), self._values

    def encode_values(self, flat: Any, out: Any) -> None:
        """The ``data`` section of an encode of ``flat`` (float32/float64), written into ``out``
        (any 2-byte type: the kernels write the bits)."""
        K = kernels.of(flat)
        with K.threads_for(flat.size):
            getattr(K.cast, self._encode_kernel)(flat, _bits(out))

    def decode_values(self, values: Any, out: Any, accumulate: bool) -> None:
        getattr(kernels.of(out).cast, self._decode_kernel)(_bits(values), out, accumulate)

    def decode_values_sum(self, a: Any, b: Any, out: Any) -> int:
        # The decode of these codecs is the exact widening of each value, so the decoded sum is the
        # widened pair sum: one pass (the sum kernel's arithmetic, its result widened to float32).
        if out.dtype != np.float32:
            raise ConfigError(f"{self.codec_id}: the decoded pair sum is written into float32, not {out.dtype}")
        K = kernels.of(out)
        with K.threads_for(out.size):
            return int(getattr(K.cast, self._sum2_widen_kernel)(_bits(a), _bits(b), out))

    def max_payload_bytes(self, shape: tuple[int, ...], dtype: Any) -> int:
        """Exactly two bytes per element, plus the container's room (fp16.md §2)."""
        return PAYLOAD_HEADER_ROOM + 2 * len(self.config_key) + 2 * math.prod(int(d) for d in shape)

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = _as_kernel_input(x)
        enc = getattr(kernels.of(flat).cast, self._encode_kernel)

        def fill(views: Mapping[str, np.ndarray]) -> None:
            enc(flat, views["data"])

        return EncodePlan({}, [SectionSpec("data", "u2", 2 * flat.size)], fill)

    def plan_feedback(self, x: Any, residual: Any, new_residual: Any, ctx: EncodeContext) -> EncodePlan | None:
        """A plan that encodes ``x + residual`` and writes ``new_residual = (x + residual) - decoded``
        in the same pass (:class:`gcodec.ErrorFeedback`'s fused path), bit for bit what the generic
        path's separate passes give: one float32 addition, the spec's rounding, the exact widening,
        one float32 subtraction per element. float32 work only (None otherwise: the caller takes
        the generic path). The fill raises PayloadValueError on a residual that is not finite (a
        non-finite input, or a value beyond the format's range), and the caller keeps the old one."""
        flat = x.reshape(-1)
        if flat.dtype != np.float32 or new_residual.dtype != np.float32:
            return None
        e = None if residual is None else residual.reshape(-1)
        if e is not None and e.dtype != np.float32:
            return None
        out_e = new_residual.reshape(-1)
        fb = getattr(kernels.of(flat).cast, self._feedback_kernel)
        cid = self.codec_id

        def fill(views: Mapping[str, np.ndarray]) -> None:
            bad = fb(flat, e, _bits(views["data"]), out_e)
            if bad:
                raise PayloadValueError(
                    f"{cid}: {bad} residual value(s) of x + residual would be NaN or infinite (non-finite "
                    "input, or values beyond the format's range); the residual was left unchanged"
                )

        return EncodePlan({}, [SectionSpec("data", "u2", 2 * flat.size)], fill)

    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        return [("data", "u2", 2 * numel(shape))]

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        getattr(kernels.of(out).cast, cls._decode_kernel)(views["data"], out, accumulate)


@register_codec
class FP16(_Cast16):
    """IEEE binary16, round to nearest even. Values beyond ±65504 become ±inf (as IEEE says), so
    use ``bf16`` or a scaled codec for gradients that can exceed that range."""

    codec_id = "fp16"
    _encode_kernel = "encode_f16"
    _feedback_kernel = "encode_f16_feedback"
    _decode_kernel = "decode_f16"
    _sum2_widen_kernel = "sum2_widen_f16"
    _values = np.dtype(np.float16)
    _overflow = 65520.0  # fp16.md §3: a >= 0x477FF000 gives ±infinity
    _largest = 65504.0
    _digits = 11
    _tiny = 2.0**-25


@register_codec
class BF16(_Cast16):
    """bfloat16 (8-bit exponent, 7-bit mantissa), round to nearest even: float32's range at half
    the bytes, with about 3 significant decimal digits."""

    codec_id = "bf16"
    _encode_kernel = "encode_bf16"
    _feedback_kernel = "encode_bf16_feedback"
    _decode_kernel = "decode_bf16"
    _sum2_widen_kernel = "sum2_widen_bf16"
    _values = BFLOAT16
    _overflow = _f32(0x7F7F8000)  # bf16.md §3: u >= 0x7F7F8000 in magnitude rounds to infinity
    _largest = _f32(0x7F7F0000)
    _digits = 8
    _tiny = 2.0**-134
