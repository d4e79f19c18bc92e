"""Error feedback makes biased sparsifiers converge: Top-K 1 % on a quadratic reaches the optimum.

f(w) = 1/2 sum_i a_i (w_i - w*_i)**2 with a_i in [0.5, 1.5], n = 2000, deterministic gradients.
Uncompressed gradient descent with step lr contracts every coordinate by |1 - lr a_i| <= 0.99 per
step (lr = 0.02), so after T = 2000 steps the relative distance to w* is at most 0.99**2000 ~ 2e-9,
i.e. at float32 rounding. Top-K keeps 20 of 2000 coordinates per step; with error feedback the
dropped gradient accumulates and is sent later, so nothing is lost and the iterates reach the same
optimum (Stich, Cordonnier and Jaggi 2018, "Sparsified SGD with memory": same rate up to a delay of
about n/k steps, here ~100 of the 2000). Without feedback, the same budget stalls far away: each
step moves only the 20 largest gradient coordinates by lr times their (shrinking) gradient.
"""

from __future__ import annotations

import numpy as np

import gcodec

N = 2000
STEPS = 2000
LR = 0.02


def _problem():
    rng = np.random.default_rng(0)
    return rng.uniform(0.5, 1.5, N), rng.standard_normal(N)


def _run(codec=None, feedback=True) -> float:
    a, wstar = _problem()
    w = np.zeros(N, np.float32)
    ef = gcodec.ErrorFeedback(codec) if codec is not None and feedback else None
    for step in range(STEPS):
        g = (a * (w - wstar)).astype(np.float32)
        if codec is None:
            d = g
        elif ef is not None:
            d = gcodec.decode(ef.encode(g, key="w", step=step))
        else:
            d = gcodec.decode(gcodec.get_codec(codec).encode(g))
        w = w - np.float32(LR) * d
    return float(np.linalg.norm(w - wstar) / np.linalg.norm(wstar))


def test_sgd_reaches_the_optimum():
    assert _run() < 1e-5


def test_topk_one_percent_with_error_feedback_reaches_the_same_optimum():
    assert _run({"id": "topk", "ratio": 0.01}) < 1e-5


def test_topk_without_error_feedback_does_not():
    """The control: the same budget without feedback is far from w* (so the test above can fail)."""
    assert _run({"id": "topk", "ratio": 0.01}, feedback=False) > 1e-2
