"""Canonical msgpack for the payload header: one way to write it, a strict way to read it.

Canonical form (specs/format.md §3): maps have text keys sorted by their UTF-8 bytes with no
duplicates; integers use the shortest msgpack encoding; floats are float64; strings are msgpack
``str`` (never ``bin``); no ext types. Two headers with the same content are therefore byte-equal,
and a reader can detect a non-canonical header by re-encoding what it parsed.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ..errors import HeaderError, LimitExceededError
from ..limits import Limits, how_to_raise

__all__ = ["MSGPACK_MAX_DEPTH", "canonical", "count_containers", "pack_canonical", "unpack_strict"]

#: msgpack refuses deeper nesting itself (StackError), whatever max_nesting says.
MSGPACK_MAX_DEPTH = 1024


def canonical(obj: Any, depth: int = 0) -> Any:
    """Return ``obj`` with every dict's keys sorted by UTF-8 bytes (recursively)."""
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, str):
                raise HeaderError(f"header map keys must be text, got {type(k).__name__}")
            items.append((k.encode("utf-8"), k, canonical(v, depth + 1)))
        items.sort(key=lambda t: t[0])
        return {k: v for _, k, v in items}
    if isinstance(obj, (list, tuple)):
        return [canonical(v, depth + 1) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj
    raise HeaderError(f"value of type {type(obj).__name__} cannot go in a header")


def pack_canonical(obj: Any) -> bytes:
    """Encode ``obj`` as canonical msgpack."""
    try:
        return msgpack.packb(canonical(obj), use_bin_type=True, use_single_float=False, strict_types=False)
    except (OverflowError, ValueError, TypeError) as e:
        if isinstance(e, HeaderError):
            raise
        raise HeaderError(f"header cannot be encoded: {e}") from None


def _no_duplicates(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in pairs:
        if k in out:
            raise HeaderError(f"F8: duplicate key {k!r} in header map")
        out[k] = v
    return out


def count_containers(obj: Any) -> int:
    """How many maps and arrays ``obj`` holds, itself included (what max_header_containers counts)."""
    if isinstance(obj, dict):
        return 1 + sum(count_containers(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return 1 + sum(count_containers(v) for v in obj)
    return 0


def check_tree(obj: Any, limit: int, depth: int = 0) -> None:
    """F8: nesting depth within ``limit``; only nil, bool, int, float, str, array and map (text keys)."""
    if depth > limit:
        raise LimitExceededError(f"F8: header nesting deeper than max_nesting={limit}; {how_to_raise('max_nesting')}")
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise HeaderError(f"F8: header map key {k!r} is not text")
            check_tree(v, limit, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            check_tree(v, limit, depth + 1)
    elif not (obj is None or isinstance(obj, (bool, int, float, str))):
        raise HeaderError(
            f"F8: header holds a msgpack {type(obj).__name__}; only nil, bool, int, float, str, "
            "array and map are allowed"
        )


class _ContainerBudget:
    """Counts the maps and arrays msgpack builds and stops the parse past ``max_header_containers``:
    an empty map or array is one byte of msgpack but 60-80 bytes of Python object."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.limit = limit

    def _take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise LimitExceededError(
                f"F8: header holds more than max_header_containers={self.limit} maps and arrays; "
                f"{how_to_raise('max_header_containers')}"
            )

    def array(self, items: list[Any]) -> list[Any]:
        self._take()
        return items

    def map(self, pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        self._take()
        return _no_duplicates(pairs)


def unpack_strict(data: bytes | memoryview, limits: Limits) -> Any:
    """Parse one msgpack object, refusing duplicates, ext, bin, trailing bytes, deep nesting and more
    than ``max_header_containers`` maps and arrays."""
    n = len(data)
    budget = _ContainerBudget(limits.max_header_containers)
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            list_hook=budget.array,
            object_pairs_hook=budget.map,
            max_str_len=n,
            max_bin_len=0,
            max_array_len=n,  # the counts are limits, checked (LimitExceededError) after parsing
            max_map_len=n,
            max_ext_len=0,
        )
    except (HeaderError, LimitExceededError):
        raise
    except msgpack.StackError:
        raise LimitExceededError(
            f"F8: header nesting exceeds msgpack's {MSGPACK_MAX_DEPTH} levels (max_nesting={limits.max_nesting}, "
            "at most 1000)"
        ) from None
    except msgpack.ExtraData:
        raise HeaderError("F8: header has bytes after its msgpack object") from None
    except UnicodeDecodeError as e:
        raise HeaderError(f"F8: a header string is not valid UTF-8 (byte {e.start} of that string)") from None
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as e:
        raise HeaderError(f"F8: header is not valid msgpack: {e}") from None
    check_tree(obj, limits.max_nesting)
    return obj
