"""Two MPI ranks run DiLoCo on a linear model with NumPy, through gcodec.mpi and
gcodec.lowcomm.Schedule: ``mpiexec -n 2 python -m tests.transport_ranks.diloco_mpi OUTDIR``.

Two fragments (the weight matrix and the bias), 4-bit pseudo-gradients with error feedback on a
router (``gcodec.mpi.Router``), a Nesterov outer step written out in NumPy. Each rank writes
the digest of its global parameters after every outer step and the losses of the global model."""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from pathlib import Path

import numpy as np
from mpi4py import MPI

import gcodec.mpi
from gcodec.lowcomm import Schedule


def main() -> None:
    comm = MPI.COMM_WORLD
    outdir = Path(sys.argv[1])
    result: dict = {"rank": comm.rank}
    try:
        d, k, n = 64, 16, 256
        w_true = np.random.default_rng(99).standard_normal((d, k)).astype(np.float32)
        x = np.random.default_rng(comm.rank).standard_normal((n, d)).astype(np.float32)
        y = x @ w_true + 0.5
        local = {"w": np.zeros((d, k), np.float32), "b": np.zeros(k, np.float32)}
        glob = {name: v.copy() for name, v in local.items()}
        mom = {name: np.zeros_like(v) for name, v in local.items()}
        fragments = {0: ["w"], 1: ["b"]}
        sched = Schedule(sync_every=6, fragments=2)
        router = gcodec.mpi.Router(None, codec={"id": "uniform", "bits": 4}, error_feedback=True)
        digests, losses = [], []
        xa = np.concatenate(comm.allgather(x))
        ya = np.concatenate(comm.allgather(y))
        for step in range(1, 37):
            r = x @ local["w"] + local["b"] - y
            local["w"] -= 0.05 * (2.0 / n) * (x.T @ r)
            local["b"] -= 0.05 * (2.0 / n) * r.sum(0)
            for f in sched.sends(step):  # delay 0: sent and applied after the same inner step
                for name in fragments[f]:
                    delta = glob[name] - local[name]
                    avg = gcodec.mpi.allreduce(comm, delta, None, key=name, state=router)
                    mom[name] = 0.9 * mom[name] + avg  # torch's SGD with Nesterov momentum
                    glob[name] = glob[name] - 0.7 * (avg + 0.9 * mom[name])
                    local[name] = glob[name].copy()
                h = hashlib.sha256(b"".join(glob[k].tobytes() for k in sorted(glob))).hexdigest()
                digests.append([step, f, h])
                ra = xa @ glob["w"] + glob["b"] - ya
                losses.append(float(np.mean(ra * ra)))
        result.update(ok=True, digests=digests, losses=losses, steps=dict(router.steps))
    except Exception:
        result.update(ok=False, error=traceback.format_exc())
    (outdir / f"rank{comm.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
