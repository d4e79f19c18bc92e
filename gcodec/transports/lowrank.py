"""PowerSGD's two rounds (Vogels et al. 2019), for one tensor or a batch of tensors.

For the tensors PowerSGD compresses (matrices whose m n / ((m + n) r) exceeds the codec's
``min_compression_rate``):

1. M = the tensor (as m x n) plus its worker residual; P = M Q with this key's warm-start Q
   (``codec.begin``); all P of the batch are summed in one allreduce;
2. each P is orthogonalised and Q = M^T P computed; all Q are summed in a second allreduce;
3. M_hat = P Q^T / p (the mean; times p for a sum), and the residual becomes M - M_hat, as in
   torch's ``powerSGD_hook``. The summed Q is kept per key as the next step's warm start.

Tensors it does not compress (vectors, small or thin matrices) are summed dense in float32 in
round 1's allreduce, ahead of the P factors (float64 ones in an allreduce of their own), so a batch
costs two collectives, not three. P and Q are identical on every rank after each sum, so non-finite input on any rank
shows up on every rank and is refused by all of them.

**16-bit factors** (the codec's ``factors`` is ``fp16`` or ``bf16``; specs/codecs/powersgd.md §8):
each rank rounds its P, then its Q, to that format (nearest even) and the two allreduces sum them
in it, half the bytes of float32; every rank widens the same sum back to float32 before
orthogonalising or reconstructing. Round 1's float32 head (riders, dense tensors) then travels in
an allreduce of its own, started with P's. Error feedback is intact: the residual is M minus the
reconstruction from the rounded, summed factors, so the rounding is fed back like the rank
truncation. A factor that overflows the format (binary16: |x| > 65504) sums to infinity on every
rank, and every rank refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import xp
from ..aggregate import count_nonfinite
from ..arrays import BFLOAT16
from ..codecs import get_codec
from ..errors import ConfigError, PayloadValueError
from .comm import AllWork, Protocol
from .control import Exchange
from .protocol_helpers import work_dtype
from .state import TransportState
from .stats import StepStats, ring_bytes
from .threads import kernel_threads

__all__ = ["LowRankItem", "factor_wire_dtype", "lowrank_protocol"]


@dataclass
class LowRankItem:
    """One tensor of a batch: its state key, input and output (same shape; may be the same array;
    host or device memory, every item of a batch on the same)."""

    key: str
    x: Any
    out: Any


def factor_wire_dtype(codec: Any) -> np.dtype:
    """The element type PowerSGD's factors travel in through the two allreduces: float32 without a
    ``factors`` codec; with one, the number type its payloads carry when the ranks may sum them
    value by value (the codec's ``values_dtype`` capability: float16 for fp16, bfloat16 for bf16).
    A factor codec without that capability (uniform, sign, ...) is no sum of its inputs, so this
    protocol refuses it with a ConfigError (a gathered payload carries it: specs/codecs/hybrid.md)."""
    cfg = codec.params.get("factors") if hasattr(codec, "params") else None
    if cfg is None:
        return np.dtype(np.float32)
    dt = get_codec(cfg).values_dtype
    if dt is None:
        raise ConfigError(
            f"powersgd: factors {cfg!r} cannot be summed by the two-allreduce protocol (its factors travel "
            "as float32 or as a summable codec's values: fp16 or bf16); use factors='fp16' or 'bf16', or none"
        )
    return np.dtype(dt)


def _to_wire(buf: Any, dt: np.dtype) -> Any:
    """``buf`` (flat float32, host) rounded to the 16-bit wire type ``dt`` (nearest even); a value
    beyond the format's range becomes infinity, which every rank refuses after the sum."""
    with np.errstate(over="ignore"):
        return buf.astype(dt)


def _from_wire(buf: Any) -> Any:
    """The summed 16-bit factors widened to float32 (exact), the type the steps work in."""
    return buf.astype(np.float32)


def _flat_concat(arrays: list[Any], dtype: np.dtype, like: Any) -> Any:
    """One new flat ``dtype`` array holding ``arrays`` one after the other, on ``like``'s memory."""
    if not arrays:
        return xp.empty(like, 0, dtype)
    return xp.concat([xp.flat(a) for a in arrays], like, dtype)


def _poisoned(like: Any, size: int) -> Any:
    """A factor buffer of the agreed ``size`` (float32, on ``like``'s memory) filled with NaN: what a
    rank whose own work failed sends in place of its factors. The sum of every rank's buffers is
    then NaN, so every peer refuses it (:func:`_check_finite`) instead of waiting for a rank that
    raised; this rank raises its own error."""
    buf = xp.empty(like, size, np.float32)
    xp.fill(buf, np.nan, np.float32)
    return buf


def _check_finite(arr: Any, what: str) -> None:
    bad = count_nonfinite(arr) if arr.shape[0] else 0
    if bad:
        raise PayloadValueError(f"{what}: {bad} summed factor value(s) are NaN or infinite (non-finite input?)")


def _finish_dense(items: list[LowRankItem], buf: Any, op: str, scale: float, what: str) -> None:
    _check_finite(buf, what)
    if op == "mean":
        xp.scale(buf, buf, scale)
    pos = 0
    for i in items:
        xp.copy(xp.flat(i.out), buf[pos : pos + i.x.size])
        pos += i.x.size


def lowrank_protocol(
    ex: Exchange,
    state: TransportState,
    items: list[LowRankItem],
    op: str,
    step: int,
    st: StepStats,
    riders: Any = None,
) -> Protocol:
    """PowerSGD allreduce of ``items``. ``riders``: optional flat float32 values of uncompressed
    tensors that travel in round 1's allreduce and are replaced by their plain sum over the ranks
    (the caller scales; they are not checked, as an uncompressed allreduce would not be).

    Every buffer (factors, dense sums, residuals) is made on the items' memory: on a device the
    products, orthogonalisation and reconstruction run there (``gcodec.kernels.cuda.lowrank``) and
    only the non-finite counts of the summed factors come to the host."""
    comm = ex.comm
    p = comm.size
    # The factors' sizes follow from the configuration: agree on it before they travel. The BEGIN
    # starts now and is waited for before the first collective, so its round trip overlaps round
    # 1's products (summable_protocol does the same with its encode).
    ex.start()
    codec = state.codec
    scale = 1.0 / p
    what = "powersgd allreduce of " + ", ".join(repr(i.key) for i in items[:3]) + ("..." if len(items) > 3 else "")
    comp = [i for i in items if codec.compresses(i.x.shape)]  # type: ignore[attr-defined]
    dense = [i for i in items if not codec.compresses(i.x.shape)]  # type: ignore[attr-defined]
    like = items[0].x if items else riders

    # The tensors PowerSGD leaves alone are summed dense, in float32 ahead of P in round 1's
    # allreduce (float64 ones in an allreduce of their own), after the caller's riders.
    head: list[Any] = [] if riders is None else [riders]
    own: Any = None
    if dense:
        dd = work_dtype(max((i.x.dtype for i in dense), key=lambda d: d.itemsize))
        own = _flat_concat([i.x for i in dense], dd, like)
        st.add("payload_bytes", own.nbytes)
        st.add("wire_bytes", ring_bytes(own.nbytes, p))
        if dd == np.float32 and comp:
            head.append(own)
        else:
            yield from ex.begin()
            yield comm.allreduce(own, "sum")
            _finish_dense(dense, own, op, scale, what)
    if not comp:
        yield from ex.begin()
        if riders is not None and riders.size:
            yield comm.allreduce(riders, "sum")
        return

    # Round 1: P = M Q for every tensor (M with its residual), summed in one allreduce (two with
    # 16-bit factors: the float32 head in its own, started with P's).
    rounds, mats = [], []
    nhead = sum(h.size for h in head)
    err: Exception | None = None
    try:
        wire = factor_wire_dtype(codec)
        if wire != np.float32 and xp.on_device(like):
            raise ConfigError(f"powersgd: factors in {wire} have no device path yet (host tensors only)")
        if wire == BFLOAT16 and not getattr(comm, "sums_bfloat16", True):
            raise ConfigError(f"powersgd: {type(comm).__name__} cannot sum bfloat16 factors; use factors='fp16'")
    except ConfigError as bad:  # the configuration is agreed below: every rank raises the same
        wire, err = np.dtype(np.float32), bad
    split = wire != np.float32
    with kernel_threads(state.threads), st.timing("encode_s"):
        try:
            if err is not None:
                raise err
            for i in comp:
                wd = work_dtype(i.x.dtype)
                m = xp.empty(i.x, i.x.size, wd)  # this rank's M, a copy in the work dtype
                xp.copy(m, xp.flat(i.x))
                if state.error_feedback:
                    e = state.lowrank_residuals.get(i.key)
                    if e is not None and e.shape == i.x.shape and xp.backend(e) == xp.backend(m):
                        xp.add(m, xp.flat(e))
                m = m.reshape(i.x.shape)
                rounds.append(codec.begin(m, key=i.key, step=step, state=state.codec_state))  # type: ignore[attr-defined]
                mats.append(m)
            if split:
                hbuf = _flat_concat(head, np.dtype(np.float32), like)
                pbuf = _to_wire(_flat_concat([r.p for r in rounds], np.dtype(np.float32), like), wire)
            else:
                pbuf = _flat_concat([*head, *(r.p for r in rounds)], np.dtype(np.float32), like)
        except Exception as e:  # take part, so that the peers raise too (see _poisoned)
            err = e
            nfac = sum(codec.factor_sizes(i.x.shape)[0] for i in comp)  # type: ignore[attr-defined]
            if split:
                hbuf, pbuf = _poisoned(like, nhead), _to_wire(_poisoned(like, nfac), wire)
            else:
                pbuf = _poisoned(like, nhead + nfac)
    fac_bytes = pbuf.nbytes - (0 if split else 4 * nhead)
    st.add("payload_bytes", fac_bytes)
    yield from ex.begin()
    if split:
        yield (
            AllWork([comm.allreduce(hbuf, "sum"), comm.allreduce(pbuf, "sum")])
            if nhead
            else comm.allreduce(pbuf, "sum")
        )
    else:
        yield comm.allreduce(pbuf, "sum")
    if err is not None:
        raise err
    st.add("wire_bytes", ring_bytes(fac_bytes, p))
    if split:  # the head's sums, then P's in float32 from here on (the layout of the float32 path)
        _check_finite(pbuf, what)
        pos = 0
        pbuf = _from_wire(pbuf)
        hsrc = hbuf
    else:
        pos, hsrc = 0, pbuf
    if riders is not None:
        xp.copy(riders, hsrc[: riders.size])
        pos = riders.size
    if own is not None and own.dtype == np.float32:
        xp.copy(own, hsrc[pos : pos + own.size])
        pos += own.size
        _finish_dense(dense, own, op, scale, what)
    if split:
        pos = 0
    _check_finite(pbuf[pos:], what)

    # Round 2: orthogonalise each summed P, Q = M^T P, summed in one allreduce.
    with kernel_threads(state.threads), st.timing("encode_s"):
        try:
            for r in rounds:
                xp.copy(xp.flat(r.p), pbuf[pos : pos + r.p.size])
                pos += r.p.size
            qbuf = _flat_concat([r.compute_q() for r in rounds], np.dtype(np.float32), like)
            if split:
                qbuf = _to_wire(qbuf, wire)
        except Exception as e:  # take part, so that the peers raise too (see _poisoned)
            err = e
            qbuf = _poisoned(like, sum(codec.factor_sizes(i.x.shape)[1] for i in comp))  # type: ignore[attr-defined]
            if split:
                qbuf = _to_wire(qbuf, wire)
    st.add("payload_bytes", qbuf.nbytes)
    yield comm.allreduce(qbuf, "sum")
    if err is not None:
        raise err
    st.add("wire_bytes", ring_bytes(qbuf.nbytes, p))
    _check_finite(qbuf, what)
    if split:
        qbuf = _from_wire(qbuf)

    # Decompress the mean P Q^T / p; the residual is what this rank's M lost against it.
    with kernel_threads(state.threads), st.timing("decode_s"):
        pos = 0
        for i, r, m in zip(comp, rounds, mats):
            assert r.q is not None
            xp.copy(xp.flat(r.q), qbuf[pos : pos + r.q.size])
            pos += r.q.size
            # The mean goes straight into the output when it has M's dtype (M is a copy, so the
            # output may be the input): no temporary of the tensor's size and no copy of it;
            # the values are the same bits either way (the reconstruct kernel writes them).
            direct = i.out.dtype == m.dtype and xp.is_contiguous(i.out)
            mean = r.decompress(
                (xp.flat(i.out) if direct else xp.empty(m, m.size, m.dtype)).reshape(m.shape), scale=scale
            )
            if state.error_feedback:
                xp.subtract(xp.flat(m), xp.flat(mean))
                state.lowrank_residuals[i.key] = m.reshape(i.x.shape)
            if op == "sum":
                xp.scale(xp.flat(mean), xp.flat(mean), float(p))
            if not direct:
                xp.copy(xp.flat(i.out), xp.flat(mean))
