"""Threads and fork (docs/architecture.md): gcodec runs its kernels on its own pool and never starts
Numba's threading layer, so a child forked after gcodec calls works, and any number of Python
threads may encode and decode at once, whichever layer Numba would pick (GNU OpenMP, TBB,
workqueue)."""

from __future__ import annotations

import os
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import gcodec
from tests.procs import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Codecs that cover every kernel family (cast, quantizers, sign, sparse selection, random-k, low rank).
CASES = [
    ("fp16", {}),
    ("bf16", {}),
    ("uniform", {"bits": 4, "rounding": "stochastic"}),
    ("qsgd", {}),
    ("sign", {}),
    ("topk", {"ratio": 0.01}),
    ("randomk", {"k": 1000}),
    ("powersgd", {"rank": 4}),
]

SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, sys
    import numpy as np
    import gcodec

    CASES = {cases!r}
    X = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)  # above the one-thread size

    def work(cid, kw):
        buf = bytes(gcodec.get_codec(cid, **kw).encode(X, step=3))
        return buf, gcodec.decode(buf).tobytes()

    def child(q):
        q.put([work(c, kw) for c, kw in CASES])

    if __name__ == "__main__":
        gcodec.set_num_threads(2)
        parent = [work(c, kw) for c, kw in CASES]   # the pool and every kernel are live in the parent
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        got = q.get(timeout=120)
        p.join(60)
        assert p.exitcode == 0, p.exitcode
        assert got == parent, "a forked child encoded or decoded different bytes"
        import numba.np.ufunc.parallel as par
        assert not par._is_initialized, "gcodec started Numba's threading layer"
        print("ok", len(got))
    """
)


def _layers() -> list[str]:
    layers = ["omp", "workqueue"]
    try:
        import tbb  # noqa: F401

        layers.append("tbb")
    except ImportError:
        pass
    return layers


@pytest.mark.parametrize("layer", _layers())
def test_a_forked_child_runs_every_codec_under_every_threading_layer(layer, tmp_path):
    script = tmp_path / "fork_child.py"
    script.write_text(SCRIPT.format(cases=CASES))
    env = dict(os.environ, NUMBA_THREADING_LAYER=layer, NUMBA_NUM_THREADS="2", PYTHONPATH=ROOT, PYTHONFAULTHANDLER="1")
    p = run([sys.executable, str(script)], 600, env=env, cwd=os.getcwd())
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == f"ok {len(CASES)}"


@pytest.mark.parametrize("cid, kw", CASES, ids=[c for c, _ in CASES])
def test_eight_python_threads_at_once_get_the_serial_bytes(cid, kw):
    x = np.random.default_rng(1).standard_normal((300, 300)).astype(np.float32)
    codec = gcodec.get_codec(cid, **kw)
    want = bytes(codec.encode(x, step=5))
    want_dec = gcodec.decode(want)

    def one(_: int) -> tuple[bytes, np.ndarray]:
        with gcodec.num_threads(2):  # each Python thread also fans out to the pool
            buf = bytes(gcodec.get_codec(cid, **kw).encode(x, step=5))
            return buf, gcodec.decode(buf)

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(16)))
    for buf, dec in results:
        assert buf == want
        np.testing.assert_array_equal(dec, want_dec)


def test_thread_settings():
    old = gcodec.get_num_threads()
    try:
        gcodec.set_num_threads(3)
        assert gcodec.get_num_threads() == 3
        with gcodec.num_threads(1):
            assert gcodec.get_num_threads() == 1
        assert gcodec.get_num_threads() == 3
        with pytest.raises(ValueError):
            gcodec.set_num_threads(0)
        gcodec.set_num_threads(None)
        import numba

        assert gcodec.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    finally:
        gcodec.set_num_threads(old)
