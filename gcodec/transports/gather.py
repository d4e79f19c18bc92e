"""Gather mode: all-gather every rank's payload; every rank decodes all p and sums them.

Works with every codec (each payload is decoded on its own, so per-worker scales and indices are
fine). Each rank receives the p - 1 payloads of the others: (p - 1) payloads per rank, which beats
a dense ring allreduce (2 (p-1)/p of the tensor) only while a payload is smaller than about 2/p of
the tensor. ``mode="auto"`` therefore uses it for p <= 2 and two-phase above; it stays available
for any p, for debugging and for codecs whose payloads are tiny.

All ranks decode the same bytes in the same (rank) order, so they end with bit-identical sums.
Stochastic codecs draw a different stream on each rank (independent rounding noise averages out
over the p payloads).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import xp
from ..aggregate import count_nonfinite
from ..errors import GcodecError, PayloadValueError
from .collectives import as_bytes, empty_like
from .comm import Protocol
from .control import Exchange
from .protocol_helpers import counted, gather_stream, nbytes_from_others, work_dtype
from .sendbuf import encode_into
from .state import TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["allgather_protocol", "decode_sum", "finish_into", "gather_protocol"]


def decode_sum(codec: object, parts: list[Any], acc: Any, what: str) -> None:
    """acc += decode(part) for each part, in order (``acc`` flat float32/float64, host or device).
    A codec that carries NaN and infinity (fp16, bf16) may leave them in the sum: it is then
    refused (:func:`refuse_nonfinite`), as the summable protocol refuses such sums, so that the
    mode does not decide whether a peer's infinity reaches the result."""
    for r, part in enumerate(parts):
        if part.shape[0] == 0:
            raise GcodecError(f"{what}: rank {r} sent no payload")
        codec.decode(part, out=acc, accumulate=True)  # type: ignore[attr-defined]
    refuse_nonfinite(codec, acc, what)


def refuse_nonfinite(codec: object, values: Any, what: str) -> None:
    """Raise PayloadValueError when a codec that carries non-finite values decoded some into
    ``values`` (the same bytes on every rank, so every rank raises alike). Other codecs' decoders
    refuse non-finite values, so their results need no pass of their own."""
    if not getattr(codec, "carries_nonfinite", False):
        return
    bad = count_nonfinite(values)
    if bad:
        raise PayloadValueError(
            f"{what}: {bad} summed value(s) are NaN or infinite (a non-finite input on some rank, or a sum "
            f"beyond the {getattr(codec, 'codec_id', 'codec')} range); refused on every rank"
        )


def finish_into(out: Any, acc: Any, op: str, p: int) -> None:
    """``out`` (flat) = the sum ``acc``, divided by ``p`` for a mean: the division writes straight
    into ``out`` where it has ``acc``'s type (one pass; ``out`` may be ``acc``), else it runs in
    ``acc`` and a copy rounds once into ``out``'s type."""
    if out.dtype != acc.dtype:
        finish_into(acc, acc, op, p)
        xp.copy(out, acc)
    elif op == "mean":
        xp.scale(out, acc, 1.0 / p)
    elif out is not acc:
        xp.copy(out, acc)


def gather_protocol(
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
    """Gather allreduce of ``x`` into ``out`` (module docstring). ``dense``: optional flat float
    values of *uncompressed* tensors, summed in place by an allreduce that starts together with
    the payloads' all-gather (:meth:`Exchange.allgather_bytes`): no round trip of their own."""
    p, me = ex.comm.size, ex.comm.rank
    codec = state.codec
    what = f"gather allreduce of {key!r}"
    err: BaseException | None = None
    buf = empty_like(x)
    with kernel_threads(state.threads), st.timing("encode_s"):
        try:
            payload = encode_into(state.worker or codec, x, key, gather_stream(step, me, 0, p), state.send_buffers, 0)
            buf = as_bytes(payload)
        except Exception as e:
            err = e
    st.add("payload_bytes", buf.shape[0])
    parts = yield from ex.allgather_bytes(buf, err, dense, codec.max_payload_bytes(tuple(x.shape), x.dtype))
    st.add("wire_bytes", nbytes_from_others(parts, me))
    acc = xp.zeros(x, x.size, work_dtype(x.dtype))
    with kernel_threads(state.threads), st.timing("decode_s"):
        try:
            decode_sum(codec, parts, acc, what)
        except Exception as e:  # a peer's payload failed its checks here: tell every rank
            err = e
    yield from ex.agree(err)  # out is written only once every rank has decoded every payload
    with st.timing("decode_s"):
        finish_into(xp.flat(out), acc, op, p)
    return out


def allgather_protocol(
    ex: Exchange,
    codec: object,
    x: Any,
    out: Any,
    key: str,
    step: int,
    st: StepStats,
    threads: int | None = None,
) -> Protocol:
    """All-gather of compressed values: rank r's ``x`` lands, encoded and decoded, in ``out[r]``.

    Every rank encodes its own ``x`` (no residual: what is gathered is a copy, the caller keeps the
    exact values), the payloads travel in one all-gather (sizes and error codes first) and every
    rank decodes all p of them, its own included, so the p gathered copies are bit-identical.
    ``out`` is ``(p, x.size)`` of any float dtype (decoded in float32 and cast once); ``x`` may be
    a view of ``out[me]``: it is encoded before anything is written to ``out``. ``x`` and ``out``
    live on one memory, host or device; the bytes that crossed between them go to ``st``'s
    ``host_bytes``.
    """
    return (yield from counted(st, _allgather(ex, codec, x, out, key, step, st, threads)))


def _allgather(
    ex: Exchange,
    codec: object,
    x: Any,
    out: Any,
    key: str,
    step: int,
    st: StepStats,
    threads: int | None = None,
) -> Protocol:
    """The body of :func:`allgather_protocol`."""
    p, me = ex.comm.size, ex.comm.rank
    what = f"compressed all-gather of {key!r}"
    err: BaseException | None = None
    buf = empty_like(x)
    with kernel_threads(threads), st.timing("encode_s"):
        try:
            buf = as_bytes(codec.encode(x, key=key, step=gather_stream(step, me, 0, p)))  # type: ignore[attr-defined]
        except Exception as e:
            err = e
    st.add("payload_bytes", buf.shape[0])
    cap = codec.max_payload_bytes(tuple(x.shape), x.dtype)  # type: ignore[attr-defined]
    parts = yield from ex.allgather_bytes(buf, err, cap=cap)
    st.add("wire_bytes", nbytes_from_others(parts, me))
    tmp = None if out.dtype == np.float32 else xp.empty(out, x.size, np.float32)
    with kernel_threads(threads), st.timing("decode_s"):
        for r, part in enumerate(parts):  # the same bytes on every rank: a bad payload fails everywhere
            if part.shape[0] == 0:
                raise GcodecError(f"{what}: rank {r} sent no payload")
            if tmp is None:
                codec.decode(part, out=out[r])  # type: ignore[attr-defined]
            else:
                codec.decode(part, out=tmp)  # type: ignore[attr-defined]
                xp.copy(out[r], tmp)  # rounded once to out's type
    return out
