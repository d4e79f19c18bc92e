"""A DDP communication hook that compresses gradients with any gcodec codec.

Register it the way torch's own hooks are registered::

    state = gcodec.torch.HookState(codec="uniform", start_iter=10, min_numel=1024)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)

Per bucket, the hook sorts the gradients into three kinds, in the spirit of torch's
``powerSGD_hook``:

* **dense**: during the first ``start_iter`` iterations, tensors under ``min_numel`` elements,
  1-D tensors (biases, norms) under a low-rank codec, and whatever the policy maps to ``None``.
  They are averaged uncompressed in one allreduce;
* **PowerSGD** tensors: all P of the bucket in one allreduce, all Q in a second one;
* everything else, grouped by codec: one flat tensor per codec, exchanged by the codec's mode
  (summable, gather, two-phase) as ``gcodec.torch.all_reduce`` would.

Results are decoded into the bucket's buffer in place, and the returned future is chained on the
asynchronous collectives: nothing blocks inside the hook.

State is keyed by *parameter*, not by bucket index: DDP rebuilds its buckets after the first
iteration (their sizes change with ``bucket_cap_mb``), so a residual kept per bucket index would
meet a tensor of another size. Error-feedback residuals of a flat group are carried over, slice by
slice, to the new group that holds the same parameters; PowerSGD's residuals and warm-start Q are
per parameter already.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..arrays import tensors_from_arrays
from ..codecs import Codec, get_codec
from ..errors import ConfigError, GcodecError
from ..policy import Policy as CodecPolicy
from ..telemetry import Telemetry
from ..transports import LowRankItem, TransportState, lowrank_protocol, resolve_mode
from ..transports.common import timed
from ..transports.control import Exchange, failed_exchange
from ..transports.gather import gather_protocol
from ..transports.handshake import Agreement, fingerprint
from ..transports.quality import sample_quality
from ..transports.stats import StepStats
from ..transports.summable import summable_protocol
from ..transports.two_phase import owner_bounds, two_phase_protocol
from .comm import TorchCommunicator, comm_for, queue_for
from .convert import to_numpy

__all__ = ["HookState", "Policy", "comm_hook"]

#: A policy maps (parameter name, gradient) to a codec, or to None to keep the tensor dense.
Policy = Callable[[str, torch.Tensor], "Codec | str | dict[str, Any] | None"]

_POLICY_MARK = "gcodec.policy.Policy"  # how a pickled HookState tells a Policy from a pattern dict

_FLAT = {"summable": summable_protocol, "gather": gather_protocol, "two_phase": two_phase_protocol}


def _codec_key(codec: Codec) -> str:
    return json.dumps(codec.get_config(), sort_keys=True)


class HookState:
    """State of :func:`comm_hook`, kept apart from the hook as torch does with ``PowerSGDState``.

    Args:
        codec: the codec for compressed tensors (a codec, id or config). Default ``"fp16"``.
        process_group: the group to reduce over; None is the default group. Not pickled.
        start_iter: iterations averaged uncompressed before compression starts. Early gradients are
            large and change fast; compressing them hurts more than later (torch's PowerSGD uses
            10 warm-up steps by default; 0 compresses from the start).
        min_numel: tensors with fewer elements stay dense. Small tensors gain nothing on the wire and
            cost a fixed encode/decode overhead each. 1024 is a good floor on CPU.
        error_feedback: keep what compression drops and add it to the next step's gradient. Needed
            for top-k, sign, low bit widths and PowerSGD; a no-op cost for fp16/bf16.
        mode: ``"auto"`` or an explicit mode (see docs/transports.md).
        policy: per-tensor codec choice: a :class:`gcodec.policy.Policy` (by name, size, ndim and
            step; it then decides alone, ``min_numel`` and ``codec`` unused), a callable
            ``policy(name, grad) -> codec or None`` or a dict ``{fnmatch pattern: codec or None}``
            (first matching pattern wins; unmatched tensors use ``codec``). ``None`` means dense.
            Names come from ``module``.
        module: the model (or the DDP wrapper), used only to name parameters for the policy and for
            statistics. Without it, parameters are named ``param0``, ``param1``, ... in the order DDP
            first hands them to the hook (the same order in every run).
        num_threads: kernel threads per rank; None follows the job (docs/transports.md, "Threads").
        telemetry: a :class:`gcodec.telemetry.Telemetry` sampling the quality of every compressed
            group every ``telemetry.every`` steps (``stats()[key]["quality"]``). Not pickled.
    """

    def __init__(
        self,
        codec: Codec | str | dict[str, Any] = "fp16",
        *,
        process_group: Any = None,
        start_iter: int = 10,
        min_numel: int = 1024,
        error_feedback: bool = True,
        mode: str = "auto",
        policy: CodecPolicy | Policy | Mapping[str, Any] | None = None,
        module: torch.nn.Module | None = None,
        num_threads: int | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.codec = get_codec(codec)
        self.telemetry = telemetry
        self.process_group = process_group
        self.start_iter = int(start_iter)
        self.min_numel = int(min_numel)
        self.error_feedback = bool(error_feedback)
        self.mode = mode
        self.policy = policy
        self.num_threads = num_threads
        self.iter = 0
        self._names: dict[int, str] = {}
        if module is not None:
            self._names = {id(p): n for n, p in module.named_parameters()}
        self._named_by_order = module is None
        self._states: dict[str, TransportState] = {}
        self._groups: dict[str, list[tuple[str, int]]] = {}  # flat-group key -> [(param name, numel)]
        self._owner: dict[str, str] = {}  # param name -> the flat group that holds its residual now
        self._comm: TorchCommunicator | None = None
        self._codec_cache: dict[str, Codec] = {}
        self._agreed: dict[str, str] = {}  # bucket -> the plan its exchange last agreed on

    # ---- names, codecs, states ---------------------------------------------------------------
    def _name(self, p: torch.Tensor) -> str:
        name = self._names.get(id(p))
        if name is None:
            name = f"param{len(self._names)}"
            self._names[id(p)] = name
        return name

    def _codec_for(self, name: str, grad: torch.Tensor, step: int = 0) -> Codec | None:
        if isinstance(self.policy, CodecPolicy):  # the policy decides everything, min_numel included
            return self.policy.codec_for(name, tuple(grad.shape), step)
        choice: Any = self.codec
        if callable(self.policy):
            choice = self.policy(name, grad)
        elif isinstance(self.policy, Mapping):
            for pattern, c in self.policy.items():
                if fnmatch.fnmatchcase(name, pattern):
                    choice = c
                    break
        if choice is None:
            return None
        if isinstance(choice, Codec):
            codec = choice
        else:  # one instance per config: stateful codecs keep their state in it
            ck = json.dumps(choice, sort_keys=True)
            codec = self._codec_cache.get(ck) or self._codec_cache.setdefault(ck, get_codec(choice))
        if grad.numel() < self.min_numel:
            return None
        if codec.codec_id == "powersgd" and not codec.compresses(tuple(grad.shape)):  # type: ignore[attr-defined]
            return None  # 1-D tensors and matrices too thin to gain: dense, as torch's hook does
        return codec

    def state_for(self, codec: Codec) -> TransportState:
        """The transport state (residuals, statistics) of one codec of this hook."""
        k = _codec_key(codec)
        st = self._states.get(k)
        if st is None:
            st = TransportState(
                codec,
                error_feedback=self.error_feedback,
                mode=self.mode,
                num_threads=self.num_threads,
                telemetry=self.telemetry,
            )
            self._states[k] = st
        return st

    def comm(self) -> TorchCommunicator:
        if self._comm is None:
            self._comm = comm_for(self.process_group)
        return self._comm

    # ---- statistics and checkpoints ----------------------------------------------------------
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per key (parameter group) and codec: bytes and seconds of the last step and totals."""
        out: dict[str, dict[str, Any]] = {}
        for st in self._states.values():
            for k, v in st.stats().items():
                out[k] = {**v, "codec": st.codec.get_config()}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Iteration, parameter names and every codec's residuals and factors, as tensors, ints and
        strings only (``torch.load(weights_only=True)`` accepts it)."""
        return {
            "iter": self.iter,
            "groups": {k: [[n, c] for n, c in v] for k, v in self._groups.items()},
            "owners": dict(self._owner),
            "states": {k: tensors_from_arrays(st.state_dict()) for k, st in self._states.items()},
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self._agreed.clear()  # agree again after a restore: the peers may have changed
        self.iter = int(sd["iter"])
        self._groups = {str(k): [(str(n), int(c)) for n, c in v] for k, v in sd.get("groups", {}).items()}
        self._owner = {str(k): str(v) for k, v in sd.get("owners", {}).items()}
        for saved in sd["states"].values():
            s = _to_arrays(saved)
            self.state_for(get_codec(s["codec"])).load_state_dict(s)

    def __getstate__(self) -> dict[str, Any]:
        # Like torch's PowerSGDState: the configuration and the state, not the process group (nor
        # the live adapter, nor parameter identities, which name parameters of this process only).
        policy: Any = self.policy
        if isinstance(policy, CodecPolicy):
            policy = {_POLICY_MARK: policy.to_dict()}
        elif isinstance(policy, Mapping):
            policy = {k: (v if v is None else get_codec(v).get_config()) for k, v in policy.items()}
        return {
            "codec": self.codec.get_config(),
            "start_iter": self.start_iter,
            "min_numel": self.min_numel,
            "error_feedback": self.error_feedback,
            "mode": self.mode,
            "policy": policy,
            "num_threads": self.num_threads,
            "state": self.state_dict(),
        }

    def __setstate__(self, d: dict[str, Any]) -> None:
        if isinstance(d["policy"], Mapping) and _POLICY_MARK in d["policy"]:
            d = {**d, "policy": CodecPolicy.from_dict(d["policy"][_POLICY_MARK])}
        self.__init__(  # type: ignore[misc]
            d["codec"],
            start_iter=d["start_iter"],
            min_numel=d["min_numel"],
            error_feedback=d["error_feedback"],
            mode=d["mode"],
            policy=d["policy"],
            num_threads=d["num_threads"],
        )
        self.load_state_dict(d["state"])

    # ---- the flat groups and their residual carry-over ---------------------------------------
    def _group_key(self, codec: Codec, names: list[str], numels: list[int], size: int) -> str:
        digest = hashlib.sha1("\0".join(names).encode()).hexdigest()[:8]
        key = f"{names[0]}..{names[-1]} ({len(names)} tensors, {codec.codec_id}, {digest})"
        layout = list(zip(names, numels))
        # The parameters' latest residuals live under the group that last held them; when that is
        # another group (DDP rebuilt its buckets, or rebuilt them back), gather them into this one.
        if any(self._owner.get(n, key) != key for n in names):
            self._carry_over(codec, key, layout, size)
        self._groups[key] = layout
        for n in names:
            self._owner[n] = key
        return key

    def _carry_over(self, codec: Codec, key: str, layout: list[tuple[str, int]], size: int) -> None:
        """Build the worker residual of ``key`` from the residuals of the groups that held its
        parameters last (after a bucket rebuild). Two-phase residuals are kept per owner chunk."""
        st = self.state_for(codec)
        ef = st.worker
        if ef is None:
            return
        chunked = resolve_mode(codec, self.mode, size) == "two_phase"

        def residual_of(k: str) -> np.ndarray | None:
            if not chunked:
                return ef.residual(k)
            parts = [ef.residual(f"{k}[{j}/{size}]") for j in range(size)]
            return None if any(q is None for q in parts) else np.concatenate([q.reshape(-1) for q in parts])  # type: ignore[union-attr]

        pieces: dict[str, np.ndarray] = {}
        for old_key in {self._owner[n] for n, _ in layout if n in self._owner}:
            res = residual_of(old_key)
            if res is None or old_key not in self._groups:
                continue
            pos = 0
            for n, c in self._groups[old_key]:
                if self._owner.get(n) == old_key:
                    pieces[n] = res.reshape(-1)[pos : pos + c]
                pos += c
        new = np.zeros(sum(c for _, c in layout), np.float32)
        pos = 0
        for n, c in layout:
            if n in pieces and pieces[n].shape[0] == c:
                new[pos : pos + c] = pieces[n]
            pos += c
        sd = ef.state_dict()
        if chunked:
            b = owner_bounds(new.shape[0], size)
            for j in range(size):
                sd["residuals"][f"{key}[{j}/{size}]"] = new[b[j] : b[j + 1]].copy()
        else:
            sd["residuals"][key] = new
        ef.load_state_dict(sd)


def _to_arrays(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()
    if isinstance(obj, dict):
        return {k: _to_arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_arrays(v) for v in obj]
    return obj


def _bucket_protocol(state: HookState, bucket: dist.GradBucket, it: int) -> Any:
    comm = state.comm()
    buf = bucket.buffer()
    p = comm.size
    what = f"DDP hook, bucket {bucket.index()} at iteration {it}"
    # The bucket's plan (which tensors go dense, which codec and mode each group takes) is decided
    # locally, then agreed in the bucket's exchange: its fingerprint travels in full the first time
    # and as a digest in the first message of every later step (see gcodec.transports.control).
    try:
        plan = _plan(state, bucket, it, p)
    except GcodecError as e:  # take part, so that the peers raise too instead of waiting
        yield from failed_exchange(comm, e, what)
    ex = Exchange(comm, plan.fingerprint, state._agreed, f"bucket{bucket.index()}", what, plan.on_agree)
    if plan.warmup or not plan.groups:
        # Warm-up, or everything dense this step (a policy's choice): plain average of the whole
        # bucket, in its own dtype, as torch's allreduce hook.
        yield from ex.begin()
        yield comm.allreduce_tensor(buf)
        buf.div_(p)
        return buf
    grads, names = plan.grads, plan.names
    # Dense tensors: their concatenation (in float32) is summed uncompressed, riding with the
    # bucket's first summable or PowerSGD group when it has one (no round of their own; see
    # summable_protocol and lowrank_protocol), else in an allreduce of its own.
    flat = (
        np.concatenate([to_numpy(grads[i]).reshape(-1).astype(np.float32) for i in plan.dense]) if plan.dense else None
    )
    if flat is not None and plan.carrier is None:
        yield from ex.begin()
        yield comm.allreduce(flat, "sum")
        _write_dense(grads, plan.dense, flat, p)

    for g in plan.groups:
        ts, mode, idx = g.state, g.mode, g.idx
        riders = flat if g is plan.carrier else None
        if mode == "powersgd":
            items = [LowRankItem(names[i], to_numpy(grads[i]), to_numpy(grads[i])) for i in idx]
            for item in items:
                sample_quality(ts, item.key, it, item.x)
            st = StepStats(g.key, it, mode, sum(i.x.nbytes for i in items))
            yield from timed(st, lowrank_protocol(ex, ts, items, "mean", it, st, riders))
            ts.record(st)
            continue
        span = _span(buf, grads, idx)
        whole = span is not None  # the group lies back to back in the bucket: work on it in place
        x = span if span is not None else np.concatenate([to_numpy(grads[i]).reshape(-1) for i in idx])
        step = ts.next_step(g.key)
        sample_quality(ts, g.key, step, x)
        st = StepStats(g.key, step, mode, x.nbytes)
        out = x if whole else np.empty_like(x)
        extra = {} if riders is None else {"dense": riders}  # only a summable group carries riders
        proto = _FLAT[mode](ex, ts, x.reshape(-1), out.reshape(-1), g.key, "mean", step, st, **extra)
        yield from timed(st, proto)
        ts.record(st)
        if not whole:
            _scatter(grads, idx, out)
    if flat is not None and plan.carrier is not None:
        _write_dense(grads, plan.dense, flat, p)
    return buf


@dataclass
class _Group:
    """The tensors ``idx`` of a bucket that one codec compresses, as one flat group ``key``."""

    key: str
    state: TransportState  # the codec's (``state.codec``)
    mode: str
    idx: list[int]


@dataclass
class _Plan:
    """What one rank intends to do with one bucket at one iteration: what its exchange agrees on."""

    warmup: bool
    names: list[str]
    grads: list[torch.Tensor]
    dense: list[int] = field(default_factory=list)
    groups: list[_Group] = field(default_factory=list)
    carrier: _Group | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)

    def on_agree(self, agreement: Agreement) -> None:
        for g in self.groups:
            g.state.agreed_on(g.key, agreement.local_ranks)


def _plan(state: HookState, bucket: dist.GradBucket, it: int, p: int) -> _Plan:
    buf = bucket.buffer()
    # Name parameters on every call, warm-up included: without a module, names follow the order in
    # which DDP first hands parameters over, which is the same in every fresh DDP (before rebuild).
    names = [state._name(q) for q in bucket.parameters()]
    common = {"bucket": bucket.index(), "numel": int(buf.numel()), "dtype": str(buf.dtype), "size": p}
    if it < state.start_iter:
        return _Plan(True, names, [], fingerprint=fingerprint(phase="warm-up", **common))
    grads = bucket.gradients()
    plan = _Plan(False, names, grads)
    by_codec: dict[str, list[int]] = {}
    codecs: dict[str, Codec] = {}
    for i, (n, g) in enumerate(zip(names, grads)):
        c = state._codec_for(n, g, it)
        if c is None:
            plan.dense.append(i)
        else:
            k = _codec_key(c)
            by_codec.setdefault(k, []).append(i)
            codecs[k] = c
    for k, idx in by_codec.items():
        codec = codecs[k]
        mode = resolve_mode(codec, state.mode, p)
        if mode == "powersgd":
            key = f"powersgd:{names[idx[0]]}..{names[idx[-1]]}"
        else:
            key = state._group_key(codec, [names[i] for i in idx], [grads[i].numel() for i in idx], p)
        plan.groups.append(_Group(key, state.state_for(codec), mode, idx))
    if plan.dense:
        plan.carrier = next((g for g in plan.groups if g.mode in ("summable", "powersgd")), None)
    plan.fingerprint = fingerprint(
        phase="compressed",
        ef=state.error_feedback,
        dense=[[names[i], int(grads[i].numel())] for i in plan.dense],
        # one field per property, each a list over the groups, so a difference names what differs
        codec=[g.state.codec.get_config() for g in plan.groups],
        mode=[g.mode for g in plan.groups],
        groups=[g.key for g in plan.groups],
        tensors=[[[names[i], list(grads[i].shape), str(grads[i].dtype)] for i in g.idx] for g in plan.groups],
        carrier=None if plan.carrier is None else plan.carrier.key,
        **common,
    )
    return plan


def _span(buf: torch.Tensor, grads: list[torch.Tensor], idx: list[int]) -> np.ndarray | None:
    """The gradients ``idx`` as one slice of the bucket's buffer when they lie back to back in it (as
    DDP lays out a bucket, minus the dense tensors at its ends), else None."""
    base, isz = buf.data_ptr(), buf.element_size()
    start = pos = grads[idx[0]].data_ptr() - base
    for i in idx:
        g = grads[i]
        if g.data_ptr() - base != pos or g.dtype != buf.dtype or not g.is_contiguous():
            return None
        pos += g.numel() * isz
    if start < 0 or pos > buf.numel() * isz or start % isz:
        return None
    return to_numpy(buf).reshape(-1)[start // isz : pos // isz]


def _scatter(grads: list[torch.Tensor], idx: list[int], flat: np.ndarray) -> None:
    """Write the consecutive slices of ``flat`` back into the gradients ``idx``, in order."""
    pos = 0
    for i in idx:
        a = to_numpy(grads[i]).reshape(-1)
        a[...] = flat[pos : pos + a.shape[0]]
        pos += a.shape[0]


def _write_dense(grads: list[torch.Tensor], dense: list[int], flat: np.ndarray, p: int) -> None:
    """The dense tensors' mean, from the sum ``flat``, written back into their gradients."""
    flat *= np.float32(1.0 / p)
    _scatter(grads, dense, flat)


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: compressed average of one gradient bucket (see :class:`HookState`).

    Returns a future that completes with the bucket's buffer, holding the averaged gradients.
    """
    if not isinstance(state, HookState):
        raise ConfigError(f"comm_hook needs a gcodec.torch.HookState, not {type(state).__name__}")
    it = state.iter
    if bucket.is_last():
        state.iter += 1
    return queue_for(state.process_group).submit(_bucket_protocol(state, bucket, it))


# DDP checks the hook's annotations against the real classes; postponed (string) annotations fail.
comm_hook.__annotations__ = {
    "state": HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
