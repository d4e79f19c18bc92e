"""Shared fixtures: deterministic test arrays of every dtype and awkward shape."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gcodec
from gcodec.arrays import DTYPES

# gcodec advise times each step after reading twice the machine's largest cache (up to 1 GiB here
# and in every rank a probe test starts); the suite reads 8 MiB instead, the same path at a size
# that keeps its many advise calls quick and its ranks small (gcodec.advise.CacheEvictor).
os.environ.setdefault("GCODEC_EVICT_BYTES", str(8 << 20))

SHAPES = [(), (0,), (1,), (7,), (63,), (65,), (3, 5), (2, 0, 3), (4, 33, 2), (10007,)]


def make_array(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Heavy-ish tailed values (Student-t) of the given shape and wire dtype."""
    rng = np.random.default_rng(seed)
    x = rng.standard_t(4, size=shape).astype(np.float64)
    return x.astype(DTYPES[dtype])


@pytest.fixture(params=list(DTYPES))
def dtype_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def codecs_default() -> list[gcodec.Codec]:
    return [gcodec.get_codec(c) for c in ("fp16", "bf16", "uniform")]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The CUDA simulator's module runs first. Its worker is many Python threads per simulated block,
    so it slows by far more than the others when earlier tests leave the cores busy; in a full run
    after the multi-process tests it has run past its limit where it takes 1-4 minutes alone."""
    items.sort(key=lambda it: it.path.name != "test_gpu_sim.py")  # stable: the rest keep their order
