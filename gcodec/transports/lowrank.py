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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import xp
from ..aggregate import count_nonfinite
from ..errors import PayloadValueError
from .comm import Protocol
from .control import Exchange
from .protocol_helpers import work_dtype
from .state import TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["LowRankItem", "lowrank_protocol"]


@dataclass
class LowRankItem:
    """One tensor of a batch: its state key, input and output (same shape; may be the same array;
    host or device memory, every item of a batch on the same)."""

    key: str
    x: Any
    out: Any


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
        st.add("wire_bytes", 2 * (p - 1) * own.nbytes // p)
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

    # Round 1: P = M Q for every tensor (M with its residual), summed in one allreduce.
    rounds, mats = [], []
    nhead = sum(h.size for h in head)
    err: Exception | None = None
    with kernel_threads(state.threads), st.timing("encode_s"):
        try:
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
            pbuf = _flat_concat([*head, *(r.p for r in rounds)], np.dtype(np.float32), like)
        except Exception as e:  # take part, so that the peers raise too (see _poisoned)
            err = e
            pbuf = _poisoned(like, nhead + sum(codec.factor_sizes(i.x.shape)[0] for i in comp))  # type: ignore[attr-defined]
    st.add("payload_bytes", pbuf.nbytes - 4 * nhead)
    yield from ex.begin()
    yield comm.allreduce(pbuf, "sum")
    if err is not None:
        raise err
    st.add("wire_bytes", 2 * (p - 1) * (pbuf.nbytes - 4 * nhead) // p)
    pos = 0
    if riders is not None:
        xp.copy(riders, pbuf[: riders.size])
        pos = riders.size
    if own is not None and own.dtype == np.float32:
        xp.copy(own, pbuf[pos : pos + own.size])
        pos += own.size
        _finish_dense(dense, own, op, scale, what)
    _check_finite(pbuf[pos:], what)

    # Round 2: orthogonalise each summed P, Q = M^T P, summed in one allreduce.
    with kernel_threads(state.threads), st.timing("encode_s"):
        try:
            for r in rounds:
                xp.copy(xp.flat(r.p), pbuf[pos : pos + r.p.size])
                pos += r.p.size
            qbuf = _flat_concat([r.compute_q() for r in rounds], np.dtype(np.float32), like)
        except Exception as e:  # take part, so that the peers raise too (see _poisoned)
            err = e
            qbuf = _poisoned(like, sum(codec.factor_sizes(i.x.shape)[1] for i in comp))  # type: ignore[attr-defined]
    st.add("payload_bytes", qbuf.nbytes)
    yield comm.allreduce(qbuf, "sum")
    if err is not None:
        raise err
    st.add("wire_bytes", 2 * (p - 1) * qbuf.nbytes // p)
    _check_finite(qbuf, what)

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
