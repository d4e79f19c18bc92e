"""Planning one exchange: which codec each tensor takes, how the tensors group, where their residuals
live, and what the ranks agree on. Every engine plans here, and only here.

An engine turns what it holds into :class:`Item` s (the DDP hook: a bucket's gradients; FSDP2: the
parameters of a module's reduce-scatter, each with its per-destination *pieces*; DiLoCo,
``gcodec.torch.all_reduce`` and ``gcodec.mpi``: their tensors) and calls :func:`plan` with a
*chooser*, :func:`policy_chooser` unless the engine adds a rule of its own. The plan says:

* **the codec of each item**: the chooser's answer, None for dense. :func:`policy_chooser` asks the
  router's policy (a :class:`gcodec.policy.Policy` or the shorthand :class:`gcodec.policy.Rules`,
  which apply the size rules themselves), or, under an adaptive controller or in a compressed
  warm-up, applies the size rules (:func:`gcodec.policy.size_rule`, through
  :meth:`~gcodec.transports.router.Router.rung_for`) to the one codec the controller chose;
* **the groups**: the items that share a codec configuration, a dtype and a memory (host, device)
  form one flat group, in the order of the group's first item. A codec that reads shapes
  (:attr:`~gcodec.codecs.Codec.reads_shape`) gets a group per item, sent in the item's shape, and
  so, for the DDP hook (``exact_groups``), does every item whose encoding would not stay the one
  it has alone (:func:`~gcodec.transports.state.shares_flat_group`); a low-rank codec under the
  ``lowrank`` protocol joins its matrices when ``join_lowrank`` (they share one round of
  products, each factored on its own); items held in rows (FSDP2) are never sent in their shape,
  so they always join;
* **each group's mode** (:func:`~gcodec.transports.state.resolve_mode`, or the engine's
  ``collective`` when it is not an allreduce) and its key
  (:meth:`~gcodec.transports.router.Router.group_key`);
* **the residuals**: each group's are placed by (parameter, element range) in its codec's state
  through the router's store (:meth:`~gcodec.transports.router.Router.place`), in the form its
  protocol keeps them; what a codec without error feedback, or a dense item, still owes comes back
  to be sent with this step (:attr:`Group.flush`, :attr:`Plan.carried`);
* **the fingerprint** the ranks agree on before anything travels (:meth:`Plan.agree_on`); an
  agreed plan is kept in the router and reused, fingerprint included, while it follows from the
  same items, codecs and settings and no residual moves (a steady job plans each exchange once).

The plan is local and deterministic: every rank that holds the same items under the same
configuration plans the same groups, and the exchange that runs it agrees on the fingerprint
before any payload moves, so ranks that plan differently all raise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..codecs import Codec
from .handshake import Agreement, fingerprint
from .quality import sample_quality
from .state import TransportState, resolve_mode, shares_flat_group
from .stats import StepStats

__all__ = ["Choice", "Group", "Item", "Piece", "Plan", "plan", "policy_chooser"]


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of the flattened parameter ``name``, in ``slots`` places of a stored
    vector (slots > stop - start: the rest is padding, as FSDP pads dim 0)."""

    name: str
    start: int
    stop: int
    slots: int

    @staticmethod
    def whole(name: str, numel: int) -> Piece:
        return Piece(name, 0, numel, numel)


@dataclass(eq=False)
class Item:
    """One tensor an engine hands to planning.

    ``dtype`` and ``device`` name its element type and memory (two items join a group only when
    both match); ``pieces``, for an item the engine holds in rows, gives the elements each row
    carries (one piece per destination, as FSDP2 lays out a reduce-scatter's input; empty: the
    whole tensor in one vector); ``tensor`` is what a callable policy is handed (the gradient, or
    a meta tensor of the parameter's shape) and, for the engines that exchange the items one by
    one, the array itself."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"
    pieces: tuple[Piece, ...] = ()
    tensor: Any = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def vectors(self) -> tuple[Piece, ...]:
        """The item's piece of each stored vector (its whole elements in one, unless in rows)."""
        return self.pieces or (Piece.whole(self.name, self.numel),)


#: What a chooser answers for one item: its codec, or None for dense.
Chooser = Callable[[Item], "Codec | None"]


@dataclass(frozen=True)
class Choice:
    """A chooser that says what its answers follow from: with ``settled`` (not None), each item's
    codec follows from its name and shape and from ``settled``, so that :func:`plan` may reuse a
    kept plan without asking again; None: ask for every item at every call."""

    choose: Chooser
    settled: Hashable = None

    def __call__(self, item: Item) -> Codec | None:
        return self.choose(item)


def policy_chooser(router: Any, step: int, rung: Codec | None = None) -> Choice:
    """The chooser of an engine's ``step``: the router's policy for each item, or, when a rung is
    given (a controller's choice for the whole exchange, a compressed warm-up's codec) or a
    controller decides (no rung: everything dense), that rung for every item the size rules do not
    keep dense. Settled (:class:`Choice`) under a rung, and under a policy whose choice no longer
    depends on the step (:meth:`~gcodec.transports.router.Router.settled`); either way until the
    router's chooser changes (``configure``, a new policy)."""
    if rung is None and not router.adaptive:
        settled = ("policy", router.version) if router.settled(step) else None
        return Choice(lambda item: router.choose(item.name, item.shape, step, item.tensor), settled)
    return Choice(lambda item: router.rung_for(item.shape, rung), ("rung", rung and rung.config_key, router.version))


@dataclass(eq=False)
class Group:
    """The items ``idx`` of a plan that one codec compresses, as one exchange under ``key``.

    ``shape`` is the shape the group is sent in (flat: the items' total; an item of a codec that
    reads shapes, or sent alone under its own name, in its shape); ``form`` is how its residual is
    stored (:data:`gcodec.transports.router.FORMS`); ``flush``, when the codec keeps no residual,
    what its items still owe, laid out as the group's vectors, to be sent with this step."""

    key: str
    codec: Codec
    state: TransportState
    mode: str
    idx: list[int]
    form: str
    shape: tuple[int, ...]
    flush: list[Any] | None = None
    # ---- filled when the group runs (the engine's run) ----
    stats: Any = None
    x: Any = None
    out: Any = None
    scatter: bool = False
    items: list[Any] = field(default_factory=list)

    def begin(self, x: Any) -> None:
        """This step's exchange of the group starts on ``x`` (its items joined, with what they owe):
        the group's step taken from its state, telemetry sampled, its statistics opened."""
        step = self.state.next_step(self.key)
        sample_quality(self.state, self.key, step, x)
        self.stats = StepStats(self.key, step, self.mode, int(x.nbytes))

    def quality(self) -> dict[str, Any] | None:
        """The telemetry record sampled for the group at this step's exchange, or None."""
        tel = self.state.telemetry
        q = tel.records().get(self.key) if tel is not None else None
        return q if q is not None and self.stats is not None and q["step"] == self.stats.step else None


@dataclass(eq=False)
class Plan:
    """What one rank intends to do with one exchange of ``items``: the dense items (by index), the
    compressed groups, what the dense items still owe (laid out as their vectors, None when
    nothing), and the fingerprint the exchange agrees on (:meth:`agree_on`)."""

    items: list[Item]
    dense: list[int] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    carried: list[Any] | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    text: str | None = None  # the fingerprint's JSON, when kept from an earlier step

    def dense_vectors(self) -> list[list[Piece]]:
        """The dense items' vectors: one per item, or one per row when the items are held in rows."""
        return _vectors([self.items[i] for i in self.dense], "rows" if _in_rows(self.items) else "lowrank")

    def on_agree(self, agreement: Agreement) -> None:
        """Tell each group's state that its key was agreed (how many ranks share this machine)."""
        for g in self.groups:
            g.state.agreed_on(g.key, agreement.local_ranks)

    def agree_on(self, *, ef: Any, **fields: Any) -> None:
        """Build the fingerprint: error feedback, the dense items, and per group its codec, mode,
        key and tensors (one field per property, each a list over the groups, so a difference names
        what differs), with the engine's own ``fields``."""
        items = self.items
        self.fingerprint = fingerprint(
            ef=ef,
            dense=[[items[i].name, items[i].numel] for i in self.dense],
            codec=[g.codec.get_config() for g in self.groups],
            mode=[g.mode for g in self.groups],
            groups=[g.key for g in self.groups],
            tensors=[[[items[i].name, list(items[i].shape), items[i].dtype] for i in g.idx] for g in self.groups],
            **fields,
        )
        self.text = json.dumps(self.fingerprint, sort_keys=True)

    def reused(self, items: list[Item]) -> Plan:
        """This kept plan for this step's ``items`` (the same names, shapes and memories): its own
        groups, to be filled by this step's run."""
        groups = [replace(g, stats=None, x=None, out=None, scatter=False, items=[]) for g in self.groups]
        return Plan(items, self.dense, groups, None, self.fingerprint, self.text)


def _in_rows(items: Sequence[Item]) -> bool:
    return any(it.pieces for it in items)


def _vectors(items: Sequence[Item], form: str) -> list[list[Piece]]:
    """The stored vectors of a group of ``items`` in ``form``: per row (``rows``), per item
    (``lowrank``), or one vector of every item end to end (``flat``, ``split``)."""
    if form == "rows":
        return [[it.vectors[j] for it in items] for j in range(len(items[0].vectors))]
    if form == "lowrank":
        return [[it.vectors[0]] for it in items]
    return [[it.vectors[0] for it in items]]


def plan(
    router: Any,
    items: Sequence[Item],
    chooser: Chooser,
    *,
    size: int,
    collective: str = "allreduce",
    mode: str | None = None,
    prefix: str = "",
    salt: Sequence[object] = (),
    join_lowrank: bool = True,
    exact_groups: bool = False,
    alone_by_name: bool = False,
    like: Callable[[int], Any] | None = None,
    agree: Mapping[str, Any] | None = None,
    derived: Callable[[Plan], Mapping[str, Any]] | None = None,
) -> Plan:
    """Plan one exchange of ``items`` on ``size`` ranks (module docstring): each item's codec from
    ``chooser`` (called once per item, in order), the groups, their modes, keys and residuals.

    ``router``: the engine's :class:`~gcodec.transports.router.Router` (states, keys, residuals).
    ``collective``: ``"allreduce"`` (each group's mode resolved from its codec) or the name of the
    engine's own collective (``"reduce_scatter"``: every group's mode); ``mode``: the engine's
    configured mode (default: each codec state's, as the router made it). ``prefix`` and ``salt``
    go into the group keys (an FSDP module's name and world size); ``exact_groups``: an item joins
    its codec's flat group only where its encoding stays the one it has alone
    (:func:`~gcodec.transports.state.shares_flat_group`: element-wise codecs, group-wise ones on a
    multiple of the group), every other item goes alone, under a key, step and random stream of
    its own, so that no item's encoding depends on which items share the exchange (the DDP hook:
    a resumed job's first buckets differ from the uninterrupted job's); ``alone_by_name``: a group of
    one item takes the item's name as key and is sent in the item's shape, as a single tensor's
    exchange is. ``like(i)``: an array in the memory of item ``i``, where its group's residuals are
    placed (default: the item's ``tensor``).

    ``agree``: the engine's fields of the fingerprint (``ef`` among them), given when the plan is
    to be agreed on (:meth:`Plan.agree_on`, with ``derived(plan)``'s fields, which follow from the
    plan). The agreed plan is then kept in the router (``router.plans``) under everything it
    followed from (the arguments, the items' names, shapes, memories and pieces, ``agree``, and
    each item's codec, or, for a settled :class:`Choice`, what its choices follow from), and the
    next call that follows from the same reuses it, fingerprint and JSON included, instead of
    grouping, placing and writing them again (every step of a steady job); a chooser that is not
    settled is still asked for every item. A plan is kept only while nothing is owed (no
    :attr:`Plan.carried`, no :attr:`Group.flush`) and until a residual moves in the router
    (:meth:`~gcodec.transports.router.Router.place`, ``take``, ``hold``, ``clear_residuals``
    forget every kept plan).
    """
    items = list(items)
    settled = getattr(chooser, "settled", None)
    chosen = [chooser(item) for item in items] if settled is None or agree is None else None
    sig: Any = None
    if agree is not None:
        sig = (
            settled,
            size,
            collective,
            mode,
            prefix,
            tuple(salt),
            join_lowrank,
            exact_groups,
            alone_by_name,
            _frozen(agree),
            getattr(derived, "__code__", derived),  # the engine's own fields follow from the plan by this code
            tuple((it.name, it.shape, it.dtype, it.device, it.pieces) for it in items),
            None if chosen is None else tuple(None if c is None else c.config_key for c in chosen),
        )
        kept = router.plans.get(sig)
        if kept is not None:
            return kept.reused(items)
    if chosen is None:
        chosen = [chooser(item) for item in items]
    like = like or (lambda i: items[i].tensor)
    rows = _in_rows(items)
    out = Plan(items)
    modes: dict[str, str] = {}
    members: dict[Any, list[int]] = {}
    codecs: dict[Any, Codec] = {}
    for i, item in enumerate(items):
        codec = chosen[i]
        if codec is None:
            out.dense.append(i)
            continue
        ck = codec.config_key
        gmode = modes.get(ck)
        if gmode is None:
            asked = mode if mode is not None else router.state_for(codec).mode
            gmode = modes[ck] = collective if collective != "allreduce" else resolve_mode(codec, asked, size)
        gk: Any = (ck, item.dtype, item.device)
        # a codec that reads shapes goes in a group of its own, exchanged in its shape (and, with
        # exact_groups, so does any item whose encoding would change in a group); low-rank
        # matrices share one round of products when the engine joins them
        if rows or (join_lowrank and gmode == "lowrank"):
            pass
        elif codec.reads_shape or (exact_groups and not shares_flat_group(codec, item.numel, gmode)):
            gk = (*gk, i)
        members.setdefault(gk, []).append(i)
        codecs[gk] = codec
    for gk, idx in members.items():
        codec = codecs[gk]
        ts = router.state_for(codec)
        gmode = modes[codec.config_key]
        names = [items[i].name for i in idx]
        first = items[idx[0]]
        alone = alone_by_name and len(idx) == 1
        if rows:
            form = "rows"
        else:
            form = {"lowrank": "lowrank", "two_phase": "split"}.get(gmode, "flat")
        if alone:
            key = names[0]
        else:
            key = router.group_key(("lowrank:" if form == "lowrank" else "") + prefix, codec, names, *salt)
        shape = first.shape if alone or (codec.reads_shape and not rows) else (sum(items[i].numel for i in idx),)
        if form == "lowrank":
            shapes: list[tuple[int, ...]] | None = [items[i].shape for i in idx]
        elif form == "split":
            shapes = [(size,)]
        elif form == "flat":
            shapes = [shape]
        else:
            shapes = None
        vectors = _vectors([items[i] for i in idx], form)
        flush = None
        if ts.worker is None:  # no error feedback in this codec: what its items still owe is sent now
            flush = router.take(vectors, like(idx[0]))
        else:
            router.place(ts, key, form, vectors, shapes, like(idx[0]))
        out.groups.append(Group(key, codec, ts, gmode, idx, form, shape, flush))
    if out.dense:
        out.carried = router.take(out.dense_vectors(), like(out.dense[0]))
    if agree is not None:
        out.agree_on(**agree, **(derived(out) if derived is not None else {}))
        if out.carried is None and all(g.flush is None for g in out.groups):  # nothing owed: steady
            router.plans[sig] = out.reused([replace(it, tensor=None) for it in out.items])
    return out


def _frozen(v: Any) -> Any:
    """``v`` (fingerprint fields: dicts, lists, scalars) as a hashable value."""
    if isinstance(v, Mapping):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    return v
