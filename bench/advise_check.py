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
4. **DDP steps** (``--ddp 0.2,4,25``): bench/transports.py's MLP at those sizes, every codec's
   step against the no-communication step plus the synchronisation a step pays once (the step
   with one 4-byte allreduce, less the step with none and that allreduce's round trip) plus
   advise's exchange. A verdict is wrong when advise says a codec pays (a saving beyond
   ``gcodec.advise.CLOSE_FRACTION`` of the dense exchange) and it measured slower.
5. **Shaped links** (``--link-json FILE``, from ``bench/link.py --json FILE``): every contender's
   step at every rate against the no-communication step plus advise's exchange on the link the
   ranks probed there, and the measured crossover bandwidth against advise's break-even
   (``bench/link.py``'s ``advise_check``).

The factor reported is max(predicted/measured, measured/predicted) per row; the summary gives the
worst and the median.
"""

from __future__ import annotations

import argparse
import json
import math
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
    CacheEvictor,
    CodecSpeed,
    Link,
    TransportSpeed,
    measure_speed,
    measure_transport,
    predict,
    probe_links,
    transport_sizes,
    verdict,
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


def _timed_steps(run, state, rounds: int, barrier, slowest) -> dict:
    """``rounds + 1`` steps of ``run()`` after a barrier each; the slowest rank's median wall time
    (the first step, the handshake, left out) and the medians of the step report's parts, which
    say where the measured time went (the state's report: one key, one round a step)."""
    ts, parts = [], []
    for _ in range(rounds + 1):
        barrier()
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
        state.end_step()
        parts.append(state.step_report()["last"])
    fields = ("encode_s", "comm_s", "decode_s", "overhead_s")
    return {
        "measured": slowest(statistics.median(ts[1:])),
        "measured_parts": {f: statistics.median(q[f] for q in parts[1:]) for f in fields},
    }


def _predicted_parts(row: dict) -> dict:
    return {"comm_s": row["comm_seconds"], "compute_s": row["compute_seconds"], "rounds": row["rounds"]}


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
            ms = measure_transport(cfg, p, error_feedback=ef, threads=1, sizes=transport_sizes([numel]))
            tr = TransportSpeed(comm.allreduce(ms.seconds(numel), op=MPI.MAX), 0.0, ms.rounds)  # the slowest rank's
            pred_tr = predict(cfg, agreed, [(numel,)], p, glink, error_feedback=ef, transport=tr)
            state = gcodec.mpi.State(cfg, error_feedback=ef, num_threads=1)

            def run(state=state, cfg=cfg) -> None:
                gcodec.mpi.allreduce(comm, x, cfg, key="w", state=state)

            got = _timed_steps(run, state, rounds, comm.Barrier, lambda t: comm.allreduce(t, op=MPI.MAX))
            rows.append(
                {
                    "codec": cfg,
                    "error_feedback": ef,
                    "collective": pred["collective"],
                    **got,
                    "predicted": pred["step_seconds"],
                    "predicted_transport": pred_tr["step_seconds"],
                    "predicted_parts": _predicted_parts(pred_tr),
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


def _gloo_start(rank: int, port: int):  # type: ignore[no-untyped-def]
    """This gloo rank's process group (2 ranks on 127.0.0.1) and its slowest-rank reduction."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120)
    )

    def slowest(t: float) -> float:
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v[0])

    return slowest


def _gloo_links(top: int, rounds: int, slowest, evict=None):  # type: ignore[no-untyped-def]
    """The gloo allreduce link and all-gather link, probed as ``--probe torch`` does (up to ``top``
    float32 values; ``evict``, a CacheEvictor, before each timed collective as ``--probe`` does
    for a training job): (allreduce fit, all-gather fit, the link pricing both)."""
    import torch
    import torch.distributed as dist

    from gcodec.torch.comm import comm_for

    tc, p = comm_for(None), 2
    fit, gfit = probe_links(
        dist.all_reduce,
        lambda b: tc.allgatherv(b, [b.shape[0]] * p).wait(),
        p,
        array=lambda n: torch.ones(n),
        barrier=dist.barrier,
        slowest=slowest,
        sizes=(1 << 10, 1 << 16, 1 << 20, top),
        repeats=rounds,
        evict=evict,
    )
    return fit, gfit, Link(fit.link.bandwidth_bps, fit.link.latency_s, gfit.link)


def gloo_rank(rank: int, port: int, numel: int, rounds: int, out: str) -> None:
    """The same check on torch.distributed with gloo (2 processes on 127.0.0.1)."""
    import torch
    import torch.distributed as dist

    import gcodec.torch
    from gcodec.transports import TransportState

    slowest = _gloo_start(rank, port)
    p = 2
    fit, gfit, glink = _gloo_links(numel, rounds, slowest)
    link, alpha, t_big = fit.link, fit.link.latency_s, fit.samples[-1][1]
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
        ms = measure_transport(cfg, p, threads=1, sizes=transport_sizes([numel]))
        tr = TransportSpeed(slowest(ms.seconds(numel)), 0.0, ms.rounds)  # the slowest rank's
        pred_tr = predict(cfg, agreed, [(numel,)], p, glink, transport=tr)
        state = TransportState(cfg, error_feedback=False, num_threads=1)
        ys = [x.clone() for _ in range(rounds + 1)]  # made before: a clone is not part of the step

        def run(state=state, cfg=cfg, ys=ys) -> None:
            gcodec.torch.all_reduce(ys.pop(), cfg, key="w", state=state)

        got = _timed_steps(run, state, rounds, dist.barrier, slowest)
        rows.append(
            {
                "codec": cfg,
                "collective": pred["collective"],
                **got,
                "predicted": pred["step_seconds"],
                "predicted_transport": pred_tr["step_seconds"],
                "predicted_parts": _predicted_parts(pred_tr),
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


#: The DDP check's contenders: what a user would try on a bandwidth-bound job.
DDP_CODECS = [
    {"id": "fp16"},
    {"id": "uniform", "bits": 4},
    {"id": "topk", "ratio": 0.01},
    {"id": "powersgd", "rank": 2},
]


def ddp_rank(rank: int, port: int, params_m: float, steps: int, out: str, cold: bool = True) -> None:
    """DDP steps of bench/transports.py's MLP (3 square layers with biases, about ``params_m``
    million parameters, one bucket so that the exchange is exposed, as the model prices it) on
    2 gloo ranks: the step with no communication at all (a hook that returns the bucket), with
    DDP's own allreduce and with gcodec's hook per codec, against the step without communication
    plus advise's predicted exchange of the model's gradients (tensors of 1024 elements or more
    compressed as one group, as the hook joins a bucket's tensors; biases dense)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gcodec.torch

    slowest = _gloo_start(rank, port)
    p = 2
    # at least 20 M parameter-steps a contender: a 0.2 M step takes a few milliseconds, and one
    # that the machine delays moves the median of 10 by a third (the same on every rank: it
    # decides how many collectives run)
    steps = max(steps, min(200, math.ceil(20 / params_m)))
    width = int((params_m * 1e6 / 3) ** 0.5)
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(rank))

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(width, width))

    shapes = [tuple(q.shape) for q in make().parameters()]
    comp = [s for s in shapes if len(s) >= 2 and int(np.prod(s)) >= 1024]
    dense = [s for s in shapes if s not in comp]
    n_comp, n_all = sum(int(np.prod(s)) for s in comp), sum(int(np.prod(s)) for s in shapes)

    def noop(state, bucket):  # type: ignore[no-untyped-def]
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def measure(setup) -> dict:  # type: ignore[no-untyped-def]
        model = make()
        ddp = DDP(model, bucket_cap_mb=4096)  # one bucket: the exchange follows the backward pass
        state = setup(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
        ts, parts = [], []
        for i in range(3 + steps):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
            if i >= 3:  # after the warm-up: kernels compiled, DDP's buckets rebuilt
                ts.append(time.perf_counter() - t0)
                if state is not None:
                    parts.append(state.step_report()["last"])
        got = {"measured": slowest(statistics.median(ts))}
        if parts:
            fields = ("encode_s", "comm_s", "decode_s", "overhead_s", "held_s")
            got["measured_parts"] = {f: statistics.median(q[f] for q in parts) for f in fields}
        del ddp, model, opt
        return got

    # the link probed and the codecs timed with the caches read over before each step, as advise
    # does for a training step (its forward and backward passes run between two exchanges);
    # --warm-caches: not
    evict = CacheEvictor() if cold else None
    fit, gfit, glink = _gloo_links(min(n_all, 1 << 22), 5, slowest, evict)
    base = measure(lambda ddp: ddp.register_comm_hook(None, noop))["measured"]
    # The synchronisation a step pays once, whatever its exchange (the ranks' arrival skew at the
    # step's first collective, the wake-ups of ranks that waited): the step with one 4-byte
    # allreduce in place of the exchange, less the step with none and that allreduce's own round
    # trip (timed back to back). Every contender pays it alike, so it moves no verdict; without
    # it the 0.2 M steps read 1.4-1.5x their prediction (docs/advise.md).
    one = torch.zeros(1)

    def sync(state, bucket):  # type: ignore[no-untyped-def]
        return dist.all_reduce(one, async_op=True).get_future().then(lambda _: bucket.buffer())

    synced = measure(lambda ddp: ddp.register_comm_hook(None, sync))["measured"]
    rt = []
    for _ in range(50):
        t0 = time.perf_counter()
        dist.all_reduce(one)
        rt.append(time.perf_counter() - t0)
    sync_s = max(0.0, synced - base - slowest(statistics.median(rt[10:])))
    base_sync = base + sync_s
    dense_row = measure(lambda ddp: None)
    pred_dense = predict(None, measure_speed(None), [(n_all,)], p, fit.link)
    rows = [
        {
            "codec": None,
            **dense_row,
            "predicted": base_sync + pred_dense["step_seconds"],
            "no_comm_s": base,
            "sync_s": sync_s,
        }
    ]
    for cfg in DDP_CODECS:
        low = cfg["id"] == "powersgd"
        sp = measure_speed(cfg, threads=1, evict=evict)
        tensors = comp if low else [(n_comp,)]
        e = torch.tensor([sum(sp.encode_seconds(int(np.prod(s))) for s in tensors), 0.0], dtype=torch.float64)
        e[1] = sum(sp.decode_seconds(int(np.prod(s))) for s in tensors)
        dist.all_reduce(e, op=dist.ReduceOp.MAX)
        # the transports' protocol on the tensors the hook sends (PowerSGD: all the matrices in
        # one exchange, as the hook sends a bucket's), the slowest rank's figure
        ms = measure_transport(
            cfg, p, threads=1, sizes=transport_sizes([n_comp]), shapes=tensors, evict=evict, joined=low
        )
        if ms.per_shape is not None:
            per_shape = tuple((s, slowest(t)) for s, t in ms.per_shape)
            tr = TransportSpeed(0.0, 0.0, ms.rounds, per_shape=per_shape, joined=ms.joined)
        else:
            tr = TransportSpeed(slowest(ms.seconds(n_comp)), 0.0, ms.rounds)
        # the encode and decode lines as the slowest rank measured them (their sum is what counts)
        k = float(e[0]) / max(1e-12, sum(sp.encode_seconds(int(np.prod(s))) for s in tensors))
        kd = float(e[1]) / max(1e-12, sum(sp.decode_seconds(int(np.prod(s))) for s in tensors))
        agreed = CodecSpeed(
            sp.encode_t0 * k, sp.encode_per_element * k, sp.decode_t0 * kd, sp.decode_per_element * kd,
            sp.payload_t0, sp.payload_per_element,
        )  # fmt: skip
        pred = predict(cfg, agreed, tensors, p, glink, dense_tensors=dense, transport=tr)

        def setup(ddp, cfg=cfg):  # type: ignore[no-untyped-def]
            st = gcodec.torch.HookState(cfg, start_iter=0, min_numel=1024, error_feedback=False, num_threads=1)
            ddp.register_comm_hook(st, gcodec.torch.comm_hook)
            return st

        got = measure(setup)
        rows.append(
            {
                "codec": cfg,
                "collective": pred["collective"],
                **got,
                "predicted": base_sync + pred["step_seconds"],
                "predicted_parts": _predicted_parts(pred),
                "no_comm_s": base,
                "sync_s": sync_s,
            }
        )
    if rank == 0:
        for r in rows:
            r["factor"] = _factor(r["predicted"], r["measured"])
        link = {"bandwidth_bps": fit.link.bandwidth_bps, "latency_s": fit.link.latency_s, "gather": gfit.to_dict()}
        Path(out).write_text(json.dumps({"params": n_all, "link": link, "rows": rows}))
    dist.destroy_process_group()


def _spawn_gloo(flags: list[str], timeout: float = 1800) -> dict:
    """Run this file's gloo rank program (``flags`` pick which) as 2 processes; rank 0's JSON."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    tmp = ROOT / ".advise_check_gloo.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GCODEC_NUM_THREADS": "1"}
    base = [sys.executable, __file__, "--port", str(port), *flags]
    procs = [subprocess.Popen([*base, str(r), str(tmp)], env=env) for r in range(2)]
    try:
        for pr in procs:
            if pr.wait(timeout=timeout) != 0:
                raise SystemExit("a gloo rank failed")
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
    res = json.loads(tmp.read_text())
    tmp.unlink()
    return res


def run_gloo(numel: int, rounds: int) -> dict:
    return _spawn_gloo(["--numel", str(numel), "--rounds", str(rounds), "--gloo-rank"], timeout=900)


def _ddp_verdict(r: dict, dense: dict) -> tuple[str, bool]:
    """(advise's verdict on the predicted steps, whether the measured step was faster than DDP's).
    A saving within advise.CLOSE_FRACTION of the dense exchange is "close": no recommendation; a
    wrong verdict is one that recommends (``"pays"``) a codec measured slower."""
    exchange = dense["predicted"] - dense["no_comm_s"] - dense.get("sync_s", 0.0)
    return verdict(dense["predicted"] - r["predicted"], exchange), r["measured"] < dense["measured"]


def _print_ddp(res: dict) -> None:
    print(
        f"-- {res['params'] / 1e6:.2f} M parameters; "
        f"step without communication {1e3 * res['rows'][0]['no_comm_s']:.1f} ms, "
        f"synchronisation {1e3 * res['rows'][0].get('sync_s', 0.0):.2f} ms"
    )
    for r in res["rows"]:
        name = "DDP allreduce" if r["codec"] is None else json.dumps(r["codec"])
        note = ""
        if r["codec"] is not None:
            said, was = _ddp_verdict(r, res["rows"][0])
            note = f"  advise: {said}, measured: {'pays' if was else 'costs'}"
            note += "  (WRONG)" if said == "pays" and not was else ""
        print(
            f"  {name:<34} measured {1e3 * r['measured']:8.1f} ms  predicted {1e3 * r['predicted']:8.1f} ms  "
            f"x{r['factor']:.2f}{note}"
        )


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
        if r["codec"] is not None:  # where the time went: the job's step report against the model
            m, q = r["measured_parts"], r["predicted_parts"]
            extra = (
                f"  [comm {1e3 * m['comm_s']:.1f} vs {1e3 * q['comm_s']:.1f} ms ({q['rounds']} rounds), "
                f"encode+decode+overhead {1e3 * (m['encode_s'] + m['decode_s']):.1f}+{1e3 * m['overhead_s']:.1f} "
                f"vs compute {1e3 * q['compute_s']:.1f} ms]"
            )
        tr = r.get("predicted_transport", r["predicted"])
        print(
            f"{name:<37} measured {1e3 * r['measured']:8.2f} ms  predicted {1e3 * r['predicted']:8.2f} ms  "
            f"x{r['factor']:.2f}; with the transport timed {1e3 * tr:8.2f} ms x{r['factor_transport']:.2f}{extra}"
        )


def ddp_check(sizes: list[float], steps: int, out: str | None, cold: bool = True) -> None:
    """The DDP check at each model size; the verdicts and factors, and a JSON file if asked."""
    print("== DDP on 2 gloo ranks (127.0.0.1), one bucket: advise's predicted step against the measured one")
    res = []
    for m in sizes:
        r = _spawn_gloo(["--steps", str(steps), *([] if cold else ["--warm-caches"]), "--ddp-rank", str(m)])
        _print_ddp(r)
        res.append(r)
    f = [r["factor"] for x in res for r in x["rows"]]
    wrong = [
        (x["params"], r["codec"])
        for x in res
        for r in x["rows"][1:]
        if _ddp_verdict(r, x["rows"][0]) == ("pays", False)
    ]
    print(f"summary: within x{max(f):.2f} (median x{statistics.median(f):.2f}); wrong verdicts: {wrong or 'none'}")
    if out:
        Path(out).write_text(json.dumps({"ddp": res, "factor_max": max(f), "wrong": wrong}, indent=2))


def link_check(path: str, out: str | None, cold: bool = True) -> None:
    """Part 5: advise against ``bench/link.py``'s contenders at every rate (its ``advise_check``,
    with the codecs timed again here)."""
    from bench import link

    res = json.loads(Path(path).read_text())
    if not any((res.get("local_step_ms") or {}).values()):
        raise SystemExit(f"{path}: no no-communication step times (run bench/link.py again: it times them now)")
    chk = link.advise_check(res, cold=cold)
    print("\n".join(link.advise_check_lines(chk)))
    if out:
        Path(out).write_text(json.dumps(chk, indent=2))


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
    ap.add_argument(
        "--ddp",
        metavar="MILLIONS",
        help="only the DDP check, at these model sizes in million parameters (e.g. 0.2,4,25)",
    )
    ap.add_argument(
        "--steps", type=int, default=8, help="timed DDP steps per contender (at least 20 M parameter-steps)"
    )
    ap.add_argument(
        "--link-json", metavar="FILE", help="only the shaped-link check, on an earlier `bench/link.py --json FILE`"
    )
    ap.add_argument(
        "--warm-caches",
        action="store_true",
        help="--ddp, --link-json: time the codecs back to back with warm caches, not after reading the caches over",
    )
    ap.add_argument("--ddp-rank", nargs=3, metavar=("PARAMS", "RANK", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_program:
        rank_program(args.numel, args.rounds, args.rank_program)
        return
    if args.gloo_rank:
        gloo_rank(int(args.gloo_rank[0]), args.port, args.numel, args.rounds, args.gloo_rank[1])
        return
    if args.ddp_rank:
        params_m, rank, out = float(args.ddp_rank[0]), int(args.ddp_rank[1]), args.ddp_rank[2]
        ddp_rank(rank, args.port, params_m, args.steps, out, not args.warm_caches)
        return
    if args.link_json:
        link_check(args.link_json, args.json, not args.warm_caches)
        return
    if args.ddp:
        ddp_check([float(v) for v in args.ddp.split(",")], args.steps, args.json, not args.warm_caches)
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
