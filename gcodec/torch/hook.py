"""A DDP communication hook that compresses gradients with any gcodec codec.

Register it the way torch's own hooks are registered::

    state = gcodec.torch.HookState(codec="uniform", min_numel=1024)
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

Codec choice, group keys and residuals are the router's (:class:`gcodec.transports.Router`), as
for FSDP2, ``all_reduce`` and ``gcodec.mpi``. Residuals are kept by *parameter* and element range,
not by bucket index: DDP rebuilds its buckets after the first iteration (their sizes change with
``bucket_cap_mb``), and a policy or an adaptive controller may move a parameter to another codec;
the router re-slices every pending residual into the new group's layout. PowerSGD's residuals and
warm-start Q are per parameter already.

An adaptive controller (``controller=gcodec.adaptive.AdaptiveController(...)``) picks one rung of its
ladder per bucket every few steps, from what the bucket's exchanges measured, the same on every
rank; the size rules (``min_numel``, a codec that would pass a shape through) keep their tensors dense.
"""

from __future__ import annotations

import json
import math
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import xp
from ..arrays import BFLOAT16, tensors_from_arrays
from ..codecs import Codec
from ..deprecation import renamed_names
from ..errors import ConfigError, GcodecError
from ..policy import DEFAULTS
from ..policy import Policy as CodecPolicy
from ..telemetry import Telemetry
from ..transports import DENSE, DoneWork, LowRankItem, Router
from ..transports.control import Exchange, failed_exchange
from ..transports.handshake import fingerprint
from ..transports.plan import Group, Item, Plan, policy_chooser
from ..transports.plan import plan as make_plan
from ..transports.quality import sample_quality
from ..transports.run import dense, joined, run, scatter
from ..transports.stats import StepStats, ring_bytes
from ..warmup import warm_for_training
from .comm import TorchCommunicator, comm_for, queue_for
from .convert import arrays_from_tensors, as_array
from .engine import EngineState, check_owner, config_diff, rank_and_world

__all__ = ["HookNotCalledWarning", "HookState", "TensorChooser", "comm_hook"]

#: A callable policy: (parameter name, its gradient; under FSDP2 a meta tensor of the parameter's
#: shape) to a codec, or to None to keep the tensor dense. Not :class:`gcodec.policy.Policy`, the
#: rule list (either one may be given as ``policy=``).
TensorChooser = Callable[[str, torch.Tensor], "Codec | str | dict[str, Any] | None"]

__getattr__ = renamed_names("gcodec.torch.hook", {"Policy": ("TensorChooser", TensorChooser)})


class HookNotCalledWarning(UserWarning):
    """An optimizer stepped before any gradient bucket reached a :class:`HookState`: DDP never called
    :func:`comm_hook` with it, so the gradients were averaged uncompressed by DDP itself.

    Raised once per state, at the first optimizer step that updates a parameter of the state's
    ``module`` (without ``module``: the first optimizer step of the process, while no state has
    been handed a bucket). The usual cause is a framework that takes the hook and drops it:
    Lightning's ``DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...)`` registers it on CUDA only
    (docs/integrations.md has the recipe that works on every device)."""


_any_bucket = False  # a bucket reached some HookState of this process

#: Watchers that are done (they warned, or their state was collected or reached) and wait to be
#: removed: torch calls the global post-step hooks while iterating their OrderedDict, which may
#: lose an entry during that loop only once the loop has reached its last entry (removing an
#: earlier one raises "OrderedDict mutated during iteration" in ``opt.step()``).
_retired: list[Any] = []


def _sweep(current: Any = None) -> None:
    """Remove the retired watchers where no loop over torch's hooks can break: outside one
    (``current`` None: a bucket, in DDP's backward), or from the loop's last hook ``current``."""
    if current is not None:
        try:
            from torch.optim.optimizer import _global_optimizer_post_hooks as hooks
        except ImportError:  # pragma: no cover - another torch: leave them to the next bucket
            return
        if not hooks or next(reversed(hooks)) != current.id:
            return
    while _retired:
        _retired.pop().remove()


def _watch(state: HookState) -> Any:
    """Until the first bucket reaches ``state``: an optimizer post-step hook of its own that warns
    (HookNotCalledWarning) at the first step of the state's model, then removes itself (when torch's
    loop over its hooks allows: :func:`_sweep`); the first bucket removes it too (:func:`comm_hook`),
    and so does the state's collection. Nothing of it runs on later steps."""
    ref = weakref.ref(state)

    def after_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        st = ref()
        done = any(h is handle for h in _retired)
        if st is None or st._reached or done:
            if not done:
                _retired.append(handle)
            _sweep(handle)
            return
        if st._watched is None:
            concerned = not _any_bucket
        else:
            groups = getattr(opt, "param_groups", None) or ()
            concerned = any(id(q) in st._watched for g in groups for q in g.get("params", ()))
        if concerned:
            _retired.append(handle)
            _sweep(handle)
            warnings.warn(
                f"gcodec: {type(opt).__name__}.step() ran before DDP handed any gradient bucket to this "
                "HookState: its comm_hook was never called, and the gradients were averaged uncompressed "
                "by DDP. Register it on the DDP model that trains: ddp.register_comm_hook(state, "
                "gcodec.torch.comm_hook). Lightning's DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...) "
                "registers hooks on CUDA only and drops them on the CPU without a word; register the hook "
                "in a Callback's on_fit_start instead (docs/integrations.md).",
                HookNotCalledWarning,
                stacklevel=3,
            )

    handle = register_optimizer_step_post_hook(after_step)
    weakref.finalize(state, handle.remove)
    return handle


def _first_bucket(state: HookState) -> None:
    global _any_bucket
    _any_bucket = state._reached = True
    state._watch_handle.remove()
    _sweep()  # in DDP's backward, outside any optimizer step


class HookState(EngineState):
    """State of :func:`comm_hook`, kept apart from the hook as torch does with ``PowerSGDState``.

    Args:
        codec: the codec for compressed tensors (a codec, id or config). Default ``"fp16"``.
        process_group: the group to reduce over; None is the default group. Not pickled. gcodec's
            collectives run on a group of its own over the same ranks, so that none of DDP's
            own (``find_unused_parameters``, SyncBatchNorm) can come between them
            (:func:`gcodec.torch.comm.own_group`).
        start_iter: iterations averaged uncompressed before compression starts. Default 0: error
            feedback from the first step, which ended where 10 dense steps first end for sign,
            top-k, PowerSGD and uniform 4 on the MLP under SGD, and for uniform 4 on the LM under
            AdamW, where top-k and PowerSGD lost more without them (docs/convergence.md, "Error
            feedback from the first step": keep 10 for those codecs with AdamW); PowerSGD's first
            step starts from the spec's random Q. torch's PowerSGD hook needs at least 2 dense steps
            (its state is per bucket, which DDP rebuilds after the first); gcodec keeps residuals
            and warm starts per parameter, so it needs none.
        warmup_codec: the codec of the warm-up iterations instead of the uncompressed average, e.g.
            ``{"id": "uniform", "bits": 8}`` with error feedback, or ``"fp16"``: a light codec that
            keeps early gradients almost exact at a fraction of the bytes, where a slow link makes
            dense warm-up steps the longest part of a short job. The size rules apply as after it
            (``min_numel``, a codec that would pass a shape through); residuals carry into the
            codec that follows. None (default): dense, as torch's hooks.
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
        controller: an adaptive controller (:class:`gcodec.adaptive.AdaptiveController`): one
            rung of its ladder per bucket, chosen every few steps from what the bucket's exchanges
            measured, instead of the policy; calibrated at construction. (Given as ``policy=``, it
            is taken as the controller, with a DeprecationWarning.)
        module: the model (or the DDP wrapper), used to name parameters for the policy and for
            statistics. Without it, parameters are named ``param0``, ``param1``, ... in the order DDP
            first hands them to the hook (the same order in every run). Also tells which optimizer
            steps are this model's: one that comes before any bucket reached the state warns
            (:class:`HookNotCalledWarning`: the hook was never registered on the DDP that trains);
            without ``module``, the first optimizer step of a process where no state got a bucket.
        num_threads: kernel threads per rank; None follows the job (docs/transports.md, "Threads").
        telemetry: a :class:`gcodec.telemetry.Telemetry` sampling the quality of every compressed
            group every ``telemetry.every`` steps (``stats()[key]["quality"]``). Not pickled.
        warm: load (or compile) the kernels of the configured codecs now
            (:func:`gcodec.warmup.warm_for_training`: the codec, the warm-up codec, a Policy's or
            a pattern dict's codecs, an adaptive controller's ladder; on float32 and the module's
            parameter dtypes), before any collective, so that the first compressed step does not
            stall and no rank keeps its peers waiting in a collective while it compiles. Costs
            what that first step would have (docs/transports.md, "Kernels at registration"); the
            seconds are in ``warm_s``. False: on first use, as before.

    A codec that cannot shrink what it is given (fp16 or bf16 on 16-bit gradients: as many bytes
    as the gradients themselves) is warned about once, at its first compressed step.
    """

    def __init__(
        self,
        codec: Codec | str | dict[str, Any] = DEFAULTS.codec,
        *,
        process_group: Any = None,
        start_iter: int = DEFAULTS.start_iter,
        min_numel: int = DEFAULTS.min_numel,
        error_feedback: bool = True,
        mode: str = "auto",
        policy: Any = None,
        controller: Any = None,
        module: torch.nn.Module | None = None,
        num_threads: int | None = None,
        telemetry: Telemetry | None = None,
        warmup_codec: Codec | str | dict[str, Any] | None = None,
        warm: bool = True,
    ) -> None:
        self._setup(
            codec,
            policy=policy,
            controller=controller,
            start_iter=start_iter,
            min_numel=min_numel,
            error_feedback=error_feedback,
            num_threads=num_threads,
            mode=mode,
            telemetry=telemetry,
        )
        self.process_group = process_group
        self.iter = 0
        self._names: dict[int, str] = {}
        if module is not None:
            self._names = {id(p): n for n, p in module.named_parameters()}
        self._named_by_order = module is None
        self._comm: TorchCommunicator | None = None
        self._expected: tuple[int | None, int | None] | None = None  # (rank, world) a loaded state was saved by
        #: The error of the last bucket that failed on this rank (None while none has), as raised:
        #: DDP re-raises it from ``backward()`` as a ``RuntimeError`` with its message only
        #: (``except RuntimeError: raise state.last_error``). Its message starts with its class.
        self.last_error: BaseException | None = None
        self.warmup_codec = self.router.codec(warmup_codec)
        self._warned: set[str] = set()  # codec configs warned about for not shrinking their input
        #: seconds the kernels' warm-up took at construction (0.0 without ``warm``)
        self.warm_s = 0.0
        if warm:
            dtypes = {torch.float32} | ({q.dtype for q in module.parameters()} if module is not None else set())
            self.warm_s = warm_for_training(
                _configured_codecs(self.codec, self.warmup_codec, self.policy, self.controller),
                [np.dtype(str(d).replace("torch.", "")) if d != torch.bfloat16 else BFLOAT16 for d in dtypes],
                error_feedback=self.error_feedback,
            )
        # Until the first bucket arrives, an optimizer step that updates these parameters means
        # DDP never called the hook (HookNotCalledWarning); None: the module is not known.
        self._reached = False
        self._watched = None if module is None else {id(q) for q in module.parameters()}
        self._watch_handle = _watch(self)

    # ---- names, codecs, states ---------------------------------------------------------------
    def _name(self, p: torch.Tensor) -> str:
        name = self._names.get(id(p))
        if name is None:
            name = f"param{len(self._names)}"
            self._names[id(p)] = name
        return name

    def comm(self) -> TorchCommunicator:
        if self._comm is None:
            self._comm = comm_for(self.process_group)
        return self._comm

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Iteration and the router's state (every codec's steps and factors, the residuals by
        parameter and element range, a controller's figures), with whose state it is: this rank,
        the world size and the configuration. Tensors, ints and strings only
        (``torch.load(weights_only=True)`` accepts it). The residuals are this rank's own: every
        rank saves its own state and loads its own (docs/transports.md, "Checkpoints")."""
        rank, world = rank_and_world(self.process_group)
        return {
            "version": _STATE_VERSION,
            "rank": rank,
            "world_size": world,
            "config": self._config_json(),
            "iter": self.iter,
            "router": tensors_from_arrays(self.router.state_dict()),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved. Refused (:class:`gcodec.ConfigError`) when it
        was saved with another configuration (naming the fields that differ), or by another rank
        or world size: at once when the process group is up, else at the first bucket, on every
        rank. A state saved before these fields existed (no ``version``) loads unchecked."""
        if "version" in sd:
            if int(sd["version"]) > _STATE_VERSION:
                raise ConfigError(
                    f"this hook state has version {int(sd['version'])}; this gcodec reads up to {_STATE_VERSION}"
                )
            diff = config_diff(json.loads(str(sd["config"])), json.loads(self._config_json()))
            if diff:
                raise ConfigError(f"this hook state was saved with another configuration ({diff})")
            self._expected = (sd["rank"], sd["world_size"])
            self._check_owner()
        self._agreed.clear()  # agree again after a restore: the peers may have changed
        self.iter = int(sd["iter"])
        self.router.load_state_dict(arrays_from_tensors(sd["router"]))

    def _config_json(self) -> str:
        """The configuration a saved state belongs to, as canonical JSON."""
        d = self._config()
        d.pop("num_threads")  # threads change no result
        controller = d.pop("controller")
        if controller is not None:  # recorded where states saved before controller= had it
            d["policy"] = controller
        if not (d["policy"] is None or isinstance(d["policy"], Mapping)):  # a callable or a controller
            d["policy"] = f"<{type(d['policy']).__name__}>"
        return json.dumps(d, sort_keys=True, default=str)

    def _check_owner(self) -> None:
        """Raise ConfigError when the state loaded here was saved by another rank or world size
        (a no-op until the process group is up; the hook checks again at its first bucket)."""
        here = rank_and_world(self.process_group)
        if self._expected is None or here[0] is None:
            return
        hint = "every rank loads its own state, saved by a job of its size (docs/transports.md, 'Checkpoints')"
        check_owner("hook state", self._expected, here, hint)
        self._expected = None

    def _config(self) -> dict[str, Any]:
        warmup = None if self.warmup_codec is None else self.warmup_codec.get_config()
        return {**super()._config(), "mode": self.mode, "warmup_codec": warmup}


def _bucket_protocol(state: HookState, bucket: dist.GradBucket, it: int) -> Any:
    t_start = time.perf_counter()  # the queue has started this bucket: the engine holds it from here
    comm = state.comm()
    buf = bucket.buffer()
    p = comm.size
    last = bucket.is_last()

    def report(groups: list[StepStats], dense_bytes: int = 0) -> None:
        state.reports.add(
            it,
            groups,
            raw_bytes=buf.nbytes,
            held_s=time.perf_counter() - t_start,
            dense_bytes=dense_bytes,
            dense_wire_bytes=ring_bytes(dense_bytes, p),
            last=last,
        )

    what = f"DDP hook, bucket {bucket.index()} at iteration {it}"
    router = state.router
    rung: Codec | None = None
    ckey: str | None = None
    if router.adaptive and it >= state.start_iter:
        # The controller decides per bucket (its compressible tensors predicted as one), from the
        # figures the bucket's earlier exchanges measured; its figures allreduce is an exchange of
        # its own, so every rank takes the same rung at the same step.
        names = [state._name(q) for q in bucket.parameters()]
        ckey = f"bucket:{names[0]}..{names[-1]}"
        shapes = [tuple(g.shape) for g in bucket.gradients() if g.numel() >= state.min_numel]
        numel = sum(math.prod(s) for s in shapes)
        rung, _ = yield from router.decide(comm, ckey, (max(numel, 1),), shapes)
    t_decided = time.perf_counter()  # what the rung costs, for the controller: from here to the end
    # The bucket's plan (which tensors go dense, which codec and mode each group takes) is decided
    # locally, then agreed in the bucket's exchange: its fingerprint travels in full the first time
    # and as a digest in the first message of every later step (see gcodec.transports.control).
    try:
        plan = _plan(state, bucket, it, p, rung)
    except Exception as e:  # take part, so that the peers raise too instead of waiting
        yield from failed_exchange(comm, e, what)
    ex = Exchange(comm, plan.fingerprint, state._agreed, f"bucket{bucket.index()}", what, plan.on_agree, plan.text)
    if not plan.groups:
        # Warm-up, or everything dense this step (a policy's choice): plain average of the whole
        # bucket, in its own dtype, as torch's allreduce hook (and DDP itself) averages: each rank
        # divides its own gradients by p, then they are summed. The division runs while the
        # BEGIN's round trip is in flight; the sum still waits for the agreement.
        try:  # a residual a parameter kept from a codec it has left goes with it
            for i, r in zip(plan.dense, plan.carried or ()):
                if r is not None:
                    xp.add(xp.flat(as_array(plan.items[i].tensor)), r)
        except Exception as e:  # take part, so that the peers raise too
            yield from ex.begin(e)
            raise
        ex.start()
        buf.div_(p)
        st = StepStats(ckey or f"bucket{bucket.index()}:dense", it, DENSE, buf.nbytes)
        yield from dense(ex, st, buf.nbytes, lambda: comm.allreduce_tensor(buf))
        if ckey is not None:
            router.record_step(ckey, None, DENSE, [st], held_s=time.perf_counter() - t_decided)
        report([st])
        return buf
    # Hand over to the queue's thread before the encodes: when the queue started this bucket on
    # DDP's thread (comm_hook), the rest runs on the queue's and overlaps DDP's backward pass. The
    # iteration's last bucket has no backward pass left to overlap (DDP's thread only waits for
    # the futures after it): its encodes run on here up to the first collective, which spares
    # the queue's thread a wake-up before it (a tenth of a small one-bucket fp16 step on 2 gloo ranks).
    if not last:
        yield DoneWork(None)
    grads = [item.tensor for item in plan.items]
    # Everything local that the groups need (the dense riders, each group's input) is made before
    # the bucket's first collective: a failure there, of any kind, goes out in that first control
    # message (the exchange's BEGIN), so that every rank raises instead of the peers waiting.
    try:
        # the dense tensors ride in float32 with the bucket's first group (no round of their own: in or
        # beside the first data collective of every protocol; a bucket with no compressed group goes
        # dense as a whole, above), with the residual a parameter kept from a codec it has left
        dense_in = [as_array(grads[i]) for i in plan.dense]
        flat = joined(dense_in, np.float32, plan.carried) if dense_in else None
        dense_bytes = 0 if flat is None else flat.nbytes
        for g in plan.groups:
            _prepare(state, buf, plan, g, it)
    except Exception as e:
        yield from ex.begin(e)  # raises e here, and the agreed error on the peers
        raise
    yield from run(ex, plan, "mean", flat)  # the dense tensors ride with the first group
    for g in plan.groups:
        if g.scatter:
            scatter([as_array(grads[i]) for i in g.idx], xp.flat(g.out))
    if flat is not None:  # the dense tensors' mean, from their sum
        xp.scale(flat, flat, 1.0 / p)
        scatter(dense_in, flat)
    _warn_no_gain(state, plan, grads)
    if ckey is not None and rung is not None:
        _record_rung(router, ckey, rung, plan, time.perf_counter() - t_decided)
    report([g.stats for g in plan.groups if g.stats is not None], dense_bytes)
    return buf


#: The layout of HookState.state_dict: 2 added the rank, world size and configuration it belongs to.
_STATE_VERSION = 2


def _warn_no_gain(state: HookState, plan: Plan, grads: list[torch.Tensor]) -> None:
    """Warn once per codec whose payload is no smaller than the gradients it was given (fp16 or
    bf16 on float16/bfloat16 gradients): compression that saves nothing costs an encode and a
    decode per step, and the user would rather know."""
    for g in plan.groups:
        st = g.stats
        if st is None or g.mode == "lowrank":
            continue
        cfg = g.state.codec.config_key
        raw = sum(grads[i].numel() * grads[i].element_size() for i in g.idx)
        if cfg in state._warned or st.values.get("payload_bytes", 0) < raw:
            continue
        state._warned.add(cfg)
        dt = str(grads[g.idx[0]].dtype).replace("torch.", "")
        warnings.warn(
            f"gcodec: {g.state.codec.codec_id} sends {int(st.values['payload_bytes'])} bytes for {raw} bytes of "
            f"{dt} gradients ({g.key}): it does not shrink them. Use a codec with fewer bits than the "
            "gradients (uniform 8 or 4 bits, top-k, PowerSGD), or leave these tensors dense.",
            RuntimeWarning,
            stacklevel=2,
        )


def _configured_codecs(codec: Codec, warmup_codec: Codec | None, policy: Any, controller: Any) -> list[Any]:
    """Every codec configuration a hook state may run: its codec, its warm-up codec, and what its
    policy names (a Policy's codecs, a pattern dict's values, a controller's ladder); a callable
    policy names nothing ahead of time."""
    out: list[Any] = [codec]
    if warmup_codec is not None:
        out.append(warmup_codec)
    if isinstance(policy, CodecPolicy):
        out += policy.codecs()
    elif isinstance(policy, Mapping):
        out += [v for v in policy.values() if v is not None]
    out += [c for c in getattr(controller, "ladder", None) or [] if c is not None]
    return out


def _prepare(state: HookState, buf: torch.Tensor, plan: Plan, g: Group, it: int) -> None:
    """Group ``g``'s input (with a residual it must send now), its output and its statistics."""
    ts, idx = g.state, g.idx
    grads = [item.tensor for item in plan.items]
    if g.mode == "lowrank":
        g.items = [LowRankItem(plan.items[i].name, a, a) for i in idx for a in (as_array(grads[i]),)]
        if g.flush is not None:
            for item, owed in zip(g.items, g.flush):
                if owed is not None:
                    xp.add(xp.flat(item.x), owed)
        for item in g.items:
            sample_quality(ts, item.key, it, item.x)
        g.stats = StepStats(g.key, it, g.mode, sum(i.x.nbytes for i in g.items))
        return
    span = _span(buf, grads, idx)
    # the group lies back to back in the bucket: work on it in place; else on a joined copy
    x = span if span is not None else xp.concat([xp.flat(as_array(grads[i])) for i in idx], as_array(grads[idx[0]]))
    if g.flush is not None and g.flush[0] is not None:  # no feedback in this codec: send it now
        xp.add(x, g.flush[0])
    g.begin(x)
    out = x if span is not None else xp.empty(x, x.shape[0], x.dtype)
    g.scatter = span is None
    # a codec that reads shapes has a group of one tensor, sent in that tensor's shape
    shape = tuple(grads[idx[0]].shape) if ts.codec.reads_shape else (-1,)
    g.x, g.out = x.reshape(shape), out.reshape(shape)


def _record_rung(router: Router, ckey: str, rung: Codec, plan: Plan, held_s: float) -> None:
    """What the bucket's compressed groups measured this step, as the controller reads a key's
    record (its rung's seconds and bytes, the seconds the bucket was held for them, and the
    telemetry when it sampled a group)."""
    quality = None
    for g in plan.groups:  # the last group sampled at this step
        quality = g.quality() or quality
    parts = [g.stats for g in plan.groups if g.stats is not None]
    router.record_step(ckey, rung, plan.groups[0].mode, parts, quality, held_s)


def _plan(state: HookState, bucket: dist.GradBucket, it: int, p: int, rung: Codec | None = None) -> Plan:
    """The bucket's plan (:func:`gcodec.transports.plan.plan`): its gradients as items, the
    policy's codec for each (or the controller's rung, or a compressed warm-up's codec, under the
    size rules); in a dense warm-up, no items, only what the warm-up agrees on."""
    buf = bucket.buffer()
    router = state.router
    # Name parameters on every call, warm-up included: without a module, names follow the order in
    # which DDP first hands parameters over, which is the same in every fresh DDP (before rebuild).
    state._check_owner()  # a state loaded before the process group was up: whose it is
    names = [state._name(q) for q in bucket.parameters()]
    common = {"bucket": bucket.index(), "numel": int(buf.numel()), "dtype": str(buf.dtype), "size": p}
    if it < state.start_iter and state.warmup_codec is None:
        return Plan([], fingerprint=fingerprint(phase="warm-up", **common))
    if it < state.start_iter:
        rung = state.warmup_codec
    grads = bucket.gradients()
    device = str(buf.device)
    items = [Item(n, tuple(g.shape), str(g.dtype), device, tensor=g) for n, g in zip(names, grads)]
    return make_plan(
        router,
        items,
        policy_chooser(router, it, rung),
        size=p,
        mode=state.mode,
        exact_groups=True,
        like=lambda i: as_array(grads[i]),
        agree={"ef": state.error_feedback, "phase": "compressed", **common},
        # the dense tensors ride with the first group (see _bucket_protocol)
        derived=lambda pl: {"carrier": pl.groups[0].key if pl.dense and pl.groups else None},
    )


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
    return xp.flat(as_array(buf))[start // isz : pos // isz]


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: compressed average of one gradient bucket (see :class:`HookState`).

    Returns a future that completes with the bucket's buffer, holding the averaged gradients.
    """
    if not isinstance(state, HookState):
        raise ConfigError(f"comm_hook needs a gcodec.torch.HookState, not {type(state).__name__}")
    if not state._reached:
        _first_bucket(state)
    it = state.iter
    last = bucket.is_last()
    if last:
        state.iter += 1
    # Started here while the queue is idle: a dense bucket's BEGIN goes out before DDP's thread
    # returns, as torch's allreduce hook starts its allreduce (FutureQueue.submit). The
    # iteration's last bucket has no backward pass left to overlap: when the queue is idle it runs
    # to its end here, without handing over to the queue's thread and back.
    return queue_for(state.process_group).submit(
        _reported(state, _bucket_protocol(state, bucket, it)),
        bucket.buffer().device,
        start_here=True,
        finish_here=last,
    )


def _reported(state: HookState, proto: Any) -> Any:
    """``proto``, whose error (if any) the state keeps as ``last_error`` and whose message is
    prefixed with the error's class: DDP hands a hook's error to the caller of ``backward()`` as a
    ``RuntimeError`` holding only its message ("Unable to cast <message> to Tensor"), so the
    class, which says which rule failed, would otherwise be lost."""
    try:
        return (yield from proto)
    except BaseException as e:
        state.last_error = e
        _prefix_class(e)
        raise


def _prefix_class(e: BaseException) -> None:
    """Put ``e``'s class in front of its message (once): ``gcodec.PayloadValueError: ...``."""
    name = f"gcodec.{type(e).__name__}" if isinstance(e, GcodecError) else type(e).__name__
    if len(e.args) == 1 and isinstance(e.args[0], str) and not e.args[0].startswith(name + ": "):
        e.args = (f"{name}: {e.args[0]}",)


# DDP checks the hook's annotations against the real classes; postponed (string) annotations fail.
comm_hook.__annotations__ = {
    "state": HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
