"""The complete examples of docs/transports.md run as written, with the launchers the page names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import procs

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "transports.md").read_text()
BIN = Path(sys.executable).parent


def example(after_heading: str) -> str:
    section = PAGE.split(after_heading, 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m is not None
    return m.group(1)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    return procs.run(cmd, 150, cwd=cwd, env=env)


@pytest.mark.torch
def test_ddp_example_runs_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "ddp_example.py").write_text(example("## A DDP job"))
    proc = run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "ddp_example.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "final loss" in proc.stdout and "(gather)" in proc.stdout
    assert (tmp_path / "hook_state_rank0.pt").exists() and (tmp_path / "hook_state_rank1.pt").exists()


@pytest.mark.mpi
def test_mpi_example_runs_under_mpiexec(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    (tmp_path / "mpi_example.py").write_text(example("## An MPI job"))
    proc = run([str(BIN / "mpiexec"), "-n", "2", sys.executable, "mpi_example.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "top-k 1 %: 1048576 raw bytes" in proc.stdout
