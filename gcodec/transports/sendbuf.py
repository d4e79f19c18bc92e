"""Send buffers: the one place where a transport turns a tensor into a payload.

Transports keep one buffer per (key, slot) and encode into it every step (``gcodec.encode(...,
out=buf)``), so that a steady job stops allocating: a fresh payload buffer page-faults on first
touch, which halves the speed of a memory-bound encode. A payload that does not fit (variable-size
codecs such as ``threshold``) gets a buffer a quarter larger than it needs, kept from then on.

Buffers live where the tensor lives: a device tensor gets a device send buffer (the payload is
written in device memory and handed to the engine as it is), a host tensor a host one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import xp
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
    buf = bufs.get(key, slot, x)
    if buf is not None:
        try:
            return _encode(encoder, x, key, step, buf, checksum)
        except BufferTooSmallError as e:
            buf = bufs.grow(key, slot, e.needed, x)
            return _encode(encoder, x, key, step, buf, checksum)
    payload = _encode(encoder, x, key, step, None, checksum)
    bufs.grow(key, slot, len(payload), x)  # ready for the next step: this one is already written
    return payload


class SendBuffers:
    """Reusable send buffers by (key, slot), and work arrays by key, on the memory of the tensor
    they serve (``like``: any array there; None is host memory)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, int], Any] = {}
        self._scratch: dict[str, Any] = {}

    def get(self, key: str, slot: int, like: Any = None) -> Any:
        """The buffer of (key, slot), if it has one on ``like``'s memory."""
        buf = self._bufs.get((key, slot))
        if buf is not None and like is not None and xp.backend(buf) != xp.backend(like):
            return None  # the tensor moved (host <-> device): a buffer there is made on the next grow
        return buf

    def grow(self, key: str, slot: int, needed: int, like: Any = None) -> Any:
        """A new buffer for (key, slot) with room for ``needed`` bytes and a quarter more."""
        n = needed + needed // 4 + 64
        buf = self._bufs[(key, slot)] = np.empty(n, np.uint8) if like is None else xp.empty(like, n, np.uint8)
        return buf

    def scratch(self, key: str, n: int, dtype: np.dtype, like: Any) -> Any:
        """A flat work array of ``n`` elements kept per key across steps (a fresh one would
        page-fault on every step), on ``like``'s memory."""
        a = self._scratch.get(key)
        if a is None or a.shape[0] != n or a.dtype != dtype or xp.backend(a) != xp.backend(like):
            a = self._scratch[key] = xp.empty(like, n, dtype)
        return a

    def clear(self) -> None:
        self._bufs.clear()
        self._scratch.clear()
