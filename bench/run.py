"""One runner for gcodec's benchmarks: results as JSON, tables as Markdown.

    python bench/run.py --quick                  # smoke run of every benchmark (< 2 min on 2 cores)
    python bench/run.py                          # the full runs (tens of minutes; link needs root)
    python bench/run.py --only convergence,link --out bench/results --docs docs

Benchmarks, each run as its own process (``bench/<script>.py``) with the arguments below:

=============  =======================================================  ==================================
name           what                                                     full run
=============  =======================================================  ==================================
throughput     encode/decode GB/s of the cast and quantization codecs   codec_throughput.py (16 Mi floats)
sparse         top-k / random-k / threshold / PowerSGD vs baselines     sparse_lowrank.py (16 Mi, 4096^2)
rate           rate-distortion of every codec (table + PNG)             rate_distortion.py
transports     DDP step time vs torch's hooks; bytes per rank by mode   transports.py ddp / bytes (mpiexec)
convergence    accuracy with/without EF over seeds (table + PNG)        convergence.py (3 seeds, 12 epochs)
link           time to accuracy under 100M/1G/10G/unlimited links       link.py (root; skips without it)
=============  =======================================================  ==================================

Each benchmark's standard output is kept (``OUT/<name>.txt``); those that write JSON write
``OUT/<name>.json``; ``OUT/summary.json`` lists every benchmark with its command, exit status and
seconds. With ``--docs DIR``, the Markdown tables go to ``DIR/benchmarks.md`` (one section per
benchmark, with the command that produced it and the machine), and the convergence and link
tables and plots to ``DIR/convergence.md``/``.png`` and ``DIR/link.md``/``.png``.
``--quick`` writes to a temporary folder and never to ``docs/`` unless ``--docs`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def commands(quick: bool, out: Path, docs: Path | None) -> dict[str, list[list[str]]]:
    """name -> the command lines it runs ({out}, {docs} resolved)."""
    py = sys.executable
    mpiexec = shutil.which("mpiexec") or str(Path(py).parent / "mpiexec")
    # the convergence and link tables and plots in docs/ come from full runs only
    conv_md = ["--markdown", str(docs / "convergence_table.md"), "--plot", str(docs / "convergence.png")]
    link_md = ["--markdown", str(docs / "link_table.md"), "--plot", str(docs / "link.png")]
    if docs is None or quick:
        conv_md = link_md = []
    rd_png = str(docs / "rate_distortion.png") if docs else str(out / "rate_distortion.png")
    if quick:
        return {
            "throughput": [
                [
                    py,
                    "bench/codec_throughput.py",
                    "--n",
                    "262144",
                    "--repeat",
                    "1",
                    "--only",
                    "uniform",
                    "--json",
                    str(out / "throughput.json"),
                ]
            ],
            "sparse": [
                [
                    py,
                    "bench/sparse_lowrank.py",
                    "--n",
                    "262144",
                    "--m",
                    "256",
                    "--repeat",
                    "1",
                    "--json",
                    str(out / "sparse.json"),
                ]
            ],
            "rate": [[py, "bench/rate_distortion.py", "--size", "128", "--png", str(out / "rate_distortion.png")]],
            "transports": [
                [py, "bench/transports.py", "ddp", "--params", "0.2", "--steps", "4"],
                [mpiexec, "-n", "2", py, "bench/transports.py", "bytes", "--numel", "65536"],
            ],
            "convergence": [[py, "bench/convergence.py", "--quick", "--json", str(out / "convergence.json"), *conv_md]],
            "link": [[py, "bench/link.py", "--quick", "--json", str(out / "link.json"), *link_md]],
        }
    return {
        "throughput": [[py, "bench/codec_throughput.py", "--json", str(out / "throughput.json")]],
        "sparse": [[py, "bench/sparse_lowrank.py", "--json", str(out / "sparse.json")]],
        "rate": [[py, "bench/rate_distortion.py", "--png", rd_png]],
        "transports": [[py, "bench/transports.py", "ddp"], [mpiexec, "-n", "4", py, "bench/transports.py", "bytes"]],
        "convergence": [[py, "bench/convergence.py", "--json", str(out / "convergence.json"), *conv_md]],
        "link": [[py, "bench/link.py", "--json", str(out / "link.json"), *link_md]],
    }


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    py = platform.python_version()
    return f"{platform.machine()} {platform.system()}, {cores} cores (load {load:.1f} at start), Python {py}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, one seed, two links")
    ap.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    ap.add_argument("--out", help="folder for JSON and logs (default: bench/results, or a temp folder with --quick)")
    ap.add_argument("--docs", help="folder for the Markdown tables and plots (default: docs/ on a full run)")
    args = ap.parse_args(argv)
    out = (
        Path(args.out)
        if args.out
        else (Path(tempfile.mkdtemp(prefix="gcodec-bench-")) if args.quick else BENCH / "results")
    )
    out.mkdir(parents=True, exist_ok=True)
    docs = Path(args.docs) if args.docs else (None if args.quick else ROOT / "docs")
    cmds = commands(args.quick, out, docs)
    names = [n for n in args.only.split(",") if n] or list(cmds)
    unknown = set(names) - set(cmds)
    if unknown:
        ap.error(f"unknown benchmark(s) {sorted(unknown)}: choose from {', '.join(cmds)}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    summary: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for name in names:
        text, rc, t0 = [], 0, time.perf_counter()
        for cmd in cmds[name]:
            print(f"== {name}: {' '.join(Path(c).name if c == sys.executable else c for c in cmd)}", flush=True)
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            text.append(p.stdout)
            if p.returncode != 0:
                rc = p.returncode
                text.append(f"(exit status {p.returncode})\n{p.stderr[-2000:]}")
        dt = time.perf_counter() - t0
        (out / f"{name}.txt").write_text("\n".join(text))
        print(f"   {'ok' if rc == 0 else 'FAILED'} in {dt:.1f} s", flush=True)
        summary.append(
            {"name": name, "commands": cmds[name], "rc": rc, "seconds": dt, "stdout": str(out / f"{name}.txt")}
        )
    total = time.perf_counter() - t_all
    # summary.json accumulates: a benchmark run again replaces its entry, the others stay
    path = out / "summary.json"
    previous = json.loads(path.read_text()).get("benchmarks", []) if path.exists() else []
    for s in summary:
        s.update(machine=machine(), date=time.strftime("%Y-%m-%d"), quick=args.quick)
    merged = {s["name"]: s for s in previous if Path(s.get("stdout", "")).exists()}
    merged.update({s["name"]: s for s in summary})
    order = [n for n in cmds if n in merged]
    path.write_text(json.dumps({"seconds_last_run": total, "benchmarks": [merged[n] for n in order]}, indent=1))
    if docs is not None:
        write_docs(docs, [merged[n] for n in order])
    print(f"{len(summary)} benchmarks in {total:.1f} s; results in {out}")
    return 0 if all(s["rc"] == 0 for s in summary) else 1


def write_docs(docs: Path, summary: list[dict[str, Any]]) -> None:
    """docs/benchmarks.md: every benchmark's output with the command that produced it."""
    lines = [
        "# Benchmark results",
        "",
        "Written by `python bench/run.py` (see the [user guide](guide.md), section 6). Each section shows the",
        "commands, the machine and date of its run, and the output as printed. The convergence and link",
        "studies are explained in [Convergence](convergence.md) and [Link benchmark](link.md).",
        "",
    ]

    def show(c: str) -> str:
        if c == sys.executable:
            return "python"
        return os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c

    for s in summary:
        cmds = "\n".join(" ".join(show(c) for c in cmd) for cmd in s["commands"])
        note = f"{s.get('date', '')}, {s.get('machine', '')}, {s['seconds']:.0f} s"
        note += " (--quick)" if s.get("quick") else ""
        status = "" if s["rc"] == 0 else f" (exit status {s['rc']})"
        lines += [f"## {s['name']}{status}", "", note, "", "```sh", cmds, "```", "", "```text"]
        lines += [Path(s["stdout"]).read_text().strip(), "```", ""]
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "benchmarks.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
