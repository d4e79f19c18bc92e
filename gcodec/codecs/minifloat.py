"""What ``fp8``, ``mx`` and ``nvfp4`` share: low-precision float elements under a scale per group.

The three codecs differ in their parameters and in how a group's scale is chosen (a binary32
``amax / max_value``, OCP's shared power of two, NVIDIA's E4M3 block scale times a tensor scale);
the element formats, their rounding (nearest-even or the stochastic rule of specs/rng.md §4, with
saturation at the largest finite value), their packing and decoding are the same
(specs/codecs/fp8.md, mx.md, nvfp4.md). :class:`BlockFloat` holds that common part; a subclass says
how its params map onto a :class:`~gcodec.layout.minifloat.BlockLayout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..errors import PayloadValueError
from ..layout.minifloat import ELEMENTS, SCALE_E4M3, SCALE_E8M0, SCALE_F32, BlockLayout, Element
from ..sections import SectionSpec, TensorEntry, numel
from .base import Codec, EncodeContext, EncodePlan, Param, binary32
from .seeds import PER_WORKER_SEED, STREAM_PARAM
from .valuecheck import first_bad, host_value, last_byte

__all__ = ["ROUNDING_PARAM", "SEED_PARAM", "BlockFloat", "e8m0_limit"]

ROUNDING_PARAM = Param(str, "nearest", "rounding rule", choices=("nearest", "stochastic"))
SEED_PARAM = PER_WORKER_SEED


def e8m0_limit(el: Element) -> int:
    """The largest E8M0 scale code whose scale keeps every element finite in binary32:
    ``max_value * 2^(code - 127) < 2^128`` exactly when ``code - 127 + emax <= 127``."""
    return 254 - el.emax


class BlockFloat(Codec):
    """Base of the low-precision float codecs. Subclasses define ``PARAMS``, ``rule_prefix`` and
    :meth:`_layout`."""

    device_checks = True  # scales and element codes checked and decoded by the backend's kernels

    rule_prefix: str = "E"

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> BlockLayout:
        raise NotImplementedError

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return {**cls.PARAMS, "stream": STREAM_PARAM}

    @classmethod
    def wire_schema_for(cls, params: Mapping[str, Any]) -> dict[str, Param]:
        return cls.wire_schema() if params.get("rounding") == "stochastic" else dict(cls.PARAMS)

    @property
    def encoding_unit(self) -> int | None:
        """A group's scale follows from its own elements, unless a tensor scale (``nvfp4``) ties
        every group to the tensor's largest magnitude; stochastic rounding draws each element's
        word at its position in the tensor (specs/rng.md §4): then the whole tensor."""
        lay = self._layout(self._params)
        return None if lay.stochastic or lay.scale == SCALE_E4M3 else int(lay.group_size)

    @property
    def element(self) -> Element:
        """The element format of this codec's payloads."""
        return ELEMENTS[self._layout(self._params).element]

    # ---- encoding ------------------------------------------------------------------------
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        if flat.dtype != np.float32:  # the specs' first step: binary32 (float64 beyond range: infinite, refused)
            with np.errstate(over="ignore"):
                flat = flat.astype(np.float32)
        params = dict(self._params)
        lay = self._layout(params)
        stream = 0
        if lay.stochastic:
            stream = ctx.take_stream()
            params["stream"] = stream
        n = flat.size
        name = self.codec_id
        el = ELEMENTS[lay.element]

        def fill(views: Mapping[str, np.ndarray]) -> None:
            nbad, nover = kernels.of(flat).minifloat.encode(
                flat,
                views["scales"],
                views["elements"],
                views.get("tensor_scale"),
                lay.element,
                lay.group_size,
                lay.scale,
                lay.stochastic,
                params.get("seed", 0),
                stream,
            )
            if nbad:
                raise PayloadValueError(
                    f"{name}: input has NaN or infinite values in {nbad} group(s); the codec cannot represent them"
                )
            if nover:  # a finite input whose largest element would decode to infinity (rules E1, NV2)
                top = el.max_value if lay.scale == SCALE_F32 else 6.0
                raise PayloadValueError(
                    f"{name}: input too large: in {nover} group(s) the scale times {top:g} overflows float32, "
                    "so the payload would decode to infinity"
                )

        sections = [SectionSpec(*s) for s in lay.sections(n)]
        return EncodePlan(params, sections, fill)

    def magnitude_bound(self, max_abs: float, count: int) -> float:
        """Elements saturate at the format's largest value, and scales follow the largest magnitude:
        with a binary32 scale (``fp8``) or NVIDIA's two levels (``nvfp4``) a decoded value is at most
        that magnitude up to a few binary32 roundings (under 2^-20 relative) and 2^-16 for scales of
        subnormal size; with a power-of-two scale (``mx``, ``fp8`` with E8M0 scales) the largest
        element times 2^(floor(log2 amax) - emax) is below 2^(floor(log2 amax) + 1), at most twice
        the magnitude (2^-126 for the smallest scale, 2^-127, of tiny inputs)."""
        v = binary32(max_abs)
        if self._layout(self._params).scale == SCALE_E8M0:
            return 2.0 * v + 2.0**-126
        return v * (1 + 2.0**-20) + 2.0**-16

    # ---- decoding ------------------------------------------------------------------------
    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        return cls._layout(params).sections(numel(shape))

    @classmethod
    def _check_scales(cls, lay: BlockLayout, views: Mapping[str, np.ndarray]) -> float:
        """Rule 1 (the scales); returns the tensor scale of ``nvfp4`` (0 otherwise)."""
        p, el = cls.rule_prefix, ELEMENTS[lay.element]
        sc = views["scales"]
        if lay.scale == SCALE_F32:
            g = first_bad(sc, "negative_or_nonfinite_f32")
            if g >= 0:
                raise PayloadValueError(
                    f"{p}1: scale of group {g} is {host_value(sc, g)!r}; scales must be finite and >= +0"
                )
            g = first_bad(sc, "product_overflows_f32", el.max_value)
            if g >= 0:
                raise PayloadValueError(
                    f"{p}1: scale of group {g} is {host_value(sc, g)!r}; float32({el.max_value:g} * scale) overflows, "
                    "so the largest element would decode to infinity"
                )
            return 0.0
        if lay.scale == SCALE_E8M0:
            top = e8m0_limit(el)
            g = first_bad(sc, "above", top)
            if g >= 0:
                c = int(host_value(sc, g))
                what = "NaN (0xFF)" if c == 0xFF else f"2^{c - 127}"
                raise PayloadValueError(
                    f"{p}1: E8M0 scale of block {g} is code {c} = {what}; codes above {top} are refused "
                    f"({lay.element} elements times it would overflow float32)"
                )
            return 0.0
        s = np.float32(host_value(views["tensor_scale"], 0))
        if not np.isfinite(s) or np.signbit(s):
            raise PayloadValueError(f"{p}1: tensor_scale is {s!r}; it must be finite and >= +0")
        g = first_bad(sc, "e4m3_signed_or_nan")
        if g >= 0:
            raise PayloadValueError(
                f"{p}2: E4M3 block scale {g} is code 0x{int(host_value(sc, g)):02x}; block scales are finite and "
                "carry no sign"
            )
        g = first_bad(sc, "e4m3_times_overflows", float(s))
        if g >= 0:
            raise PayloadValueError(
                f"{p}2: E4M3 block scale {g} (code 0x{int(host_value(sc, g)):02x}) times tensor_scale {float(s)!r} "
                "times 6 "
                "overflows float32, so the block's largest element would decode to infinity"
            )
        return float(s)

    #: The rules of this codec's page for the unused bits of the last byte and for element codes
    #: that are not finite values; checked in the order scales, padding, elements.
    padding_rule: str = ""
    elements_rule: str = ""

    @classmethod
    def _check_padding(cls, lay: BlockLayout, n: int, views: Mapping[str, np.ndarray]) -> None:
        bits = ELEMENTS[lay.element].bits
        used = n * bits % 8
        codes = views["elements"]
        if used and last_byte(codes) >> used:
            raise PayloadValueError(
                f"{cls.padding_rule}: unused high bits of the last elements byte {codes.size - 1} are not zero"
            )

    @classmethod
    def _check_empty_tensor_scale(cls, lay: BlockLayout, n: int, ts: float) -> None:
        """nvfp4.md NV4: a payload of 0 elements has the tensor scale +0 (§2, §3 step 2: A = 0). NV1 has
        refused a NaN, infinite or negative one and -0 already, so any other value is positive."""
        if lay.scale == SCALE_E4M3 and n == 0 and ts != 0.0:
            raise PayloadValueError(
                f"{cls.rule_prefix}4: tensor_scale is {ts!r} in a payload of 0 elements; it must be +0"
            )

    @classmethod
    def _bad_elements(cls, lay: BlockLayout, nbad: int) -> str:
        return (
            f"{cls.elements_rule}: {nbad} element code(s) are not finite {lay.element} values "
            "(NaN or infinity; for int8 the pattern 0x80)"
        )

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        lay = cls._layout(params)
        ts = cls._check_scales(lay, views)
        cls._check_padding(lay, entry.numel, views)
        nbad = kernels.of(views["elements"]).minifloat.count_bad_elements(views["elements"], entry.numel, lay.element)
        if nbad:
            raise PayloadValueError(cls._bad_elements(lay, nbad))
        cls._check_empty_tensor_scale(lay, entry.numel, ts)

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
        ts = cls._check_scales(lay, views)
        cls._check_padding(lay, entry.numel, views)
        cls._check_empty_tensor_scale(lay, entry.numel, ts)  # NV4 (no elements: nothing else to check)
        if accumulate:  # check every element first: a bad payload must not half-update the sum
            nbad = kernels.of(views["elements"]).minifloat.count_bad_elements(
                views["elements"], entry.numel, lay.element
            )
            if nbad:
                raise PayloadValueError(cls._bad_elements(lay, nbad))
        if lay.scale == SCALE_F32:
            sc32, sc8 = views["scales"], np.empty(0, np.uint8)
        else:
            sc32, sc8 = np.empty(0, np.float32), views["scales"]
        nbad = kernels.of(out).minifloat.decode(
            views["elements"], sc32, sc8, out, lay.element, lay.group_size, lay.scale, accumulate, ts
        )
        if nbad:
            raise PayloadValueError(cls._bad_elements(lay, nbad))
