"""DiLoCo and Streaming DiLoCo on torch.distributed, with compressed outer gradients.

Every replica trains on its own for ``sync_every`` inner steps; then the replicas average the
pseudo-gradient ``theta_global - theta_local`` through gcodec's compressed all-reduce (any codec,
any policy, error feedback keyed by parameter name, the transports' summable, gather and
two-phase modes) and every replica applies the same average to the same global parameters with
the outer optimizer. The schedule and the streaming variant are :mod:`gcodec.lowcomm`'s.

Replicas hold bit-identical global parameters after every outer step: they start from rank 0's
parameters, every rank decodes the same average (gcodec's protocols give every rank the same
bits), and the outer optimizer is deterministic. A rank whose configuration or step differs makes
every rank raise at that synchronisation (:class:`gcodec.ConfigError`), never a hang.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..arrays import tensors_from_arrays
from ..codecs import get_codec
from ..errors import ConfigError, GcodecError
from ..lowcomm import Schedule, assign_fragments
from ..policy import DEFAULTS
from ..transports import Router
from ..transports.comm import Communicator, Protocol
from ..transports.control import Exchange, control_bytes, failed_exchange
from ..transports.handshake import fingerprint
from .comm import FutureWork, comm_for, own_group, queue_for, synchronize
from .convert import arrays_from_tensors, as_array
from .engine import check_owner, config_diff, rank_and_world

__all__ = ["DiLoCo"]

#: 2: the state records its rank and world size and holds the local parameters.
_STATE_VERSION = 2


def _agree_step(comm: Communicator, fp: dict[str, Any], agreed: dict[str, str], step: int, fragment: int) -> Protocol:
    """One control message before a fragment's exchange: every rank's configuration (a full
    fingerprint exchange the first time and whenever it changes) and its inner step and fragment,
    so that replicas that drifted apart all raise here instead of summing different rounds."""
    ex = Exchange(comm, fp, agreed, "diloco", "DiLoCo synchronisation")
    # one word (a control message holds as many words as ranks): the step; with the agreed schedule
    # it fixes the fragment too
    table = yield from ex.sizes([step])
    if bool((table != table[0]).any()):
        got = "; ".join(f"rank {r}: step {int(t[0])} (fragment {fragment} here)" for r, t in enumerate(table))
        raise ConfigError(f"DiLoCo replicas are at different synchronisations ({got})")


class _Pending:
    """One fragment's exchange in flight: its work and its parameters' average buffers."""

    def __init__(self, sent: int, check: Any, deltas: dict[str, torch.Tensor], work: Any) -> None:
        self.sent = sent
        self.check = check
        self.deltas = deltas
        self.work = work
        self.done = False

    def wait(self) -> dict[str, torch.Tensor]:
        if not self.done:
            error: GcodecError | None = None
            try:
                self.check.wait()
            finally:  # the fragment's exchange is queued behind the check: drain it too
                self.done = True
                try:
                    self.work.wait()
                except GcodecError as e:  # raised below unless the check's own error is on its way
                    error = e
            if error is not None:
                raise error
        return self.deltas


class DiLoCo:
    """DiLoCo over torch.distributed (module docstring; docs/lowcomm.md).

    Args:
        model: the replica's model; its parameters that require gradients are synchronised.
        inner_optimizer: the replica's own optimizer (AdamW in the papers). Its ``step`` counts the
            inner steps: DiLoCo registers a post-step hook on it (``hook=False``: call
            :meth:`step` after each inner step yourself).
        outer_optimizer: an optimizer over ``model.parameters()`` applied to the averaged
            pseudo-gradient; default SGD with Nesterov momentum 0.9 and lr 0.7 (the paper's).
        sync_every: ``H``, inner steps between two synchronisations of a fragment.
        codec: the codec of the pseudo-gradients (a codec, its id or config; None: uncompressed
            sums in the parameters' dtype).
        policy: instead, a :class:`gcodec.policy.Policy`, a callable or a ``{pattern: codec}``
            dict choosing per parameter (``codec`` is then the default of the shorthand).
        error_feedback: keep what the codec dropped and send it at the next synchronisation.
        ef_decay: multiply the residual by this before it is added (``gcodec.ErrorFeedback(decay=)``;
            SparseLoCo uses 0.95 with chunked top-k and no outer momentum).
        min_numel: parameters with fewer elements go uncompressed (norm gains, biases); 1-D
            parameters go uncompressed too unless ``policy`` names a codec for them
            (:data:`gcodec.policy.DEFAULTS`, as in every engine).
        mode: the transports' mode (``"auto"``, ``"summable"``, ``"gather"``, ``"two_phase"``).
        fragments, delay, mix: Streaming DiLoCo (:class:`gcodec.lowcomm.Schedule`): ``fragments``
            parts synced at staggered steps, each exchange overlapping ``delay`` inner steps, the
            global values mixed in with weight ``1 - mix``.
        group: the process group (None: the default group).
        hook: count inner steps through a post-step hook on ``inner_optimizer``.

    The global parameters are kept in float32 on the parameters' device (float64 ones in
    float64). ``state_dict``/``load_state_dict`` checkpoint the global copy, the outer optimizer,
    the residuals, the step and any average not yet applied: tensors, numbers and strings only
    (``torch.load(weights_only=True)``), and a resumed run continues bit for bit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        outer_optimizer: torch.optim.Optimizer | None = None,
        *,
        sync_every: int = 100,
        codec: Any = None,
        policy: Any = None,
        error_feedback: bool = True,
        ef_decay: float = 1.0,
        min_numel: int = DEFAULTS.min_numel,
        mode: str = "auto",
        fragments: int = 1,
        delay: int = 0,
        mix: float = 0.0,
        group: Any = None,
        hook: bool = True,
    ) -> None:
        self.schedule = Schedule(sync_every, fragments, delay, mix)
        self.model = model
        self.group = group
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ConfigError("DiLoCo: the model has no parameters that require gradients")
        for n, p in named:
            if p.dtype not in (torch.float32, torch.float64):
                raise ConfigError(f"DiLoCo keeps float32/float64 parameters; {n!r} is {p.dtype}")
        self.names = [n for n, _ in named]
        self._params = dict(named)
        frag = assign_fragments([p.numel() for _, p in named], fragments)
        #: Parameter names of each fragment, in model order.
        self.fragments: list[list[str]] = [[] for _ in range(fragments)]
        for n, f in zip(self.names, frag, strict=True):
            self.fragments[f].append(n)
        self.outer_optimizer = outer_optimizer or torch.optim.SGD(
            [p for _, p in named], lr=0.7, momentum=0.9, nesterov=True
        )
        self.router = Router(
            policy,
            codec=codec,
            min_numel=min_numel,
            dense_1d=DEFAULTS.dense_1d,
            error_feedback=error_feedback,
            mode=mode,
            decay=ef_decay,
        )
        self._config = fingerprint(
            key="diloco",
            schedule=self.schedule.as_dict(),
            params=[[n, list(p.shape), str(p.dtype)] for n, p in named],
            codec=None if codec is None else get_codec(codec).get_config(),
            policy=_describe(policy),
            error_feedback=bool(error_feedback),
            ef_decay=float(ef_decay),
            min_numel=int(min_numel),
            mode=mode,
            outer=[type(self.outer_optimizer).__name__, _hyper(self.outer_optimizer)],
        )
        self._agreed: dict[str, str] = {}
        self.inner_step = 0
        self._pending: dict[int, _Pending] = {}
        self._ready: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}  # restored averages
        #: (inner step, fragment, "send" or "apply") of every synchronisation event, in order.
        self.log: list[tuple[int, int, str]] = []
        self._bytes = 0
        self._control = 0  # control messages' bytes (agreement, sizes, fingerprints)
        self._control_mark = 0
        self._payload = 0
        self._raw = 0
        self._wait_s = 0.0
        synchronize(group)  # nothing of gcodec's may be in flight on the group during the broadcast
        # Agree on the parameters first: a broadcast of tensors whose shapes differ between ranks
        # aborts gloo (or copies a transposed one silently when only the element counts agree).
        _agree_parameters(named, group)
        with torch.no_grad():
            for _, p in named:
                dist.broadcast(p.data, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        self._global = {n: p.detach().clone() for n, p in named}
        self._hook = inner_optimizer.register_step_post_hook(lambda *_: self.step()) if hook else None

    # ---- the loop --------------------------------------------------------------------------
    def step(self) -> None:
        """Count one inner step; send the fragments that are due, apply those whose exchange is
        ``delay`` steps old."""
        self.inner_step += 1
        t = self.inner_step
        for f in self.schedule.sends(t):
            self._send(f, t)
        for f in self.schedule.applies(t):
            self._apply(f)

    def _send(self, f: int, t: int) -> None:
        comm = comm_for(self.group)
        queue = queue_for(self.group)
        if not self._pending:  # control bytes are counted from here to the last pending exchange's end
            self._control_mark = control_bytes(comm)
        check = queue.submit(_agree_step(comm, self._config, self._agreed, t, f))
        deltas = {}
        with torch.no_grad():
            for name in self.fragments[f]:
                delta = self._global[name] - self._params[name].detach()
                deltas[name] = delta
                self._raw += delta.numel() * delta.element_size()
        try:
            items = [(name, as_array(d), as_array(d)) for name, d in deltas.items()]
        except Exception as e:  # take part, so that the peers raise too instead of waiting
            queue.run(failed_exchange(comm, e, f"DiLoCo exchange of fragment {f}"))
            raise
        # one protocol for the fragment: the router joins the keys that go dense into one exchange
        device = next(iter(deltas.values())).device if deltas else None
        fut = queue.submit(self.router.protocol_many(comm, items, "mean"), device)
        self._pending[f] = _Pending(t, check, deltas, FutureWork(fut))
        self.log.append((t, f, "send"))

    def _average(self, f: int) -> dict[str, torch.Tensor]:
        if f in self._ready:
            return self._ready.pop(f)[1]
        t0 = time.perf_counter()
        avg = self._pending.pop(f).wait()
        self._wait_s += time.perf_counter() - t0
        if not self._pending:  # every exchange sent since the mark has ended: its control messages too
            now = control_bytes(comm_for(self.group))
            self._control += now - self._control_mark
            self._control_mark = now
        for name in self.fragments[f]:
            rec = self.router.last(name)
            if rec is not None:
                self._bytes += int(rec.get("wire_bytes", 0))
                self._payload += int(rec.get("payload_bytes", 0))
        return avg

    def _apply(self, f: int) -> None:
        avg = self._average(f)
        names = self.fragments[f]
        mix = float(self.schedule.mix)
        grads = {n: p.grad for n, p in self._params.items()}
        local = {}
        try:
            with torch.no_grad():
                for p in self._params.values():
                    p.grad = None
                for n in names:
                    p = self._params[n]
                    if mix:
                        local[n] = p.detach().clone()
                    p.copy_(self._global[n])
                    p.grad = avg[n].to(p.dtype)
            self.outer_optimizer.step()
            with torch.no_grad():
                for n in names:
                    p = self._params[n]
                    self._global[n].copy_(p)
                    if mix:  # Streaming DiLoCo's merge: mix * local + (1 - mix) * global
                        p.copy_(torch.lerp(self._global[n], local[n], mix))
        finally:
            for n, p in self._params.items():
                p.grad = grads[n]
        self.log.append((self.inner_step, f, "apply"))

    def sync(self) -> None:
        """Wait for every exchange in flight (their averages stay pending until their step)."""
        for f in sorted(self._pending):
            sent = self._pending[f].sent
            self._ready[f] = (sent, self._average(f))

    # ---- what it holds ---------------------------------------------------------------------
    def global_parameters(self) -> dict[str, torch.Tensor]:
        """The global parameters as of the last outer step (the same bits on every replica)."""
        return dict(self._global)

    def stats(self) -> dict[str, Any]:
        """Inner steps, outer steps, this rank's encoded pseudo-gradient bytes (``payload_bytes``:
        what it contributes to each exchange), the bytes it put on the wire for its exchanges
        (``wire_bytes``: the data as the transports count them, ``data_wire_bytes``, plus the
        control messages, ``control_bytes``: the agreement on the configuration and the step, the
        size exchanges, and the full fingerprint at the first synchronisation), against the raw
        pseudo-gradient bytes, and seconds spent waiting for exchanges (what the overlap did not
        hide). Control bytes are counted on the group's communicator between a synchronisation's
        first send and its last exchange's end: another engine exchanging on the same group
        meanwhile would be counted here too."""
        outer = sum(1 for _, _, kind in self.log if kind == "apply")
        wire = self._bytes + self._control
        return {
            "inner_steps": self.inner_step,
            "outer_steps": outer,
            "payload_bytes": self._payload,
            "wire_bytes": wire,
            "data_wire_bytes": self._bytes,
            "control_bytes": self._control,
            "raw_bytes": self._raw,
            "wire_bytes_per_inner_step": wire / max(1, self.inner_step),
            "wait_s": self._wait_s,
        }

    def close(self) -> None:
        """Remove the inner optimizer's hook and wait for exchanges in flight."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.sync()

    def __enter__(self) -> DiLoCo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the model and the inner optimizer (class
        docstring). Waits for the exchanges in flight; their averages are saved, not re-sent."""
        self.sync()
        return {
            "version": _STATE_VERSION,
            "config": json.dumps(self._config, sort_keys=True),
            "rank": dist.get_rank(self.group),
            "world_size": dist.get_world_size(self.group),
            "inner_step": self.inner_step,
            "global": {n: t.detach().cpu().clone() for n, t in self._global.items()},
            # this replica's own parameters between synchronisations: restored by load_state_dict
            # whatever was loaded into the model before (the constructor's broadcast of rank 0's
            # parameters would otherwise overwrite a model restored before DiLoCo was built)
            "local": {n: p.detach().cpu().clone() for n, p in self._params.items()},
            "outer_optimizer": self.outer_optimizer.state_dict(),
            "router": tensors_from_arrays(self.router.state_dict()),
            "ready": {
                str(f): {"sent": sent, "average": {n: t.detach().cpu().clone() for n, t in avg.items()}}
                for f, (sent, avg) in self._ready.items()
            },
            "counters": {
                "wire_bytes": self._bytes,
                "control_bytes": self._control,
                "payload_bytes": self._payload,
                "raw_bytes": self._raw,
            },
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output, this replica's local parameters included (so it
        does not matter whether the model was loaded before or after DiLoCo was built). Refused
        (:class:`gcodec.ConfigError`) when saved with another configuration (naming the fields
        that differ), by another rank (the single-file habit of loading rank 0's checkpoint on
        every rank gives every replica rank 0's local parameters: another run) or by a job of
        another world size. A version-1 state (before local parameters were saved) loads, and
        then keeps the model's parameters as they are."""
        version = sd.get("version")
        if version not in (1, _STATE_VERSION):
            raise ConfigError(f"DiLoCo state version {version!r}, this gcodec reads 1 to {_STATE_VERSION}")
        mine = json.dumps(self._config, sort_keys=True)
        if sd["config"] != mine:
            diff = config_diff(json.loads(sd["config"]), json.loads(mine)) or "the same fields, another order"
            raise ConfigError(f"DiLoCo state was saved with another configuration ({diff})")
        if version == _STATE_VERSION:
            hint = "every replica loads its own local parameters and residuals (docs/lowcomm.md, 'Checkpoints')"
            check_owner("DiLoCo state", (sd["rank"], sd["world_size"]), rank_and_world(self.group), hint)
        self.sync()
        self._pending.clear()
        with torch.no_grad():
            for n, t in sd["global"].items():
                self._global[n].copy_(t)
            for n, t in sd.get("local", {}).items():
                self._params[n].copy_(t)
        self.outer_optimizer.load_state_dict(sd["outer_optimizer"])
        self.router.load_state_dict(arrays_from_tensors(sd["router"]))
        self._agreed.clear()  # agree again after a restore: the peers may have changed
        dev = {n: p.device for n, p in self._params.items()}
        self._ready = {
            int(f): (int(v["sent"]), {n: t.to(dev[n]) for n, t in v["average"].items()}) for f, v in sd["ready"].items()
        }
        self.inner_step = int(sd["inner_step"])
        self._bytes = int(sd["counters"]["wire_bytes"])
        self._control = int(sd["counters"].get("control_bytes", 0))
        self._raw = int(sd["counters"]["raw_bytes"])
        self._payload = int(sd["counters"]["payload_bytes"])


def _agree_parameters(named: Sequence[tuple[str, torch.Tensor]], group: Any) -> None:
    """Every replica's parameter list (names, shapes, dtypes), compared on every rank before any
    tensor moves: the first one that differs raises the same ConfigError on every rank, naming the
    parameter, and what each rank holds."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
    world = dist.get_world_size(group)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine, group=own_group(group))  # gcodec's own group: nobody else's collectives
    if all(e == everyone[0] for e in everyone):
        return
    if len({len(e) for e in everyone}) > 1:
        counts = ", ".join(f"rank {r}: {len(e)}" for r, e in enumerate(everyone))
        first = next(
            i for i in range(max(len(e) for e in everyone)) if len({e[i] if i < len(e) else None for e in everyone}) > 1
        )
    else:
        counts = ""
        first = next(i for i in range(len(mine)) if len({e[i] for e in everyone}) > 1)
    held = "; ".join(
        f"rank {r}: " + (f"{e[first][0]!r} {list(e[first][1])} {e[first][2]}" if first < len(e) else "nothing")
        for r, e in enumerate(everyone)
    )
    raise ConfigError(
        "DiLoCo replicas differ in their parameters"
        + (f" (parameter counts: {counts})" if counts else "")
        + f": the first that differs is #{first}: {held}"
    )


def _hyper(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The outer optimizer's hyperparameters, as the configuration every replica must share."""
    out: dict[str, Any] = {}
    for i, g in enumerate(opt.param_groups):
        for k, v in g.items():
            if k != "params" and isinstance(v, (bool, int, float, str, type(None))):
                out[f"{i}.{k}"] = v
        out[f"{i}.params"] = len(g["params"])
    return out


def _describe(policy: Any) -> Any:
    """A policy as the replicas compare it: a Policy's rules, a dict's patterns; a callable by its
    name (its decisions are compared at each exchange by the transports' handshake)."""
    if policy is None:
        return None
    to_dict = getattr(policy, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(policy, Mapping):
        return {str(k): (None if v is None else get_codec(v).get_config()) for k, v in policy.items()}
    return getattr(policy, "__qualname__", type(policy).__name__)
