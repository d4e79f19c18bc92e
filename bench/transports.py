"""Transport benchmarks: DDP hook step time against torch's hooks, and bytes per rank by mode.

    python bench/transports.py ddp   [--params 4] [--steps 30]    # 2 gloo ranks on loopback
    python bench/transports.py ddp --model link                   # bench/link.py's MLP (biases dense)
    python bench/transports.py ddp --model deep                   # 16 layers of 256 x 256: many tensors
    mpiexec -n 4 python bench/transports.py bytes [--numel 1048576]

``ddp`` trains an MLP of about ``--params`` million parameters with 2 gloo ranks on 127.0.0.1 and
reports the best-of median step time (forward, backward with the hook, optimizer step) of: no
hook, torch's ``fp16_compress_hook``, gcodec ``fp16``, torch's ``powerSGD_hook`` (rank 2) and gcodec
``powersgd`` rank 2 (both with one bucket and 2 warm-up steps; timed after warm-up), gcodec top-k
1 % and sign, both with error feedback (no torch counterpart), and gcodec's
hook on its all-dense path (every step a warm-up step: the plain average, as the adaptive
controller's "none" rung sends it), whose ratio to no hook is the hook's own cost. Every contender
runs in the same processes, interleaved round by round, so machine noise hits all alike. One
bucket by default; ``--bucket-mb`` sets DDP's ``bucket_cap_mb`` (several buckets, where torch's
PowerSGD hook may fail on gloo), ``--only dense,adaptive`` runs a subset beside plain DDP.

``bytes`` runs ``gcodec.mpi.allreduce`` in gather and two-phase mode for a few codecs and prints the
bytes each rank received (from the transports' statistics), against one payload and against
2 (p-1)/p of a payload.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

#: The ``ddp`` contenders, in the order they run each round.
CONTENDERS = (
    "none",
    "gcodec dense",
    "gcodec adaptive",
    "torch fp16",
    "gcodec fp16",
    "torch powerSGD r2",
    "gcodec powersgd r2",
    "gcodec topk 1%",
    "gcodec sign",
)


#: The ratios ``ddp`` prints (where both contenders ran).
RATIOS = (
    ("gcodec dense", "none"),
    ("gcodec adaptive", "none"),
    ("gcodec fp16", "torch fp16"),
    ("gcodec powersgd r2", "torch powerSGD r2"),
)

#: the step report's parts that add up (encode + comm + decode + overhead = held), as printed
PARTS = ("encode_s", "comm_s", "decode_s", "overhead_s", "held_s")


def _ddp_rank(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gcodec.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    width = int((args.params * 1e6 / 3) ** 0.5)

    def make_model() -> torch.nn.Module:
        if args.model == "link":  # bench/link.py's MLP: biases, a 10-wide head, DDP's default buckets
            return torch.nn.Sequential(
                torch.nn.Linear(64, 2048),
                torch.nn.ReLU(),
                torch.nn.Linear(2048, 2048),
                torch.nn.ReLU(),
                torch.nn.Linear(2048, 10),
            )
        if args.model == "deep":  # many tensors in one bucket: 16 weights of 256 x 256, 16 biases
            return torch.nn.Sequential(*[m for _ in range(16) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())])
        return torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
        )

    from gcodec.adaptive import AdaptiveController

    def hook_for(name: str, model: torch.nn.Module) -> tuple[Any, Any]:
        """The contender's (hook, state); (None, None) for DDP's own allreduce."""
        if name == "torch fp16":
            return default_hooks.fp16_compress_hook, None
        if name == "torch powerSGD r2":
            return powerSGD_hook.powerSGD_hook, powerSGD_hook.PowerSGDState(
                None, matrix_approximation_rank=2, start_powerSGD_iter=2
            )
        # module=: each state watches its own model's optimizer (HookNotCalledWarning), not the
        # other contenders' steps that run before its first bucket
        hook_state = {
            "none": None,
            "gcodec fp16": lambda: gcodec.torch.HookState("fp16", start_iter=0, error_feedback=False, module=model),
            # never past its warm-up: every bucket averaged dense
            "gcodec dense": lambda: gcodec.torch.HookState("fp16", start_iter=1 << 62, module=model),
            # bench/link.py's controller: 2 fp16 steps, then its rungs (dense where that pays)
            "gcodec adaptive": lambda: gcodec.torch.HookState(
                "fp16",
                start_iter=2,
                warmup_codec="fp16",
                controller=AdaptiveController(start=1, interval=10, warmup_steps=2),
                module=model,
            ),
            "gcodec powersgd r2": lambda: gcodec.torch.HookState(
                {"id": "powersgd", "rank": 2}, start_iter=2, module=model
            ),
            # with error feedback; a tensor whose size is not a multiple of the codec's unit (top-k:
            # every tensor; sign: 256) is encoded on its own (gcodec.transports.shares_flat_group)
            "gcodec topk 1%": lambda: gcodec.torch.HookState({"id": "topk", "ratio": 0.01}, start_iter=2, module=model),
            "gcodec sign": lambda: gcodec.torch.HookState("sign", start_iter=2, module=model),
        }[name]
        return (None, None) if hook_state is None else (gcodec.torch.comm_hook, hook_state())

    contenders = {}
    for name in CONTENDERS:
        if args.only and name != "none" and not any(w in name for w in args.only.split(",")):
            continue
        torch.manual_seed(0)
        model = make_model()
        # one bucket by default: torch's PowerSGD hook needs it on gloo
        ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
        hook, hook_state = hook_for(name, model)
        if hook is not None:
            ddp.register_comm_hook(hook_state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        shape = {"link": (32, 64), "deep": (64, 256)}.get(args.model, (64, width))
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(rank))
        contenders[name] = (ddp, opt, x, hook_state)

    def step(name: str) -> float:
        ddp, opt, x, _ = contenders[name]
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        return time.perf_counter() - t0

    for name in contenders:  # warm-up: compile, rebuild buckets, PowerSGD's warm-up steps
        for _ in range(4):
            step(name)
    for _, _, _, st in contenders.values():  # the step reports count the timed steps only
        if hasattr(st, "reports"):
            st.reports.reset()
    times: dict[str, list[float]] = {n: [] for n in contenders}
    for _ in range(args.steps):
        for name in contenders:
            times[name].append(step(name))
    rungs: dict = {}  # what the adaptive controller ran, per bucket, at the end, and its moves
    switches: list = []
    if "gcodec adaptive" in contenders:
        router = contenders["gcodec adaptive"][3].router
        rungs = dict(router.current)

        def cid(c: Any) -> str:
            return c if isinstance(c, str) else c["id"]

        switches = [[step, key, cid(old), cid(new)] for key, step, old, new in router.switches]
    # where gcodec's hooks spent each step, per contender: the step report's totals over its steps
    parts = {}
    for name, (_, _, _, st) in contenders.items():
        if hasattr(st, "step_report"):
            rep = st.step_report()
            k = max(1, rep["steps"])
            parts[name] = {f: rep["total"][f] / k for f in PARTS}
    if rank == 0:
        res = {
            "parts": parts,
            "params": sum(p.numel() for p in contenders["none"][0].parameters()),
            "median_s": {n: statistics.median(t) for n, t in times.items()},
            "min_s": {n: min(t) for n, t in times.items()},
            "rungs": rungs,
            "switches": switches,
        }
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def ddp(args: argparse.Namespace) -> None:
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "ddp.json")
    mp.spawn(_ddp_rank, args=(port, args, out), nprocs=2)
    with open(out) as f:
        res = json.load(f)
    med = res["median_s"]
    print(f"DDP step time, 2 gloo ranks on loopback, {res['params'] / 1e6:.2f} M parameters, median of {args.steps}")
    for n, t in med.items():
        print(f"  {n:20s} {1e3 * t:8.1f} ms   (min {1e3 * res['min_s'][n]:.1f} ms)")
    for a, b in RATIOS:
        if a in med and b in med:
            print(f"  {a + ' / ' + b + ':':40s} {med[a] / med[b]:.3f}")
    if res["parts"]:
        print("  rank 0's hook per timed step (mean ms): encode, comm, decode, overhead = held")
        for n, v in res["parts"].items():
            e, c, d, o, h = (1e3 * v[f] for f in PARTS)
            print(f"    {n:20s} {e:6.2f} + {c:6.2f} + {d:6.2f} + {o:6.2f} = {h:6.2f}")
    if res["rungs"]:
        print(f"  the adaptive controller's last rungs: {res['rungs']}")
        moves = ", ".join(f"step {st} {k.split(':')[1].split('..')[0]}: {a} -> {b}" for st, k, a, b in res["switches"])
        print(f"  its moves (bucket by first parameter): {moves or 'none'}")


def nbytes(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    import gcodec
    import gcodec.mpi

    comm = MPI.COMM_WORLD
    p = comm.size
    x = np.random.default_rng(comm.rank).standard_normal(args.numel).astype(np.float32)
    rows = []
    for cfg in ({"id": "uniform", "bits": 8}, {"id": "uniform", "bits": 4}, {"id": "topk", "ratio": 0.01}):
        payload = len(gcodec.get_codec(cfg).encode(x))
        for mode in ("gather", "two_phase"):
            st = gcodec.mpi.State(cfg, error_feedback=False)
            for _ in range(2):
                gcodec.mpi.allreduce(comm, x, st.codec, key="b", state=st, mode=mode)
            recv = comm.allreduce(st.stats()["b"]["wire_bytes"], op=MPI.MAX)
            rows.append((cfg, mode, payload, recv))
    if comm.rank == 0:
        print(f"bytes received per rank (max over ranks), p = {p}, {args.numel} float32 elements")
        for cfg, mode, payload, recv in rows:
            print(
                f"  {json.dumps(cfg):38s} {mode:10s} payload {payload:9d}  received {recv:9d}"
                f"  = {recv / payload:.3f} payloads  ({recv / (2 * (p - 1) / p * payload):.3f} x 2(p-1)/p)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["ddp", "bytes"])
    ap.add_argument("--params", type=float, default=4.0, help="million parameters of the DDP model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--model",
        choices=["square", "link", "deep"],
        default="square",
        help="square: three --params Linear layers; link: bench/link.py's MLP 64-2048-2048-10 (small dense tensors); "
        "deep: 16 Linear layers 256-256 (many tensors in one bucket)",
    )
    ap.add_argument(
        "--bucket-mb", type=float, default=1024, help="DDP's bucket_cap_mb (torch's PowerSGD hook needs one bucket)"
    )
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated substrings: run only the ddp contenders whose names contain one (and 'none')",
    )
    ap.add_argument("--numel", type=int, default=1 << 20)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ddp(args) if args.what == "ddp" else nbytes(args)


if __name__ == "__main__":
    main()
