"""Rank programs for the watchdog's own tests (tests/test_procs.py):
``python -m tests.transport_ranks.hang SCENARIO ENGINE [RANK WORLD PORT]``, ENGINE ``gloo`` or ``mpi``.

* ``hang``: rank 0 enters a compressed all-reduce (gcodec.torch over gloo, or gcodec.mpi, where
  MPICH spins in its wait) and waits there for rank 1, which never comes: it blocks on an event
  nobody sets, as a rank stuck on a lock would;
* ``busy SECONDS``: rank 0 computes for SECONDS of CPU time while rank 1 waits for it in a
  collective, then both finish that collective and exit 0;
* ``seed``: each rank prints the hash of a string (its interpreter's string hash seed), then both
  finish one collective and exit 0."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np


def stuck_on_a_lock() -> None:
    threading.Event().wait()


def compute(seconds: float) -> None:
    """Encode, validate and decode with a few codecs (Python layers, Numba kernels) until
    ``seconds`` of CPU time are spent."""
    import gcodec

    t0 = time.process_time()
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    codecs = [gcodec.get_codec(c) for c in ("fp16", "uniform", "sign", {"id": "topk", "ratio": 0.1})]
    while time.process_time() - t0 < seconds:
        for c in codecs:
            buf = c.encode(x)
            gcodec.validate(buf)
            x = 0.5 * (x + gcodec.decode(buf))


def main() -> None:
    scenario, engine, *rest = sys.argv[1:]
    seconds = float(rest.pop(0)) if scenario == "busy" else 0.0
    if engine == "gloo":
        import torch
        import torch.distributed as dist

        import gcodec.torch

        from ..procs import start_gloo

        rank, world, port = (int(a) for a in rest)
        start_gloo(rank, world, port, 20)

        def collective() -> None:
            gcodec.torch.all_reduce(torch.ones(4096), "uniform", key="k")

        def done() -> None:
            dist.destroy_process_group()
    else:
        from mpi4py import MPI

        import gcodec.mpi

        rank = MPI.COMM_WORLD.rank

        def collective() -> None:
            gcodec.mpi.allreduce(MPI.COMM_WORLD, np.ones(4096, np.float32), "uniform", key="k")

        def done() -> None:
            pass

    if scenario == "hang" and rank == 1:
        stuck_on_a_lock()
    if scenario == "busy" and rank == 0:
        compute(seconds)
    if scenario == "seed":
        print(f"string hash {hash('gcodec')}", flush=True)
    collective()
    done()


if __name__ == "__main__":
    main()
