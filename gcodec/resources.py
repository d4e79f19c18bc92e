"""Resource accounting of a decode, checked against :class:`gcodec.Limits` before anything is allocated.

Besides its outputs (``max_output_bytes``), decoding one tensor allocates temporaries whose size
comes from the header: k-sized index and value arrays of the sparse codecs, PowerSGD's factor copies,
and a float32 staging buffer when the output is 16-bit. Their bound,
:meth:`Codec.decode_scratch_bytes` plus the staging buffer, is checked against
``max_scratch_bytes``, and the work :meth:`Codec.decode_work` against ``max_decode_work`` (all
tensors of a payload together). The same checks run on encode, so a sender cannot produce a payload
its peers with the same limits refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .arrays import DTYPES
from .codecs.registry import codec_class
from .errors import GcodecError
from .format.container import MINOR, PREAMBLE_SIZE, PendingTensor, TensorEntry, read_payload
from .limits import Limits, get_limits

__all__ = [
    "CONTAINER_COST",
    "HEADER_BYTE_COST",
    "MEMORY_SLACK",
    "check_pending_resources",
    "check_resources",
    "memory_bound",
    "scratch_bytes",
    "staging_bytes",
]

#: Bytes of Python objects per byte of msgpack header and per map or array in it, at most: what
#: parsing, checking (F9, F11) and describing (PayloadInfo) the costliest valid headers measured
#: (docs/limits.md, "Memory while decoding": a map of 2-character parameter names under a newer
#: minor, 29 bytes per header byte; 131 072 one-entry maps, 31 MiB for 640 KiB; a bundle of 12 000
#: empty tensors, 28 MiB for 0.95 MiB), with about 10 % to spare.
HEADER_BYTE_COST = 32
CONTAINER_COST = 112

#: What no payload size accounts for: the value checks' chunks (``first_bad`` of gcodec/kernels/cpu/memory.py), the
#: small objects of a call.
MEMORY_SLACK = 1 << 20


def staging_bytes(numel: int, out_dtype: Any) -> int:
    """The float32 staging buffer of a 16-bit output (none for float32/float64 outputs)."""
    return 4 * numel if np.dtype(out_dtype).itemsize == 2 else 0


def scratch_bytes(cls: Any, params: dict[str, Any], entry: TensorEntry) -> int:
    """Temporaries of decoding ``entry`` into an array of its own dtype."""
    return cls.decode_scratch_bytes(params, entry) + staging_bytes(entry.numel, DTYPES[entry.dtype])


def check_resources(cls: Any, params: dict[str, Any], entry: TensorEntry, lim: Limits, where: str) -> None:
    lim.check("decode scratch bytes", scratch_bytes(cls, params, entry), "max_scratch_bytes", where)


def check_pending_resources(pending: Sequence[PendingTensor], lim: Limits) -> None:
    """On encode: what a receiver with the same limits will check (scratch per tensor, total work)."""
    work = 0
    for i, t in enumerate(pending):
        cls = codec_class(t.codec)
        e = TensorEntry(t.codec, t.version, t.dtype, tuple(t.shape), dict(t.params), (), t.name)
        where = f"tensors[{i}]"
        check_resources(cls, e.params, e, lim, where)
        work += cls.decode_work(e.params, e)
        lim.check("decode work (multiply-adds)", work, "max_decode_work", where)


def _header_bytes(buf: Any, lim: Limits) -> tuple[int, int]:
    """(H, C): the header length a reader would parse from ``buf`` (0 when it would not), and an upper
    bound on the maps and arrays in it: the bytes that could open one (each container opened has
    its own type byte), at most ``max_header_containers``."""
    try:
        b = np.frombuffer(memoryview(buf).cast("B"), np.uint8)
    except (TypeError, ValueError):
        return 0, 0
    if b.shape[0] < PREAMBLE_SIZE:
        return 0, 0
    h = int.from_bytes(bytes(b[8:12]), "little")
    h = max(0, min(h, b.shape[0] - PREAMBLE_SIZE, lim.max_header_bytes))
    hb = b[PREAMBLE_SIZE : PREAMBLE_SIZE + h]
    opening = int(np.count_nonzero((hb >= 0x80) & (hb <= 0x9F))) + int(
        np.count_nonzero(hb >= 0xDC) - np.count_nonzero(hb >= 0xE0)
    )
    return h, min(opening, lim.max_header_containers)


def memory_bound(buf: Any, *, limits: Limits | None = None) -> int:
    """The most ``validate``, ``decode`` or ``inspect_header`` of ``buf`` allocates (docs/limits.md,
    "Memory while decoding"), decoding into arrays of the declared dtypes:

        decoded bytes of all tensors + the largest scratch of one tensor
        + HEADER_BYTE_COST x H + CONTAINER_COST x C + MEMORY_SLACK

    with H the header's length and C its maps and arrays. A payload that a reader refuses counts only
    what it allocates before the refusal: the tensors whose record rules (C0-C3, limits) pass; the
    decoded bytes only when every record passes (decode allocates outputs after checking them all).
    ``buf`` is bytes-like (a host payload; a device payload is read where it lies, docs/gpu.md).
    """
    lim = limits or get_limits()
    h, c = _header_bytes(buf, lim)
    bound = HEADER_BYTE_COST * h + CONTAINER_COST * c + MEMORY_SLACK
    try:
        p = read_payload(buf, limits=lim)
    except GcodecError:
        return bound
    scratch = out = work = 0
    for i, e in enumerate(p.header.tensors):  # the record rules in the reader's order (api._checked)
        where = f"tensors[{i}]"
        try:
            cls = codec_class(e.codec)
            if not 1 <= e.version <= cls.version:
                return bound + scratch
            params = cls.check_entry(e, where, strict=p.minor <= MINOR)
            check_resources(cls, params, e, lim, where)
            work += cls.decode_work(params, e)
            lim.check("decode work (multiply-adds)", work, "max_decode_work", where)
        except GcodecError:
            return bound + scratch
        scratch = max(scratch, scratch_bytes(cls, params, e))
        out += e.numel * DTYPES[e.dtype].itemsize
    return bound + scratch + out
