"""Ranks that change their minds after agreeing: the cases both rank programs run.

Every case agrees on a configuration for two steps, then the last rank changes one thing (the
codec, the tensor's length, its dtype or the mode) at the third step, where every rank must raise a
:class:`gcodec.ConfigError` that names the field; at the fourth step every rank is back on the
agreed configuration and the exchange must work again (no rank hangs, none is left a message
behind). A hang fails the test through the runner's deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import gcodec

#: (name, codec, mode) of the agreed configuration: one per protocol (summable, gather or two-phase
#: by ``auto``, explicit two-phase, PowerSGD, shared-seed Random-K).
BASES: list[tuple[str, dict[str, Any], str]] = [
    ("fp16", {"id": "fp16"}, "auto"),
    ("uniform", {"id": "uniform", "bits": 8}, "auto"),
    ("uniform-2p", {"id": "uniform", "bits": 8}, "two_phase"),
    ("powersgd", {"id": "powersgd", "rank": 2}, "auto"),
    ("randomk", {"id": "randomk", "ratio": 0.1, "seed": 3}, "auto"),
]

#: What the changing rank changes, and the fingerprint field the error must name.
CHANGES = {"codec": "codec", "length": "shape", "dtype": "dtype", "mode": "mode"}

SHAPE = (64, 48)


def other_codec(cfg: dict[str, Any]) -> dict[str, Any]:
    """A different configuration of the same codec (the subtle change: same id, other parameter)."""
    tweak = {"fp16": {"id": "bf16"}, "uniform": {"bits": 4}, "powersgd": {"rank": 1}, "randomk": {"ratio": 0.2}}
    return {**cfg, **tweak[cfg["id"]]}


def other_mode(cfg: dict[str, Any], mode: str, size: int) -> str:
    """A mode other than the one ``mode`` resolves to on ``size`` ranks (``auto`` gathers up to 2)."""
    if cfg["id"] in ("fp16", "randomk", "powersgd"):
        return "gather"
    resolved = mode if mode != "auto" else ("gather" if size <= 2 else "two_phase")
    return "gather" if resolved == "two_phase" else "two_phase"


def case_inputs(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng(1000 * step + rank).standard_normal(SHAPE).astype(np.float32)


def run_cases(
    rank: int,
    size: int,
    allreduce: Callable[[np.ndarray, dict[str, Any], str, str], np.ndarray],
    check: Callable[[str, bool, str], None],
) -> None:
    """Run every base x change through ``allreduce(x, codec, mode, key)`` (the engine under test)."""
    changer = size - 1
    for name, cfg, mode in BASES:
        for change, field in CHANGES.items():
            key = f"{name}/{change}"
            try:
                for step in range(2):
                    allreduce(case_inputs(rank, step), cfg, mode, key)
            except gcodec.GcodecError as e:
                check(f"{key}: agreed steps run", False, f"{type(e).__name__}: {e}")
                continue
            x, c, m = case_inputs(rank, 2), cfg, mode
            if rank == changer:
                if change == "codec":
                    c = other_codec(cfg)
                elif change == "length":
                    x = np.concatenate([x.reshape(-1), x.reshape(-1)[:8]]).reshape(SHAPE[0] * SHAPE[1] // 8 + 1, 8)
                elif change == "dtype":
                    x = x.astype(np.float64)
                else:
                    m = other_mode(cfg, mode, size)
            try:
                allreduce(x, c, m, key)
                check(f"{key}: the change raises", False, "no error")
            except gcodec.ConfigError as e:
                msg = str(e)
                check(
                    f"{key}: every rank raises a ConfigError naming {field!r} and rank {changer}",
                    field in msg and str(changer) in msg and not isinstance(e, gcodec.ProtocolOrderError),
                    f"{type(e).__name__}: {msg[:400]}",
                )
            except gcodec.GcodecError as e:
                check(f"{key}: the change raises a ConfigError", False, f"{type(e).__name__}: {e}")
            xs = [case_inputs(r, 3) for r in range(size)]
            try:
                y = allreduce(xs[rank], cfg, mode, key)
                if cfg["id"] in ("fp16", "uniform"):
                    # fp16 (|x| < 8): x / p and the sum each round once, half an ulp of 2**-7 each;
                    # uniform 8 bits: half a step max|group| / 127 per term (the mean of p terms
                    # keeps it), and two-phase's re-encode adds at most another half step
                    mean = np.mean(xs, axis=0)
                    step = max(float(np.max(np.abs(a))) for a in xs) / 127
                    bound = 2.0**-8 if cfg["id"] == "fp16" else step * 1.01 + 1e-7
                    err = float(np.max(np.abs(y - mean)))
                    ok = err <= bound
                else:
                    ok, err = bool(np.all(np.isfinite(y))) and y.shape == SHAPE, 0.0
                check(f"{key}: the agreed configuration works again afterwards", ok, f"max err {err:.3g}")
            except gcodec.GcodecError as e:
                check(f"{key}: the agreed configuration works again afterwards", False, f"{type(e).__name__}: {e}")
