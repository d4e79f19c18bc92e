"""Convergence study: every codec at its usual setting, with and without error feedback, several seeds.

    python bench/convergence.py                       # 3 seeds, 12 epochs (~10 min on 2 busy cores)
    python bench/convergence.py --quick               # 1 seed, 2 epochs, 2 codecs: a smoke run
    python bench/convergence.py --seeds 5 --epochs 20 --markdown docs/convergence.md --plot docs/convergence.png
    python bench/convergence.py --workload lm         # the language model under AdamW (below)
    python bench/convergence.py --diagnose            # why top-k and PowerSGD lose there: per tensor

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
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gcodec.demo.launch import run_job  # noqa: E402
from gcodec.demo.runs import LMSettings, Settings, lm_spec, run_spec  # noqa: E402

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


# ---- the dense warm-up (--warmup-study) ------------------------------------------------------------

#: The biased codecs (and uniform 4) whose error feedback the warm-up study starts at step 0 and
#: after the 10 dense steps that were HookState's default; PowerSGD's first step starts from the
#: spec's random Q (a compressed start: nothing dense). PowerSGD with 16-bit factors runs from
#: step 0 only (the bytes it saves are measured against the float32 factors at the same steps).
WARMUP_CODECS: list[tuple[str, dict[str, Any]]] = [
    ("sign", {"id": "sign"}),
    ("top-k 1%", {"id": "topk", "ratio": 0.01}),
    ("powersgd r2", {"id": "powersgd", "rank": 2}),
    ("uniform 4", {"id": "uniform", "bits": 4}),
]
FACTOR_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("powersgd r2, fp16 factors", {"id": "powersgd", "rank": 2, "factors": "fp16"}),
    ("powersgd r2, bf16 factors", {"id": "powersgd", "rank": 2, "factors": "bf16"}),
]
#: the dense warm-up the study compares against (HookState's default until it became 0)
OLD_START = 10


def warmup_runs(lm: bool, factors: bool = True) -> list[dict[str, Any]]:
    """The runs of one warm-up study job: the uncompressed baseline, then each codec of
    :data:`WARMUP_CODECS` with error feedback after ``OLD_START`` dense steps and from step 0, and
    (``factors``) PowerSGD's 16-bit factors from step 0."""

    def spec(label: str, cfg: dict[str, Any], start: int) -> dict[str, Any]:
        base = lm_spec(label, "ddp-gcodec", cfg, True) if lm else run_spec(label, cfg, True)
        return {**base, "start_iter": start}

    out = [lm_spec("uncompressed", "ddp") if lm else run_spec("uncompressed", None, False)]
    for name, cfg in WARMUP_CODECS:
        out.append(spec(f"{name} + EF, dense {OLD_START}", cfg, OLD_START))
        out.append(spec(f"{name} + EF, from step 0", cfg, 0))
    if factors:  # the LM (minutes a run on 2 cores) runs the bf16 factors only
        out += [spec(f"{name} + EF, from step 0", cfg, 0) for name, cfg in (FACTOR_RUNS[1:] if lm else FACTOR_RUNS)]
    return out


def run_warmup(
    seeds: int, lm: bool, epochs: int, steps: int, workers: int = 2, factors: bool = True, first_seed: int = 0
) -> dict[str, Any]:
    """One job per seed of :func:`warmup_runs`; the MLP at ``epochs``, the LM (demo size, the
    nanoGPT recipe of :func:`lm_settings`) at ``steps``."""
    jobs = []
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    runs = warmup_runs(lm, factors)
    for seed in range(first_seed, first_seed + seeds):
        print(f"seed {seed}: {len(runs)} runs ...", file=sys.stderr, flush=True)
        t1 = time.perf_counter()
        if lm:
            s: Any = lm_settings("demo", seed, steps)
            res = run_job(runs, s, workers, module="gcodec.demo.lm_worker", timeout_s=4 * 3600)
        else:
            s = Settings(epochs=epochs, seed=seed, evals_per_epoch=2)
            res = run_job(runs, s, workers, split_seed=0)
        elapsed = time.perf_counter() - t1
        jobs.append({"size": "demo", "seed": seed, "settings": s.to_dict(), "runs": res["runs"], "elapsed_s": elapsed})
        print(f"  {time.perf_counter() - t1:.0f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    return {
        "workload": "lm" if lm else "mlp",
        "study": "warmup",
        "workers": workers,
        "seeds": seeds,
        "sizes": ["demo"],
        "epochs": epochs,
        "steps": steps,
        "elapsed_s": time.perf_counter() - t0,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "load": [load0, os.getloadavg()[0]],
        "jobs": jobs,
    }


# ---- the language model under AdamW (--workload lm) ---------------------------------------------

#: Model sizes: the demo's (``gcodec demo --workload lm``: 437,760 parameters) and a nanoGPT-style
#: one of 834,304 (twice the layers), both byte-level with a context of 64 and tied embeddings.
LM_SIZES: dict[str, dict[str, int]] = {
    "demo": {"d_model": 128, "layers": 2, "heads": 4},
    "nanogpt": {"d_model": 128, "layers": 4, "heads": 4},
}
U4 = {"id": "uniform", "bits": 4}
TOPK = {"id": "topk", "ratio": 0.01}
PSGD = {"id": "powersgd", "rank": 2}


#: The remedies for top-k and PowerSGD under AdamW that the study measured on the same seeds
#: (docs/convergence.md, "The language model under AdamW"): a better-served embedding, 1-bit
#: Adam's frozen second moment after a dense warm-up, and the budget each needs.
FREEZE_AT = 60


def lm_remedies() -> list[dict[str, Any]]:
    return [
        # rank 4, and the tied embedding (also the output layer, where rank 2 loses most of
        # AdamW's step) quantized instead of factorised
        {
            **lm_spec("powersgd r4 + EF, embedding uniform 4", "ddp-gcodec", {"id": "powersgd", "rank": 4}, True),
            "policy": {"tok.weight": U4},
        },
        # 1-bit Adam (Tang et al. 2021): dense AdamW for the first fifth, then v frozen, so the
        # step is linear in the gradient and what error feedback repays late is not renormalised
        {
            **lm_spec(f"top-k 1% + EF, v frozen at {FREEZE_AT}", "ddp-gcodec", TOPK, True),
            "optimizer": "adamw-frozen",
            "freeze_at": FREEZE_AT,
            "start_iter": FREEZE_AT,
        },
        # the rank at which PowerSGD comes near the baseline
        lm_spec("powersgd r16 + EF", "ddp-gcodec", {"id": "powersgd", "rank": 16}, True),
    ]


def lm_runs(quick: bool = False, remedies: bool = True) -> list[dict[str, Any]]:
    """The LM runs of one job: the baseline, the three codecs with error feedback as the hook runs
    them by default, and (``remedies``) :func:`lm_remedies`."""
    runs = [
        lm_spec("uncompressed", "ddp"),
        lm_spec("uniform 4 + EF", "ddp-gcodec", U4, True),
        lm_spec("top-k 1% + EF", "ddp-gcodec", TOPK, True),
        lm_spec("powersgd r2 + EF", "ddp-gcodec", PSGD, True),
    ]
    if quick:
        return runs[:2]
    return runs + (lm_remedies() if remedies else [])


def lm_settings(size: str, seed: int, steps: int, quick: bool = False) -> LMSettings:
    """nanoGPT-like training of one size: AdamW (betas 0.9, 0.95, weight decay 0.1), lr 3e-3 with
    a linear warm-up of 20 steps and a cosine to 3e-4, gradient clipping at 1.0, batch 16 x 64
    bytes per worker; the hook's defaults (10 dense steps, tensors under 1024 elements dense)."""
    if quick:
        return dataclasses.replace(LMSettings.quick(), seed=seed, grad_clip=1.0)
    return LMSettings(
        **LM_SIZES[size],
        context=64,
        batch=16,
        steps=steps,
        lr=3e-3,
        warmup=20,
        eval_every=50,
        val_windows=256,
        seed=seed,
        start_iter=10,
        min_numel=1024,
        grad_clip=1.0,
        timeout_s=600.0,
    )


def run_lm(
    seeds: int,
    sizes: list[str],
    steps: int,
    quick: bool,
    workers: int = 2,
    remedies: tuple[str, ...] = ("demo",),
    first_seed: int = 0,
) -> dict[str, Any]:
    """One job per (size, seed): every run of :func:`lm_runs` (the remedies for the sizes in
    ``remedies`` only) from the seed's initial weights and batches, on ``workers`` gloo processes
    with DDP and the hook."""
    jobs = []
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for size in sizes:
        for seed in range(first_seed, first_seed + seeds):
            s = lm_settings(size, seed, steps, quick)
            runs = lm_runs(quick, size in remedies)
            print(f"{size} seed {seed}: {len(runs)} runs, {s.steps} steps ...", file=sys.stderr, flush=True)
            t1 = time.perf_counter()
            res = run_job(runs, s, workers, module="gcodec.demo.lm_worker", timeout_s=4 * 3600)
            jobs.append(
                {
                    "size": size,
                    "seed": seed,
                    "settings": s.to_dict(),
                    "corpus": res["corpus"],
                    "runs": res["runs"],
                    "elapsed_s": time.perf_counter() - t1,
                }
            )
    return {
        "workload": "lm",
        "workers": workers,
        "seeds": seeds,
        "sizes": sizes,
        "steps": jobs[0]["settings"]["steps"] if jobs else steps,
        "elapsed_s": time.perf_counter() - t0,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        # the 1-minute load average when the study started and ended (a shared machine)
        "load": [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "jobs": jobs,
    }


def summarise_lm(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (size, run label): validation loss over seeds and its gap to the same seeds'
    uncompressed run, in % (mean, and the worst seed)."""
    rows = []
    for size in result["sizes"]:
        jobs = [j for j in result["jobs"] if j["size"] == size]
        for label in [r["label"] for r in jobs[0]["runs"]]:
            losses, gaps, bits, failed, params = [], [], [], [], 0
            for job in jobs:
                runs = {r["label"]: r for r in job["runs"]}
                r, base = runs[label], runs["uncompressed"]
                if not r.get("ok") or not base.get("ok"):
                    failed.append(r.get("error") or base.get("error"))
                    continue
                params = r["params"]
                losses.append(r["val_loss"])
                gaps.append(r["val_loss"] / base["val_loss"] - 1.0)
                bits.append(r["bits_per_element"])
            rows.append(
                {
                    "size": size,
                    "label": label,
                    "params": params,
                    "bits_per_element": statistics.mean(bits) if bits else None,
                    "val_loss_mean": statistics.mean(losses) if losses else None,
                    "val_loss_min": min(losses) if losses else None,
                    "val_loss_max": max(losses) if losses else None,
                    "gap_mean": statistics.mean(gaps) if gaps else None,
                    "gap_worst": max(gaps) if gaps else None,
                    "within_1pct": bool(gaps) and max(gaps) <= 0.01,
                    "failed": failed,
                }
            )
    return rows


def markdown_lm(result: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    s = result["jobs"][0]["settings"]
    out = [
        f"{result['seeds']} seeds, {result['steps']} steps of {s['batch']}x{s['context']} bytes x {result['workers']} "
        f"gloo workers (DDP + gcodec.torch.comm_hook), AdamW lr {s['lr']} (warm-up {s['warmup']}, cosine), "
        f"clip {s['grad_clip']}; {result['elapsed_s'] / 60:.0f} min on {result['machine']}, {result['date']}",
        "",
    ]
    for size in result["sizes"]:
        mine = [r for r in rows if r["size"] == size]
        params = next((r["params"] for r in mine if r["params"]), 0)
        dims = next(j["settings"] for j in result["jobs"] if j["size"] == size)
        out += [
            f"**{size}** ({dims['layers']} layers x {dims['d_model']}, {params:,} parameters)",
            "",
            "| run | bits/el | val loss, mean (min..max) | vs uncompressed, mean (worst seed) | within 1 % |",
            "|---|---:|---:|---:|:---:|",
        ]
        for r in mine:
            if r["val_loss_mean"] is None:
                out.append(f"| {r['label']} | | failed: {r['failed'][0]} | | |")
                continue
            base = r["label"] == "uncompressed"
            gap = "" if base else f"{100 * r['gap_mean']:+.2f} % ({100 * r['gap_worst']:+.2f} %)"
            ok = "" if base else ("yes" if r["within_1pct"] else "**no**")
            out.append(
                f"| {r['label']} | {r['bits_per_element']:.2f} | {r['val_loss_mean']:.4f} "
                f"({r['val_loss_min']:.3f}..{r['val_loss_max']:.3f}) | {gap} | {ok} |"
            )
        out.append("")
    return "\n".join(out)


#: The diagnosis runs (``--diagnose``): seed 0 of the demo size with the worker's dense shadow
#: (``LMSettings.diag_every``), the codecs as the hook runs them and the variants that tell the
#: causes apart.
DIAG_KEYS = ("density", "resid_ratio", "v_ratio_median", "u_ratio", "u_cos")


def diagnose_runs() -> list[dict[str, Any]]:
    return [
        lm_spec("uncompressed", "ddp"),
        lm_spec("uniform 4 + EF", "ddp-gcodec", U4, True),
        lm_spec("top-k 1% + EF", "ddp-gcodec", TOPK, True),
        lm_spec("powersgd r2 + EF", "ddp-gcodec", PSGD, True),
        {
            **lm_spec(f"top-k 1% + EF, v frozen at {FREEZE_AT}", "ddp-gcodec", TOPK, True),
            "optimizer": "adamw-frozen",
            "freeze_at": FREEZE_AT,
            "start_iter": FREEZE_AT,
        },
        {**lm_spec("powersgd r2 + EF, embedding uniform 4", "ddp-gcodec", PSGD, True), "policy": {"tok.weight": U4}},
        lm_spec("chunk top-k 41/4096 + EF", "ddp-gcodec", {"id": "chunktopk", "chunk": 4096, "k": 41}, True),
    ]


def adam_compressibility(steps: int, at: tuple[int, ...], quick: bool = False) -> list[dict[str, Any]]:
    """How much of the gradient and of AdamW's step the two compressors could keep at best: one
    process trains the demo model (seed 0) uncompressed with the global batch of 2 workers and
    AdamW as lm_settings; at the steps ``at`` it takes the clipped gradient g and the step
    u = m_hat / (sqrt(v_hat) + eps) of the tensors the hook compresses, and reports the share of
    their energy (sum of squares) held by their largest 1 % and 10 % of elements (all tensors
    together, as the hook's top-k ranks them) and by the best rank-2 approximation of each matrix
    (its top 2 singular values; mean over the matrices)."""
    import torch

    from gcodec.demo import corpus
    from gcodec.demo import lm_worker as lw

    torch.set_num_threads(1)  # a shared machine: one core, as each worker of the study
    s = lm_settings("demo", 0, steps, quick)
    s = dataclasses.replace(s, batch=2 * s.batch)
    data = corpus.load()
    model = lw.make_model(s)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.1)
    big = [p for p in model.parameters() if p.numel() >= s.min_numel]

    def top_share(xs: list[Any], ratio: float) -> float:
        e = torch.cat([x.flatten() for x in xs]).pow(2)
        return float(e.topk(max(1, int(ratio * e.numel()))).values.sum() / e.sum())

    def rank2_share(xs: list[Any]) -> float:
        shares = [torch.linalg.svdvals(x.reshape(x.shape[0], -1)).pow(2) for x in xs]
        return statistics.mean(float(e[:2].sum() / e.sum()) for e in shares)

    out = []
    for step in range(max(at) + 1):
        for grp in opt.param_groups:
            grp["lr"] = lw.lr_at(s, step)
        x = torch.from_numpy(corpus.batch(data.train, s.batch, s.context, s.seed, step, 0))
        opt.zero_grad()
        lw.lm_loss(model, x).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        grads = [p.grad.clone() for p in big if p.grad is not None] if step in at else []
        opt.step()
        if step in at:
            ups = []
            for p in big:
                st = opt.state[p]
                t = float(st["step"])
                ups.append((st["exp_avg"] / (1 - 0.9**t)) / ((st["exp_avg_sq"] / (1 - 0.95**t)).sqrt() + 1e-8))
            out.append(
                {
                    "step": step + 1,
                    **{
                        f"{k}_{w}": f(xs, *a)
                        for w, xs in (("grad", grads), ("update", ups))
                        for k, f, a in (
                            ("top1", top_share, (0.01,)),
                            ("top10", top_share, (0.1,)),
                            ("rank2", rank2_share, ()),
                        )
                    },
                }
            )
    return out


def run_diagnose(steps: int, quick: bool, workers: int = 2) -> dict[str, Any]:
    s = dataclasses.replace(lm_settings("demo", 0, steps, quick), diag_every=4 if quick else 25)
    runs = diagnose_runs()[:3] if quick else diagnose_runs()
    t0 = time.perf_counter()
    res = run_job(runs, s, workers, module="gcodec.demo.lm_worker", timeout_s=4 * 3600)
    shares = adam_compressibility(steps, (4, 8) if quick else (50, 100, 150, 200), quick)
    return {"settings": s.to_dict(), "runs": res["runs"], "shares": shares, "elapsed_s": time.perf_counter() - t0}


def diagnose_markdown(result: dict[str, Any], first: int = 100) -> str:
    """Per run and tensor: the dense shadow's comparison (lm_worker.DenseShadow.compare), averaged
    over the diagnosis steps from ``first`` on, and how far the tensor travelled from its initial
    weights at the end against the uncompressed run."""
    runs = [r for r in result["runs"] if r.get("ok")]
    base = next((r for r in runs if r["method"] == "ddp"), None)
    out = [
        "Energy share the best 1 % / 10 % of elements and the best rank 2 keep, of the gradient and of"
        " AdamW's step (adam_compressibility):",
        "",
        "| step | top 1 %: gradient | top 1 %: step | top 10 %: gradient | top 10 %: step "
        "| rank 2: gradient | rank 2: step |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result.get("shares", []):
        out.append(
            f"| {row['step']} | "
            + " | ".join(
                f"{row[k]:.3f}"
                for k in ("top1_grad", "top1_update", "top10_grad", "top10_update", "rank2_grad", "rank2_update")
            )
            + " |"
        )
    out.append("")
    for r in runs:
        if r["method"] == "ddp":
            continue
        rows = [d for d in r["diag"] if d["step"] >= first] or r["diag"][-1:]
        out += [
            f"**{r['label']}** (val loss {r['val_loss']:.4f}"
            + (f", {100 * (r['val_loss'] / base['val_loss'] - 1):+.1f} %)" if base else ")"),
            "",
            "| tensor | " + " | ".join(DIAG_KEYS) + " | distance / uncompressed |",
            "|---|" + "---:|" * (len(DIAG_KEYS) + 1),
        ]
        for name in rows[0]["layers"]:
            vals = [statistics.mean(d["layers"][name][k] for d in rows) for k in DIAG_KEYS]
            far = ""
            if base:
                far = f"{r['diag'][-1]['layers'][name]['dist_rms'] / base['diag'][-1]['layers'][name]['dist_rms']:.2f}"
            out.append(f"| {name} | " + " | ".join(f"{v:.3g}" for v in vals) + f" | {far} |")
        out.append("")
    return "\n".join(out)


def plot_lm(result: dict[str, Any], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'gcodec[bench]')"
    sizes = result["sizes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 5), dpi=100, squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, size in zip(axes[0], sizes):
        jobs = [j for j in result["jobs"] if j["size"] == size]
        for i, label in enumerate(r["label"] for r in jobs[0]["runs"]):
            curves = [next(r for r in j["runs"] if r["label"] == label).get("curve") for j in jobs]
            curves = [c for c in curves if c]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            x = [curves[0][k]["step"] for k in range(n)]
            y = [statistics.mean(c[k]["val_loss"] for c in curves) for k in range(n)]
            style = {"color": "k", "ls": "--", "lw": 2.0} if label == "uncompressed" else {"color": colors(i % 10)}
            ax.plot(x, y, label=label, **style)
        ax.set_xlabel("step")
        ax.set_title(f"{size}: validation loss, mean over {result['seeds']} seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("nats per byte")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=("mlp", "lm"), default="mlp", help="the digits MLP (SGD) or the LM (AdamW)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="LM: seeds first-seed, first-seed + 1, ...")
    ap.add_argument("--epochs", type=int, default=12, help="MLP: epochs")
    ap.add_argument("--steps", type=int, default=300, help="LM: steps")
    ap.add_argument("--sizes", default="demo,nanogpt", help=f"LM: model sizes, of {', '.join(LM_SIZES)}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--remedies", default="demo", help="LM: the sizes that also run the remedies ('' for none)")
    ap.add_argument("--quick", action="store_true", help="1 seed, 2 codecs (MLP: 2 epochs; LM: the tiny model)")
    ap.add_argument("--json", metavar="FILE", help="write every run of every seed")
    ap.add_argument("--markdown", metavar="FILE", help="write the table (Markdown)")
    ap.add_argument("--plot", metavar="FILE", help="write the loss curves (PNG)")
    ap.add_argument(
        "--diagnose",
        action="store_true",
        help="LM: seed 0 of the demo size with the dense shadow's diagnostics, per tensor (docs/convergence.md)",
    )
    ap.add_argument(
        "--warmup-study",
        action="store_true",
        help="error feedback from step 0 against 10 dense steps first (and PowerSGD's 16-bit factors), per workload",
    )
    ap.add_argument("--no-factors", action="store_true", help="--warmup-study without the 16-bit factor runs")
    ap.add_argument(
        "--from-json", metavar="FILE", nargs="+", help="re-make the table and plot from earlier --json files (merged)"
    )
    args = ap.parse_args(argv)
    if args.diagnose:
        diag = run_diagnose(args.steps, args.quick, args.workers)
        md = diagnose_markdown(diag, first=0 if args.quick else 100)
        print(md)
        if args.json:
            Path(args.json).write_text(json.dumps(diag, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(md)
        return 0
    if args.from_json:
        parts = [json.loads(Path(f).read_text()) for f in args.from_json]
        result = parts[0]
        for more in parts[1:]:  # jobs of other sizes or seeds, run apart
            result["jobs"] += more["jobs"]
            result["sizes"] += [x for x in more.get("sizes", []) if x not in result["sizes"]]
            result["elapsed_s"] += more["elapsed_s"]
        if result.get("workload") == "lm":  # seeds run apart (--first-seed)
            result["seeds"] = len({j["seed"] for j in result["jobs"]})
    elif args.warmup_study:
        lm = args.workload == "lm"
        result = run_warmup(args.seeds, lm, args.epochs, args.steps, args.workers, not args.no_factors, args.first_seed)
    elif args.workload == "lm":
        sizes = ["demo"] if args.quick else [x for x in args.sizes.split(",") if x]
        unknown = [x for x in sizes if x not in LM_SIZES]
        if unknown:
            ap.error(f"unknown size(s) {unknown}; choose from {list(LM_SIZES)}")
        remedies = tuple(x for x in args.remedies.split(",") if x)
        seeds = 1 if args.quick else args.seeds
        result = run_lm(seeds, sizes, args.steps, args.quick, args.workers, remedies, args.first_seed)
    else:
        seeds, epochs = (1, 2) if args.quick else (args.seeds, args.epochs)
        result = run(seeds, epochs, args.quick, args.workers)
    lm = result.get("workload") == "lm"
    rows = summarise_lm(result) if lm else summarise(result)
    result["summary"] = rows
    md = markdown_lm(result, rows) if lm else markdown(result, rows)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    if args.plot:
        why = plot_lm(result, args.plot) if lm else plot(result, args.plot)
        print(why or f"loss curves: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
