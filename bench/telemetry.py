"""Telemetry benchmarks: what sampling costs, and the norm ratio of each codec on real gradients.

    python bench/telemetry.py overhead  [--numel 262144] [--steps 500]
    python bench/telemetry.py norm-ratio [--steps 60]

``overhead`` runs ``gcodec.mpi.allreduce`` on ``MPI.COMM_SELF`` (the whole transport path: handshake
once, encode, exchange, decode, statistics) for a few codecs with telemetry off and sampling every
100, 10 and 1 steps, in interleaved rounds of 100 steps, and prints the best round per step and the overhead
against "off".

``norm-ratio`` trains the demo's NumPy MLP (hidden layer 512, synthetic classes) with plain SGD and,
at every step, measures each codec at its usual setting on the real gradient of the hidden layer
(24 576 values) and of all weights together, without error feedback and with it (the residual
carried from step to step as ``gcodec.ErrorFeedback`` does). It prints the median norm ratio, the
median cosine and the share of steps below 0.9: the measurement behind the default threshold.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gcodec
from gcodec.telemetry import measure

CODECS = {
    "fp16": {"id": "fp16"},
    "bf16": {"id": "bf16"},
    "uniform 8": {"id": "uniform", "bits": 8},
    "uniform 4": {"id": "uniform", "bits": 4},
    "uniform 2": {"id": "uniform", "bits": 2},
    "qsgd 15": {"id": "qsgd", "levels": 15},
    "terngrad": {"id": "terngrad"},
    "sign": {"id": "sign"},
    "topk 1 %": {"id": "topk", "ratio": 0.01},
    "topk 10 %": {"id": "topk", "ratio": 0.1},
    "randomk 1 %": {"id": "randomk", "ratio": 0.01},
    "powersgd r4": {"id": "powersgd", "rank": 4},
}


def overhead(args: argparse.Namespace) -> dict:
    from mpi4py import MPI

    import gcodec.mpi
    from gcodec.telemetry import Telemetry

    comm = MPI.COMM_SELF
    x = np.random.default_rng(0).standard_normal(args.numel).astype(np.float32)
    out: dict = {"numel": args.numel, "steps": args.steps, "codecs": {}}
    settings = {"off": None, "every 100": 100, "every 10": 10, "every 1": 1}
    for name in ("fp16", "uniform 8", "topk 1 %"):
        cfg = CODECS[name]
        states = {
            s: gcodec.mpi.State(
                cfg, error_feedback=True, telemetry=None if e is None else Telemetry(every=e, warn=False)
            )
            for s, e in settings.items()
        }
        for st in states.values():  # warm-up: compile, handshake, page in
            gcodec.mpi.allreduce(comm, x, cfg, key="w", state=st)
        # Rounds of 100 steps (one sample at "every 100"), interleaved; the best round of each
        # setting counts, so that the noise of a shared machine hits every setting alike.
        times = {s: float("inf") for s in settings}
        for _ in range(max(1, args.steps // 100)):
            for s, st in states.items():
                t0 = time.perf_counter()
                for _ in range(100):
                    gcodec.mpi.allreduce(comm, x, cfg, key="w", state=st)
                times[s] = min(times[s], time.perf_counter() - t0)
        per_step = {s: t / 100 for s, t in times.items()}
        out["codecs"][name] = {
            s: {"step_ms": 1e3 * v, "overhead_pct": 100 * (v / per_step["off"] - 1)} for s, v in per_step.items()
        }
        row = "  ".join(
            f"{s}: {1e3 * v:7.3f} ms ({100 * (v / per_step['off'] - 1):+5.1f} %)" for s, v in per_step.items()
        )
        print(f"{name:<10} {row}", flush=True)
    return out


def norm_ratio(args: argparse.Namespace) -> dict:
    from gcodec.demo.model import MLP, DemoSizes, make_dataset

    sizes = DemoSizes.full()
    xtr, ytr, _, _ = make_dataset(sizes)
    model = MLP(sizes.d_in, 512, sizes.classes)
    rng = np.random.default_rng(7)
    efs = {name: gcodec.ErrorFeedback(cfg) for name, cfg in CODECS.items()}
    rec: dict = {name: {"plain": [], "ef": [], "plain_cos": [], "ef_cos": []} for name in CODECS}
    for step in range(args.steps):
        idx = rng.integers(0, len(ytr), sizes.batch)
        _, grads = model.gradients(xtr[idx], ytr[idx])
        g = grads["fc1.weight"]
        for name, cfg in CODECS.items():
            q = measure(g, cfg, key="fc1", step=step)
            ef = efs[name]
            e = ef.residual("fc1")
            qe = measure(g, cfg, key="fc1", step=step, residual=e)
            ef.encode(g, key="fc1", step=step)  # advance the residual as training with EF would
            if step >= 5:  # past the first steps, where gradients are large and change fast
                rec[name]["plain"].append(q["norm_ratio"])
                rec[name]["plain_cos"].append(q["cosine"])
                rec[name]["ef"].append(qe["norm_ratio"])
                rec[name]["ef_cos"].append(qe["cosine"])
        model.sgd(grads, sizes.lr)
    print(f"{'codec':<13} {'norm ratio':>10} {'cos':>6} {'<0.9':>6}   {'with EF':>8} {'cos':>6} {'<0.9':>6}")
    out = {}
    for name, r in rec.items():
        row = {
            "median_norm_ratio": statistics.median(r["plain"]),
            "median_cosine": statistics.median(r["plain_cos"]),
            "share_below_0_9": float(np.mean(np.array(r["plain"]) < 0.9)),
            "ef_median_norm_ratio": statistics.median(r["ef"]),
            "ef_median_cosine": statistics.median(r["ef_cos"]),
            "ef_share_below_0_9": float(np.mean(np.array(r["ef"]) < 0.9)),
        }
        out[name] = row
        print(
            f"{name:<13} {row['median_norm_ratio']:>10.3f} {row['median_cosine']:>6.3f} "
            f"{100 * row['share_below_0_9']:>5.0f}%   {row['ef_median_norm_ratio']:>8.3f} "
            f"{row['ef_median_cosine']:>6.3f} {100 * row['ef_share_below_0_9']:>5.0f}%"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("overhead")
    p.add_argument("--numel", type=int, default=1 << 18)
    p.add_argument("--steps", type=int, default=500)
    p = sub.add_parser("norm-ratio")
    p.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    res = overhead(args) if args.cmd == "overhead" else norm_ratio(args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
