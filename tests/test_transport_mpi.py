"""gcodec.mpi with real ranks: ``mpiexec -n 2`` and ``-n 4`` (oversubscribed on small machines).

The rank program (tests/transport_ranks/mpi_program.py) runs the checks inside the ranks and writes
one JSON file per rank; here every rank's file must exist and every check in it must pass. Each
mpiexec runs under a timeout, so a hang fails the test instead of stalling the suite. The error
bounds each codec is held to are derived in tests/transport_ranks/bounds.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.mpi

from tests.procs import run_mpi, scaled  # noqa: E402  (one helper for the multi-process tests)

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
TIMEOUT = 120


def run_ranks(n: int, scenario: str, outdir: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    if not MPIEXEC.exists():
        pytest.fail(f"mpiexec not found next to {sys.executable}: install the 'mpi' extra (mpich)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    return run_mpi("tests.transport_ranks.mpi_program", [scenario, str(outdir)], n, timeout, env=env)


def checks_of(outdir: Path, n: int, proc: subprocess.CompletedProcess[str]) -> list[dict]:
    out = []
    for r in range(n):
        f = outdir / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no results\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        out += [{**c, "rank": r} for c in json.loads(f.read_text())]
    return out


def assert_all_pass(checks: list[dict], minimum: int) -> None:
    failed = [c for c in checks if not c["ok"]]
    assert not failed, "\n".join(f"rank {c['rank']}: {c['name']}: {c['detail']}" for c in failed)
    assert len(checks) >= minimum, f"only {len(checks)} checks ran"


@pytest.mark.parametrize("n", [2, 4])
def test_every_codec_and_mode_matches_the_mean_within_its_bound(tmp_path: Path, n: int) -> None:
    proc = run_ranks(n, "matrix", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = checks_of(tmp_path, n, proc)
    assert_all_pass(checks, minimum=80 * n)
    names = {c["name"] for c in checks}
    assert any("bit-exact" in s for s in names)
    assert any("two_phase" in s for s in names) and any("gather" in s for s in names)


@pytest.mark.parametrize("n", [2, 4])
def test_mismatch_corruption_and_nan_raise_on_every_rank(tmp_path: Path, n: int) -> None:
    proc = run_ranks(n, "errors", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = checks_of(tmp_path, n, proc)
    assert_all_pass(checks, minimum=7 * n)


def test_the_step_reports_of_a_state_and_a_policy_state_add_up_per_round(tmp_path: Path) -> None:
    proc = run_ranks(2, "report", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_all_pass(checks_of(tmp_path, 2, proc), minimum=2 * 4)


def test_error_feedback_state_checkpoint_resumes_bit_identically(tmp_path: Path) -> None:
    proc = run_ranks(2, "checkpoint", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_all_pass(checks_of(tmp_path, 2, proc), minimum=2 * 10)


def test_a_killed_rank_ends_the_job_with_an_error_not_a_hang(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = run_ranks(2, "kill", tmp_path, timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < scaled(60)
    assert not (tmp_path / "rank0.json").exists() or all(
        c["name"] != "survivor returned from a collective with a dead peer"
        for c in json.loads((tmp_path / "rank0.json").read_text())
    )
