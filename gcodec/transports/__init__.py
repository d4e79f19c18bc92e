"""Compressed collectives over any engine: the protocols, written once.

:mod:`gcodec.mpi` and :mod:`gcodec.torch` adapt MPI and torch.distributed to the small
:class:`Communicator` interface; everything else (the modes, the handshake, error agreement, error
feedback, statistics, kernel threads) lives here and knows no engine. See docs/transports.md.
"""

from __future__ import annotations

from ..deprecation import renamed_names
from .allreduce import OPS, allreduce_protocol
from .comm import Communicator, DoneWork, Protocol, Serial, Task, Work, run_blocking
from .lowrank import LowRankItem, lowrank_protocol
from .router import DENSE, Piece, Router
from .state import GATHER_MAX_RANKS, MODES, TransportState, resolve_mode, shares_flat_group
from .threads import job_threads, kernel_threads

#: ``PolicyState``, the router's old name
__getattr__ = renamed_names("gcodec.transports", {"PolicyState": ("Router", Router)})

__all__ = [
    "DENSE",
    "GATHER_MAX_RANKS",
    "MODES",
    "OPS",
    "Communicator",
    "DoneWork",
    "LowRankItem",
    "Piece",
    "Protocol",
    "Router",
    "Serial",
    "Task",
    "TransportState",
    "Work",
    "allreduce_protocol",
    "job_threads",
    "kernel_threads",
    "lowrank_protocol",
    "resolve_mode",
    "run_blocking",
    "shares_flat_group",
]
