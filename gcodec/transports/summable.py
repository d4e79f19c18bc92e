"""Summable mode: reduce the payloads' values themselves, decode once.

For fp16, bf16 and shared-seed Random-K the payloads of all ranks share their header (same params,
same indices: Random-K draws its indices from the step, identical on every rank), and their values
add elementwise. So each rank encodes, and the ranks sum the *values sections* of their payloads,
then each decodes its own (now summed) payload once.

The sum is a reduce-scatter and an all-gather of the values, written out here rather than left
to the engine's allreduce:

1. each rank splits its values into p chunks and sends chunk j to rank j (all-to-all);
2. rank j adds the p copies of its chunk in float32 (float64 for float64 values), in rank order,
   and rounds the sum once to the values' type;
3. the reduced chunks are all-gathered into every rank's payload, which is decoded once.

With two ranks the two collectives become one: each rank all-gathers the whole values and sums
both copies itself. At p = 2 that moves the same bytes ((p-1) n = 2 (p-1)/p n) and gives the same
sums (every element added in rank order, rounded once), with one round trip instead of two.

*Riders*: the caller may hand over a flat float32/float64 array of uncompressed values (the
tensors a DDP bucket keeps dense) that comes back summed over the ranks. With p > 2 they travel in
the same collectives, ahead of the values in each message, summed in rank order; with p = 2 in an
allreduce started together with the values' all-gather (a sum of two terms has one order). A
bucket then waits once (twice for p > 2), not once more for its biases.

The payload itself never leaves its rank (only values travel), so it is written without a payload
CRC; the summed values are checked instead (NaN or infinity on any rank is refused on every rank).

Bytes per rank are those of a ring allreduce of the values, 2 (p-1)/p of a payload. Unlike an
engine's float16 allreduce, which rounds at every hop in an order that depends on the algorithm
and p, the result rounds once, is bit-identical on every rank and does not depend on the engine.
For ``op="mean"`` each rank encodes x / p, so that the sum of p workers cannot overflow binary16
where the mean does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import xp
from ..aggregate import add_values, count_nonfinite, round_values, sum_pair, summable_section
from ..codecs import Codec
from ..errors import ConfigError, PayloadValueError
from .collectives import as_bytes
from .comm import Communicator, Protocol, with_riders
from .control import Exchange
from .protocol_helpers import nbytes_from_others, work_dtype
from .sendbuf import encode_into
from .state import TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["chunk_bounds", "summable_protocol"]


def chunk_bounds(n: int, p: int) -> list[int]:
    """p + 1 boundaries splitting n elements into p nearly equal contiguous chunks."""
    return [n * j // p for j in range(p + 1)]


def summable_protocol(
    ex: Exchange,
    state: TransportState,
    x: Any,
    out: Any,
    key: str,
    op: str,
    step: int,
    st: StepStats,
    dense: Any = None,
) -> Protocol:
    """Summable allreduce of ``x`` into ``out`` (arrays on one memory, host or device: every buffer
    is made there). ``dense``: optional flat float32/float64 values of *uncompressed* tensors that
    ride in the same collectives and are replaced by their plain sum over the ranks (not the mean:
    the caller scales), summed in rank order like the values."""
    comm = ex.comm
    p = comm.size
    # The values' size follows from the configuration: agree on it before they travel. The BEGIN
    # starts now and is waited for after the encode, which it does not depend on: its round trip
    # (a gloo all-gather of 7 words, 0.3-1.5 ms on a loaded 2-core machine) overlaps the encode.
    ex.start()
    codec = state.codec
    wd = work_dtype(x.dtype)
    what = f"summable allreduce of {key!r}"
    err: BaseException | None = None
    # Step 1: encode x (x / p for a mean) with the worker's residual; randomk's stream is the step,
    # the same on every rank, so all ranks keep the same indices.
    with kernel_threads(state.threads), st.timing("encode_s"):
        if op == "mean":
            xs = state.send_buffers.scratch(key, x.size, wd, x)
            xp.scale(xs, xp.flat(x), 1.0 / p)
            xs = xs.reshape(x.shape)
        else:
            xs = x
        try:
            # The payload never leaves this process (only its values travel, and they are checked
            # after the sum), so it carries no payload CRC: no CRC pass on encode, reseal or decode.
            payload = encode_into(state.worker or codec, xs, key, step, state.send_buffers, 0, checksum=False)
            vals, vdt = summable_section(payload, verify_checksum=False)  # our own fresh payload
        except Exception as e:
            # e.g. NaN input for randomk, or any failure of this rank's own work: take part with
            # NaN in place of the values (as many as the configuration fixes, encoding nothing, so
            # that an encoder that cannot run at all still takes part). NaN survives the sum, so
            # every rank sees it and refuses the result; no size exchange is needed.
            err, payload = e, None
            count, vdt = _values_layout(codec, xs)
            vals = xp.empty(xs, count, np.uint16 if xp.on_device(xs) and vdt.itemsize == 2 else vdt)
            xp.fill(vals, np.nan, vdt)
    st.add("payload_bytes", vals.nbytes if payload is None else len(payload))
    yield from ex.begin()
    # Every rank has the same number of values (the handshake agreed on codec and shape) and of
    # riders (the caller's layout is the same on every rank), so the chunk sizes are known
    # everywhere and the collectives need no size exchange.
    riders = xp.empty(vals, 0, np.float32) if dense is None else dense
    bad: int | None
    if p == 2:
        # Where the codec decodes a values section by itself (fp16, bf16), the two copies are summed
        # and decoded in one pass straight into ``out``; a refused sum then leaves its decoded
        # values there, as an uncompressed allreduce would.
        fuse = codec.values_dtype is not None and out.dtype == np.float32 and xp.is_contiguous(out)
        flat_out = xp.flat(out) if fuse else None
        bad = yield from _sum_by_allgather(comm, vals, vdt, riders, st, state, flat_out)
        if flat_out is not None:
            if err is not None:
                raise err
            _refuse_nonfinite(bad, what, vdt)
            return out
    else:
        bad = yield from _sum_by_reduce_scatter(comm, vals, vdt, riders, st, state)
    with kernel_threads(state.threads), st.timing("decode_s"):
        # The summed values are the same on every rank: all refuse them alike when any is not finite.
        if bad is None:
            bad = count_nonfinite(vals, vdt)
        if err is not None:
            raise err
        _refuse_nonfinite(bad, what, vdt)
        # No reseal: the payload was written without a payload CRC (above), so its summed values
        # need none, and a reseal would only parse the payload again.
        codec.decode(payload, out=out)
    return out


def _values_layout(codec: Codec, xs: Any) -> tuple[int, np.dtype]:
    """(count, number type) of ``codec``'s summable values for ``xs`` (Codec.summable_values)."""
    got = codec.summable_values(tuple(xs.shape), xs.dtype)
    if got is None:  # resolve_mode sends only summable codecs here
        raise ConfigError(f"codec {codec.codec_id!r} declares no summable values")
    return got


def _refuse_nonfinite(bad: int, what: str, vdt: np.dtype) -> None:
    if bad:
        raise PayloadValueError(
            f"{what}: {bad} summed value(s) are NaN or infinite in {vdt} (non-finite input or a "
            "failed encode on some rank, or an op='sum' beyond the type's range)"
        )


def _reduce_into(parts: list[Any], dst: Any, dt: np.dtype) -> int | None:
    """``dst`` = the sum of ``parts`` (byte buffers of ``dst``'s values, number type ``dt``) in rank
    order, in float32 (float64 for float64) from +0, rounded once. Returns the number of non-finite
    sums when the pass counted them (two parts: one fused pass, the same arithmetic), else None."""
    if not dst.shape[0]:
        return 0
    chunks = [q.view(dst.dtype) for q in parts]
    if len(chunks) == 2:
        return sum_pair(chunks[0], chunks[1], dst, dt)
    acc = xp.zeros(dst, dst.shape[0], np.float64 if dt == np.float64 else np.float32)
    for c in chunks:
        add_values(c, acc, dt)
    round_values(acc, dst, dt)
    return None


def _sum_by_allgather(
    comm: Communicator,
    vals: Any,
    vdt: np.dtype,
    riders: Any,
    st: StepStats,
    state: TransportState,
    decoded: Any = None,
) -> Protocol:
    """p = 2: one all-gather of the whole values; each rank sums both copies.

    Same bytes as reduce-scatter + all-gather at p = 2 ((p-1) n = 2 (p-1)/p n), one collective
    instead of two, and the same sums: every element is added in rank order and rounded once.
    The riders go in an allreduce started together with it (the sum of two float32 terms is the
    same in any order), waited for together: no copy of the values next to them. ``decoded``: a
    flat array that receives the codec's decode of the summed section (``decode_values_sum``)
    instead of the sum being written into ``vals``. Returns how many sums are not finite.
    """
    vb = as_bytes(vals)
    gather = comm.allgatherv(vb, [vb.shape[0]] * comm.size)
    yield with_riders(comm, riders, gather)
    parts = gather.result()
    st.add("wire_bytes", nbytes_from_others(parts, comm.rank))
    with kernel_threads(state.threads), st.timing("decode_s"):
        if decoded is not None:
            a, b = (q.view(vals.dtype) for q in parts)
            return state.codec.decode_values_sum(a, b, decoded)
        return _reduce_into(parts, vals, vdt)


def _sum_by_reduce_scatter(
    comm: Communicator, vals: Any, vdt: np.dtype, riders: Any, st: StepStats, state: TransportState
) -> Protocol:
    """p > 2: all-to-all of chunk j (riders' then values') to rank j, which sums the p copies in rank
    order; all-gather of the summed chunks. 2 (p-1)/p of the bytes per rank, as a ring allreduce."""
    p, me = comm.size, comm.rank
    vb, rb = as_bytes(vals), as_bytes(riders)
    vi, ri = vals.dtype.itemsize, riders.dtype.itemsize
    vbnd, rbnd = chunk_bounds(vals.shape[0], p), chunk_bounds(riders.shape[0], p)

    def cut(j: int) -> tuple[slice, slice]:
        return slice(rbnd[j] * ri, rbnd[j + 1] * ri), slice(vbnd[j] * vi, vbnd[j + 1] * vi)

    sizes = [(rbnd[j + 1] - rbnd[j]) * ri + (vbnd[j + 1] - vbnd[j]) * vi for j in range(p)]
    if rb.shape[0] == 0:
        sends = [vb[cut(j)[1]] for j in range(p)]  # contiguous views: no copy
    else:
        sends = [xp.concat([rb[cut(j)[0]], vb[cut(j)[1]]], vb) for j in range(p)]
    w = comm.alltoallv(sends, [sizes[me]] * p)
    yield w
    recv = w.result()
    nr = (rbnd[me + 1] - rbnd[me]) * ri
    st.add("wire_bytes", nbytes_from_others(recv, me) - (p - 1) * nr)  # the values' bytes only
    mine_r = xp.empty(vals, rbnd[me + 1] - rbnd[me], riders.dtype)
    mine_v = xp.empty(vals, vbnd[me + 1] - vbnd[me], vals.dtype)
    with kernel_threads(state.threads), st.timing("decode_s"):
        _reduce_into([q[:nr] for q in recv], mine_r, riders.dtype)
        _reduce_into([q[nr:] for q in recv], mine_v, vdt)
    mine = as_bytes(mine_v) if nr == 0 else xp.concat([as_bytes(mine_r), as_bytes(mine_v)], vb)
    w = comm.allgatherv(mine, sizes)
    yield w
    parts = w.result()
    st.add("wire_bytes", sum((vbnd[j + 1] - vbnd[j]) * vi for j in range(p) if j != me))
    for j in range(p):
        rs, vs = cut(j)
        n = rs.stop - rs.start
        xp.copy(rb[rs], parts[j][:n])
        xp.copy(vb[vs], parts[j][n:])
    return None  # the gathered sums are counted by the caller
