"""How transports pick the kernel thread count when ranks share a machine (gcodec/transports/threads.py)."""

from __future__ import annotations

import sys

import numba
import pytest

import gcodec
from gcodec.transports import threads as T

MAX = numba.config.NUMBA_NUM_THREADS


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("GCODEC_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(T, "_cores", lambda: 8)
    monkeypatch.setattr(T, "_max_threads", lambda: 8)
    monkeypatch.setitem(sys.modules, "torch", None)  # torch's own thread count caps it when loaded
    return monkeypatch


def test_cores_are_shared_between_local_ranks(env):
    assert T.job_threads(1) == 8
    assert T.job_threads(2) == 4
    assert T.job_threads(3) == 2
    assert T.job_threads(16) == 1  # never zero


def test_explicit_choice_then_gcodec_then_omp(env):
    env.setenv("OMP_NUM_THREADS", "3")
    assert T.job_threads(2) == 3
    env.setenv("GCODEC_NUM_THREADS", "5")
    assert T.job_threads(2) == 5
    assert T.job_threads(2, override=2) == 2
    assert T.job_threads(2, override=64) == 8  # capped at the pool's size
    env.setenv("GCODEC_NUM_THREADS", "zero")  # unparsable: ignored
    assert T.job_threads(2) == 3


def test_kernel_threads_scopes_gcodec_threads_on_this_thread():
    before = gcodec.get_num_threads()
    with T.kernel_threads(1):
        assert gcodec.get_num_threads() == 1
    assert gcodec.get_num_threads() == before
    with T.kernel_threads(None):
        assert gcodec.get_num_threads() == before
    assert MAX >= 1


def test_torch_thread_count_caps_the_choice(env):
    class FakeTorch:
        @staticmethod
        def get_num_threads() -> int:
            return 3

    env.setitem(sys.modules, "torch", FakeTorch)
    assert T.job_threads(1) == 3
    assert T.job_threads(4) == 2
