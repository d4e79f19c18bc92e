"""FSDP2 benchmark: gcodec's compressed reduce-scatter against FSDP2's own, bytes and step time.

    python bench/fsdp.py [--ranks 2] [--params 4] [--steps 20]

Trains an MLP of about ``--params`` million parameters (three square Linear layers, each its own
FSDP module) with ``--ranks`` gloo ranks on 127.0.0.1 and reports, per contender:

* bytes each rank receives per step in the reduce-scatters, from the payload sizes: FSDP2's own
  reduce-scatter moves (p-1)/p of its input (float32, or bfloat16 with ``reduce_dtype``); gcodec's
  figure is the ``wire_bytes`` of its statistics (payloads from the other ranks);
* the median step time (forward, backward with the reduce-scatters, SGD step) after warm-up.

Contenders: FSDP2 fp32, FSDP2 with ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)``, and
``gcodec.torch.compress_fsdp`` with fp16 (with and without error feedback), uniform 8 bits, uniform
4 bits + EF and top-k 1 % + EF (2 warm-up steps).
All run in the same processes, interleaved step by step, so machine noise hits all alike.

    sudo python bench/fsdp.py --link [--rates 100mbit,1gbit,unlimited] [--json F] [--markdown F]
    sudo python bench/fsdp.py --gloo-bytes    # what gloo's reduce-scatter really moves

**Time to accuracy on an emulated link** (``--link``): the demo's digits task with the link
benchmark's MLP 64-2048-2048-10 (4.35 M parameters), each Linear layer its own FSDP2 module, 2
gloo ranks in a network namespace whose loopback is shaped by a token bucket (bench/link.py's
``namespace``; needs root). Contenders: FSDP2 fp32, FSDP2 ``reduce_dtype=bfloat16``, and
``compress_fsdp`` with several codecs. The method is bench/link.py's (its ``run``): one full
training run per contender gives the steps to the target (FSDP2 fp32's final test accuracy), a
short job per rate gives the median step time, and time to accuracy = steps x step time (the
first ``--warmup`` steps at FSDP2 fp32's, since compress_fsdp leaves them to FSDP). The table
gives each contender's time to accuracy relative to FSDP2 bf16's at every rate.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CONTENDERS = {
    "FSDP2 fp32": None,
    "FSDP2 reduce_dtype=bf16": "bf16",
    "gcodec fp16": "fp16",
    "gcodec fp16 + EF": "fp16",
    "gcodec uniform 8": {"id": "uniform", "bits": 8},
    "gcodec uniform 4 + EF": {"id": "uniform", "bits": 4},
    "gcodec top-k 1% + EF": {"id": "topk", "ratio": 0.01},
    "gcodec uniform 4 + EF, AG u8": {"id": "uniform", "bits": 4},
}
#: contenders with gcodec's quantized parameter all-gather (compress_fsdp(all_gather=...))
AG8 = {"id": "uniform", "bits": 8, "group_size": 128}
ALL_GATHER = {"gcodec uniform 4 + EF, AG u8": AG8}


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
            ef = "+ EF" in name  # error feedback where the codec needs it (or asked for)
            ag = ALL_GATHER.get(name)
            state = gcodec.torch.compress_fsdp(model, codec, start_iter=2, error_feedback=ef, all_gather=ag)
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
        # FSDP's own all-gathers: every rank receives (p-1)/p of the fp32 parameters, twice a step
        # (forward, and backward after reshard_after_forward)
        ag_wire = 2 * nparams * 4 * (world - 1) / world
        if state is None:
            item = 2 if CONTENDERS[name] == "bf16" else 4
            wire = nparams * item * (world - 1) / world
        else:
            st = state.stats()
            wire = sum(v["wire_bytes"] for v in st.values() if v["mode"] != "all_gather")
            ag = [v for v in st.values() if v["mode"] == "all_gather"]
            if ag:  # compressed from the first call: totals over the steps
                ag_wire = sum(v["total"]["wire_bytes"] for v in ag) / args.steps
        res[name] = {"step_s": t, "wire_bytes": wire, "all_gather_wire_bytes": ag_wire}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"params": nparams, "width": width, "ranks": world, "runs": res}, f)
    dist.destroy_process_group()


def _spec(
    label: str, codec: dict[str, Any] | None, ef: bool = False, reduce_dtype: str | None = None
) -> dict[str, Any]:
    hook = "fsdp" if codec is None else "fsdp-gcodec"
    spec = {"label": label, "codec": codec, "error_feedback": ef, "hook": hook}
    if reduce_dtype:
        spec["reduce_dtype"] = reduce_dtype
    return spec


#: --link's contenders; the first is the reference (target accuracy, warm-up steps), the second the
#: baseline of the ratios.
LINK_CONTENDERS = [
    _spec("FSDP2 fp32", None),
    _spec("FSDP2 reduce_dtype=bf16", None, reduce_dtype="bf16"),
    _spec("gcodec fp16", {"id": "fp16"}),
    _spec("gcodec uniform 8", {"id": "uniform", "bits": 8}),
    _spec("gcodec uniform 4 + EF", {"id": "uniform", "bits": 4}, True),
    _spec("gcodec top-k 1% + EF", {"id": "topk", "ratio": 0.01}, True),
    _spec(
        "gcodec top-k 1% + uniform 8 + EF", {"id": "topk", "ratio": 0.01, "values": {"id": "uniform", "bits": 8}}, True
    ),
    # gcodec's quantized parameter all-gather (ZeRO++ qwZ-style) on top of the reduce-scatter codec
    {**_spec("gcodec uniform 4 + EF, AG u8", {"id": "uniform", "bits": 4}, True), "all_gather": AG8},
]
BASELINE = "FSDP2 reduce_dtype=bf16"


def link_markdown(res: dict[str, Any]) -> str:
    """The --link table: steps to target, step time and time to accuracy per rate, and the ratio
    of each time to accuracy to FSDP2 bf16's."""
    from bench import link

    rates, p = res["rates"], res["workers"]
    base = next(r for r in res["rows"] if r["label"] == BASELINE)
    head = ["contender", "bytes/rank/step", "AG bytes/rank/step", "final acc", "steps to target"]
    reshard = res.get("reshard_after_forward", True)
    head += [f"step ms @ {q}" for q in rates] + [f"TTA @ {q} (vs bf16)" for q in rates]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in res["rows"]:
        cells = [
            r["label"],
            "" if r["bytes_per_step"] is None else f"{r['bytes_per_step'] * (p - 1) / p:,.0f}",
            f"{r['all_gather_bytes_per_step'] * (p - 1):,.0f}"  # the other ranks' payloads
            if r.get("all_gather_bytes_per_step")
            else f"{(2 if reshard else 1) * 4 * res['params'] * (p - 1) / p:,.0f}",  # FSDP's: fp32 shards
            "" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f} %",
            "not reached" if r["steps_to_target"] is None else str(r["steps_to_target"]),
        ]
        cells += ["" if r["rates"][q]["step_ms"] is None else f"{r['rates'][q]['step_ms']:.0f}" for q in rates]
        for q in rates:
            t, b = r["rates"][q]["time_to_target_s"], base["rates"][q]["time_to_target_s"]
            cells.append(link._fmt_s(t) + ("" if t is None or not b else f" ({t / b:.2f}x)"))
        lines.append("| " + " | ".join(cells) + " |")
    best = []
    for q in rates:
        b = base["rates"][q]["time_to_target_s"]
        g = [r for r in res["rows"] if r["hook"] == "fsdp-gcodec" and r["rates"][q]["time_to_target_s"] is not None]
        if g and b:
            w = min(g, key=lambda r: r["rates"][q]["time_to_target_s"])
            t = w["rates"][q]["time_to_target_s"]
            best.append(f"- {q}: best gcodec {w['label']} {t:.1f} s, FSDP2 bf16 {b:.1f} s ({t / b:.2f}x)")
    return (
        f"{res['model']} ({res['params']:,} parameters), FSDP2 (each Linear its own module), "
        f"{res['workers']} gloo ranks, target accuracy {100 * res['target']:.1f} % (FSDP2 fp32's final), "
        f"{res['elapsed_s'] / 60:.1f} min; bytes/rank/step: (p-1)/p of what one rank encodes for the "
        "reduce-scatters (its rows for the other ranks); AG bytes/rank/step: what a rank receives in the "
        "parameter all-gathers (FSDP's: (p-1)/p of the fp32 parameters per all-gather; gcodec's: the "
        "other ranks' payloads)\n\n" + "\n".join(lines) + "\n\n" + "\n".join(best) + "\n"
    )


def _gloo_bytes_rank(rank: int, port: int, out: str) -> None:
    """One rank of --gloo-bytes: bytes through the namespace's loopback per collective."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    n = 4_000_000
    x, y = torch.randn(n), torch.empty(n // 2)

    def lo() -> int:
        return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())

    res = {}
    for name, f in [
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(y, x)),
        ("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(n), x)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(x, y)),
        ("all_reduce", lambda: dist.all_reduce(x)),
    ]:
        dist.barrier()
        b0 = lo()
        f()
        dist.barrier()
        res[name] = lo() - b0
    if rank == 0:
        Path(out).write_text(json.dumps({"input_bytes": 4 * n, "lo_bytes": res}))
    dist.destroy_process_group()


def gloo_bytes_main() -> int:
    """--gloo-bytes: what gloo's collectives really move, counted on a private loopback (root):
    2 ranks, 16 MB of float32 input each."""
    import subprocess
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import link

    out = os.path.join(tempfile.mkdtemp(prefix="fsdp-bytes-"), "bytes.json")
    try:
        with link.namespace("unlimited") as prefix:
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
            cmd = [*prefix, sys.executable, __file__, "--gloo-bytes", "--port", "29533", "--out", out]
            procs = [subprocess.Popen([*cmd, "--rank", str(r)], env=env) for r in range(2)]
            if any(p.wait() for p in procs):
                sys.exit("a rank failed")
    except link.NoNamespace as e:
        print(f"bench/fsdp.py --gloo-bytes: skipped: {e}")
        return 0
    data = json.loads(Path(out).read_text())
    n = data["input_bytes"]
    print(f"2 gloo ranks, {n / 1e6:.0f} MB input each; bytes through the loopback (both ranks, headers included):")
    for name, b in data["lo_bytes"].items():
        print(f"  {name:24} {b / 1e6:8.1f} MB  = {b / n:.2f} x one rank's input")
    return 0


def link_main(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import link

    for q in args.rates:
        if q not in link.RATE_BITS:
            sys.exit(f"unknown rate {q!r}: use {', '.join(link.RATES)}")
    hidden = [256, 256] if args.quick else [2048, 2048]
    contenders = LINK_CONTENDERS[:3] if args.quick else LINK_CONTENDERS
    if args.only:  # a subset (by index); the reference and the bf16 baseline always run
        keep = {0, 1, *(int(i) for i in args.only.split(","))}
        contenders = [c for i, c in enumerate(LINK_CONTENDERS) if i in keep]
    if args.quick:
        args.rates, args.epochs, args.timed_steps = ["unlimited"], 2, 3
    args.workers = args.ranks
    if args.no_reshard:  # ZeRO-2: the parameters stay gathered from forward to backward
        contenders = [{**c, "reshard_after_forward": False} for c in contenders]
    try:
        res = link.run(args, contenders=contenders, hidden=hidden)
    except link.NoNamespace as e:
        print(f"bench/fsdp.py --link: skipped: {e}")
        return 0
    res["load_average"] = os.getloadavg()
    res["reshard_after_forward"] = not args.no_reshard
    md = link_markdown(res)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--params", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--link", action="store_true", help="time to accuracy on an emulated link (root)")
    ap.add_argument("--rates", type=lambda s: s.split(","), default=["100mbit", "1gbit", "unlimited"])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=10, help="--link: FSDP2's own reduce-scatters first")
    ap.add_argument("--timed-steps", type=int, default=6)
    ap.add_argument("--target", type=float, default=None, help="--link: accuracy to reach (default FSDP2 fp32's)")
    ap.add_argument("--quick", action="store_true", help="--link: small MLP, 3 contenders, 2 epochs, no limit")
    ap.add_argument("--accuracy-from", metavar="FILE", help="--link: reuse the accuracy runs of an earlier --json")
    ap.add_argument(
        "--no-reshard", action="store_true", help="--link: reshard_after_forward=False (one all-gather a step)"
    )
    ap.add_argument("--only", metavar="I,J", help="--link: only these contenders (indices), besides fp32 and bf16")
    ap.add_argument("--gloo-bytes", action="store_true", help="count the loopback bytes of gloo's collectives (root)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--markdown", metavar="FILE")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gloo_bytes:
        if args.rank >= 0:
            _gloo_bytes_rank(args.rank, args.port, args.out)
            return
        sys.exit(gloo_bytes_main())
    if args.link:
        sys.exit(link_main(args))
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
    print(
        f"{'contender':30} {'RS bytes/rank/step':>18} {'vs fp32':>8} {'vs bf16':>8} {'AG bytes/rank/step':>18} "
        f"{'step ms':>8} {'vs bf16':>8}"
    )
    for name, r in runs.items():
        print(
            f"{name:30} {r['wire_bytes']:18,.0f} {r['wire_bytes'] / f32['wire_bytes']:8.3f} "
            f"{r['wire_bytes'] / b16['wire_bytes']:8.3f} {r['all_gather_wire_bytes']:18,.0f} "
            f"{1e3 * r['step_s']:8.1f} {r['step_s'] / b16['step_s']:8.2f}"
        )


if __name__ == "__main__":
    main()
