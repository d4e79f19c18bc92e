"""One rank of the language-model workload: ``python -m gcodec.demo.lm_worker JOB.json``.

Started by :func:`gcodec.demo.launch.run_job` (``module="gcodec.demo.lm_worker"``) with gloo's
environment. The job holds :class:`~gcodec.demo.runs.LMSettings` and runs made by
:func:`~gcodec.demo.runs.lm_spec`; every rank trains every run from the same initial weights on its
own batches of the standard library's source (:mod:`gcodec.demo.corpus`), and rank 0 writes the
results: validation loss against tokens and seconds, bytes per rank per inner step, step times.

The model: bytes embedded in ``d_model`` dimensions plus a learned position embedding, ``layers``
pre-norm transformer blocks (``heads`` heads, GELU MLP of 4 x ``d_model``, no dropout) under a
causal mask, a final LayerNorm and the embedding as output layer (tied weights).
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
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import corpus, warm_codec
from .runs import LMSettings

PROGRESS = "@progress "


class TinyLM(torch.nn.Module):
    """The byte-level decoder-only transformer of the module docstring."""

    def __init__(self, d_model: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(256, d_model)
        torch.nn.init.normal_(self.tok.weight, std=0.02)  # it is the output layer too: small logits
        self.pos = torch.nn.Parameter(torch.randn(context, d_model) * 0.02)
        block = torch.nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d_model)
        self.mask: torch.Tensor
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.norm(h) @ self.tok.weight.T


def make_model(s: LMSettings) -> TinyLM:
    torch.manual_seed(s.seed)
    return TinyLM(s.d_model, s.layers, s.heads, s.context)


def lm_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    logits = model(windows[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), windows[:, 1:].reshape(-1))


def lr_at(s: LMSettings, step: int, total: int | None = None) -> float:
    """Linear warm-up over ``warmup`` steps, then a half cosine from ``lr`` to ``lr / 10`` at step
    ``total`` (default ``s.steps``)."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, (total or s.steps) - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def _hook_bytes(state: Any, model: torch.nn.Module, s: LMSettings, steps: int) -> tuple[float, float]:
    """Bytes per step the DDP hook's rank contributed, from its step reports (compressed payloads,
    the small tensors sent dense beside them, the dense warm-up steps): over the whole run, and per
    compressed step (after the warm-up, whose steps send 4 bytes per element)."""
    total = state.step_report()["total"]
    sent = float(total["payload_bytes"]) + float(total["dense_bytes"])
    n = sum(p.numel() for p in model.parameters())
    warm = min(steps, s.start_iter)
    after = sent - (warm * 4.0 * n if state.warmup_codec is None else 0.0)
    return sent / max(1, steps), after / max(1, steps - (warm if state.warmup_codec is None else 0))


def optimizer_diagnostics(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    before: list[torch.Tensor],
    start: list[torch.Tensor],
    s: LMSettings,
    step: int,
    grad_norm: float,
) -> dict[str, Any]:
    """What one optimizer step did to the tensors the hook compresses (those of ``min_numel``
    elements or more), on this rank: the share of gradient elements that are non-zero (a sparse
    codec's average leaves the rest at 0), the step's size per element in units of the learning
    rate (RMS, and the share of elements that moved by more than lr / 10), the distance travelled
    from the initial weights (RMS per element), and for Adam the median of sqrt(v_hat) (the
    second-moment estimate, bias-corrected) and the median of |m_hat| / (sqrt(v_hat) + eps);
    ``layers``: per tensor, its distance from the initial weights (RMS per element), to which a
    :class:`DenseShadow` adds its comparison."""
    lr = opt.param_groups[0]["lr"]
    nz = n = 0
    sq = moved = dist0 = 0.0
    ratios, roots = [], []
    layers: dict[str, dict[str, float]] = {}
    for (name, p), b, p0 in zip(model.named_parameters(), before, start):
        if p.numel() < s.min_numel or p.grad is None:
            continue
        layers[name] = {"dist_rms": float((p.detach() - p0).pow(2).mean().sqrt())}
        d = (p.detach() - b).abs()
        n += p.numel()
        nz += int((p.grad != 0).sum())
        sq += float((d * d).sum())
        moved += int((d > 0.1 * lr).sum())
        dist0 += float(((p.detach() - p0) ** 2).sum())
        st = opt.state.get(p, {})
        if "exp_avg_sq" in st:
            t = float(st["step"])
            g = opt.param_groups[0]
            b1, b2 = g["betas"]
            v = st["exp_avg_sq"] / (1 - b2**t)
            m = st["exp_avg"] / (1 - b1**t)
            roots.append(v.sqrt().flatten())
            ratios.append((m.abs() / (v.sqrt() + g["eps"])).flatten())
    out: dict[str, Any] = {
        "step": float(step + 1),
        "lr": lr,
        "grad_norm": grad_norm,
        "density": nz / max(1, n),
        "update_rms_lr": math.sqrt(sq / max(1, n)) / lr,
        "moved_share": moved / max(1, n),
        "dist_rms": math.sqrt(dist0 / max(1, n)),
    }
    if roots:
        out["sqrt_v_median"] = float(torch.cat(roots).median())
        out["m_over_sqrt_v_median"] = float(torch.cat(ratios).median())
    out["layers"] = layers
    return out


class DenseShadow:
    """What the optimizer would have done with the uncompressed gradient, beside a run whose DDP
    hook compresses (diagnostics, ``LMSettings.diag_every``; it costs one dense allreduce a step).

    A wrapper around the comm hook copies each rank's local gradient before the hook compresses it;
    after the backward pass :meth:`after_backward` averages the copies densely (the *true* average
    gradient g at the run's own weights) and adds ``g - g_hat`` (``g_hat``: what the hook delivered)
    to a running sum, which with error feedback and no decay equals the ranks' mean residual. A
    shadow AdamW (betas 0.9, 0.95, the run's clipping) is fed g; :meth:`compare` sets its m and v
    beside the optimizer's, per tensor of ``min_numel`` elements or more."""

    def __init__(self, model: torch.nn.Module, s: LMSettings) -> None:
        self.s = s
        self.named = list(model.named_parameters())
        self.local: dict[int, torch.Tensor] = {}
        self.true: dict[int, torch.Tensor] = {}
        self.delivered: dict[int, torch.Tensor] = {}
        self.resid = {id(p): torch.zeros_like(p) for _, p in self.named}
        self.m = {id(p): torch.zeros_like(p) for _, p in self.named}
        self.v = {id(p): torch.zeros_like(p) for _, p in self.named}
        self.t = 0

    def wrap(self, hook: Any) -> Any:
        def capture(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                self.local[id(p)] = g.detach().clone()
            return hook(state, bucket)

        capture.__annotations__ = dict(hook.__annotations__)  # DDP compares them with the real types
        return capture

    @torch.no_grad()
    def after_backward(self) -> None:
        """Before clipping: the true average gradient, the delivered one, the residual sum."""
        flat = torch.cat([self.local[id(p)].flatten() for _, p in self.named])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        pos = 0
        for _, p in self.named:
            g = flat[pos : pos + p.numel()].view_as(p)
            pos += p.numel()
            self.true[id(p)] = g
            assert p.grad is not None
            self.delivered[id(p)] = p.grad.detach().clone()
            self.resid[id(p)] += g - p.grad
        self.local.clear()

    @torch.no_grad()
    def after_step(self, betas: tuple[float, float]) -> None:
        """Feed the shadow AdamW the true gradient, clipped as the run clips its own."""
        b1, b2 = betas
        scale = 1.0
        if self.s.grad_clip:
            norm = math.sqrt(sum(float((g * g).sum()) for g in self.true.values()))
            scale = min(1.0, self.s.grad_clip / (norm + 1e-6))  # torch's clip_grad_norm_ rule
        for _, p in self.named:
            g = self.true[id(p)] * scale
            self.m[id(p)].lerp_(g, 1 - b1)
            self.v[id(p)].mul_(b2).addcmul_(g, g, value=1 - b2)
        self.t += 1

    @torch.no_grad()
    def compare(self, opt: torch.optim.Optimizer) -> dict[str, dict[str, float]]:
        """Per tensor: ``g_ratio`` |g_hat| / |g| and ``g_cos`` (this step, before clipping),
        ``resid_ratio`` |mean residual| / |g|, ``density`` (share of g_hat's elements not 0),
        ``v_ratio`` sqrt(mean v / mean v_true) and ``v_ratio_median`` (median over elements of
        sqrt(v / v_true)), ``u_ratio`` |u| / |u_true| and ``u_cos``, where u = m_hat / (sqrt(v_hat) + eps)
        is Adam's step in units of the learning rate."""
        grp = opt.param_groups[0]
        b1, b2 = grp["betas"]
        eps = grp["eps"]
        out: dict[str, dict[str, float]] = {}

        def cos(a: torch.Tensor, b: torch.Tensor) -> float:
            return float((a * b).sum() / (a.norm() * b.norm() + 1e-30))

        for name, p in self.named:
            if p.numel() < self.s.min_numel:
                continue
            st = opt.state.get(p, {})
            if "exp_avg_sq" not in st:
                continue
            g, gh = self.true[id(p)], self.delivered[id(p)]
            t = float(st["step"])
            c1, c2 = 1 - b1**t, 1 - b2**t
            v, vt = st["exp_avg_sq"], self.v[id(p)]
            u = (st["exp_avg"] / c1) / ((v / c2).sqrt() + eps)
            ut = (self.m[id(p)] / c1) / ((vt / c2).sqrt() + eps)
            gn = float(g.norm()) + 1e-30
            out[name] = {
                "g_ratio": float(gh.norm()) / gn,
                "g_cos": cos(gh, g),
                "resid_ratio": float(self.resid[id(p)].norm()) / gn,
                "density": float((gh != 0).float().mean()),
                "v_ratio": math.sqrt(float(v.mean()) / (float(vt.mean()) + 1e-30)),
                "v_ratio_median": float(((v + 1e-30) / (vt + 1e-30)).sqrt().median()),
                "u_ratio": float(u.norm()) / (float(ut.norm()) + 1e-30),
                "u_cos": cos(u, ut),
            }
        return out


class _TorchFT:
    """torchft's DiLoCo (``torchft.local_sgd.DiLoCo``) as the outside anchor: every rank is a
    replica group of one, with its own store and manager; rank 0 runs the lighthouse. With a
    codec in the run, the manager is gcodec's (:class:`gcodec.torch.torchft.Manager`): the same
    torchft DiLoCo, its pseudo-gradients through gcodec's compressed allreduce; fp32 otherwise."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, run: dict[str, Any], index: int) -> None:
        from torch.distributed import TCPStore
        from torchft import Manager, ProcessGroupGloo
        from torchft.local_sgd import DiLoCo as FTDiLoCo

        rank, world = dist.get_rank(), dist.get_world_size()
        self.lighthouse = None
        addr = [None]
        if rank == 0:
            from torchft.coordination import LighthouseServer

            self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world)
            addr = [self.lighthouse.address()]
        dist.broadcast_object_list(addr, src=0)
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        timeout = datetime.timedelta(seconds=120)
        extra: dict[str, Any] = {}
        if run.get("codec") is not None:
            from gcodec.torch.torchft import Manager  # type: ignore[assignment]

            extra = {
                "codec": run["codec"],
                "error_feedback": bool(run.get("error_feedback")),
                "ef_decay": float(run.get("ef_decay", 1.0)),
            }
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
            state_dict=lambda: {"model": model.state_dict()},
            min_replica_size=world,
            replica_id=f"lm{index}-rank{rank}",
            lighthouse_addr=addr[0],
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=self.store.port,
            hostname="localhost",
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timeout,
            **extra,
        )
        m = float(run.get("outer_momentum", 0.9))
        outer = torch.optim.SGD(model.parameters(), lr=float(run.get("outer_lr", 0.7)), momentum=m, nesterov=m > 0)
        # with a codec, one exchange per synchronisation (torchft's bucketization: the parameters as
        # one flat buffer), as gcodec's DiLoCo joins a fragment: one exchange per parameter costs
        # a payload header and an agreement each (docs/lowcomm.md, "torchft", has the bytes)
        self.diloco = FTDiLoCo(
            self.manager, [model], opt, outer, sync_every=int(run["sync_every"]), use_bucketization=bool(extra)
        )
        self.diloco.__enter__()

    def close(self) -> None:
        self.diloco.__exit__(None, None, None)
        self.manager.shutdown()
        dist.barrier()  # every manager is down before the lighthouse goes
        if self.lighthouse is not None:
            self.lighthouse.shutdown()


class FrozenVarianceAdamW(torch.optim.Optimizer):
    """AdamW whose second moment stops updating after ``freeze_at`` steps (1-bit Adam's idea,
    Tang et al. 2021): until then exactly torch's AdamW, afterwards each element's step is the
    momentum divided by a fixed sqrt(v_hat), linear in the gradients."""

    def __init__(
        self, params: Any, lr: float, betas: tuple[float, float], weight_decay: float, freeze_at: int, eps: float = 1e-8
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay, "eps": eps})
        self.freeze_at = int(freeze_at)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]  # no closure
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = int(st["step"])
                p.mul_(1 - g["lr"] * g["weight_decay"])
                st["exp_avg"].lerp_(p.grad, 1 - b1)
                if t <= self.freeze_at:
                    st["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                c2 = math.sqrt(1 - b2 ** min(t, self.freeze_at)) if self.freeze_at > 0 else 1.0
                denom = (st["exp_avg_sq"].sqrt() / c2).add_(g["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-g["lr"] / (1 - b1**t))


def make_optimizer(model: torch.nn.Module, run: dict[str, Any], s: LMSettings) -> torch.optim.Optimizer:
    """The run's optimizer: AdamW (betas 0.9, 0.95; weight decay 0.1) unless the run names
    ``"optimizer": "sgd"`` (plain SGD, ``momentum`` 0 unless the run gives one)."""
    kind = run.get("optimizer", "adamw")
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.1)
    if kind == "adamw-frozen":
        freeze = int(run.get("freeze_at", s.start_iter))
        return FrozenVarianceAdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.1, freeze_at=freeze)
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=s.lr, momentum=float(run.get("momentum", 0.0)))
    raise ValueError(f"unknown optimizer {kind!r}")


def train_run(run: dict[str, Any], s: LMSettings, data: corpus.Corpus, index: int) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    # a run may override the job's learning rate and the hook's size rules (lm_spec)
    own = {k: type(getattr(s, k))(run[k]) for k in ("lr", "start_iter", "min_numel") if k in run}
    s = dataclasses.replace(s, **own)
    model = make_model(s)
    n_params = sum(p.numel() for p in model.parameters())
    method = run["method"]
    module: torch.nn.Module = model
    state = dl = None
    shadow: DenseShadow | None = None
    if method in ("ddp", "ddp-gcodec"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        module = DDP(model)
        if method == "ddp-gcodec":
            import gcodec.torch

            state = gcodec.torch.HookState(
                codec=run["codec"],
                error_feedback=run["error_feedback"],
                start_iter=s.start_iter,
                min_numel=s.min_numel,
                policy=run.get("policy"),
                module=model if run.get("policy") is not None else None,
                warmup_codec=run.get("warmup_codec"),
            )
            hook: Any = gcodec.torch.comm_hook
            if s.diag_every:
                shadow = DenseShadow(model, s)
                hook = shadow.wrap(hook)
            module.register_comm_hook(state, hook)
    opt = make_optimizer(model, run, s)
    if method == "diloco":
        import gcodec.torch

        dl = gcodec.torch.DiLoCo(
            model,
            opt,
            sync_every=int(run["sync_every"]),
            codec=run["codec"],
            error_feedback=run["error_feedback"],
            ef_decay=float(run.get("ef_decay", 1.0)),
            min_numel=int(run.get("min_numel", 0)),
            policy=run.get("policy"),
            fragments=int(run.get("fragments", 1)),
            delay=int(run.get("delay", 0)),
            mix=float(run.get("mix", 0.0)),
            outer_optimizer=torch.optim.SGD(
                model.parameters(),
                lr=float(run.get("outer_lr", 0.7)),
                momentum=float(run.get("outer_momentum", 0.9)),
                nesterov=float(run.get("outer_momentum", 0.9)) > 0,
            ),
        )
    ft = _TorchFT(model, opt, run, index) if method == "torchft" else None
    if run.get("codec") is not None:  # load the kernels before the clock starts
        warm_codec(run["codec"], bool(run.get("error_feedback")))
    val = torch.from_numpy(corpus.val_windows(data.val, s.val_windows, s.context))
    evaluator = make_model(s) if dl is not None else None
    curve: list[dict[str, float]] = []
    diag: list[dict[str, Any]] = []
    start = [p.detach().clone() for p in model.parameters()] if s.diag_every and rank == 0 else []
    times: list[float] = []
    train_s = 0.0
    total = int(run.get("steps") or s.steps)  # a run may train a longer schedule than the job's
    steps = s.max_steps or total
    dist.barrier()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, step, total)
        x = torch.from_numpy(corpus.batch(data.train, s.batch, s.context, s.seed, step, rank))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(module, x)
        loss.backward()
        if shadow is not None:
            shadow.after_backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)) if s.grad_clip else 0.0
        watch = bool(start) and (step + 1) % s.diag_every == 0
        before = [p.detach().clone() for p in model.parameters()] if watch else []
        opt.step()  # DiLoCo's post-step hook sends and applies here
        dt = time.perf_counter() - t0
        if shadow is not None:
            shadow.after_step(opt.param_groups[0].get("betas", (0.9, 0.95)))
        if watch:
            diag.append(optimizer_diagnostics(model, opt, before, start, s, step, grad_norm))
            if shadow is not None and "betas" in opt.param_groups[0]:
                for name, row in shadow.compare(opt).items():
                    diag[-1]["layers"].setdefault(name, {}).update(row)
        times.append(dt)
        train_s += dt
        done = step + 1
        if done % s.eval_every == 0 or done == steps:
            net = model
            if dl is not None and evaluator is not None:
                evaluator.load_state_dict(dl.global_parameters(), strict=False)
                net = evaluator
            with torch.no_grad():
                v = float(lm_loss(net, val))
            curve.append(
                {
                    "step": done,
                    "tokens": float(done * s.batch * s.context * world),
                    "train_s": train_s,
                    "val_loss": v,
                    "train_loss": float(loss.detach()),
                }
            )
        if rank == 0:
            print(f"{PROGRESS}{json.dumps({'run': index, 'step': done})}", flush=True)
    if dl is not None:
        dl.close()  # its exchanges run on gcodec's queue: finish them before a collective of our own
    if ft is not None:
        ft.close()
    dist.barrier()
    compressed_step = None
    if method == "ddp":
        per_step = 4.0 * n_params
    elif method == "torchft" and ft is not None and hasattr(ft.manager, "gcodec_stats"):
        per_step = ft.manager.gcodec_stats()["payload_bytes"] / max(1, steps)  # as gcodec's DiLoCo counts it
    elif method == "torchft":  # float32 pseudo-gradients, one allreduce per parameter, every H steps
        per_step = 4.0 * n_params * (steps // int(run["sync_every"])) / steps
    elif method == "ddp-gcodec":
        per_step, compressed_step = _hook_bytes(state, model, s, steps)
    else:
        assert dl is not None
        per_step = dl.stats()["payload_bytes"] / max(1, steps)
    warm = times[min(len(times) - 1, 3) :]
    return {
        **run,
        "ok": True,
        "params": n_params,
        "steps": steps,
        "bytes_per_inner_step": per_step,
        # what a step sends once the warm-up is over (the hook's), in bits per parameter
        "bits_per_element": 8.0 * (per_step if compressed_step is None else compressed_step) / n_params,
        "step_ms": 1e3 * float(np.median(warm)),
        "mean_step_ms": 1e3 * float(np.mean(warm)),
        "step_times_ms": [round(1e3 * t, 4) for t in times],
        "train_s": train_s,
        "val_loss": curve[-1]["val_loss"] if curve else None,
        "curve": curve,
        "diloco": dl.stats() if dl is not None else None,
        "diag": diag,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    s = LMSettings(**job["settings"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=s.timeout_s))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // dist.get_world_size()))
    data = corpus.load()
    results = []
    for i, run in enumerate(job["runs"]):
        try:
            results.append(train_run(run, s, data, i))
        except Exception as e:  # gcodec's error agreement: every rank raises, none hangs
            results.append({**run, "ok": False, "error": f"{type(e).__name__}: {e}"})
            traceback.print_exc(file=sys.stderr)
            if dist.get_rank() == 0:
                print(f"{PROGRESS}{json.dumps({'run': i, 'failed': True})}", flush=True)
    if dist.get_rank() == 0:
        out = Path(job["out"])
        tmp = out.with_suffix(".tmp")
        meta = {"python": data.python, "corpus_sha256": data.sha256, "train_bytes": int(data.train.shape[0])}
        tmp.write_text(json.dumps({"workers": dist.get_world_size(), "corpus": meta, "runs": results}))
        tmp.replace(out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
