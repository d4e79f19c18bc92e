"""Configurable size limits, checked before anything is allocated.

A payload comes from another machine and must be treated as untrusted. Every size it declares
(header length, number of tensors and sections, dimensions, elements, output bytes) is checked
against a :class:`Limits` object before memory is reserved for it. The same limits apply on encode, so
a sender cannot produce a payload its peers would refuse.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import numpy as np

from .deprecation import REMOVED_IN, renamed_names
from .errors import ConfigError, LimitExceededError

__all__ = ["MAX_NESTING_CAP", "NUMPY_MAXDIMS", "Limits", "get_limits", "scoped_limits", "set_limits"]

#: The most dimensions a NumPy array can have (64 since NumPy 2.0, 32 before).
NUMPY_MAXDIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32

#: The largest ``max_nesting`` (specs/format.md F8): below the 1024 levels where common msgpack
#: parsers stop, so that a reader built on one can honour any limit a peer may use. gcodec's own
#: header reader and writer walk with explicit stacks and reach it whatever Python's frame limit.
MAX_NESTING_CAP = 1000


@dataclasses.dataclass(frozen=True)
class Limits:
    """Upper bounds on what one payload may declare.

    The defaults are those of a receiver of untrusted payloads: any single gradient tensor of up to
    2**28 elements and 1 GiB decoded (one layer of a multi-billion-parameter model; a DDP bucket is
    25 MiB) is admitted, while a 200-byte payload cannot make a receiver allocate more than 1 GiB
    of output plus 2 GiB of temporaries, or spend more than about 2**32 multiply-adds. A receiver
    that expects bigger tensors raises them: ``gcodec.scoped_limits(max_elements=2**31,
    max_output_bytes=8 << 30)``. See docs/limits.md.

    Attributes:
        max_header_bytes: largest msgpack header accepted (1 MiB).
        max_tensors: most tensors in one bundle.
        max_sections: most sections in one payload, all tensors together.
        max_ndim: most dimensions of one tensor.
        max_elements: most elements of one tensor.
        max_output_bytes: most bytes the decoded tensors of one payload may take, all together.
        max_payload_bytes: largest payload accepted or produced.
        max_nesting: deepest nesting of maps and arrays inside the header (at most 1000).
        max_header_containers: most maps and arrays in one header (2**17). Each costs a Python object
            of 60-250 bytes for one to a few msgpack bytes, so this bounds what parsing a hostile header
            can allocate: at most 32 x max_header_bytes + 112 x max_header_containers bytes (the
            header's part of the memory bound of docs/limits.md).
        max_decode_work: most multiply-adds the decode of one payload may take, all tensors together
            (numel per tensor; numel*k for ``dct``; m*n*rank for a low-rank PowerSGD tensor:
            specs/format.md §9.1).
        max_scratch_bytes: most bytes of temporaries (beyond the outputs) that decoding or validating
            one tensor may allocate: index and value arrays of sparse codecs, a float32 staging buffer
            for 16-bit outputs, factor copies of PowerSGD (per codec: specs/format.md §9.1).
    """

    max_header_bytes: int = 1 << 20
    max_tensors: int = 65536
    max_sections: int = 1 << 18
    max_ndim: int = 32
    max_elements: int = 1 << 28
    max_output_bytes: int = 1 << 30
    max_payload_bytes: int = 1 << 31
    max_nesting: int = 8
    max_header_containers: int = 1 << 17
    max_decode_work: int = 1 << 32
    max_scratch_bytes: int = 1 << 31

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if type(v) is not int or v < 0:
                raise ConfigError(f"Limits.{f.name} must be a non-negative integer, got {v!r}")
        if self.max_nesting > MAX_NESTING_CAP:
            raise ConfigError(
                f"Limits.max_nesting={self.max_nesting} is above the cap of specs/format.md F8 (msgpack parsers "
                f"stop at 1024 levels); use at most {MAX_NESTING_CAP}"
            )

    def check_ndim(self, ndim: int, where: str = "") -> None:
        """``max_ndim``, capped at what NumPy can represent whatever the configured value."""
        self.check("ndim", ndim, "max_ndim", where)
        if ndim > NUMPY_MAXDIMS:
            loc = f" at {where}" if where else ""
            raise LimitExceededError(
                f"ndim {ndim} exceeds NumPy's {NUMPY_MAXDIMS} dimensions{loc} (no limit can raise this)"
            )

    def check(self, what: str, value: int, limit_name: str, where: str = "") -> None:
        """Raise :class:`LimitExceededError` when ``value`` exceeds the named limit."""
        limit = getattr(self, limit_name)
        if value > limit:
            loc = f" at {where}" if where else ""
            raise LimitExceededError(f"{what} {value} exceeds {limit_name}={limit}{loc}; {how_to_raise(limit_name)}")


def how_to_raise(limit_name: str) -> str:
    """The hint every LimitExceededError message ends with."""
    return (
        f"if the payload is trusted, raise the limit: gcodec.scoped_limits({limit_name}=...) for a block, "
        f"limits=gcodec.Limits({limit_name}=...) for one call, or gcodec.set_limits(...)"
    )


_current = Limits()


def get_limits() -> Limits:
    """The limits in force for calls that do not pass their own."""
    return _current


def set_limits(new: Limits) -> Limits:
    """Replace the process-wide limits; returns the previous ones."""
    global _current
    if not isinstance(new, Limits):
        raise TypeError("set_limits expects a gcodec.Limits")
    old, _current = _current, new
    return old


@contextmanager
def scoped_limits(**changes: int) -> Iterator[Limits]:
    """Change some limits for a block: ``with gcodec.scoped_limits(max_elements=10**6): ...``
    (restored on exit, even on an exception; blocks nest)."""
    old = set_limits(dataclasses.replace(_current, **changes))
    try:
        yield _current
    finally:
        set_limits(old)


__getattr__ = renamed_names("gcodec.limits", {"limits": ("scoped_limits", scoped_limits)})


class _LimitsModule(types.ModuleType):
    """This module, still callable for a while: ``gcodec.limits(...)``, the old spelling of
    :func:`scoped_limits`, warns (a module that is also a function hid what the call does)."""

    def __call__(self, **changes: int) -> AbstractContextManager[Limits]:
        warnings.warn(
            f"gcodec.limits(...) is renamed gcodec.scoped_limits(...); calling the module goes in gcodec {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        return scoped_limits(**changes)


sys.modules[__name__].__class__ = _LimitsModule
