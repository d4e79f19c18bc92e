"""Shared fixtures: deterministic test arrays of every dtype and awkward shape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


#: the pytest-xdist worker this process is ("gw0", "gw1", ...), or None in a serial session
WORKER = os.environ.get("PYTEST_XDIST_WORKER")


#: Seconds of wall each of the longest modules took in a whole-suite run (2 pytest-xdist workers on
#: 2 cores at load 10-18, fresh clone, 2026-12-07; test_faults less its soaks' later cut). Only the
#: order of modules under pytest-xdist uses it: longest first (see below). A module missing here
#: only starts later; a stale figure only costs balance.
MODULE_SECONDS = {
    "test_device_protocols": 730,  # waits on its CUDA-simulator job (start_in_background)
    "test_gpu_sim": 380,  # likewise
    "test_torchft": 750,
    "test_vectors": 720,
    "test_faults": 570,
    "test_demo": 490,
    "test_fsdp": 400,
    "test_memory_bound": 320,
    "test_nested_range": 320,
    "test_transport_torch": 280,
    "test_nonfinite": 280,
    "test_formats": 240,
    "test_agreement": 230,
    "test_properties": 220,
    "test_spec_decoder": 200,
    "test_lm": 180,
    "test_integrations": 160,
    "test_quant_uniform": 150,
    "test_procs": 150,
    "test_kernel_settings": 140,
    "test_bench_link": 110,
    "test_header_depth": 110,
    "test_corruption": 100,
    "test_transport_mpi": 100,
    "test_feedback": 90,
    "test_adaptive": 85,
    "test_diloco": 85,
    "test_engine_order": 75,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The order of the modules. The modules whose long single-process job starts in the
    background when a large session begins (``start_in_background``: the CUDA simulator's workers,
    many Python threads on one core for minutes) run last in a serial session: their jobs ran
    meanwhile on the core that the serial tests leave idle, and the tests only read the results.

    Under pytest-xdist each module runs whole on one worker (``--dist loadfile``), handed out in
    the order of the collection (``--no-loadscope-reorder``: xdist's own reorder puts the modules
    with most tests first, which left the few long multi-process modules for the end, on one
    worker while the others idled). The simulator modules go first, then the others longest first
    (:data:`MODULE_SECONDS`), the short ones filling the gaps at the end. Stable: a module's
    tests keep their order."""

    def long_job(it: pytest.Item) -> bool:
        return hasattr(it, "module") and hasattr(it.module, "start_in_background")

    def seconds(it: pytest.Item) -> int:
        return MODULE_SECONDS.get(Path(str(it.fspath)).stem, 0)

    if WORKER:
        items.sort(key=lambda it: (not long_job(it), -seconds(it)))
    else:
        items.sort(key=long_job)


#: a background process filling Numba's kernel cache while the session starts (see below)
_WARMUP: list[subprocess.Popen] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """A fresh clone compiles every kernel the suite uses (minutes of CPU): the in-process tests
    compile theirs one after the other on one core, and the ranks of a multi-process test that
    finds one missing each compile it again. For a large session (a whole suite) ``gcodec warmup``
    runs at low priority in the background from the start, on the core that the serial tests and
    the CUDA simulator (the first module) leave idle, and fills the cache with every codec at its
    defaults and the common settings; whoever needs a kernel after that loads it (milliseconds).
    With a filled cache it only loads (seconds). ``GCODEC_TEST_WARMUP=0`` turns it off.

    The modules with a ``start_in_background`` function (the CUDA simulator's workers) start their
    jobs here too (tests/procs.py run_early), for the same idle core."""
    if len(session.items) < 1000:
        return
    if WORKER is not None:
        # pytest-xdist: each worker collects the whole suite, and none knows which modules it will
        # run, so the simulator modules run their jobs when they come (first, see above). No
        # background warm-up: every core runs a worker, and a warm-up beside them compiles at low
        # priority what the workers then compile again; the test command (tools/run-tests.sh)
        # fills the cache before the workers start, in one process per core (gcodec warmup --jobs).
        return
    modules = {it.module for it in session.items if hasattr(it, "module")}
    for m in sorted(modules, key=lambda m: m.__name__):
        if hasattr(m, "start_in_background"):
            m.start_in_background()
    _start_warmup()


def _start_warmup() -> None:
    if os.environ.get("GCODEC_TEST_WARMUP", "1") == "0":
        return
    root = Path(__file__).resolve().parents[1]
    code = "import os; os.nice(10); import gcodec, gcodec.warmup; gcodec.set_num_threads(1); gcodec.warmup.warmup()"
    env = {**os.environ, "PYTHONPATH": str(root)}
    _WARMUP.append(
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    for p in _WARMUP:
        if p.poll() is None:
            p.kill()
        p.wait()
