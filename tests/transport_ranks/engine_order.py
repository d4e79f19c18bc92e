"""One gloo rank training DDP with gcodec's hook while the engine and the user run collectives of
their own on the same process group: ``python -m tests.transport_ranks.engine_order OUTDIR SETTINGS
RANK WORLD PORT``; writes OUTDIR/rank<r>.json.

``SETTINGS`` is a comma-separated list of :data:`SETTINGS`, run one after the other:

* ``unused``: ``DDP(find_unused_parameters=True)``, every parameter used (DDP all-reduces its
  unused-parameter bitmap on its own thread after the last bucket is handed to the hook); also
  one parameter left unused every other step;
* ``static``: ``DDP(static_graph=True)`` (its first iteration searches for unused parameters the
  same way; compressed from that first iteration);
* ``syncnorm``: a normalisation layer that all-reduces its batch statistics in forward and their
  gradients in backward, on the default group, as ``torch.nn.SyncBatchNorm`` does (which runs on
  CUDA only; this one is the same pattern on the CPU);
* ``user``: the user's own collectives between steps, on the default group (a loss all-reduce, a
  barrier, an ``all_gather_object``), one of them while a ``gcodec.torch.all_reduce(...,
  async_op=True)`` is still in flight.

Each setting trains every codec family for a few steps and checks that the hook ran, that every
step's gradients and the final parameters are identical on every rank, and that the compressed
run stays close to the same model trained with DDP's own allreduce.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec.torch

from ..procs import finish_gloo, run_checked, start_gloo

CHECKS: list[dict] = []
SETTINGS = ("unused", "static", "syncnorm", "user")

#: one codec per family, each protocol the hook runs: summable, gather (p = 2) or two-phase
#: (p > 2) with error feedback, sparse + EF, low rank + EF
CODECS: dict[str, Any] = {
    "fp16": "fp16",
    "uniform4": {"id": "uniform", "bits": 4},
    "topk": {"id": "topk", "ratio": 0.05},
    "powersgd": {"id": "powersgd", "rank": 2},
}
STEPS = 6


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


class _SyncStats(torch.autograd.Function):
    """Sum of a tensor over the ranks in forward, and of its gradient in backward (SyncBatchNorm's
    two collectives), on the default group."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        g = g.clone()
        dist.all_reduce(g)
        return g


class SyncNorm(torch.nn.Module):
    """Normalise by the batch mean and variance of every rank together (SyncBatchNorm's pattern)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.bias = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = x.shape[0] * dist.get_world_size()
        stats = _SyncStats.apply(torch.cat([x.sum(0), (x * x).sum(0)]))
        mean, sq = stats[: x.shape[1]] / count, stats[x.shape[1] :] / count
        return (x - mean) / torch.sqrt(sq - mean * mean + 1e-5) * self.weight + self.bias


class Net(torch.nn.Module):
    def __init__(self, setting: str) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 96)
        self.norm = SyncNorm(96) if setting == "syncnorm" else torch.nn.Identity()
        self.fc2 = torch.nn.Linear(96, 96)
        self.side = torch.nn.Linear(96, 96)  # skipped on odd steps under "unused"
        self.head = torch.nn.Linear(96, 8)
        self.skip_side = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.fc1(x)))
        h = torch.tanh(self.fc2(h))
        if not self.skip_side:
            h = h + torch.tanh(self.side(h))
        return self.head(h)


def _digest(ts: Any) -> str:
    return hashlib.sha256(b"".join(t.detach().contiguous().numpy().tobytes() for t in ts)).hexdigest()


def _same_on_every_rank(what: str) -> bool:
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, what)
    return len(set(got)) == 1


def train(setting: str, codec: Any, rank: int) -> tuple[list[float], dict[str, torch.Tensor], bool]:
    """STEPS steps of the setting's model; (losses, final parameters, whether every step's
    gradients agreed on every rank). ``codec`` None trains with DDP's own allreduce."""
    torch.manual_seed(0)
    net = Net(setting)
    kwargs: dict[str, Any] = {"bucket_cap_mb": 0.02}
    if setting == "unused":
        kwargs["find_unused_parameters"] = True
    if setting == "static":
        kwargs["static_graph"] = True
    ddp = DDP(net, **kwargs)
    state = None
    if codec is not None:
        start = 0 if setting == "static" else 1
        state = gcodec.torch.HookState(codec, start_iter=start, min_numel=64, module=net)
        ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(64, 32, generator=g)
    y = torch.tanh(x @ torch.randn(32, 8, generator=torch.Generator().manual_seed(5)))
    losses, agreed = [], True
    for step in range(STEPS):
        net.skip_side = setting == "unused" and step % 2 == 1
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        agreed &= _same_on_every_rank(_digest(grads))
        opt.step()
        if setting == "user":  # the user's own collectives between steps, on the default group
            total = loss.detach().clone()
            metric = torch.full((4096,), float(rank + step))
            work = None
            if codec is not None:  # a compressed all-reduce of the user's in flight meanwhile
                work = gcodec.torch.all_reduce(metric, codec, op="sum", async_op=True, key="metric")
            dist.all_reduce(total)
            if work is not None:  # the same sum on every rank (exact where the codec is lossless here)
                work.wait()
                agreed &= _same_on_every_rank(_digest([metric]))
                if codec == "fp16":
                    agreed &= bool((metric == sum(range(dist.get_world_size())) + dist.get_world_size() * step).all())
            losses.append(float(total) / dist.get_world_size())
            dist.barrier()
            names: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(names, f"rank{rank}")
        else:
            losses.append(float(loss.detach()))
    if state is not None:
        check(f"{setting}: the hook compressed ({codec})", len(state.stats()) > 0, str(sorted(state.stats())))
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}, agreed


def run(setting: str, rank: int) -> None:
    base_losses, base, _ = train(setting, None, rank)
    for name, codec in CODECS.items():
        losses, params, agreed = train(setting, codec, rank)
        check(f"{setting} {name}: every step's gradients identical on every rank", agreed)
        check(
            f"{setting} {name}: final parameters identical on every rank",
            _same_on_every_rank(_digest(params.values())),
        )
        # compression changes the steps a little; a hook that dropped or mixed up a bucket would not
        # stay this close to DDP's own run over six steps
        drift = max(float((params[n] - base[n]).abs().max()) for n in base)
        check(f"{setting} {name}: close to DDP's own allreduce", drift < 0.05, f"max |delta| {drift:.4f}")
        # Within 15 % of the first loss: top-k 5 % + EF, which selects within each tensor (so that
        # no tensor's encoding depends on its bucket), ends up to 10.2 % behind after six steps on
        # 3 ranks (two-phase, "syncnorm"; 7.5 % when it selected over each bucket's joined group)
        check(
            f"{setting} {name}: loss falls as DDP's does",
            losses[-1] < base_losses[0] and abs(losses[-1] - base_losses[-1]) < 0.15 * base_losses[0],
            f"gcodec {losses[0]:.4f} -> {losses[-1]:.4f}, DDP {base_losses[0]:.4f} -> {base_losses[-1]:.4f}",
        )


def main() -> None:
    outdir, settings = Path(sys.argv[1]), sys.argv[2].split(",")
    rank, world, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start_gloo(rank, world, port, timeout=60.0)

    def body() -> None:
        for setting in settings:
            run(setting, rank)

    run_checked(body, CHECKS, outdir, rank)
    finish_gloo()


if __name__ == "__main__":
    main()
