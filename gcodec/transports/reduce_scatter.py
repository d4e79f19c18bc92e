"""A compressed reduce-scatter: the sharded-data-parallel gradient exchange (FSDP, ZeRO).

The input is ``x`` of shape ``(p, S)``: row j is what this rank contributes to rank j's shard of S
elements (FSDP2's layout: row j holds chunk j of every parameter, one after the other). The output
is this rank's shard, ``scale * sum over ranks r of row[me] of rank r``.

The S columns are split into *groups* (by the caller's policy): each group is a list of column
segments, the same in every row, with a codec (and that codec's :class:`TransportState`, which holds
the error-feedback residuals and statistics) or none (dense: the row's raw values travel as they
are, as in an uncompressed reduce-scatter). Then:

1. for each group and each destination j, this rank gathers the group's segments of row j into one
   flat array and encodes it (with its own worker residual per (group, j) when error feedback is
   on; a dense group sends the raw bytes);
2. one all-to-all moves everything, sizes first (one all-gather of a ``p x groups`` table, with this
   rank's error code): rank j receives the p payloads of its row;
3. each owner decodes its p payloads in rank order with ``accumulate=True`` into a float32 (float64
   for float64) accumulator per group, multiplies by ``scale`` and rounds once into its shard.

Bytes per rank: (p-1)/p of the compressed row set, like an uncompressed reduce-scatter of the
payloads. There is no second phase (nothing is all-gathered back), hence no server residual.
A rank whose encode fails still takes part (its error code travels with the sizes, every rank
raises before data moves); a payload that fails its checks on its owner is reported in a final
error-agreement allreduce, so every rank raises a :class:`~gcodec.GcodecError` of the same class.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..arrays import BFLOAT16
from ..errors import GcodecError
from .collectives import EMPTY, agree, as_bytes, error_code, raise_agreed
from .comm import Communicator, Protocol
from .common import gather_stream, work_dtype
from .sendbuf import encode_into
from .state import TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["RSGroup", "reduce_scatter_protocol"]


@dataclass
class RSGroup:
    """One group of columns of a reduce-scatter.

    ``segments`` are ``(start, stop)`` column ranges of a row (the same in every row); ``state`` is
    the codec's transport state, or None for a dense group; ``key`` names the group (statistics,
    residuals ``f"{key}[{j}/{p}]"``); ``step`` is this exchange's step (random streams).
    """

    key: str
    segments: list[tuple[int, int]]
    state: TransportState | None
    step: int = 0
    stats: StepStats | None = field(default=None, repr=False)

    @property
    def numel(self) -> int:
        return sum(b - a for a, b in self.segments)


def _gather_cols(row: np.ndarray, segments: Sequence[tuple[int, int]]) -> np.ndarray:
    if len(segments) == 1:
        a, b = segments[0]
        return row[a:b]
    return np.concatenate([row[a:b] for a, b in segments])


def _as_float(part: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Raw bytes of a dense row segment as values of ``dtype`` (bfloat16 via ml_dtypes)."""
    return part.view(BFLOAT16 if dtype == BFLOAT16 else dtype)


def reduce_scatter_protocol(
    comm: Communicator,
    x: np.ndarray,
    out: np.ndarray,
    groups: Sequence[RSGroup],
    scale: float,
    what: str,
    threads: int | None = None,
) -> Protocol:
    """Reduce-scatter ``x`` (shape ``(p, S)``) into ``out`` (shape ``(S,)``): see the module doc.

    Each group's ``stats`` (a :class:`StepStats`, made here when None) receives its payload, wire,
    encode, communication and decode figures; the caller records them.
    """
    p, me = comm.size, comm.rank
    if x.ndim != 2 or x.shape[0] != p or out.shape != (x.shape[1],):
        raise GcodecError(f"{what}: input of shape {x.shape} and output {out.shape} do not match {p} ranks")
    ng = len(groups)
    for g in groups:
        if g.stats is None:
            g.stats = StepStats(g.key, g.step, "reduce_scatter" if g.state else "dense", g.numel * p * x.itemsize)
    err: BaseException | None = None

    # Step 1: per destination j, one part per group (payload or raw bytes).
    sends: list[list[np.ndarray]] = [[EMPTY] * ng for _ in range(p)]
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        t0 = time.perf_counter()
        try:
            with kernel_threads(threads):
                for j in range(p):
                    xj = _gather_cols(x[j], g.segments)
                    if g.state is None:
                        sends[j][gi] = as_bytes(np.ascontiguousarray(xj))
                    else:
                        ts = g.state
                        payload = encode_into(
                            ts.worker or ts.codec,
                            np.ascontiguousarray(xj),
                            f"{g.key}[{j}/{p}]",
                            gather_stream(g.step, me, j, p),
                            ts.send_buffers,
                            j,
                        )
                        sends[j][gi] = as_bytes(payload)
        except GcodecError as e:
            err = e
        st.add("encode_s", time.perf_counter() - t0)
        st.add("payload_bytes", sum(sends[j][gi].shape[0] for j in range(p)))
    if err is not None:
        sends = [[EMPTY] * ng for _ in range(p)]

    # Step 2: sizes (with the error code), then one all-to-all of the concatenated parts.
    head = np.array([*(s.shape[0] for parts in sends for s in parts), error_code(err)], np.int64)
    t0 = time.perf_counter()
    w = comm.allgather(head)
    yield w
    table = w.result().reshape(p, p * ng + 1)  # table[src, dst * ng + g]; last column: src's error
    raise_agreed(table[:, -1], err, what)
    sizes = table[:, :-1].reshape(p, p, ng)
    bufs = [np.concatenate(parts) if ng > 1 else parts[0] for parts in sends]
    w = comm.alltoallv(bufs, [int(sizes[r, me].sum()) for r in range(p)])
    yield w
    recv = w.result()
    comm_s = time.perf_counter() - t0
    total_wire = sum(int(sizes[r, me].sum()) for r in range(p) if r != me)
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        wire = sum(int(sizes[r, me, gi]) for r in range(p) if r != me)
        st.add("wire_bytes", wire)
        st.add("comm_s", comm_s * (wire / total_wire if total_wire else 1.0 / ng))

    # Step 3: the owner decodes and sums its row, group by group, in rank order; rounds once.
    wd = work_dtype(x.dtype)
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        with kernel_threads(threads), st.timing("decode_s"):
            try:
                acc = np.zeros(g.numel, wd)
                for r in range(p):
                    off = int(sizes[r, me, :gi].sum())
                    part = recv[r][off : off + int(sizes[r, me, gi])]
                    if g.state is None:
                        vals = _as_float(part, x.dtype)
                        if vals.shape[0] != g.numel:
                            raise GcodecError(f"{what}: rank {r} sent {vals.shape[0]} values for {g.key!r}")
                        acc += vals
                    else:
                        if part.shape[0] == 0:
                            raise GcodecError(f"{what}: rank {r} sent no payload for {g.key!r}")
                        g.state.codec.decode(part, out=acc, accumulate=True)
                if scale != 1.0:
                    acc *= wd.type(scale)
                pos = 0
                for a, b in g.segments:
                    out[a:b] = acc[pos : pos + b - a]
                    pos += b - a
            except GcodecError as e:
                err = e
    yield from agree(comm, err, what)
    return out
