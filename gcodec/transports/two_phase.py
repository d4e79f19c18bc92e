"""Two-phase mode: a compressed reduce-scatter, then a compressed all-gather (any codec).

Each rank owns a contiguous 1/p chunk of the flat tensor:

1. every rank encodes each chunk of its (error-corrected) tensor and sends chunk j's payload to
   rank j (all-to-all, sizes first);
2. rank j decodes the p payloads of its chunk, sums them in rank order (and divides by p for a
   mean), and re-encodes the result with its own *server-side* error-feedback residual, which
   carries what this second compression drops into the next step;
3. the owners' payloads are all-gathered and every rank decodes all p chunks.

Each rank sends and receives about (p-1)/p of a payload per phase, 2 (p-1)/p in all, like a ring
allreduce of the compressed tensor and unlike gather's p - 1 (the 1-bit Adam scheme of Tang et al.
2021, generalised to any codec). The cost is a second encode and decode and a second rounding of
each chunk. All ranks decode the same owner payloads, so they end with bit-identical results.
"""

from __future__ import annotations

from typing import Any

from .. import xp
from .collectives import as_bytes, empty_like
from .comm import Protocol
from .control import Exchange
from .gather import decode_sum, finish_into, refuse_nonfinite
from .protocol_helpers import gather_stream, nbytes_from_others, work_dtype
from .sendbuf import encode_into
from .state import OWNER_ALIGN, TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["owner_bounds", "two_phase_protocol"]

# Chunk boundaries fall on multiples of this many elements, so that the group-wise quantizers
# (groups of 64 by default) see the same groups as in a whole-tensor encode.
_ALIGN = OWNER_ALIGN


def owner_bounds(n: int, p: int) -> list[int]:
    """p + 1 boundaries: rank j owns elements [b[j], b[j+1]) of the flat tensor."""
    b = [min(n, (n * j // p) // _ALIGN * _ALIGN) for j in range(p)]
    return [*b, n]


def two_phase_protocol(
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
    """Two-phase allreduce of ``x`` into ``out`` (module docstring). ``dense``: optional flat float
    values of *uncompressed* tensors, summed in place by an allreduce that starts together with
    the first phase's all-to-all (:meth:`Exchange.alltoall_bytes`): no round trip of their own."""
    p, me = ex.comm.size, ex.comm.rank
    codec = state.codec
    what = f"two-phase allreduce of {key!r}"
    flat = xp.flat(x)
    empty = empty_like(x)
    b = owner_bounds(flat.shape[0], p)
    err: BaseException | None = None
    # the most bytes a rank may announce for one chunk's payload, in either phase
    cap = max(codec.max_payload_bytes((b[j + 1] - b[j],), flat.dtype) for j in range(p))

    # Phase 1: encode each chunk (worker residual per chunk) and scatter the payloads to the owners.
    sends = [empty] * p
    with kernel_threads(state.threads), st.timing("encode_s"):
        try:
            for j in range(p):
                payload = encode_into(
                    state.worker or codec,
                    flat[b[j] : b[j + 1]],
                    f"{key}[{j}/{p}]",
                    gather_stream(step, me, j, p),
                    state.send_buffers,
                    j,
                )
                sends[j] = as_bytes(payload)
        except Exception as e:
            err, sends = e, [empty] * p
    st.add("payload_bytes", sum(s.shape[0] for s in sends))
    recv = yield from ex.alltoall_bytes(sends, err, dense, cap)
    st.add("wire_bytes", nbytes_from_others(recv, me))

    # Phase 2: the owner sums its chunk and re-encodes it with the server residual.
    mine = empty
    with kernel_threads(state.threads), st.timing("decode_s"):
        try:
            acc = xp.zeros(x, b[me + 1] - b[me], work_dtype(x.dtype))
            decode_sum(codec, recv, acc, what)
            finish_into(acc, acc, op, p)
        except Exception as e:
            err = e
    if err is None:
        with kernel_threads(state.threads), st.timing("encode_s"):
            try:
                payload = encode_into(
                    state.server or codec, acc, f"{key}[{me}/{p}]", gather_stream(step, me, p, p), state.send_buffers, p
                )
                mine = as_bytes(payload)
            except Exception as e:
                err = e
    st.add("payload_bytes", mine.shape[0])
    parts = yield from ex.allgather_bytes(mine, err, cap=cap)
    st.add("wire_bytes", nbytes_from_others(parts, me))

    # Every rank decodes every owner's chunk into the output.
    oflat = xp.flat(out)
    with kernel_threads(state.threads), st.timing("decode_s"):
        try:
            for j in range(p):
                codec.decode(parts[j], out=oflat[b[j] : b[j + 1]])
            refuse_nonfinite(codec, oflat, what)  # an owner's sum re-encoded beyond fp16's range
        except Exception as e:
            err = e
    yield from ex.agree(err)
    return out
