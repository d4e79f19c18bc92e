"""Kill and resume a 2-rank DDP job with gcodec's hook:
``python -m tests.transport_ranks.resume_torch OUTDIR PHASE RANK WORLD PORT``; writes
OUTDIR/<phase>_rank<r>.json (checks) and, per codec, what the test compares.

Phases, each over every codec of :data:`CODECS` (AdamW, a small language model with a tied
embedding, three DDP buckets):

* ``full``: :data:`STEPS` steps uninterrupted; the final parameters' digest;
* ``first``: the same job, checkpointed after :data:`SAVE_AT` steps the way single-file jobs do it
  (every rank's hook state gathered to rank 0, which writes one file with the model and the
  optimizer), then two more steps whose work is lost, then the process is killed (SIGKILL);
* ``second``: a fresh job that loads that file (the model, the optimizer, and each rank its own
  hook state) and runs to :data:`STEPS`; the final parameters' digest.

Also checked in ``second``: loading rank 0's hook state on rank 1 (the rank-0-only habit) and a
state saved with another codec are refused with a ConfigError.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec
import gcodec.torch

from ..procs import finish_gloo, run_checked, start_gloo

CHECKS: list[dict] = []
STEPS, SAVE_AT = 7, 3
LR = 3e-3
#: One codec of every family (gcodec/codecs), with error feedback. On this model some tensors are
#: multiples of a codec's groups or chunks and share one flat group, others are encoded alone.
CODECS: dict[str, Any] = {
    "fp16": "fp16",
    "bf16": "bf16",
    "uniform4": {"id": "uniform", "bits": 4},
    "uniform4_stochastic": {"id": "uniform", "bits": 4, "rounding": "stochastic"},
    "qsgd": {"id": "qsgd", "levels": 7, "bucket_size": 128},
    "terngrad": "terngrad",
    "sign": "sign",
    "topk": {"id": "topk", "ratio": 0.02},
    "randomk": {"id": "randomk", "ratio": 0.05},
    "chunktopk": {"id": "chunktopk", "chunk": 256, "k": 8},
    "threshold": {"id": "threshold", "threshold": 1e-2},
    "fp8": "fp8",
    "mx": {"id": "mx", "element": "e2m1"},
    "nvfp4": "nvfp4",
    "dct": {"id": "dct", "chunk": 64, "k": 4},
    "powersgd": {"id": "powersgd", "rank": 2},
    "topk_uniform8": {"id": "topk", "ratio": 0.05, "values": {"id": "uniform", "bits": 8}},
}


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


class TinyLM(torch.nn.Module):
    """Token and position embeddings, one MLP block, a head tied to the token embedding (its
    gradient is ready last, so DDP's rebuilt buckets differ from its first ones)."""

    def __init__(self, vocab: int = 96, dim: int = 64, ctx: int = 16) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, dim)
        self.wpe = torch.nn.Embedding(ctx, dim)
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.proj = torch.nn.Linear(4 * dim, dim)
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        h = h + self.proj(torch.nn.functional.gelu(self.fc(h)))
        return self.head(self.ln(h))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    idx = torch.randint(0, 96, (8, 17), generator=g)
    return idx[:, :-1], idx[:, 1:]


#: per iteration of the last job built, the parameters of each bucket DDP handed to the hook
LAYOUTS: dict[int, list[tuple[str, ...]]] = {}


def _recording_hook(state: gcodec.torch.HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    LAYOUTS.setdefault(state.iter, []).append(tuple(state._name(q) for q in bucket.parameters()))
    return gcodec.torch.comm_hook(state, bucket)


_recording_hook.__annotations__ = dict(gcodec.torch.comm_hook.__annotations__)


def _job(codec: Any) -> tuple[TinyLM, DDP, torch.optim.Optimizer, gcodec.torch.HookState]:
    torch.manual_seed(0)
    model = TinyLM()
    ddp = DDP(model, bucket_cap_mb=0.03)
    # every tensor compressed, the 1-D ones too (a pattern that names the codec): then tensors of
    # 64 elements sit beside ones of multiples of 256 (a sign group, a chunk) in one bucket
    state = gcodec.torch.HookState(codec, start_iter=1, min_numel=64, module=model, policy={"*": codec})
    LAYOUTS.clear()
    ddp.register_comm_hook(state, _recording_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR, weight_decay=0.1)
    return model, ddp, opt, state


def _step(ddp: DDP, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = _batch(rank, step)
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(ddp(x).reshape(-1, 96), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    opt.step()


def _digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def full(outdir: Path, rank: int) -> None:
    for name, codec in CODECS.items():
        model, ddp, opt, _ = _job(codec)
        for step in range(STEPS):
            _step(ddp, opt, rank, step)
        (outdir / f"full_{name}_rank{rank}.txt").write_text(_digest(model))
        torch.save(model.state_dict(), outdir / f"full_{name}_rank{rank}.pt")


def first(outdir: Path, rank: int) -> None:
    for name, codec in CODECS.items():
        model, ddp, opt, state = _job(codec)
        for step in range(SAVE_AT):
            _step(ddp, opt, rank, step)
        hooks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(hooks, state.state_dict())  # every rank's own, on rank 0 too
        if rank == 0:
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "hook": hooks, "step": SAVE_AT},
                outdir / f"ckpt_{name}.pt",
            )
        dist.barrier()
        for step in range(SAVE_AT, SAVE_AT + 2):  # work the kill loses
            _step(ddp, opt, rank, step)
    (outdir / f"first_rank{rank}.json").write_text(json.dumps(CHECKS))
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)


def second(outdir: Path, rank: int) -> None:
    for name, codec in CODECS.items():
        ckpt = torch.load(outdir / f"ckpt_{name}.pt", weights_only=True)
        model, ddp, opt, state = _job(codec)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        if name == "uniform4":  # the refusals, once
            _refusals(ckpt, state, rank)
        state.load_state_dict(ckpt["hook"][rank])
        for step in range(int(ckpt["step"]), STEPS):
            _step(ddp, opt, rank, step)
        if name == "uniform4":  # what the test is about: other buckets in the restart's first step
            first_it, last_it = LAYOUTS[int(ckpt["step"])], LAYOUTS[STEPS - 1]
            check("the restarted DDP's first buckets differ from its rebuilt ones", first_it != last_it, str(LAYOUTS))
        (outdir / f"second_{name}_rank{rank}.txt").write_text(_digest(model))
        torch.save(model.state_dict(), outdir / f"second_{name}_rank{rank}.pt")


def _refusals(ckpt: dict[str, Any], state: gcodec.torch.HookState, rank: int) -> None:
    other = ckpt["hook"][1 - rank]
    try:
        state.load_state_dict(other)
        check("another rank's hook state is refused", False, "loaded")
    except gcodec.ConfigError as e:
        check("another rank's hook state is refused", f"saved by rank {1 - rank}" in str(e), str(e))
    foreign = gcodec.torch.HookState("sign", start_iter=1, min_numel=64, warm=False, policy={"*": "sign"})
    try:
        foreign.load_state_dict(ckpt["hook"][rank])
        check("a state saved with another codec is refused", False, "loaded")
    except gcodec.ConfigError as e:
        check("a state saved with another codec is refused", "codec: saved" in str(e), str(e)[:300])


def main() -> None:
    outdir, phase = Path(sys.argv[1]), sys.argv[2]
    rank, world, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start_gloo(rank, world, port, timeout=60.0)
    body = {"full": full, "first": first, "second": second}[phase]
    CHECKS.clear()

    def run() -> None:
        body(outdir, rank)

    run_checked(run, CHECKS, outdir, rank)
    (outdir / f"{phase}_rank{rank}.json").write_text(json.dumps(CHECKS))
    finish_gloo()


if __name__ == "__main__":
    main()
