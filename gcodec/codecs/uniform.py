"""``uniform``: group-wise symmetric integer quantization (specs/codecs/uniform.md).

Each group of ``group_size`` consecutive elements gets its own scale ``absmax / qmax`` with
``qmax = 2**(bits-1) - 1``, so one outlier only coarsens its own group. Codes are the rounded
quotients ``x / scale`` in ``[-qmax, qmax]``, stored as ``bits``-bit two's complement, packed
little-end first. 8 bits with groups of 64 costs 8.5 bits per element and keeps the error of
each element within half its group's scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import PayloadValueError
from ..format.container import SectionSpec, TensorEntry
from ..kernels import quant_cpu
from .base import Aggregation, Codec, EncodeContext, EncodePlan, Param
from .registry import register_codec

__all__ = ["Uniform"]


def _sizes(n: int, bits: int, group_size: int) -> tuple[int, int]:
    """(number of groups, bytes of packed codes)."""
    return (n + group_size - 1) // group_size, (n * bits + 7) // 8


@register_codec
class Uniform(Codec):
    """Group-wise symmetric integer quantization.

    Parameters:
        bits: 8, 4 or 2 bits per code. 8 keeps ~2 decimal digits per group; 4 and 2 need error
            feedback to train well.
        group_size: elements sharing one float32 scale (default 64: 0.5 extra bits per element).
            Smaller groups follow outliers more closely at the cost of more scales.
        rounding: ``"nearest"`` (deterministic, ties to even).
    """

    codec_id = "uniform"
    aggregation = Aggregation.GATHER
    PARAMS = {
        "bits": Param(int, 8, "bits per code", choices=(8, 4, 2)),
        "group_size": Param(int, 64, "elements per scale", min=1, max=1 << 24),
        "rounding": Param(str, "nearest", "rounding rule", choices=("nearest",)),
    }

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        if flat.dtype not in (np.float32, np.float64):
            flat = flat.astype(np.float32)
        bits, g = self._params["bits"], self._params["group_size"]
        ngroups, ncodes = _sizes(flat.size, bits, g)

        def fill(views: Mapping[str, np.ndarray]) -> None:
            codes, scales = views["codes"], views["scales"]
            cg = quant_cpu.chunk_groups(g)
            if bits == 8 or g % (8 // bits) == 0:
                nbad = quant_cpu.uniform_encode(flat, codes, scales, g, bits, cg)
            else:
                nbad = quant_cpu.uniform_scales(flat, scales, g, bits, cg)
                quant_cpu.uniform_pack_unaligned(flat, codes, scales, g, bits)
            if nbad:
                raise PayloadValueError(
                    f"uniform: input has NaN or infinite values in {nbad} group(s); "
                    "the codec cannot represent them (see specs/codecs/uniform.md §5)"
                )

        sections = [SectionSpec("scales", "f4", 4 * ngroups), SectionSpec("codes", "u1", ncodes)]
        return EncodePlan(dict(self._params), sections, fill)

    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        n = int(np.prod(shape, dtype=object))
        ngroups, ncodes = _sizes(n, params["bits"], params["group_size"])
        return [("scales", "f4", 4 * ngroups), ("codes", "u1", ncodes)]

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        cls._check_header_values(params, entry, views)
        bits = params["bits"]
        nbad = quant_cpu.count_forbidden(views["codes"], bits, entry.numel)
        if nbad:
            raise PayloadValueError(_forbidden(nbad, bits))

    @classmethod
    def _check_header_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        """U1, U3: the cheap checks (scales, padding bits) that decoding always makes first."""
        scales = views["scales"]
        bad = ~(scales >= 0) | ~np.isfinite(scales) | (scales.view(np.uint32) >> 31).astype(bool)
        if bad.any():
            g = int(np.flatnonzero(bad)[0])
            raise PayloadValueError(f"U1: scale of group {g} is {scales[g]!r}; scales must be finite and >= +0")
        bits = params["bits"]
        used = entry.numel * bits % 8
        codes = views["codes"]
        if used and codes[-1] >> used:
            raise PayloadValueError(f"U3: unused high bits of the last code byte {codes.size - 1} are not zero")

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        bits, g = params["bits"], params["group_size"]
        if accumulate:  # check everything first: a bad payload must not half-update the sum
            cls.check_values(params, entry, views)
        else:
            cls._check_header_values(params, entry, views)
        nbad = quant_cpu.uniform_decode(
            views["codes"], views["scales"], out, g, bits, accumulate, quant_cpu.chunk_groups(g)
        )
        if nbad:
            raise PayloadValueError(_forbidden(nbad, bits))


def _forbidden(nbad: int, bits: int) -> str:
    return f"U2: {nbad} code(s) hold the forbidden value -{1 << (bits - 1)} (codes lie in [-qmax, qmax])"
