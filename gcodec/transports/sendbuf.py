"""Send buffers: the one place where a transport turns a tensor into a payload.

Transports keep one buffer per (key, slot) and encode into it every step (``gcodec.encode(...,
out=buf)``), so that a steady job stops allocating: a fresh payload buffer page-faults on first
touch, which halves the speed of a memory-bound encode. A payload that does not fit (variable-size
codecs such as ``threshold``) gets a buffer a quarter larger than it needs, kept from then on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..api import encode
from ..codecs import Codec
from ..errors import BufferTooSmallError
from ..feedback import ErrorFeedback

__all__ = ["SendBuffers", "encode_into"]


def _encode(encoder: Codec | ErrorFeedback, x: np.ndarray, key: str, step: int, out: Any, checksum: bool) -> Any:
    if isinstance(encoder, ErrorFeedback):
        return encoder.encode(x, key, step=step, out=out, checksum=checksum)
    return encode(x, encoder, key=key, step=step, out=out, checksum=checksum)


def encode_into(
    encoder: Codec | ErrorFeedback,
    x: np.ndarray,
    key: str,
    step: int,
    bufs: SendBuffers | None,
    slot: int = 0,
    *,
    checksum: bool = True,
) -> Any:
    """Encode ``x`` (with ``encoder``'s error feedback when it is an :class:`~gcodec.ErrorFeedback`)
    into the send buffer kept in ``bufs`` for (key, slot); returns the payload, a view of that buffer.

    The payload stays valid until the next encode of the same (key, slot). ``bufs=None``: a fresh
    payload every call. ``checksum=False`` for payloads that never leave this process (summable
    mode sends values, not payloads).
    """
    if bufs is None:
        return _encode(encoder, x, key, step, None, checksum)
    buf = bufs.get(key, slot)
    if buf is not None:
        try:
            return _encode(encoder, x, key, step, buf, checksum)
        except BufferTooSmallError as e:
            buf = bufs.grow(key, slot, e.needed)
            return _encode(encoder, x, key, step, buf, checksum)
    payload = _encode(encoder, x, key, step, None, checksum)
    bufs.grow(key, slot, len(payload))  # ready for the next step: this one is already written
    return payload


class SendBuffers:
    """Reusable send buffers by (key, slot)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, int], np.ndarray] = {}

    def get(self, key: str, slot: int) -> np.ndarray | None:
        return self._bufs.get((key, slot))

    def grow(self, key: str, slot: int, needed: int) -> np.ndarray:
        """A new buffer for (key, slot) with room for ``needed`` bytes and a quarter more."""
        buf = self._bufs[(key, slot)] = np.empty(needed + needed // 4 + 64, np.uint8)
        return buf

    def clear(self) -> None:
        self._bufs.clear()
