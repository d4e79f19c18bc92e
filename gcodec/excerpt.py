"""Quoting header content in error messages without echoing megabytes of it back.

A quoted value may come from a header nested up to ``max_nesting`` = 1000 levels (specs/format.md
F8), deeper than Python's ``repr`` can go (it stops at the interpreter's frame limit with
``RecursionError``), or hold a string or a list of a million entries. :func:`short` therefore writes
the text itself, with an explicit stack, and stops as soon as it has ``limit`` characters.
"""

from __future__ import annotations

from typing import Any

__all__ = ["QUOTE_LIMIT", "short"]

#: The most characters of one quoted value (a list of keys, a string from a header) in a message.
QUOTE_LIMIT = 200

_OPEN: dict[type, tuple[str, str]] = {list: ("[", "]"), tuple: ("(", ")"), dict: ("{", "}")}


def _scalar(obj: Any, limit: int) -> str:
    """repr of a non-container, cut: a long string or bytes is quoted from its first ``limit`` items."""
    if isinstance(obj, (str, bytes)) and len(obj) > limit:
        return repr(obj[:limit])
    try:
        return repr(obj)
    except ValueError:  # an int too long for str() (sys.set_int_max_str_digits)
        return f"<int of {obj.bit_length()} bits>" if isinstance(obj, int) else f"<{type(obj).__name__}>"


def short(obj: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(obj)`` cut to ``limit`` characters, ending in "…" when cut.

    Lists, tuples and dicts (of any depth and length) are written as ``repr`` writes them, but
    only up to the first ``limit + 1`` characters; other values use their own ``repr``.
    """
    parts: list[str] = []
    size = 0
    # Each entry: an iterator over the items still to write at one level. An item is either text
    # (a bracket, a separator) or a value.
    stack: list[Any] = [iter((obj,))]
    while stack and size <= limit:
        try:
            item = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if type(item) is _Text:
            text = str(item)
        elif type(item) in _OPEN:
            opening, closing = _OPEN[type(item)]
            text = opening
            stack.append(_members(item, closing))
        else:
            text = _scalar(item, limit)
        parts.append(text)
        size += len(text)
    out = "".join(parts)
    return out if len(out) <= limit else out[: limit - 1] + "…"


class _Text(str):
    """Literal text among the values to quote."""


_SEP, _COLON = _Text(", "), _Text(": ")


def _members(c: Any, closing: str) -> Any:
    """The members of a list, tuple or dict, with their separators, then the closing bracket."""
    if isinstance(c, dict):
        for j, (k, v) in enumerate(c.items()):
            if j:
                yield _SEP
            yield k
            yield _COLON
            yield v
    else:
        for j, v in enumerate(c):
            if j:
                yield _SEP
            yield v
        if isinstance(c, tuple) and len(c) == 1:
            yield _Text(",")
    yield _Text(closing)
