"""gcodec: gradient-compression codecs with a versioned, validated wire format.

>>> import gcodec, numpy as np
>>> codec = gcodec.get_codec("uniform", bits=8, group_size=64)
>>> buf = codec.encode(np.linspace(-1, 1, 1000, dtype=np.float32))
>>> gcodec.validate(buf).codec
'uniform'
>>> y = gcodec.decode(buf)

Layers, bottom-up (the import contract in pyproject.toml enforces them): :mod:`gcodec.arrays`,
:mod:`gcodec.sections`, :mod:`gcodec.layout` (plain facts) → :mod:`gcodec.kernels` (hot loops per
backend) → :mod:`gcodec.codecs` (algorithms) → :mod:`gcodec.format` (bytes) → :mod:`gcodec.api`
(payloads) → interop, CLI, demo. See docs/architecture.md and specs/.
"""

from __future__ import annotations

from . import limits  # the module (calling it, the old scoped_limits, is deprecated)
from .aggregate import sum_payloads
from .api import (
    PayloadInfo,
    TensorInfo,
    decode,
    decode_bundle,
    encode,
    encode_bundle,
    inspect_header,
    validate,
)
from .codecs import Aggregation, Codec, codec_class, get_codec, list_codecs, register_codec
from .codecs.state import CodecState
from .elements import ElementCodes, element_codes
from .errors import (
    BufferTooSmallError,
    ChecksumError,
    ConfigError,
    FormatError,
    GcodecError,
    HeaderError,
    LayoutError,
    LimitExceededError,
    PayloadValueError,
    ProtocolOrderError,
    SizeMismatchError,
    UnknownCodecError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
    WaitTimeoutError,
)
from .feedback import ErrorFeedback
from .limits import Limits, get_limits, scoped_limits, set_limits
from .threads import get_num_threads, num_threads, set_num_threads

__version__ = "0.1.0"

__all__ = [
    "Aggregation",
    "BufferTooSmallError",
    "ChecksumError",
    "Codec",
    "CodecState",
    "ConfigError",
    "ElementCodes",
    "ErrorFeedback",
    "FormatError",
    "GcodecError",
    "HeaderError",
    "LayoutError",
    "LimitExceededError",
    "Limits",
    "PayloadInfo",
    "PayloadValueError",
    "ProtocolOrderError",
    "SizeMismatchError",
    "TensorInfo",
    "UnknownCodecError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "WaitTimeoutError",
    "codec_class",
    "decode",
    "decode_bundle",
    "element_codes",
    "encode",
    "encode_bundle",
    "get_codec",
    "get_limits",
    "get_num_threads",
    "inspect_header",
    "limits",
    "list_codecs",
    "num_threads",
    "register_codec",
    "scoped_limits",
    "set_limits",
    "set_num_threads",
    "sum_payloads",
    "validate",
]
