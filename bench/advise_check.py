"""Check ``gcodec advise``'s predictions against this machine: encode/decode times and gcodec.mpi
allreduce times, predicted against measured.

    python bench/advise_check.py [--numel 4194304] [--ranks 2] [--json out.json]

1. **Codec speed.** The advise model fits ``t(n) = t0 + c·n`` on two sizes (16 Ki and 4 Mi elements);
   here each codec is timed at other sizes (256 Ki and ``--numel``) and compared with the line.
2. **Allreduce.** ``mpiexec -n RANKS`` runs this file as the rank program. The link (alpha, beta) is
   calibrated from two dense ``MPI.Allreduce`` sizes (the model's ring formula), each rank measures
   its codec speeds (one kernel thread per rank, as the transports use), and every codec's
   ``gcodec.mpi.allreduce`` of ``--numel`` float32 values is timed (median of the rounds, interleaved)
   and compared with :func:`gcodec.advise.predict`'s step time for that link.
3. **gloo.** The same with two torch.distributed gloo processes on 127.0.0.1: dense
   ``dist.all_reduce`` calibrates the link, ``gcodec.torch.all_reduce`` is timed (``--no-gloo`` skips).

The factor reported is max(predicted/measured, measured/predicted) per row; the summary gives the
worst and the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gcodec.advise import (  # noqa: E402
    CodecSpeed,
    Link,
    TransportSpeed,
    measure_speed,
    measure_transport,
    predict,
    probe_links,
)

CODECS = [
    {"id": "fp16"},
    {"id": "bf16"},
    {"id": "uniform", "bits": 8},
    {"id": "uniform", "bits": 4},
    {"id": "qsgd", "levels": 15},
    {"id": "topk", "ratio": 0.01},
]


def _factor(pred: float, meas: float) -> float:
    return max(pred / meas, meas / pred) if pred > 0 and meas > 0 else float("inf")


def _best(f, repeats: int) -> float:
    f()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def speed_check(numel: int) -> list[dict]:
    import gcodec
    from gcodec.codecs.state import CodecState

    rows = []
    for cfg in CODECS:
        sp = measure_speed(cfg)
        for n in (1 << 18, numel):
            x = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
            st = CodecState()
            buf = gcodec.encode(x, cfg, key="k", state=st)
            out = np.empty_like(x)
            enc = _best(lambda x=x, st=st, cfg=cfg: gcodec.encode(x, cfg, key="k", state=st), 3)
            dec = _best(lambda buf=buf, out=out: gcodec.decode(buf, out=out), 3)
            row = {
                "codec": cfg,
                "numel": n,
                "encode_predicted": sp.encode_seconds(n),
                "encode_measured": enc,
                "decode_predicted": sp.decode_seconds(n),
                "decode_measured": dec,
            }
            row["encode_factor"] = _factor(row["encode_predicted"], enc)
            row["decode_factor"] = _factor(row["decode_predicted"], dec)
            rows.append(row)
            print(
                f"{cfg['id']:<8} {json.dumps({k: v for k, v in cfg.items() if k != 'id'}):<18} n={n:>9} "
                f"encode {1e3 * enc:8.3f} ms (pred {1e3 * row['encode_predicted']:8.3f}, x{row['encode_factor']:.2f})  "
                f"decode {1e3 * dec:8.3f} ms (pred {1e3 * row['decode_predicted']:8.3f}, x{row['decode_factor']:.2f})",
                flush=True,
            )
    return rows


def rank_program(numel: int, rounds: int, out: str) -> None:
    from mpi4py import MPI

    import gcodec.mpi

    comm = MPI.COMM_WORLD
    p = comm.size

    # the link as gcodec advise --probe measures it, with the checked size as the largest
    mc = gcodec.mpi.MPICommunicator(comm)
    fit, gfit = probe_links(
        lambda a: comm.Allreduce(MPI.IN_PLACE, a),
        lambda b: mc.allgatherv(b, [b.shape[0]] * p).wait(),
        p,
        barrier=comm.Barrier,
        slowest=lambda t: comm.allreduce(t, op=MPI.MAX),
        sizes=(1 << 10, 1 << 16, 1 << 20, numel),
        repeats=rounds,
    )
    link, alpha, t_big = fit.link, fit.link.latency_s, fit.samples[-1][1]
    glink = Link(link.bandwidth_bps, link.latency_s, gfit.link)  # the transport-timed rows use both
    dense_pred = predict(None, measure_speed(None), [(numel,)], p, link)["step_seconds"]
    rows = [{"codec": None, "measured": t_big, "predicted": dense_pred}]
    x = np.random.default_rng(comm.rank).standard_normal(numel, dtype=np.float32)
    for cfg in CODECS:
        sp = measure_speed(cfg, threads=1)
        sp_enc = comm.allreduce(sp.encode_seconds(numel), op=MPI.MAX)
        sp_dec = comm.allreduce(sp.decode_seconds(numel), op=MPI.MAX)
        agreed = CodecSpeed(sp_enc, 0.0, sp_dec, 0.0, sp.payload_t0, sp.payload_per_element)
        for ef in (False, True):
            pred = predict(cfg, agreed, [(numel,)], p, link, error_feedback=ef)
            tr = comm.allreduce(measure_transport(cfg, p, error_feedback=ef, threads=1).seconds(numel), op=MPI.MAX)
            pred_tr = predict(cfg, agreed, [(numel,)], p, glink, error_feedback=ef, transport=TransportSpeed(tr, 0.0))
            state = gcodec.mpi.State(cfg, error_feedback=ef, num_threads=1)
            ts = []
            for _ in range(rounds + 1):
                comm.Barrier()
                t0 = time.perf_counter()
                gcodec.mpi.allreduce(comm, x, cfg, key="w", state=state)
                ts.append(time.perf_counter() - t0)
            meas = comm.allreduce(statistics.median(ts[1:]), op=MPI.MAX)
            s = state.stats()["w"]["total"]
            rows.append(
                {
                    "codec": cfg,
                    "error_feedback": ef,
                    "collective": pred["collective"],
                    "measured": meas,
                    "predicted": pred["step_seconds"],
                    "predicted_transport": pred_tr["step_seconds"],
                    "predicted_comm": pred["comm_seconds"],
                    "predicted_compute": pred["compute_seconds"],
                    "measured_encode_decode": (s["encode_s"] + s["decode_s"]) / (rounds + 1),
                    "measured_comm": s["comm_s"] / (rounds + 1),
                }
            )
    if comm.rank == 0:
        for r in rows:
            r["factor"] = _factor(r["predicted"], r["measured"])
            r["factor_transport"] = _factor(r.get("predicted_transport", r["predicted"]), r["measured"])
        Path(out).write_text(
            json.dumps(
                {
                    "link": {"bandwidth_bps": link.bandwidth_bps, "latency_s": alpha, "gather": gfit.to_dict()},
                    "rows": rows,
                },
                indent=2,
            )
        )


def gloo_rank(rank: int, port: int, numel: int, rounds: int, out: str) -> None:
    """The same check on torch.distributed with gloo (2 processes on 127.0.0.1)."""
    import datetime

    import torch
    import torch.distributed as dist

    import gcodec.torch
    from gcodec.torch.comm import comm_for
    from gcodec.transports import TransportState

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    p = 2

    def slowest(t: float) -> float:
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v[0])

    def med_max(ts: list[float]) -> float:
        return slowest(statistics.median(ts[1:]))

    tc = comm_for(None)
    fit, gfit = probe_links(
        dist.all_reduce,
        lambda b: tc.allgatherv(b, [b.shape[0]] * p).wait(),
        p,
        array=lambda n: torch.ones(n),
        barrier=dist.barrier,
        slowest=slowest,
        sizes=(1 << 10, 1 << 16, 1 << 20, numel),
        repeats=rounds,
    )
    link, alpha, t_big = fit.link, fit.link.latency_s, fit.samples[-1][1]
    glink = Link(link.bandwidth_bps, link.latency_s, gfit.link)
    rows = [
        {
            "codec": None,
            "measured": t_big,
            "predicted": predict(None, measure_speed(None), [(numel,)], p, link)["step_seconds"],
        }
    ]
    x = torch.from_numpy(np.random.default_rng(rank).standard_normal(numel, dtype=np.float32))
    for cfg in CODECS:
        sp = measure_speed(cfg, threads=1)
        e = torch.tensor([sp.encode_seconds(numel), sp.decode_seconds(numel)], dtype=torch.float64)
        dist.all_reduce(e, op=dist.ReduceOp.MAX)
        agreed = CodecSpeed(float(e[0]), 0.0, float(e[1]), 0.0, sp.payload_t0, sp.payload_per_element)
        pred = predict(cfg, agreed, [(numel,)], p, link)
        tr = slowest(measure_transport(cfg, p, threads=1).seconds(numel))
        pred_tr = predict(cfg, agreed, [(numel,)], p, glink, transport=TransportSpeed(tr, 0.0))
        state = TransportState(cfg, error_feedback=False, num_threads=1)
        ts = []
        for _ in range(rounds + 1):
            y = x.clone()
            dist.barrier()
            t0 = time.perf_counter()
            gcodec.torch.all_reduce(y, cfg, key="w", state=state)
            ts.append(time.perf_counter() - t0)
        rows.append(
            {
                "codec": cfg,
                "collective": pred["collective"],
                "measured": med_max(ts),
                "predicted": pred["step_seconds"],
                "predicted_transport": pred_tr["step_seconds"],
            }
        )
    if rank == 0:
        for r in rows:
            r["factor"] = _factor(r["predicted"], r["measured"])
            r["factor_transport"] = _factor(r.get("predicted_transport", r["predicted"]), r["measured"])
        Path(out).write_text(
            json.dumps(
                {
                    "link": {"bandwidth_bps": link.bandwidth_bps, "latency_s": alpha, "gather": gfit.to_dict()},
                    "rows": rows,
                }
            )
        )
    dist.destroy_process_group()


def run_gloo(numel: int, rounds: int) -> dict:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    tmp = ROOT / ".advise_check_gloo.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GCODEC_NUM_THREADS": "1"}
    base = [sys.executable, __file__, "--numel", str(numel), "--rounds", str(rounds), "--port", str(port)]
    procs = [subprocess.Popen([*base, "--gloo-rank", str(r), str(tmp)], env=env) for r in range(2)]
    try:
        for pr in procs:
            if pr.wait(timeout=900) != 0:
                raise SystemExit("a gloo rank failed")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
    res = json.loads(tmp.read_text())
    tmp.unlink()
    return res


def _print_rows(res: dict) -> None:
    link = res["link"]
    g = link["gather"]
    print(
        f"calibrated link: {link['bandwidth_bps'] / 1e9:.2f} Gbit/s, alpha {1e6 * link['latency_s']:.1f} us; "
        f"all-gather {g['bandwidth_bps'] / 1e9:.2f} Gbit/s, alpha {1e6 * g['latency_s']:.1f} us"
    )
    for r in res["rows"]:
        name = "dense allreduce" if r["codec"] is None else json.dumps(r["codec"])
        name += " + EF" if r.get("error_feedback") else ""
        extra = ""
        if r["codec"] is not None and "measured_comm" in r:
            extra = (
                f"  [compute {1e3 * r['measured_encode_decode']:.1f} vs {1e3 * r['predicted_compute']:.1f} ms, "
                f"comm {1e3 * r['measured_comm']:.1f} vs {1e3 * r['predicted_comm']:.1f} ms]"
            )
        tr = r.get("predicted_transport", r["predicted"])
        print(
            f"{name:<37} measured {1e3 * r['measured']:8.2f} ms  predicted {1e3 * r['predicted']:8.2f} ms  "
            f"x{r['factor']:.2f}; with the transport timed {1e3 * tr:8.2f} ms x{r['factor_transport']:.2f}{extra}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numel", type=int, default=1 << 22)
    ap.add_argument("--skip-speed", action="store_true", help="only the allreduce part")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed (gloo) part")
    ap.add_argument("--rank-program", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--gloo-rank", nargs=2, metavar=("RANK", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_program:
        rank_program(args.numel, args.rounds, args.rank_program)
        return
    if args.gloo_rank:
        gloo_rank(int(args.gloo_rank[0]), args.port, args.numel, args.rounds, args.gloo_rank[1])
        return
    print(f"== codec speed: the advise line against timings at other sizes ({os.cpu_count()} cores)")
    speed = [] if args.skip_speed else speed_check(args.numel)
    print(f"== gcodec.mpi allreduce of {args.numel} float32 on {args.ranks} ranks (mpiexec, this machine)")
    tmp = ROOT / ".advise_check_mpi.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GCODEC_NUM_THREADS": "1"}
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec), "-n", str(args.ranks), sys.executable, __file__, "--numel", str(args.numel)]
    subprocess.run([*cmd, "--rounds", str(args.rounds), "--rank-program", str(tmp)], check=True, env=env, timeout=900)
    mpi = json.loads(tmp.read_text())
    tmp.unlink()
    _print_rows(mpi)
    gloo: dict = {"rows": []}
    if not args.no_gloo:
        print(f"== gcodec.torch.all_reduce of {args.numel} float32 on 2 gloo ranks (127.0.0.1)")
        gloo = run_gloo(args.numel, args.rounds)
        _print_rows(gloo)
    factors = [r["encode_factor"] for r in speed] + [r["decode_factor"] for r in speed] or [float("nan")]
    comm_f = [r["factor"] for r in mpi["rows"] if r["codec"] is not None]
    gloo_f = [r["factor"] for r in gloo["rows"] if r["codec"] is not None] or [float("nan")]
    comm_t = [r["factor_transport"] for r in mpi["rows"] if r["codec"] is not None]
    gloo_t = [r["factor_transport"] for r in gloo["rows"] if r["codec"] is not None] or [float("nan")]
    summary = {
        "speed_factor_median": statistics.median(factors),
        "speed_factor_max": max(factors),
        "allreduce_factor_median": statistics.median(comm_f),
        "allreduce_factor_max": max(comm_f),
        "gloo_factor_median": statistics.median(gloo_f),
        "gloo_factor_max": max(gloo_f),
        "allreduce_transport_factor_median": statistics.median(comm_t),
        "allreduce_transport_factor_max": max(comm_t),
        "gloo_transport_factor_median": statistics.median(gloo_t),
        "gloo_transport_factor_max": max(gloo_t),
    }
    print(
        f"summary: codec speed within x{summary['speed_factor_max']:.2f} "
        f"(median x{summary['speed_factor_median']:.2f}); "
        f"MPI allreduce within x{summary['allreduce_factor_max']:.2f} "
        f"(median x{summary['allreduce_factor_median']:.2f}); "
        f"gloo within x{summary['gloo_factor_max']:.2f} (median x{summary['gloo_factor_median']:.2f})"
    )
    print(
        "with the transports' protocol timed (advise's default): "
        f"MPI within x{summary['allreduce_transport_factor_max']:.2f} "
        f"(median x{summary['allreduce_transport_factor_median']:.2f}); "
        f"gloo within x{summary['gloo_transport_factor_max']:.2f} "
        f"(median x{summary['gloo_transport_factor_median']:.2f})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"speed": speed, "mpi": mpi, "gloo": gloo, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
