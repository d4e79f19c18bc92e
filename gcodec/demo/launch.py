"""Start the demo's worker processes (gloo or mpiexec), follow rank 0's progress, collect results."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

PROGRESS = "@progress "  # the worker's progress lines (gcodec.demo.worker.PROGRESS)


class LaunchError(RuntimeError):
    """A worker process failed or timed out; the message holds the tail of its standard error."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def torchrun_env(rank: int, world: int, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun gives worker ``rank`` of ``world`` on this host, its rendezvous on
    127.0.0.1:``port``, over ``base`` (default: this process's environment)."""
    env = dict(os.environ if base is None else base)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    return env


def mpiexec() -> str | None:
    """The ``mpiexec`` next to this Python (the ``mpich`` wheel installs one), else the PATH's."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def run_job(
    runs: list[dict[str, Any]],
    settings: Any,
    workers: int = 2,
    backend: str = "gloo",
    progress: Callable[[int, int], None] | None = None,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 1800.0,
    split_seed: int | None = None,
    before_wait: Callable[[], Any] | None = None,
    module: str = "gcodec.demo.worker",
) -> dict[str, Any]:
    """Train ``runs`` on ``workers`` real processes; return rank 0's results.

    ``progress(run_index, step)`` is called for every step rank 0 finishes. ``prefix`` goes before
    each worker's command line (``ip netns exec NAME`` for the link benchmark); ``env`` is added to
    the workers' environment. ``before_wait()`` runs here once the workers are started (the demo
    fills the kernel cache while they import torch). ``module`` is the worker program
    (``gcodec.demo.lm_worker`` for the language-model workload; ``settings`` is then its own).
    """
    if workers < 1:
        raise ValueError("workers must be >= 1")
    with tempfile.TemporaryDirectory(prefix="gcodec-demo-") as tmp:
        out = Path(tmp) / "result.json"
        job = {
            "settings": settings.to_dict(),
            "runs": runs,
            "backend": backend,
            "out": str(out),
            "split_seed": split_seed,
        }
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        base_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        # gcodec may run from a source tree rather than an install: keep it importable in the workers
        root = str(Path(__file__).resolve().parents[2])
        base_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, base_env.get("PYTHONPATH", "")) if p)
        cmd = [*prefix, sys.executable, "-m", module, str(job_path)]
        errs = [Path(tmp) / f"rank{r}.err" for r in range(workers)]
        procs: list[subprocess.Popen] = []
        if backend == "mpi":
            exe = mpiexec()
            if exe is None:
                raise LaunchError("--mpi needs mpiexec: pip install 'gcodec[mpi]'")
            with open(errs[0], "wb") as ferr:
                procs.append(
                    subprocess.Popen(
                        [*prefix, exe, "-n", str(workers), *cmd[len(prefix) :]],
                        stdout=subprocess.PIPE,
                        stderr=ferr,
                        env=base_env,
                        text=True,
                    )
                )
        elif backend == "gloo":
            port = free_port()
            for r in range(workers):
                e = torchrun_env(r, workers, port, base_env)
                with open(errs[r], "wb") as ferr:
                    procs.append(
                        subprocess.Popen(
                            cmd,
                            stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                            stderr=ferr,
                            env=e,
                            text=True,
                        )
                    )
        else:
            raise ValueError(f"backend must be 'gloo' or 'mpi', not {backend!r}")
        deadline = time.monotonic() + timeout_s
        try:
            if before_wait is not None:
                before_wait()
            assert procs[0].stdout is not None
            for line in procs[0].stdout:  # rank 0 (or mpiexec, which forwards rank 0's output)
                if line.startswith(PROGRESS) and progress is not None:
                    ev = json.loads(line[len(PROGRESS) :])
                    progress(int(ev["run"]), int(ev.get("step", -1)))
                if time.monotonic() > deadline:
                    raise LaunchError(f"workers ran past {timeout_s:.0f} s")
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except (subprocess.TimeoutExpired, LaunchError, KeyboardInterrupt):
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            raise
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if failed or not out.exists():
            tails = []
            for r, f in enumerate(errs):
                if f.exists() and f.stat().st_size:
                    tails.append(f"--- rank {r} stderr:\n" + f.read_text(errors="replace")[-3000:])
            raise LaunchError(f"worker processes failed (rank, exit status): {failed}\n" + "\n".join(tails))
        return json.loads(out.read_text())
