"""One gloo rank training with the adaptive controller on the DDP hook and then on FSDP2, and
FSDP2 under a :class:`gcodec.policy.Policy`:
``python -m tests.transport_ranks.adaptive_torch OUTDIR RANK WORLD PORT``.

The link is given as 1 Mbit/s for the first 60 steps and 1 Tbit/s after, as in the MPI program
(tests/transport_ranks/adaptive_mpi.py, which says why not 10 Mbit/s: on a busy machine the codecs'
measured seconds can exceed a dense exchange priced at 10 Mbit/s, and the controller rightly stays
dense; a full suite at load ~9 ended FSDP2's slow phase back on dense at step 8 that way).

Writes OUTDIR/rank<r>.json (checks) and OUTDIR/decisions<r>.json (each engine's switches,
decisions and a digest of its parameters), which tests/test_adaptive.py compares across the ranks.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec.torch
from gcodec.adaptive import AdaptiveController
from gcodec.policy import Policy
from gcodec.telemetry import Telemetry

from ..procs import finish_gloo, run_checked, start_gloo

CHECKS: list[dict] = []
STEPS, FAST_FROM = 120, 60


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def controller() -> AdaptiveController:
    return AdaptiveController(bandwidth="1Mbit", interval=10, warmup_steps=5, latency_s=1e-5)


def data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(256, 128, generator=g)
    w_true = torch.randn(128, 64, generator=torch.Generator().manual_seed(99))
    return x, x @ w_true


def train(
    model: torch.nn.Module,
    params: Any,
    ctl: AdaptiveController | None,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    steps: int = STEPS,
) -> list[float]:
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for step in range(steps):
        if ctl is not None and step == FAST_FROM:
            ctl.bandwidth_bps = 1e12  # the link gets fast: compression must get out of the way
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def record(ctl: AdaptiveController, switches: list, params: list[torch.Tensor]) -> dict:
    return {
        "switches": [[s[0], s[1], s[2], s[3]] for s in switches],
        "decisions": [[d["key"], d["step"], d["from"], d["to"]] for d in ctl.decisions],
        "params": digest(params),
    }


def check_engine(name: str, ctl: AdaptiveController, switches: list, losses: list[float]) -> None:
    up = [s for s in switches if s[2] == "dense"]  # first moves off the dense rung (slow link)
    check(f"{name}: the controller leaves dense on the slow link", bool(up) and up[0][1] < FAST_FROM, str(switches))
    late = [s for s in switches if s[1] >= FAST_FROM]
    check(
        f"{name}: and comes back to dense or fp16 on the fast one",
        bool(late) and all(s[3] == "dense" or s[3]["id"] == "fp16" for s in late[-1:]),
        str(switches),
    )
    check(f"{name}: the loss falls", losses[-1] < 0.2 * losses[0], f"{losses[0]} -> {losses[-1]}")
    # a decision every 10 steps from step 5 of each key: 12 in 120 steps (a key DDP's bucket
    # rebuild renamed after its first step decides one step later)
    check(f"{name}: every decision was recorded", len(ctl.decisions) >= 11, str(len(ctl.decisions)))


def run(rank: int, world: int, outdir: Path) -> None:
    out: dict[str, Any] = {}
    x, y = data(rank)

    # DDP: one rung per bucket
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 64)
    ctl = controller()
    state = gcodec.torch.HookState(
        controller=ctl, start_iter=0, min_numel=1024, module=model, telemetry=Telemetry(every=5, warn=False)
    )
    ddp = DDP(model)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    losses = train(ddp, ddp.parameters(), ctl, x, y, 10.0)
    gcodec.torch.synchronize()
    check_engine("DDP hook", ctl, state.router.switches, losses)
    check(
        "DDP hook: compressed groups ran under the controller's codecs",
        any(v["codec"]["id"] != "fp16" for v in state.stats().values()),
        str(sorted(state.stats())),
    )
    recs = {k: state.router.last(k) for k in ctl.measured}
    check(
        "DDP hook: each bucket's record holds the seconds the bucket was held, its exchanges' own within",
        bool(recs)
        and all(
            r is not None and r["held_s"] >= r["encode_s"] + r["comm_s"] + r["decode_s"] > 0 for r in recs.values()
        ),
        str(recs),
    )
    out["ddp"] = record(ctl, state.router.switches, list(model.parameters()))

    # FSDP2: one rung per module
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Linear(64, 64))
    for m in net:
        fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    ctl = controller()
    fstate = gcodec.torch.compress_fsdp(net, controller=ctl, start_iter=0, min_numel=1024)
    y2 = y @ torch.eye(64)
    losses = train(net, net.parameters(), ctl, x, y2, 0.5)
    check_engine("FSDP2", ctl, fstate.router.switches, losses)
    full = [v.full_tensor() for v in net.state_dict().values()]
    out["fsdp"] = record(ctl, fstate.router.switches, full)

    # FSDP2 under a gcodec.policy.Policy: each parameter gets the codec the policy names
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Linear(64, 64))
    for m in net:
        fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    policy = Policy([{"name": "0.*", "codec": {"id": "uniform", "bits": 4}}], default="bf16", min_numel=1024)
    pstate = gcodec.torch.compress_fsdp(net, policy=policy, start_iter=0)
    train(net, net.parameters(), None, x, y2, 0.5, steps=3)
    by_module: dict[str, set] = {}
    for k, v in pstate.stats().items():
        by_module.setdefault(k.split(":")[0], set()).add(None if v["codec"] is None else v["codec"]["id"])
    check(
        "FSDP2 honours a Policy: uniform 4 for 0.weight, bf16 for 1.weight, biases dense",
        by_module.get("0") == {"uniform", None} and by_module.get("1") == {"bf16", None},
        str(sorted(pstate.stats())),
    )
    (outdir / f"decisions{rank}.json").write_text(json.dumps(out))


def main() -> None:
    outdir, rank, world, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    start_gloo(rank, world, port, 60)
    run_checked(lambda: run(rank, world, outdir), CHECKS, outdir, rank)
    finish_gloo()


if __name__ == "__main__":
    main()
