"""The ``seed`` and ``stream`` parameters of stochastic codecs.

Each codec documents its own seed rule: codecs that round independently (``uniform`` stochastic,
``qsgd``, ``terngrad``) want one seed per worker so rounding errors average out; codecs whose
payloads are summed or whose ranks must agree (``randomk``, ``powersgd``) need one shared seed.
"""

from __future__ import annotations

from ..rng import MASK64
from .base import Param

__all__ = ["PER_WORKER_SEED", "SHARED_SEED", "STREAM_PARAM", "seed_param"]


def seed_param(doc: str) -> Param:
    """A Philox key parameter (0 .. 2**64-1, default 0) with the codec's own rule in ``doc``."""
    return Param(int, 0, doc, min=0, max=MASK64)


PER_WORKER_SEED = seed_param(
    "Philox key (0 .. 2**64-1). Give each worker its own seed (e.g. base + rank) so that their rounding "
    "errors are independent and average out"
)
SHARED_SEED = seed_param(
    "Philox key (0 .. 2**64-1). Every worker must use the same seed (and the same step), so that all "
    "ranks draw the same random choices"
)
STREAM_PARAM = Param(int, 0, "Philox stream of this payload (the step, or the per-key call counter)", min=0, max=MASK64)
