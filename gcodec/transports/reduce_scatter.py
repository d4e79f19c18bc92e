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
2. one all-to-all moves everything; each destination's block starts with its groups' part sizes,
   and the block's length travels first in the exchange's control message (with this rank's
   error code): rank j receives the p payloads of its row;
3. each owner decodes its p payloads in rank order with ``accumulate=True`` into a float32 (float64
   for float64) accumulator per group, multiplies by ``scale`` and rounds once into its shard.

When every group is dense or uses a cast codec (fp16, bf16), the payloads' sizes are known on
every rank and their values add directly, so a shorter path runs (the *values* path, statistics
mode ``"summable"``): each rank encodes as above (same residuals, no payload CRC, since the payload
never leaves it) and sends only the values sections, in one all-to-all with no size exchange; the
owner adds the p value arrays in rank order into the float32 accumulator (exactly what decoding
them with ``accumulate=True`` does) and rounds once. Each rank's block to each rank starts with
its 8-byte error code, so the one all-to-all is also an all-gather of the codes: a rank whose
encode failed sends zeros, and every rank raises before adding anything. The values' size follows
from the configuration, so the exchange's control message (gcodec/transports/control.py) runs
first on its own: two collectives, against one for FSDP's own reduce-scatter and three for the
payload path; 8 bytes per block instead of a header and CRC.

Bytes per rank: (p-1)/p of the compressed row set, like an uncompressed reduce-scatter of the
payloads. There is no second phase (nothing is all-gathered back), hence no server residual.
A rank whose encode fails still takes part (its error code travels with the sizes, every rank
raises before data moves); a payload that fails its checks on its owner is reported in a final
error-agreement control message, so every rank raises a :class:`~gcodec.GcodecError` of the same class.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import xp
from ..aggregate import add_values
from ..arrays import BFLOAT16
from ..errors import GcodecError
from .collectives import as_bytes, empty_like, error_code, raise_agreed
from .comm import Protocol
from .control import Exchange
from .protocol_helpers import counted, gather_stream, work_dtype
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


def _gather_cols(row: Any, segments: Sequence[tuple[int, int]]) -> Any:
    """The group's segments of one row as one contiguous flat array (a view for one segment)."""
    if len(segments) == 1:
        a, b = segments[0]
        return xp.contiguous(row[a:b])
    return xp.concat([row[a:b] for a, b in segments], row)


def _as_float(part: Any, dtype: np.dtype) -> Any:
    """Raw bytes of a dense row segment as values of ``dtype`` (their uint16 bits for bfloat16
    and float16, which :func:`~gcodec.aggregate.add_values` widens exactly)."""
    return part.view(np.uint16 if dtype.itemsize == 2 else dtype)


def _scatter_cols(acc: Any, out: Any, segments: Sequence[tuple[int, int]], scale: float) -> None:
    """``out[segments] = acc * scale``, rounded once to out's type, segment by segment."""
    if scale != 1.0:
        xp.scale(acc, acc, scale)
    pos = 0
    for a, b in segments:
        xp.copy(out[a:b], acc[pos : pos + b - a])
        pos += b - a


#: Bytes of the error code in front of each rank's block on the values path.
_CODE = 8


def _values_dtypes(groups: Sequence[RSGroup], dtype: np.dtype) -> list[np.dtype] | None:
    """Per group, the number type of what travels on the values path; None when some group's
    payload is not one values section the ranks can sum (``codec.values_dtype``) or the input is float64."""
    if work_dtype(dtype) != np.float32:
        return None
    out: list[np.dtype] = []
    for g in groups:
        if g.state is None:
            out.append(BFLOAT16 if dtype == BFLOAT16 else np.dtype(dtype))
        elif g.state.codec.values_dtype is not None:
            out.append(g.state.codec.values_dtype)
        else:
            return None
    return out


def _cast_values(ts: TransportState, x: np.ndarray, key: str, out: np.ndarray) -> None:
    """The values ``encode`` would put in the payload of ``x`` (``codec.values_dtype``) (with the worker's
    residual when error feedback is on), written into ``out``."""
    if ts.worker is not None:
        ts.worker.encode_values(x, key, out)
        return
    flat = x.reshape(-1)
    if flat.dtype not in (np.float32, np.float64):
        flat = flat.astype(np.float32)  # 16-bit inputs widen exactly, as the codec does
    ts.codec.encode_values(flat, out)


def _values_protocol(
    ex: Exchange,
    x: Any,
    out: Any,
    groups: Sequence[RSGroup],
    dtypes: list[np.dtype],
    scale: float,
    what: str,
    threads: int | None,
) -> Protocol:
    """The values path (module doc): one all-to-all of [error code | values of every group]."""
    comm = ex.comm
    p = comm.size
    # The blocks' size follows from the configuration: agree on it before they travel.
    yield from ex.begin()
    ng = len(groups)
    nbytes = [g.numel * dt.itemsize for g, dt in zip(groups, dtypes)]
    block = _CODE + sum(nbytes)  # what each rank sends to each rank
    # One contiguous send buffer (kept by the first codec group's state: no page faults per call).
    keeper = next((g for g in groups if g.state is not None), None)
    if keeper is None or keeper.state is None:
        send = xp.empty(x, p * block, np.uint8)
    else:
        kept = keeper.state.send_buffers
        buf = kept.get(f"{keeper.key}#values", 0, x)
        if buf is None or buf.shape[0] < p * block:
            buf = kept.grow(f"{keeper.key}#values", 0, p * block, x)
        send = buf[: p * block]
    err: BaseException | None = None
    off = _CODE
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        t0 = time.perf_counter()
        with kernel_threads(threads):
            for j in range(p):
                dst = send[j * block + off : j * block + off + nbytes[gi]]
                xj = _gather_cols(x[j], g.segments)
                if g.state is None:
                    xp.copy(dst, as_bytes(xj))
                    continue
                ts = g.state
                try:
                    # the values straight into the send buffer: no payload, header or copy
                    _cast_values(ts, xj, f"{g.key}[{j}/{p}]", dst.view(np.uint16))
                except Exception as e:  # take part with zeros; the error code below tells every rank
                    err = err or e
                    xp.fill(dst, 0)
        st.add("encode_s", time.perf_counter() - t0)
        st.add("payload_bytes", nbytes[gi] * p)
        off += nbytes[gi]
    code = np.array([error_code(err)], np.int64).view(np.uint8)
    for j in range(p):
        xp.copy(send[j * block : j * block + _CODE], code)  # 8 bytes from the host per block
    t0 = time.perf_counter()
    w = comm.alltoallv([send[j * block : (j + 1) * block] for j in range(p)], [block] * p)
    yield w
    recv = w.result()
    comm_s = time.perf_counter() - t0
    # Every rank sent its error code to every rank: an all-gather of the codes, for free.
    codes = [xp.to_host(recv[r][:_CODE]).view(np.int64)[0] for r in range(p)]  # 8 bytes each to the host
    raise_agreed(np.array(codes), err, what)
    for g, nb in zip(groups, nbytes):
        st = g.stats
        assert st is not None
        st.add("wire_bytes", nb * (p - 1))
        st.add("comm_s", comm_s * nb / (block - _CODE) if block > _CODE else comm_s / ng)
    off = _CODE
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        with kernel_threads(threads), st.timing("decode_s"):
            acc = xp.zeros(x, g.numel, np.float32)
            for r in range(p):
                add_values(_as_float(recv[r][off : off + nbytes[gi]], dtypes[gi]), acc, dtypes[gi])  # exact widening
            _scatter_cols(acc, out, g.segments, scale)
        off += nbytes[gi]
    return out


def reduce_scatter_protocol(
    ex: Exchange,
    x: Any,
    out: Any,
    groups: Sequence[RSGroup],
    scale: float,
    what: str,
    threads: int | None = None,
) -> Protocol:
    """Reduce-scatter ``x`` (shape ``(p, S)``) into ``out`` (shape ``(S,)``): see the module doc.

    ``x`` and ``out`` live on one memory, host or device; every buffer is made there. Each group's
    ``stats`` (a :class:`StepStats`, made here when None) receives its payload, wire, encode,
    communication and decode figures; the bytes copied between host and device (sizes and codes
    only) go to the first group's ``host_bytes``. The caller records them.
    """
    comm = ex.comm
    p = comm.size
    if x.ndim != 2 or x.shape[0] != p or out.shape != (x.shape[1],):
        bad = GcodecError(f"{what}: input of shape {x.shape} and output {out.shape} do not match {p} ranks")
        yield from ex.begin(bad)  # the peers raise too
        raise bad
    dtypes = _values_dtypes(groups, x.dtype)
    mode = "reduce_scatter" if dtypes is None else "summable"
    for g in groups:
        if g.stats is None:
            g.stats = StepStats(g.key, g.step, mode if g.state else "dense", g.numel * p * x.dtype.itemsize)
    if dtypes is not None:
        body = _values_protocol(ex, x, out, groups, dtypes, scale, what, threads)
    else:
        body = _payload_protocol(ex, x, out, groups, what, scale, threads)
    st = groups[0].stats if groups else None
    return (yield from (body if st is None else counted(st, body)))


def _payload_protocol(
    ex: Exchange,
    x: Any,
    out: Any,
    groups: Sequence[RSGroup],
    what: str,
    scale: float,
    threads: int | None,
) -> Protocol:
    """The payload path (module doc, steps 1-3)."""
    comm = ex.comm
    p, me = comm.size, comm.rank
    ng = len(groups)
    err: BaseException | None = None

    # Step 1: per destination j, one part per group (payload or raw bytes).
    empty = empty_like(x)
    sends: list[list[Any]] = [[empty] * ng for _ in range(p)]
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        t0 = time.perf_counter()
        try:
            with kernel_threads(threads):
                for j in range(p):
                    xj = _gather_cols(x[j], g.segments)
                    if g.state is None:
                        sends[j][gi] = as_bytes(xj)
                    else:
                        ts = g.state
                        payload = encode_into(
                            ts.worker or ts.codec,
                            xj,
                            f"{g.key}[{j}/{p}]",
                            gather_stream(g.step, me, j, p),
                            ts.send_buffers,
                            j,
                        )
                        sends[j][gi] = as_bytes(payload)
        except Exception as e:
            err = e
        st.add("encode_s", time.perf_counter() - t0)
        st.add("payload_bytes", sum(sends[j][gi].shape[0] for j in range(p)))
    if err is not None:
        sends = [[empty] * ng for _ in range(p)]

    # Step 2: the size of each destination's block travels in the exchange's control message (with
    # the error code); each block starts with its groups' part sizes, then one all-to-all.
    # (the part sizes are host words: on a device, 8 bytes per group and destination cross)
    bufs = [xp.concat([np.array([s.shape[0] for s in parts], np.int64).view(np.uint8), *parts], x) for parts in sends]
    t0 = time.perf_counter()
    # the most a destination's block can hold under the agreed groups: the part sizes, raw rows
    # and each codec's largest payload of its segments
    cap = 8 * ng + sum(
        g.numel * x.dtype.itemsize if g.state is None else g.state.codec.max_payload_bytes((g.numel,), x.dtype)
        for g in groups
    )
    table = yield from ex.sizes([b.shape[0] for b in bufs], err, cap)  # table[src, dst]
    w = comm.alltoallv(bufs, [int(table[r, me]) for r in range(p)])
    yield w
    recv = w.result()
    comm_s = time.perf_counter() - t0
    sizes = np.zeros((p, ng), np.int64)  # sizes[src, g]: what src sent here for group g
    try:
        for r in range(p):
            sizes[r] = _part_sizes(recv[r], ng, r, what)
    except Exception as e:  # a lying peer: tell every rank in the final agreement
        err = e
    total_wire = int(sizes.sum() - sizes[me].sum())
    for gi, g in enumerate(groups):
        st = g.stats
        assert st is not None
        wire = sum(int(sizes[r, gi]) for r in range(p) if r != me)
        st.add("wire_bytes", wire)
        st.add("comm_s", comm_s * (wire / total_wire if total_wire else 1.0 / ng))

    # Step 3: the owner decodes and sums its row, group by group, in rank order; rounds once.
    wd = work_dtype(x.dtype)
    for gi, g in enumerate(groups if err is None else []):
        st = g.stats
        assert st is not None
        with kernel_threads(threads), st.timing("decode_s"):
            try:
                acc = xp.zeros(x, g.numel, wd)
                for r in range(p):
                    off = 8 * ng + int(sizes[r, :gi].sum())
                    part = recv[r][off : off + int(sizes[r, gi])]
                    if g.state is None:
                        if part.shape[0] != g.numel * x.dtype.itemsize:
                            raise GcodecError(f"{what}: rank {r} sent {part.shape[0]} bytes of values for {g.key!r}")
                        add_values(_as_float(part, x.dtype), acc, x.dtype)
                    else:
                        if part.shape[0] == 0:
                            raise GcodecError(f"{what}: rank {r} sent no payload for {g.key!r}")
                        g.state.codec.decode(part, out=acc, accumulate=True)
                _scatter_cols(acc, out, g.segments, scale)
            except Exception as e:
                err = e
    yield from ex.agree(err)
    return out


def _part_sizes(block: Any, ng: int, r: int, what: str) -> np.ndarray:
    """The ``ng`` part sizes at the start of rank r's block, checked against the block's length
    (a peer's block is untrusted input like any payload); on a device, only these 8 ng bytes
    come to the host."""
    if block.shape[0] < 8 * ng:
        raise GcodecError(f"{what}: rank {r} sent a block of {block.shape[0]} bytes, shorter than its {ng} part sizes")
    sizes = np.array(xp.to_host(block[: 8 * ng]), copy=True).view(np.int64)
    if bool((sizes < 0).any()) or int(sizes.sum()) != block.shape[0] - 8 * ng:
        raise GcodecError(f"{what}: rank {r}'s part sizes {sizes.tolist()} do not add up to its block")
    return sizes
