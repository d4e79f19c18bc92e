"""Canonical msgpack for the payload header: one way to write it, a strict way to read it.

Canonical form (specs/format.md §5): maps have text keys sorted by their UTF-8 bytes with no
duplicates; integers use the shortest msgpack encoding; floats are float64; strings are msgpack
``str`` (never ``bin``); no ext types. Two headers with the same content are therefore byte-equal,
and a reader can detect a non-canonical header by re-encoding what it parsed (F11).

Both directions are written here, without recursion: F8 admits headers nested up to
``max_nesting`` = 1000 levels, deeper than Python's own frame limit (1000 frames, some of them
already taken by the caller), so a recursive walk would raise ``RecursionError`` on a header the
spec says must parse. msgpack-python's pure-Python fallback (``MSGPACK_PUREPYTHON=1``, or wherever
its C extension is missing) recurses once per level in both its unpacker and its packer; its C
extension does not, but stops at 1024 levels with its own errors. Reading and writing headers
with explicit stacks gives the same F8 behaviour on every installation, and the reader refuses a
too-deep or too-large header while parsing, before building what it declares.
"""

from __future__ import annotations

import struct
from typing import Any

from ..errors import HeaderError, LimitExceededError
from ..limits import Limits, how_to_raise

__all__ = ["MSGPACK_MAX_DEPTH", "check_tree", "count_containers", "pack_canonical", "unpack_strict"]

#: Standard msgpack parsers (msgpack-python's C extension among them) stop at 1024 levels; F8 caps
#: ``max_nesting`` below that so that every allowed limit can be honoured by any reader.
MSGPACK_MAX_DEPTH = 1024

_B1 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")


# --------------------------------------------------------------------------------------------
# walks over a header object (explicit stacks: a header may be 1000 levels deep)


def _children(obj: Any) -> Any:
    """The direct children of a map or array, in order (a map gives its values), else None."""
    if isinstance(obj, dict):
        return obj.values()
    if isinstance(obj, (list, tuple)):
        return obj
    return None


def count_containers(obj: Any) -> int:
    """How many maps and arrays ``obj`` holds, itself included (what max_header_containers counts)."""
    n = 0
    todo = [obj]
    while todo:
        o = todo.pop()
        kids = _children(o)
        if kids is not None:
            n += 1
            todo.extend(kids)
    return n


def check_tree(obj: Any, limit: int) -> None:
    """F8 on an object about to be written: nesting depth within ``limit``; only nil, bool, int,
    float, str, array and map (text keys). Visits in document order, so the first problem found is
    the first one a reader would meet."""
    # (iterator over a container's children, their depth, whether they are a map's (key, value) pairs)
    stack: list[tuple[Any, int, bool]] = [(iter((obj,)), 0, False)]
    while stack:
        it, depth, pairs = stack[-1]
        try:
            item = next(it)
        except StopIteration:
            stack.pop()
            continue
        if pairs:
            k, item = item
            if not isinstance(k, str):
                raise HeaderError(f"F8: header map key {_type_word(k)} is not text")
        if depth > limit:
            raise LimitExceededError(
                f"F8: header nesting deeper than max_nesting={limit}; {how_to_raise('max_nesting')}"
            )
        if isinstance(item, dict):
            stack.append((iter(item.items()), depth + 1, True))
        elif isinstance(item, (list, tuple)):
            stack.append((iter(item), depth + 1, False))
        elif not (item is None or isinstance(item, (bool, int, float, str))):
            raise HeaderError(
                f"F8: header holds a {type(item).__name__}; only nil, bool, int, float, str, array and map are allowed"
            )


def _type_word(v: Any) -> str:
    """A short name for a value in a message: never the repr of what may be a deep container."""
    return type(v).__name__ if isinstance(v, (dict, list, tuple, bytes)) else repr(v)[:40]


# --------------------------------------------------------------------------------------------
# writing


def _pack_int(v: int, out: bytearray) -> None:
    if v >= 0:
        if v < 0x80:
            out.append(v)
        elif v < 0x100:
            out += b"\xcc" + _B1.pack(v)
        elif v < 0x10000:
            out += b"\xcd" + _U16.pack(v)
        elif v < 0x100000000:
            out += b"\xce" + _U32.pack(v)
        elif v < 0x10000000000000000:
            out += b"\xcf" + _U64.pack(v)
        else:
            raise HeaderError(f"header cannot be encoded: integer {v} does not fit in 64 bits")
    elif v >= -32:
        out.append(v & 0xFF)
    elif v >= -0x80:
        out += b"\xd0" + _I8.pack(v)
    elif v >= -0x8000:
        out += b"\xd1" + _I16.pack(v)
    elif v >= -0x80000000:
        out += b"\xd2" + _I32.pack(v)
    elif v >= -0x8000000000000000:
        out += b"\xd3" + _I64.pack(v)
    else:
        raise HeaderError(f"header cannot be encoded: integer {v} does not fit in 64 bits")


def _pack_str(s: str, out: bytearray) -> None:
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        raise HeaderError("header cannot be encoded: a string is not valid Unicode (a lone surrogate)") from None
    n = len(b)
    if n < 32:
        out.append(0xA0 | n)
    elif n < 0x100:
        out += b"\xd9" + _B1.pack(n)
    elif n < 0x10000:
        out += b"\xda" + _U16.pack(n)
    elif n < 0x100000000:
        out += b"\xdb" + _U32.pack(n)
    else:
        raise HeaderError("header cannot be encoded: a string of 4 GiB or more")
    out += b


def _pack_len(n: int, fix: int, c16: bytes, c32: bytes, out: bytearray) -> None:
    if n < 16:
        out.append(fix | n)
    elif n < 0x10000:
        out += c16 + _U16.pack(n)
    elif n < 0x100000000:
        out += c32 + _U32.pack(n)
    else:
        raise HeaderError("header cannot be encoded: an array or map of 2**32 entries or more")


def _map_items(d: dict[Any, Any]) -> Any:
    """§5 rule 2: a map's keys and values, alternately, keys sorted by their UTF-8 bytes.

    For strings that can be encoded at all (no lone surrogates, which _pack_str refuses), UTF-8
    byte order is code point order, which is how Python compares str: sorting the keys themselves
    gives the canonical order without building their encodings (what F11 re-encodes can be a 1 MiB
    header of small maps)."""
    for k in d:
        if not isinstance(k, str):
            raise HeaderError(f"header map keys must be text, got {type(k).__name__}")
    for k in sorted(d):
        yield k
        yield d[k]


#: How many distinct strings :func:`pack_canonical` keeps the encoding of: the keys of tensor
#: records, sections and params repeat in every record; a bound keeps a header of a million
#: distinct strings from doubling its cost.
_STRING_CACHE = 256


def pack_canonical(obj: Any) -> bytes:
    """Encode ``obj`` as canonical msgpack (specs/format.md §5), iteratively.

    Only nil, bool, int, float, str, list/tuple and dict with text keys go in a header; anything
    else, an integer beyond 64 bits, or nesting beyond :data:`MSGPACK_MAX_DEPTH` levels (no reader
    parses it; this also stops a container that holds itself) is a :class:`HeaderError`.
    """
    out = bytearray()
    strings: dict[str, bytes] = {}  # encodings of the first strings seen: record keys repeat
    # Each entry: an iterator over what is still to be written at that level. A map's iterator
    # yields its keys and values alternately, in canonical key order.
    stack: list[Any] = [iter((obj,))]
    while stack:
        for o in stack[-1]:
            t = type(o)
            if t is str:
                enc = strings.get(o)
                if enc is not None:
                    out += enc
                elif len(strings) < _STRING_CACHE:
                    tmp = bytearray()
                    _pack_str(o, tmp)
                    enc = strings[o] = bytes(tmp)
                    out += enc
                else:
                    _pack_str(o, out)
            elif t is int:
                if 0 <= o < 0x80:
                    out.append(o)
                else:
                    _pack_int(o, out)
            elif t is list or t is tuple or t is dict or isinstance(o, (list, tuple, dict)):
                if len(stack) > MSGPACK_MAX_DEPTH:
                    raise HeaderError(f"header cannot be encoded: nested deeper than {MSGPACK_MAX_DEPTH} levels")
                if isinstance(o, dict):
                    _pack_len(len(o), 0x80, b"\xde", b"\xdf", out)
                    stack.append(_map_items(o))
                else:
                    _pack_len(len(o), 0x90, b"\xdc", b"\xdd", out)
                    stack.append(iter(o))
                break  # go on with the new innermost container
            elif o is None:
                out.append(0xC0)
            elif isinstance(o, bool):
                out.append(0xC3 if o else 0xC2)
            elif isinstance(o, int):
                _pack_int(int(o), out)
            elif isinstance(o, float):
                out += b"\xcb" + _F64.pack(o)
            elif isinstance(o, str):
                _pack_str(str(o), out)
            else:
                raise HeaderError(f"value of type {type(o).__name__} cannot go in a header")
        else:
            stack.pop()
    return bytes(out)


# --------------------------------------------------------------------------------------------
# reading

#: type byte -> (kind, size of the length or value field); kinds below. Fixed-size scalars read
#: their value from the field; str, array and map read their length from it.
_STR, _ARR, _MAP, _UINT, _INT, _F4, _F8 = range(7)
_WIDE = {
    0xCA: (_F4, 4),
    0xCB: (_F8, 8),
    0xCC: (_UINT, 1),
    0xCD: (_UINT, 2),
    0xCE: (_UINT, 4),
    0xCF: (_UINT, 8),
    0xD0: (_INT, 1),
    0xD1: (_INT, 2),
    0xD2: (_INT, 4),
    0xD3: (_INT, 8),
    0xD9: (_STR, 1),
    0xDA: (_STR, 2),
    0xDB: (_STR, 4),
    0xDC: (_ARR, 2),
    0xDD: (_ARR, 4),
    0xDE: (_MAP, 2),
    0xDF: (_MAP, 4),
}
_FIELD = {1: _B1, 2: _U16, 4: _U32, 8: _U64}
_SIGNED = {1: _I8, 2: _I16, 4: _I32, 8: _I64}
_NO_VALUE: dict[int, str] = {
    0xC1: "the type byte 0xc1, which msgpack never uses",
    **{t: "a bin value (F8: no bin in a header)" for t in (0xC4, 0xC5, 0xC6)},
    **{t: "an ext value (F8: no ext in a header)" for t in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8)},
}


def _malformed(what: str) -> HeaderError:
    return HeaderError(f"F8: header is not valid msgpack: {what}")


def unpack_strict(data: bytes | memoryview, limits: Limits) -> Any:
    """Parse one msgpack object under every rule of F8, without recursion.

    Refused while parsing, before anything is built for what they declare: an object deeper than
    ``max_nesting`` and more than ``max_header_containers`` maps and arrays (``LimitExceededError``);
    the type byte 0xc1, bin and ext values, a length longer than the bytes left, a map key that is
    not a string, a repeated key, invalid UTF-8, a truncated object and bytes after the object
    (``HeaderError``).
    """
    b = bytes(data)
    n = len(b)
    max_depth = limits.max_nesting
    containers_left = limits.max_header_containers
    # The open containers, innermost last: [list or dict, elements still to read, pending map key]
    # (the pending key is _KEY while a map's next item is a key, None for an array). The elements
    # of the innermost container are at depth len(stack).
    stack: list[list[Any]] = []
    top: list[Any] | None = None
    i = 0
    while True:
        try:
            t = b[i]
        except IndexError:
            raise _malformed("truncated (an object is missing at the end)") from None
        i += 1
        # ---- one object: a scalar in ``obj``, or a non-empty container opened (then ``continue``)
        if 0xA0 <= t <= 0xBF:
            ln = t & 0x1F
            if ln > n - i:
                raise _malformed(f"a string of {ln} bytes runs past the end of the header")
            try:
                obj: Any = b[i : i + ln].decode("utf-8")
            except UnicodeDecodeError as e:
                raise HeaderError(f"F8: a header string is not valid UTF-8 (byte {e.start} of that string)") from None
            i += ln
        elif t <= 0x7F:
            obj = t
        elif t <= 0x9F or 0xDC <= t <= 0xDF:
            if top is not None and top[2] is _KEY:
                raise HeaderError("F8: a header map key is an array or map, not text")
            if t <= 0x9F:
                is_map, ln = t <= 0x8F, t & 0x0F
            else:
                size = _WIDE[t][1]
                if i + size > n:
                    raise _malformed("truncated array or map length")
                is_map = t >= 0xDE
                ln = _FIELD[size].unpack_from(b, i)[0]
                i += size
            containers_left -= 1
            if containers_left < 0:
                raise LimitExceededError(
                    f"F8: header holds more than max_header_containers={limits.max_header_containers} maps "
                    f"and arrays; {how_to_raise('max_header_containers')}"
                )
            if ln:
                if len(stack) >= max_depth:  # its elements would lie deeper than max_nesting
                    raise LimitExceededError(
                        f"F8: header nesting deeper than max_nesting={max_depth}; {how_to_raise('max_nesting')}"
                    )
                # every element takes at least one byte, every map entry two
                if (ln + ln if is_map else ln) > n - i:
                    what = "a map" if is_map else "an array"
                    raise _malformed(f"{what} of {ln} entries runs past the end of the header")
                top = [{} if is_map else [], ln, _KEY if is_map else None]
                stack.append(top)
                continue
            obj = {} if is_map else []
        elif t >= 0xE0:
            obj = t - 0x100
        elif t == 0xC0:
            obj = None
        elif t == 0xC2:
            obj = False
        elif t == 0xC3:
            obj = True
        elif t in _WIDE:
            kind, size = _WIDE[t]
            if i + size > n:
                raise _malformed("truncated number or string length")
            if kind == _STR:
                ln = _FIELD[size].unpack_from(b, i)[0]
                i += size
                if ln > n - i:
                    raise _malformed(f"a string of {ln} bytes runs past the end of the header")
                try:
                    obj = b[i : i + ln].decode("utf-8")
                except UnicodeDecodeError as e:
                    raise HeaderError(
                        f"F8: a header string is not valid UTF-8 (byte {e.start} of that string)"
                    ) from None
                i += ln
            else:
                if kind == _UINT:
                    obj = _FIELD[size].unpack_from(b, i)[0]
                elif kind == _INT:
                    obj = _SIGNED[size].unpack_from(b, i)[0]
                elif kind == _F4:
                    obj = _F32.unpack_from(b, i)[0]
                else:
                    obj = _F64.unpack_from(b, i)[0]
                i += size
        else:
            raise _malformed(_NO_VALUE[t]) if t == 0xC1 else HeaderError(f"F8: header holds {_NO_VALUE[t]}")
        # ---- hand the finished object to its container, closing every container it completes
        while True:
            if top is None:
                if i != n:
                    raise HeaderError("F8: header has bytes after its msgpack object")
                return obj
            key = top[2]
            if key is _KEY:
                if type(obj) is not str:
                    raise HeaderError(f"F8: header map key {_type_word(obj)} is not text")
                if obj in top[0]:
                    raise HeaderError(f"F8: duplicate key {obj[:40]!r} in header map")
                top[2] = obj
                break
            if key is None:
                top[0].append(obj)
            else:
                top[0][key] = obj
                top[2] = _KEY
            top[1] -= 1
            if top[1]:
                break
            obj = stack.pop()[0]
            top = stack[-1] if stack else None


class _Key:
    """Marks a map whose next item is a key."""


_KEY = _Key()
