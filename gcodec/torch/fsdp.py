"""FSDP2: a compressed reduce-scatter with error feedback, plugged into ``fully_shard``.

>>> state = gcodec.torch.compress_fsdp(model, codec="uniform")   # doctest: +SKIP

torch's FSDP2 reduces gradients with one reduce-scatter per FSDP module (parameter group) and step,
and accepts a custom one (``FSDPModule.set_custom_reduce_scatter``). :class:`ReduceScatter` is that
custom reduce-scatter for any gcodec codec: FSDP hands it ``input`` of ``p * S`` elements whose row
j holds chunk j of every parameter (dim-0 sharding, padded), and ``output`` of S elements, this
rank's shard. Columns are sorted by the policy into a dense group and one group per codec;
:func:`gcodec.transports.reduce_scatter.reduce_scatter_protocol` encodes each row's group for its
owner (own worker residual per destination), moves the payloads in one all-to-all (sizes first) and
the owner decodes and sums them with ``accumulate=True``.

FSDP applies its own pre/post divide factors to the input and output; the comm honours ``op``
(``SUM``, ``AVG``, ``PREMUL_SUM(f)``) and works in whatever ``reduce_dtype`` FSDP gives it
(float32, bfloat16, float16; sums run in float32 and round once).

Residuals are checkpointed per parameter FQN and element range (``"fc1.weight[0:2048]"``) of the
flattened, unpadded parameter, so they survive a change of world size: see
:func:`reshard_state_dicts`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import xp
from ..codecs import Codec, get_codec
from ..deprecation import renamed_names
from ..errors import ConfigError
from ..policy import DEFAULTS
from ..policy import Policy as CodecPolicy
from ..transports.control import Exchange, failed_exchange
from ..transports.gather import allgather_protocol
from ..transports.handshake import Agreement, fingerprint
from ..transports.plan import Choice, Item, Piece, Plan, policy_chooser
from ..transports.plan import plan as make_plan
from ..transports.reduce_scatter import RSGroup, reduce_scatter_protocol
from ..transports.router import parse_range
from ..transports.stats import Stats, StepStats, scatter_bytes
from .comm import FutureWork, TorchCommunicator, comm_for, queue_for
from .convert import as_array
from .engine import EngineState, check_owner, rank_and_world
from .hook import TensorChooser

__all__ = ["FSDPState", "QuantizedAllGather", "ReduceScatter", "compress_fsdp", "reshard_state_dicts"]

try:  # torch 2.13: the interfaces FSDP2 checks custom comms against
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AGBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _RSBase
except ImportError:  # pragma: no cover - older torch: duck typing is enough
    _RSBase = object  # type: ignore[assignment,misc]
    _AGBase = object  # type: ignore[assignment,misc]

__getattr__ = renamed_names("gcodec.torch.fsdp", {"Policy": ("TensorChooser", TensorChooser)})

FORMAT = "gcodec.fsdp/1"
#: Key prefix of :meth:`FSDPState.dcp_state_dict` (``"gcodec.fsdp.rank3/fc1.weight[0:2048]"``).
DCP_PREFIX = "gcodec.fsdp.rank"


def _op_scale(op: Any, p: int) -> tuple[str, float]:
    """(name, factor applied to the sum) of a torch ReduceOp (or "sum"/"avg"/"mean")."""
    if isinstance(op, str):
        if op in ("sum",):
            return "sum", 1.0
        if op in ("avg", "mean"):
            return "avg", 1.0 / p
        raise ConfigError(f"op {op!r} is not 'sum' or 'avg'")
    kind = getattr(op, "op", op)  # a ReduceOp instance or a RedOpType
    R: Any = dist.ReduceOp.RedOpType
    if kind == R.SUM:
        return "sum", 1.0
    if kind == R.AVG:
        return "avg", 1.0 / p
    if kind == R.PREMUL_SUM:
        f = getattr(op, "factor", None)
        if not isinstance(f, (int, float)):
            raise ConfigError("PREMUL_SUM with a tensor factor is not supported by gcodec's reduce-scatter")
        return f"premul_sum({float(f)!r})", float(f)
    raise ConfigError(f"gcodec's reduce-scatter supports SUM, AVG and PREMUL_SUM, not {op}")


class _Layout:
    """Where each parameter's chunk sits in a row of FSDP's reduce-scatter input."""

    def __init__(self, entries: list[tuple[str, tuple[int, ...], int, int]], p: int) -> None:
        #: (fqn, full shape, column offset in the row, chunk length)
        self.entries = entries
        self.p = p
        self.row = sum(e[3] for e in entries)


class FSDPState(EngineState):
    """State of the compressed reduce-scatters of one FSDP2 model (what :func:`compress_fsdp` returns).

    Args:
        codec: codec of compressed gradients (a codec, id or config). Default ``"fp16"``.
        policy: per parameter: a :class:`gcodec.policy.Policy` (it decides alone, by name, shape
            and the module's reduce-scatter count as its step), a callable
            ``policy(fqn, meta_tensor) -> codec or None`` (the tensor has the parameter's full shape
            on the meta device) or ``{fnmatch pattern: codec or None}`` (first match wins; None
            means dense; unmatched parameters use ``codec``).
        controller: an adaptive controller (:class:`gcodec.adaptive.AdaptiveController`: one rung
            per module every few steps) instead of the policy; calibrated at construction. (Given
            as ``policy=``, it is taken as the controller, with a DeprecationWarning.)
        start_iter: reduce-scatters per module left uncompressed first (FSDP's own reduce-scatter);
            default 0, error feedback from the first (gcodec.policy.DEFAULTS).
        min_numel: parameters with fewer elements stay dense.
        error_feedback: keep per-rank worker residuals (per parameter chunk and destination).
        num_threads: kernel threads per rank; None follows the job (docs/transports.md, "Threads").
        all_gather: codec of the parameter all-gathers (:class:`QuantizedAllGather`), e.g.
            ``{"id": "uniform", "bits": 8, "group_size": 128}``; None (default): FSDP's own,
            uncompressed all-gather.

    1-D parameters (biases, norms) stay dense unless a policy names a codec for them explicitly.
    """

    def __init__(
        self,
        codec: Codec | str | dict[str, Any] = DEFAULTS.codec,
        *,
        policy: Any = None,
        start_iter: int = DEFAULTS.start_iter,
        min_numel: int = DEFAULTS.min_numel,
        error_feedback: bool = True,
        num_threads: int | None = None,
        all_gather: Codec | str | dict[str, Any] | None = None,
        controller: Any = None,
    ) -> None:
        self._setup(
            codec,
            policy=policy,
            controller=controller,
            start_iter=start_iter,
            min_numel=min_numel,
            error_feedback=error_feedback,
            num_threads=num_threads,
        )
        self.all_gather = None if all_gather is None else get_codec(all_gather)
        if self.all_gather is not None and self.all_gather.low_rank:
            raise ConfigError(f"{self.all_gather.codec_id} needs whole matrices; FSDP all-gathers flat shards")
        self.ag_iters: dict[str, int] = {}  # module FQN -> compressed all-gathers done
        self._ag = Stats()
        if self.codec.low_rank:
            raise ConfigError(f"{self.codec.codec_id} needs whole matrices; FSDP's reduce-scatter sends row chunks")
        self.iters: dict[str, int] = {}  # module FQN -> reduce-scatters done
        self._dense = Stats()
        self._modules: set[str] = set()  # the ReduceScatters of this state: a step ends when all reported
        self._threads: int | None = num_threads
        self._shapes: dict[str, tuple[int, ...]] = {}

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "all_gather": self.all_gather and self.all_gather.get_config()}

    def codec_for(self, fqn: str, shape: Sequence[int], step: int = 0, rung: Codec | None = None) -> Codec | None:
        """The codec of a parameter at its module's ``step``, or None when it stays dense (policy,
        size, 1-D); under an adaptive controller the module's ``rung`` unless the size rules keep
        the parameter dense."""
        shape = tuple(int(d) for d in shape)
        meta = torch.empty(shape, device="meta") if callable(self.policy) and not self.router.adaptive else None
        codec = policy_chooser(self.router, step, rung)(Item(fqn, shape, "", tensor=meta))
        if codec is not None and codec.low_rank:
            raise ConfigError(f"{fqn}: {codec.codec_id} cannot compress FSDP's row chunks (it needs whole matrices)")
        return codec

    def comm(self, group: Any) -> TorchCommunicator:
        return comm_for(group)

    @property
    def iter(self) -> int:
        return max(self.iters.values(), default=0)

    # ---- statistics --------------------------------------------------------------------------
    def _report(self, step: int, groups: list[StepStats], raw: int, t0: float, **dense: Any) -> None:
        held = time.perf_counter() - t0
        self.reports.add(step, groups, raw_bytes=raw, held_s=held, parts=len(self._modules), **dense)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per key (module and codec): bytes and seconds of the last step and totals, as the DDP
        hook's ``HookState.stats()``; dense traffic under ``"<module>:dense"`` with codec None."""
        out: dict[str, dict[str, Any]] = {k: {**v, "codec": None} for k, v in self._dense.as_dict().items()}
        out.update(super().stats())
        if self.all_gather is not None:
            cfg = self.all_gather.get_config()
            for k, v in self._ag.as_dict().items():
                out[k] = {**v, "codec": cfg if v["mode"] == "all_gather" else None}
        return out

    def reset_stats(self) -> None:
        self._ag.reset()
        self._dense.reset()
        for st in self.router.states.values():
            st.reset_stats()

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's residuals keyed ``"fqn[start:stop]"`` (elements of the flattened parameter
        that this rank last sent to one owner), shapes, step counters, the configuration, and whose
        they are: this rank and the world size (None before the default process group is up).

        Tensors, ints, floats, strings and None only: ``torch.load(weights_only=True)`` reads it.
        """
        residuals = {k: torch.from_numpy(v.astype(np.float32)) for k, v in self.router.ranges().items()}
        rank, world = rank_and_world()
        return {
            "format": FORMAT,
            "rank": rank,
            "world_size": world,
            "codec": self.codec.config_key,
            "error_feedback": self.error_feedback,
            "iters": dict(self.iters),
            "shapes": {k: list(v) for k, v in self._shapes.items()},
            "residuals": residuals,
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (or one of :func:`reshard_state_dicts`' outputs).

        Residuals are placed when each module's next compressed reduce-scatter builds its groups,
        whatever the world size they were saved at (element ranges, not chunks).
        """
        if sd.get("format") != FORMAT:
            raise ConfigError(f"not a gcodec FSDP state dict (format {sd.get('format')!r})")
        if get_codec(json.loads(sd["codec"])) != self.codec:
            raise ConfigError(f"state was saved with codec {sd['codec']}, not {self.codec.get_config()}")
        # At another world size, reshard_state_dicts' outputs name the rank each is for. A state
        # without these fields (saved before them) loads unchecked.
        hint = "each rank loads the state it saved (reshard_state_dicts makes one per rank for another world size)"
        check_owner("FSDP state", (sd.get("rank"), sd.get("world_size")), rank_and_world(), hint)
        self.iters = {str(k): int(v) for k, v in sd["iters"].items()}
        self._shapes = {str(k): tuple(int(d) for d in v) for k, v in sd["shapes"].items()}
        pending = _assemble(sd["residuals"], self._shapes)
        self.router.clear_residuals()
        self.router.hold({f"{fqn}[0:{full.shape[0]}]": full for fqn, full in pending.items()})
        self._agreed.clear()

    # ---- torch.distributed.checkpoint ---------------------------------------------------------
    def dcp_state_dict(self, group: Any = None) -> dict[str, torch.Tensor]:
        """This rank's :meth:`state_dict` for ``torch.distributed.checkpoint``, under keys of its own.

        DCP keeps one copy of a key that every rank saves (it takes equal keys for replicated
        state), but every rank's residuals differ: here each key starts with
        ``"gcodec.fsdp.rank<r>/"`` (the residuals ``".../fqn[a:b]"`` and ``".../meta"``, the rest of
        the state as JSON bytes in a uint8 tensor), so DCP writes them all. Merge it into the dict
        you save, e.g. ``dcp.save({**app_state, **state.dcp_state_dict()}, checkpoint_id=path)``,
        and restore with :meth:`load_dcp`.
        """
        r = dist.get_rank(group)
        sd = self.state_dict()
        meta = {k: sd[k] for k in ("format", "rank", "world_size", "codec", "error_feedback", "iters", "shapes")}
        text = json.dumps(meta, sort_keys=True).encode()
        out: dict[str, torch.Tensor] = {f"{DCP_PREFIX}{r}/meta": torch.frombuffer(bytearray(text), dtype=torch.uint8)}
        for k, v in sd["residuals"].items():
            out[f"{DCP_PREFIX}{r}/{k}"] = v
        return out

    def load_dcp(self, checkpoint_id: Any = None, *, storage_reader: Any = None, group: Any = None) -> None:
        """Restore the state saved with :meth:`dcp_state_dict` in a DCP checkpoint, on this job's
        world size: the same number of ranks gets each rank's own residuals back; another number
        gets :func:`reshard_state_dicts` of all of them. Other keys of the checkpoint are ignored.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        def reader() -> Any:
            return storage_reader if storage_reader is not None else dcp.FileSystemReader(checkpoint_id)

        md = reader().read_metadata().state_dict_metadata
        saved: dict[int, dict[str, Any]] = {}
        for k, v in md.items():
            if k.startswith(DCP_PREFIX) and isinstance(v, TensorStorageMetadata):
                rank_s, key = k[len(DCP_PREFIX) :].split("/", 1)
                saved.setdefault(int(rank_s), {})[key] = (k, v)
        if not saved:
            raise ConfigError(f"no gcodec FSDP state in the checkpoint {checkpoint_id!r}")
        world, me = dist.get_world_size(group), dist.get_rank(group)
        ranks = sorted(saved) if len(saved) != world else [me]  # same world size: only our own
        template = {
            name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
            for r in ranks
            for name, meta in saved[r].values()
        }
        dcp.load(template, storage_reader=reader(), process_group=group)
        sds = []
        for r in ranks:
            sd: dict[str, Any] = {"residuals": {}}
            for key, (name, _) in saved[r].items():
                if key == "meta":
                    sd.update(json.loads(bytes(template[name].numpy()).decode()))
                else:
                    sd["residuals"][key] = template[name]
            sds.append(sd)
        self.load_state_dict(sds[0] if len(saved) == world else reshard_state_dicts(sds, world)[me])


def _chunk(shape: Sequence[int], p: int) -> int:
    """Elements of one owner's chunk of a parameter of ``shape`` sharded on dim 0 over ``p`` ranks
    (FSDP pads dim 0 to a multiple of ``p``)."""
    return -(-(shape[0] if shape else 1) // p) * math.prod(shape[1:])


def _assemble(residuals: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Full flat residual per FQN from ``"fqn[a:b]"`` pieces (zeros where none was saved)."""
    full: dict[str, np.ndarray] = {}
    for k, v in residuals.items():
        fqn, a, b = parse_range(str(k))
        numel = int(np.prod(shapes[fqn])) if fqn in shapes else b
        arr = full.get(fqn)
        if arr is None:
            arr = full[fqn] = np.zeros(numel, np.float32)
        vals = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        if vals.shape != (b - a,) or b > arr.shape[0]:
            raise ConfigError(f"residual {k!r} has shape {vals.shape}; expected ({b - a},) within {arr.shape[0]}")
        arr[a:b] = vals
    return full


def reshard_state_dicts(state_dicts: Sequence[Mapping[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """Re-partition the per-rank states of a job saved on ``len(state_dicts)`` ranks for
    ``world_size`` ranks; returns one state dict per new rank.

    The gradient a job owes its parameters is the *average* of the ranks' residuals (FSDP averages
    gradients), so every new rank starts from that average: the new ranks' average is the old one,
    whatever the two world sizes. Residuals are split into the new owners' element ranges.
    Assumes the same averaging on both sides (the default; a custom ``gradient_divide_factor`` or an
    fp16 ``reduce_dtype``, whose pre-divide factor depends on the world size, are not rescaled).
    """
    if not state_dicts:
        raise ConfigError("no state dicts to reshard")
    first = state_dicts[0]
    for sd in state_dicts:
        if sd.get("format") != FORMAT or sd["codec"] != first["codec"]:
            raise ConfigError("state dicts of different formats or codecs cannot be resharded together")
    shapes: dict[str, tuple[int, ...]] = {}
    for sd in state_dicts:
        shapes.update({str(k): tuple(int(d) for d in v) for k, v in sd["shapes"].items()})
    total: dict[str, np.ndarray] = {}
    for sd in state_dicts:
        for fqn, arr in _assemble(sd["residuals"], shapes).items():
            if fqn in total:
                total[fqn] += arr
            else:
                total[fqn] = arr.copy()
    n_old = len(state_dicts)
    iters: dict[str, int] = {}
    for sd in state_dicts:
        for k, v in sd["iters"].items():
            iters[str(k)] = max(iters.get(str(k), 0), int(v))
    out = []
    for r in range(world_size):
        res: dict[str, torch.Tensor] = {}
        for fqn, arr in total.items():
            mean = arr / np.float32(n_old)
            clen = _chunk(shapes.get(fqn, (arr.shape[0],)), world_size)
            for j in range(world_size):  # every range, as each rank sends a chunk to every owner
                a, b = j * clen, min((j + 1) * clen, arr.shape[0])
                if b > a:
                    res[f"{fqn}[{a}:{b}]"] = torch.from_numpy(mean[a:b].astype(np.float32))
        out.append(
            {
                "format": FORMAT,
                "rank": r,
                "world_size": world_size,
                "codec": first["codec"],
                "error_feedback": first["error_feedback"],
                "iters": dict(iters),
                "shapes": {k: list(v) for k, v in shapes.items()},
                "residuals": res,
            }
        )
    return out


class ReduceScatter(_RSBase):  # type: ignore[misc,valid-type]
    """FSDP2's custom reduce-scatter (``torch.distributed.fsdp._fully_shard._fsdp_api.ReduceScatter``)
    with a gcodec codec. Usually made by :func:`compress_fsdp`, one per FSDP module.

    Args:
        state: the shared :class:`FSDPState` (codec, policy, residuals, statistics); or a codec
            (id, config) for a standalone comm with a state of its own.
        module: the FSDP module whose parameter group this comm reduces (names the parameters;
            without it the row is one tensor named by ``name``).
        name: the module's FQN, the prefix of its statistics keys.
        fqns: ``{id(parameter): fqn}`` naming the module's parameters (default: from ``module``).
    """

    def __init__(
        self,
        state: FSDPState | Codec | str | dict[str, Any] = DEFAULTS.codec,
        module: torch.nn.Module | None = None,
        *,
        name: str = "",
        fqns: Mapping[int, str] | None = None,
    ) -> None:
        if not isinstance(state, FSDPState):  # standalone: every column compressed from the first call
            state = FSDPState(state, policy={"*": state}, start_iter=0, min_numel=0)
        self.state = state
        self.module = module
        self.name = name or "<root>"
        if _owns_parameters(module):  # FSDP calls it every step: a step ends when all such have
            state._modules.add(self.name)
        self.fqns = dict(fqns) if fqns is not None else {}
        if module is not None and fqns is None:
            self.fqns = {id(p): n for n, p in module.named_parameters()}

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    # ---- the layout of FSDP's input ----------------------------------------------------------
    def _layout(self, row: int, p: int) -> _Layout:
        entries: list[tuple[str, tuple[int, ...], int, int]] = []
        fsdp_params = []
        if self.module is not None and hasattr(self.module, "_get_fsdp_state"):
            for pg in self.module._get_fsdp_state()._fsdp_param_groups:  # type: ignore[operator]
                fsdp_params += list(pg.fsdp_params)
        for candidates in (fsdp_params, [fp for fp in fsdp_params if fp.sharded_param.requires_grad]):
            entries, pos = [], 0
            for fp in candidates:
                shape = tuple(int(d) for d in fp._orig_size)
                clen = _chunk(shape, p)
                fqn = self.fqns.get(id(fp.sharded_param)) or getattr(fp, "_param_fqn", None) or f"param{len(entries)}"
                if fp.fsdp_placement.dim != 0:
                    fqn = f"{fqn}#shard{fp.fsdp_placement.dim}"  # not a flat element range: never compressed
                entries.append((fqn, shape, pos, clen))
                pos += clen
            if pos == row:
                return _Layout(entries, p)
        return _Layout([(f"{self.name}.flat{row}", (row * p,), 0, row)], p)  # unknown: one anonymous tensor

    # ---- the call FSDP makes -----------------------------------------------------------------
    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup | None = None,
        op: Any = dist.ReduceOp.AVG,
        async_op: bool = False,
    ) -> Any:
        t0 = time.perf_counter()
        st = self.state
        comm = st.comm(group)
        p = comm.size
        it = st.iters.get(self.name, 0)
        st.iters[self.name] = it + 1
        n = input_tensor.numel()
        if it < st.start_iter:  # warm-up: FSDP's own reduce-scatter, uncompressed
            s = StepStats(f"{self.name}:dense", it, "native", input_tensor.nbytes)
            s.add("payload_bytes", input_tensor.nbytes)
            s.add("wire_bytes", scatter_bytes(input_tensor.nbytes, p))
            with s.timing("comm_s"):
                rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                work = rs(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
            if not async_op:
                st._dense.record(s)
                st._report(it, [s], input_tensor.nbytes, t0)
            return work
        rung: Codec | None = None
        if st.router.adaptive:
            # One rung per module, from what its reduce-scatters measured; the controller's
            # figures allreduce is an exchange of its own, queued in order with the others.
            rung, _ = queue_for(group).run(st.router.decide(comm, self.name, (max(n // p, 1),)))
        try:
            opname, scale = _op_scale(op, p)
            if n % p or output_tensor.numel() != n // p:
                raise ConfigError(f"reduce-scatter of {n} elements into {output_tensor.numel()} on {p} ranks")
            layout = self._layout(n // p, p)
            x = as_array(input_tensor).reshape(p, n // p)  # the tensors' memory, host or device
            out = xp.flat(as_array(output_tensor))
            agree = {"ef": st.error_feedback, "module": self.name, "numel": n, "dtype": str(input_tensor.dtype)}
            plan, groups = self._groups(layout, it, x, rung, {**agree, "op": opname, "size": p})
        except Exception as e:  # take part, so that the peers raise too instead of waiting
            queue_for(group).run(failed_exchange(comm, e, f"compressed reduce-scatter of {self.name!r}"))
            raise
        proto = self._protocol(comm, x, out, groups, scale, plan.fingerprint, rung, (it, t0, input_tensor.nbytes))
        if async_op:
            return FutureWork(queue_for(group).submit(proto, input_tensor.device))
        queue_for(group).run(proto)  # FSDP2 waits for it anyway
        return None

    def _groups(
        self, layout: _Layout, it: int, x: np.ndarray, rung: Codec | None, agree: dict[str, Any]
    ) -> tuple[Plan, list[RSGroup]]:
        """The module's plan (:func:`gcodec.transports.plan.plan`: its parameters as items whose
        pieces are the chunks each destination's row carries, agreed on with ``agree`` and the
        groups' column segments) and the reduce-scatter's groups of columns, the dense one first;
        residuals owed by a parameter that left a codec (or by a codec without feedback) are added
        into the input's columns here."""
        st = self.state
        p = layout.p
        items = []
        for fqn, shape, _, clen in layout.entries:
            numel = math.prod(shape)
            pieces = tuple(Piece(fqn, min(j * clen, numel), min((j + 1) * clen, numel), clen) for j in range(p))
            items.append(Item(fqn, shape, str(x.dtype), pieces=pieces))

        def choose(item: Item) -> Codec | None:
            # a parameter sharded on another dim is no flat element range: never compressed
            return None if "#shard" in item.name else st.codec_for(item.name, item.shape, it, rung)

        settled = policy_chooser(st.router, it, rung).settled

        def segs(idx: list[int]) -> list[tuple[int, int]]:
            out: list[tuple[int, int]] = []
            for i in idx:
                _, _, a, clen = layout.entries[i]
                if out and out[-1][1] == a:
                    out[-1] = (out[-1][0], a + clen)
                else:
                    out.append((a, a + clen))
            return out

        plan = make_plan(
            st.router,
            items,
            Choice(choose, settled),
            size=p,
            collective="reduce_scatter",
            prefix=f"{self.name}:",
            salt=(p,),
            like=lambda i: x,
            agree=agree,
            derived=lambda pl: {"segments": ([segs(pl.dense)] if pl.dense else []) + [segs(g.idx) for g in pl.groups]},
        )

        def add_rows(idx: list[int], vals: list[Any] | None) -> None:
            """Add residuals laid out as the rows of ``idx`` into the input's columns of ``idx``."""
            for j, v in enumerate(vals or ()):
                if v is None:
                    continue
                pos = 0
                for i in idx:
                    _, _, a, clen = layout.entries[i]
                    xp.add(x[j, a : a + clen], v[pos : pos + clen])
                    pos += clen

        groups: list[RSGroup] = []
        if plan.dense:
            add_rows(plan.dense, plan.carried)  # parameters that left a codec send what it still owed
            groups.append(RSGroup(f"{self.name}:dense", segs(plan.dense), None, it))
        for g in plan.groups:
            add_rows(g.idx, g.flush)  # no feedback in this codec: send it now
            for i in g.idx:
                st._shapes[layout.entries[i][0]] = layout.entries[i][1]
            groups.append(RSGroup(g.key, segs(g.idx), g.state, g.state.next_step(g.key)))
        return plan, groups

    def _protocol(
        self,
        comm: TorchCommunicator,
        x: np.ndarray,
        out: np.ndarray,
        groups: list[RSGroup],
        scale: float,
        fp: Any,
        rung: Codec | None = None,
        report: tuple[int, float, int] | None = None,
    ) -> Any:
        st = self.state
        states = st.router.states

        def on_agree(agreement: Agreement) -> None:
            for ts in states.values():
                ts.agreed_on(self.name, agreement.local_ranks)
            if st._threads is None:
                st._threads = next(iter(states.values())).threads if states else None

        what = f"compressed reduce-scatter of {self.name!r}"
        ex = Exchange(comm, fp, st._agreed, self.name, what, on_agree)
        yield from reduce_scatter_protocol(ex, x, out, groups, scale, what, st._threads)
        for g in groups:
            assert g.stats is not None
            (g.state.record if g.state is not None else st._dense.record)(g.stats)
        if st.router.adaptive:  # what the controller reads of this module's step
            parts = [g.stats for g in groups if g.stats is not None and (g.state is not None or rung is None)]
            st.router.record_step(self.name, rung, "reduce_scatter", parts)
        if report is not None:
            it, t0, raw = report
            p = comm.size
            dense = [g for g in groups if g.state is None and g.stats is not None]
            dense_bytes = sum(x.shape[0] * g.numel * x.dtype.itemsize for g in dense)  # the p rows of its columns
            st._report(
                it,
                [g.stats for g in groups if g.state is not None and g.stats is not None],
                raw,
                t0,
                dense_bytes=dense_bytes,
                dense_wire_bytes=scatter_bytes(dense_bytes, p),
                dense_comm_s=sum(g.stats.values["comm_s"] for g in dense if g.stats is not None),
            )
        return None


def _owns_parameters(module: Any) -> bool:
    """Whether FSDP2 reduce-scatters gradients for ``module`` itself (a root whose parameters all
    live in child FSDP modules has none); True when it cannot tell (no module, another torch)."""
    get = getattr(module, "_get_fsdp_state", None)
    if module is None or get is None:
        return True
    try:
        return any(pg.fsdp_params for pg in get()._fsdp_param_groups)
    except AttributeError:
        return True


class QuantizedAllGather(_AGBase):  # type: ignore[misc,valid-type]
    """FSDP2's custom all-gather (``torch.distributed.fsdp._fully_shard._fsdp_api.AllGather``) of
    compressed parameters, ZeRO++ qwZ-style: each rank encodes its flat shard (every parameter of
    the module, concatenated as FSDP lays them out) with ``codec``, the payloads are all-gathered
    and every rank decodes all of them into FSDP's all-gather output. Usually made by
    :func:`compress_fsdp` with ``all_gather=``, one per FSDP module.

    Only the unsharded copy that forward and backward use is compressed: FSDP copies the sharded
    parameters into its all-gather buffer before the call, so the sharded (optimizer) parameters
    stay exact. No error feedback: each all-gather encodes the current weights afresh. Every rank
    decodes the same bytes, its own payload included, so all ranks compute with the same weights.

    Buffers of mixed dtypes (FSDP gathers them as uint8) go through FSDP's own all-gather. CUDA
    tensors run on their device (docs/gpu.md).

    Args:
        state: the shared :class:`FSDPState` (its ``all_gather`` codec, statistics); or a codec for
            a standalone comm.
        name: the module's FQN, the prefix of its statistics key (``"<name>:all_gather"``).
    """

    def __init__(
        self, state: FSDPState | Codec | str | dict[str, Any] = DEFAULTS.all_gather, *, name: str = ""
    ) -> None:
        if not isinstance(state, FSDPState):
            state = FSDPState(all_gather=state)
        if state.all_gather is None:
            raise ConfigError("QuantizedAllGather needs a state with an all_gather codec")
        self.state = state
        self.codec: Codec = state.all_gather
        self.name = name or "<root>"

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup | None = None,
        async_op: bool = False,
    ) -> Any:
        st = self.state
        comm = st.comm(group)
        p = comm.size
        n = input_tensor.numel()
        if output_tensor.numel() != n * p:
            raise ConfigError(f"all-gather of {n} elements into {output_tensor.numel()} on {p} ranks")
        it = st.ag_iters.get(self.name, 0)
        st.ag_iters[self.name] = it + 1
        floats = (torch.float32, torch.bfloat16, torch.float16)
        if input_tensor.dtype not in floats:
            s = StepStats(f"{self.name}:all_gather_dense", it, "native", input_tensor.nbytes)
            s.add("payload_bytes", input_tensor.nbytes)
            s.add("wire_bytes", input_tensor.nbytes * (p - 1))
            with s.timing("comm_s"):
                work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
            st._ag.record(s)
            return work
        s = StepStats(f"{self.name}:all_gather", it, "all_gather", input_tensor.nbytes)
        x = xp.flat(as_array(input_tensor))
        out = as_array(output_tensor).reshape(p, n)
        fp = fingerprint(
            module=self.name, all_gather=self.codec.get_config(), numel=n, dtype=str(input_tensor.dtype), size=p
        )
        what = f"compressed all-gather of {self.name!r}"
        ex = Exchange(comm, fp, st._agreed, f"{self.name}:all_gather", what)
        proto = allgather_protocol(ex, self.codec, x, out, self.name, it, s, st._threads)
        # Always synchronous: FSDP waits only on a c10d Work, and ordering with the reduce-scatters
        # on the same group's queue keeps every rank's collectives in the same order.
        queue_for(group).run(proto)
        st._ag.record(s)
        return None


def compress_fsdp(
    model: torch.nn.Module,
    codec: Codec | str | dict[str, Any] = DEFAULTS.codec,
    *,
    policy: TensorChooser | CodecPolicy | Mapping[str, Any] | None = None,
    error_feedback: bool = True,
    start_iter: int = DEFAULTS.start_iter,
    min_numel: int = DEFAULTS.min_numel,
    num_threads: int | None = None,
    all_gather: Codec | str | dict[str, Any] | None = None,
    state: FSDPState | None = None,
    controller: Any = None,
) -> FSDPState:
    """Set a compressed :class:`ReduceScatter` on every FSDP2 module of ``model`` (call after
    ``fully_shard``); returns the shared :class:`FSDPState` (statistics, checkpoints).

    Parameters are named by their FQN in ``model``; the policy language is the DDP hook's (see
    :class:`FSDPState`). ``all_gather`` (off by default) also sets a :class:`QuantizedAllGather`
    with that codec on every FSDP module, e.g. ``{"id": "uniform", "bits": 8, "group_size": 128}``.
    """
    from torch.distributed.fsdp import FSDPModule

    if state is None:
        state = FSDPState(
            codec,
            policy=policy,
            start_iter=start_iter,
            min_numel=min_numel,
            error_feedback=error_feedback,
            num_threads=num_threads,
            all_gather=all_gather,
            controller=controller,
        )
    fqns = {id(p): n for n, p in model.named_parameters()}
    found = 0
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            m.set_custom_reduce_scatter(ReduceScatter(state, m, name=name or "<root>", fqns=fqns))  # type: ignore[arg-type]
            if state.all_gather is not None:
                m.set_custom_all_gather(QuantizedAllGather(state, name=name or "<root>"))  # type: ignore[arg-type]
            found += 1
    if not found:
        raise ConfigError("compress_fsdp: no FSDP module in the model (call fully_shard first)")
    return state
