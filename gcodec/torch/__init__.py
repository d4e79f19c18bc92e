"""gcodec on torch.distributed: a compressed ``all_reduce``, a DDP communication hook, FSDP2's
reduce-scatter (:func:`compress_fsdp`, docs/fsdp.md) and DiLoCo's outer loop (:class:`DiLoCo`,
docs/lowcomm.md).

>>> import gcodec.torch                                                         # doctest: +SKIP
>>> ddp.register_comm_hook(gcodec.torch.HookState(codec="fp16"), gcodec.torch.comm_hook)  # doctest: +SKIP
>>> gcodec.torch.all_reduce(tensor, "uniform")            # in place, the mean  # doctest: +SKIP

Both run the protocols of :mod:`gcodec.transports` (summable, gather, two-phase, PowerSGD) with the
same handshake and error agreement as :mod:`gcodec.mpi`, on CPU tensors of any process group
(gloo in the tests). Importing this module imports torch; ``import gcodec`` does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch

from ..codecs import Codec
from ..deprecation import renamed_names
from ..feedback import ErrorFeedback
from ..policy import Policy as CodecPolicy
from ..transports import Router, TransportState
from ..transports.control import failed_exchange
from ..transports.router import call_protocol
from .comm import FutureQueue as FutureQueue  # importable for engines built on it; not the API
from .comm import FutureWork, comm_for, queue_for, synchronize
from .comm import TorchCommunicator as TorchCommunicator
from .convert import as_array
from .convert import to_numpy as to_numpy
from .convert import to_tensor as to_tensor
from .diloco import DiLoCo
from .hook import HookNotCalledWarning, HookState, TensorChooser, comm_hook

if TYPE_CHECKING:
    from .fsdp import FSDPState, QuantizedAllGather, ReduceScatter, compress_fsdp, reshard_state_dicts

__all__ = [
    "AllReduceWork",
    "DiLoCo",
    "FSDPState",
    "HookNotCalledWarning",
    "HookState",
    "QuantizedAllGather",
    "ReduceScatter",
    "Router",
    "TensorChooser",
    "TransportState",
    "all_reduce",
    "as_array",
    "comm_hook",
    "compress_fsdp",
    "reshard_state_dicts",
    "synchronize",
]

#: Names of gcodec.torch.fsdp, imported when first asked for: FSDP2's interfaces bring
#: torch.distributed.fsdp, torch.fx and sympy (about 640 modules and 1.5 CPU-seconds), which a DDP
#: job, a DiLoCo job or an all_reduce never uses, and every rank pays at start-up.
_FSDP_NAMES = frozenset({"FSDPState", "QuantizedAllGather", "ReduceScatter", "compress_fsdp", "reshard_state_dicts"})
_renamed = renamed_names("gcodec.torch", {"Policy": ("TensorChooser", TensorChooser)})


def __getattr__(name: str) -> Any:
    if name in _FSDP_NAMES:
        value = getattr(importlib.import_module(".fsdp", __name__), name)
        globals()[name] = value
        return value
    return _renamed(name)


#: What ``all_reduce(..., async_op=True)`` returns, like torch's ``Work``.
AllReduceWork = FutureWork


def all_reduce(
    tensor: torch.Tensor,
    codec: Codec | str | dict[str, Any] | CodecPolicy | None,
    op: str = "mean",
    group: Any = None,
    async_op: bool = False,
    *,
    key: str | None = None,
    mode: str = "auto",
    state: TransportState | ErrorFeedback | Router | None = None,
) -> AllReduceWork | None:
    """Compressed allreduce of a tensor, in place (the result overwrites ``tensor``).

    Args:
        tensor: a contiguous CPU tensor (float32, float64, float16 or bfloat16) or CUDA tensor
            (float32, float64: the protocol runs on its device, docs/gpu.md).
        codec: a codec, its id or config; the same on every rank (the handshake checks). A
            :class:`gcodec.policy.Policy` picks the codec per key and step through a router (dense
            when it says None); None when ``state`` is a :class:`~gcodec.transports.Router`.
        op: ``"mean"`` or ``"sum"``.
        group: the process group (None: the default group).
        async_op: return a work object instead of waiting (as ``torch.distributed.all_reduce``).
        key: names the tensor for its state (residuals, streams, statistics).
        mode: ``"auto"``, ``"summable"``, ``"gather"``, ``"two_phase"`` or ``"lowrank"``.
        state: a :class:`TransportState` for error feedback and statistics, or a
            :class:`gcodec.ErrorFeedback` (worker residuals kept in it); by default a shared
            state without error feedback, per group and codec. Or a
            :class:`~gcodec.transports.Router` (a policy or an adaptive controller choosing per key
            and step, residuals that follow a key across codec changes), as ``gcodec.mpi``'s
            ``Router``.
    """
    comm = comm_for(group)
    try:
        arr = as_array(tensor)  # a NumPy view (CPU) or a device array (CUDA), never a copy
        proto = call_protocol(comm, ("torch", id(group)), arr, arr, codec, op, key or "tensor", mode, state)
    except Exception as e:  # take part, so that the peers raise too instead of waiting
        queue_for(group).run(failed_exchange(comm, e, f"all_reduce of {key or 'tensor'!r}"))
        raise
    work = AllReduceWork(queue_for(group).submit(proto, tensor.device))
    if async_op:
        return work
    work.wait()
    return None
