"""The demo's model and data: a small NumPy MLP with hand-written backprop, synthetic classes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

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
