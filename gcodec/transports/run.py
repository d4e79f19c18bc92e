"""Running an exchange: the one place that picks a group's protocol, runs the uncompressed
exchange and records a group's statistics.

* :func:`exchange` runs one compressed group under its agreed :class:`~gcodec.transports.control.Exchange`
  by its mode, which follows from what its codec declares (:func:`~gcodec.transports.state.resolve_mode`):
  the factor protocol (``lowrank``: :func:`~gcodec.transports.lowrank.lowrank_protocol`) for a codec
  that declares ``low_rank``, else the flat protocol of the mode (summable, gather, two-phase). The
  uncompressed tensors that ride with a group (``riders``) travel in or beside its first data
  collective; the group's seconds and bytes are timed into its :class:`StepStats` and recorded in
  its state once.
* :func:`run` runs every group of a :class:`~gcodec.transports.plan.Plan` under one exchange, the
  dense items riding with the first group (the DDP hook's bucket).
* :func:`dense` is the uncompressed exchange alone: the agreement, then one allreduce.

What each rank sends of a ring allreduce or a reduce-scatter of ``n`` bytes is
:func:`~gcodec.transports.stats.ring_bytes` and :func:`~gcodec.transports.stats.scatter_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import xp
from .comm import Protocol, Work
from .control import Exchange
from .gather import gather_protocol
from .lowrank import LowRankItem, lowrank_protocol
from .plan import Plan
from .protocol_helpers import timed
from .state import TransportState
from .stats import StepStats, ring_bytes
from .summable import summable_protocol
from .two_phase import two_phase_protocol

__all__ = ["FLAT", "dense", "exchange", "joined", "run", "scatter"]

#: The flat protocols by mode: every group whose codec does not declare ``low_rank``.
FLAT = {"summable": summable_protocol, "gather": gather_protocol, "two_phase": two_phase_protocol}


def exchange(
    ex: Exchange,
    state: TransportState,
    mode: str,
    st: StepStats,
    op: str,
    *,
    x: Any = None,
    out: Any = None,
    items: Sequence[LowRankItem] | None = None,
    riders: Any = None,
) -> Protocol:
    """One group's exchange under ``ex``: ``x`` into ``out`` (under ``st.key``, at ``st.step``) by
    the flat protocol of ``mode``, or, under ``lowrank``, the factors of ``items`` (default: ``x``
    alone). ``riders``: flat float32 (float64) values of uncompressed tensors that come back
    summed. Its figures go to ``st`` and ``state``'s statistics."""
    if mode == "lowrank":
        got = list(items) if items else [LowRankItem(st.key, x, out)]
        proto = lowrank_protocol(ex, state, got, op, st.step, st, riders)
    else:
        proto = FLAT[mode](ex, state, x, out, st.key, op, st.step, st, dense=riders)
    yield from timed(st, proto)
    state.record(st)


def run(ex: Exchange, plan: Plan, op: str, riders: Any = None) -> Protocol:
    """Every group of ``plan`` in order under the one exchange ``ex`` (each group's input, output
    and :class:`StepStats` made by the engine), ``riders`` with the first."""
    for g in plan.groups:
        yield from exchange(
            ex,
            g.state,
            g.mode,
            g.stats,
            op,
            x=g.x,
            out=g.out,
            items=g.items,
            riders=riders if g is plan.groups[0] else None,
        )


def dense(ex: Exchange, st: StepStats, nbytes: int, start: Callable[[], Work]) -> Protocol:
    """The uncompressed exchange alone: the agreement first (the sum's size follows from the
    configuration), then one allreduce of ``nbytes`` (``start`` starts it), timed into ``st`` with
    its payload and ring bytes."""
    yield from ex.begin()
    st.add("payload_bytes", nbytes)
    st.add("wire_bytes", ring_bytes(nbytes, ex.comm.size))
    yield from timed(st, _one(start()))


def _one(work: Work) -> Protocol:
    yield work


def joined(arrays: Sequence[Any], dtype: Any, owed: Sequence[Any] | None = None) -> Any:
    """``arrays`` end to end in one new flat ``dtype`` array on the first one's memory (the dense
    items of a plan, riding or alone), each with what it still owes a codec it left (``owed``,
    :attr:`Plan.carried`: flat arrays or None) added."""
    flat = xp.concat([xp.flat(a) for a in arrays], arrays[0], dtype)
    pos = 0
    for a, r in zip(arrays, owed or ()):
        n = int(a.size)
        if r is not None:
            xp.add(flat[pos : pos + n], r)
        pos += n
    return flat


def scatter(outs: Sequence[Any], flat: Any) -> None:
    """Write the consecutive slices of ``flat`` into the arrays ``outs``, in order."""
    pos = 0
    for o in outs:
        n = int(o.size)
        xp.copy(xp.flat(o), flat[pos : pos + n])
        pos += n
