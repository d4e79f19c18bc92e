"""gcodec's PowerSGD DDP hook against torch's ``powerSGD_hook``: step time, 2 gloo ranks, by thread setting.

    python bench/powersgd_hook.py                                   # mlp and transformer, 1 and default threads
    python bench/powersgd_hook.py --models mlp --threads default --rounds 10
    python bench/powersgd_hook.py --only gcodec --models transformer  # one contender (for py-spy)

Each (model, thread setting) pair runs in two fresh gloo ranks on 127.0.0.1 (``torch.multiprocessing``
spawn), so that a thread setting is the whole process's, as in a job:

* ``1``: ``torch.set_num_threads(1)`` in each rank (what torchrun's ``OMP_NUM_THREADS=1`` gives);
* ``default``: torch's own default (one thread per core in each rank, so two ranks on a 2-core
  machine oversubscribe it), and gcodec's kernels on what the job leaves them (``num_threads=None``).

The contenders, built from the same seed in the same two processes: torch's ``powerSGD_hook``
(``PowerSGDState``: rank 2, error feedback and warm start on, PowerSGD from iteration 2), gcodec's
hook with ``{"id": "powersgd", "rank": 2}`` (error feedback, ``start_iter=2``; tensors too small to
compress and vectors travel dense, as in torch's), and plain DDP (its own allreduce) for scale.
Every model is one DDP bucket by default (``--bucket-mb``): with several, torch's hook launches
its collectives from future callbacks and aborted on gloo here ("Received data size doesn't match
expected size", docs/transports.md, Notes). They take turns, ``--steps`` steps each per round,
``--rounds`` rounds, after a warm-up past both hooks' dense iterations; every step starts after a
barrier, so both ranks time the same step. The printed figure is rank 0's median step (forward,
backward with the hook, SGD step) and the ratio gcodec / torch of the medians; the load average is
printed before and after each pair, since the ratio, not the milliseconds, is what a loaded machine
leaves comparable. Beside each median, the median CPU time of rank 0's process per step (every
thread: the hooks', gloo's, torch's), which a loaded machine disturbs less than wall time.

Models (``--models``):

* ``mlp``: 64-256-256-10 with biases, batch 32, cross-entropy (a digits-sized classifier: three
  compressed matrices, three dense biases);
* ``transformer``: an embedding (512 x 64), 4 ``nn.TransformerEncoderLayer`` (d 64, 4 heads,
  feed-forward 256, no dropout), mean pooling and a 10-way head; batch 8 x 32 tokens (0.23 M
  parameters: 18 compressed matrices, 33 dense vectors);
* ``cnn``: torch's MNIST example network (two 3x3 convolutions, 9216-128-10; 4-D kernels compressed
  as m x (c k k)), batch 32 of 28 x 28.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

CONTENDERS = ("ddp", "torch", "gcodec")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _model(name: str) -> tuple[Any, Any, Any]:
    """(model, input, target) of ``name``, parameters from seed 0, data from the rank's seed."""
    import torch
    import torch.nn as nn

    if name == "mlp":
        m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        return m, (32, 64), None
    if name == "transformer":

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.Embedding(512, 64)
                layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
                self.enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
                self.head = nn.Linear(64, 10)

            def forward(self, x: Any) -> Any:
                return self.head(self.enc(self.emb(x)).mean(dim=1))

        return Net(), (8, 32), 512
    if name == "cnn":

        class Cnn(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.c1 = nn.Conv2d(1, 32, 3)
                self.c2 = nn.Conv2d(32, 64, 3)
                self.f1 = nn.Linear(9216, 128)
                self.f2 = nn.Linear(128, 10)

            def forward(self, x: Any) -> Any:
                x = torch.relu(self.c2(torch.relu(self.c1(x))))
                x = torch.flatten(torch.max_pool2d(x, 2), 1)
                return self.f2(torch.relu(self.f1(x)))

        return Cnn(), (32, 1, 28, 28), None
    raise SystemExit(f"unknown model {name!r}")


def _rank(rank: int, port: int, args: argparse.Namespace, model_name: str, threads: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gcodec.torch

    if threads != "default":
        torch.set_num_threads(int(threads))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(rank)
    _, shape, vocab = _model(model_name)
    x = torch.randint(0, vocab, shape, generator=g) if vocab else torch.randn(*shape, generator=g)
    y = torch.randint(0, 10, (shape[0],), generator=g)
    kw = {} if args.bucket_mb is None else {"bucket_cap_mb": args.bucket_mb}

    contenders: dict[str, tuple[Any, Any, Any]] = {}
    for name in CONTENDERS:
        if args.only and name not in args.only.split(","):
            continue
        torch.manual_seed(0)
        model = _model(model_name)[0]
        ddp = DDP(model, **kw)
        state: Any = None
        if name == "torch":
            state = P.PowerSGDState(
                None,
                matrix_approximation_rank=args.rank,
                start_powerSGD_iter=2,
                use_error_feedback=True,
                warm_start=True,
            )
            ddp.register_comm_hook(state, P.powerSGD_hook)
        elif name == "gcodec":
            state = gcodec.torch.HookState({"id": "powersgd", "rank": args.rank}, start_iter=2, module=model)
            ddp.register_comm_hook(state, gcodec.torch.comm_hook)
        contenders[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), state)

    cpu: dict[str, list[float]] = {n: [] for n in contenders}

    def steps(name: str, n: int) -> list[float]:
        ddp, opt, _ = contenders[name]
        ts = []
        for _ in range(n):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            ts.append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        return ts

    for name in contenders:  # past both hooks' dense iterations, DDP's bucket rebuild, kernel loads
        steps(name, 6)
    for _, _, st in contenders.values():
        if hasattr(st, "reports"):
            st.reports.reset()
    for v in cpu.values():
        v.clear()
    times: dict[str, list[float]] = {n: [] for n in contenders}
    for _ in range(args.rounds):
        for name in contenders:
            times[name] += steps(name, args.steps)
    if rank == 0:
        res: dict[str, Any] = {"median_ms": {n: 1e3 * statistics.median(t) for n, t in times.items()}}
        res["cpu_ms"] = {n: 1e3 * statistics.median(t) for n, t in cpu.items()}
        buckets = {"torch": lambda st: len(st.p_memory_dict), "gcodec": lambda st: len(st.router.plans)}
        res["buckets"] = {n: buckets[n](c[2]) for n, c in contenders.items() if n in buckets}
        st = contenders.get("gcodec", (None, None, None))[2]
        if st is not None:
            rep = st.step_report()
            k = max(1, rep["steps"])
            res["parts_ms"] = {
                f: 1e3 * rep["total"][f] / k for f in ("encode_s", "comm_s", "decode_s", "overhead_s", "held_s")
            }
        res["params"] = sum(p.numel() for p in next(iter(contenders.values()))[0].parameters())
        res["torch_threads"] = torch.get_num_threads()
        res["gcodec_threads"] = None if st is None else [s.threads for s in st.router.states.values()]
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def run_pair(args: argparse.Namespace, model: str, threads: str) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(), "psgd.json")
    before = _load()
    mp.spawn(_rank, args=(port, args, model, threads, out), nprocs=2)
    with open(out) as f:
        res = json.load(f)
    res["load"] = f"{before} -> {_load()}"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,transformer", help="comma-separated: mlp, transformer, cnn")
    ap.add_argument(
        "--threads", default="1,default", help="comma-separated torch thread settings: a number or 'default'"
    )
    ap.add_argument("--steps", type=int, default=20, help="steps per contender per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--rank", type=int, default=2, help="PowerSGD's rank (both hooks)")
    ap.add_argument(
        "--bucket-mb",
        type=float,
        default=1024,
        help="DDP's bucket_cap_mb (default: one bucket; torch's hook can abort on gloo with several)",
    )
    ap.add_argument("--only", default="", help="comma-separated contenders to run (ddp, torch, gcodec)")
    ap.add_argument("--json", default=None, help="also write every result to this file")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(
        f"PowerSGD r{args.rank} DDP step, 2 gloo ranks on 127.0.0.1, {os.cpu_count()} cores; rank 0's median of "
        f"{args.rounds} x {args.steps} interleaved steps"
    )
    results = []
    for model in args.models.split(","):
        for threads in args.threads.split(","):
            res = run_pair(args, model, threads)
            med = res["median_ms"]
            ratio = med["gcodec"] / med["torch"] if {"gcodec", "torch"} <= med.keys() else float("nan")
            cells = "  ".join(f"{n} {t:7.2f} ms (cpu {res['cpu_ms'][n]:.2f})" for n, t in med.items())
            print(
                f"{model:12s} threads {threads:8s} ({res['params'] / 1e6:.2f} M params)  {cells}  "
                f"gcodec/torch {ratio:.3f}  load {res['load']}",
                flush=True,
            )
            if "parts_ms" in res:
                e, c, d, o, h = res["parts_ms"].values()
                print(
                    f"{'':12s} gcodec hook per step (ms): encode {e:.2f} + comm {c:.2f} + decode {d:.2f} + "
                    f"overhead {o:.2f} = held {h:.2f}; buckets {res['buckets']}; threads torch "
                    f"{res['torch_threads']} gcodec {res['gcodec_threads']}",
                    flush=True,
                )
            results.append({"model": model, "threads": threads, "ratio": ratio, **res})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
