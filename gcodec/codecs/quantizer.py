"""What ``uniform``, ``qsgd`` and ``terngrad`` share: scaled integer codes.

The three codecs differ only in how a group's scale is chosen and in their parameters; the codes,
their packing, the rounding rules and decoding are the same (specs/codecs/uniform.md §6,
qsgd.md, terngrad.md). :class:`ScaledQuantizer` holds that common part; a subclass says how its
params map onto the kernel (:meth:`ScaledQuantizer._layout`).

Stochastic codecs take their random stream per call from the caller's state
(:meth:`EncodeContext.take_stream`, :mod:`gcodec.codecs.state`) and write it into the header, so a
payload never depends on the encoder's state to be decoded or checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..errors import PayloadValueError
from ..layout.quant import RULE_L2, QuantLayout
from ..sections import SectionSpec, TensorEntry, numel
from .base import Codec, EncodeContext, EncodePlan, Param, binary32
from .seeds import STREAM_PARAM
from .valuecheck import first_bad, host_value, last_byte

__all__ = ["QuantLayout", "ScaledQuantizer"]


class ScaledQuantizer(Codec):
    """Base of the group-scaled integer codecs. Subclasses define ``PARAMS``, ``_layout`` and the
    rule prefix used in error messages (``U``, ``Q``, ``TG``)."""

    device_checks = True  # scales and codes checked and decoded by the backend's kernels

    rule_prefix: str = "U"

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> QuantLayout:
        raise NotImplementedError

    @classmethod
    def _is_stochastic(cls, params: Mapping[str, Any]) -> bool:
        return True

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return {**cls.PARAMS, "stream": STREAM_PARAM}

    @classmethod
    def wire_schema_for(cls, params: Mapping[str, Any]) -> dict[str, Param]:
        return cls.wire_schema() if cls._is_stochastic(params) else dict(cls.PARAMS)

    @property
    def encoding_unit(self) -> int | None:
        """A group's scale follows from its own elements (``group_size=0``: the tensor's); stochastic
        rounding draws each element's word at its position in the tensor (specs/rng.md), so a
        stochastic encoding depends on where the tensor starts: the whole tensor."""
        lay = self._layout(self._params)
        return None if lay.stochastic or lay.group_size == 0 else int(lay.group_size)

    # ---- encoding ------------------------------------------------------------------------
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        if flat.dtype != np.float32:  # the spec's first step; kernels are compiled for float32 only
            with np.errstate(over="ignore"):  # beyond float32: infinite, refused by the kernel
                flat = flat.astype(np.float32)
        params = dict(self._params)
        lay = self._layout(params)
        stream = 0
        if lay.stochastic:
            stream = ctx.take_stream()
            params["stream"] = stream
        n = flat.size
        ng = lay.ngroups(n)
        name = self.codec_id

        def fill(views: Mapping[str, np.ndarray]) -> None:
            codes = views["codes"]
            if lay.scale_f16:
                sc16 = views["scales"].view(np.uint16)
                sc32 = np.empty(ng, np.float32)
            else:
                sc16 = np.empty(0, np.uint16)
                sc32 = views["scales"]
            nbad = kernels.of(flat).quant.encode(flat, codes, sc32, sc16, lay, params.get("seed", 0), stream)
            if not nbad and not lay.scale_f16:
                nover = kernels.of(flat).quant.count_scale_overflows(sc32, lay.qmax)
                if nover:  # a finite input whose largest code would decode to infinity (rule 1)
                    raise PayloadValueError(
                        f"{name}: input too large: in {nover} group(s) the scale times {lay.qmax} overflows float32, "
                        "so the payload would decode to infinity"
                    )
            if nbad:
                why = "NaN or infinite values"
                if lay.scale_f16:
                    why += " (or a scale above the float16 range: use scale_dtype='float32')"
                raise PayloadValueError(f"{name}: input has {why} in {nbad} group(s); the codec cannot represent them")

        sections = [SectionSpec(*s) for s in lay.sections(n)]
        return EncodePlan(params, sections, fill)

    def magnitude_bound(self, max_abs: float, count: int) -> float:
        """Codes lie in [-qmax, qmax], so a decoded value is at most qmax times the largest scale:
        about max|v| for ``uniform`` (max|v| / qmax, rounded up to binary16 with float16 scales) and
        ``terngrad`` (max|v|, or less when clipping), and about the bucket's L2 norm for ``qsgd``,
        which is at most sqrt(bucket size) * max|v|. The roundings of these steps add less than a
        factor 1 + 2^-20 with binary32 scales (a few binary32 roundings and a binary64 sum), 1 + 2^-8
        with binary16 scales (rounded up by at most 2^-10), and 2^-16 for scales of subnormal size.
        (A scale that would overflow is refused by the codec itself.)"""
        lay = self._layout(self._params)
        v = binary32(max_abs)
        if lay.rule == RULE_L2:
            bucket = count if lay.group_size == 0 else min(lay.group_size, count)
            v *= math.sqrt(max(bucket, 1))
        return v * (1 + 2.0 ** (-8 if lay.scale_f16 else -20)) + 2.0**-16

    # ---- decoding ------------------------------------------------------------------------
    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        return cls._layout(params).sections(numel(shape))

    @classmethod
    def _check_scales(cls, lay: QuantLayout, views: Mapping[str, np.ndarray]) -> None:
        p = cls.rule_prefix
        sc = views["scales"]
        if lay.scale_f16:
            g = first_bad(sc.view(np.uint16), "negative_or_nonfinite_f16")
        else:
            g = first_bad(sc, "negative_or_nonfinite_f32")
        if g >= 0:
            raise PayloadValueError(
                f"{p}1: scale of group {g} is {host_value(sc, g)!r}; scales must be finite and >= +0"
            )
        if not lay.scale_f16:  # float16 scales times qmax <= 127 never overflow float32
            g = first_bad(sc, "product_overflows_f32", lay.qmax)
            if g >= 0:
                raise PayloadValueError(
                    f"{p}1: scale of group {g} is {host_value(sc, g)!r}; float32({lay.qmax} * scale) overflows, "
                    "so its largest code would decode to infinity"
                )

    @classmethod
    def _check_padding(cls, lay: QuantLayout, n: int, views: Mapping[str, np.ndarray]) -> None:
        used = n * lay.width % 8
        codes = views["codes"]
        if used and last_byte(codes) >> used:
            raise PayloadValueError(
                f"{cls.rule_prefix}3: unused high bits of the last code byte {codes.size - 1} are not zero"
            )

    @classmethod
    def _bad_codes(cls, lay: QuantLayout, nbad: int) -> str:
        return (
            f"{cls.rule_prefix}2: {nbad} code(s) lie outside [-{lay.qmax}, {lay.qmax}] "
            f"(the {lay.width}-bit codes this payload's params allow)"
        )

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        lay = cls._layout(params)
        cls._check_scales(lay, views)
        cls._check_padding(lay, entry.numel, views)
        nbad = kernels.of(views["codes"]).quant.count_bad(views["codes"], entry.numel, lay.width, lay.qmax)
        if nbad:
            raise PayloadValueError(cls._bad_codes(lay, nbad))

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        lay = cls._layout(params)
        if accumulate:  # check everything first: a bad payload must not half-update the sum
            cls.check_values(params, entry, views)
        else:
            cls._check_scales(lay, views)
            cls._check_padding(lay, entry.numel, views)
        n = entry.numel
        g = lay.group_size if lay.group_size > 0 else max(n, 1)
        if lay.scale_f16:
            sc16, sc32 = views["scales"].view(np.uint16), np.empty(0, np.float32)
        else:
            sc16, sc32 = np.empty(0, np.uint16), views["scales"]
        nbad = kernels.of(out).quant.scaled_decode(views["codes"], sc32, sc16, out, g, lay.width, lay.qmax, accumulate)
        if nbad:
            raise PayloadValueError(cls._bad_codes(lay, nbad))
