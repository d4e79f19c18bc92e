"""FSDP2 benchmark: gcodec's compressed reduce-scatter against FSDP2's own, bytes and step time.

    python bench/fsdp.py [--ranks 2] [--params 4] [--steps 20]

Trains an MLP of about ``--params`` million parameters (three square Linear layers, each its own
FSDP module) with ``--ranks`` gloo ranks on 127.0.0.1 and reports, per contender:

* bytes each rank receives per step in the reduce-scatters, from the payload sizes: FSDP2's own
  reduce-scatter moves (p-1)/p of its input (float32, or bfloat16 with ``reduce_dtype``); gcodec's
  figure is the ``wire_bytes`` of its statistics (payloads from the other ranks);
* the median step time (forward, backward with the reduce-scatters, SGD step) after warm-up.

Contenders: FSDP2 fp32, FSDP2 with ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``, and
``gcodec.torch.compress_fsdp`` with fp16, uniform 8 and 4 bits, and top-k 1 % + EF (2 warm-up steps).
All run in the same processes, interleaved step by step, so machine noise hits all alike.
The constrained-link runs of issue 15 wait for the link emulation of the benchmarks issue.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

CONTENDERS = {
    "FSDP2 fp32": None,
    "FSDP2 reduce_dtype=bf16": "bf16",
    "gcodec fp16": "fp16",
    "gcodec uniform 8": {"id": "uniform", "bits": 8},
    "gcodec uniform 4": {"id": "uniform", "bits": 4},
    "gcodec top-k 1% + EF": {"id": "topk", "ratio": 0.01},
}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import gcodec.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    width = int((args.params * 1e6 / 3) ** 0.5) // 64 * 64
    runs = {}
    for name, codec in CONTENDERS.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(3)))
        mp = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16) if codec == "bf16" else MixedPrecisionPolicy()
        for m in model:
            fully_shard(m, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        state = None
        if codec not in (None, "bf16"):
            state = gcodec.torch.compress_fsdp(model, codec, start_iter=2)
        x = torch.randn(64, width, generator=torch.Generator().manual_seed(rank))
        runs[name] = (model, state, torch.optim.SGD(model.parameters(), lr=1e-3), x, [])
    for _step in range(args.steps):
        for _name, (model, _, opt, x, times) in runs.items():
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    nparams = sum(p.numel() for p in next(iter(runs.values()))[0].parameters())
    res = {}
    for name, (_, state, _, _, times) in runs.items():
        t = statistics.median(times[4:])
        if state is None:
            item = 2 if CONTENDERS[name] == "bf16" else 4
            wire = nparams * item * (world - 1) / world
        else:
            wire = sum(v["wire_bytes"] for v in state.stats().values())
        res[name] = {"step_s": t, "wire_bytes": wire}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"params": nparams, "width": width, "ranks": world, "runs": res}, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--params", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank >= 0:
        _rank(args.rank, args.ranks, args.port, args, args.out)
        return
    import subprocess
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "fsdp.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, __file__, "--ranks", str(args.ranks), "--params", str(args.params)]
    base += ["--steps", str(args.steps), "--port", str(port), "--out", out]
    procs = [subprocess.Popen([*base, "--rank", str(r)], env=env) for r in range(args.ranks)]
    if any(p.wait() for p in procs):
        sys.exit("a rank failed")
    with open(out) as f:
        data = json.load(f)
    runs = data["runs"]
    print(f"{data['params'] / 1e6:.2f} M parameters (3 x Linear({data['width']})), {data['ranks']} gloo ranks")
    f32, b16 = runs["FSDP2 fp32"], runs["FSDP2 reduce_dtype=bf16"]
    print(f"{'contender':26} {'bytes/rank/step':>16} {'vs fp32':>8} {'vs bf16':>8} {'step ms':>8} {'vs bf16':>8}")
    for name, r in runs.items():
        print(
            f"{name:26} {r['wire_bytes']:16,.0f} {r['wire_bytes'] / f32['wire_bytes']:8.3f} "
            f"{r['wire_bytes'] / b16['wire_bytes']:8.3f} {1e3 * r['step_s']:8.1f} {r['step_s'] / b16['step_s']:8.2f}"
        )


if __name__ == "__main__":
    main()
