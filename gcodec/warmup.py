"""Compile every kernel ahead of time, so that the first encode of a fresh process is fast.

gcodec's CPU kernels are compiled by Numba on first use and cached on disk (``cache=True``, in
``__pycache__`` beside the sources, or ``NUMBA_CACHE_DIR``). A fresh job with an empty cache pays the
compile on every rank's first step (1.5-3 s per codec setting); :func:`warmup` (``gcodec warmup`` on
the command line) runs codecs through encode, validate, decode and accumulate on small inputs of
every dtype, so that an image build or an install step fills the cache once. It changes nothing else
and is safe to run again: with a filled cache it only loads what is there. Numba compiles on one
core; ``jobs=`` (``gcodec warmup --jobs N``) compiles the settings in N processes at once, each
writing its own kernels' cache files (a kernel two settings share may be compiled by both: the
cache keeps one).

The quantizers compile one kernel per setting (code width, rule, rounding, scale type), so that a
job compiles only what it uses. By default every codec is warmed up at its defaults plus
:data:`WARMUP_CONFIGS`; a job with other settings names them (``gcodec warmup --codec
'{"id": "uniform", "bits": 4, "rounding": "stochastic"}'``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

import numpy as np

from .api import decode, encode, validate
from .arrays import DTYPES
from .codecs.registry import get_codec, list_codecs
from .feedback import ErrorFeedback

__all__ = ["WARMUP_CONFIGS", "warm_for_training", "warmup"]

#: The codec settings warmed up besides every codec at its defaults: common settings that compile
#: kernels of their own (other widths, stochastic rounding, float16 scales, nested values).
WARMUP_CONFIGS: list[dict[str, Any]] = [
    {"id": "uniform", "bits": 4},
    {"id": "uniform", "bits": 2},
    {"id": "uniform", "bits": 8, "rounding": "stochastic"},
    {"id": "uniform", "bits": 4, "rounding": "stochastic"},
    {"id": "uniform", "bits": 8, "scale_dtype": "float16"},
    {"id": "qsgd", "bucket_size": 0},
    {"id": "terngrad", "clip": 2.5},
    {"id": "sign", "group_size": 0},
    {"id": "topk", "index_coding": "raw"},
    {"id": "topk", "values": {"id": "uniform", "bits": 8}},
    {"id": "randomk", "values": {"id": "fp16"}},
    {"id": "powersgd", "rank": 2},
]


def _inputs(dtype: np.dtype) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    # small tensors (the one-thread path; 64 elements: whole-tensor groups of 64 take the kernels'
    # literal group-of-64 path) and one above the threading threshold (the pool path)
    shapes = ((64,), (64, 33), (300, 300))
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def warmup(
    codecs: Iterable[str | dict[str, Any]] | None = None,
    *,
    progress: Callable[[str, float], None] | None = None,
    jobs: int = 1,
) -> dict[str, float]:
    """Compile (or load from the cache) every kernel the given codecs use; returns seconds per codec.

    ``codecs``: ids or configs; default every registered codec at its defaults plus
    :data:`WARMUP_CONFIGS`. ``progress(label, seconds)`` is called after each one. ``jobs``: how
    many processes compile at once (each setting is one task, handed to whichever process is free;
    a new process imports gcodec first, about a second).
    """
    configs: list[Any] = list(codecs) if codecs is not None else [*list_codecs(), *WARMUP_CONFIGS]
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    times: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        results: Iterable[tuple[str, float]] = map(_warm_one, configs)
        if jobs > 1 and len(configs) > 1:
            # spawned, not forked: a forked child would inherit a started kernel thread pool's locks
            pool = stack.enter_context(ProcessPoolExecutor(min(jobs, len(configs)), mp_context=get_context("spawn")))
            results = (f.result() for f in as_completed([pool.submit(_warm_one, cfg) for cfg in configs]))
        for label, seconds in results:
            times[label] = seconds
            if progress is not None:
                progress(label, seconds)
    return times


def _warm_one(cfg: str | dict[str, Any]) -> tuple[str, float]:
    """One codec setting through every path :func:`warmup` warms: (its repr, seconds)."""
    codec = get_codec(cfg)
    t0 = time.perf_counter()
    for dtype in DTYPES.values():
        for x in _inputs(dtype):
            buf = encode(x, codec, key="warmup", step=0)
            validate(buf)
            y = decode(buf)
            for out_dtype in (np.float32, np.float64):
                acc = np.zeros(x.shape, out_dtype)
                decode(buf, out=acc, accumulate=True)
            decode(buf, out=np.empty_like(y))
    ErrorFeedback(codec).encode(_inputs(np.dtype(np.float32))[-1], key="warmup", step=0)
    return repr(codec), time.perf_counter() - t0


def warm_for_training(
    codecs: Iterable[Any],
    dtypes: Iterable[Any] = (np.float32,),
    *,
    error_feedback: bool = True,
) -> float:
    """Load (or compile) the kernels a training job's exchanges will run for ``codecs`` on
    gradients of ``dtypes``, now, so that the first compressed step does not: the engines call it
    when they are configured (``HookState(..., warm=True)``), before any collective, so that a rank
    compiling for seconds never keeps its peers waiting in one. Returns the seconds it took.

    Per codec and dtype, on a small tensor (the calling thread) and one past the threading
    threshold (the kernel pool): the encode (through error feedback's fused kernels when
    ``error_feedback``), the decode, the decode that adds into a float32 sum (gather, two-phase),
    and for summable codecs the values path (encode_values, the pair sum and its decode). A codec
    that refuses a dtype, or a setting, is skipped here: the exchange reports it itself.
    """
    from .aggregate import sum_pair, summable_section

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    for cfg in codecs:
        try:
            codec = get_codec(cfg)
        except Exception:  # a bad configuration is the engine's to report
            continue
        for dt in {np.dtype(d) for d in dtypes}:
            for shape in ((320, 320),):  # past the threading threshold: the pool starts too
                x = rng.standard_normal(shape).astype(dt)
                try:
                    if error_feedback:
                        buf = ErrorFeedback(codec).encode(x, key="warm", step=0)
                    else:
                        buf = encode(x, codec, key="warm", step=0)
                    decode(buf)
                    decode(buf, out=np.zeros(shape, np.float32), accumulate=True)
                    if codec.values_dtype is not None:
                        a = bytearray(bytes(buf))
                        values, vdt = summable_section(a)
                        sum_pair(values, values.copy(), values, vdt)
                        codec.decode_values_sum(values, values, np.empty(x.size, np.float32))
                except Exception:
                    continue
    return time.perf_counter() - t0
