"""Simulated compressed data-parallel training of the demo MLP (two workers in one process)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..api import decode
from ..codecs.base import Codec
from ..codecs.registry import get_codec, list_codecs
from ..feedback import ErrorFeedback
from ..threads import get_num_threads, num_threads
from .model import MLP, SEED, DemoSizes, make_dataset
from .tour import TRAINING_CANDIDATES, _err_text, _errors, codec_label

WORKERS = 2


def _training_runs(max_codecs: int = 2) -> list[tuple[str, Codec | None, bool]]:
    registered = set(list_codecs())
    runs: list[tuple[str, Codec | None, bool]] = [("fp32 (uncompressed)", None, False)]
    chosen: list[Codec] = []
    for cid, params in TRAINING_CANDIDATES:
        if cid in registered and len(chosen) < max_codecs:
            try:
                chosen.append(get_codec(cid, **params))
            except Exception:
                continue
    for i, c in enumerate(chosen):
        runs.append((codec_label(c) + " + EF", c, True))
        if i == 0:
            runs.append((codec_label(c) + " (no EF)", c, False))
    return runs


@contextlib.contextmanager
def _numba_threads(n: int) -> Iterator[None]:
    """Run Numba's parallel kernels on ``n`` threads inside the block.

    Step 4 encodes tiny tensors thousands of times; each simulated worker is one thread, and
    waking a thread pool for a few hundred elements costs more than the work (on a busy machine,
    milliseconds per call).
    """
    with num_threads(min(n, get_num_threads())):
        yield


def train(sizes: DemoSizes, codec: Codec | None, error_feedback: bool, seed: int = SEED) -> dict[str, Any]:
    """SGD with ``WORKERS`` simulated workers; each compresses its gradient, the sum is decoded.

    Every run starts from the same weights and sees the same batches. With ``codec=None`` the
    workers' fp32 gradients are averaged exactly. ``mean_norm_ratio`` averages, over the steps,
    ``||sum of decoded|| / ||sum of what was encoded||`` (with error feedback, what is encoded is
    the gradient plus the residual), the over-compression monitor.
    """
    with _numba_threads(1):
        return _train(sizes, codec, error_feedback, seed)


def _train(sizes: DemoSizes, codec: Codec | None, error_feedback: bool, seed: int) -> dict[str, Any]:
    xtr, ytr, xte, yte = make_dataset(sizes, seed)
    model = MLP(sizes.d_in, sizes.hidden, sizes.classes, seed)
    rng = np.random.default_rng(seed + 4)
    part = sizes.batch // WORKERS
    # each worker owns a codec instance (stateful codecs keep per-key state) and its residuals
    workers = [get_codec(codec.get_config()) if codec is not None else None for _ in range(WORKERS)]
    efs = [ErrorFeedback(c) if (c is not None and error_feedback) else None for c in workers]
    sent = 0
    norm_ratios = []
    t0 = time.perf_counter()
    for step in range(sizes.train_steps):
        idx = rng.integers(0, len(ytr), sizes.batch)
        local = [
            model.gradients(xtr[idx[w * part : (w + 1) * part]], ytr[idx[w * part : (w + 1) * part]])[1]
            for w in range(WORKERS)
        ]
        exact = {k: np.stack([g[k] for g in local]).mean(axis=0) for k in model.params}
        if codec is None:
            avg = exact
            sent += sum(4 * g.size for g in exact.values()) * WORKERS
        else:
            acc = {k: np.zeros_like(v) for k, v in model.params.items()}
            sent_in = {k: np.zeros_like(v) for k, v in model.params.items()}
            for w in range(WORKERS):
                for k, g in local[w].items():
                    ef, c = efs[w], workers[w]
                    if ef is not None:
                        e = ef.residual(k)
                        sent_in[k] += g if e is None else g + e  # what the codec really compresses
                        buf = ef.encode(g, key=k, step=step)
                    else:
                        sent_in[k] += g
                        assert c is not None
                        buf = c.encode(g, key=k, step=step)
                    sent += len(memoryview(buf))
                    decode(buf, out=acc[k], accumulate=True)  # the receiver sums as it decodes
            avg = {k: v / WORKERS for k, v in acc.items()}
            norm_ratios.append(_errors(list(acc.values()), list(sent_in.values()))[1])
        model.sgd(avg, sizes.lr)
    elapsed = time.perf_counter() - t0
    train_loss, train_acc = model.evaluate(xtr, ytr)
    test_loss, test_acc = model.evaluate(xte, yte)
    n = model.num_params
    return {
        "train_loss": train_loss,
        "train_accuracy": train_acc,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "bits_per_element": 8.0 * sent / (n * WORKERS * sizes.train_steps),
        "mean_norm_ratio": float(np.mean(norm_ratios)) if norm_ratios else 1.0,
        "seconds": elapsed,
    }


def training_report(sizes: DemoSizes) -> list[dict[str, Any]]:
    out = []
    for label, codec, ef in _training_runs():
        row: dict[str, Any] = {
            "label": label,
            "codec": None if codec is None else codec.get_config(),
            "error_feedback": ef,
        }
        try:
            row.update(ok=True, **train(sizes, codec, ef))
        except Exception as e:
            row.update(ok=False, error=_err_text(e))
        out.append(row)
    return out


# --------------------------------------------------------------------------------------------
# running and printing


def _threads() -> int:
    return get_num_threads()
