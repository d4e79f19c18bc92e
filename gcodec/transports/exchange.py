"""One compressed allreduce of one tensor: agree, pick the protocol, run it, record statistics.

This is what ``gcodec.mpi.allreduce`` and ``gcodec.torch.all_reduce`` run, on their own
communicator. ``out`` may be ``x`` itself (in place).
"""

from __future__ import annotations

import json

import numpy as np

from ..arrays import dtype_name
from ..errors import ConfigError
from .comm import Communicator, Protocol
from .common import timed
from .gather import gather_protocol
from .handshake import fingerprint, handshake
from .lowrank import LowRankItem, lowrank_protocol
from .quality import sample_quality
from .state import TransportState, resolve_mode
from .stats import StepStats
from .summable import summable_protocol
from .two_phase import two_phase_protocol

__all__ = ["OPS", "agree_on", "allreduce_protocol"]

OPS = ("mean", "sum")

_PROTOCOLS = {"summable": summable_protocol, "gather": gather_protocol, "two_phase": two_phase_protocol}


def agree_on(comm: Communicator, state: TransportState, key: str, **fields: object) -> Protocol:
    """Run the handshake for ``key`` unless these exact fields were agreed on before."""
    fp = fingerprint(key=key, codec=state.codec.get_config(), ef=state.error_feedback, **fields)
    text = json.dumps(fp, sort_keys=True)
    if state.agreed.get(key) == text:
        return
    agreement = yield from handshake(comm, fp)
    state.agreed[key] = text
    state.agreed_on(key, agreement.local_ranks)


def allreduce_protocol(
    comm: Communicator, state: TransportState, x: np.ndarray, out: np.ndarray, key: str, op: str, mode: str
) -> Protocol:
    if op not in OPS:
        raise ConfigError(f"op {op!r} is not one of {list(OPS)}")
    if out.shape != x.shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ConfigError(f"out must be a writeable C-contiguous array of shape {x.shape}")
    resolved = resolve_mode(state.codec, mode, comm.size)
    fields = {"shape": list(x.shape), "dtype": dtype_name(x.dtype), "mode": resolved, "op": op, "size": comm.size}
    yield from agree_on(comm, state, key, **fields)
    step = state.next_step(key)
    sample_quality(state, key, step, x)
    st = StepStats(key, step, resolved, x.nbytes)
    if resolved == "powersgd":
        yield from timed(st, lowrank_protocol(comm, state, [LowRankItem(key, x, out)], op, step, st))
    else:
        yield from timed(st, _PROTOCOLS[resolved](comm, state, x, out, key, op, step, st))
    state.record(st)
    return out
