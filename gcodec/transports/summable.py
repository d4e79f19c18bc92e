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

The payload itself never leaves its rank (only values travel), so it is written without a payload
CRC; the summed values are checked instead (NaN or infinity on any rank is refused on every rank).

Bytes per rank are those of a ring allreduce of the values, 2 (p-1)/p of a payload. Unlike an
engine's float16 allreduce, which rounds at every hop in an order that depends on the algorithm
and p, the result rounds once, is bit-identical on every rank and does not depend on the engine.
For ``op="mean"`` each rank encodes x / p, so that the sum of p workers cannot overflow binary16
where the mean does not.
"""

from __future__ import annotations

import numpy as np

from ..aggregate import add_values, count_nonfinite, reseal, round_values, summable_values
from ..errors import GcodecError, PayloadValueError
from .collectives import as_bytes
from .comm import Communicator, Protocol
from .common import nbytes_from_others, work_dtype
from .sendbuf import encode_into
from .state import TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["chunk_bounds", "reduce_chunks", "summable_protocol"]


def chunk_bounds(n: int, p: int) -> list[int]:
    """p + 1 boundaries splitting n elements into p nearly equal contiguous chunks."""
    return [n * j // p for j in range(p + 1)]


def reduce_chunks(chunks: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Sum ``chunks`` (arrays of ``dtype``) in list order in float32 (float64 for float64) and round once."""
    acc = np.zeros(chunks[0].shape, np.float64 if dtype == np.float64 else np.float32)
    for c in chunks:
        add_values(c, acc)
    out = np.empty(acc.shape, dtype)
    round_values(acc, out)
    return out


def summable_protocol(
    comm: Communicator,
    state: TransportState,
    x: np.ndarray,
    out: np.ndarray,
    key: str,
    op: str,
    step: int,
    st: StepStats,
) -> Protocol:
    p, me = comm.size, comm.rank
    codec = state.codec
    wd = work_dtype(x.dtype)
    what = f"summable allreduce of {key!r}"
    err: BaseException | None = None
    # Step 1: encode x (x / p for a mean) with the worker's residual; randomk's stream is the step,
    # the same on every rank, so all ranks keep the same indices.
    with kernel_threads(state.threads), st.timing("encode_s"):
        if op == "mean":
            xs = state.scratch(key, x.shape, wd)
            np.multiply(x, wd.type(1.0 / p), out=xs)
        else:
            xs = x
        try:
            # The payload never leaves this process (only its values travel, and they are checked
            # after the sum), so it carries no payload CRC: no CRC pass on encode, reseal or decode.
            payload = encode_into(state.worker or codec, xs, key, step, state.send_buffers, 0, checksum=False)
            vals = summable_values(payload, verify_checksum=False)  # our own fresh payload
        except GcodecError as e:
            # e.g. NaN input for randomk: take part with a payload of NaN values. NaN survives the
            # sum, so every rank sees it and refuses the result; no size exchange is needed.
            err = e
            payload = codec.encode(np.zeros_like(xs), key=key, step=step, checksum=False)
            vals = summable_values(payload, verify_checksum=False)
            vals[...] = np.nan
    st.add("payload_bytes", len(payload))
    # Every rank has the same number of values (the handshake agreed on codec and shape), so the
    # chunk sizes are known everywhere and the collectives need no size exchange.
    bounds = chunk_bounds(vals.shape[0], p)
    raw = as_bytes(vals)
    isz = vals.dtype.itemsize
    sends = [raw[bounds[j] * isz : bounds[j + 1] * isz] for j in range(p)]
    mine_n = (bounds[me + 1] - bounds[me]) * isz

    # Step 2: reduce-scatter of the values.
    w = comm.alltoallv(sends, [mine_n] * p)
    yield w
    recv = w.result()
    st.add("wire_bytes", nbytes_from_others(recv, me))
    with kernel_threads(state.threads), st.timing("decode_s"):
        mine = reduce_chunks([r.view(vals.dtype) for r in recv], vals.dtype)

    # Step 3: all-gather of the reduced chunks into this rank's payload; then decode it once.
    w = comm.allgatherv(as_bytes(mine), [(bounds[j + 1] - bounds[j]) * isz for j in range(p)])
    yield w
    parts = w.result()
    st.add("wire_bytes", nbytes_from_others(parts, me))
    with kernel_threads(state.threads), st.timing("decode_s"):
        for j in range(p):
            vals[bounds[j] : bounds[j + 1]] = parts[j].view(vals.dtype)
        # The summed values are the same on every rank: all refuse them alike when any is not finite.
        bad = count_nonfinite(vals)
        if err is not None:
            raise err
        if bad:
            raise PayloadValueError(
                f"{what}: {bad} summed value(s) are NaN or infinite in {vals.dtype} (non-finite input or a "
                "failed encode on some rank, or an op='sum' beyond the type's range)"
            )
        reseal(payload)  # a no-op without a payload CRC; kept so a checksummed payload stays valid
        codec.decode(payload, out=out)
    return out
