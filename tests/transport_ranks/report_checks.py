"""The step-report checks of the engines called one key at a time (a TransportState's, a Router's),
shared by the thread ranks (tests/test_step_reports.py), the mpiexec ranks (mpi_program.py,
scenario ``report``) and the gloo ranks (torch_program.py, scenario ``all_reduce_report``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: A weight the policies compress and a bias the Router's policy keeps dense.
N_W, N_B = 6000, 64


def inputs(rank: int) -> dict[str, np.ndarray]:
    g = np.random.default_rng(rank)
    return {"w": g.standard_normal(N_W).astype(np.float32), "b": g.standard_normal(N_B).astype(np.float32)}


def check_rounds(
    rank: int, size: int, run_key: Callable[[str, np.ndarray], None], report: Any, end_each: bool, dense: int
) -> list[str]:
    """Three rounds of the keys (w, b) through ``run_key`` on this rank, ``dense`` bytes of each
    round sent uncompressed, in gather mode (every rank's payload crosses to every other rank, so
    the received bytes are ``(size - 1)`` times the encoded ones). With ``end_each`` each round is
    closed by ``report.end_step()`` and its report held against the round's wall time; without,
    the next round's first call closes it. Returns the problems found."""
    bad: list[str] = []
    xs = inputs(rank)
    p = size
    for i in range(3):
        t0 = time.perf_counter()
        for k in ("w", "b"):
            run_key(k, xs[k].copy())
        wall = time.perf_counter() - t0
        if end_each:
            report.end_step()
        elif i == 0:
            if report.step_report()["last"] is not None:
                bad.append("round 0 closed before a key came back")
            continue
        rep = report.step_report()["last"]
        want = i if end_each else i - 1
        parts = rep["encode_s"] + rep["comm_s"] + rep["decode_s"] + rep["overhead_s"]
        if rep["step"] != want or rep["raw_bytes"] != 4 * (N_W + N_B):
            bad.append(f"round {i}: step {rep['step']} (want {want}), raw {rep['raw_bytes']}")
        if abs(parts - rep["held_s"]) > 1e-9 or rep["overhead_s"] < 0:
            bad.append(f"round {i}: parts {parts} against held {rep['held_s']}")
        if end_each and not 0 < rep["held_s"] <= wall:
            bad.append(f"round {i}: held {rep['held_s']} outside (0, the round's wall time {wall}]")
        sent, got = rep["payload_bytes"], rep["wire_bytes"]
        if not 0 < sent < 4 * (N_W + N_B) - dense or got != (p - 1) * sent:
            bad.append(f"round {i}: payload {rep['payload_bytes']}, wire {rep['wire_bytes']}")
        if rep["dense_bytes"] != dense or rep["dense_wire_bytes"] != 2 * (p - 1) * dense // p:
            bad.append(f"round {i}: dense {rep['dense_bytes']} / {rep['dense_wire_bytes']}, want {dense}")
    return bad
