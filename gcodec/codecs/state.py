"""Per-key mutable state of a codec, kept apart from the codec itself.

A codec object is immutable configuration plus a pure algorithm; whatever changes from call to call
lives in a :class:`CodecState` that the caller owns, saves and restores (as torch keeps
``PowerSGDState`` apart from its hook, and zarr keeps its codecs frozen):

* **random streams**: a stochastic codec's stream for one call is ``step`` when the caller passes
  one (all workers passing the same step draw the same stream), otherwise a counter per ``key``
  that starts at 0 and advances by one per encode, refused or not. The stream is written into the
  header, so a payload never depends on the encoder's state to be decoded or checked;
* **arrays per key**: PowerSGD's warm-start Q;
* **children**: the state of a nested codec (``topk`` values, ``powersgd`` factors), one per role.

Who owns one: ``gcodec.encode(x, codec, state=...)`` takes it explicitly; ``codec.encode(x)`` without
``state=`` uses :func:`default_state` of that codec object; :class:`gcodec.ErrorFeedback`, the zarr
and numcodecs adapters and the transports each own theirs. :meth:`CodecState.state_dict` holds plain
ints, strings and NumPy arrays only.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..arrays import backend_of
from ..errors import ConfigError
from ..rng import MASK64

__all__ = ["CodecState", "check_step", "default_state", "owned_array"]


def owned_array(v: Any) -> np.ndarray:
    """A NumPy copy of ``v``: an array, a list, or a CPU torch tensor (a checkpoint loaded by torch)."""
    if type(v).__module__.startswith("torch"):
        v = v.detach().cpu().numpy()
    return np.array(v, copy=True)


def check_step(step: Any) -> int:
    """``step`` as a stream number, or ConfigError when it is not an integer in [0, 2**64)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= int(step) <= MASK64:
        raise ConfigError(f"step must be an integer in [0, 2**64), got {step!r}")
    return int(step)


def _host_copy(v: Any) -> np.ndarray:
    """A host copy of a kept array; device arrays (a device encode's warm-start Q) are copied on
    gcodec's current stream, after its work (a checkpoint is host memory)."""
    if backend_of(v) == "cpu":
        return np.array(v, copy=True)
    return np.asarray(kernels.of(v).launch.host(v))


class CodecState:
    """Stream counters, per-key arrays and nested codecs' states of one codec (thread-safe, picklable)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str | None, int] = {}
        self._arrays: dict[str, dict[str | None, np.ndarray]] = {}
        self._children: dict[str, CodecState] = {}

    # ---- random streams --------------------------------------------------------------------
    def take_stream(self, key: str | None, step: int | None) -> int:
        """The stream for one call: ``step`` if given, else ``key``'s counter (then advanced)."""
        if step is not None:
            return check_step(step)
        with self._lock:
            s = self._streams.get(key, 0)
            self._streams[key] = (s + 1) & MASK64
            return s

    def next_stream(self, key: str | None = None) -> int:
        """The stream the next call for ``key`` without a step will use."""
        with self._lock:
            return self._streams.get(key, 0)

    # ---- arrays per key --------------------------------------------------------------------
    def get_array(self, slot: str, key: str | None) -> np.ndarray | None:
        with self._lock:
            return self._arrays.get(slot, {}).get(key)

    def put_array(self, slot: str, key: str | None, value: np.ndarray) -> None:
        with self._lock:
            self._arrays.setdefault(slot, {})[key] = value

    def copy_key(self, key: str | None, into: CodecState | None = None) -> CodecState:
        """A copy of ``key``'s array in every slot (nothing else), put in ``into`` (a new state by
        default) and returned: what an encode of ``key`` reads, for a trial encode that must not
        move the real state."""
        out = CodecState() if into is None else into
        with self._lock:
            copies = {slot: _host_copy(d[key]) for slot, d in self._arrays.items() if key in d}
        for slot, v in copies.items():
            out.put_array(slot, key, v)
        return out

    # ---- nested codecs ---------------------------------------------------------------------
    def child(self, role: str) -> CodecState:
        """The state of the nested codec in ``role`` (made on first use)."""
        with self._lock:
            c = self._children.get(role)
            if c is None:
                c = self._children[role] = CodecState()
            return c

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"streams": {key: int}, "arrays": {slot: {key: array}}, "children": {role: ...}}``, copied."""
        with self._lock:
            children = dict(self._children)
            out: dict[str, Any] = {
                "streams": dict(self._streams),
                "arrays": {s: {k: _host_copy(v) for k, v in d.items()} for s, d in self._arrays.items()},
            }
        out["children"] = {r: c.state_dict() for r, c in children.items()}
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace everything with what :meth:`state_dict` returned (checked before anything changes)."""
        if not isinstance(state, Mapping):
            raise ConfigError(f"codec state must be a dict, got {type(state).__name__}")
        streams = state.get("streams", {})
        arrays = state.get("arrays", {})
        if not isinstance(streams, Mapping) or not isinstance(arrays, Mapping):
            raise ConfigError("codec state: 'streams' and 'arrays' must be dicts")
        new_streams = {}
        for k, v in streams.items():
            try:
                new_streams[k] = check_step(v)
            except ConfigError:
                raise ConfigError(f"stream state for key {k!r} must be an integer in [0, 2**64), got {v!r}") from None
        new_arrays: dict[str, dict[str | None, np.ndarray]] = {}
        for slot, d in arrays.items():
            if not isinstance(d, Mapping):
                raise ConfigError(f"codec state: arrays[{slot!r}] must be a dict")
            new_arrays[slot] = {k: owned_array(v) for k, v in d.items()}
        children = {}
        for role, sub in dict(state.get("children", {})).items():
            c = CodecState()
            c.load_state_dict(sub)
            children[role] = c
        with self._lock:
            self._streams, self._arrays, self._children = new_streams, new_arrays, children

    def __getstate__(self) -> dict[str, Any]:
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return f"CodecState(streams={len(self._streams)}, arrays={sum(len(d) for d in self._arrays.values())})"


# One default state per codec *object* (not per configuration: two equal codecs built separately
# keep separate counters, as two workers simulated in one process expect). Entries go when the codec
# object is collected.
_DEFAULTS: dict[int, CodecState] = {}
_DEFAULTS_LOCK = threading.Lock()


def default_state(codec: object) -> CodecState:
    """The state ``codec.encode(x)`` uses when no ``state=`` is given: one per codec object."""
    k = id(codec)
    with _DEFAULTS_LOCK:
        st = _DEFAULTS.get(k)
        if st is None:
            st = _DEFAULTS[k] = CodecState()
            weakref.finalize(codec, _DEFAULTS.pop, k, None)
        return st
