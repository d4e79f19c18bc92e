"""``gcodec tour`` (also ``gcodec demo --tour``): a tour of every registered codec on real gradients.

The tour runs in four steps, each printed as soon as it is done:

1. **Real gradients.** A small NumPy MLP (ReLU hidden layer, softmax output, hand-written
   backprop) trains for a few SGD steps on synthetic classification data made with a fixed seed;
   its per-layer gradients are what the codecs compress. One larger heavy-tailed tensor
   (Student-t, 3 degrees of freedom, ~4 M elements) stands in for a big layer and gives the speeds.
2. **Every codec.** Each registered codec (``gcodec.list_codecs()``, so codecs added later appear
   by themselves) encodes, validates and decodes both; the table shows bits per element, the
   ratio against fp32, the relative L2 error ``||decoded - x|| / ||x||``, the gradient-norm ratio
   ``||decoded|| / ||x||`` (below 0.9 for long suggests over-compression) and encode
   and decode speed in GB/s of fp32 input (best of 3). A codec that fails is reported, not fatal.
3. **A bundle.** All the MLP's gradients travel in one payload with one header.
4. **Compressed training.** The MLP trains with two simulated workers whose gradients are
   compressed (with and without :class:`gcodec.ErrorFeedback`), summed on decode, and averaged;
   final loss and accuracy are compared with uncompressed SGD.

Everything here is deterministic given :data:`SEED` except the timings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import __version__
from ..codecs.registry import list_codecs
from ..jsonsafe import json_safe
from .model import SEED, DemoSizes, collect_gradients, heavy_tailed
from .tour import bundle_report, codec_tour
from .training import WORKERS, _threads, training_report


def run_tour(quick: bool = False, emit: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the four steps; return the results as a JSON-safe dict.

    ``emit`` (when given) receives each step's human-readable text as soon as the step is done.
    """
    sizes = DemoSizes.quick() if quick else DemoSizes.full()
    t_start = time.perf_counter()
    say = emit or (lambda s: None)
    result: dict[str, Any] = {
        "gcodec_version": __version__,
        "quick": quick,
        "seed": SEED,
        "cpu_count": os.cpu_count(),
        "numba_threads": _threads(),
        "codecs_registered": list_codecs(),
    }
    say(_fmt_intro(result))

    grads = collect_gradients(sizes)
    big = heavy_tailed(sizes.big_shape)
    result["gradients"] = {
        "model": f"MLP {sizes.d_in}-{sizes.hidden}-{sizes.classes} (ReLU, softmax cross-entropy)",
        "step": sizes.warmup_steps + 1,
        "batch": sizes.batch,
        "tensors": {
            k: {"shape": list(g.shape), "rms": float(np.sqrt(np.mean(g.astype(np.float64) ** 2)))}
            for k, g in grads.items()
        },
        "elements": sum(g.size for g in grads.values()),
        "big": {"distribution": "Student-t(3) x 1e-3", "shape": list(big.shape), "elements": int(big.size)},
    }
    say(_fmt_gradients(result["gradients"]))

    result["codecs"] = codec_tour(grads, big, sizes.repeats)
    result["timing_repeats"] = sizes.repeats
    say(_fmt_codecs(result))

    result["bundle"] = bundle_report(grads)
    say(_fmt_bundle(result["bundle"], result["gradients"]["elements"]))

    result["training"] = {
        "workers": WORKERS,
        "steps": sizes.train_steps,
        "batch": sizes.batch,
        "lr": sizes.lr,
        "runs": training_report(sizes),
    }
    say(_fmt_training(result["training"]))
    result["elapsed_s"] = time.perf_counter() - t_start
    say(f"Done in {result['elapsed_s']:.1f} s.")
    return json_safe(result)


def _f(v: Any, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _fmt_intro(r: Mapping[str, Any]) -> str:
    mode = " (quick)" if r["quick"] else ""
    return (
        f"gcodec {r['gcodec_version']} demo{mode}: encode -> validate -> decode real gradients with every codec\n"
        f"registered codecs: {', '.join(r['codecs_registered'])}\n"
        f"CPU: {r['cpu_count']} core(s), numba threads: {r['numba_threads']}\n"
    )


def _fmt_gradients(g: Mapping[str, Any]) -> str:
    lines = [f"1. Real gradients: {g['model']}, step {g['step']}, batch {g['batch']}"]
    for k, t in g["tensors"].items():
        lines.append(f"   {k:<12} {'x'.join(map(str, t['shape'])):>8}   rms {t['rms']:.3e}")
    b = g["big"]
    lines.append(
        f"   plus a heavy-tailed tensor: {b['distribution']}, shape {'x'.join(map(str, b['shape']))}"
        f" ({b['elements'] / 1e6:.1f} M elements) for the speeds"
    )
    return "\n".join(lines) + "\n"


def pyplot() -> tuple[Any, str | None]:
    """matplotlib's pyplot on the Agg backend, or (None, why not) when matplotlib is missing: what
    every plot of the demo and the benchmarks starts with."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "no plot: matplotlib is not installed (pip install 'gcodec[bench]')"
    return plt, None


def _table(headers: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """A text table: ``left`` columns left-aligned, the rest right-aligned (the demo's and the tour's)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _fmt_codecs(r: Mapping[str, Any]) -> str:
    rows, failed = [], []
    for c in r["codecs"]:
        if not c["ok"]:
            failed.append(f"   {c['label']}: FAILED ({c['error']})")
            continue
        b, m = c["big"], c["mlp"]
        rows.append(
            [
                c["label"],
                _f(b["bits_per_element"], ".2f"),
                _f(b["ratio"], ".2f") + "x",
                _f(m["rel_error"], ".2e"),
                _f(m["norm_ratio"], ".3f"),
                _f(m["ratio"], ".2f") + "x",
                _f(b["rel_error"], ".2e"),
                _f(b["norm_ratio"], ".3f"),
                _f(b["encode_gbps"], ".2f"),
                _f(b["decode_gbps"], ".2f"),
            ]
        )
    headers = [
        "codec",
        "bits/el",
        "ratio",
        "MLP err",
        "MLP norm",
        "MLP ratio",
        "t3 err",
        "t3 norm",
        "enc GB/s",
        "dec GB/s",
    ]
    lines = [
        "2. Every codec. err = ||decoded - x|| / ||x||, norm = ||decoded|| / ||x||; bits/el, ratio (vs fp32) and",
        "   speeds on the heavy-tailed tensor (GB/s of fp32 input, best of "
        f"{r['timing_repeats']}); MLP ratio counts one payload per layer.",
        *("   " + s for s in _table(headers, rows)),
        *failed,
    ]
    return "\n".join(lines) + "\n"


def _fmt_bundle(rows: list[Mapping[str, Any]], elements: int) -> str:
    table, failed = [], []
    for b in rows:
        if not b["ok"]:
            failed.append(f"   {b['label']}: FAILED ({b['error']})")
            continue
        table.append(
            [
                b["label"],
                str(b["nbytes"]),
                str(b["header_nbytes"]),
                f"{b['overhead_per_tensor']:.0f}",
                str(b["separate_nbytes"]),
                f"{b['separate_overhead_per_tensor']:.0f}",
                f"{b['ratio']:.2f}x",
                "yes" if b["matches_separate_decode"] else "NO",
            ]
        )
    headers = [
        "codecs",
        "bytes",
        "header",
        "overhead/tensor",
        "separate: bytes",
        "overhead/tensor",
        "ratio",
        "same decode",
    ]
    lines = [
        f"3. One bundle: the MLP's gradients ({elements} elements) in one payload with one header,",
        "   against one payload per tensor. overhead = bytes - section bytes (preamble, header, padding, CRC)",
        *("   " + s for s in _table(headers, table)),
        *failed,
    ]
    return "\n".join(lines) + "\n"


def _fmt_training(t: Mapping[str, Any]) -> str:
    lines = [
        f"4. Compressed training: {t['workers']} workers, {t['steps']} SGD steps, batch {t['batch']}, "
        f"lr {t['lr']}; the receiver sums payloads as it decodes (decode(..., accumulate=True))"
    ]
    table, failed = [], []
    for r in t["runs"]:
        if not r["ok"]:
            failed.append(f"   {r['label']}: FAILED ({r['error']})")
            continue
        table.append(
            [
                r["label"],
                f"{r['bits_per_element']:.2f}",
                f"{r['train_loss']:.3f}",
                f"{r['train_accuracy']:.3f}",
                f"{r['test_loss']:.3f}",
                f"{r['test_accuracy']:.3f}",
                _f(r["mean_norm_ratio"], ".3f"),
            ]
        )
    headers = ["run", "bits/el sent", "train loss", "train acc", "test loss", "test acc", "mean norm ratio"]
    lines += ["   " + s for s in _table(headers, table)] + failed
    return "\n".join(lines) + "\n"


def iter_text(result: Mapping[str, Any]) -> Iterator[str]:
    """The human-readable report of a finished :func:`run_tour` result."""
    yield _fmt_intro(result)
    yield _fmt_gradients(result["gradients"])
    yield _fmt_codecs(result)
    yield _fmt_bundle(result["bundle"], result["gradients"]["elements"])
    yield _fmt_training(result["training"])
