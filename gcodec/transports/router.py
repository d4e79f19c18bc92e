"""The router: per parameter and step, which codec, under which group key, with which residual.

Every engine adapter (the DDP hook, FSDP2's reduce-scatter, ``gcodec.torch.all_reduce``,
``gcodec.mpi``) hands its tensors to one :class:`Router` and keeps only what is its own: a DDP
bucket's items, FSDP's row layout. The router owns

* the one policy language (:func:`gcodec.policy.as_policy`: a :class:`~gcodec.policy.Policy`,
  or a callable / ``{pattern: codec}`` dict adapted into :class:`~gcodec.policy.Rules`), asked per
  parameter and step (:meth:`Router.choose`);
* the adaptive controller, when one is given (``controller=``): a stage of its own that decides
  per key with collectives (:meth:`Router.select`), calibrated once when the router is built;
* one codec instance per configuration and one :class:`TransportState` per codec;
* readable group keys (:meth:`Router.group_key`);
* the error-feedback residuals, keyed by (parameter name, element range).

**Residual placement.** A group's residual is stored in its codec's state in one of four *forms*
(``flat``: one residual under the key, in the tensor's shape; ``split``: one flat vector kept as
the two-phase owners' chunks ``key[j/p]``; ``rows``: one vector per destination ``key[j/n]``, as
FSDP's reduce-scatter keeps them; ``lowrank``: one matrix per parameter, PowerSGD's). Each stored
vector is described by its *pieces*: (parameter, first element, last element + 1, slots), laid end
to end, slots beyond the elements being padding. When a group is formed (:meth:`Router.place`) and
any of its parameters' residual lives elsewhere (DDP rebuilt its buckets, FSDP resharded, a policy
or controller moved the parameter to another codec, a checkpoint was loaded at another world size),
the router copies every element range into the new layout: nothing a codec dropped is lost. A
parameter that goes dense, or to a codec without error feedback, gets its pending residual back to
send with this step (:meth:`Router.take`). Two-phase *server* residuals, a second-order correction,
start again from zero.

The chooser must decide the same on every rank; the exchange that follows agrees on the result.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import xp
from ..arrays import dtype_name
from ..codecs import Codec, get_codec
from ..deprecation import REMOVED_IN
from ..errors import ConfigError
from ..feedback import ErrorFeedback
from ..policy import DEFAULTS, Policy, Rules, as_policy, size_rule
from .allreduce import allreduce_protocol, check_call
from .comm import Communicator, Protocol
from .control import Exchange, failed_exchange
from .plan import Group, Item, Piece, Plan, plan
from .protocol_helpers import work_dtype
from .run import dense as run_dense
from .run import joined, run, scatter
from .state import TransportState, check_mode
from .stats import DENSE, KeyRounds, StepStats, ring_bytes
from .two_phase import owner_bounds

__all__ = ["DENSE", "FORMS", "Piece", "Router", "call_protocol", "split_controller"]

#: How a group's residual is stored in its codec's state (module docstring).
FORMS = ("flat", "split", "rows", "lowrank")


@dataclass
class _Store:
    """Where one group's residual lives: state ``ck`` (None: held by the router after a load),
    storage ``key``, its form and the pieces of each stored vector."""

    ck: str | None
    key: str
    form: str
    vectors: tuple[tuple[Piece, ...], ...]
    shape: tuple[int, ...] | None = None  # the flat form's residual shape
    held: list[np.ndarray | None] | None = None

    @property
    def names(self) -> set[str]:
        return {pc.name for v in self.vectors for pc in v}


#: Figures that count whole bytes: a key's share of a group's is rounded, the last key taking the rest.
_BYTE_FIELDS = ("payload_bytes", "wire_bytes", "host_bytes")


def split_controller(policy: Any, controller: Any, stacklevel: int = 3) -> tuple[Any, Any]:
    """``(policy, controller)`` as an engine was given them, with an adaptive controller given as
    the policy (the old form) moved to ``controller``, with a DeprecationWarning (``stacklevel``:
    the engine's caller's frame, counted from here)."""
    if controller is None and hasattr(policy, "select"):
        warnings.warn(
            f"an adaptive controller given as the policy: pass it as controller= (the old form goes in gcodec "
            f"{REMOVED_IN})",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return None, policy
    return policy, controller


class Router:
    """Codec choice, states, group keys and residual placement for one engine (module docstring).

    Args:
        chooser: a :class:`gcodec.policy.Policy`, a callable or a ``{pattern: codec}`` dict
            (adapted with ``codec``, ``min_numel`` and ``dense_1d``), or None for ``codec``
            everywhere. (An adaptive controller given here is taken as ``controller``, with a
            DeprecationWarning.)
        controller: an adaptive controller (:class:`gcodec.adaptive.AdaptiveController`, or any
            object with its ``calibrate`` and ``select`` protocol): it decides per key, with
            collectives of its own, instead of the chooser; calibrated here, at construction (it
            times its codecs as this router runs them), never inside a step.
        codec, min_numel, dense_1d: the shorthand's default codec and size rules
            (:class:`gcodec.policy.Rules`); a Policy decides alone. No size rule by default: a
            tensor handed to ``gcodec.torch.all_reduce`` or ``gcodec.mpi`` is compressed as asked;
            the engines that plan a model's parameters pass :data:`gcodec.policy.DEFAULTS`.
        error_feedback, mode, num_threads, telemetry, decay: as for :class:`TransportState`,
            applied to the state of every codec the chooser picks.
    """

    def __init__(
        self,
        chooser: Any = None,
        *,
        controller: Any = None,
        codec: Codec | str | Mapping[str, Any] | None = DEFAULTS.codec,
        min_numel: int = 0,
        dense_1d: bool = False,
        error_feedback: bool = True,
        mode: str = "auto",
        num_threads: int | None = None,
        telemetry: Any = None,
        decay: float = 1.0,
    ) -> None:
        mode = check_mode(mode)
        self._shorthand: dict[str, Any] = {"codec": codec, "min_numel": min_numel, "dense_1d": dense_1d}
        self.error_feedback, self.mode = bool(error_feedback), mode
        chooser, controller = split_controller(chooser, controller)
        #: the adaptive controller (None: the chooser decides alone)
        self.controller = controller
        #: changes with every new chooser: what a kept plan's choices followed from (:meth:`settled`)
        self.version = 0
        self.policy = chooser
        if controller is not None:  # its rungs timed as this engine runs them (all now with calibration="setup")
            controller.calibrate(error_feedback=self.error_feedback, mode=self.mode)
        self.num_threads, self.telemetry = num_threads, telemetry
        self.decay = float(decay)
        self.states: dict[str, TransportState] = {}
        self.current: dict[str, str] = {}  # key -> codec json, or DENSE
        self.steps: dict[str, int] = {}
        #: (key, step, from, to) for every codec change, from/to as codec configs or "dense".
        self.switches: list[tuple[str, int, Any, Any]] = []
        self._last: dict[str, dict[str, Any]] = {}
        self._codecs: dict[str, Codec] = {}
        self.agreed: dict[str, str] = {}  # agreements of exchanges that are no codec's own
        self._stores: dict[tuple[str | None, str], _Store] = {}
        self._owner: dict[str, tuple[str | None, str]] = {}  # parameter -> the store holding its residual
        #: per-round totals of the keys this router exchanged one call at a time (:meth:`step_report`)
        self.reports = KeyRounds()
        #: the engines' agreed plans by what they follow from, while no residual moves
        #: (:func:`gcodec.transports.plan.plan`)
        self.plans: dict[Any, Plan] = {}

    # ---- the policy --------------------------------------------------------------------------
    @property
    def policy(self) -> Any:
        """What the engine was given (a Policy, a callable, a dict or None); setting it (or
        :meth:`configure`) adapts it, from the next choice, the same on every rank or the exchange
        that follows refuses it. A controller is given at construction (``controller=``)."""
        return self._policy

    @policy.setter
    def policy(self, value: Any) -> None:
        if hasattr(value, "select"):
            raise ConfigError("an adaptive controller is given when the engine is built (controller=), not as a policy")
        self.chooser = as_policy(value, **self._shorthand)
        self._policy = value
        self.version += 1

    def configure(self, **shorthand: Any) -> None:
        """Change the shorthand's ``codec``, ``min_numel`` or ``dense_1d`` (see :class:`Router`)."""
        unknown = set(shorthand) - set(self._shorthand)
        if unknown:
            raise ConfigError(f"unknown router setting(s) {sorted(unknown)}")
        self._shorthand.update(shorthand)
        self.policy = self._policy

    # ---- codecs and states ---------------------------------------------------------------------
    @property
    def adaptive(self) -> bool:
        """Whether an adaptive controller decides, with collectives of its own."""
        return self.controller is not None

    def codec(self, choice: Any) -> Codec | None:
        """One codec instance per configuration (None stays None: dense)."""
        if choice is None:
            return None
        c = choice if isinstance(choice, Codec) else get_codec(choice)
        return self._codecs.setdefault(c.config_key, c)

    def state_for(self, codec: Codec) -> TransportState:
        """The transport state (residuals, steps, statistics) of one codec of this router."""
        k = codec.config_key
        st = self.states.get(k)
        if st is None:
            st = self.states[k] = TransportState(
                codec,
                error_feedback=self.error_feedback,
                mode=self.mode,
                num_threads=self.num_threads,
                telemetry=self.telemetry,
                decay=self.decay,
            )
        return st

    def rung_for(self, shape: Sequence[int], rung: Codec | None) -> Codec | None:
        """``rung`` (a controller's choice for a bucket or module, or a compressed warm-up's codec)
        for one tensor of ``shape``, unless the size rules keep the tensor dense (None)."""
        if rung is None:
            return None
        rules = self._shorthand
        keep = size_rule(shape, rung, min_numel=int(rules["min_numel"]), dense_1d=bool(rules["dense_1d"]))
        return rung if keep is None else None

    def settled(self, step: int) -> bool:
        """Whether the policy's choice at ``step`` follows from a tensor's name and shape alone (a
        Policy past its warm-up and step ranges, a pattern dict, the default codec; never a callable
        or another chooser that does not say, :attr:`gcodec.policy.Policy.settled_step`)."""
        at = getattr(self.chooser, "settled_step", None)
        return at is not None and step >= at

    def choose(self, name: str, shape: Sequence[int], step: int, tensor: Any = None) -> Codec | None:
        """The policy's codec for parameter ``name`` at ``step`` (None: dense). Not for a controller,
        which decides per key with collectives (:meth:`select`)."""
        if self.adaptive:
            raise ConfigError("an adaptive controller decides per key through Router.select, not choose")
        if isinstance(self.chooser, Rules):  # a callable policy is handed the engine's tensor
            return self.codec(self.chooser.codec_for(name, tuple(shape), step, tensor))
        return self.codec(self.chooser.codec_for(name, tuple(shape), step))

    def select(
        self,
        comm: Communicator,
        key: str,
        shape: tuple[int, ...],
        step: int,
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> Protocol:
        """The codec of ``key`` at ``step``, as a protocol: a controller may run collectives first
        (the same on every rank); a policy answers at once. ``shapes``: the tensors of a key that
        stands for several (a DDP bucket), which a controller prices a low-rank rung on."""
        if self.controller is not None:
            choice = yield from self.controller.select(comm, self, key, shape, step, shapes)
            return self.codec(choice)
        try:
            # a policy answers locally (a user's callable may raise, or name a codec that does not
            # exist): take part in the exchange with the error, so that the peers raise too
            return self.codec(self.chooser.codec_for(key, shape, step))
        except Exception as e:
            yield from failed_exchange(comm, e, f"codec choice for {key!r} at step {step}")

    def decide(
        self, comm: Communicator, key: str, shape: tuple[int, ...], shapes: Sequence[tuple[int, ...]] | None = None
    ) -> Protocol:
        """``key``'s next step and its codec for it, as a protocol returning ``(codec, step)``: the
        key's step counter advances, the chooser selects (:meth:`select`), a change is logged."""
        step = self.steps.get(key, 0)
        self.steps[key] = step + 1
        codec = yield from self.select(comm, key, shape, step, shapes)
        self.note_choice(key, step, codec)
        return codec, step

    def note_choice(self, key: str, step: int, codec: Codec | None) -> bool:
        """Record ``key``'s codec at ``step``; True when it changed (a switch is logged)."""
        new = DENSE if codec is None else codec.config_key
        old = self.current.get(key)
        self.current[key] = new
        if old is None or old == new:
            return False
        self.switches.append(
            (key, step, DENSE if old == DENSE else json.loads(old), DENSE if codec is None else codec.get_config())
        )
        return True

    @staticmethod
    def group_key(prefix: str, codec: Codec, names: Sequence[str], *salt: object) -> str:
        """A readable key for the group of parameters ``names`` under ``codec``: the first and last
        names, the count, the codec id and a digest of every name (and ``salt``), so that two groups
        never share a key."""
        digest = hashlib.sha1("\0".join([*names, *map(str, salt)]).encode()).hexdigest()[:8]
        span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        return f"{prefix}{span} ({len(names)} tensors, {codec.codec_id}, {digest})"

    # ---- records -------------------------------------------------------------------------------
    def record(self, key: str, rec: dict[str, Any]) -> None:
        """Keep ``key``'s last step record (what :meth:`last` gives a controller)."""
        self._last[key] = rec

    def record_step(
        self,
        key: str,
        codec: Codec | None,
        mode: str,
        parts: Sequence[Any],
        quality: Any = None,
        held_s: float | None = None,
    ) -> None:
        """Record ``key``'s last step from the :class:`StepStats` of the exchanges it ran (their
        bytes and seconds summed) under ``codec`` (None: dense), with a telemetry record if one
        was sampled: what a controller reads of an engine's bucket or module. ``held_s``: the
        seconds the engine held the key's tensors for the exchange, from the decision to its end
        (agreement, dense riders and waits included), where the engine measures it."""
        vals: dict[str, float] = {}
        for st in parts:
            for f, v in st.values.items():
                vals[f] = vals.get(f, 0) + v
        rec: dict[str, Any] = {"step": self.steps[key] - 1, "mode": mode, **vals}
        rec["codec"] = DENSE if codec is None else codec.get_config()
        if quality is not None:
            rec["quality"] = quality
        if held_s is not None:
            rec["held_s"] = held_s
        self.record(key, rec)

    def last(self, key: str) -> dict[str, Any] | None:
        """``key``'s last record (as in :meth:`stats`, not copied), or None before its first step."""
        return self._last.get(key)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per key: the last step's record (bytes, seconds, mode, ``codec``: config or "dense", and
        ``quality`` when telemetry sampled it)."""
        return {k: dict(v) for k, v in self._last.items()}

    def step_report(self) -> dict[str, Any]:
        """What this router's calls (``gcodec.mpi.allreduce`` or ``gcodec.torch.all_reduce`` with
        it as ``state=``) did per step, every key and codec together, dense keys included: the
        last finished round, the number of rounds and the totals, in the shape every engine's
        report has (:class:`gcodec.transports.stats.KeyRounds`: a round ends when a key comes
        back, or at :meth:`end_step`). An engine with buckets or modules keeps its own report."""
        return self.reports.as_dict()

    def end_step(self) -> None:
        """Close the round in progress (:meth:`step_report`), as the next call of a key would."""
        self.reports.end_step()

    def residual_norm(self, key: str) -> float:
        """The norm of ``key``'s pending residual (0 when none)."""
        got = self._read_names({key})
        parts = [_host(v).astype(np.float64) for (_, _, v) in got.get(key, [])]
        return float(np.sqrt(sum(float(np.dot(v, v)) for v in parts)))

    # ---- residual placement --------------------------------------------------------------------
    def _vector(self, store: _Store, j: int) -> np.ndarray | None:
        """Stored vector ``j`` of ``store``, flat (None when the state holds none yet)."""
        if store.held is not None:
            return store.held[j]
        ts = self.states.get(store.ck or "")
        if ts is None:
            return None
        if store.form == "lowrank":
            r = ts.lowrank_residuals.get(store.vectors[j][0].name)
            return None if r is None else xp.flat(r)
        ef = ts.worker
        if ef is None:
            return None
        if store.form == "flat":
            r = ef.residual(store.key)
        elif store.form == "rows":
            r = ef.residual(f"{store.key}[{j}/{len(store.vectors)}]")
        else:  # split: the owners' chunks of one vector
            p = store.shape[0] if store.shape else 1
            parts = [ef.residual(f"{store.key}[{i}/{p}]") for i in range(p)]
            if any(q is None for q in parts):
                return None
            r = xp.concat([xp.flat(q) for q in parts], parts[0])
        return None if r is None else xp.flat(r)

    def _read_names(self, names: set[str]) -> dict[str, list[tuple[int, int, np.ndarray]]]:
        """Every pending element range of ``names``: {name: [(start, stop, values)]}."""
        out: dict[str, list[tuple[int, int, np.ndarray]]] = {}
        for sid in {self._owner[n] for n in names if n in self._owner}:
            store = self._stores.get(sid)
            if store is None:
                continue
            for j, pieces in enumerate(store.vectors):
                v = self._vector(store, j)
                if v is None:
                    continue
                pos = 0
                for pc in pieces:
                    if pc.name in names and self._owner.get(pc.name) == sid:
                        out.setdefault(pc.name, []).append((pc.start, pc.stop, v[pos : pos + pc.stop - pc.start]))
                    pos += pc.slots
        return out

    @staticmethod
    def _fill(pieces: Sequence[Piece], got: Mapping[str, list[tuple[int, int, Any]]], like: Any = None) -> Any:
        """A vector laid out as ``pieces`` from the element ranges ``got`` (None when none overlaps),
        on the memory of ``like`` (the group's tensor) or else of the residuals it is made of: a
        device job's residuals move on the device (a checkpoint's host ranges are uploaded once)."""
        v: Any = None
        wide = any(vals.dtype == np.float64 for parts in got.values() for _, _, vals in parts)
        pos = 0
        for pc in pieces:
            for a, b, vals in got.get(pc.name, ()):
                lo, hi = max(a, pc.start), min(b, pc.stop)
                if hi > lo:
                    if v is None:
                        n = sum(q.slots for q in pieces)
                        v = xp.zeros(vals if like is None else like, n, np.float64 if wide else np.float32)
                    xp.copy(v[pos + lo - pc.start : pos + hi - pc.start], vals[lo - a : hi - a])
            pos += pc.slots
        return v

    def _release(self, names: set[str]) -> None:
        """Drop the stores none of whose parameters they hold any more."""
        live = set(self._owner.values())
        for sid in [s for s in self._stores if s not in live]:
            self._drop(self._stores.pop(sid))

    def _drop(self, store: _Store) -> None:
        """Forget what ``store``'s state holds under its keys (already read where still owed)."""
        ts = self.states.get(store.ck or "")
        if ts is None:
            return
        if store.form == "lowrank":
            # lowrank residuals are kept by parameter name: a matrix that moved to another
            # group (a DDP bucket rebuild) is already that group's, under the same name
            for v in store.vectors:
                if v[0].name not in self._owner:
                    ts.lowrank_residuals.pop(v[0].name, None)
        elif ts.worker is not None:
            n = len(store.vectors) if store.form == "rows" else 0
            if store.form == "split" and store.shape:
                n = store.shape[0]
            for k in [store.key, *(f"{store.key}[{j}/{n}]" for j in range(n))]:
                ts.worker.reset(k)

    def place(
        self,
        ts: TransportState,
        key: str,
        form: str,
        vectors: Sequence[Sequence[Piece]],
        shapes: Sequence[tuple[int, ...]] | None = None,
        like: Any = None,
    ) -> None:
        """Make ``ts`` hold the pending residuals of the group ``key`` laid out as ``vectors``.

        ``form`` is one of :data:`FORMS`; ``shapes`` gives the residual's shape per vector (flat:
        the tensor's; lowrank: each matrix's), and for ``split`` the number of owners as ``[(p,)]``;
        ``like``, an array of the group's memory (host or device), where the residuals go.
        Costs nothing in a steady job (the group already holds them). A state without error
        feedback holds no residuals: what its group still owes is :meth:`take` n, to be sent.
        """
        if form not in FORMS:
            raise ConfigError(f"residual form {form!r} is not one of {list(FORMS)}")
        if ts.worker is None:
            raise ConfigError(f"{ts.codec.codec_id} keeps no residuals here (no error feedback): take them to send")
        sid = (ts.codec.config_key, key)
        layout = tuple(tuple(v) for v in vectors)
        shape = None if not shapes else tuple(shapes[0])
        store = self._stores.get(sid)
        names = {pc.name for v in layout for pc in v}
        # the same layout, held under this key, split among as many owners (a two-phase group at a
        # new world size keeps its vectors but re-slices them): nothing to move
        same = store is not None and store.vectors == layout and store.shape == (shape if form != "lowrank" else None)
        if same and all(self._owner.get(n) == sid for n in names):
            return
        self.plans.clear()  # a kept plan placed residuals that move now
        got = self._read_names(names)
        fresh = _Store(sid[0], key, form, layout, shape if form != "lowrank" else None)
        for n in names:
            self._owner.pop(n, None)
        old = self._stores.pop(sid, None)
        self._release(names)
        if old is not None:  # this key's own earlier layout (another owner count): its chunk keys go too
            self._drop(old)
        filled = [self._fill(v, got, like) for v in layout]
        self._stores[sid] = fresh
        for n in names:
            self._owner[n] = sid
        for j, v in enumerate(filled):
            if v is None:
                continue
            if form == "lowrank":
                ts.lowrank_residuals[layout[j][0].name] = v.reshape(shapes[j] if shapes else v.shape)
            elif form == "flat":
                ts.worker.set_residual(key, v.reshape(shape) if shape else v)
            elif form == "rows":
                ts.worker.set_residual(f"{key}[{j}/{len(layout)}]", v)
            else:
                p = shape[0] if shape else 1
                b = owner_bounds(v.shape[0], p)
                for i in range(p):  # views of the new vector, which nothing else holds
                    ts.worker.set_residual(f"{key}[{i}/{p}]", v[b[i] : b[i + 1]])

    def take(self, vectors: Sequence[Sequence[Piece]], like: Any = None) -> list[Any] | None:
        """The pending residuals of parameters about to go dense, or to a codec without error
        feedback, laid out as ``vectors`` and forgotten (the caller sends them with this step);
        None when there are none."""
        names = {pc.name for v in vectors for pc in v}
        if not any(n in self._owner for n in names):
            return None
        self.plans.clear()  # a kept plan placed residuals that move now
        got = self._read_names(names)
        for n in names:
            self._owner.pop(n, None)
        self._release(names)
        filled = [self._fill(v, got, like) for v in vectors]
        return filled if any(f is not None for f in filled) else None

    def clear_residuals(self) -> None:
        """Forget every pending residual (every codec's and the held ones)."""
        self.plans.clear()  # a kept plan placed residuals that move now
        for ts in self.states.values():
            if ts.worker is not None:
                ts.worker.reset()
            ts.lowrank_residuals.clear()
        self._stores.clear()
        self._owner.clear()

    # ---- checkpoints ---------------------------------------------------------------------------
    def ranges(self) -> dict[str, np.ndarray]:
        """Every pending residual as ``{"name[start:stop]": values}`` (float32, or float64 for
        float64 tensors), whatever its layout."""
        out: dict[str, np.ndarray] = {}
        for name, parts in self._read_names(set(self._owner)).items():
            for a, b, v in parts:
                if b > a:  # a destination that holds only padding of this parameter has none
                    out[f"{name}[{a}:{b}]"] = np.array(_host(v), np.float64 if v.dtype == np.float64 else np.float32)
        return out

    def hold(self, ranges: Mapping[str, Any]) -> None:
        """Take residuals saved as :meth:`ranges` gave them; each reaches its parameter's group when
        that group is next formed (:meth:`place`), at any layout and world size."""
        pieces: list[Piece] = []
        vals: list[np.ndarray | None] = []
        for k, v in ranges.items():
            name, a, b = parse_range(k)
            arr = np.asarray(v).reshape(-1)
            if arr.dtype not in (np.float32, np.float64):
                raise ConfigError(f"residual {k!r} has dtype {arr.dtype}; expected float32 or float64")
            if arr.shape[0] != b - a:
                raise ConfigError(f"residual {k!r} has {arr.shape[0]} values, not {b - a}")
            pieces.append(Piece(name, a, b, b - a))
            vals.append(arr)
        self.plans.clear()  # a kept plan placed residuals that move now
        for i, (pc, v) in enumerate(zip(pieces, vals)):
            sid = (None, f"held:{pc.name}[{pc.start}:{pc.stop}]#{i}")
            self._stores[sid] = _Store(None, sid[1], "rows", ((pc,),), held=[v])
            self._owner_add(pc.name, sid)

    def _owner_add(self, name: str, sid: tuple[str | None, str]) -> None:
        """A parameter may be held in several loaded ranges: keep them all readable under one owner."""
        old = self._owner.get(name)
        if old is None or old[0] is not None:
            self._owner[name] = sid
            return
        a, b = self._stores[old], self._stores.pop(sid)
        merged = _Store(None, a.key, "rows", a.vectors + b.vectors, held=[*(a.held or []), *(b.held or [])])
        self._stores[old] = merged

    def state_dict(self) -> dict[str, Any]:
        """Every codec's state (steps, warm starts, server residuals), the residuals by parameter
        and element range, each key's current codec and step, and the chooser's own state (plain
        arrays, ints, strings, dicts)."""
        chooser_sd = getattr(self.controller, "state_dict", None)
        states = {}
        for k, ts in self.states.items():
            sd = ts.state_dict()
            if sd["worker"] is not None:
                sd["worker"]["residuals"] = {}  # kept by range below, placed again on load
            sd["lowrank_residuals"] = {}
            states[k] = sd
        return {
            "states": states,
            "residuals": self.ranges(),
            "current": dict(self.current),
            "steps": dict(self.steps),
            "chooser": chooser_sd() if callable(chooser_sd) else None,
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (the chooser must be configured as it was)."""
        for k, part in sd["states"].items():
            self.state_for(self.codec(json.loads(k))).load_state_dict(part)  # type: ignore[arg-type]
        self.clear_residuals()
        self.hold(sd.get("residuals", {}))
        self.agreed.clear()  # agree again after a restore: the peers may have changed
        self.current = {str(k): str(v) for k, v in sd["current"].items()}
        self.steps = {str(k): int(v) for k, v in sd["steps"].items()}
        loader = getattr(self.controller, "load_state_dict", None)
        if sd.get("chooser") is not None and callable(loader):
            loader(sd["chooser"])

    # ---- allreduces of keys (gcodec.mpi, gcodec.torch.all_reduce, DiLoCo) --------------------
    def protocol(self, comm: Communicator, x: np.ndarray, out: np.ndarray, key: str, op: str) -> Protocol:
        """Choose ``key``'s codec for this step, move its residual on a change, exchange
        (:meth:`protocol_many` of one key)."""
        yield from self.protocol_many(comm, [(key, x, out)], op)
        return out

    def protocol_many(self, comm: Communicator, items: Sequence[tuple[str, Any, Any]], op: str) -> Protocol:
        """Allreduce several keys in one exchange (``items``: ``(key, x, out)``, the same keys in the
        same order on every rank; ``out`` may be ``x``). Each key's codec is decided for this step
        (:meth:`decide`); then the keys are planned together (:func:`gcodec.transports.plan.plan`,
        the plan kept per key set and codec choice until a residual moves): the keys that share a
        codec (and a dtype) are joined into one flat group, as the DDP hook joins a bucket's
        tensors, unless the codec reads shapes (:attr:`Codec.reads_shape`) or is low-rank (each such
        key goes alone, in its shape); a key alone goes under its own name. The ranks agree on the
        plan once (one fingerprint: every key, shape, dtype, codec and mode), then the groups run in
        order (:func:`gcodec.transports.run.run`); the keys that go dense ride with the first
        group in float32, or, when there is none or they hold float64, go in one allreduce of
        their own. Residuals stay keyed by parameter and element range, so a key that changes
        group keeps what it is owed (:meth:`place`). Each key's record and step report gets its
        share of its group's figures. (What joining saves is measured in docs/lowcomm.md, "A
        synchronisation's own cost".)"""
        t0 = time.perf_counter()
        chosen: list[Codec | None] = []
        steps: list[int] = []
        for key, x, _ in items:
            codec, step = yield from self.decide(comm, key, tuple(x.shape))
            chosen.append(codec)
            steps.append(step)
        names = [k for k, _, _ in items]
        what = f"compressed allreduce of {names[0]!r}" + (
            f" and {len(names) - 1} more key(s)" if len(names) > 1 else ""
        )
        try:
            for _, x, out in items:
                check_call(x, out, op)
            pl = self._plan(comm, items, chosen, op)
        except Exception as e:  # take part, so that the peers raise too instead of waiting
            yield from failed_exchange(comm, e, what)
        slot = names[0] if len(names) == 1 else _many_key(names)
        ex = Exchange(comm, pl.fingerprint, self.agreed, slot, what, pl.on_agree, pl.text)
        p = comm.size
        try:
            for g in pl.groups:
                self._prepare(g, items)
            xs = [items[i][1] for i in pl.dense]
            buf = joined(xs, np.result_type(*[work_dtype(x.dtype) for x in xs]), pl.carried) if xs else None
        except Exception as e:
            yield from ex.begin(e)
            raise
        ride = buf is not None and bool(pl.groups) and buf.dtype == np.float32
        yield from run(ex, pl, op, buf if ride else None)
        dst = StepStats("", 0, DENSE, 0)
        if buf is not None:
            if not ride:
                yield from run_dense(ex, dst, buf.nbytes, lambda: comm.allreduce(buf, "sum"))
            if op == "mean":
                xp.scale(buf, buf, 1.0 / p)
        held = time.perf_counter() - t0
        total = max(sum(int(x.size) for _, x, _ in items), 1)
        for g in pl.groups:
            outs = [items[i][2] for i in g.idx]
            if len(g.idx) > 1:
                scatter(outs, xp.flat(g.out))
            keys = [(names[i], steps[i], items[i][1]) for i in g.idx]
            self._record_keys(g.stats, g.codec, keys, held / total, g.quality())
        if buf is not None:
            scatter([items[i][2] for i in pl.dense], buf)
            if ride:  # in the first group's collectives: its bytes, none of its seconds
                dst.values["payload_bytes"] = buf.nbytes
                dst.values["wire_bytes"] = ring_bytes(buf.nbytes, p)
            self._record_keys(dst, None, [(names[i], steps[i], items[i][1]) for i in pl.dense], held / total)
        return [out for _, _, out in items]

    def _plan(
        self, comm: Communicator, items: Sequence[tuple[str, Any, Any]], chosen: list[Codec | None], op: str
    ) -> Plan:
        """The plan of ``items`` under the codecs ``chosen`` (:func:`gcodec.transports.plan.plan`,
        kept for the next call of the same keys, shapes, dtypes, memories and codecs until a
        residual moves)."""
        xs = [x for _, x, _ in items]
        its = [Item(k, tuple(x.shape), dtype_name(x.dtype), xp.backend(x)) for k, x, _ in items]
        by_item = {id(it): c for it, c in zip(its, chosen)}

        def dense_dtype(pl: Plan) -> dict[str, Any]:
            wdt = np.result_type(*[work_dtype(xs[i].dtype) for i in pl.dense]) if pl.dense else None
            return {"dense_dtype": None if wdt is None else str(wdt)}

        ef: Any = {"decay": self.decay} if self.error_feedback and self.decay != 1.0 else self.error_feedback
        return plan(
            self,
            its,
            lambda it: by_item[id(it)],
            size=comm.size,
            join_lowrank=False,
            alone_by_name=True,
            like=lambda i: xs[i],
            agree={"ef": ef, "op": op, "size": comm.size},
            derived=dense_dtype,
        )

    @staticmethod
    def _prepare(g: Group, items: Sequence[tuple[str, Any, Any]]) -> None:
        """Group ``g``'s input (its keys joined, with what it must send now), output and statistics."""
        xs = [items[i][1] for i in g.idx]
        if len(xs) == 1:  # alone, in its shape; a copy only to add what it owes
            x, out = xs[0], items[g.idx[0]][2]
            if g.flush is not None and g.flush[0] is not None:
                c = x.reshape(-1).astype(np.result_type(work_dtype(x.dtype), g.flush[0].dtype))
                xp.add(c, g.flush[0])  # x + residual, a NaN sum a positive NaN (format.md §10)
                x = c.astype(x.dtype).reshape(x.shape)
        else:
            x = xp.concat([xp.flat(a) for a in xs], xs[0])
            if g.flush is not None and g.flush[0] is not None:
                xp.add(x, g.flush[0])
            out = xp.empty(x, x.shape[0], x.dtype)
        g.begin(x)
        g.x, g.out = x, out

    def _record_keys(
        self, st: StepStats, codec: Codec | None, keys: list[tuple[str, int, Any]], held_per: float, quality: Any = None
    ) -> None:
        """The figures ``st`` of one exchange of several keys (``keys``: name, step, input) split by
        their element counts into each key's record and step report: seconds in proportion, bytes
        rounded down with the last key taking the remainder, so that they add up to the exchange's;
        ``held_per``: the call's held seconds per element."""
        sizes = [int(x.size) for _, _, x in keys]
        total = max(sum(sizes), 1)
        left = {f: int(st.values[f]) for f in _BYTE_FIELDS}
        cfg = DENSE if codec is None else codec.get_config()
        for j, ((key, step, x), w) in enumerate(zip(keys, sizes)):
            kst = StepStats(key, step, st.mode, int(x.nbytes))
            for f, v in st.values.items():
                if f in _BYTE_FIELDS:
                    share = left[f] if j == len(keys) - 1 else int(v) * w // total
                    left[f] -= share
                    kst.values[f] = share
                elif f != "raw_bytes":
                    kst.values[f] = v * w / total
            rec: dict[str, Any] = {"step": step, "mode": kst.mode, **kst.values, "codec": cfg}
            if quality is not None:  # the group's: what its codec did to these keys together
                rec["quality"] = quality
            self.record(key, rec)
            self.reports.add_call(key, [kst], raw_bytes=int(x.nbytes), held_s=held_per * w)


def _many_key(names: Sequence[str]) -> str:
    """The agreement slot of one :meth:`Router.protocol_many` key set: its first and last keys, their
    count and a digest of every key, so that two key sets never share a slot."""
    digest = hashlib.sha1("\0".join(names).encode()).hexdigest()[:8]
    return f"many:{names[0]}..{names[-1]} ({len(names)} keys, {digest})"


#: The states and routers of single calls given none, per communicator (``scope``), codec and mode.
_shared: dict[tuple[Any, ...], Any] = {}
_wrapped: weakref.WeakKeyDictionary[ErrorFeedback, TransportState] = weakref.WeakKeyDictionary()


def call_protocol(
    comm: Communicator, scope: Any, x: Any, out: Any, codec: Any, op: str, key: str, mode: str, state: Any
) -> Protocol:
    """One allreduce of ``key`` as ``gcodec.mpi.iallreduce`` and ``gcodec.torch.all_reduce`` take
    their arguments. A :class:`Router` as ``state``, or a :class:`~gcodec.policy.Policy` as
    ``codec`` (a router without error feedback shared per ``scope`` and policy), chooses per key
    and step; else ``state`` is a :class:`TransportState`, a :class:`gcodec.ErrorFeedback` (its
    worker residuals, wrapped once) or None (a state without error feedback shared per ``scope``,
    codec and mode: it keeps a codec's warm starts and steps). Raises ConfigError on bad arguments
    (the caller takes part in the exchange with it)."""
    if isinstance(state, Router) or isinstance(codec, Policy):
        router = state
        if not isinstance(state, Router):
            router = _shared.get((scope, id(codec)))
            if router is None or router.chooser is not codec:
                router = _shared[(scope, id(codec))] = Router(codec, error_feedback=False, mode=mode)
        return router.protocol(comm, x, out, key, op)
    if state is None:
        if codec is None:
            raise ConfigError("an allreduce needs a codec (or a state that holds one, or a Router as state=)")
        c = get_codec(codec)
        ts = _shared.get((scope, repr(c), mode))
        if ts is None:
            ts = _shared[(scope, repr(c), mode)] = TransportState(c, mode=mode, error_feedback=False)
    elif isinstance(state, (TransportState, ErrorFeedback)):
        c = state.codec if codec is None else get_codec(codec)
        if state.codec != c:
            raise ConfigError(f"state holds codec {state.codec!r}, not {c!r}")
        if isinstance(state, TransportState):
            ts = state
        elif (ts := _wrapped.get(state)) is None:
            ts = _wrapped[state] = TransportState(c, mode=mode, worker=state)
    else:
        kinds = "None, a gcodec.ErrorFeedback, a TransportState or a Router"
        raise ConfigError(f"state= must be {kinds}, not {type(state).__name__}")
    return allreduce_protocol(comm, ts, x, out, key, op, mode)


def _host(v: Any) -> np.ndarray:
    """A host copy of a residual for a checkpoint or a norm (device residuals copied once)."""
    return np.asarray(v) if isinstance(v, np.ndarray) else v.copy_to_host()


def parse_range(k: str) -> tuple[str, int, int]:
    """``(name, start, stop)`` of a residual's key ``"name[start:stop]"`` (:meth:`Router.ranges`)."""
    if not k.endswith("]") or "[" not in k:
        raise ConfigError(f"residual key {k!r} is not 'name[start:stop]'")
    name, _, rng = k[:-1].rpartition("[")
    a, sep, b = rng.partition(":")
    if not sep or not a.isdigit() or not b.isdigit() or int(b) < int(a):
        raise ConfigError(f"residual key {k!r} is not 'name[start:stop]'")
    return name, int(a), int(b)
