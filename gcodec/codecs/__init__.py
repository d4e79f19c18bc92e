"""Codecs: pure algorithms from arrays to sections, with caller-owned state. Importing this registers the built-ins."""

from . import (  # noqa: F401  (registration side effect)
    cast,
    chunktopk,
    dct,
    fp8,
    mx,
    nvfp4,
    powersgd,
    qsgd,
    randomk,
    sign,
    terngrad,
    threshold,
    topk,
    uniform,
)
from .base import Aggregation, Codec, EncodePlan, Param
from .registry import codec_class, get_codec, list_codecs, register_codec

__all__ = [
    "Aggregation",
    "Codec",
    "EncodePlan",
    "Param",
    "codec_class",
    "get_codec",
    "list_codecs",
    "register_codec",
]
