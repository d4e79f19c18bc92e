"""The codec tour: every registered codec on the demo's gradients, and one bundle."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..api import decode, decode_bundle, encode_bundle, validate
from ..codecs.base import Codec
from ..codecs.registry import codec_class, get_codec, list_codecs
from .model import EXTRA_VARIANTS


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
