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

import numpy as np

from ..errors import PayloadValueError
from .comm import Protocol
from .common import work_dtype
from .control import Exchange
from .state import TransportState
from .stats import StepStats
from .threads import kernel_threads

__all__ = ["LowRankItem", "lowrank_protocol"]


@dataclass
class LowRankItem:
    """One tensor of a batch: its state key, input and output (same shape; may be the same array)."""

    key: str
    x: np.ndarray
    out: np.ndarray


def _flat_concat(arrays: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    return np.concatenate([a.reshape(-1) for a in arrays]).astype(dtype, copy=False) if arrays else np.empty(0, dtype)


def _check_finite(arr: np.ndarray, what: str) -> None:
    bad = int(np.count_nonzero(~np.isfinite(arr)))
    if bad:
        raise PayloadValueError(f"{what}: {bad} summed factor value(s) are NaN or infinite (non-finite input?)")


def _finish_dense(items: list[LowRankItem], buf: np.ndarray, op: str, scale: float, what: str) -> None:
    _check_finite(buf, what)
    if op == "mean":
        buf *= buf.dtype.type(scale)
    pos = 0
    for i in items:
        i.out.reshape(-1)[...] = buf[pos : pos + i.x.size]
        pos += i.x.size


def lowrank_protocol(
    ex: Exchange,
    state: TransportState,
    items: list[LowRankItem],
    op: str,
    step: int,
    st: StepStats,
    riders: np.ndarray | None = None,
) -> Protocol:
    """PowerSGD allreduce of ``items``. ``riders``: optional flat float32 values of uncompressed
    tensors that travel in round 1's allreduce and are replaced by their plain sum over the ranks
    (the caller scales; they are not checked, as an uncompressed allreduce would not be)."""
    comm = ex.comm
    p = comm.size
    # The factors' sizes follow from the configuration: agree on it before they travel.
    yield from ex.begin()
    codec = state.codec
    scale = 1.0 / p
    what = "powersgd allreduce of " + ", ".join(repr(i.key) for i in items[:3]) + ("..." if len(items) > 3 else "")
    comp = [i for i in items if codec.compresses(i.x.shape)]  # type: ignore[attr-defined]
    dense = [i for i in items if not codec.compresses(i.x.shape)]  # type: ignore[attr-defined]

    # The tensors PowerSGD leaves alone are summed dense, in float32 ahead of P in round 1's
    # allreduce (float64 ones in an allreduce of their own), after the caller's riders.
    head: list[np.ndarray] = [] if riders is None else [riders]
    own: np.ndarray | None = None
    if dense:
        dd = work_dtype(max((i.x.dtype for i in dense), key=lambda d: d.itemsize))
        own = _flat_concat([i.x for i in dense], dd)
        st.add("payload_bytes", own.nbytes)
        st.add("wire_bytes", 2 * (p - 1) * own.nbytes // p)
        if dd == np.float32 and comp:
            head.append(own)
        else:
            yield comm.allreduce(own, "sum")
            _finish_dense(dense, own, op, scale, what)
    if not comp:
        if riders is not None and riders.size:
            yield comm.allreduce(riders, "sum")
        return

    # Round 1: P = M Q for every tensor (M with its residual), summed in one allreduce.
    rounds, mats = [], []
    with kernel_threads(state.threads), st.timing("encode_s"):
        for i in comp:
            wd = work_dtype(i.x.dtype)
            m = i.x.astype(wd)
            if state.error_feedback:
                e = state.lowrank_residuals.get(i.key)
                if e is not None and e.shape == m.shape:
                    m += e
            rounds.append(codec.begin(m, key=i.key, step=step, state=state.codec_state))  # type: ignore[attr-defined]
            mats.append(m)
        pbuf = _flat_concat([*head, *(r.p for r in rounds)], np.dtype(np.float32))
    nhead = sum(h.size for h in head)
    st.add("payload_bytes", pbuf.nbytes - 4 * nhead)
    yield comm.allreduce(pbuf, "sum")
    st.add("wire_bytes", 2 * (p - 1) * (pbuf.nbytes - 4 * nhead) // p)
    pos = 0
    if riders is not None:
        riders[...] = pbuf[: riders.size]
        pos = riders.size
    if own is not None and own.dtype == np.float32:
        own[...] = pbuf[pos : pos + own.size]
        pos += own.size
        _finish_dense(dense, own, op, scale, what)
    _check_finite(pbuf[pos:], what)

    # Round 2: orthogonalise each summed P, Q = M^T P, summed in one allreduce.
    with kernel_threads(state.threads), st.timing("encode_s"):
        for r in rounds:
            r.p[...] = pbuf[pos : pos + r.p.size].reshape(r.p.shape)
            pos += r.p.size
        qbuf = _flat_concat([r.compute_q() for r in rounds], np.dtype(np.float32))
    st.add("payload_bytes", qbuf.nbytes)
    yield comm.allreduce(qbuf, "sum")
    st.add("wire_bytes", 2 * (p - 1) * qbuf.nbytes // p)
    _check_finite(qbuf, what)

    # Decompress the mean P Q^T / p; the residual is what this rank's M lost against it.
    with kernel_threads(state.threads), st.timing("decode_s"):
        pos = 0
        for i, r, m in zip(comp, rounds, mats):
            assert r.q is not None
            r.q[...] = qbuf[pos : pos + r.q.size].reshape(r.q.shape)
            pos += r.q.size
            mean = r.decompress(np.empty(m.shape, m.dtype), scale=scale)
            if state.error_feedback:
                np.subtract(m, mean, out=m)
                state.lowrank_residuals[i.key] = m.reshape(i.x.shape)
            if op == "sum":
                mean *= mean.dtype.type(p)
            i.out.reshape(-1)[...] = mean.reshape(-1)
