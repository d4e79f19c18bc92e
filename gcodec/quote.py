"""Quoting header content in error messages without echoing megabytes of it back."""

from __future__ import annotations

from typing import Any

__all__ = ["QUOTE_LIMIT", "short"]

#: The most characters of one quoted value (a list of keys, a string from a header) in a message.
QUOTE_LIMIT = 200


def short(obj: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(obj)`` cut to ``limit`` characters, ending in "…" when cut."""
    if isinstance(obj, (list, tuple)) and len(obj) > limit:
        obj = obj[:limit]  # repr of the head only: never build the text of a huge list
    elif isinstance(obj, str) and len(obj) > limit:
        obj = obj[:limit]
        return repr(obj)[: limit - 1] + "…"
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 1] + "…"
