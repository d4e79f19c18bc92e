"""One data-parallel rank of the demo: ``python -m gcodec.demo.worker JOB.json``.

Started by :mod:`gcodec.demo.launch` (several processes with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set, for gloo) or under ``mpiexec`` (``"backend": "mpi"`` in the
job). The job file holds the :class:`~gcodec.demo.runs.Settings` and the list of runs; every rank
trains every run in order on its shard of each global batch, and rank 0 writes the results to the
job's ``out`` path and prints one ``@progress`` line per step to standard output.

With gloo, the gradients travel through DDP and :func:`gcodec.torch.comm_hook` (or, for comparison,
torch's own ``fp16_compress_hook`` / ``powerSGD_hook``, or no hook), or through FSDP2's
reduce-scatter (``fully_shard`` per Linear layer; hook ``fsdp``: FSDP2's own, with the run's
``reduce_dtype``; ``fsdp-gcodec``: :func:`gcodec.torch.compress_fsdp` with the run's codec); with
MPI, each gradient goes through :func:`gcodec.mpi.allreduce` after ``backward()`` with the same
rules as the hook (the first ``start_iter`` steps and tensors under ``min_numel`` elements dense).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..codecs import get_codec
from .data import train_test_split
from .runs import Settings

PROGRESS = "@progress "


class MLP(torch.nn.Sequential):
    """64 -> hidden... -> 10 with ReLU, PyTorch's default initialisation (seeded by the caller)."""

    def __init__(self, hidden: list[int], d_in: int = 64, classes: int = 10) -> None:
        layers: list[torch.nn.Module] = []
        width = d_in
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        layers.append(torch.nn.Linear(width, classes))
        super().__init__(*layers)


def _dense(codec: Any, p: torch.Tensor, min_numel: int) -> bool:
    """Whether the hook leaves this parameter's gradient uncompressed (HookState's rule)."""
    if codec is None or p.numel() < min_numel:
        return True
    return not codec.compresses(tuple(p.shape))


def _wire_bytes_dense(run: dict[str, Any], params: Sequence[torch.Tensor], s: Settings) -> int:
    """Bytes per step a rank contributes for what no gcodec statistic counts: its dense tensors,
    or everything under plain DDP and torch's hooks (fp16: 2 bytes each; PowerSGD: P and Q in fp32)."""
    hook = run["hook"]
    if hook in ("none", "torch-allreduce"):
        return sum(4 * p.numel() for p in params)
    if hook == "local":  # nothing leaves the rank
        return 0
    if hook == "fsdp":  # the whole reduce-scatter input, in reduce_dtype
        return sum((2 if run.get("reduce_dtype") == "bf16" else 4) * p.numel() for p in params)
    if hook == "fsdp-gcodec":  # its statistics count the dense groups too
        return 0
    if hook in ("torch-fp16", "torch-bf16"):
        return sum(2 * p.numel() for p in params)
    if hook == "torch-powersgd":
        r = int(run.get("rank", 2))
        total = 0
        for p in params:
            if p.dim() == 2 and (p.shape[0] + p.shape[1]) * r < p.numel():
                total += 4 * (p.shape[0] + p.shape[1]) * r
            else:
                total += 4 * p.numel()
        return total
    if run.get("policy") is not None:  # a pattern policy (all dense in the link benchmark's use)
        return sum(4 * p.numel() for p in params)
    if run.get("adaptive") is not None:  # the hook's step reports count what it sent dense
        return 0
    codec = get_codec(run["codec"])
    return sum(4 * p.numel() for p in params if _dense(codec, p, s.min_numel))


class _Comm:
    """The rank's transport: DDP over gloo, or mpi4py."""

    def __init__(self, backend: str, timeout_s: float) -> None:
        self.backend = backend
        if backend == "mpi":
            from mpi4py import MPI

            self.mpi = MPI
            self.comm = MPI.COMM_WORLD
            self.rank, self.size = self.comm.rank, self.comm.size
        else:
            import torch.distributed as dist

            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
            self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def barrier(self) -> None:
        if self.backend == "mpi":
            self.comm.Barrier()
        else:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.backend != "mpi":
            import torch.distributed as dist

            dist.destroy_process_group()


def _wrap_fsdp(model: torch.nn.Module, run: dict[str, Any], s: Settings, comm: _Comm) -> tuple[Any, Any, Any]:
    """FSDP2 on gloo: every Linear layer its own FSDP module, then the root (FSDP2's defaults, with
    the run's ``reduce_dtype`` and ``reshard_after_forward``); ``fsdp-gcodec`` sets gcodec's
    reduce-scatter on every module."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import gcodec.torch

    if comm.backend == "mpi":
        raise ValueError("FSDP2 runs need the gloo backend")
    dtypes = {None: None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    mp = MixedPrecisionPolicy(reduce_dtype=dtypes[run.get("reduce_dtype")])
    mesh = init_device_mesh("cpu", (comm.size,))
    reshard = bool(run.get("reshard_after_forward", True))  # False: one all-gather a step (ZeRO-2)
    for m in model.children():
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    state = None
    if run["hook"] == "fsdp-gcodec":
        state = gcodec.torch.compress_fsdp(
            model,
            run["codec"],
            start_iter=s.start_iter,
            min_numel=s.min_numel,
            error_feedback=run["error_feedback"],
            all_gather=run.get("all_gather"),  # a codec: gcodec's quantized parameter all-gather
        )
    return model, state, None


def _wrap(model: torch.nn.Module, run: dict[str, Any], s: Settings, comm: _Comm) -> tuple[Any, Any, Any]:
    """(module to call, gcodec state or None, reducer for the MPI path or None)."""
    if run["hook"] in ("fsdp", "fsdp-gcodec"):
        return _wrap_fsdp(model, run, s, comm)
    if comm.backend == "mpi":
        import gcodec.mpi

        codec = None if run["codec"] is None else get_codec(run["codec"])
        state = None if codec is None else gcodec.mpi.State(codec, error_feedback=run["error_feedback"])
        names = dict(model.named_parameters())
        mpi = comm.mpi

        def reduce(step: int) -> None:
            for name, p in names.items():
                assert p.grad is not None
                g = p.grad.numpy()  # a view: results land in the gradient
                if state is None or step < s.start_iter or _dense(codec, p, s.min_numel):
                    comm.comm.Allreduce(mpi.IN_PLACE, g, op=mpi.SUM)
                    g /= comm.size
                else:
                    assert codec is not None
                    gcodec.mpi.allreduce(comm.comm, g, codec, "mean", key=name, out=g, state=state)

        return model, state, reduce

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gcodec.torch

    hook = run["hook"]
    # torch's powerSGD_hook starts collectives from future callbacks; with several buckets on gloo
    # their order can differ between ranks (docs/transports.md, Notes): give it one bucket.
    cap = 1e4 if hook == "torch-powersgd" else s.bucket_cap_mb
    ddp = DDP(model, bucket_cap_mb=cap)
    hook_state: Any = None
    if hook == "gcodec":
        policy, controller = run.get("policy"), None
        if run.get("adaptive") is not None:  # the controller's arguments: it picks each bucket's codec
            from gcodec.adaptive import AdaptiveController

            controller = AdaptiveController(**run["adaptive"])
        hook_state = gcodec.torch.HookState(
            codec=run["codec"],
            start_iter=s.start_iter,
            min_numel=s.min_numel,
            error_feedback=run["error_feedback"],
            policy=policy,
            controller=controller,
            module=model,
            warmup_codec=run.get("warmup_codec"),
        )
        ddp.register_comm_hook(hook_state, gcodec.torch.comm_hook)
    elif hook == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "torch-bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "torch-allreduce":  # what DDP does, as a Python hook: the floor of any hook's step
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "torch-powersgd":
        ps = powerSGD_hook.PowerSGDState(
            None,
            matrix_approximation_rank=int(run.get("rank", 2)),
            start_powerSGD_iter=max(2, s.start_iter),
            min_compression_rate=1,
            random_seed=s.seed,
        )
        ddp.register_comm_hook(ps, powerSGD_hook.powerSGD_hook)
    elif hook == "local":
        ddp.register_comm_hook(None, _local_hook)
    elif hook != "none":
        raise ValueError(f"unknown hook {hook!r}")
    return ddp, hook_state, None


def _local_hook(_state, bucket):  # type: ignore[no-untyped-def]
    """No communication: each rank keeps its own bucket. Its step is the compute (forward, backward,
    optimizer) that every other hook adds its exchange to; the ranks' weights drift apart, so a
    run with it is for timing, not for accuracy. (No annotations: torch checks that a hook's
    bucket is annotated ``dist.GradBucket`` or not at all, and this module's are strings.)"""
    import torch

    fut: Any = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _totals(state: Any) -> dict[str, float]:
    out = {"payload_bytes": 0.0, "encode_s": 0.0, "decode_s": 0.0, "comm_s": 0.0}
    if state is None:
        return out
    for v in state.stats().values():
        for k in out:
            out[k] += float(v["total"][k])
    return out


def train_run(run: dict[str, Any], s: Settings, comm: _Comm, data: tuple, index: int) -> dict[str, Any]:
    """Train one run from the seed's initial weights; the result as rank 0 reports it."""
    if run.get("start_iter") is not None:  # the run's own warm-up length (e.g. torch's PowerSGD: 2)
        s = dataclasses.replace(s, start_iter=int(run["start_iter"]))
    xtr, ytr, xte, yte = data
    torch.manual_seed(s.seed)
    model = MLP(s.hidden)
    params = list(model.parameters())
    t_setup = time.perf_counter()
    module, state, reduce = _wrap(model, run, s, comm)
    # the engine's setup (an adaptive controller calibrates its codecs here), not in train_s
    setup_s = time.perf_counter() - t_setup
    opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=s.momentum)
    p, r = comm.size, comm.rank
    gbatch = s.batch * p
    steps_per_epoch = len(ytr) // gbatch
    total_steps = steps_per_epoch * s.epochs
    k = min(s.evals_per_epoch, steps_per_epoch)
    evals = {round(j * steps_per_epoch / k) for j in range(1, k + 1)} if k > 0 else set()  # steps in an epoch
    xte_t, yte_t = torch.from_numpy(xte), torch.from_numpy(yte)
    curve: list[dict[str, float]] = []
    step_times: list[float] = []
    codec_ms: list[tuple[float, float]] = []  # per compressed step: (encode s, decode s)
    # per step: the seconds the hook held the gradients (its exchanges' encode, communication,
    # decode and planning, every bucket summed: its step report's held_s), None where it has none
    held: list[float | None] = []
    reported = 0
    seen = _totals(state)
    losses: list[float] = []
    step = 0
    train_s = 0.0
    comm.barrier()
    for epoch in range(s.epochs):
        if s.max_steps and step >= s.max_steps:
            break
        order = np.random.default_rng(s.seed * 1000 + epoch).permutation(len(ytr))
        for i in range(steps_per_epoch):
            if s.max_steps and step >= s.max_steps:
                break
            idx = order[i * gbatch + r * s.batch : i * gbatch + (r + 1) * s.batch]
            x, y = torch.from_numpy(xtr[idx]), torch.from_numpy(ytr[idx])
            if s.cosine:
                for g in opt.param_groups:
                    g["lr"] = 0.5 * s.lr * (1.0 + math.cos(math.pi * step / total_steps))
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = torch.nn.functional.cross_entropy(module(x), y)
            loss.backward()
            if reduce is not None:
                reduce(step)
            opt.step()
            dt = time.perf_counter() - t0
            if state is not None and step >= s.start_iter:  # DDP has waited for the hook by now
                now = _totals(state)
                codec_ms.append((now["encode_s"] - seen["encode_s"], now["decode_s"] - seen["decode_s"]))
                seen = now
            train_s += dt
            step_times.append(dt)
            rep = state.step_report() if hasattr(state, "step_report") else None
            if rep is not None and rep["steps"] > reported and rep["last"] is not None:
                reported = rep["steps"]
                held.append(float(rep["last"]["held_s"]))
            else:
                held.append(None)
            losses.append(float(loss.detach()))
            step += 1
            if i + 1 in evals:
                with torch.no_grad():
                    out = model(xte_t)
                    acc = float((out.argmax(1) == yte_t).float().mean())
                    test_loss = float(torch.nn.functional.cross_entropy(out, yte_t))
                window = losses[-(step - int(curve[-1]["step"] if curve else 0)) :]
                curve.append(
                    {
                        "epoch": epoch + (i + 1) / steps_per_epoch,
                        "step": step,
                        "train_s": train_s,
                        "accuracy": acc,
                        "test_loss": test_loss,
                        "train_loss": float(np.mean(window)),
                    }
                )
            if r == 0:
                print(f"{PROGRESS}{json.dumps({'run': index, 'step': step})}", flush=True)
    comm.barrier()
    tot = _totals(state)
    compressed = max(1, step - s.start_iter) if state is not None else max(1, step)
    nparams = sum(q.numel() for q in params)
    bytes_per_step = tot["payload_bytes"] / compressed + _wire_bytes_dense(run, params, s)
    decisions = None
    if run.get("adaptive") is not None and state is not None:
        # its codecs change during the run: every step's bytes as the hook reported them, warm-up
        # included, and the rungs it took
        rep = state.step_report()
        bytes_per_step = (rep["total"]["payload_bytes"] + rep["total"]["dense_bytes"]) / max(1, rep["steps"])
        moves = [d for d in state.controller.decisions if d["from"] != d["to"]]
        decisions = [
            {"step": d["step"], "from": d["from"], "to": d["to"], "predicted_s": [float(t) for t in d["predicted_s"]]}
            for d in moves
        ]
    ag_bytes = None
    if run["hook"] == "fsdp-gcodec" and state is not None:  # the last step's: its totals hold the warm-up's
        st = state.stats()
        bytes_per_step = float(sum(v["payload_bytes"] for v in st.values() if v["mode"] != "all_gather"))
        ag = [v for v in st.values() if v["mode"] == "all_gather"]  # every call compressed, 1 or 2 a step
        if ag:
            ag_bytes = float(sum(v["total"]["payload_bytes"] for v in ag)) / max(1, step)
    modes = sorted({v["mode"] for v in state.stats().values()}) if state is not None else []
    # steady state: after the dense warm-up and two compressed steps (first-call costs)
    first = min(len(step_times) - 1, s.start_iter + 2)
    warm = step_times[first:] or step_times
    warm_held = [h for h in held[first:] if h is not None]
    return {
        **run,
        "ok": True,
        "params": nparams,
        "steps": step,
        "compressed_steps": compressed if state is not None else 0,
        "bytes_per_step": bytes_per_step,
        "all_gather_bytes_per_step": ag_bytes,  # this rank's all-gather payloads (quantized all-gather only)
        "bits_per_element": 8.0 * bytes_per_step / nparams,
        # medians: the first compressed steps also pay one-time costs (kernel cache loads, buffers)
        "encode_ms": 1e3 * float(np.median([e for e, _ in codec_ms])) if codec_ms else 0.0,
        "decode_ms": 1e3 * float(np.median([d for _, d in codec_ms])) if codec_ms else 0.0,
        "encode_ms_mean": 1e3 * tot["encode_s"] / compressed,
        "decode_ms_mean": 1e3 * tot["decode_s"] / compressed,
        "comm_ms": 1e3 * tot["comm_s"] / compressed,
        "step_ms": 1e3 * float(np.median(warm)),
        # the same steps' median of the seconds the hook held the gradients (None without a
        # gcodec engine): what of it the step does not show was hidden behind the backward pass
        "held_ms": 1e3 * float(np.median(warm_held)) if warm_held else None,
        # the dense warm-up steps (before start_iter), first step left out (DDP's bucket rebuild)
        "warmup_step_ms": 1e3 * float(np.median(step_times[1 : s.start_iter] or step_times)),
        "train_s": train_s,
        "setup_s": setup_s,
        # the first steps one by one: where first-call costs (buffers, kernel loads, a bucket
        # rebuild, a controller's probe) show
        "first_steps_ms": [1e3 * t for t in step_times[:8]],
        "modes": modes,
        "accuracy": curve[-1]["accuracy"] if curve else None,
        "test_loss": curve[-1]["test_loss"] if curve else None,
        "train_loss": curve[-1]["train_loss"] if curve else float(np.mean(losses)),
        "curve": curve,
        "decisions": decisions,  # an adaptive run's rung changes (step, from, to)
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    s = Settings(**job["settings"])
    backend = job.get("backend", "gloo")
    comm = _Comm(backend, s.timeout_s)
    # Ranks share the machine's cores: one share each for torch and for gcodec's kernels.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // comm.size))
    data = train_test_split(s.seed if job.get("split_seed") is None else int(job["split_seed"]))
    results = []
    for i, run in enumerate(job["runs"]):
        try:
            results.append(train_run(run, s, comm, data, i))
        except Exception as e:  # gcodec's error agreement: every rank raises, none hangs
            results.append({**run, "ok": False, "error": f"{type(e).__name__}: {e}"})
            traceback.print_exc(file=sys.stderr)
            if comm.rank == 0:
                print(f"{PROGRESS}{json.dumps({'run': i, 'failed': True})}", flush=True)
    if comm.rank == 0:
        out = Path(job["out"])
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"workers": comm.size, "backend": backend, "runs": results}))
        tmp.replace(out)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
