"""``gcodec demo``: compressed data-parallel training with real worker processes.

The demo trains a small MLP (64-256-256-10, ReLU; 85 k parameters) on the UCI handwritten digits
that ship inside gcodec (:mod:`gcodec.demo.data`) with ``workers`` real processes: torch
DistributedDataParallel over gloo with :func:`gcodec.torch.comm_hook` (the default), or
:func:`gcodec.mpi.allreduce` under ``mpiexec``. It trains once per codec of
:data:`~gcodec.demo.runs.DEMO_RUNS`, from the same initial weights and batches, and reports bits per
element, bytes per step per worker, compression ratio, encode/decode time and test accuracy against
the uncompressed run.

The process layout: this process (the launcher, :mod:`gcodec.demo.launch`) writes a job file,
starts the ranks (``python -m gcodec.demo.worker``), fills the Numba kernel cache for the codecs
while they import torch (so the ranks load compiled kernels instead of compiling them twice), shows
a progress bar from rank 0's progress lines, and prints the table from rank 0's results.

The codec tour (every codec's size, error and speed on real gradients, and a bundle) is
:func:`run_tour` (``gcodec tour`` or ``gcodec demo --tour``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import __version__
from ..jsonsafe import json_safe
from .data import train_test_split
from .model import MLP, SEED, DemoSizes, collect_gradients, heavy_tailed, make_dataset
from .progress import Progress
from .runs import DEMO_RUNS, Settings, demo_specs, run_spec
from .tour import codec_label, codec_variants
from .tour_report import _table, iter_text, pyplot, run_tour
from .training import train

__all__ = [
    "DEMO_RUNS",
    "MLP",
    "SEED",
    "DemoSizes",
    "Settings",
    "codec_label",
    "codec_variants",
    "collect_gradients",
    "demo_settings",
    "demo_table",
    "heavy_tailed",
    "iter_text",
    "make_dataset",
    "run_demo",
    "run_spec",
    "run_tour",
    "train",
    "train_test_split",
    "write_plot",
]


def demo_settings(quick: bool = False) -> Settings:
    """The demo's settings; ``quick`` (the tests) trains 6 epochs instead of 12."""
    return Settings(epochs=6) if quick else Settings()


def warm_kernels(specs: list[dict[str, Any]]) -> None:
    """Encode and decode a small tensor with every codec of ``specs``: on a fresh install this
    compiles the Numba kernels once, into the on-disk cache the worker processes then load."""
    for spec in specs:
        if spec.get("hook") == "gcodec" and spec.get("codec") is not None:
            try:
                warm_codec(spec["codec"])
            except Exception:  # the run itself will report it
                pass


def warm_codec(config: Any, error_feedback: bool = False) -> None:
    """Encode (through :class:`gcodec.ErrorFeedback` when ``error_feedback``: its fused kernels are
    others), decode and sum a small tensor with one codec: the first call of a Numba kernel in a
    process loads or compiles it. Low-rank codecs are left out: they run matrix products in the
    transport."""
    import numpy as np

    from ..api import decode
    from ..codecs import get_codec
    from ..feedback import ErrorFeedback

    codec = get_codec(config)
    if codec.low_rank:
        return
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    buf = ErrorFeedback(codec).encode(x, "warm") if error_feedback else codec.encode(x, key="warm")
    decode(buf)
    # the transports sum into their buffers: the quantizers compile that kernel apart
    decode(buf, out=np.zeros_like(x), accumulate=True)


def run_demo(
    workers: int = 2,
    mpi: bool = False,
    quick: bool = False,
    progress: bool = True,
    settings: Settings | None = None,
    specs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Train every demo run on ``workers`` processes; return the results (JSON-safe).

    ``result["runs"]`` holds one dict per codec, in order, with ``label``, ``codec`` (config),
    ``error_feedback``, ``bits_per_element``, ``bytes_per_step`` (what one worker puts on the wire
    per step once compression has started, its dense tensors included), ``ratio`` (32 /
    bits_per_element), ``encode_ms``/``decode_ms`` per step, ``accuracy`` (final test accuracy),
    ``delta_accuracy`` (minus the uncompressed run's) and ``curve`` (test accuracy over training).
    """
    from .launch import run_job

    s = settings or demo_settings(quick)
    specs = specs if specs is not None else demo_specs()
    n_train = len(train_test_split(s.seed)[1])
    steps = (n_train // (s.batch * workers)) * s.epochs
    bar = Progress([sp["label"] for sp in specs], steps) if progress else None
    t0 = time.perf_counter()

    def warm() -> None:
        warm_kernels(specs)

    try:
        if bar is not None:
            bar.phase("starting workers")
        result = run_job(
            specs,
            s,
            workers,
            "mpi" if mpi else "gloo",
            progress=None if bar is None else bar.step,
            # the launcher fills the kernel cache while the workers import torch
            before_wait=warm if bar is None else bar.during("compiling kernels", warm),
        )
    finally:
        if bar is not None:
            bar.close()
    runs = result["runs"]
    base = next((r for r in runs if r.get("ok") and r["codec"] is None), None)
    for r in runs:
        if r.get("ok"):
            r["ratio"] = 32.0 / r["bits_per_element"]
            r["delta_accuracy"] = None if base is None else r["accuracy"] - base["accuracy"]
    return json_safe(
        {
            "gcodec_version": __version__,
            "model": f"MLP 64-{'-'.join(map(str, s.hidden))}-10 (ReLU)",
            "dataset": "UCI handwritten digits (8x8), 1438 train / 359 test",
            "transport": "MPI (gcodec.mpi.allreduce)" if mpi else "torch DDP over gloo + gcodec.torch.comm_hook",
            "workers": result["workers"],
            "cpu_count": os.cpu_count(),
            "settings": s.to_dict(),
            "steps_per_run": steps,
            "elapsed_s": time.perf_counter() - t0,
            "runs": runs,
        }
    )


def demo_table(result: Mapping[str, Any]) -> Iterator[str]:
    """The demo's report, line by line."""
    s = result["settings"]
    yield (
        f"gcodec {result['gcodec_version']} demo: {result['model']} on {result['dataset']}, "
        f"{result['workers']} workers ({result['transport']})"
    )
    yield (
        f"{s['epochs']} epochs x {result['steps_per_run'] // max(1, s['epochs'])} steps, "
        f"batch {s['batch']} per worker, "
        f"SGD lr {s['lr']}{' (cosine)' if s['cosine'] else ''}; compression from step {s['start_iter']}, "
        f"tensors under {s['min_numel']} elements dense"
    )
    yield ""
    headers = ["codec", "bits/el", "bytes/step/worker", "ratio", "enc ms", "dec ms", "test acc", "vs uncompressed"]
    rows, failed = [], []
    for r in result["runs"]:
        if not r.get("ok"):
            failed.append(f"{r['label']}: FAILED ({r.get('error')})")
            continue
        d = r.get("delta_accuracy")
        rows.append(
            [
                r["label"],
                f"{r['bits_per_element']:.2f}",
                f"{r['bytes_per_step']:,.0f}",
                f"{r['ratio']:.1f}x",
                f"{r['encode_ms']:.2f}",
                f"{r['decode_ms']:.2f}",
                f"{100 * r['accuracy']:.1f} %",
                "" if d is None or r["codec"] is None else f"{100 * d:+.1f} pt",
            ]
        )
    yield from _table(headers, rows)
    yield from failed
    yield ""
    yield (
        "bits/el and bytes: what one worker encodes per step once compression runs (dense tensors included);\n"
        "enc/dec ms: gcodec's encode and decode time per step on one worker; one test image is 0.28 pt."
    )
    yield f"Done in {result['elapsed_s']:.1f} s."


def write_plot(result: Mapping[str, Any], path: str | Path) -> str | None:
    """Write the test-accuracy curves as a PNG; returns None, or why not (matplotlib missing)."""
    plt, why = pyplot()
    if plt is None:
        return why
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for r in result["runs"]:
        if r.get("ok"):
            ep = [c["epoch"] for c in r["curve"]]
            acc = [c["accuracy"] for c in r["curve"]]
            label = f"{r['label']} ({r['bits_per_element']:.2f} b/el)"
            ax.plot(ep, acc, label=label, lw=2.2 if r["codec"] is None else 1.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"gcodec demo: {result['model']}, digits, {result['workers']} workers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
