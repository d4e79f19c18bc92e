"""``mpiexec -n P python -m tests.transport_ranks.faults_mpi SCENARIO OUTDIR [ARGS]``: gcodec.mpi
with faults on purpose (tests/transport_ranks/faults.py). Writes ``OUTDIR/rank<r>.json``.

* ``kill PROTOCOL N``: rank 1 dies before collective N of the second exchange; the survivors must
  not return from it (mpiexec ends the job: MPI has no recovery from a lost rank);
* ``stop``: rank 0 stops rank 1 for 3 s during 40 exchanges per protocol; every result must be exact;
* ``corrupt``: at step 5 of 10, rank 1 flips a byte of what it sends; every rank raises a
  ChecksumError at that step and the steps after it are exact again;
* ``soak N``: N allreduces; memory, threads and file descriptors must stay flat.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

import gcodec
import gcodec.mpi
from gcodec.transports import Serial

from .faults import PROTOCOLS, corrupting, dying, exact_inputs, soak, stopped_run, within

COMM = MPI.COMM_WORLD
ME, P = COMM.rank, COMM.size
CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def allreduce(proto: str, x: np.ndarray, key: str, ef: Any = None) -> np.ndarray:
    codec, mode, _ = PROTOCOLS[proto]
    return gcodec.mpi.allreduce(COMM, x, codec, key=key, mode=mode, state=ef)


def scenario_kill(proto: str, target: str) -> None:
    adapter = dying(gcodec.mpi.MPICommunicator, int(target))(COMM)
    gcodec.mpi._adapters[id(COMM)] = (adapter, Serial())
    allreduce(proto, exact_inputs(ME, 0), "k")  # agreement and one clean exchange
    if ME == 1:
        adapter.arm()
    allreduce(proto, exact_inputs(ME, 1), "k")
    check("a survivor returned from an exchange whose peer died in it", ME == 1, f"rank {ME}")


def scenario_stop() -> None:
    pids = COMM.allgather(os.getpid())
    for proto in PROTOCOLS:
        COMM.Barrier()
        bad, ys, took = stopped_run(ME, pids, proto, lambda x, key, proto=proto: allreduce(proto, x, key))
        same = all(np.array_equal(a, b) for a, b in zip(ys, COMM.bcast(ys, root=0)))
        check(
            f"stop {proto}: 40 results exact (or in bound) through a 3 s SIGSTOP", not bad and same, "; ".join(bad[:3])
        )
        check(f"stop {proto}: the stop was inside the loop", took >= 3.0 or ME == 1, f"{took:.1f} s")


def scenario_corrupt() -> None:
    from gcodec.mpi import MPICommunicator

    adapter = corrupting(MPICommunicator)(COMM) if ME == 1 else MPICommunicator(COMM)
    gcodec.mpi._adapters[id(COMM)] = (adapter, Serial())
    for proto in ("gather", "two_phase"):
        seen = []
        for step in range(10):
            adapter.armed = step == 5  # type: ignore[attr-defined]
            try:
                y = allreduce(proto, exact_inputs(ME, step), f"corrupt-{proto}")
                ok, detail = within(proto, y, step, P)
                seen.append("ok" if ok else detail)
            except gcodec.GcodecError as e:
                seen.append(type(e).__name__)
        expect = ["ok"] * 5 + ["ChecksumError"] + ["ok"] * 4
        check(f"corrupt {proto}: every rank raises a ChecksumError at step 5 only", seen == expect, str(seen))


def scenario_soak(n: str) -> None:
    steps = int(n)
    x = exact_inputs(ME, 0)[:8]
    state = gcodec.mpi.State({"id": "uniform", "bits": 8})

    def step() -> None:
        allreduce("summable", x, "soak-fp16")
        gcodec.mpi.allreduce(COMM, x, state.codec, key="soak-uniform", state=state)

    soak(steps, step, f"{2 * steps} allreduces", check)


def main() -> None:
    scenario, outdir, args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    try:
        globals()[f"scenario_{scenario}"](*args)
    except Exception:
        check("no unexpected exception", False, traceback.format_exc())
    (outdir / f"rank{ME}.json").write_text(json.dumps(CHECKS))


if __name__ == "__main__":
    main()
