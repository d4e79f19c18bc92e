"""The error hierarchy.

Every problem with a payload, a header, a limit or a configuration raises a subclass of
:class:`GcodecError`, which itself derives from :class:`ValueError`. Callers that decode bytes from
untrusted peers can therefore catch ``GcodecError`` and be sure nothing else escapes.

Messages say *what* is wrong and *where*: a header field name (``tensors[0].shape``) or a byte
offset (``@ byte 24``).
"""

from __future__ import annotations

__all__ = [
    "ChecksumError",
    "ConfigError",
    "FormatError",
    "GcodecError",
    "HeaderError",
    "LayoutError",
    "LimitExceededError",
    "PayloadValueError",
    "ProtocolOrderError",
    "SizeMismatchError",
    "UnknownCodecError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "WaitTimeoutError",
]


class GcodecError(ValueError):
    """Base class of every error gcodec raises on bad input or configuration."""


class FormatError(GcodecError):
    """The bytes are not a gcodec payload: bad magic, too short, bad preamble."""


class UnsupportedVersionError(FormatError):
    """The payload's major format version is newer than this reader supports."""


class UnsupportedFeatureError(FormatError):
    """The payload requires a feature (or sets a flag) that this reader does not know."""


class HeaderError(FormatError):
    """The msgpack header is malformed, not canonical, or has a bad field."""


class UnknownCodecError(HeaderError):
    """The codec id in the header (or given to ``get_codec``) is not registered."""


class LimitExceededError(GcodecError):
    """A size declared by the payload (or requested by the caller) exceeds a configured limit."""


class LayoutError(FormatError):
    """Sections overlap, leave gaps, are misaligned, have non-zero padding, or run past the end."""


class SizeMismatchError(LayoutError):
    """A section's size disagrees with what the codec's params and the tensor's shape imply."""


class ChecksumError(FormatError):
    """A CRC32C does not match: the bytes were corrupted in transit or storage."""


class PayloadValueError(GcodecError):
    """A value inside a section (or an input value) is not allowed, e.g. a NaN scale."""


class ConfigError(GcodecError):
    """A codec was configured with bad parameters, or ``out=`` does not fit."""


class ProtocolOrderError(ConfigError):
    """Ranks of a compressed collective are not at the same message: one ran an exchange the others
    did not, or sent something that is not a gcodec control message where one was due."""


class WaitTimeoutError(GcodecError, RuntimeError):
    """``wait(timeout=...)`` on a compressed collective's work ran out before the exchange ended.
    The exchange is not cancelled: it goes on in the background (its peers are still in it), and a
    later ``wait()`` returns its result. A ``RuntimeError`` too, as torch's ``Work.wait`` raises."""


class BufferTooSmallError(ConfigError):
    """``encode(..., out=buf)``: the payload does not fit in ``buf``; ``needed`` says how many bytes do."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed
