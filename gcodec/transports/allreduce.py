"""One compressed allreduce of one tensor: resolve its mode, agree on it, run it
(:func:`gcodec.transports.run.exchange`: the protocol and the statistics).

This is what ``gcodec.mpi.allreduce`` and ``gcodec.torch.all_reduce`` run on their own
communicator when given a state or a codec (a :class:`~gcodec.transports.router.Router` plans its
keys instead: :meth:`~gcodec.transports.router.Router.protocol_many`). ``out`` may be ``x`` itself
(in place). Each call is one part of its state's step report
(:class:`~gcodec.transports.stats.KeyRounds`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import xp
from ..arrays import dtype_name
from ..errors import ConfigError
from .comm import Communicator, Protocol
from .control import Exchange, failed_exchange
from .handshake import fingerprint
from .quality import sample_quality
from .run import exchange
from .state import TransportState, resolve_mode
from .stats import StepStats

__all__ = ["OPS", "allreduce_protocol", "check_call", "exchange_for"]

OPS = ("mean", "sum")


def _writeable_contiguous(a: object) -> bool:
    """NumPy's flags, or a device array's own C-contiguity (device memory is always writeable)."""
    if isinstance(a, np.ndarray):
        return bool(a.flags.c_contiguous and a.flags.writeable)
    check = getattr(a, "is_c_contiguous", None)
    return bool(check()) if callable(check) else False


def check_call(x: Any, out: Any, op: str) -> None:
    """A caller's arguments: ``op`` one of :data:`OPS`, ``out`` a writeable C-contiguous array of
    ``x``'s shape on ``x``'s memory (ConfigError otherwise)."""
    if op not in OPS:
        raise ConfigError(f"op {op!r} is not one of {list(OPS)}")
    if tuple(out.shape) != tuple(x.shape) or not _writeable_contiguous(out):
        raise ConfigError(f"out must be a writeable C-contiguous array of shape {x.shape}")
    if xp.backend(out) != xp.backend(x):
        raise ConfigError(f"out lives in {xp.backend(out)} memory and x in {xp.backend(x)}: give both on one")


def ef_fingerprint(state: TransportState) -> Any:
    """Error feedback as the ranks agree on it: on or off, and its decay when it is not 1 (so that
    configurations without a decay keep the fingerprint they always had)."""
    if state.error_feedback and state.decay != 1.0:
        return {"decay": state.decay}
    return state.error_feedback


def exchange_for(comm: Communicator, state: TransportState, key: str, what: str, **fields: object) -> Exchange:
    """The exchange of ``key`` under ``state``: its fingerprint (codec config, error feedback and
    ``fields``), agreed in full the first time and whenever it changes, by digest at every step."""
    fp = fingerprint(key=key, codec=state.codec.get_config(), ef=ef_fingerprint(state), **fields)
    return Exchange(comm, fp, state.agreed, key, what, lambda a: state.agreed_on(key, a.local_ranks))


def allreduce_protocol(
    comm: Communicator,
    state: TransportState,
    x: np.ndarray,
    out: np.ndarray,
    key: str,
    op: str,
    mode: str,
) -> Protocol:
    """The protocol of one allreduce of ``key``; its figures go to ``state``'s statistics and
    step report."""
    t0 = time.perf_counter()  # the engine holds the tensor from its protocol's start
    what = f"compressed allreduce of {key!r}"
    try:
        check_call(x, out, op)
        resolved = resolve_mode(state.codec, mode, comm.size)
    except Exception as e:  # take part, so that the peers raise too instead of waiting
        yield from failed_exchange(comm, e, what)
    fields = {"shape": list(x.shape), "dtype": dtype_name(x.dtype), "mode": resolved, "op": op, "size": comm.size}
    ex = exchange_for(comm, state, key, what, **fields)
    step = state.next_step(key)
    sample_quality(state, key, step, x)
    st = StepStats(key, step, resolved, x.nbytes)
    yield from exchange(ex, state, resolved, st, op, x=x, out=out)
    state.reports.add_call(key, [st], raw_bytes=x.nbytes, held_s=time.perf_counter() - t0)
    return out
