"""gcodec's compressed allreduce inside torchft's quorum (docs/lowcomm.md, "torchft").

torchft (``pip install 'gcodec[torchft]'``, torchft 0.2.0) keeps training going when a replica
group is lost: a lighthouse forms quorums of the live replicas, every step reconfigures its process
group when the quorum changed, and a replica that (re)joins recovers the model from a live peer.
All of torchft's algorithms reach the network through one call, ``Manager.allreduce``: its
``DiLoCo`` and ``LocalSGD`` for their (pseudo-)gradients and parameters, its ``DistributedDataParallel``
for every bucket. :class:`Manager` is torchft's manager with that one call replaced by gcodec's
router (any codec, any policy, error feedback); everything else stays torchft's: quorum,
healing, checkpoint transfer, commit votes. The two lines a torchft user changes::

    from gcodec.torch.torchft import Manager                     # instead of torchft's Manager
    manager = Manager(pg=ProcessGroupGloo(), ..., codec={"id": "uniform", "bits": 4}, error_feedback=True)

What happens at each of torchft's events:

* **A quorum change is one more re-plan.** The first exchange after the quorum changed runs on a
  new :class:`TorchftCommunicator` over the reconfigured process group (control sequence numbers
  from zero on every member alike); every key agrees its configuration again (the fingerprint
  holds the world size); the per-parameter residuals are kept, re-sliced by element range into the
  layout the new world size gives (two-phase keeps one residual per owner chunk); the two-phase
  *server* residuals are dropped (:meth:`Manager.replan` says why).
* **A step that is not committed leaves the residuals as they were.** torchft discards such a step
  (its DiLoCo restores the global parameters, its DDP skips the optimizer step); the residuals
  are put back as they were before the step's first exchange, so nothing the discarded step
  "sent" is taken off what is still owed.
* **A replica that (re)joins gets gcodec's shared state through torchft's recovery** (a state dict
  function registered as ``"gcodec"``): each key's step counter (random streams), the codec
  states (PowerSGD's warm start), the current codec per key and the chooser's state. Not the
  peer's residuals: they are what *that* replica still owes; the joiner owes nothing yet.
* **Agreement errors are not faults.** A :class:`~gcodec.ConfigError` (replicas configured
  differently) raises from :meth:`Manager.should_commit` on every replica instead of being
  swallowed as a transient error and retried forever; a lost or stopped peer (gloo's error or
  timeout) is torchft's to handle: the step is not committed and the next quorum goes on without it.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions, AllreduceOptions, AllToAllOptions, ReduceOp

try:
    from torchft.manager import Manager as _TorchftManager
    from torchft.manager import _ManagedWork
    from torchft.work import _DummyWork
except ImportError as e:  # an optional extra
    raise ImportError(
        "gcodec.torch.torchft needs torchft (pip install 'gcodec[torchft]', which pins torchft==0.2.0)"
    ) from e

from ..arrays import tensors_from_arrays
from ..errors import ConfigError, GcodecError, ProtocolOrderError
from ..policy import DEFAULTS
from ..transports import Router
from ..transports.comm import Protocol
from ..transports.control import control_bytes, failed_exchange
from .comm import FutureQueue, TorchCommunicator
from .convert import arrays_from_tensors, as_array

__all__ = ["Manager", "TorchftCommunicator"]

_OPS: dict[str, Any] = {"sum": ReduceOp.SUM, "max": ReduceOp.MAX}


class TorchftCommunicator(TorchCommunicator):
    """gcodec's communicator over torchft's reconfigurable process group (``ProcessGroupGloo``,
    ``ProcessGroupNCCL``), for one quorum.

    torchft's group is not a torch.distributed group (it is never registered): the collectives go
    through its own methods (``allreduce``, ``allgather``, ``alltoall_base``), which run on the
    backend group of the current quorum. A communicator belongs to the quorum it was made in:
    once torchft reconfigured the group, its collectives raise instead of landing on the new
    quorum's group, where the peers count messages from zero.
    """

    def __init__(self, pg: Any, quorum_id: int) -> None:
        self.pg = pg
        self.group = None
        self.quorum_id = int(quorum_id)
        self._backend = pg.parent  # the backend group of this quorum
        self.rank = int(self._backend.rank())
        self.size = int(self._backend.size())
        nccl = "nccl" in str(pg.getBackendName()).lower()
        self._words_on = torch.device("cuda", torch.cuda.current_device()) if nccl else None

    def current(self) -> bool:
        """Whether torchft's group still runs on this communicator's quorum."""
        return getattr(self.pg, "_pg", None) is self._backend

    def _live(self) -> Any:
        if not self.current():
            raise GcodecError(
                f"torchft reconfigured the process group (quorum {self.quorum_id} ended) under a gcodec exchange"
            )
        return self.pg

    def _all_reduce(self, t: torch.Tensor, op: str) -> Any:
        opts = AllreduceOptions()
        opts.reduceOp = _OPS[op]
        return self._live().allreduce([t], opts)

    def _all_gather(self, outs: list[torch.Tensor], src: torch.Tensor) -> Any:
        return self._live().allgather([outs], [src], AllgatherOptions())

    def _all_to_all(self, recv: torch.Tensor, send: torch.Tensor, rcounts: list[int], scounts: list[int]) -> Any:
        return self._live().alltoall_base(recv, send, rcounts, scounts, AllToAllOptions())


class _QueuedWork(dist._Work):
    """A c10d work over a future of gcodec's queue, which torchft's ``_ManagedWork`` wraps as it
    wraps its process group's works (its callbacks, timeout and error reporting apply alike)."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._fut.wait()  # re-raises the exchange's error (a lost peer, a timeout, a disagreement)
        return True

    def is_completed(self) -> bool:
        return bool(self._fut.done())

    def get_future(self) -> torch.futures.Future:
        return self._fut


class Manager(_TorchftManager):
    """torchft's ``Manager`` whose ``allreduce`` is gcodec's compressed allreduce (module docstring).

    Args:
        *args, **kwargs: torchft's ``Manager`` arguments, unchanged (``pg``, ``load_state_dict``,
            ``state_dict``, ``min_replica_size``, ``timeout``, ...).
        codec: the codec of every exchange (a codec, its id or config); None: uncompressed sums
            in each tensor's work dtype, through gcodec's agreed dense path.
        policy: instead, a :class:`gcodec.policy.Policy`, a callable or a ``{pattern: codec}`` dict
            choosing per key (``codec`` is then the shorthand's default). Keys are named
            ``"torchft/<fragment>/<call>[shape]"`` (below).
        error_feedback, ef_decay, mode: as for :class:`gcodec.torch.DiLoCo`.
        min_numel: tensors with fewer elements go uncompressed (:data:`gcodec.policy.DEFAULTS`).
            1-D tensors are compressed (``dense_1d`` off, unlike the engines that plan parameters):
            torchft hands over flat buckets (its DDP's, its DiLoCo's with ``use_bucketization``),
            which are 1-D and hold every parameter; a bias or a norm scale handed over alone is
            small, and ``min_numel`` keeps it dense.
        fragments: how many model fragments torchft's Streaming DiLoCo syncs in turn (its
            ``model_fragments``); 1 for DiLoCo, LocalSGD and DDP.

    **Keys.** ``Manager.allreduce`` is handed tensors without names. torchft's algorithms make the
    same calls in the same order at every synchronisation (DiLoCo and LocalSGD one per parameter,
    or per bucket with ``use_bucketization``, in model order; DDP one per bucket, which torchft's
    DDP never rebuilds), so a tensor is named by its place: the fragment synced
    (``current_step() % fragments``, as torchft's DiLoCo picks it), the call's index since the
    step's ``start_quorum`` and the tensor's shape. Its residual follows that name.
    """

    def __init__(
        self,
        *args: Any,
        codec: Any = None,
        policy: Any = None,
        error_feedback: bool = True,
        ef_decay: float = 1.0,
        min_numel: int = DEFAULTS.min_numel,
        mode: str = "auto",
        fragments: int = 1,
        **kwargs: Any,
    ) -> None:
        if int(fragments) < 1:
            raise ConfigError(f"fragments must be at least 1, not {fragments!r}")
        super().__init__(*args, **kwargs)
        self.router = Router(
            policy,
            codec=codec,
            min_numel=min_numel,
            dense_1d=False,
            error_feedback=error_feedback,
            mode=mode,
            decay=ef_decay,
        )
        self.fragments = int(fragments)
        self._queue = FutureQueue()
        self._comm: TorchftCommunicator | None = None
        self._calls = 0  # allreduce calls since the step's start_quorum
        self._snapshot: dict[str, Any] | None = None  # residuals before the step's first exchange
        self._lock = threading.Lock()  # the figures, added to from the queue's thread
        self._figures = {"exchanges": 0, "raw_bytes": 0, "payload_bytes": 0, "data_wire_bytes": 0}
        self._control_before = 0  # control bytes of the communicators of earlier quorums
        #: One record per re-plan: the manager's step, torchft's quorum id, this replica's rank and
        #: the world size of the new quorum, and how many residual ranges were re-sliced.
        self.replans: list[dict[str, Any]] = []
        #: Steps whose commit failed, with the residuals put back (the manager's step each time).
        self.rollbacks: list[int] = []
        self.register_state_dict_fn("gcodec", self._load_shared, self._shared_state)

    # ---- torchft's calls -----------------------------------------------------------------------
    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        """torchft's ``start_quorum``; the next ``allreduce`` is the step's first call."""
        self._queue.drain()  # nothing of the last step may still run on the group being reconfigured
        super().start_quorum(*args, **kwargs)
        self._calls = 0
        self._snapshot = None

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False, reduce_op: Any = ReduceOp.AVG) -> Any:
        """torchft's fault-tolerant allreduce, compressed: the same contract (a work whose future
        completes with ``tensor`` averaged over the quorum's participants, or summed; an error
        reported to the manager, not raised; a no-op once the step errored), any floating tensor
        through gcodec's router. ``should_quantize`` is ignored (the codec decides). Another
        reduction (max, min) or an integer tensor goes through torchft's own allreduce."""
        if reduce_op not in (ReduceOp.AVG, ReduceOp.SUM) or not torch.is_floating_point(tensor):
            self._queue.drain()  # torchft's collective must not start between the queue's on the group
            return super().allreduce(tensor, should_quantize=False, reduce_op=reduce_op)
        if self.errored():
            return _DummyWork(tensor)
        self.wait_quorum()
        n = self.num_participants()
        if not self.is_participating():
            tensor.zero_()
        comm = self._communicator()
        if self._snapshot is None:
            self._snapshot = self._residuals()
        key = f"torchft/{self.current_step() % self.fragments}/{self._calls}{list(tensor.shape)}"
        self._calls += 1
        try:
            arr = as_array(tensor)  # a NumPy view (CPU) or a device array (CUDA), never a copy
        except Exception as e:  # take part, so that the peers raise too instead of waiting
            self._queue.run(failed_exchange(comm, e, f"torchft allreduce of {key!r}"))
            raise
        fut = self._queue.submit(self._exchange(comm, arr, key), tensor.device)
        managed = _ManagedWork(self, _QueuedWork(fut), tensor)

        def finish(f: torch.futures.Future) -> torch.Tensor:  # torchft's own normalisation
            if reduce_op == ReduceOp.AVG:
                tensor.div_(n)
            return tensor

        managed.get_future().then(finish)
        return managed

    def should_commit(self, timeout: timedelta | None = None) -> bool:
        """torchft's commit vote, after every exchange of the step has ended (each is bounded by the
        process group's timeout). An agreement error (:class:`gcodec.ConfigError`, the same on
        every replica) raises here; a step that is not committed gets its residuals back."""
        self._queue.drain()
        err = self.errored()
        cause = getattr(err, "original_exception", None)
        if isinstance(cause, ConfigError) and not isinstance(cause, _TRANSIENT):
            raise cause
        ok = super().should_commit(timeout)
        if not ok and self._snapshot is not None:
            self._restore(self._snapshot)
            self.rollbacks.append(self.current_step())
        self._snapshot = None
        return ok

    def shutdown(self, wait: bool = True) -> None:
        """torchft's ``shutdown``, after gcodec's queue thread has ended."""
        self._queue.close(timeout=None if wait else 0.0)
        super().shutdown(wait=wait)

    # ---- the exchanges -------------------------------------------------------------------------
    def _communicator(self) -> TorchftCommunicator:
        comm = self._comm
        if comm is None or comm.quorum_id != self._quorum_id or not comm.current():
            self.replan()
            comm = self._comm
            assert comm is not None
        return comm

    def replan(self) -> None:
        """Re-plan for the quorum torchft has just configured (called by the first exchange after a
        quorum change; the queue is idle then).

        * A new communicator over the new backend group: its control messages count from zero, as
          every member's do (a replica that just joined has counted nothing).
        * Every key agrees its configuration again (the fingerprints hold the world size).
        * Per-parameter residuals are kept: read out by (parameter, element range) and placed
          again at each key's next exchange, in the layout the new world size gives (two-phase
          keeps one residual per owner chunk, and the chunks move when the world size changes).
        * Two-phase server residuals are dropped. Each is what the re-encoding of one chunk's
          *sum* dropped, held by that chunk's owner for its next re-encoding. At a new world size
          the chunk bounds move and the sum is over other replicas; a lost replica's are gone with
          it; the owners change with the ranks (torchft orders replicas by id). Re-slicing them
          would take an exchange of its own between old and new owners, for a second-order term:
          one re-encoding's error per chunk, at most the codec's error on the summed values,
          which the worker residuals (first order, kept) do not depend on.
        """
        if self._comm is not None:
            self._control_before += control_bytes(self._comm)
        self._comm = TorchftCommunicator(self._pg, self._quorum_id)
        held = self.router.ranges()
        self.router.clear_residuals()
        self.router.hold(held)
        for ts in self.router.states.values():
            if ts.server is not None:
                ts.server.reset()
            ts.agreed.clear()
        self.router.agreed.clear()
        self.replans.append(
            {
                "step": self.current_step(),
                "quorum_id": int(self._quorum_id),
                "rank": self._comm.rank,
                "world_size": self._comm.size,
                "residual_ranges": len(held),
            }
        )

    def _exchange(self, comm: TorchftCommunicator, arr: Any, key: str) -> Protocol:
        out = yield from self.router.protocol(comm, arr, arr, key, "sum")
        rec = self.router.last(key) or {}
        with self._lock:
            f = self._figures
            f["exchanges"] += 1
            f["raw_bytes"] += int(arr.nbytes)
            f["payload_bytes"] += int(rec.get("payload_bytes", 0))
            f["data_wire_bytes"] += int(rec.get("wire_bytes", 0))
        return out

    # ---- residuals around a step that may not be committed --------------------------------------
    def _residuals(self) -> dict[str, Any]:
        """This replica's residuals as they are now: by parameter range, and the server ones."""
        return {
            "ranges": {k: v.copy() for k, v in self.router.ranges().items()},
            "server": {k: ts.server.state_dict() for k, ts in self.router.states.items() if ts.server is not None},
        }

    def _restore(self, snap: dict[str, Any]) -> None:
        self.router.clear_residuals()
        self.router.hold(snap["ranges"])
        for k, ts in self.router.states.items():
            if ts.server is not None:
                ts.server.reset()
                if k in snap["server"]:
                    ts.server.load_state_dict(snap["server"][k])

    # ---- what a recovering replica receives -----------------------------------------------------
    def _shared_state(self) -> dict[str, Any]:
        """The router's state without this replica's own residuals (module docstring)."""
        sd = self.router.state_dict()
        sd["residuals"] = {}
        for part in sd["states"].values():
            part["server"] = None
        return tensors_from_arrays(sd)

    def _load_shared(self, sd: Any) -> None:
        mine = self.router.ranges()  # a live replica that heals keeps what it owes; a new one owes nothing
        self.router.load_state_dict(arrays_from_tensors(sd))
        self.router.hold(mine)

    # ---- figures -------------------------------------------------------------------------------
    def gcodec_stats(self) -> dict[str, Any]:
        """What this replica's exchanges put on the wire: the data as the transports count it
        (``data_wire_bytes``), the control messages (``control_bytes``: agreements, sizes,
        fingerprints; every quorum's), their sum (``wire_bytes``), the encoded payloads and the raw
        tensors' bytes, the number of exchanges, re-plans and rolled-back steps."""
        with self._lock:
            out: dict[str, Any] = dict(self._figures)
        control = self._control_before + (control_bytes(self._comm) if self._comm is not None else 0)
        out["control_bytes"] = control
        out["wire_bytes"] = out["data_wire_bytes"] + control
        out["replans"] = len(self.replans)
        out["rollbacks"] = len(self.rollbacks)
        return out


#: Agreement errors that a fault causes, not a configuration: a replica whose step errored skips
#: its remaining exchanges (torchft's allreduce is a no-op then) while its peers go on, and the
#: peers' next control message finds it at another message. Its messages realign (every rank
#: continues from the same sequence number) and the step is not committed: torchft retries.
_TRANSIENT: tuple[type[BaseException], ...] = (ProtocolOrderError,)
