"""torch.distributed as a gcodec communicator, and the queue that runs protocols behind futures."""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import traceback
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import alloc, xp
from ..arrays import BFLOAT16
from ..errors import ConfigError, WaitTimeoutError
from ..transports import Communicator, DoneWork, Protocol, Work
from ..transports.collectives import joined
from .convert import as_array, as_tensor

__all__ = [
    "FutureQueue",
    "FutureWork",
    "TorchCommunicator",
    "TorchWork",
    "comm_for",
    "own_group",
    "queue_for",
    "synchronize",
]

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


class TorchWork(Work):
    """A torch.distributed async work; ``result`` is computed from the outputs once it completes."""

    def __init__(self, work: Any, finish: Any) -> None:
        self._work = work
        self._finish = finish
        self._value: Any = None
        self._have = False

    def test(self) -> bool:
        return bool(self._work.is_completed())

    def wait(self) -> Any:
        self._work.wait()
        return self.result()

    def result(self) -> Any:
        if not self._have:
            self._value, self._have = self._finish(), True
        return self._value


def _tensor(a: Any) -> torch.Tensor:
    """The tensor view of an array the protocols hand over (host: a CPU tensor; device: a CUDA
    tensor of its device), never a copy. Host bfloat16 (PowerSGD's 16-bit factors) is viewed
    through its bits: torch.from_numpy has no bfloat16."""
    if isinstance(a, np.ndarray):
        if a.dtype == BFLOAT16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    return as_tensor(a)


def _array(t: torch.Tensor) -> Any:
    """The array view of a tensor the collectives filled (host: NumPy; CUDA: a Numba device array)."""
    return t.numpy() if t.device.type == "cpu" else as_array(t)


def _receive_buffers(count: int, width: int, device: torch.device) -> list[torch.Tensor]:
    """``count`` receive buffers of ``width`` bytes on ``device``, through gcodec's allocator: a
    process without the memory gets a :class:`~gcodec.LimitExceededError` naming them, never a raw
    ``MemoryError`` or ``OutOfMemoryError`` from inside a collective. ``width`` was bounded before
    (the plan's largest payload: :meth:`gcodec.transports.control.Exchange.sizes`)."""
    what = f"{count} receive buffers of {width} bytes"
    if device.type == "cpu":
        return [torch.from_numpy(alloc.empty(what, width, np.uint8)) for _ in range(count)]
    try:
        return [torch.empty(width, dtype=torch.uint8, device=device) for _ in range(count)]
    except torch.OutOfMemoryError:
        raise alloc.out_of_memory(f"{what} on {device}", count * width) from None


def _host_words_device(group: Any) -> torch.device | None:
    """Where host words (control messages, fingerprints) travel: on a group whose backend takes no
    CPU tensors (NCCL), a CUDA device (the words are copied there and back: tens of bytes, never
    tensor data); None where CPU tensors travel as they are (gloo, MPI)."""
    try:
        backend = str(dist.get_backend(group)).lower()
    except Exception:
        return None
    if backend != "nccl" or not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


class TorchCommunicator(Communicator):
    """:class:`~gcodec.transports.Communicator` on a torch.distributed process group.

    Arrays given and returned live on the caller's device: NumPy arrays travel as CPU tensors (gloo),
    device arrays (Numba, CuPy, anything with ``__cuda_array_interface__``) as CUDA tensors of their
    device, viewed without a copy (NCCL; a gloo group takes CUDA tensors for its all-reduce and
    all-gathers too), and the receive buffers are allocated on the input's device. The control
    messages stay host int64 words.

    The variable-size all-gather pads every buffer to the largest size (torch's all_gather wants
    equal sizes); all-to-all uses ``all_to_all_single`` with split sizes.
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._words_on = _host_words_device(group)

    # ---- the engine's collectives (a subclass over another engine replaces these three) ------
    def _all_reduce(self, t: torch.Tensor, op: str) -> Any:
        """Start an in-place all-reduce of ``t``; return the engine's work."""
        return dist.all_reduce(t, op=_OPS[op], group=self.group, async_op=True)

    def _all_gather(self, outs: list[torch.Tensor], src: torch.Tensor) -> Any:
        """Start an all-gather of equal-sized ``src`` into ``outs`` (rank order)."""
        return dist.all_gather(outs, src, group=self.group, async_op=True)

    def _all_to_all(self, recv: torch.Tensor, send: torch.Tensor, rcounts: list[int], scounts: list[int]) -> Any:
        """Start an all-to-all of ``send`` (split by ``scounts``) into ``recv`` (split by ``rcounts``)."""
        return dist.all_to_all_single(recv, send, rcounts, scounts, group=self.group, async_op=True)

    def _host(self, a: np.ndarray) -> torch.Tensor:
        """A host array as a tensor this group's backend takes (a device copy on NCCL)."""
        t = torch.from_numpy(a)
        return t if self._words_on is None else t.to(self._words_on)

    def allreduce(self, arr: Any, op: str = "sum") -> Work:
        if isinstance(arr, np.ndarray) and self._words_on is not None:
            t = self._host(arr)

            def back() -> Any:
                arr[...] = t.cpu().numpy()
                return arr

            return TorchWork(self._all_reduce(t, op), back)
        t = _tensor(arr)
        return TorchWork(self._all_reduce(t, op), lambda: arr)

    def allreduce_tensor(self, t: torch.Tensor) -> Work:
        """Sum a tensor of any dtype the engine supports, in place (the uncompressed path)."""
        return TorchWork(self._all_reduce(t, "sum"), lambda: t)

    def allgather(self, arr: np.ndarray) -> Work:
        host = isinstance(arr, np.ndarray)
        src = self._host(np.ascontiguousarray(arr)) if host else _tensor(arr)
        outs = [torch.empty_like(src) for _ in range(self.size)]
        w = self._all_gather(outs, src)
        if host:  # control words: host int64 back
            return TorchWork(w, lambda: np.stack([o.cpu().numpy() for o in outs]))
        return TorchWork(w, lambda: _array(torch.stack(outs)))

    def allgatherv(self, buf: Any, counts: Sequence[int]) -> Work:
        counts = [int(c) for c in counts]
        width = max(counts) if counts else 0
        if width == 0:
            return DoneWork([xp.empty(buf, 0, np.uint8) for _ in counts])
        if isinstance(buf, np.ndarray):
            if buf.shape[0] == width and buf.flags.writeable:
                src = torch.from_numpy(buf)  # the usual case: equal sizes, no padding copy
            else:
                src = torch.zeros(width, dtype=torch.uint8)
                src.numpy()[: buf.shape[0]] = buf  # through NumPy: buf may be a read-only view
            if self._words_on is not None:  # host bytes (a fingerprint) on an NCCL group
                src = src.to(self._words_on)
                outs = _receive_buffers(self.size, width, src.device)
                w = self._all_gather(outs, src)
                return TorchWork(w, lambda: [o[:c].cpu().numpy() for o, c in zip(outs, counts)])
        else:  # a device buffer: the padding, if any, is made on its device
            src = _tensor(buf)
            if src.shape[0] != width:
                pad = torch.zeros(width, dtype=torch.uint8, device=src.device)
                pad[: src.shape[0]] = src
                src = pad
        outs = _receive_buffers(self.size, width, src.device)
        w = self._all_gather(outs, src)
        return TorchWork(w, lambda: [_array(o[:c]) for o, c in zip(outs, counts)])

    def alltoallv(self, bufs: Sequence[Any], recv_counts: Sequence[int]) -> Work:
        scounts = [int(b.shape[0]) for b in bufs]
        rcounts = [int(c) for c in recv_counts]
        send = _tensor(joined(bufs))
        recv = _receive_buffers(1, sum(rcounts), send.device)[0]
        try:
            w = self._all_to_all(recv, send, rcounts, scounts)
        except RuntimeError as e:
            if send.device.type == "cpu":
                raise
            raise ConfigError(  # e.g. gloo: no all-to-all of CUDA tensors (two-phase, payload reduce-scatter)
                f"this process group cannot all-to-all {send.device} tensors ({e}); use NCCL (or MPI) for "
                "device tensors, or a mode without all-to-all (summable, gather, powersgd)"
            ) from None

        def finish() -> list[Any]:
            a = _array(recv)
            offs = np.concatenate([[0], np.cumsum(rcounts)]).astype(np.int64)
            return [a[offs[i] : offs[i + 1]] for i in range(self.size)]

        return TorchWork(w, finish)


class FutureWork:
    """A torch-``Work``-like handle on a future (``wait()``, ``is_completed()``, ``get_future()``):
    what ``all_reduce(..., async_op=True)`` and ``ReduceScatter(..., async_op=True)`` return."""

    def __init__(self, fut: torch.futures.Future) -> None:
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        """Wait until the exchange ends (re-raising its error). ``timeout``, a
        ``datetime.timedelta`` as torch's ``Work.wait`` takes or seconds: raise
        :class:`gcodec.WaitTimeoutError` (a ``RuntimeError``) if it has not ended by then. The
        exchange is not cancelled by a timeout (its peers are in it); a later ``wait()`` returns
        its result."""
        if timeout is not None:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
            done = threading.Event()
            self._fut.add_done_callback(lambda _: done.set())
            if not done.wait(max(seconds, 0.0)):
                raise WaitTimeoutError(
                    f"a compressed collective did not end within {seconds:g} s (it goes on in the background; "
                    "a peer may be slow, stopped or dead)"
                )
        self._fut.wait()
        return True

    def is_completed(self) -> bool:
        return bool(self._fut.done())

    def get_future(self) -> torch.futures.Future:
        return self._fut


class FutureQueue:
    """Run protocols one at a time in submission order on a thread of the queue's own.

    ``submit`` does not block (unless asked to run the protocol here: ``finish_here``): it
    returns a ``torch.futures.Future`` that completes with the protocol's result (or its error).
    One worker thread runs the protocols in submission order,
    waiting on each collective with ``wait()``, so the collectives of overlapping calls (DDP calls
    the hook for bucket i + 1 while bucket i is still in flight) start in the same order on every
    rank, and the encoding of a bucket overlaps the backward pass of the next.

    Why not chain the steps on the collectives' futures (``add_done_callback``): the callbacks then
    run on gloo's own threads and complete the hook's future from there. Completing a future from
    Python releases the GIL and takes it back; if the training thread, woken by that completion,
    reaches ``destroy_process_group`` first, it holds the GIL while joining gloo's threads and the
    process hangs at exit (seen on 2 of 6 benchmark runs). gloo's threads now never run Python.

    The queue's own thread completes the futures, so it runs their callbacks (DDP's reducer
    copies the bucket back there). At interpreter exit every queue's thread is joined first
    (:func:`_close_all`), so that finalization never finds it inside torch: ended there, it
    aborted the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._held: list[Work] = []  # the collectives of the last completed protocol (see _serve)
        self._pending = 0  # protocols submitted and not yet finished (under _lock)
        # held while a protocol runs, on the queue's thread or on a caller's (finish_here)
        self._exec = threading.Lock()
        _live.add(self)

    def submit(
        self, proto: Protocol, device: Any = None, *, start_here: bool = False, finish_here: bool = False
    ) -> torch.futures.Future:
        """Queue ``proto``; for tensors on a CUDA ``device`` its work goes on the stream that is
        current *now* (the caller's: DDP's, when DDP calls the hook) and the future is made for that
        device, so a consumer waits on the stream (torch records an event when the value is set),
        not on the host.

        ``start_here``: when the queue is idle (nothing submitted is unfinished), ``proto`` runs on
        the calling thread up to its first collective, which it thus starts at once; the queue's
        thread waits for that collective and runs the rest. No other protocol can start a
        collective in between (the queue is idle and the lock is held), so the order of the
        collectives on every rank is the submission order, as before. What it saves is the wake-up
        of the queue's thread before the first collective, a measurable part of a DDP step whose
        bucket goes dense (docs/transports.md, the DDP hook): the BEGIN round trip then starts
        while DDP's thread is still in the hook, as torch's own ``allreduce_hook`` starts its
        allreduce. A protocol that has heavy local work before its first collective
        (an encode) should yield a completed work (``DoneWork``) before it, so that the work runs
        on the queue's thread and still overlaps the caller's.

        ``finish_here``: when the queue is idle, ``proto`` runs to its end on the calling thread,
        which waits on its collectives itself, and the future comes back completed; for a caller
        that has nothing to overlap with it (DDP's last bucket of an iteration: its thread only
        waits for the futures after it). That spares two thread switches: the queue thread's
        wake-up for the first wait, and the caller's wake-up by the queue thread at the end. The
        order of collectives is kept as with ``start_here``: the protocol runs under the queue's
        execution lock, so a protocol submitted meanwhile (from another thread) starts only after
        it on the queue's thread."""
        stream = None
        if device is not None and torch.device(device).type == "cuda":
            stream = torch.cuda.current_stream(device)
            result: torch.futures.Future = torch.futures.Future(devices=[torch.device(device)])
        else:
            result = torch.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # first use, or in a forked child
                self._thread = threading.Thread(target=self._serve, name="gcodec-torch-queue", daemon=True)
                self._thread.start()
            here = finish_here and self._pending == 0
            if here:
                # Taken before the lock is let go: a protocol submitted from now on queues behind
                # this one, and the queue's thread runs it only once this one has ended.
                self._exec.acquire()
            elif start_here and self._pending == 0:
                proto = _started(proto)
            self._pending += 1
            if not here:
                self._jobs.put((proto, result, stream))
        if here:
            self._finish(proto, result)
        return result

    def _finish(self, proto: Protocol, result: torch.futures.Future) -> None:
        """Run ``proto`` to its end on this thread (``submit(finish_here=True)``), holding the
        execution lock the caller took, and complete ``result``."""
        try:
            held: list[Work] = []
            value, error = self._run(proto, held)
            if error is not None:
                _drop_locals(error)
            self._held = held  # released by whichever thread ends the next protocol (see _serve)
            del held
        finally:
            self._exec.release()
            with self._lock:
                self._pending -= 1
        if error is None:
            result.set_result(value)
        else:
            result.set_exception(error)

    def run(self, proto: Protocol) -> Any:
        """Run ``proto`` after the protocols submitted before it and return its result (or raise its
        error), for callers that wait anyway (FSDP2 calls its reduce-scatter synchronously)."""
        return self.submit(proto).wait()

    def drain(self) -> None:
        """Wait until every protocol submitted so far has finished (whatever its outcome).

        When ``backward()`` raises from one bucket's hook, DDP has already handed the later buckets
        to this queue, and their collectives still run here; tearing the process group down under
        them aborts the process. Call this (``gcodec.torch.synchronize()``) before
        ``destroy_process_group`` after an error."""
        self.submit(_empty()).wait()

    def close(self, timeout: float | None = None) -> None:
        """Let the queue's thread finish what was submitted before, then end it (``timeout``
        seconds at most). Called for every queue at interpreter exit: see :func:`_close_all`."""
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._jobs.put(_STOP)
            self._thread = None  # a later submit starts a new thread
        thread.join(timeout)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                self._held = []
                return
            stream = job[2]
            # On the caller's stream: gcodec's kernels launch on torch's current stream, and the
            # future records its completion event there.
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                held: list[Work] = []
                with self._exec:
                    value, error = self._run(job[0], held)
                if error is not None:
                    _drop_locals(error)
                result = job[1]
                # This protocol's collectives stay referenced here until the next protocol
                # completes (or the queue closes); the previous protocol's are released now, on
                # this thread. A c10d work whose last reference is dropped on gloo's worker thread
                # (the protocol let go first, the worker a moment after the work completed) takes
                # the GIL there to free its tensors; when the training thread, woken by the
                # completion, frees DDP's reducer at once, it joins that worker while holding the
                # GIL: a hang at the end of the program (5 of 16 runs of a program that destroyed
                # the group, then returned with its DDP model alive). A work released here, long
                # after it completed, is released by its last holder: this thread.
                self._held = held
                del job, held
                with self._lock:
                    self._pending -= 1
                if error is None:
                    result.set_result(value)
                else:
                    result.set_exception(error)
            del result, value, error, stream

    @staticmethod
    def _run(proto: Protocol, held: list[Work]) -> tuple[Any, BaseException | None]:
        """Run ``proto`` to its end: (its value, None), or (None, the error it raised); every
        collective it yielded is appended to ``held``."""
        try:
            work = next(proto)
            while True:
                held.append(work)
                work.wait()  # re-raises the collective's error (a dead peer, a timeout)
                work = proto.send(None)
        except StopIteration as stop:
            return stop.value, None
        except BaseException as e:
            proto.close()
            return None, e


def _started(proto: Protocol) -> Protocol:
    """Run ``proto`` here up to its first collective; return the protocol that goes on from there
    (yielding that collective first), or that returns or raises what ``proto`` did before any."""
    try:
        first = next(proto)
    except StopIteration as stop:
        return _finished(stop.value, None)
    except BaseException as e:  # the queue's thread raises it, where every error of a protocol goes
        return _finished(None, e)
    return _resumed(proto, first)


def _finished(value: Any, error: BaseException | None) -> Protocol:
    if error is not None:
        raise error
    return value
    yield  # a generator that starts no collective


def _resumed(proto: Protocol, first: Work) -> Protocol:
    """``proto`` after its first collective ``first``: what the queue's thread runs of it."""
    work = first
    try:
        while True:
            yield work
            try:
                work = proto.send(None)
            except StopIteration as stop:
                return stop.value
    finally:
        proto.close()  # the queue closes this one on an error: close the protocol it runs


_STOP = object()  # what close() puts on a queue: its thread returns
_live: weakref.WeakSet[FutureQueue] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit, end every queue's thread before the interpreter finalizes.

    Completing a future runs its callbacks on the completing thread: DDP's reducer copies the
    bucket back inside ``set_result``, in torch's C++. The training thread, woken by that
    completion, may reach the end of the program while the queue's thread is still in there; a
    daemon thread that then asks for the GIL is ended by ``pthread_exit``, whose unwinding through
    torch's ``noexcept`` frames calls ``std::terminate`` ("terminate called without an active
    exception", SIGABRT at exit). So the thread is joined here, after what it was running, while
    the interpreter still stands. 60 s at most: a queue stuck on a dead peer's collective does
    not hold the exit longer than the process group's own timeout would."""
    for q in list(_live):
        q.close(timeout=60.0)


def _drop_locals(error: BaseException) -> None:
    """Clear the local variables of the finished frames in ``error``'s traceback (and its causes'),
    keeping their file and line. The error lives on in the future, and DDP keeps that future; the
    protocol's frames would otherwise keep its tensors and c10d works alive with it, possibly until
    interpreter exit, after the process group they belong to is gone."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)  # frames still executing are left as they are
        e = e.__cause__ or e.__context__


def _empty() -> Protocol:
    return
    yield  # a generator that starts no collective


_queues: dict[int, FutureQueue] = {}
_queues_lock = threading.Lock()


def queue_for(group: Any) -> FutureQueue:
    """The one queue of a process group (None: the default group)."""
    key = id(group) if group is not None else 0
    with _queues_lock:
        q = _queues.get(key)
        if q is None:
            q = _queues[key] = FutureQueue()
        return q


_comms: dict[int, tuple[Any, TorchCommunicator]] = {}


def comm_for(group: Any) -> TorchCommunicator:
    """The one communicator of a process group (None: the default group), on gcodec's own group
    over the same ranks (:func:`own_group`). One per group, because the control messages'
    sequence number it keeps counts every exchange on the group, whichever engine (DDP hook,
    all_reduce, FSDP2, DiLoCo) ran it."""
    key = id(group) if group is not None else 0
    with _queues_lock:
        hit = _comms.get(key)
        if hit is not None and hit[0] is group and _alive(hit[1].group):
            return hit[1]
        c = TorchCommunicator(_new_own_group(group))
        _comms[key] = (group, c)  # the user's group held: its id is not reused while it is here
        return c


def own_group(group: Any = None) -> Any:
    """The process group on which gcodec runs the collectives of ``group`` (None: the default
    group): a group of its own over the same ranks, in the same order, with the same backend and
    timeout, made on first use (every rank reaches its first compressed exchange of ``group``
    alike) and kept until the process groups are destroyed.

    Why a group of its own: gloo and NCCL match collectives by their order on a process group.
    gcodec's queue thread starts a bucket's collectives while the engine's thread goes on and
    starts its own on the engine's group: DDP all-reduces its unused-parameter bitmap once the
    last bucket is handed to the hook (``find_unused_parameters=True``, and ``static_graph``'s
    first iteration), SyncBatchNorm all-reduces statistics in backward, users run collectives
    between steps. On one rank DDP's collective came first, on another gcodec's: gloo read one
    as the other ("Received data size doesn't match expected size") or both waited until the
    timeout. On a group that only gcodec uses, its collectives are ordered among themselves by
    the group's queue (submission order, the same on every rank), and nobody else's can come
    between them (docs/transports.md, "One order of collectives")."""
    return comm_for(group).group


def _new_own_group(group: Any) -> Any:
    """A new process group over ``group``'s ranks (in its order), with its backend and timeout."""
    world = group if group is not None else dist.distributed_c10d._get_default_group()
    return dist.new_group(
        ranks=dist.get_process_group_ranks(world),
        timeout=_timeout_of(world),
        backend=str(dist.get_backend(world)),
        use_local_synchronization=True,  # only the group's members make it (a subgroup's peers)
        group_desc="gcodec",
        sort_ranks=False,
    )


def _timeout_of(group: Any) -> Any:
    """The collective timeout of ``group``'s backend (``init_process_group(timeout=...)``), so that
    a dead peer ends gcodec's collectives as soon as the engine's own; None: the backend's default."""
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except Exception:  # no backend for that device, or no options to read
            continue
    return None


def _alive(group: Any) -> bool:
    """Whether ``group`` still stands (``destroy_process_group`` ends gcodec's groups too; a job
    that starts a new one gets new ones)."""
    if group is None:  # a communicator made on the default group itself
        return bool(dist.is_initialized())
    try:
        return group in dist.distributed_c10d._world.pg_map
    except Exception:
        return True


def synchronize(group: Any = None) -> None:
    """Wait for every compressed collective gcodec has queued on ``group`` (None: the default
    group) to finish: the DDP hook's, ``all_reduce(async_op=True)``'s and FSDP2's. Needed before
    ``destroy_process_group`` when a step failed, since the later buckets' exchanges still run."""
    queue_for(group).drain()
