"""Two MPI ranks train a linear model through gcodec.mpi with the adaptive controller:
``mpiexec -n 2 python -m tests.transport_ranks.adaptive_mpi OUTDIR``. The link is given as 1 Mbit/s
for the first 60 steps and 1 Tbit/s after; each rank writes its losses, decisions and switches.

At 1 Mbit/s the dense exchange of the 32 KB gradient is priced at 0.26 s a step, so no codec's
measured seconds, even on a loaded machine, make dense look cheaper there. At 10 Mbit/s (26 ms) a
fresh-clone CI run once ended with its last switch at step 15 instead of at the change (step 65):
most likely codec seconds measured slower than the dense exchange on the busy machine."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
from mpi4py import MPI

import gcodec.mpi
from gcodec.adaptive import AdaptiveController
from gcodec.telemetry import Telemetry


def main() -> None:
    comm = MPI.COMM_WORLD
    outdir = Path(sys.argv[1])
    result: dict = {"rank": comm.rank}
    try:
        rng = np.random.default_rng(comm.rank)
        d, k, n = 128, 64, 512
        w_true = np.random.default_rng(99).standard_normal((d, k)).astype(np.float32)
        x = rng.standard_normal((n, d)).astype(np.float32)
        y = x @ w_true
        w = np.zeros((d, k), np.float32)
        ctl = AdaptiveController(bandwidth="1Mbit", interval=10, warmup_steps=5, latency_s=1e-5)
        state = gcodec.mpi.Router(controller=ctl, error_feedback=True, telemetry=Telemetry(every=5, warn=False))
        losses = []
        for step in range(120):
            if step == 60:
                ctl.bandwidth_bps = 1e12  # the link gets fast: compression must get out of the way
            r = x @ w - y
            losses.append(float(comm.allreduce(float(np.mean(r * r))) / comm.size))
            g = (2.0 / n) * (x.T @ r)
            g = gcodec.mpi.allreduce(comm, g, None, key="w", state=state)
            w -= np.float32(0.02) * g
        result.update(
            losses=losses,
            switches=[[s[1], s[2], s[3]] for s in state.switches],
            decisions=[[dd["step"], dd["from"], dd["to"]] for dd in ctl.decisions],
            ok=True,
        )
    except Exception:
        result.update(ok=False, error=traceback.format_exc())
    (outdir / f"rank{comm.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
