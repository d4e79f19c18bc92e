"""The multi-process tests' watchdog (tests/procs.py) on purpose: a rank that hangs is stopped
within the stall limit with every rank's stack in the report; a rank that keeps computing is not,
however long its peer waits for it; a job that never ends is stopped at its load-scaled limit."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests import procs

STALL = 5.0


def _expect_stall(start: float, e: pytest.ExceptionInfo[procs.Stalled]) -> str:
    report = str(e.value)
    assert "no progress for" in report, report
    took = time.monotonic() - start
    # the start-up of the ranks, the stall limit, the stacks: bounded, however loaded the machine
    assert took < 600 * procs.timeout_scale(), took
    return report


def _ranks_named(report: str) -> None:
    # rank 0 waits inside gcodec's all-reduce, rank 1 on its lock: each is named, with its stack
    assert "rank 0: " in report and "rank 1: " in report, report
    assert report.count("--- Python stacks of pid") == 2, report
    zero = report.split("rank 0: ", 1)[1].split("\n", 1)[0]
    one = report.split("rank 1: ", 1)[1].split("\n", 1)[0]
    assert "all_reduce" in zero or "allreduce" in zero, zero
    assert "stuck_on_a_lock" in one, one


@pytest.mark.torch
def test_a_hung_gloo_rank_is_stopped_with_every_ranks_stack(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    t0 = time.monotonic()
    with pytest.raises(procs.Stalled) as e:
        procs.run_ranks("tests.transport_ranks.hang", ["hang", "gloo"], 2, 300, tmp_path, stall=STALL)
    report = _expect_stall(t0, e)
    _ranks_named(report)
    assert "in all_reduce" in report  # faulthandler's line for rank 0's main thread


@pytest.mark.mpi
def test_a_hung_mpi_rank_is_stopped_though_mpich_spins_in_its_wait(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    t0 = time.monotonic()
    with pytest.raises(procs.Stalled) as e:
        procs.run_mpi("tests.transport_ranks.hang", ["hang", "mpi"], 2, 300, stall=STALL)
    report = _expect_stall(t0, e)
    _ranks_named(report)


@pytest.mark.torch
def test_a_rank_that_keeps_computing_is_never_stopped(tmp_path: Path) -> None:
    """Rank 0 computes for 2.5 stall limits of CPU time while rank 1 waits in a collective."""
    pytest.importorskip("torch")
    args = ["busy", "gloo", str(2.5 * STALL)]
    assert procs.run_ranks("tests.transport_ranks.hang", args, 2, 300, tmp_path, stall=STALL) == [0, 0]


@pytest.mark.torch
def test_the_ranks_of_a_job_are_interpreters_with_their_own_hash_seeds(tmp_path: Path) -> None:
    """Ranks forked from the fork server would share its string hash seed (and so the order of
    every set of strings); each rank number has its own server, as torchrun's ranks are separate
    interpreters. Two random 64-bit seeds give the same hash of a string with probability 2**-64,
    unless PYTHONHASHSEED fixes them (then the ranks of a user's job agree too)."""
    pytest.importorskip("torch")
    if os.environ.get("PYTHONHASHSEED") not in (None, "random"):
        pytest.skip("PYTHONHASHSEED is set: every interpreter has that seed")
    assert procs.run_ranks("tests.transport_ranks.hang", ["seed", "gloo"], 2, 300, tmp_path) == [0, 0]
    hashes = [
        re.search(r"string hash (-?\d+)", p.read_text()) for p in sorted(tmp_path.glob("hang_seed_gloo2_rank*.log"))
    ]
    assert len(hashes) == 2 and all(hashes), [p.read_text()[-500:] for p in tmp_path.glob("*.log")]
    assert hashes[0].group(1) != hashes[1].group(1)  # type: ignore[union-attr]


def test_a_job_that_never_ends_is_stopped_at_its_limit() -> None:
    """A livelock makes progress for ever: the limit (twice the timeout, in load-scaled seconds)
    stops it."""
    t0 = time.monotonic()
    with pytest.raises(procs.Stalled, match="over its limit"):
        procs.run([sys.executable, "-c", "while True: pass"], timeout=2)
    assert time.monotonic() - t0 < 4 * procs.machine_slowdown() * procs.timeout_scale() + 30
