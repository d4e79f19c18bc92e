"""gcodec: gradient-compression codecs with a versioned, validated wire format.

>>> import gcodec, numpy as np
>>> codec = gcodec.get_codec("uniform", bits=8, group_size=64)
>>> buf = codec.encode(np.linspace(-1, 1, 1000, dtype=np.float32))
>>> gcodec.validate(buf).codec
'uniform'
>>> y = gcodec.decode(buf)

Layers, bottom-up: :mod:`gcodec.arrays` (backends), :mod:`gcodec.codecs` (algorithms),
:mod:`gcodec.format` (bytes), then transports. See docs/ and specs/.
"""

from __future__ import annotations

from .api import (
    PayloadInfo,
    TensorInfo,
    decode,
    decode_bundle,
    encode_bundle,
    validate,
)
from .codecs import Aggregation, Codec, codec_class, get_codec, list_codecs, register_codec
from .errors import (
    ChecksumError,
    ConfigError,
    FormatError,
    GcodecError,
    HeaderError,
    LayoutError,
    LimitExceededError,
    PayloadValueError,
    SizeMismatchError,
    UnknownCodecError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
)
from .feedback import ErrorFeedback
from .limits import Limits, get_limits, limits, set_limits

__version__ = "0.1.0"

__all__ = [
    "Aggregation",
    "ChecksumError",
    "Codec",
    "ConfigError",
    "ErrorFeedback",
    "FormatError",
    "GcodecError",
    "HeaderError",
    "LayoutError",
    "LimitExceededError",
    "Limits",
    "PayloadInfo",
    "PayloadValueError",
    "SizeMismatchError",
    "TensorInfo",
    "UnknownCodecError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "codec_class",
    "decode",
    "decode_bundle",
    "encode_bundle",
    "get_codec",
    "get_limits",
    "limits",
    "list_codecs",
    "register_codec",
    "set_limits",
    "validate",
]
