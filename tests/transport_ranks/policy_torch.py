"""One gloo rank with a Policy and telemetry on the DDP hook:
``python -m tests.transport_ranks.policy_torch OUTDIR RANK WORLD PORT``; writes OUTDIR/rank<r>.json."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec.torch
from gcodec.policy import Policy
from gcodec.telemetry import Telemetry
from gcodec.transports import Router

from ..procs import finish_gloo, run_checked, start_gloo

CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def run(rank: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8)
    )
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(128, 32, generator=g)
    y = torch.tanh(x @ torch.randn(32, 8, generator=torch.Generator().manual_seed(5)))
    policy = Policy(
        [{"name": "0.weight", "codec": "fp16"}, {"name": "4.*", "codec": None}],
        default={"id": "uniform", "bits": 8},
        warmup_steps=3,
        min_numel=64,
    )
    records: list[dict] = []
    tel = Telemetry(every=2, callback=records.append, warn=False)
    state = gcodec.torch.HookState(policy=policy, start_iter=0, module=model, telemetry=tel)
    ddp = DDP(model, bucket_cap_mb=0.01)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    stats = state.stats()
    codecs = {v["codec"]["id"] for v in stats.values()}
    check("loss falls", losses[-1] < 0.5 * losses[0], f"{losses[0]} -> {losses[-1]}")
    check("fp16 for 0.weight, uniform for 2.weight", codecs == {"fp16", "uniform"}, str(sorted(stats)))
    check(
        "biases and the head stay dense", not any("bias" in k or k.startswith("4.") for k in stats), str(sorted(stats))
    )
    uq = [v["quality"] for v in stats.values() if v["codec"]["id"] == "uniform"]
    check("quality in stats", len(uq) == 1 and uq[0]["norm_ratio"] > 0.99 and uq[0]["cosine"] > 0.999, str(uq))
    check(
        "callback got samples", len(records) >= 2 * 10 and all(r["step"] % 2 == 0 for r in records), str(len(records))
    )
    check("no warning on a healthy run", tel.warnings == [], str(tel.warnings))
    back = pickle.loads(pickle.dumps(state))
    check("policy survives pickling", isinstance(back.policy, Policy) and back.policy == policy, repr(back.policy))

    # a compressed warm-up: fp16 for the first 3 iterations, then the hook's codec
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))
    wstate = gcodec.torch.HookState({"id": "uniform", "bits": 8}, start_iter=3, warmup_codec="fp16", min_numel=64)
    wddp = DDP(net)
    wddp.register_comm_hook(wstate, gcodec.torch.comm_hook)
    wopt = torch.optim.SGD(wddp.parameters(), lr=0.2)
    for _ in range(5):
        wopt.zero_grad()
        torch.nn.functional.mse_loss(wddp(x), y).backward()
        wopt.step()
    steps: dict[str, int] = {}
    for v in wstate.stats().values():  # DDP's bucket rebuild after the first step renames a group
        steps[v["codec"]["id"]] = steps.get(v["codec"]["id"], 0) + v["steps"]
    check("a warm-up codec runs the first start_iter steps", steps == {"fp16": 3, "uniform": 2}, str(steps))

    # all_reduce through a router: a Policy switching codec at step 2, residual carried over
    switch = Policy(
        [{"until_step": 2, "codec": {"id": "topk", "ratio": 0.1}}], default={"id": "uniform", "bits": 8}, min_numel=0
    )
    router = Router(switch, error_feedback=True)
    gen = torch.Generator().manual_seed(7 + rank)
    same = True
    for _ in range(4):
        t = torch.randn(64, 64, generator=gen)
        gcodec.torch.all_reduce(t, None, key="w", state=router)
        top = t.clone()
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        same = same and torch.equal(top, t)  # every rank holds the same bits
    sw = [(k, step, a["id"], b["id"]) for k, step, a, b in router.switches]
    check("all_reduce with a Router switches codec at the policy's step", sw == [("w", 2, "topk", "uniform")], str(sw))
    check("and every rank gets the same result", same)
    t = torch.ones(8, 8) * (rank + 1)
    gcodec.torch.all_reduce(t, Policy(default="fp16", min_numel=0), key="p")  # a Policy given directly
    check("all_reduce with a Policy averages", torch.equal(t, torch.full((8, 8), 1.5)), str(t[0, :3]))


def main() -> None:
    outdir, rank, world, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    start_gloo(rank, world, port, 20)
    run_checked(lambda: run(rank), CHECKS, outdir, rank)
    finish_gloo()


if __name__ == "__main__":
    main()
