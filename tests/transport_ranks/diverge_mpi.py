"""``mpiexec -n P python -m tests.transport_ranks.diverge_mpi OUTDIR``: gcodec.mpi with a rank that
changes its configuration after agreement (tests/transport_ranks/diverge.py); writes rank<r>.json."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

import gcodec
import gcodec.mpi

from .diverge import run_cases

COMM = MPI.COMM_WORLD
CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def allreduce(x: np.ndarray, codec: dict[str, Any], mode: str, key: str) -> np.ndarray:
    return gcodec.mpi.allreduce(COMM, x, codec, key=key, mode=mode)


def main() -> None:
    outdir = Path(sys.argv[1])
    try:
        run_cases(COMM.rank, COMM.size, allreduce, check)
        # the communicator itself is untouched: a plain MPI allreduce still sums
        got = COMM.allreduce(COMM.rank + 1)
        check("MPI itself works afterwards", got == COMM.size * (COMM.size + 1) // 2, str(got))
    except Exception:
        check("no unexpected exception", False, traceback.format_exc())
    (outdir / f"rank{COMM.rank}.json").write_text(json.dumps(CHECKS))


if __name__ == "__main__":
    main()
