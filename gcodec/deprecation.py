"""Old public names kept for a while under a :class:`DeprecationWarning`.

A renamed public name stays importable from where it was: the module's ``__getattr__`` (PEP 562)
serves it, warns once per use site (Python's default filter), and names its replacement. Old
keyword arguments go through :func:`renamed_kwarg`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: The release that drops the names this module keeps.
REMOVED_IN = "0.3"

#: Old transport ``mode=`` names -> their names now (a mode is named for its protocol, not a codec).
RENAMED_MODES = {"powersgd": "lowrank"}


def renamed_names(module: str, names: Mapping[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (old name -> (new name, object))."""

    def __getattr__(name: str) -> Any:
        if name in names:
            new, value = names[name]
            warnings.warn(
                f"{module}.{name} is renamed {module}.{new}; {name} goes in gcodec {REMOVED_IN}",
                DeprecationWarning,
                stacklevel=2,
            )
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def renamed_kwarg(func: str, old: str, new: str, old_value: Any, new_value: Any, unset: Any) -> Any:
    """The value of keyword ``new`` of ``func`` (whose default is None), taking the deprecated
    ``old`` (default ``unset``) with a warning; both given is a TypeError, as Python says for a
    keyword given twice."""
    if old_value is unset:
        return new_value
    if new_value is not None:
        raise TypeError(f"{func}() got both {new}= and its old name {old}=")
    warnings.warn(
        f"{func}({old}=) is renamed {func}({new}=); {old}= goes in gcodec {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value
