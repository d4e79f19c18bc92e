"""Run under ``mpiexec -n P python -m tests.transport_ranks.mpi_program SCENARIO OUTDIR``.

Each rank writes ``OUTDIR/rank<r>.json``: a list of checks ``{"name", "ok", "detail"}``. The pytest
side (tests/test_transport_mpi.py) reads every rank's file; a rank that did not write one failed.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
from mpi4py import MPI

import gcodec
import gcodec.mpi
from gcodec.aggregate import summable_values
from gcodec.transports import run_blocking
from gcodec.transports.two_phase import owner_bounds

from .bounds import bound, envelope
from .report_checks import N_B, check_rounds

COMM = MPI.COMM_WORLD
P, ME = COMM.size, COMM.rank
CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def inputs(shape: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Every rank's input (each rank can compute all of them, for the references)."""
    return [np.random.default_rng(seed * 100 + r).standard_t(4, size=shape).astype(np.float32) for r in range(P)]


# Codecs and the modes each runs: every codec in every mode it can run (docs/transports.md, Modes).
CODECS = [
    ({"id": "fp16"}, ["summable", "gather", "two_phase"]),
    ({"id": "bf16"}, ["summable", "gather", "two_phase"]),
    ({"id": "randomk", "ratio": 0.25, "seed": 3}, ["summable", "gather", "two_phase"]),
    ({"id": "randomk", "ratio": 0.25, "seed": 3, "values": {"id": "fp16"}}, ["summable"]),
    ({"id": "uniform", "bits": 8}, ["gather", "two_phase"]),
    ({"id": "uniform", "bits": 4, "rounding": "stochastic", "seed": 5}, ["gather", "two_phase"]),
    ({"id": "qsgd", "levels": 15, "seed": 1}, ["gather", "two_phase"]),
    ({"id": "terngrad", "seed": 2}, ["gather", "two_phase"]),
    ({"id": "sign"}, ["gather", "two_phase"]),
    ({"id": "topk", "ratio": 0.1}, ["gather", "two_phase"]),
    ({"id": "threshold", "threshold": 0.5}, ["gather", "two_phase"]),
]


def summable_reference(codec: gcodec.Codec, xs: list[np.ndarray], op: str, step: int) -> np.ndarray:
    """The same arithmetic in one process: encode x/p per rank, add the values in rank order in
    float32, round once to the values' type, decode."""
    scaled = [x.astype(np.float32) * np.float32(1.0 / P) if op == "mean" else x for x in xs]
    pays = [codec.encode(s, key="ref", step=step) for s in scaled]
    vals = [summable_values(b) for b in pays]
    acc = np.zeros(vals[0].shape, np.float32)
    for v in vals:
        acc += v.astype(np.float32)
    from gcodec.aggregate import reseal

    vals[0][...] = acc.astype(vals[0].dtype)
    reseal(pays[0])
    return gcodec.decode(pays[0]).astype(xs[0].dtype)


def scenario_matrix() -> None:
    shape = (40, 130)  # 5200 elements: uneven chunks and groups
    for i, (cfg, modes) in enumerate(CODECS):
        for mode in modes:
            codec = gcodec.get_codec(cfg)
            name = f"{cfg} {mode}"
            xs = inputs(shape, i)
            exact = np.mean(np.stack(xs).astype(np.float64), axis=0)
            y = gcodec.mpi.allreduce(COMM, xs[ME], codec, key=f"m{i}-{mode}", mode=mode)
            same = COMM.allgather(y.tobytes())
            check(name + ": same bytes on every rank", all(s == same[0] for s in same))
            check(name + ": shape and dtype", y.shape == shape and y.dtype == np.float32)
            if mode == "summable":
                ref = summable_reference(codec, xs, "mean", 0)
                check(name + ": bit-exact against the one-process reference", np.array_equal(y, ref))
            flat_err = np.abs(y.astype(np.float64) - exact).reshape(-1)
            if mode == "summable" and cfg["id"] == "randomk":
                continue  # the reference above is the whole story (dropped elements are zero by design)
            if mode == "gather":
                b = sum(bound(codec, x.reshape(-1)) for x in xs) / P
            elif mode == "summable":  # each rank rounds x/p, then the sum is rounded once
                b1 = sum(bound(codec, x.reshape(-1)) for x in xs) / P
                b = b1 + envelope(codec, np.abs(exact.reshape(-1)) + b1)
            else:  # two-phase: the mean of the chunk errors, plus the owner's re-encode of the sum
                ob = owner_bounds(exact.size, P)
                b = np.zeros(exact.size)
                for j in range(P):
                    sl = slice(ob[j], ob[j + 1])
                    b1 = sum(bound(codec, x.reshape(-1)[sl]) for x in xs) / P
                    b[sl] = b1 + envelope(codec, np.abs(exact.reshape(-1)[sl]) + b1)
            b = b + 1e-6 * np.mean(np.abs(np.stack(xs)), axis=0).reshape(-1) + 1e-30
            worst = float(np.max(flat_err / b))
            check(name + ": within the codec's bound of the exact mean", worst <= 1.0, f"worst err/bound {worst:.3g}")

    # summable with op="sum" and a 16-bit input dtype; bit-exact too
    for cfg in ({"id": "fp16"}, {"id": "bf16"}):
        codec = gcodec.get_codec(cfg)
        xs = [x.astype(gcodec.arrays.BFLOAT16) for x in inputs((3, 1000), 9)]
        y = gcodec.mpi.allreduce(COMM, xs[ME], codec, op="sum", key="sum16")
        ref = summable_reference(codec, xs, "sum", 0)
        check(f"{cfg} op=sum bf16 input: bit-exact", y.dtype == xs[0].dtype and np.array_equal(y, ref))

    # PowerSGD: at full rank the mean comes back (up to float32 rounding); at rank 2 the error is
    # that of an orthogonal projection of the mean, so never more than the mean itself.
    xs = inputs((8, 300), 20)
    exact = np.mean(np.stack(xs).astype(np.float64), axis=0)
    full = gcodec.get_codec("powersgd", rank=8, min_compression_rate=0.0, seed=1)
    y = gcodec.mpi.allreduce(COMM, xs[ME], full, key="psgd-full")
    rel = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    check("powersgd full rank: equals the mean", rel < 1e-4, f"rel err {rel:.3g}")
    r2 = gcodec.get_codec("powersgd", rank=2, seed=1)
    for mode in ("lowrank", "gather"):
        y = gcodec.mpi.allreduce(COMM, xs[ME], r2, key=f"psgd-{mode}", mode=mode)
        rel = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
        same = COMM.allgather(y.tobytes())
        check(f"powersgd r2 {mode}: projection bound", 0 < rel <= 1.0 + 1e-5, f"rel err {rel:.3g}")
        check(f"powersgd r2 {mode}: same on every rank", all(s == same[0] for s in same))
    # 16-bit factors: MPI sums binary16 (MPICH's MPIX_C_FLOAT16); the same projection bound, the
    # same result on every rank; bfloat16 has no MPI datatype and every rank refuses it alike
    r16 = gcodec.get_codec("powersgd", rank=2, seed=1, factors="fp16")
    y = gcodec.mpi.allreduce(COMM, xs[ME], r16, key="psgd-fp16")
    rel = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
    same = COMM.allgather(y.tobytes())
    check("powersgd r2 fp16 factors: projection bound", 0 < rel <= 1.0 + 1e-3, f"rel err {rel:.3g}")
    check("powersgd r2 fp16 factors: same on every rank", all(s == same[0] for s in same))
    try:
        gcodec.mpi.allreduce(COMM, xs[ME], gcodec.get_codec("powersgd", rank=2, factors="bf16"), key="psgd-bf16")
        check("powersgd bf16 factors: refused", False, "no error")
    except gcodec.ConfigError as e:
        check("powersgd bf16 factors: refused", "bfloat16" in str(e), str(e))
    v = inputs((1000,), 21)  # a vector: PowerSGD leaves it dense, the exact mean in float32
    y = gcodec.mpi.allreduce(COMM, v[ME], r2, key="psgd-vec")
    check("powersgd vector: dense mean", np.allclose(y, np.mean(v, axis=0), rtol=1e-6, atol=1e-6))

    # iallreduce: two requests in flight, waited in reverse order, both right.
    xs = inputs((2000,), 30)
    r1 = gcodec.mpi.iallreduce(COMM, xs[ME], "fp16", key="i1")
    r2q = gcodec.mpi.iallreduce(COMM, xs[ME] * 2, "bf16", key="i2")
    while not r2q.test():
        time.sleep(0.001)
    b2, b1 = r2q.wait(), r1.wait()
    m = np.mean(xs, axis=0)
    e1, e2 = float(np.max(np.abs(b1 - m))), float(np.max(np.abs(b2 - 2 * m)))
    check("iallreduce: two in flight", e1 < 2e-3 * np.max(np.abs(m)) and e2 < 2e-2 * np.max(np.abs(m)), f"{e1} {e2}")

    # statistics: bytes and times per key
    st = gcodec.mpi.State("uniform", error_feedback=False)
    gcodec.mpi.allreduce(COMM, xs[ME], "uniform", key="s", state=st, mode="two_phase")
    s = st.stats()["s"]
    check(
        "stats: raw, payload and wire bytes, seconds",
        s["raw_bytes"] == 8000 and 0 < s["wire_bytes"] and s["payload_bytes"] > 0 and s["encode_s"] > 0,
        json.dumps(s),
    )

    # ef=, the old name of state=: warns, and means the same
    st2 = gcodec.mpi.State("uniform", error_feedback=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = gcodec.mpi.allreduce(COMM, xs[ME], "uniform", key="s", ef=st2, mode="two_phase")
    st3 = gcodec.mpi.State("uniform", error_feedback=False)
    new = gcodec.mpi.allreduce(COMM, xs[ME], "uniform", key="s", state=st3, mode="two_phase")
    named = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    check(
        "ef= still works, warns once and names state=",
        np.array_equal(old, new) and st2.stats()["s"]["raw_bytes"] == 8000 and len(named) == 1 and "state=" in named[0],
        repr(named),
    )
    try:
        gcodec.mpi.allreduce(COMM, xs[ME], "uniform", key="s", ef=st2, state=st3)
        check("ef= and state= together are refused", False, "no error")
    except TypeError as e:
        check("ef= and state= together are refused", "both" in str(e), str(e))


def scenario_errors() -> None:
    x = inputs((4096,), 40)[ME]
    # 1. mismatched config: rank 1 uses 4 bits, the others 8
    bits = 4 if ME == 1 else 8
    try:
        gcodec.mpi.allreduce(COMM, x, gcodec.get_codec("uniform", bits=bits), key="mm")
        check("mismatch raises", False, "no error")
    except gcodec.ConfigError as e:
        check("mismatch raises ConfigError naming the field", "codec" in str(e) and "bits" in str(e), str(e))
    # 2. mismatched shape
    try:
        gcodec.mpi.allreduce(COMM, x[: 4000 + ME], "fp16", key="shape")
        check("shape mismatch raises", False, "no error")
    except gcodec.ConfigError as e:
        check("shape mismatch raises ConfigError", "shape" in str(e), str(e))

    # 3. a corrupt peer payload: rank 1's communicator flips a byte of what it sends
    from gcodec.mpi import MPICommunicator

    class CorruptingComm(MPICommunicator):
        armed = False  # after the handshake: corrupt payloads, not fingerprints

        def allgatherv(self, buf, counts):  # type: ignore[no-untyped-def]
            if self.armed and buf.shape[0] > 200:
                buf = buf.copy()
                buf[-50] ^= 0xFF
            return super().allgatherv(buf, counts)

        def alltoallv(self, bufs, recv_counts):  # type: ignore[no-untyped-def]
            bufs = [b.copy() for b in bufs]
            for b in bufs:
                if self.armed and b.shape[0] > 200:
                    b[-50] ^= 0xFF
            return super().alltoallv(bufs, recv_counts)

    for mode in ("gather", "two_phase"):
        comm = CorruptingComm(COMM) if ME == 1 else MPICommunicator(COMM)
        state = gcodec.mpi.State("uniform", error_feedback=False)
        from gcodec.transports import allreduce_protocol

        run_blocking(allreduce_protocol(comm, state, x, np.empty_like(x), "bad", "mean", mode))  # clean step
        comm.armed = True  # type: ignore[attr-defined]
        try:
            run_blocking(allreduce_protocol(comm, state, x, np.empty_like(x), "bad", "mean", mode))
            check(f"corrupt payload ({mode}) raises", False, "no error")
        except gcodec.ChecksumError as e:
            check(f"corrupt payload ({mode}) raises the ChecksumError everywhere", True, f"{type(e).__name__}: {e}")

    # 4. NaN input on one rank: every rank raises, nobody hangs
    for codec in ("fp16", "topk"):
        bad = x.copy()
        if ME == P - 1:
            bad[7] = np.nan
        try:
            gcodec.mpi.allreduce(COMM, bad, codec, key=f"nan-{codec}")
            check(f"NaN on one rank ({codec}) raises", False, "no error")
        except gcodec.GcodecError as e:
            check(f"NaN on one rank ({codec}) raises everywhere", True, f"{type(e).__name__}: {e}")

    # 5. after all that, the communicator still works
    y = gcodec.mpi.allreduce(COMM, x, "fp16", key="after")
    m = np.mean(inputs((4096,), 40), axis=0)
    err = float(np.max(np.abs(y - m)))
    check("allreduce works after the errors", err < 2.0**-10 * float(np.max(np.abs(x))) * 2, f"max err {err}")


def scenario_checkpoint(path: str) -> None:
    """Train-like loop with error feedback; restore at step 3 from a pickle; the rest is bit-identical."""
    codecs = [{"id": "topk", "ratio": 0.05}, {"id": "uniform", "bits": 4, "rounding": "stochastic", "seed": 4}]
    for mode in ("gather", "two_phase", "summable", "lowrank"):
        for cfg in (
            codecs
            if mode in ("gather", "two_phase")
            else [{"id": "randomk", "ratio": 0.1, "seed": 9} if mode == "summable" else {"id": "powersgd", "rank": 2}]
        ):
            steps = [inputs((32, 64), 50 + t)[ME] for t in range(6)]

            def run(state, ts, steps=steps, mode=mode):  # type: ignore[no-untyped-def]
                return [gcodec.mpi.allreduce(COMM, steps[t], state.codec, key="w", state=state, mode=mode) for t in ts]

            a = gcodec.mpi.State(cfg, mode=mode)
            first = run(a, range(3))
            blob = pickle.dumps(a.state_dict())
            rest = run(a, range(3, 6))
            b = gcodec.mpi.State(cfg, mode=mode)
            b.load_state_dict(pickle.loads(blob))
            again = run(b, range(3, 6))
            same = all(np.array_equal(u, v) for u, v in zip(rest, again))
            check(f"checkpoint {cfg['id']} {mode}: resumes bit-identically", same and len(first) == 3)
            ef_on = a.state_dict()["worker"]["residuals"] or a.state_dict()["lowrank_residuals"]
            check(f"checkpoint {cfg['id']} {mode}: residuals saved", bool(ef_on))


def scenario_report() -> None:
    """The step reports of gcodec.mpi's two states against the rounds' wall time (report_checks)."""
    for end_each in (True, False):
        state = gcodec.mpi.State({"id": "uniform", "bits": 4}, mode="gather")

        def by_state(k: str, x: np.ndarray, state=state) -> None:  # type: ignore[no-untyped-def]
            gcodec.mpi.allreduce(COMM, x, None, key=k, state=state, mode="gather")

        bad = check_rounds(ME, P, by_state, state, end_each, dense=0)
        check(f"State's step report adds up (end_step each round: {end_each})", not bad, "; ".join(bad))
        router = gcodec.mpi.Router({"b": None}, codec={"id": "uniform", "bits": 4}, mode="gather")

        def by_policy(k: str, x: np.ndarray, router=router) -> None:  # type: ignore[no-untyped-def]
            gcodec.mpi.allreduce(COMM, x, None, key=k, state=router)

        bad = check_rounds(ME, P, by_policy, router, end_each, dense=4 * N_B)
        check(f"Router's step report adds up, dense key included (end_step: {end_each})", not bad, "; ".join(bad))


def scenario_kill() -> None:
    x = inputs((1 << 16,), 60)[ME]
    gcodec.mpi.allreduce(COMM, x, "uniform", key="k", mode="two_phase")  # handshake and one step
    if ME == 1:
        os._exit(3)  # dies mid-job, between steps: the others are inside the next collective
    gcodec.mpi.allreduce(COMM, x, "uniform", key="k", mode="two_phase")
    check("survivor returned from a collective with a dead peer", False)


def main() -> None:
    scenario, outdir = sys.argv[1], Path(sys.argv[2])
    try:
        {"matrix": scenario_matrix, "errors": scenario_errors, "kill": scenario_kill, "report": scenario_report}.get(
            scenario, lambda: scenario_checkpoint(str(outdir))
        )()
    except Exception:
        check("no unexpected exception", False, traceback.format_exc())
    (outdir / f"rank{ME}.json").write_text(json.dumps(CHECKS))


if __name__ == "__main__":
    main()
