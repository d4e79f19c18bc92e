#!/usr/bin/env python
"""Rate-distortion of every registered codec on gradient-like tensors: bits per element against
relative error, as a markdown table and a PNG.

    python bench/rate_distortion.py                       # table to stdout, docs/rate_distortion.png
    python bench/rate_distortion.py --png out.png --seed 1

The test tensor imitates a layer gradient (1024 x 1024 float32): a low-rank part with decaying
singular values (gradients of layers are close to low rank, which is what PowerSGD exploits) plus
heavy-tailed noise (Student-t, 3 degrees of freedom: a few entries are far larger than the rest,
which is what makes per-tensor scales and Top-K interesting): 75 % of the energy in the low-rank
part, 25 % in the noise.

For each codec setting the script encodes the tensor once (no error feedback: this is the
distortion of one step; with feedback the dropped part is sent later), decodes it, and reports

* bits/element: ``8 * len(payload) / numel``, header and checksum included;
* relative error: ``||decode(x) - x|| / ||x||`` (Frobenius).

Every codec in ``gcodec.list_codecs()`` appears; codecs without a settings entry below are run with
their defaults (and listed as such).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gcodec  # noqa: E402

#: codec id -> list of (label, params). Ordered from coarse to fine where that makes sense.
SETTINGS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "fp16": [("fp16", {})],
    "bf16": [("bf16", {})],
    "uniform": [(f"uniform {b}-bit", {"bits": b}) for b in (2, 4, 8)]
    + [(f"uniform {b}-bit g32", {"bits": b, "group_size": 32}) for b in (4, 8)],
    "fp8": [("fp8 e4m3 g128", {}), ("fp8 e5m2 g128", {"element": "e5m2"})],
    "mx": [(f"mx {e}", {"element": e}) for e in ("e2m1", "e2m3", "e3m2", "e4m3", "int8")],
    "nvfp4": [("nvfp4", {})],
    "qsgd": [("qsgd s=1", {"levels": 1}), ("qsgd s=15", {"levels": 15}), ("qsgd s=127", {"levels": 127})],
    "terngrad": [("terngrad", {})],
    "sign": [("sign", {})],
    "topk": [(f"topk {r:g}", {"ratio": r}) for r in (0.001, 0.01, 0.1)]
    + [("topk 0.01 + uniform8", {"ratio": 0.01, "values": {"id": "uniform", "bits": 8}})],
    "randomk": [(f"randomk {r:g}", {"ratio": r}) for r in (0.01, 0.1)]
    + [("randomk 0.1 + fp16", {"ratio": 0.1, "values": {"id": "fp16"}})],
    "threshold": [],  # thresholds depend on the data: filled in by _threshold_settings
    "powersgd": [(f"powersgd r={r}", {"rank": r, "iterations": 2}) for r in (1, 4, 16, 64)]
    + [
        ("powersgd r=4 + fp16", {"rank": 4, "iterations": 2, "factors": {"id": "fp16"}}),
        ("powersgd r=4 + bf16", {"rank": 4, "iterations": 2, "factors": {"id": "bf16"}}),
        ("powersgd r=16 + fp16", {"rank": 16, "iterations": 2, "factors": {"id": "fp16"}}),
        ("powersgd r=16 + uniform8", {"rank": 16, "iterations": 2, "factors": {"id": "uniform", "bits": 8}}),
    ],
}

#: marker per family in the plot
FAMILY = {
    "fp16": "cast",
    "bf16": "cast",
    "uniform": "quantisation",
    "fp8": "low-precision float",
    "mx": "low-precision float",
    "nvfp4": "low-precision float",
    "qsgd": "quantisation",
    "terngrad": "quantisation",
    "sign": "quantisation",
    "topk": "sparsification",
    "randomk": "sparsification",
    "threshold": "sparsification",
    "powersgd": "low rank",
}


def gradient_like(m: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = 32
    u, _ = np.linalg.qr(rng.standard_normal((m, r)))
    v, _ = np.linalg.qr(rng.standard_normal((n, r)))
    low = (u * (0.8 ** np.arange(r))) @ v.T
    noise = rng.standard_t(3, (m, n))
    low *= np.sqrt(3.0) * np.linalg.norm(noise) / np.linalg.norm(low)  # energies 3 : 1
    return ((low + noise) * 1e-3).astype(np.float32)


def _threshold_settings(x: np.ndarray) -> list[tuple[str, dict[str, Any]]]:
    a = np.abs(x.reshape(-1))
    out = []
    for q in (0.995, 0.95):
        t = float(np.quantile(a, q))
        out.append((f"threshold (keeps {1 - q:.1%})", {"threshold": t}))
    return out


def measure(x: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    settings = dict(SETTINGS)
    settings["threshold"] = _threshold_settings(x)
    norm = float(np.linalg.norm(x.astype(np.float64)))
    for cid in gcodec.list_codecs():
        entries = settings.get(cid) or [(f"{cid} (defaults)", {})]
        for label, params in entries:
            codec = gcodec.get_codec(cid, **params)
            buf = codec.encode(x, key="bench", step=0)
            y = gcodec.decode(buf)
            err = float(np.linalg.norm(y.astype(np.float64) - x) / norm)
            rows.append(
                {
                    "codec": cid,
                    "label": label,
                    "family": FAMILY.get(cid, "other"),
                    "bits": 8 * len(buf) / x.size,
                    "error": err,
                }
            )
    return rows


def protocol_rows(x: np.ndarray, steps: tuple[int, ...] = (1, 8)) -> list[dict[str, Any]]:
    """PowerSGD as the DDP hook runs it (the two-allreduce protocol on one rank, no error
    feedback, warm start on): bits per element on the wire (P and Q, float32 or 16-bit) and the
    relative error of the step's output at each of ``steps`` (step 1 starts from the spec's random
    Q; later steps from the warm start), float32 factors against ``factors="fp16"`` and ``"bf16"``;
    ``apart``: how far the last step's output lies from the float32 factors' (relative to ||x||)."""
    from gcodec.advise import MirrorComm
    from gcodec.transports import LowRankItem, TransportState, lowrank_protocol, run_blocking
    from gcodec.transports.allreduce import exchange_for
    from gcodec.transports.stats import StepStats

    norm = float(np.linalg.norm(x.astype(np.float64)))
    rows = []
    for rank in (1, 2, 4, 16):
        ref: np.ndarray | None = None
        for factors in (None, "fp16", "bf16"):
            codec = gcodec.get_codec("powersgd", rank=rank, factors=factors)
            comm, state = MirrorComm(1), TransportState(codec, error_feedback=False)
            out = np.empty_like(x)
            errs, nbytes = {}, 0
            for t in range(1, max(steps) + 1):
                ex = exchange_for(comm, state, "t", "rate-distortion", shapes=[list(x.shape)], size=1)
                step = state.next_step("t")
                st = StepStats("t", step, "lowrank", x.nbytes)
                run_blocking(lowrank_protocol(ex, state, [LowRankItem("t", x, out)], "mean", step, st))
                nbytes = int(st.values["payload_bytes"])
                if t in steps:
                    errs[t] = float(np.linalg.norm(out.astype(np.float64) - x) / norm)
            if ref is None:
                ref = out.astype(np.float64)
            apart = float(np.linalg.norm(out.astype(np.float64) - ref) / norm)
            bits = 8 * nbytes / x.size
            rows.append({"rank": rank, "factors": factors or "float32", "bits": bits, "errors": errs, "apart": apart})
    return rows


def protocol_table(rows: list[dict[str, Any]]) -> str:
    steps = list(rows[0]["errors"])
    lines = [
        "| PowerSGD (two-allreduce protocol) | factors | bits/element | "
        + " | ".join(f"relative error, step {t}" for t in steps)
        + f" | apart from float32 factors, step {steps[-1]} |",
        "|---|---|---:|" + "---:|" * (len(steps) + 1),
    ]
    for r in rows:
        errs = " | ".join(f"{r['errors'][t]:.5f}" for t in steps)
        lines.append(f"| rank {r['rank']} | {r['factors']} | {r['bits']:.4f} | {errs} | {r['apart']:.2e} |")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| codec | setting | bits/element | relative error |", "|---|---|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["family"], r["codec"], r["bits"])):
        lines.append(f"| `{r['codec']}` | {r['label']} | {r['bits']:.3f} | {r['error']:.4f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {
        "cast": "s",
        "quantisation": "o",
        "low-precision float": "v",
        "sparsification": "^",
        "low rank": "D",
        "other": "x",
    }
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    for fam, mk in markers.items():
        pts = [r for r in rows if r["family"] == fam]
        if not pts:
            continue
        ax.scatter([r["bits"] for r in pts], [max(r["error"], 1e-5) for r in pts], marker=mk, s=40, label=fam)
        for i, r in enumerate(sorted(pts, key=lambda r: r["bits"])):
            dy = (2, -9)[i % 2]  # alternate above/below so that neighbours stay readable
            ax.annotate(
                r["label"], (r["bits"], max(r["error"], 1e-5)), fontsize=6.5, xytext=(4, dy), textcoords="offset points"
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bits per element (payload incl. header)")
    ax.set_ylabel("relative error ||decode(x) - x|| / ||x||")
    ax.set_title("gcodec rate-distortion, one step, 1024x1024 gradient-like float32 (low rank + Student-t)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=1024, help="the tensor is size x size")
    ap.add_argument("--png", default=str(ROOT / "docs" / "rate_distortion.png"))
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    x = gradient_like(args.size, args.size, args.seed)
    rows = measure(x)
    print(table(rows))
    print()
    print(protocol_table(protocol_rows(x)))
    if args.png:
        plot(rows, Path(args.png))
        print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
