"""Faults on purpose, with real processes (tests/transport_ranks/faults*.py; docs/transports.md
"Agreement and failures" says what a user sees in each case).

* A rank SIGKILLed before each collective of an exchange, in each protocol: on gloo (timeout 15 s)
  the survivor raises within the timeout; under ``mpiexec`` the job ends (MPI has no recovery from a
  lost rank) and no survivor returns a result. Never a hang: every run has a deadline.
* A rank stopped for 3 s (SIGSTOP, then SIGCONT) in the middle of 40 exchanges per protocol: every
  result exact (the inputs are integers that fp16 and 8-bit groups carry exactly) or, for
  two-phase, within half a quantization step.
* A corrupt payload at step 5 of a training loop: every rank raises a ChecksumError at that step.
* Soaks: 3,000 ``gcodec.mpi.allreduce`` calls and 2,500 DDP-hook steps leak nothing: from 40 % of
  the steps to the end, resident memory within 2 MiB, Python's allocated blocks within half a block
  per step (one leaked object per step fails), threads and file descriptors unchanged
  (tests/transport_ranks/faults.py ``soak``; :func:`test_the_soak_sees_a_leak_of_one_object_per_step`
  shows the check failing on a leak).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.procs import checks_of
from tests.transport_ranks.faults import PROTOCOLS

ROOT = Path(__file__).resolve().parents[1]


def _mpi(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mpi4py")
    from tests.procs import run_mpi

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    return run_mpi("tests.transport_ranks.faults_mpi", [args[0], str(tmp_path), *args[1:]], 2, timeout, env=env)


def _gloo(tmp_path: Path, *args: str, deadline: float = 180) -> list[int]:
    pytest.importorskip("torch")
    from tests.procs import run_ranks

    return run_ranks("tests.transport_ranks.faults_torch", [args[0], str(tmp_path), *args[1:]], 2, deadline, tmp_path)


MPI_KILLS = [(proto, n) for proto, (_, _, count) in PROTOCOLS.items() for n in range(count)]


@pytest.mark.mpi
@pytest.mark.parametrize("proto, n", MPI_KILLS)
def test_mpi_a_rank_killed_in_any_phase_ends_the_job_and_no_survivor_returns(
    tmp_path: Path, proto: str, n: int
) -> None:
    proc = _mpi(tmp_path, "kill", proto, str(n), timeout=60)  # a hang fails here
    assert proc.returncode != 0
    f = tmp_path / "rank0.json"
    assert not f.exists() or not any("survivor returned" in c["name"] for c in json.loads(f.read_text()))


#: Every phase of summable, two-phase and FSDP2's three exchanges; one phase of gather and
#: PowerSGD (their phases are those of two-phase's first half and of summable: each gloo run
#: costs a process group, ~5 s on 2 cores).
GLOO_KILLS = [
    *(("summable", n) for n in range(2)),
    *(("two_phase", n) for n in range(5)),
    ("gather", 1),
    ("powersgd", 2),
    *(("fsdp-values", n) for n in range(2)),
    *(("fsdp-payloads", n) for n in range(3)),
    *(("all-gather", n) for n in range(2)),
]


@pytest.mark.torch
@pytest.mark.parametrize("proto, n", GLOO_KILLS)
def test_gloo_a_rank_killed_in_any_phase_makes_the_survivor_raise(tmp_path: Path, proto: str, n: int) -> None:
    codes = _gloo(tmp_path, "kill", proto, str(n))
    assert codes == [0, -9], codes  # the survivor ends normally (having raised), the victim by SIGKILL
    checks = checks_of(tmp_path, [0])
    assert [c["name"] for c in checks] == [f"kill {proto} #{n}: the survivor raises within the timeout"]


@pytest.mark.mpi
def test_mpi_a_stopped_rank_does_not_corrupt_results(tmp_path: Path) -> None:
    proc = _mpi(tmp_path, "stop")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(checks_of(tmp_path, range(2))) == 2 * 2 * len(PROTOCOLS)


@pytest.mark.torch
def test_gloo_a_stopped_rank_does_not_corrupt_results(tmp_path: Path) -> None:
    assert _gloo(tmp_path, "stop") == [0, 0]
    # and the wait(timeout=) checks: three on the stopping rank, one on the stopped one
    assert len(checks_of(tmp_path, range(2))) == 2 * 2 * len(PROTOCOLS) + 4


@pytest.mark.mpi
def test_mpi_a_corrupt_payload_mid_run_raises_at_that_step_only(tmp_path: Path) -> None:
    proc = _mpi(tmp_path, "corrupt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(checks_of(tmp_path, range(2))) == 2 * 2


@pytest.mark.torch
def test_gloo_a_corrupt_payload_mid_training_raises_at_that_step(tmp_path: Path) -> None:
    assert _gloo(tmp_path, "corrupt") == [0, 0]
    assert len(checks_of(tmp_path, range(2))) == 3 * 2


@pytest.mark.mpi
def test_mpi_soak_of_3000_calls_leaks_no_memory_objects_threads_or_fds(tmp_path: Path) -> None:
    proc = _mpi(tmp_path, "soak", "1500", timeout=300)  # two allreduces per iteration; ~25 s idle
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(checks_of(tmp_path, range(2))) == 3 * 2


@pytest.mark.torch
def test_ddp_soak_of_2500_hook_steps_leaks_no_memory_objects_threads_or_fds(tmp_path: Path) -> None:
    assert _gloo(tmp_path, "soak", "2500", deadline=300) == [0, 0]  # ~70 s on 2 idle cores
    assert len(checks_of(tmp_path, range(2))) == 3 * 2


@pytest.mark.parametrize("leak", [0, 1])
def test_the_soak_sees_a_leak_of_one_object_per_step(leak: int) -> None:
    """The soak's checks on a step that leaks one small object per step (a 1-element list, 72
    bytes: far below what resident memory shows) and on the same step without the leak."""
    from tests.transport_ranks.faults import soak

    kept: list[list[int]] = []
    checks: list[tuple[str, bool, str]] = []

    def step() -> None:
        x = [len(kept)]
        if leak:
            kept.append(x)

    soak(1000, step, "steps", lambda name, ok, detail: checks.append((name, ok, detail)))
    failed = [name for name, ok, _ in checks if not ok]
    assert failed == (["soak: steps leak no Python objects"] if leak else []), checks
