"""Low-communication training, side by side: DDP against DiLoCo (gcodec's and torchft's) on the
language-model workload, through emulated links.

    sudo python bench/lowcomm.py                               # 2 and 4 workers; 100 Mbit/s, 1 Gbit/s, unlimited
    sudo python bench/lowcomm.py --workers 2 --quick           # small model, a few contenders
    sudo python bench/lowcomm.py --json r.json --markdown docs/lowcomm_table.md --plot docs/lowcomm.png

**Workload.** :mod:`gcodec.demo.lm_worker`'s byte-level transformer on the standard library's source
(:mod:`gcodec.demo.corpus`; the results record the Python version and the corpus hash), real gloo
processes, AdamW inner steps with warm-up and cosine decay, the same weights and batches for every
contender.

**Contenders.** DDP fp32 (plain allreduce of every gradient, every step); DDP with gcodec's hook;
DiLoCo fp32 (:class:`gcodec.torch.DiLoCo`, uncompressed pseudo-gradients every H steps); torchft's
DiLoCo (``torchft.local_sgd.DiLoCo``, fp32, the outside anchor), and the same with gcodec's
4-bit pseudo-gradients and error feedback inside it (:mod:`gcodec.torch.torchft`); gcodec's DiLoCo with 4-bit
pseudo-gradients and error feedback, with chunked top-k 2-bit values and error feedback, with the
chunked DCT (those two when the codecs are registered); Streaming DiLoCo (2 fragments, each
exchange overlapping 2 inner steps, mix 0.5) with 4-bit values and error feedback.

**Method** (as bench/link.py's). A run's trajectory does not depend on the link, only its wall time:

1. on the unshaped loopback every contender trains the whole schedule; its validation curve gives
   the inner steps it needs to reach the *target*, DDP fp32's final validation loss within 2 %
   (relative), and its bytes per rank per inner step (the encoded contribution of one rank, as
   gcodec's statistics and the payload sizes count it);
2. at every shaped rate (a network namespace whose loopback is shaped by a token bucket, as
   bench/link.py builds it; both ranks' traffic shares it) every contender runs ``k H + 3`` inner
   steps (``--periods k``, default 3), its mean step time over each of the last ``k`` windows of
   ``H`` steps (a whole synchronisation period, the exchange included) is taken, and the median
   of those ``k`` means is kept (one window moved the ratios by about 20 % between runs);
   ``--rounds r`` repeats that pass ``r`` times, the contenders in a rotated order each time, and
   keeps each contender's median over the passes; the table shows the ratios of every pass beside
   it (lowest-highest), since the machine's speed drifts between passes minutes apart;
3. time to target at a rate = steps to target x that mean step time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from link import NoNamespace, namespace  # noqa: E402

from gcodec.codecs.registry import list_codecs  # noqa: E402
from gcodec.demo.launch import run_job  # noqa: E402
from gcodec.demo.runs import LMSettings, lm_spec  # noqa: E402
from gcodec.demo.tour_report import pyplot  # noqa: E402

RATES = ["100mbit", "1gbit", "unlimited"]
#: relative margin on DDP fp32's final validation loss that counts as reaching it
MARGIN = 0.02
U4 = {"id": "uniform", "bits": 4}
#: The DiLoCo rows' outer optimizer: plain averaging (SGD lr 1, no momentum). At 12-20 outer steps
#: it measured closer to DDP than the paper's Nesterov 0.7/0.9 (tuned for hundreds of outer steps;
#: docs/lowcomm.md has the runs); one row keeps the paper's for comparison.
OUTER = {"outer_lr": 1.0, "outer_momentum": 0.0}


def contenders(h: int, diloco_steps: int, quick: bool = False) -> list[dict[str, Any]]:
    """The contenders (module docstring); the first is the reference. The DiLoCo runs train
    ``diloco_steps`` inner steps (their own cosine schedule), so that the steps they need to reach
    DDP's loss can be seen, and average with outer SGD at lr 1 without momentum (``OUTER``)."""
    ids = set(list_codecs())
    d = {"sync_every": h, "steps": diloco_steps, **OUTER}
    out = [
        lm_spec("DDP fp32", "ddp"),
        lm_spec("DDP + gcodec uniform 4 + EF", "ddp-gcodec", U4, True),
        lm_spec(f"DiLoCo H={h} fp32", "diloco", None, False, **d),
        lm_spec(f"DiLoCo H={h} fp32, outer Nesterov 0.7/0.9", "diloco", None, False, sync_every=h, steps=diloco_steps),
        lm_spec(f"torchft DiLoCo H={h} fp32", "torchft", None, False, **d),
        lm_spec(f"DiLoCo H={h} uniform 4 + EF", "diloco", U4, True, **d),
        # torchft's own DiLoCo and quorum, its pseudo-gradients through gcodec.torch.torchft
        lm_spec(f"torchft DiLoCo H={h} + gcodec uniform 4 + EF", "torchft", U4, True, **d),
    ]
    if importlib.util.find_spec("torchft") is None:  # pip install 'gcodec[torchft]'
        print("torchft is not installed (pip install 'gcodec[torchft]'): its DiLoCo is left out", file=sys.stderr)
        out = [c for c in out if c["method"] != "torchft"]
    if "chunktopk" in ids:
        # SparseLoCo's setting (k = 64 of 4096: 1.6 % of the coordinates a sync), and a density of
        # 6.25 %: the benchmark's runs have 36-96 outer steps where the paper's have thousands, and
        # at 1.6 % the residual needs more of them to deliver what the first syncs held back
        # (docs/lowcomm.md, "Chunked top-k's density")
        for k in (64, 256):
            cfg = {"id": "chunktopk", "chunk": 4096, "k": k, "values": {"id": "uniform", "bits": 2, "group_size": 64}}
            label = f"DiLoCo H={h} chunked top-k {k}/4096 2-bit + EF (decay 0.95)"
            out.append(lm_spec(label, "diloco", cfg, True, ef_decay=0.95, **d))
    if "dct" in ids:
        dct = {"id": "dct", "values": {"id": "sign"}}  # DeMo's: top-k DCT coefficients, 1-bit values
        out.append(lm_spec(f"DiLoCo H={h} chunked DCT + sign + EF", "diloco", dct, True, **d))
    out.append(
        lm_spec(f"Streaming DiLoCo H={h} P=2 uniform 4 + EF", "diloco", U4, True, fragments=2, delay=2, mix=0.5, **d)
    )
    if quick:
        keep = (
            "DDP fp32",
            f"DiLoCo H={h} fp32",
            f"torchft DiLoCo H={h} fp32",
            f"DiLoCo H={h} uniform 4 + EF",
            f"torchft DiLoCo H={h} + gcodec uniform 4 + EF",
        )
        out = [c for c in out if c["label"] in keep]
    return out


def steps_to(curve: list[dict[str, Any]], target: float) -> int | None:
    """The first evaluated inner step whose validation loss is within the margin of ``target``."""
    for c in curve:
        if c["val_loss"] <= target * (1.0 + MARGIN):
            return int(c["step"])
    return None


def period_median(times_ms: list[float], h: int, k: int) -> float:
    """The median over the last ``k`` windows of ``h`` steps of each window's mean step time: a
    window holds one synchronisation, so every window costs what a period costs, and the median
    keeps one slow window (the machine's, not the method's) out of the figure."""
    if len(times_ms) < k * h:
        raise ValueError(f"{len(times_ms)} step times, fewer than {k} windows of {h}")
    tail = times_ms[len(times_ms) - k * h :]
    return float(statistics.median(statistics.fmean(tail[i * h : (i + 1) * h]) for i in range(k)))


def rotated(cons: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    """Timing round ``i``'s order: the contenders rotated by ``i``, so that over the rounds each
    runs at a different moment of the pass (after another neighbour, earlier or later), and a
    drift of the machine's speed within a pass does not always land on the same contender."""
    j = i % len(cons) if cons else 0
    return cons[j:] + cons[:j]


def round_median(times: list[float | None]) -> float | None:
    """A contender's step time at one rate: the median over the timing rounds that ran."""
    got = [t for t in times if t is not None]
    return float(statistics.median(got)) if got else None


def time_ratio(steps: int | None, t: float | None, ref_steps: int | None, ref_t: float | None) -> float | None:
    """Time to target (steps x step time) against a reference's; None where either has no step
    count or no step time."""
    if steps is None or not ref_steps or t is None or not ref_t:
        return None
    return steps * t / (ref_steps * ref_t)


def round_ratios(
    steps: int | None, times: list[float | None], ref_steps: int | None, ref_times: list[float | None]
) -> list[float | None]:
    """Time to target against a reference, round by round (each round's own step times: a pass
    runs every contender within minutes, so the ratio of one round is free of the drift between
    rounds)."""
    return [time_ratio(steps, t, ref_steps, rt) for t, rt in zip(times, ref_times, strict=False)]


def stored_curves(res: dict[str, Any]) -> dict[str, dict[int, Any]]:
    """The curves of an earlier ``--json`` by world and seed (a file written before ``--seeds``
    holds one seed's, its settings' own)."""
    if "curves_seeds" in res:
        return {w: {int(k): v for k, v in per.items()} for w, per in res["curves_seeds"].items()}
    seed = int(res["settings"].get("seed", 0))
    return {w: {seed: v} for w, v in res.get("curves", {}).items()}


def seed_outcomes(runs: list[dict[str, Any]], reference: str) -> dict[str, dict[str, Any]]:
    """One seed's curves: each contender's final loss and the steps it needs to reach that seed's
    target (its own DDP fp32 run's final loss within the margin)."""
    by = {r["label"]: r for r in runs}
    ref = by.get(reference, {})
    target = float(ref["val_loss"]) if ref.get("ok") else math.nan
    return {
        label: {
            "target": target,
            "val_loss": r.get("val_loss") if r.get("ok") else None,
            "steps_to_target": steps_to(r["curve"], target) if r.get("ok") and target == target else None,
        }
        for label, r in by.items()
    }


def seed_ratios(
    mine: dict[str, dict[str, Any]], ref: dict[str, dict[str, Any]], t: float | None, ref_t: float | None
) -> dict[str, float | None]:
    """Time to target against a reference, seed by seed: each seed's step counts (the curves
    differ by seed, the step times do not) times the step times at one rate."""
    return {
        seed: time_ratio(m.get("steps_to_target"), t, (ref.get(seed) or {}).get("steps_to_target"), ref_t)
        for seed, m in mine.items()
    }


def diloco_steps(spec: str, steps: int, world: int) -> int:
    """The DiLoCo runs' inner steps at ``world`` workers from ``--diloco-steps``: ``N`` for every
    world, ``W=N,...`` per world, or empty for the default, 1.5 x DDP's ``steps`` at 2 workers and
    4 x at more. DiLoCo's replicas drift further apart between syncs the more of them there are:
    measured on this workload at 4 workers (H = 25, averaging), uncompressed DiLoCo ended 6.2 %
    above DDP's loss after 900 inner steps (1.5 x) and reached it within 2 % at step 1050 of a
    1500-step schedule, and chunked top-k 2-bit + EF (decay 0.95) ended 4.7 % above it at 1500
    steps and reached it at step 1475 of 2400; at 2 workers they reach it at 525 and 700 of 900."""
    spec = spec.strip()
    if not spec:
        return steps * 3 // 2 if world <= 2 else steps * 4
    if "=" not in spec:
        return int(spec)
    per = {}
    for part in spec.split(","):
        w, _, n = part.partition("=")
        per[int(w)] = int(n)
    if world not in per:
        raise SystemExit(f"--diloco-steps {spec!r} names no value for {world} workers")
    return per[world]


def run(args: argparse.Namespace) -> dict[str, Any]:
    h = args.sync_every
    curves = stored_curves(json.loads(Path(args.curves_from).read_text())) if args.curves_from else {}
    s = LMSettings.quick() if args.quick else LMSettings(steps=args.steps, batch=args.batch, eval_every=h)
    if args.quick:
        s = LMSettings(**{**s.to_dict(), "eval_every": h, "steps": 3 * h})
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    out: dict[str, Any] = {"settings": s.to_dict(), "sync_every": h, "margin": MARGIN, "worlds": {}}
    for world in args.workers:
        t0 = time.perf_counter()
        dsteps = 3 * h if args.quick and not args.diloco_steps else diloco_steps(args.diloco_steps, args.steps, world)
        cons = contenders(h, dsteps, args.quick)
        by_seed: dict[int, dict[str, Any]] = {}
        for seed in args.seeds:
            prev = curves.get(str(world), {}).get(seed)
            if prev is not None:  # the curves of an earlier run (--curves-from): same contenders and schedule
                by_seed[seed] = prev
                continue
            print(f"[{world} workers] curves, seed {seed}: {len(cons)} contenders", file=sys.stderr, flush=True)
            with namespace("unlimited") as prefix:
                by_seed[seed] = run_job(
                    cons,
                    LMSettings(**{**s.to_dict(), "seed": seed}),
                    world,
                    prefix=prefix,
                    env=env,
                    module="gcodec.demo.lm_worker",
                    timeout_s=7200,
                )
        res = by_seed[args.seeds[0]]
        out["corpus"] = res["corpus"]
        out.setdefault("curves", {})[str(world)] = res
        out.setdefault("curves_seeds", {})[str(world)] = {str(k): v for k, v in by_seed.items()}
        runs = {r["label"]: r for r in res["runs"]}
        seeds = {seed: seed_outcomes(r["runs"], cons[0]["label"]) for seed, r in by_seed.items()}
        first = seeds[args.seeds[0]]  # the table's main columns
        target = first[cons[0]["label"]]["target"]
        # per contender and rate: the step time of each timing round (None where the round failed)
        rounds: dict[str, dict[str, list[float | None]]] = {c["label"]: {} for c in cons}
        k = args.periods
        timing = LMSettings(**{**s.to_dict(), "max_steps": k * h + 3})
        for rate in [] if args.curves_only else args.rates:
            for i in range(args.rounds):
                order = rotated(cons, i)
                print(
                    f"[{world} workers] timing at {rate}, round {i + 1}/{args.rounds}: {k * h + 3} steps per contender",
                    file=sys.stderr,
                    flush=True,
                )
                with namespace(rate) as prefix:
                    tr = run_job(
                        order, timing, world, prefix=prefix, env=env, module="gcodec.demo.lm_worker", timeout_s=3600
                    )
                got = {r["label"]: r for r in tr["runs"] if r.get("ok")}
                for c in cons:
                    r = got.get(c["label"])
                    t = None if r is None else period_median(r["step_times_ms"], h, k) / 1e3
                    rounds[c["label"]].setdefault(rate, []).append(t)
        rows = []
        for c in cons:
            r = runs[c["label"]]
            if not r.get("ok"):
                rows.append({"label": c["label"], "ok": False, "error": r.get("error")})
                continue
            n = first[c["label"]]["steps_to_target"]
            per = rounds[c["label"]]
            medians = {rate: round_median(ts) for rate, ts in per.items()}
            step_s = {rate: v for rate, v in medians.items() if v is not None}
            rows.append(
                {
                    "label": c["label"],
                    "method": c["method"],
                    "ok": True,
                    "val_loss": r["val_loss"],
                    "loss_vs_ddp": r["val_loss"] / target - 1.0,
                    "bytes_per_inner_step": r["bytes_per_inner_step"],
                    "steps_to_target": n,
                    "step_s": step_s,
                    "step_s_rounds": per,
                    "seeds": {str(seed): got.get(c["label"], {}) for seed, got in seeds.items()},
                    "time_to_target_s": {k: (None if n is None else n * v) for k, v in step_s.items()},
                    "curve": r["curve"],
                    "params": r["params"],
                }
            )
        _ratios(rows, cons, h)
        out["worlds"][str(world)] = {
            "target": target,
            "diloco_steps": dsteps,
            "rows": rows,
            "elapsed_s": time.perf_counter() - t0,
        }
    return out


def _ratios(rows: list[dict[str, Any]], cons: list[dict[str, Any]], h: int) -> None:
    by = {r["label"]: r for r in rows if r.get("ok")}
    ddp = by.get("DDP fp32")
    dil = by.get(f"DiLoCo H={h} fp32")
    ft = by.get(f"torchft DiLoCo H={h} fp32")
    for r in by.values():
        if ddp:
            r["bytes_vs_ddp"] = ddp["bytes_per_inner_step"] / r["bytes_per_inner_step"]
        if dil:
            r["bytes_vs_diloco_fp32"] = dil["bytes_per_inner_step"] / r["bytes_per_inner_step"]
        for name, ref in (("ddp", ddp), ("torchft", ft)):
            if ref is None:
                continue
            r[f"time_vs_{name}"] = {
                rate: time_ratio(r["steps_to_target"], t, ref["steps_to_target"], ref["step_s"].get(rate))
                for rate, t in r["step_s"].items()
            }
            r[f"time_vs_{name}_seeds"] = {
                rate: seed_ratios(r["seeds"], ref["seeds"], t, ref["step_s"].get(rate))
                for rate, t in r["step_s"].items()
            }
            r[f"time_vs_{name}_rounds"] = {
                rate: round_ratios(r["steps_to_target"], ts, ref["steps_to_target"], ref["step_s_rounds"].get(rate, []))
                for rate, ts in r["step_s_rounds"].items()
            }


def _f(v: Any, fmt: str, none: str = "n/a") -> str:
    return none if v is None else format(v, fmt)


def markdown(res: dict[str, Any], rates: list[str]) -> str:
    s = res["settings"]
    c = res["corpus"]
    lines = [
        "<!-- written by bench/lowcomm.py; do not edit by hand -->",
        f"Byte-level transformer ({s['layers']} layers x {s['d_model']}, context {s['context']}), "
        f"{s['steps']} inner steps of {s['batch']} windows per rank; corpus: Python {c['python']} standard "
        f"library, sha256 `{c['corpus_sha256'][:16]}`. Target: DDP fp32's final validation loss "
        f"+{100 * res['margin']:.0f} %.",
        "",
    ]
    for world, w in res["worlds"].items():
        ds = w.get("diloco_steps")
        train = f"; the DiLoCo runs train {ds} inner steps" if ds else ""
        lines += [f"**{world} workers** (target {w['target']:.4f} nats/byte{train})", ""]
        head = ["contender", "bytes/rank/inner step", "vs DDP", "vs DiLoCo fp32", "val loss", "vs DDP", "steps"]
        head += [f"time @ {r}" for r in rates] + ["@100mbit vs DDP", "@100mbit vs torchft"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in w["rows"]:
            if not r.get("ok"):
                lines.append(f"| {r['label']} | failed: {r.get('error')} |")
                continue
            cells = [
                r["label"],
                f"{r['bytes_per_inner_step']:,.0f}",
                _f(r.get("bytes_vs_ddp"), ".1f") + "x",
                _f(r.get("bytes_vs_diloco_fp32"), ".1f") + "x",
                f"{r['val_loss']:.4f}",
                f"{100 * r['loss_vs_ddp']:+.2f} %",
                _f(r["steps_to_target"], "d", "not reached"),
            ]
            cells += [_f(r["time_to_target_s"].get(rate), ".1f", "-") + " s" for rate in rates]
            for name in ("ddp", "torchft"):
                cells.append(_f((r.get(f"time_vs_{name}") or {}).get("100mbit"), ".3f", "-"))
                spread = [v for v in (r.get(f"time_vs_{name}_rounds") or {}).get("100mbit", []) if v is not None]
                if len(spread) > 1:  # the rounds' own ratios, lowest to highest
                    cells[-1] += f" ({min(spread):.3f}-{max(spread):.3f})"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += seed_table(w["rows"])
    return "\n".join(lines) + "\n"


def seed_table(rows: list[dict[str, Any]]) -> list[str]:
    """Every seed's steps to its target and time against torchft at 100 Mbit/s (nothing for one seed)."""
    ok = [r for r in rows if r.get("ok")]
    seeds = sorted({k for r in ok for k in r.get("seeds", {})}, key=int)
    if len(seeds) < 2:
        return []
    head = ["contender"] + [f"seed {k}: steps" for k in seeds] + [f"seed {k}: vs torchft" for k in seeds]
    head.append("vs torchft, median")
    out = ["Per seed (each seed's own DDP fp32 target; step times as above, at 100 Mbit/s):", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ok:
        per = r.get("time_vs_torchft_seeds", {}).get("100mbit", {})
        ratios = [per.get(k) for k in seeds]
        got = [v for v in ratios if v is not None]
        cells = [r["label"]]
        cells += [_f(r["seeds"].get(k, {}).get("steps_to_target"), "d", "not reached") for k in seeds]
        cells += [_f(v, ".3f", "-") for v in ratios]
        cells.append(_f(statistics.median(got) if got else None, ".3f", "-"))
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def plot(res: dict[str, Any], path: str) -> str | None:
    plt, why = pyplot()
    if plt is None:
        return why
    worlds = list(res["worlds"].items())
    fig, axes = plt.subplots(1, len(worlds), figsize=(7 * len(worlds), 4.5), dpi=110, squeeze=False)
    for ax, (world, w) in zip(axes[0], worlds, strict=True):
        for r in w["rows"]:
            if r.get("ok"):
                ax.plot([c["tokens"] for c in r["curve"]], [c["val_loss"] for c in r["curve"]], label=r["label"])
        ax.axhline(w["target"] * (1 + res["margin"]), color="grey", ls=":", lw=1)
        ax.set_xlabel("tokens (all ranks)")
        ax.set_ylabel("validation loss (nats/byte)")
        ax.set_title(f"{world} workers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("--rates", default=",".join(RATES), help="links to time at (tc tbf rates, or unlimited)")
    ap.add_argument("--steps", type=int, default=600, help="inner steps of DDP's schedule")
    ap.add_argument(
        "--batch",
        type=int,
        default=4,
        help="windows of 64 bytes per rank per step (small: the step is communication-bound, as across sites)",
    )
    ap.add_argument("--sync-every", type=int, default=25, help="DiLoCo's H")
    ap.add_argument(
        "--diloco-steps",
        default="",
        help="inner steps of the DiLoCo runs: N, or W=N,... per world size (default 1.5 x --steps at 2 workers, "
        "4 x at more)",
    )
    ap.add_argument(
        "--periods", type=int, default=3, help="timing windows of H steps per contender and rate (median kept)"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="timing passes per rate, the contenders rotated each pass; a contender's step time is the median "
        "over passes, and the ratios of every pass are reported beside it",
    )
    ap.add_argument(
        "--seeds",
        default="0",
        help="data and initialisation seeds, comma-separated: the curves (and each seed's DDP target) are trained "
        "for each; the table's main columns are the first seed's, a second table gives every seed's steps and ratio",
    )
    ap.add_argument("--quick", action="store_true", help="the quick model and 4 contenders")
    ap.add_argument("--curves-only", action="store_true", help="train the curves, time nothing (then --curves-from)")
    ap.add_argument("--curves-from", metavar="JSON", help="reuse the curves of an earlier --json; time only")
    ap.add_argument("--json", help="write the results")
    ap.add_argument("--markdown", help="write the table")
    ap.add_argument("--plot", help="write the validation curves (PNG)")
    args = ap.parse_args(argv)
    args.workers = [int(v) for v in args.workers.split(",")]
    args.rates = args.rates.split(",")
    args.seeds = [int(v) for v in args.seeds.split(",")]
    try:
        res = run(args)
    except NoNamespace as e:
        print(f"bench/lowcomm.py: {e}; no results", file=sys.stderr)
        return 0
    text = markdown(res, args.rates)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.plot:
        why = plot(res, args.plot)
        if why:
            print(why, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
