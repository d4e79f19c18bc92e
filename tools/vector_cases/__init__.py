"""Golden-vector cases for ``specs/vectors/`` and the helpers that build them.

Every module in this package whose name does not start with ``_`` is a *case module*. It defines:

``VALID``: a list of ``(name, make)``. ``make()`` returns ``(payload_bytes, input)``: a payload that
    must validate and decode, and the input it was encoded from (an array, or for a bundle a dict
    of name to array; ``None`` when the payload was edited by hand and no single input exists).
    ``make`` must be deterministic: fixed inputs (see :func:`ramp`, :func:`uniform_values`), fixed
    seeds, no clocks.

``INVALID``: a list of ``(name, make_bad, error_class_name, rule)``. ``make_bad()`` returns bytes that
    both ``gcodec.validate`` and ``gcodec.decode`` must reject with exactly ``gcodec.<error_class_name>``
    (the most specific class, compared with ``type(e).__name__``), and ``rule`` names the spec rule
    that fires (``"F7"``, ``"C3"``, ``"U2"``). Build bad payloads by editing real ones and recomputing
    every CRC that the intended rule does not concern (:func:`edit` does this), so that the intended
    rule is the first one a reader hits. A fifth element, a dict of :class:`gcodec.Limits` fields,
    checks the case under those limits instead of the defaults (a vector at the edge of a limit that
    a reader may raise, such as ``max_nesting``'s cap of 1000); the manifest records it as ``limits``.

Names are ``[a-z0-9_]+`` and unique across all modules; a codec family prefixes its names with its
codec id (``qsgd_...``). ``tools/make_vectors.py --write`` turns the cases into files, and
``tests/test_vectors.py`` checks the committed files against them.

The helpers below never use NumPy's random distributions (their streams may change between NumPy
versions): inputs come from a SplitMix64 counter and exact power-of-two scaling, so every platform
computes the same bits.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

import gcodec
from gcodec.arrays import BFLOAT16
from gcodec.checksum import crc32c
from gcodec.format.header import pack_canonical

__all__ = [
    "PREAMBLE",
    "Parts",
    "align8",
    "assemble",
    "bits_array",
    "bundle",
    "edit",
    "encode",
    "header_of",
    "relayout",
    "section_blobs",
    "split",
    "splitmix64",
    "uniform_values",
]

PREAMBLE = struct.Struct("<4sBBHII")


# --------------------------------------------------------------------------------------------
# deterministic inputs


def splitmix64(seed: int, n: int) -> np.ndarray:
    """``n`` outputs of SplitMix64 started at ``seed`` (uint64, identical on every platform)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_values(n: int, seed: int, dtype: Any = np.float32, *, scale_exp: int = 0) -> np.ndarray:
    """``n`` values in ``[-2**scale_exp, 2**scale_exp)``, exactly representable in ``dtype``.

    The significand width matches the dtype (53/24/11/8 bits for float64/32/16/bfloat16), so the
    array is built by exact integer arithmetic and one exact conversion.
    """
    dt = np.dtype(dtype)
    mant = {np.dtype(np.float64): 53, np.dtype(np.float32): 24, np.dtype(np.float16): 11, BFLOAT16: 8}[dt]
    u = splitmix64(seed, n) >> np.uint64(64 - mant)  # mant random bits
    ints = u.astype(np.int64) - (1 << (mant - 1))  # [-2**(mant-1), 2**(mant-1))
    vals = np.ldexp(ints.astype(np.float64), scale_exp - (mant - 1))  # exact
    return vals.astype(dt)


def bits_array(bits: Sequence[int], dtype: Any) -> np.ndarray:
    """An array of ``dtype`` from explicit bit patterns (for NaN, -0.0, subnormals)."""
    dt = np.dtype(dtype)
    ut = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize]
    return np.array(bits, dtype=ut).view(dt)


# --------------------------------------------------------------------------------------------
# encoding


def encode(codec: str, x: Any, *, checksum: bool = True, meta: Mapping[str, str] | None = None, **params: Any) -> bytes:
    """``gcodec.get_codec(codec, **params).encode(x)`` as ``bytes``."""
    return bytes(gcodec.get_codec(codec, **params).encode(x, checksum=checksum, meta=meta))


def bundle(tensors: Mapping[str, Any], codecs: Mapping[str, Any], **kw: Any) -> bytes:
    """``gcodec.encode_bundle`` as ``bytes``; ``codecs`` maps names to codec ids or codec objects."""
    return bytes(gcodec.encode_bundle(tensors, dict(codecs), **kw))


# --------------------------------------------------------------------------------------------
# taking payloads apart and putting them back together


def align8(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclasses.dataclass
class Parts:
    """A payload split into its fields (no checks beyond what is needed to find them)."""

    magic: bytes
    major: int
    minor: int
    flags: int
    header_length: int
    header_crc: int
    header: bytes  # the msgpack header bytes
    header_pad: bytes  # zero bytes between the header and the data area
    data: bytes  # the data area (sections and their padding)
    payload_crc: bytes | None  # the 4 CRC bytes, or None when flag bit 0 is clear


def split(payload: bytes) -> Parts:
    """Split a well-formed payload into :class:`Parts`."""
    magic, major, minor, flags, hlen, hcrc = PREAMBLE.unpack_from(payload, 0)
    hdr = payload[16 : 16 + hlen]
    start = align8(16 + hlen)
    end = len(payload) - (4 if flags & 1 else 0)
    crc = payload[end:] if flags & 1 else None
    return Parts(magic, major, minor, flags, hlen, hcrc, hdr, payload[16 + hlen : start], payload[start:end], crc)


def header_of(payload: bytes) -> dict[str, Any]:
    """The header of a payload as a plain dict (parsed without any checks)."""
    p = split(payload)
    return msgpack.unpackb(p.header, raw=False, strict_map_key=False)


def section_blobs(payload: bytes) -> list[list[bytes]]:
    """The bytes of every section, per tensor, in header order."""
    p = split(payload)
    h = msgpack.unpackb(p.header, raw=False)
    return [[p.data[s[2] : s[2] + s[3]] for s in t["sections"]] for t in h["tensors"]]


def relayout(header: dict[str, Any], blobs: Sequence[Sequence[bytes]]) -> tuple[dict[str, Any], bytes]:
    """Give each section of ``header`` the bytes in ``blobs`` and lay them out as a writer does.

    Section offsets are the running end rounded up to 8, ``nbytes`` is the blob's length,
    ``data_length`` the end of the last section rounded up to 8, and padding is zero. Returns the
    updated header and the data area.
    """
    out = bytearray()
    for t, tb in zip(header["tensors"], blobs, strict=True):
        for s, b in zip(t["sections"], tb, strict=True):
            out += bytes(align8(len(out)) - len(out))
            s[2], s[3] = len(out), len(b)
            out += b
    out += bytes(align8(len(out)) - len(out))
    header["data_length"] = len(out)
    return header, bytes(out)


def assemble(
    header: dict[str, Any] | bytes,
    data: bytes,
    *,
    magic: bytes = b"GCDC",
    major: int = 1,
    minor: int = 0,
    flags: int = 1,
    header_length: int | None = None,
    header_crc: int | None = None,
    header_pad: bytes | None = None,
    payload_crc: bytes | None = None,
) -> bytes:
    """Build a payload from its parts. CRCs are computed unless given; ``header`` dicts are packed canonically.

    ``flags`` bit 0 decides whether a payload CRC is appended.
    """
    hb = header if isinstance(header, bytes) else pack_canonical(header)
    hlen = len(hb) if header_length is None else header_length
    pad = bytes(align8(16 + len(hb)) - 16 - len(hb)) if header_pad is None else header_pad
    pre12 = PREAMBLE.pack(magic, major, minor, flags, hlen, 0)[:12]
    hcrc = crc32c(hb, crc32c(pre12)) if header_crc is None else header_crc
    body = PREAMBLE.pack(magic, major, minor, flags, hlen, hcrc) + hb + pad + data
    if flags & 1:
        body += struct.pack("<I", crc32c(pad + data)) if payload_crc is None else payload_crc
    return body


def edit(
    payload: bytes,
    *,
    header: Callable[[dict[str, Any]], dict[str, Any] | bytes | None] | bytes | None = None,
    data: Callable[[bytearray], bytes | bytearray | None] | bytes | None = None,
    **preamble: Any,
) -> bytes:
    """A copy of ``payload`` with its header and/or data area changed, all CRCs recomputed.

    ``header`` is new header bytes, or a function that edits the parsed header dict in place (or
    returns a replacement dict or raw bytes). ``data`` is a new data area, or a function that edits
    a ``bytearray`` of it in place. ``preamble`` keywords (``magic``, ``major``, ``minor``,
    ``flags``, ``header_length``, ``header_crc``, ``header_pad``, ``payload_crc``) go to
    :func:`assemble`; unspecified preamble fields keep the original's values.
    """
    p = split(payload)
    hdr: dict[str, Any] | bytes = p.header
    if callable(header):
        h = msgpack.unpackb(p.header, raw=False)
        r = header(h)
        hdr = h if r is None else r
    elif header is not None:
        hdr = header
    body: bytes = p.data
    if callable(data):
        d = bytearray(p.data)
        r2 = data(d)
        body = bytes(d if r2 is None else r2)
    elif data is not None:
        body = data
    kw: dict[str, Any] = {"magic": p.magic, "major": p.major, "minor": p.minor, "flags": p.flags}
    kw.update(preamble)
    return assemble(hdr, body, **kw)
