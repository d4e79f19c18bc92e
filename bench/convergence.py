"""Convergence study: every codec at its usual setting, with and without error feedback, several seeds.

    python bench/convergence.py                       # 3 seeds, 12 epochs (~10 min on 2 busy cores)
    python bench/convergence.py --quick               # 1 seed, 2 epochs, 2 codecs: a smoke run
    python bench/convergence.py --seeds 5 --epochs 20 --markdown docs/convergence.md --plot docs/convergence.png

The training is the demo's (``gcodec demo``): the MLP 64-256-256-10 on the bundled UCI digits, 2 real
worker processes (DDP over gloo with ``gcodec.torch.comm_hook``), plain SGD with a cosine learning
rate, compression from step 10, tensors under 1024 elements dense. One job per seed trains every
run of :data:`RUNS` from the seed's initial weights and batch order (the train/test split stays
fixed), so the runs of one seed differ only by their codec.

Reports final test accuracy (mean, and min..max over seeds) against the uncompressed baseline of
the same seeds, the per-seed gap's mean, and the training-loss curves (mean over seeds) as a PNG.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gcodec.demo.launch import run_job  # noqa: E402
from gcodec.demo.runs import Settings, run_spec  # noqa: E402

#: (name, codec config) at their usual settings; each runs with and without error feedback
CODECS: list[tuple[str, dict[str, Any]]] = [
    ("fp16", {"id": "fp16"}),
    ("uniform 8", {"id": "uniform", "bits": 8}),
    ("uniform 4", {"id": "uniform", "bits": 4}),
    ("uniform 2", {"id": "uniform", "bits": 2}),
    ("qsgd s=15", {"id": "qsgd"}),
    ("terngrad", {"id": "terngrad"}),
    ("sign", {"id": "sign"}),
    ("top-k 1%", {"id": "topk", "ratio": 0.01}),
    ("random-k 10%", {"id": "randomk", "ratio": 0.1}),
    ("powersgd r2", {"id": "powersgd", "rank": 2}),
    ("top-k 1% + uniform 8", {"id": "topk", "ratio": 0.01, "values": {"id": "uniform", "bits": 8}}),
    ("fp8 e4m3", {"id": "fp8"}),
    ("mxfp4", {"id": "mx"}),
    ("nvfp4", {"id": "nvfp4"}),
]


def specs(quick: bool) -> list[dict[str, Any]]:
    out = [run_spec("uncompressed", None, False)]
    for name, cfg in CODECS[:2] if quick else CODECS:
        out.append(run_spec(name, cfg, False))
        out.append(run_spec(name + " + EF", cfg, True))
    return out


def run(seeds: int, epochs: int, quick: bool, workers: int = 2) -> dict[str, Any]:
    jobs = []
    t0 = time.perf_counter()
    for seed in range(seeds):
        s = Settings(epochs=epochs, seed=seed, evals_per_epoch=2)
        print(f"seed {seed}: {len(specs(quick))} runs, {epochs} epochs ...", file=sys.stderr, flush=True)
        res = run_job(specs(quick), s, workers, split_seed=0)
        jobs.append({"seed": seed, "settings": s.to_dict(), "runs": res["runs"]})
    return {"workers": workers, "seeds": seeds, "epochs": epochs, "elapsed_s": time.perf_counter() - t0, "jobs": jobs}


def summarise(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run label: accuracy over seeds and the gap to the same seeds' baseline."""
    labels = [r["label"] for r in result["jobs"][0]["runs"]]
    rows = []
    for label in labels:
        accs, gaps, bits, failed = [], [], [], []
        for job in result["jobs"]:
            runs = {r["label"]: r for r in job["runs"]}
            r, base = runs[label], runs["uncompressed"]
            if not r.get("ok"):
                failed.append(r.get("error"))
                continue
            accs.append(r["accuracy"])
            gaps.append(r["accuracy"] - base["accuracy"])
            bits.append(r["bits_per_element"])
        rows.append(
            {
                "label": label,
                "error_feedback": label.endswith("+ EF"),
                "bits_per_element": statistics.mean(bits) if bits else None,
                "accuracy_mean": statistics.mean(accs) if accs else None,
                "accuracy_min": min(accs) if accs else None,
                "accuracy_max": max(accs) if accs else None,
                "accuracy_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                "gap_mean": statistics.mean(gaps) if gaps else None,
                "gap_min": min(gaps) if gaps else None,
                "within_1pt": bool(gaps) and statistics.mean(gaps) >= -0.01,
                "failed": failed,
            }
        )
    return rows


def markdown(result: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    s = result["jobs"][0]["settings"]
    lines = [
        "| run | bits/el | test accuracy, mean (min..max) | vs uncompressed, mean (worst seed) | within 1 pt |",
        "|---|---:|---:|---:|:---:|",
    ]
    for r in rows:
        if r["accuracy_mean"] is None:
            lines.append(f"| {r['label']} | | failed: {r['failed'][0]} | | |")
            continue
        gap = "" if r["label"] == "uncompressed" else f"{100 * r['gap_mean']:+.2f} pt ({100 * r['gap_min']:+.2f})"
        ok = "" if r["label"] == "uncompressed" else ("yes" if r["within_1pt"] else "**no**")
        lines.append(
            f"| {r['label']} | {r['bits_per_element']:.2f} | {100 * r['accuracy_mean']:.2f} % "
            f"({100 * r['accuracy_min']:.1f}..{100 * r['accuracy_max']:.1f}) | {gap} | {ok} |"
        )
    head = (
        f"{result['seeds']} seeds x {len(rows)} runs, {result['epochs']} epochs of {s['batch']}x{result['workers']} "
        f"per step, {result['workers']} gloo workers, {result['elapsed_s'] / 60:.1f} min"
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'gcodec[bench]')"
    labels = [r["label"] for r in result["jobs"][0]["runs"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), dpi=100, sharey=True)
    colors = plt.get_cmap("tab20")
    for ax, ef in zip(axes, (False, True)):
        for label in labels:
            if label != "uncompressed" and label.endswith("+ EF") != ef:
                continue
            curves = [next(r for r in job["runs"] if r["label"] == label).get("curve") for job in result["jobs"]]
            curves = [c for c in curves if c]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            x = [curves[0][i]["epoch"] for i in range(n)]
            y = [statistics.mean(c[i]["train_loss"] for c in curves) for i in range(n)]
            if label == "uncompressed":
                ax.plot(x, y, "k--", label=label, lw=2.0, zorder=10)
            else:
                ax.plot(x, y, label=label, lw=1.2, color=colors(len(ax.lines) % 20))
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title("with error feedback" if ef else "without error feedback")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"training loss (mean over {result['seeds']} seeds)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1 seed, 2 epochs, 2 codecs")
    ap.add_argument("--json", metavar="FILE", help="write every run of every seed")
    ap.add_argument("--markdown", metavar="FILE", help="write the table (Markdown)")
    ap.add_argument("--plot", metavar="FILE", help="write the training-loss curves (PNG)")
    ap.add_argument("--from-json", metavar="FILE", help="re-make the table and plot from an earlier --json")
    args = ap.parse_args(argv)
    seeds, epochs = (1, 2) if args.quick else (args.seeds, args.epochs)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        result = run(seeds, epochs, args.quick, args.workers)
    rows = summarise(result)
    result["summary"] = rows
    md = markdown(result, rows)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    if args.plot:
        why = plot(result, args.plot)
        print(why or f"loss curves: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
