"""``gcodec demo``: a tour of every registered codec on real gradients.

The tour runs in four steps, each printed as soon as it is done:

1. **Real gradients.** A small NumPy MLP (ReLU hidden layer, softmax output, hand-written
   backprop) trains for a few SGD steps on synthetic classification data made with a fixed seed;
   its per-layer gradients are what the codecs compress. One larger heavy-tailed tensor
   (Student-t, 3 degrees of freedom, ~4 M elements) stands in for a big layer and gives the speeds.
2. **Every codec.** Each registered codec (``gcodec.list_codecs()``, so codecs added later appear
   by themselves) encodes, validates and decodes both; the table shows bits per element, the
   ratio against fp32, the relative L2 error ``||decoded - x|| / ||x||``, the gradient-norm ratio
   ``||decoded|| / ||x||`` (DESIGN.md §1: below 0.9 for long suggests over-compression) and encode
   and decode speed in GB/s of fp32 input (best of 3). A codec that fails is reported, not fatal.
3. **A bundle.** All the MLP's gradients travel in one payload with one header.
4. **Compressed training.** The MLP trains with two simulated workers whose gradients are
   compressed (with and without :class:`gcodec.ErrorFeedback`), summed on decode, and averaged;
   final loss and accuracy are compared with uncompressed SGD.

Everything here is deterministic given :data:`SEED` except the timings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from . import __version__
from .api import decode, decode_bundle, encode_bundle, validate
from .codecs.base import Codec
from .codecs.registry import codec_class, get_codec, list_codecs
from .feedback import ErrorFeedback

__all__ = [
    "MLP",
    "SEED",
    "DemoSizes",
    "codec_label",
    "codec_variants",
    "collect_gradients",
    "heavy_tailed",
    "make_dataset",
    "run_demo",
]

#: Seed of every random draw in the demo (data, initial weights, batches, the heavy-tailed tensor).
SEED = 0


@dataclasses.dataclass(frozen=True)
class DemoSizes:
    """How big the demo is. ``full()`` is ``gcodec demo``; ``quick()`` is ``--quick`` (tests)."""

    d_in: int
    hidden: int
    classes: int
    n_train: int
    n_test: int
    warmup_steps: int  # SGD steps before the gradients of step 2 are collected
    big_shape: tuple[int, int]  # the heavy-tailed tensor
    repeats: int  # timings: best of this many
    train_steps: int  # step 4
    batch: int  # global batch of step 4, split between the workers
    lr: float

    @classmethod
    def full(cls) -> DemoSizes:
        return cls(48, 64, 10, 8192, 2048, 5, (2048, 2048), 3, 120, 256, 0.5)

    @classmethod
    def quick(cls) -> DemoSizes:
        return cls(16, 32, 10, 1024, 512, 3, (256, 256), 1, 40, 128, 0.5)


# --------------------------------------------------------------------------------------------
# Step 1: real gradients from a small MLP


def make_dataset(sizes: DemoSizes, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic classification: Gaussian inputs labelled by a random tanh teacher network.

    Returns ``(X_train, y_train, X_test, y_test)``. The labels are a nonlinear function of the
    inputs, so a linear model cannot fit them and the hidden layer's gradients matter.
    """
    rng = np.random.default_rng(seed)
    n = sizes.n_train + sizes.n_test
    x = rng.standard_normal((n, sizes.d_in)).astype(np.float32)
    w = rng.standard_normal((sizes.d_in, 32)) / math.sqrt(sizes.d_in)
    v = rng.standard_normal((32, sizes.classes))
    y = np.argmax(np.tanh(x @ w) @ v, axis=1)
    return x[: sizes.n_train], y[: sizes.n_train], x[sizes.n_train :], y[sizes.n_train :]


class MLP:
    """``softmax(relu(x W1 + b1) W2 + b2)`` with cross-entropy loss and hand-written backprop."""

    def __init__(self, d_in: int, hidden: int, classes: int, seed: int = SEED) -> None:
        rng = np.random.default_rng(seed + 1)
        self.params: dict[str, np.ndarray] = {
            "fc1.weight": (rng.standard_normal((d_in, hidden)) * math.sqrt(2.0 / d_in)).astype(np.float32),
            "fc1.bias": np.zeros(hidden, np.float32),
            "fc2.weight": (rng.standard_normal((hidden, classes)) * math.sqrt(1.0 / hidden)).astype(np.float32),
            "fc2.bias": np.zeros(classes, np.float32),
        }

    @property
    def num_params(self) -> int:
        return sum(p.size for p in self.params.values())

    def copy(self) -> MLP:
        m = MLP.__new__(MLP)
        m.params = {k: v.copy() for k, v in self.params.items()}
        return m

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = self.params
        z = x @ p["fc1.weight"] + p["fc1.bias"]
        a = np.maximum(z, 0)
        logits = a @ p["fc2.weight"] + p["fc2.bias"]
        logits = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return z, a, e / e.sum(axis=1, keepdims=True)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(mean cross-entropy, accuracy)."""
        _, _, prob = self._forward(x)
        rows = np.arange(len(y))
        return float(-np.log(prob[rows, y] + 1e-12).mean()), float((prob.argmax(axis=1) == y).mean())

    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """(loss, {name: dLoss/dparam as float32}) on one batch."""
        p = self.params
        z, a, prob = self._forward(x)
        n = len(y)
        rows = np.arange(n)
        loss = float(-np.log(prob[rows, y] + 1e-12).mean())
        g = prob.copy()  # d loss / d logits
        g[rows, y] -= 1.0
        g /= n
        ga = g @ p["fc2.weight"].T
        ga[z <= 0] = 0.0  # through the ReLU
        grads = {
            "fc1.weight": x.T @ ga,
            "fc1.bias": ga.sum(axis=0),
            "fc2.weight": a.T @ g,
            "fc2.bias": g.sum(axis=0),
        }
        return loss, {k: v.astype(np.float32) for k, v in grads.items()}

    def sgd(self, grads: Mapping[str, np.ndarray], lr: float) -> None:
        for k, g in grads.items():
            self.params[k] -= np.float32(lr) * g


def collect_gradients(sizes: DemoSizes, seed: int = SEED) -> dict[str, np.ndarray]:
    """Train the MLP ``warmup_steps`` SGD steps, then return the next step's per-layer gradients."""
    xtr, ytr, _, _ = make_dataset(sizes, seed)
    model = MLP(sizes.d_in, sizes.hidden, sizes.classes, seed)
    rng = np.random.default_rng(seed + 2)
    for _ in range(sizes.warmup_steps):
        idx = rng.integers(0, len(ytr), sizes.batch)
        _, g = model.gradients(xtr[idx], ytr[idx])
        model.sgd(g, sizes.lr)
    idx = rng.integers(0, len(ytr), sizes.batch)
    return model.gradients(xtr[idx], ytr[idx])[1]


def heavy_tailed(shape: tuple[int, ...], seed: int = SEED) -> np.ndarray:
    """Student-t (3 degrees of freedom) float32 values scaled to gradient-like magnitudes (1e-3)."""
    rng = np.random.default_rng(seed + 3)
    return (rng.standard_t(3, size=shape) * 1e-3).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Step 2: every codec

#: Extra settings shown besides each codec's defaults, when the codec accepts them.
EXTRA_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "uniform": [{"bits": 4}, {"bits": 2}],
    "terngrad": [{"clip": 2.5}],  # the TernGrad paper's clipping at 2.5 standard deviations
}


def _accepts(cls: type[Codec], params: Mapping[str, Any]) -> bool:
    try:
        cls(**params)
    except Exception:
        return False
    return True


def codec_variants() -> list[tuple[str, dict[str, Any]]]:
    """(codec id, params) for every registered codec at its defaults, plus :data:`EXTRA_VARIANTS`."""
    out: list[tuple[str, dict[str, Any]]] = []
    for cid in list_codecs():
        out.append((cid, {}))
        try:
            cls = codec_class(cid)
        except Exception:
            continue
        out.extend((cid, dict(p)) for p in EXTRA_VARIANTS.get(cid, []) if _accepts(cls, p))
    return out


def codec_label(codec: Codec | str, params: Mapping[str, Any] | None = None) -> str:
    """``id k=v ...``: the codec's numeric params and any non-default ones (never seeds or unset ones)."""
    if isinstance(codec, Codec):
        cid, params, schema = codec.codec_id, codec.params, type(codec).PARAMS
    else:
        cid = codec
        try:
            schema = codec_class(cid).PARAMS
        except Exception:
            schema = {}
    parts = []
    for k, v in (params or {}).items():
        p = schema.get(k)
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        if k == "seed" or v is None or not (numeric or p is None or v != p.default):
            continue
        parts.append(f"{k}={v}")
    return " ".join([cid, *parts])


def _err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _timed_best(fn: Callable[[], Any], repeats: int, budget_s: float = 3.0) -> tuple[float, Any]:
    """Best wall time of up to ``repeats`` calls (fewer when one call exceeds ``budget_s``)."""
    best, result = math.inf, None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        if dt > budget_s:
            break
    return best, result


def _errors(decoded: list[np.ndarray], original: list[np.ndarray]) -> tuple[float, float]:
    """(relative L2 error, norm ratio) over a list of tensors taken together (float64 sums)."""
    num = sum(float(np.sum((d.astype(np.float64) - x.astype(np.float64)) ** 2)) for d, x in zip(decoded, original))
    ref = sum(float(np.sum(x.astype(np.float64) ** 2)) for x in original)
    dn = sum(float(np.sum(d.astype(np.float64) ** 2)) for d in decoded)
    if ref == 0:
        return (0.0 if num == 0 else math.inf), (1.0 if dn == 0 else math.inf)
    return math.sqrt(num / ref), math.sqrt(dn / ref)


def measure_codec(
    cid: str, params: Mapping[str, Any], grads: Mapping[str, np.ndarray], big: np.ndarray, repeats: int
) -> dict[str, Any]:
    """Encode, validate and decode the MLP gradients and the big tensor with one codec setting."""
    codec = get_codec(cid, **params)
    row: dict[str, Any] = {
        "id": cid,
        "label": codec_label(codec),
        "config": codec.get_config(),
        "aggregation": codec.aggregation.value,
    }
    # The MLP's gradients, one payload per layer (as a per-parameter hook would send them).
    dec, orig, nbytes = [], [], 0
    for name, g in grads.items():
        buf = codec.encode(g, key=name)
        info = validate(buf)
        y = decode(buf)
        assert isinstance(y, np.ndarray)
        if y.shape != g.shape or y.dtype != g.dtype:
            raise AssertionError(f"{name}: decoded {y.dtype}{list(y.shape)} from {g.dtype}{list(g.shape)}")
        dec.append(y)
        orig.append(g)
        nbytes += info.nbytes
    n = sum(g.size for g in grads.values())
    rel, norm = _errors(dec, orig)
    row["mlp"] = {
        "elements": n,
        "nbytes": nbytes,
        "bits_per_element": 8.0 * nbytes / n,
        "ratio": 4.0 * n / nbytes,
        "rel_error": rel,
        "norm_ratio": norm,
    }
    # The big heavy-tailed tensor: sizes from validate(), speeds as best of `repeats`.
    codec.encode(big[:64], key="warmup")  # compile or load the kernels outside the timing
    t_enc, buf = _timed_best(lambda: codec.encode(big, key="big"), repeats)
    info = validate(buf)
    out = np.empty_like(big)
    t_dec, _ = _timed_best(lambda: decode(buf, out=out), repeats)
    rel, norm = _errors([out], [big])
    row["big"] = {
        "elements": int(big.size),
        "nbytes": info.nbytes,
        "bits_per_element": info.bits_per_element,
        "ratio": info.ratio,
        "rel_error": rel,
        "norm_ratio": norm,
        "encode_gbps": big.size * 4 / t_enc / 1e9,
        "decode_gbps": big.size * 4 / t_dec / 1e9,
    }
    return row


def codec_tour(grads: Mapping[str, np.ndarray], big: np.ndarray, repeats: int) -> list[dict[str, Any]]:
    """One row per codec setting; a failing codec gives ``{"ok": False, "error": ...}``."""
    rows = []
    for cid, params in codec_variants():
        try:
            row = {"ok": True, **measure_codec(cid, params, grads, big, repeats)}
        except Exception as e:
            row = {"id": cid, "label": codec_label(cid, params), "ok": False, "error": _err_text(e)}
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Step 3: one bundle


def _section_bytes(buf: Any) -> int:
    return sum(s[3] for t in validate(buf).tensors for s in t.sections)


def bundle_report(grads: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """All gradients in one payload, for a couple of codec choices, against one payload each."""
    registered = set(list_codecs())
    choices: list[tuple[str, str | dict[str, str]]] = []
    if "fp16" in registered:
        choices.append(("fp16 for all", "fp16"))
    if "uniform" in registered and "fp16" in registered:
        mixed = {k: ("uniform" if k.endswith("weight") else "fp16") for k in grads}
        choices.append(("uniform weights, fp16 biases", mixed))
    if not choices:
        first = sorted(registered)[0]
        choices.append((f"{first} for all", first))
    out = []
    for label, spec in choices:
        try:
            buf = encode_bundle(grads, spec)
            info = validate(buf)
            dec = decode_bundle(buf)
            per = {k: (spec[k] if isinstance(spec, dict) else spec) for k in grads}
            singles = {k: get_codec(per[k]).encode(g, key=k) for k, g in grads.items()}
            same = all(np.array_equal(dec[k], get_codec(per[k]).decode(singles[k])) for k in grads)
            sep_bytes = sum(len(memoryview(b)) for b in singles.values())
            sep_sections = sum(_section_bytes(b) for b in singles.values())
            sections = _section_bytes(buf)
            n = len(grads)
            out.append(
                {
                    "label": label,
                    "ok": True,
                    "tensors": n,
                    "codecs": sorted({t.codec for t in info.tensors}),
                    "nbytes": info.nbytes,
                    "header_nbytes": info.header_nbytes,
                    "section_nbytes": sections,
                    "overhead_per_tensor": (info.nbytes - sections) / n,
                    "separate_nbytes": sep_bytes,
                    "separate_overhead_per_tensor": (sep_bytes - sep_sections) / n,
                    "original_nbytes": info.original_nbytes,
                    "ratio": info.ratio,
                    "matches_separate_decode": bool(same),
                }
            )
        except Exception as e:
            out.append({"label": label, "ok": False, "error": _err_text(e)})
    return out


# --------------------------------------------------------------------------------------------
# Step 4: compressed training

#: Lossy codecs tried in step 4, first registered ones first; each runs with error feedback, and
#: the first also without, to show what the feedback buys.
TRAINING_CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("topk", {}),
    ("sign", {}),
    ("uniform", {"bits": 2}),
    ("terngrad", {}),
    ("qsgd", {}),
    ("uniform", {"bits": 4}),
]
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
    try:
        import numba

        old = numba.get_num_threads()
        numba.set_num_threads(min(n, old))
    except Exception:  # pragma: no cover - numba is a core dependency
        yield
        return
    try:
        yield
    finally:
        numba.set_num_threads(old)


def train(sizes: DemoSizes, codec: Codec | None, error_feedback: bool, seed: int = SEED) -> dict[str, Any]:
    """SGD with ``WORKERS`` simulated workers; each compresses its gradient, the sum is decoded.

    Every run starts from the same weights and sees the same batches. With ``codec=None`` the
    workers' fp32 gradients are averaged exactly. ``mean_norm_ratio`` averages, over the steps,
    ``||sum of decoded|| / ||sum of what was encoded||`` (with error feedback, what is encoded is
    the gradient plus the residual), the over-compression monitor of DESIGN.md §1.
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
    try:
        import numba

        return int(numba.get_num_threads())
    except Exception:  # pragma: no cover
        return 1


def run_demo(quick: bool = False, emit: Callable[[str], None] | None = None) -> dict[str, Any]:
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


def json_safe(obj: Any) -> Any:
    """NaN and infinities become None (strict JSON); tuples become lists; NumPy scalars, Python."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


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


def _table(headers: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
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
    """The human-readable report of a finished :func:`run_demo` result."""
    yield _fmt_intro(result)
    yield _fmt_gradients(result["gradients"])
    yield _fmt_codecs(result)
    yield _fmt_bundle(result["bundle"], result["gradients"]["elements"])
    yield _fmt_training(result["training"])
