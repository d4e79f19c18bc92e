"""Wire format v1: preamble, canonical msgpack header, aligned raw sections, CRC32C.

This module knows bytes, not algorithms. A codec describes the sections it wants (name, element
type, byte length) and fills them; this module lays them out, checks them and hands them back as
zero-copy NumPy views. ``specs/format.md`` is the normative description; the rule numbers in
error messages (``F7``) refer to it.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import kernels
from ..alloc import out_of_memory
from ..arrays import backend_of
from ..checksum import crc32c
from ..errors import (
    ChecksumError,
    ConfigError,
    FormatError,
    HeaderError,
    LayoutError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
)
from ..excerpt import short
from ..limits import Limits, get_limits
from ..sections import SECTION_DTYPES, SectionInfo, SectionSpec, TensorEntry
from .header import check_tree, count_containers, pack_canonical, unpack_strict

__all__ = [
    "ALIGN",
    "FLAG_PAYLOAD_CRC",
    "KNOWN_FEATURES",
    "MAGIC",
    "MAJOR",
    "MINOR",
    "PREAMBLE_SIZE",
    "SECTION_DTYPES",
    "Header",
    "ParsedPayload",
    "PendingTensor",
    "SectionInfo",
    "SectionSpec",
    "TensorEntry",
    "align_up",
    "read_payload",
    "write_payload",
]

MAGIC = b"GCDC"
MAJOR = 1
MINOR = 0
FLAG_PAYLOAD_CRC = 0x0001
_KNOWN_FLAGS = FLAG_PAYLOAD_CRC
PREAMBLE_SIZE = 16
ALIGN = 8
_PREAMBLE = struct.Struct("<4sBBHII")

#: Required features this reader implements (none are defined in format 1.0).
KNOWN_FEATURES: frozenset[str] = frozenset()

_TENSOR_KEYS = frozenset({"codec", "version", "dtype", "shape", "params", "sections", "name"})
_TOP_KEYS = frozenset({"tensors", "data_length", "features", "meta"})
_TENSOR_DTYPES = ("float32", "float16", "bfloat16", "float64")


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclasses.dataclass(frozen=True)
class Header:
    tensors: tuple[TensorEntry, ...]
    data_length: int
    features: tuple[str, ...] = ()
    meta: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def is_bundle(self) -> bool:
        return bool(self.tensors) and self.tensors[0].name is not None

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tensors": [t.to_wire() for t in self.tensors],
            "data_length": self.data_length,
        }
        if self.features:
            d["features"] = list(self.features)
        if self.meta:
            d["meta"] = self.meta  # read only: packed (F11) or counted, never changed
        return d


@dataclasses.dataclass
class PendingTensor:
    """What a codec hands the writer: the header record (without offsets) and a fill callback.

    ``fill`` receives a mapping from section name to a writable NumPy view of exactly the declared
    length and element type, and must write every element.
    """

    codec: str
    version: int
    dtype: str
    shape: tuple[int, ...]
    params: dict[str, Any]
    sections: Sequence[SectionSpec]
    fill: Callable[[Mapping[str, np.ndarray]], None]
    name: str | None = None
    backend: str = "cpu"  # where the tensor lives: the payload is written in that backend's memory


# --------------------------------------------------------------------------------------------
# writing


def write_payload(
    tensors: Sequence[PendingTensor],
    *,
    meta: Mapping[str, str] | None = None,
    checksum: bool = True,
    limits: Limits | None = None,
    alloc: Callable[[int], np.ndarray] | None = None,
) -> memoryview:
    """Lay out and fill a payload; returns a writable ``memoryview`` of its bytes.

    ``alloc(nbytes)`` provides the payload's memory: a 1-D uint8 array of exactly ``nbytes`` (a slice
    of a reused send buffer, say). Default: fresh memory of the tensors' backend (``np.empty`` for
    host tensors; one device buffer for CUDA tensors, returned as a ``DevicePayload``). Every byte is
    written, padding included, so the memory need not be zeroed.
    """
    lim = limits or get_limits()
    # Step 1: section offsets, packed in order at ALIGN-byte boundaries of the data area.
    entries: list[TensorEntry] = []
    pos = 0
    for t in tensors:
        infos = []
        for s in t.sections:
            if s.dtype not in SECTION_DTYPES or s.nbytes % SECTION_DTYPES[s.dtype].itemsize:
                raise ValueError(f"codec {t.codec} declared a bad section {s}")
            pos = align_up(pos)
            infos.append(SectionInfo(s.name, s.dtype, pos, s.nbytes))
            pos += s.nbytes
        entries.append(TensorEntry(t.codec, t.version, t.dtype, tuple(t.shape), dict(t.params), tuple(infos), t.name))
    data_length = align_up(pos)
    header = Header(tuple(entries), data_length, (), dict(meta or {}))
    _check_header(header, lim)
    wire = header.to_wire()
    hbytes = pack_canonical(wire)
    lim.check("header length", len(hbytes), "max_header_bytes")
    lim.check("header maps and arrays", count_containers(wire), "max_header_containers")

    # Step 2: one allocation for the whole payload; zero exactly the padding bytes.
    data_start = align_up(PREAMBLE_SIZE + len(hbytes))
    total = data_start + data_length + (4 if checksum else 0)
    lim.check("payload size", total, "max_payload_bytes")
    backends = {t.backend for t in tensors}
    if len(backends) > 1:
        raise ConfigError(f"a payload's tensors must all live on one backend, got {sorted(backends)}")
    backend = backends.pop() if backends else "cpu"
    buf = kernels.get(backend).memory.alloc(total) if alloc is None else alloc(total)
    if buf.dtype != np.uint8 or tuple(buf.shape) != (total,):
        raise ValueError(f"payload allocator returned {buf.dtype} {buf.shape}, not uint8 ({total},)")
    # The buffer's backend does the memory work: host bytes for NumPy buffers, device memory for CUDA
    # buffers (the header is built here, on the host, and copied once; sections are filled in place).
    M = kernels.of(buf).memory
    if kernels.of(buf) is not kernels.get(backend):
        raise ConfigError(f"the tensors live on {backend!r} but the payload buffer does not; give out= of that kind")
    flags = FLAG_PAYLOAD_CRC if checksum else 0
    pre = _PREAMBLE.pack(MAGIC, MAJOR, MINOR, flags, len(hbytes), 0)
    hcrc = crc32c(hbytes, crc32c(pre[:12]))
    pad = bytes(data_start - PREAMBLE_SIZE - len(hbytes))
    M.put(buf, 0, _PREAMBLE.pack(MAGIC, MAJOR, MINOR, flags, len(hbytes), hcrc) + hbytes + pad)
    end = 0
    for t, e in zip(tensors, entries):
        views = {}
        for si in e.sections:
            M.zero(buf, data_start + end, data_start + si.offset)
            lo = data_start + si.offset
            views[si.name] = M.view(buf, lo, lo + si.nbytes, SECTION_DTYPES[si.dtype])
            end = si.offset + si.nbytes
        t.fill(views)
    M.zero(buf, data_start + end, data_start + data_length)

    # Step 3: the payload checksum covers everything after the header.
    if checksum:
        M.crc32c_store(buf, PREAMBLE_SIZE + len(hbytes), data_start + data_length, total - 4)
    return M.result(buf)


# --------------------------------------------------------------------------------------------
# reading


@dataclasses.dataclass(frozen=True)
class ParsedPayload:
    """A payload whose container has been checked; sections are views into ``buffer``."""

    header: Header
    buffer: np.ndarray  # the whole payload as uint8: host bytes, or the backend's device array
    data_start: int
    minor: int
    flags: int
    header_length: int

    @property
    def checksummed(self) -> bool:
        return bool(self.flags & FLAG_PAYLOAD_CRC)

    def view(self, section: SectionInfo) -> np.ndarray:
        start = self.data_start + section.offset
        raw = self.buffer[start : start + section.nbytes]
        return raw.view(SECTION_DTYPES[section.dtype])

    def views(self, entry: TensorEntry) -> dict[str, np.ndarray]:
        """The entry's sections as views of the payload's memory (device views for a device payload)."""
        return {s.name: self.view(s) for s in entry.sections}

    @property
    def on_host(self) -> bool:
        return isinstance(self.buffer, np.ndarray)

    def host_views(self, entry: TensorEntry) -> dict[str, np.ndarray]:
        """The entry's sections in host memory: :meth:`views` for a host payload; for a device
        payload one copy of the bytes from the entry's first section to its last (counted in the
        backend's ``transferred()``), for a codec whose checks or decoding run on the host."""
        if self.on_host or not entry.sections:
            return self.views(entry)
        first, last = entry.sections[0], entry.sections[-1]
        lo = self.data_start + first.offset
        h = kernels.of(self.buffer).memory.to_host(self.buffer[lo : self.data_start + last.offset + last.nbytes])
        out = {}
        for s in entry.sections:
            o = s.offset - first.offset
            out[s.name] = h[o : o + s.nbytes].view(SECTION_DTYPES[s.dtype])
        return out


def read_payload(buf: Any, *, limits: Limits | None = None, verify_checksum: bool = True) -> ParsedPayload:
    """Check the container (rules F1-F15 of specs/format.md) and parse the header."""
    lim = limits or get_limits()
    # The payload is read where it lies (host bytes, or device memory: docs/gpu.md, "Decoding a
    # device payload"); only the preamble, the header and the stored CRC are copied out of it.
    M = kernels.get(backend_of(buf)).memory
    b = M.payload_bytes(buf)
    n = int(b.shape[0])
    lim.check("payload size", n, "max_payload_bytes")
    # F1-F4: preamble.
    if n < PREAMBLE_SIZE:
        raise FormatError(f"F1: payload is {n} bytes, shorter than the {PREAMBLE_SIZE}-byte preamble")
    pre = M.host_bytes(b, 0, PREAMBLE_SIZE)
    magic, major, minor, flags, hlen, hcrc = _PREAMBLE.unpack(pre)
    if magic != MAGIC:
        raise FormatError(f"F2: bad magic {magic!r} @ byte 0 (expected {MAGIC!r})")
    if major != MAJOR:
        raise UnsupportedVersionError(f"F3: format version {major}.{minor} @ byte 4; this reader supports {MAJOR}.x")
    if flags & ~_KNOWN_FLAGS:
        raise UnsupportedFeatureError(f"F4: unknown flag bits 0x{flags & ~_KNOWN_FLAGS:04x} @ byte 6")
    # F5-F7: header bytes and their checksum.
    if hlen == 0:
        raise HeaderError("F5: header length is 0 @ byte 8")
    lim.check("header length", hlen, "max_header_bytes", "byte 8")
    if PREAMBLE_SIZE + hlen > n:
        raise LayoutError(f"F6: header of {hlen} bytes runs past the end of a {n}-byte payload")
    hbytes = M.host_bytes(b, PREAMBLE_SIZE, PREAMBLE_SIZE + hlen)
    got = crc32c(hbytes, crc32c(pre[:12]))
    if got != hcrc:
        raise ChecksumError(f"F7: header CRC32C mismatch @ byte 12: stored 0x{hcrc:08x}, computed 0x{got:08x}")
    # F8-F11: header content. Its Python objects are many small allocations that the header limits
    # bound (docs/limits.md, "The parsed header"); a process short of even that much memory gets the
    # allocator's LimitExceededError, as for any buffer a payload sizes (gcodec/alloc.py).
    try:
        raw = unpack_strict(hbytes, lim)
        header = _parse_header(raw, lim, strict_keys=minor <= MINOR)
        unknown = [f for f in header.features if f not in KNOWN_FEATURES]
        if unknown:
            raise UnsupportedFeatureError(f"F10: payload requires unknown feature(s) {short(unknown)}")
        canonical = minor > MINOR or pack_canonical(header.to_wire()) == hbytes
    except MemoryError:
        raise out_of_memory(f"the Python objects of a parsed {hlen}-byte header") from None
    if not canonical:
        raise HeaderError("F11: header is not in canonical form (key order, integer or float width, or defaults)")
    # F12-F13: layout.
    _check_layout(header)
    data_start = align_up(PREAMBLE_SIZE + hlen)
    expected = data_start + header.data_length + (4 if flags & FLAG_PAYLOAD_CRC else 0)
    if n < expected:
        raise LayoutError(f"F13: payload truncated: {n} bytes, header declares {expected}")
    if n > expected:
        raise LayoutError(f"F13: {n - expected} unexpected trailing byte(s) after byte {expected}")
    # F14: payload checksum.
    if flags & FLAG_PAYLOAD_CRC and verify_checksum:
        (stored,) = struct.unpack("<I", M.host_bytes(b, n - 4, n))
        got = M.crc32c(b, PREAMBLE_SIZE + hlen, n - 4)
        if got != stored:
            # name the bytes the CRC covers (a flipped byte is somewhere in them), not only its own offset
            raise ChecksumError(
                f"F14: payload CRC32C mismatch: a byte in {PREAMBLE_SIZE + hlen}..{n - 5} (the padding after "
                f"the header and the sections) differs from what was written; stored 0x{stored:08x} @ byte "
                f"{n - 4}, computed 0x{got:08x}"
            )
    # F15: padding is zero.
    parsed = ParsedPayload(header, b, data_start, minor, flags, hlen)
    _check_padding(parsed)
    return parsed


def _check_padding(p: ParsedPayload) -> None:
    gaps = [(PREAMBLE_SIZE + p.header_length, p.data_start)]
    end = 0
    for t in p.header.tensors:
        for s in t.sections:
            gaps.append((p.data_start + end, p.data_start + s.offset))
            end = s.offset + s.nbytes
    gaps.append((p.data_start + end, p.data_start + p.header.data_length))
    bad = kernels.of(p.buffer).memory.first_nonzero(p.buffer, gaps)
    if bad >= 0:
        raise LayoutError(f"F15: non-zero padding byte @ byte {bad}")


def _check_layout(h: Header) -> None:
    pos = 0
    for i, t in enumerate(h.tensors):
        for j, s in enumerate(t.sections):
            where = f"tensors[{i}].sections[{j}] ({short(s.name)})"
            want = align_up(pos)
            if s.offset < pos:
                raise LayoutError(f"F12: {where} at offset {s.offset} overlaps the previous section ending at {pos}")
            if s.offset != want:
                raise LayoutError(f"F12: {where} at offset {s.offset} leaves a gap; expected offset {want}")
            pos = s.offset + s.nbytes
    if h.data_length != align_up(pos):
        raise LayoutError(f"F12: data_length {h.data_length} does not match the sections' end {align_up(pos)}")


def _want(cond: bool, msg: str) -> None:
    if not cond:
        raise HeaderError(msg)


def _uint(v: Any, where: str) -> int:
    _want(type(v) is int and v >= 0, f"F9: {where} must be a non-negative integer, got {short(v)}")
    return v


def _parse_header(raw: Any, lim: Limits, *, strict_keys: bool) -> Header:
    """F9: the header's schema. Unknown keys are an error unless the payload's minor is newer."""
    _want(isinstance(raw, dict), "F9: header must be a msgpack map")
    if strict_keys:
        extra = sorted(set(raw) - _TOP_KEYS)
        _want(not extra, f"F9: unknown header key(s) {short(extra)}")
    _want("tensors" in raw, "F9: header lacks 'tensors'")
    _want("data_length" in raw, "F9: header lacks 'data_length'")
    data_length = _uint(raw["data_length"], "data_length")
    lim.check("data_length", data_length, "max_payload_bytes", "data_length")
    features = raw.get("features", [])
    _want(
        isinstance(features, list) and all(isinstance(f, str) for f in features),
        "F9: features must be a list of strings",
    )
    if "features" in raw:
        _want(bool(features), "F9: an empty 'features' list must be omitted")
    meta = raw.get("meta", {})
    _want(
        isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()),
        "F9: meta must map text to text",
    )
    if "meta" in raw:
        _want(bool(meta), "F9: an empty 'meta' map must be omitted")
    tensors = raw["tensors"]
    _want(isinstance(tensors, list) and len(tensors) >= 1, "F9: tensors must be a non-empty list")
    lim.check("tensor count", len(tensors), "max_tensors", "tensors")
    entries = tuple(_parse_tensor(t, i, lim, strict_keys) for i, t in enumerate(tensors))
    named = [e.name is not None for e in entries]
    _want(all(named) or not any(named), "F9: either every tensor has a name (bundle) or none does")
    _want(all(named) or len(entries) == 1, "F9: a payload of several tensors must name each one")
    if all(named):
        names = [e.name for e in entries]
        _want(len(set(names)) == len(names), "F9: tensor names in a bundle must be unique")
    nsec = sum(len(e.sections) for e in entries)
    lim.check("section count", nsec, "max_sections", "tensors[*].sections")
    total_out = sum(e.numel * _np_dtype(e.dtype).itemsize for e in entries)
    lim.check("decoded size in bytes", total_out, "max_output_bytes")
    # the parsed map itself, not a copy: a header may be mostly meta
    return Header(entries, data_length, tuple(features), meta)


def _np_dtype(name: str) -> np.dtype:
    from ..arrays import DTYPES

    return DTYPES[name]


def _parse_tensor(t: Any, i: int, lim: Limits, strict_keys: bool) -> TensorEntry:
    w = f"tensors[{i}]"
    _want(isinstance(t, dict), f"F9: {w} must be a map")
    if strict_keys:
        extra = sorted(set(t) - _TENSOR_KEYS)
        _want(not extra, f"F9: unknown key(s) {short(extra)} in {w}")
    for k in ("codec", "version", "dtype", "shape", "params", "sections"):
        _want(k in t, f"F9: {w} lacks {k!r}")
    codec = t["codec"]
    _want(isinstance(codec, str) and codec != "", f"F9: {w}.codec must be a non-empty string")
    version = _uint(t["version"], f"{w}.version")
    dtype = t["dtype"]
    _want(dtype in _TENSOR_DTYPES, f"F9: {w}.dtype {short(dtype)} is not one of {list(_TENSOR_DTYPES)}")
    shape = t["shape"]
    _want(isinstance(shape, list), f"F9: {w}.shape must be a list")
    lim.check_ndim(len(shape), f"{w}.shape")
    numel = 1
    for j, d in enumerate(shape):
        _uint(d, f"{w}.shape[{j}]")
        lim.check("dimension", d, "max_elements", f"{w}.shape[{j}]")
        numel *= d
    lim.check("element count", numel, "max_elements", f"{w}.shape")
    params = t["params"]
    _want(isinstance(params, dict), f"F9: {w}.params must be a map")
    name = t.get("name")
    _want("name" not in t or isinstance(name, str), f"F9: {w}.name must be a string")
    secs = t["sections"]
    _want(isinstance(secs, list), f"F9: {w}.sections must be a list")
    lim.check("section count", len(secs), "max_sections", f"{w}.sections")
    infos = []
    seen = set()
    for j, s in enumerate(secs):
        sw = f"{w}.sections[{j}]"
        _want(isinstance(s, list) and len(s) == 4, f"F9: {sw} must be [name, dtype, offset, nbytes]")
        sname, sdt, off, nb = s
        _want(isinstance(sname, str) and sname != "", f"F9: {sw} name must be a non-empty string")
        _want(sname not in seen, f"F9: {sw} repeats section name {short(sname)}")
        seen.add(sname)
        _want(
            isinstance(sdt, str) and sdt in SECTION_DTYPES,
            f"F9: {sw} element type {short(sdt)} is not one of {list(SECTION_DTYPES)}",
        )
        _uint(off, f"{sw} offset")
        _uint(nb, f"{sw} nbytes")
        if nb % SECTION_DTYPES[sdt].itemsize:
            raise LayoutError(f"F12: {sw} length {nb} is not a multiple of its element size")
        infos.append(SectionInfo(sname, sdt, off, nb))
    return TensorEntry(codec, version, dtype, tuple(shape), params, tuple(infos), name)


def _check_header(h: Header, lim: Limits) -> None:
    """On encode: every limit a reader applies (F5, F8, F9), so peers never refuse what we write."""
    lim.check("tensor count", len(h.tensors), "max_tensors")
    for i, t in enumerate(h.tensors):
        lim.check_ndim(len(t.shape), f"tensors[{i}].shape")
        lim.check("element count", t.numel, "max_elements", f"tensors[{i}].shape")
    lim.check("section count", sum(len(t.sections) for t in h.tensors), "max_sections")
    total_out = sum(t.numel * _np_dtype(t.dtype).itemsize for t in h.tensors)
    lim.check("decoded size in bytes", total_out, "max_output_bytes")
    check_tree(h.to_wire(), lim.max_nesting)
