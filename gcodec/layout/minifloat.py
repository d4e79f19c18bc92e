"""The low-precision element formats of ``fp8``, ``mx`` and ``nvfp4`` (specs/codecs/fp8.md §3, mx.md §3).

Each format is a wire fact shared by the codecs and every backend's kernels: its width, how a
magnitude code maps to a value, the largest finite code, and which codes are not finite. Magnitude
codes of the floating-point formats are ordered like their values (``value(c) < value(c + 1)``),
which is what lets one integer routine round into any of them and saturate with ``min(code,
maxcode)``. The block-scale rules (OCP's shared exponent, NVIDIA's two levels) live in the codecs'
spec pages and the kernels; this module only names the element types.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = [
    "ELEMENTS",
    "SCALE_E4M3",
    "SCALE_E8M0",
    "SCALE_F32",
    "BlockLayout",
    "Element",
    "element",
    "magnitude_value",
    "values_table",
]

SCALE_F32 = 0  # a binary32 scale amax / max_value per group (fp8.md §4.1)
SCALE_E8M0 = 1  # a power of two 2^(floor(log2 amax) - emax) per group, as an E8M0 code (fp8.md §4.2, mx.md §5)
SCALE_E4M3 = 2  # nvfp4: an E4M3 code per block times one binary32 tensor scale (nvfp4.md §4)


@dataclasses.dataclass(frozen=True)
class Element:
    """One element format.

    Floating point (``integer`` False): sign-magnitude, ``bits - 1 - mbits`` exponent bits, ``mbits``
    mantissa bits; magnitude code ``c = (E << mbits) | f`` has the value ``f * 2^(emin - mbits)`` when
    ``E == 0`` and ``(2^mbits + f) * 2^(E - 1 + emin - mbits)`` otherwise. ``integer`` (MXINT8): two's
    complement ``q`` with the value ``q * 2^-6``.
    """

    name: str
    bits: int
    mbits: int
    emin: int  # exponent of the smallest normal value (1 - bias); the integer format: 0 (quantum 2^(0 - mbits))
    emax: int  # exponent of the largest normal value (OCP's emax_elem)
    maxcode: int  # the magnitude code of the largest finite value (saturation target)
    finite_below: int  # magnitude codes >= this are NaN or infinite (refused); 1 << (bits - 1) when all are finite
    integer: bool = False
    ml_dtypes_name: str = ""  # the matching ml_dtypes type
    torch_name: str = ""  # the matching torch dtype (for e2m1: two elements per byte)
    safetensors: str = ""  # the safetensors dtype of the element codes, when it has one
    dlpack_code: int = -1  # the DLPack (v1.1) DLDataTypeCode of one element (kDLInt for int8)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def max_value(self) -> float:
        return float(magnitude_value(self, self.maxcode))

    @property
    def packed(self) -> bool:
        """Whether several elements share a byte (6- and 4-bit elements, mx.md §4)."""
        return self.bits != 8


def magnitude_value(el: Element, c: int) -> float:
    """The (non-negative) value of magnitude code ``c`` (finite codes only)."""
    if el.integer:
        return c * 2.0**-6
    e, f = c >> el.mbits, c & ((1 << el.mbits) - 1)
    if e == 0:
        return f * 2.0 ** (el.emin - el.mbits)
    return ((1 << el.mbits) + f) * 2.0 ** (e - 1 + el.emin - el.mbits)


ELEMENTS: dict[str, Element] = {
    e.name: e
    for e in (
        Element(
            "e4m3",
            8,
            3,
            -6,
            8,
            0x7E,
            0x7F,
            ml_dtypes_name="float8_e4m3fn",
            torch_name="float8_e4m3fn",
            safetensors="F8_E4M3",
            dlpack_code=10,
        ),
        Element(
            "e5m2",
            8,
            2,
            -14,
            15,
            0x7B,
            0x7C,
            ml_dtypes_name="float8_e5m2",
            torch_name="float8_e5m2",
            safetensors="F8_E5M2",
            dlpack_code=12,
        ),
        Element("e2m3", 6, 3, 0, 2, 0x1F, 0x20, ml_dtypes_name="float6_e2m3fn", safetensors="F6_E2M3", dlpack_code=15),
        Element("e3m2", 6, 2, -2, 4, 0x1F, 0x20, ml_dtypes_name="float6_e3m2fn", safetensors="F6_E3M2", dlpack_code=16),
        Element(
            "e2m1",
            4,
            1,
            0,
            2,
            0x7,
            0x8,
            ml_dtypes_name="float4_e2m1fn",
            torch_name="float4_e2m1fn_x2",
            safetensors="F4",
            dlpack_code=17,
        ),
        # MXINT8: codes -127 .. 127 (the pattern 0x80, -2.0, is refused: mx.md rule MX3)
        Element("int8", 8, 6, 0, 0, 127, 128, integer=True, torch_name="int8", safetensors="I8", dlpack_code=0),
    )
}


def element(name: str) -> Element:
    return ELEMENTS[name]


def values_table(el: Element) -> np.ndarray:
    """float32 value of every code ``0 .. 2^bits - 1`` (sign included); NaN where a code is not finite
    (and at 0x80 of the integer format)."""
    n = 1 << el.bits
    out = np.empty(n, np.float32)
    for c in range(n):
        if el.integer:
            q = c - 256 if c >= 128 else c
            out[c] = np.nan if q == -128 else q * 2.0**-6
            continue
        mag = c & (el.sign_bit - 1)
        v = np.nan if mag >= el.finite_below else magnitude_value(el, mag)
        out[c] = -v if c & el.sign_bit else v
    return out


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """How a payload's params map onto sections and kernels: the element format, the elements per
    scale, the scale rule, and whether rounding is stochastic."""

    element: str
    group_size: int
    scale: int  # SCALE_*
    stochastic: bool

    def ngroups(self, n: int) -> int:
        return -(-n // self.group_size)

    def sections(self, n: int) -> list[tuple[str, str, int]]:
        ng = self.ngroups(n)
        out = []
        if self.scale == SCALE_E4M3:
            out.append(("tensor_scale", "f4", 4))
        out.append(("scales", "f4", 4 * ng) if self.scale == SCALE_F32 else ("scales", "u1", ng))
        out.append(("elements", "u1", (n * ELEMENTS[self.element].bits + 7) // 8))
        return out
