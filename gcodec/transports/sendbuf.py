"""Send buffers: the one place where a transport turns a tensor into a payload.

Transports keep one buffer per (key, slot) and hand it to :func:`encode_into` every step, so that a
steady job stops allocating (a fresh payload buffer page-faults on first touch, which halves the
speed of a memory-bound encode). Until the core grows an ``encode(..., out=buf)``, the buffer is
only a size hint and a fresh payload is returned; switching to the core's buffer-reusing encode is
a change to this function alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import Codec
from ..feedback import ErrorFeedback

__all__ = ["SendBuffers", "encode_into"]


def encode_into(encoder: Codec | ErrorFeedback, x: np.ndarray, key: str, step: int, buf: np.ndarray | None) -> Any:
    """Encode ``x`` (with ``encoder``'s error feedback when it is an :class:`~gcodec.ErrorFeedback`).

    ``buf`` is the caller's reusable buffer for this (key, slot), or None. Returns the payload.
    """
    if isinstance(encoder, ErrorFeedback):
        return encoder.encode(x, key, step=step)
    return encoder.encode(x, key=key, step=step)


class SendBuffers:
    """Reusable send buffers by (key, slot); :meth:`get` returns the buffer kept for it, if any."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, int], np.ndarray] = {}

    def get(self, key: str, slot: int) -> np.ndarray | None:
        return self._bufs.get((key, slot))

    def keep(self, key: str, slot: int, payload: Any) -> None:
        """Remember the payload's buffer as this slot's send buffer for the next step."""
        self._bufs[(key, slot)] = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload

    def clear(self) -> None:
        self._bufs.clear()
