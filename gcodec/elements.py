"""The raw element codes of an ``fp8``, ``mx`` or ``nvfp4`` payload, as the matching low-precision dtype.

A payload of these codecs already holds its elements in the industry's formats (specs/codecs/mx.md
§3): an FP8 kernel, a safetensors writer or a framework can take them as they are, without
decoding to float32. :func:`element_codes` validates the payload and returns views of its
sections, no copy: the elements as ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2`` (or ``int8`` for
MXINT8), the packed FP6/FP4 bytes as ``uint8``, and the scales (``float32``, or E8M0/E4M3 codes as
``ml_dtypes.float8_e8m0fnu`` / ``float8_e4m3fn``). :meth:`ElementCodes.torch` gives torch views
of the same memory where torch has the dtype.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from .api import validate
from .codecs import codec_class
from .errors import ConfigError, GcodecError
from .format.container import read_payload
from .layout.minifloat import ELEMENTS, SCALE_E4M3, SCALE_E8M0, SCALE_F32, BlockLayout, Element

__all__ = ["ElementCodes", "element_codes", "element_format", "scale_format"]

#: The scale sections' element types other tools know by name: (safetensors dtype, DLPack type code).
_SCALE_DTYPES = {"e8m0": ("F8_E8M0", 14), "e4m3": ("F8_E4M3", 10), "float32": ("F32", 2)}

#: A block layout's scale rule as the scale sections' element type.
_SCALE_KIND = {SCALE_E8M0: "e8m0", SCALE_E4M3: "e4m3", SCALE_F32: "float32"}


def _layout(codec_id: str, params: dict[str, Any]) -> BlockLayout | None:
    """The block layout of a tensor record, for the codecs whose layout is a :class:`BlockLayout`
    (they store industry element formats: fp8, mx, nvfp4), else None."""
    try:
        layout = getattr(codec_class(codec_id), "_layout", None)
    except GcodecError:  # not a registered codec
        return None
    if layout is None:
        return None
    try:
        lay = layout(params)
    except (KeyError, TypeError, ValueError, ConfigError):
        return None
    return lay if isinstance(lay, BlockLayout) else None


@dataclasses.dataclass(frozen=True)
class ElementCodes:
    """Views of one tensor's sections (read-only when the payload is)."""

    element: Element
    count: int  # elements (numel)
    group_size: int  # elements per scale
    elements: np.ndarray  # 8-bit formats: one code per item in the ml_dtypes type; FP6/FP4: packed uint8
    scales: np.ndarray  # float32, or E8M0 (float8_e8m0fnu) / E4M3 (float8_e4m3fn) codes
    tensor_scale: float | None  # nvfp4's binary32 tensor scale

    @property
    def safetensors_dtype(self) -> str:
        """The safetensors dtype name of the element codes ("" when it has none)."""
        return self.element.safetensors

    @property
    def dlpack_code(self) -> int:
        """The DLPack (v1.1) ``DLDataTypeCode`` of one element (-1 when it has none)."""
        return self.element.dlpack_code

    def torch(self) -> Any:
        """The element codes as a torch tensor of the matching dtype (``float8_e4m3fn``,
        ``float8_e5m2``, ``int8``, or ``float4_e2m1fn_x2``: two elements per byte, the first in the
        low nibble), sharing memory with the payload. ConfigError for FP6, which torch lacks."""
        import torch

        name = self.element.torch_name
        if not name:
            raise ConfigError(f"torch has no dtype for {self.element.name} elements")
        raw = self.elements.view(np.uint8)
        with warnings.catch_warnings():  # a read-only payload gives a read-only view; torch warns
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(raw)
        return t.view(getattr(torch, name))


def _ml(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def element_format(codec_id: str, params: dict[str, Any]) -> Element | None:
    """The element format of a tensor record with this codec and params, or None (another codec, or
    params that do not name one)."""
    lay = _layout(codec_id, params)
    return None if lay is None else ELEMENTS.get(lay.element)


def scale_format(codec_id: str, params: dict[str, Any]) -> tuple[str, str, int] | None:
    """(scale type, its safetensors dtype, its DLPack type code) of a tensor record's ``scales``
    section, or None for other codecs (or params that do not name one)."""
    lay = _layout(codec_id, params)
    if lay is None or lay.element not in ELEMENTS:
        return None
    kind = _SCALE_KIND.get(lay.scale)
    if kind not in _SCALE_DTYPES:
        return None
    return (kind, *_SCALE_DTYPES[kind])


def element_codes(buf: Any) -> ElementCodes:
    """Validate a single-tensor ``fp8``, ``mx`` or ``nvfp4`` payload and return views of its
    element and scale sections (no copy). ConfigError for other codecs or for bundles."""
    info = validate(buf)
    if info.is_bundle or _layout(info.codec, info.tensors[0].params if info.tensors else {}) is None:
        raise ConfigError(f"element_codes needs a single fp8, mx or nvfp4 tensor, not {info.codec!r}")
    p = read_payload(buf)
    entry = p.header.tensors[0]
    views = p.host_views(entry)  # host views (a device payload's sections copied once)
    lay = codec_class(entry.codec)._layout(entry.params)  # type: ignore[attr-defined]
    el = ELEMENTS[lay.element]
    codes = views["elements"]
    if el.bits == 8:
        codes = codes.view(np.int8) if el.integer else codes.view(_ml(el.ml_dtypes_name))
    scales = views["scales"]
    if scales.dtype == np.uint8:
        scales = scales.view(_ml("float8_e4m3fn" if lay.scale == SCALE_E4M3 else "float8_e8m0fnu"))
    ts = float(views["tensor_scale"][0]) if "tensor_scale" in views else None
    return ElementCodes(el, entry.numel, lay.group_size, codes, scales, ts)
