"""What the multi-process tests share: a free TCP port for a process group's rendezvous, starting
the ranks of a rank program with a deadline, and reading the checks they wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port that is free now (the OS picks it); the tests start their ranks right after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(module: str, args: Sequence[str], world: int, timeout: float, logs: Path) -> list[int]:
    """Run ``python -m module *args RANK WORLD PORT`` for every rank on 127.0.0.1 and return their exit
    codes. Ranks still running at the deadline are killed (nothing hangs the suite); each rank's
    output goes to ``logs``/``<name>_rank<r>.log``, and its tail is printed when any rank failed."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    name = "_".join([module.rsplit(".", 1)[-1], *(a for a in args if "/" not in a)])
    paths = [logs / f"{name}{world}_rank{r}.log" for r in range(world)]
    files = [open(p, "w") for p in paths]
    cmd = [sys.executable, "-m", module, *args]
    procs = [
        subprocess.Popen([*cmd, str(r), str(world), str(port)], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        for r, f in enumerate(files)
    ]
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in files:
            f.close()
    if any(codes):
        for r, p in enumerate(paths):
            print(f"--- rank {r}:", p.read_text()[-3000:])
    return codes


def start_program(module: str, args: Sequence[str], log: Path) -> subprocess.Popen:
    """Start ``python -m module *args`` on its own (a test that kills, stops or restarts it), its
    output to ``log``, one kernel thread; the caller waits for it and kills it at its deadline.
    The path holds this checkout, then whatever the test's own ``PYTHONPATH`` held (where an
    optional extra such as torchft may have been installed)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    with open(log, "a") as f:
        cmd = [sys.executable, "-m", module, *args]
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def run_mpi(module: str, args: Sequence[str], ranks: int, timeout: float) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n ranks python -m module *args`` with the venv's mpiexec (the mpich wheel), one
    kernel thread per rank, output captured."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GCODEC_NUM_THREADS": "1"}
    return subprocess.run(
        [str(mpiexec), "-n", str(ranks), sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def checks_of(outdir: Path, ranks: Iterable[int]) -> list[dict]:
    """The checks every rank wrote to ``outdir/rank<r>.json``; fails on a missing file or a failed check."""
    out = []
    for r in ranks:
        f = outdir / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no results"
        out += [{**c, "rank": r} for c in json.loads(f.read_text())]
    failed = [c for c in out if not c["ok"]]
    assert not failed, "\n".join(f"rank {c['rank']}: {c['name']}: {c['detail']}" for c in failed)
    return out


def start_gloo(rank: int, world: int, port: int, timeout: float) -> None:
    """In a rank program: one kernel thread (the ranks share the machine's cores) and the gloo
    process group of the ranks on 127.0.0.1, with ``timeout`` seconds for every collective."""
    import datetime
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.enable(all_threads=True)  # an abort in torch's C++ (SIGABRT) prints where each thread was
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )


def run_checked(body: Callable[[], None], checks: list[dict], outdir: Path, rank: int) -> None:
    """In a rank program: run ``body``, record an unexpected exception as a failed check, and write
    the checks to ``outdir/rank<r>.json`` (what :func:`checks_of` reads)."""
    import traceback

    try:
        body()
    except Exception:
        checks.append({"name": "no unexpected exception", "ok": False, "detail": traceback.format_exc()})
    (outdir / f"rank{rank}.json").write_text(json.dumps(checks))
    if "gcodec.torch" in sys.modules:  # a failed step leaves later buckets' exchanges running
        import gcodec.torch

        gcodec.torch.synchronize()


def finish_gloo(destroy: bool = True) -> None:
    """In a rank program, after :func:`run_checked` wrote its checks: free what the steps left in
    reference cycles (DDP modules whose hook failed) while the process group still stands, then
    tear the group down and return, so that the program ends as a user's does (interpreter exit,
    gcodec's queue threads joined at exit: an abort there fails the test, as it should).

    ``destroy=False`` (a scenario whose peer was killed): the group cannot be torn down cleanly and
    the queue may be stuck on the dead peer's collective, so the rank leaves at once."""
    import gc

    import torch.distributed as dist

    gc.collect()
    if not destroy:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()
