"""``fp16`` and ``bf16``: cast every element to a 16-bit float (specs/codecs/fp16.md, bf16.md).

These are the baseline codecs every data-parallel stack ships (torch's ``fp16_compress_hook``,
``bf16_compress_hook``): 2 bytes per element, deterministic, and *summable*: workers can add
their 16-bit values (in a wider accumulator) before anyone decodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..sections import SectionSpec, TensorEntry, numel
from .base import Aggregation, Codec, EncodeContext, EncodePlan
from .registry import register_codec

__all__ = ["BF16", "FP16"]


def _as_kernel_input(x: np.ndarray) -> np.ndarray:
    """float32/float64 go to the kernels as they are; 16-bit inputs are widened (exactly)."""
    flat = x.reshape(-1)
    if flat.dtype in (np.float32, np.float64):
        return flat
    return flat.astype(np.float32)


class _Cast16(Codec):
    PARAMS = {}
    aggregation = Aggregation.SUMMABLE
    _encode_kernel: str  # names in each backend's ``cast`` module
    _decode_kernel: str

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = _as_kernel_input(x)
        enc = getattr(kernels.of(flat).cast, self._encode_kernel)

        def fill(views: Mapping[str, np.ndarray]) -> None:
            enc(flat, views["data"])

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
    _decode_kernel = "decode_f16"


@register_codec
class BF16(_Cast16):
    """bfloat16 (8-bit exponent, 7-bit mantissa), round to nearest even: float32's range at half
    the bytes, with about 3 significant decimal digits."""

    codec_id = "bf16"
    _encode_kernel = "encode_bf16"
    _decode_kernel = "decode_bf16"
