"""Small helpers shared by the protocols: work dtypes, random streams, timing of collectives."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import xp
from .comm import Protocol
from .stats import StepStats

__all__ = ["counted", "gather_stream", "timed", "work_dtype"]


def work_dtype(dtype: np.dtype) -> np.dtype:
    """Sums and residuals run in float64 for float64 tensors, else float32 (16-bit sums would round away
    small contributions)."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def gather_stream(step: int, rank: int, slot: int, size: int) -> int:
    """The random stream of one payload of a gathered codec: distinct per (step, rank, slot).

    Payloads that are decoded separately and then summed need *independent* rounding on each rank
    (the noise of p ranks then averages out); payloads summed before decoding (Random-K) need the
    *same* stream on every rank, and use the step itself. ``slot`` is the chunk (two-phase), with
    ``size`` for the chunk owner's re-encode.
    """
    return (step * size + rank) * (size + 1) + slot


def timed(st: StepStats, proto: Protocol) -> Protocol:
    """Run ``proto``, adding the time spent waiting on its collectives to ``st``'s ``comm_s`` and
    the bytes its steps copied between host and device to ``host_bytes``.

    The copies are counted per thread (:func:`gcodec.xp.transferred`) over each run of the
    protocol between two yields: those runs are the protocol's own work, whatever other
    protocols a driver interleaves with it."""
    moved = xp.transferred()
    try:
        work = next(proto)
        while True:
            st.add("host_bytes", xp.transferred() - moved)
            t0 = time.perf_counter()
            yield work
            st.add("comm_s", time.perf_counter() - t0)
            moved = xp.transferred()
            work = proto.send(None)
    except StopIteration as stop:
        st.add("host_bytes", xp.transferred() - moved)
        return stop.value


def counted(st: StepStats, proto: Protocol) -> Protocol:
    """Run ``proto``, adding the bytes its steps copied between host and device to ``st``'s
    ``host_bytes`` (as :func:`timed` does, for protocols that time their own collectives)."""
    moved = xp.transferred()
    try:
        work = next(proto)
        while True:
            st.add("host_bytes", xp.transferred() - moved)
            yield work
            moved = xp.transferred()
            work = proto.send(None)
    except StopIteration as stop:
        st.add("host_bytes", xp.transferred() - moved)
        return stop.value


def nbytes_from_others(parts: list[Any], rank: int) -> int:
    return sum(int(p.shape[0]) for r, p in enumerate(parts) if r != rank)
