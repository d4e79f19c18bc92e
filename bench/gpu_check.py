"""One-call check of gcodec's CUDA backend on a machine with one NVIDIA GPU (under 8 minutes).

    pip install -e '.[cuda,torch]'     # numba-cuda and CuPy; torch is optional but wanted
    python bench/gpu_check.py          # writes docs/performance-gpu.md

1. **Bytes**: for every codec the CUDA backend runs (fp16, bf16, uniform 8/4/2 nearest and
   stochastic, qsgd, terngrad, sign, topk, randomk, threshold, hybrids) and several seeds, the payload
   encoded from device memory must equal the CPU payload byte for byte, and the CPU payload decoded
   into a device ``out=`` must equal the CPU decode (plus ``accumulate=True``). PowerSGD: the device
   payload decodes close to the CPU's (its encoder's products are free, specs/codecs/powersgd.md §5)
   and the CPU payload decodes on the device bit for bit (§6). ErrorFeedback with device arrays: the
   payloads and the residual equal the CPU run's. A torch tensor encoded under a non-default
   ``torch.cuda.stream`` gives the same bytes.
2. **torch**: a CUDA tensor is encoded without a host copy of its values (checked with the CUDA
   caching allocator's and torch's profiler-free counters: the tensor's storage pointer is what the
   kernels read) and decoded into a CUDA tensor ``out=``.
3. **Speed** on ~1 GiB float32 inputs, timed with CUDA events after a warm-up: device-to-device copy
   bandwidth, then encode and decode of each codec, against ``x.half()``, ``torch.topk`` (1 % of
   256 M elements: gcodec's top-k encode of the same tensor against it, target >= 5x) and PowerSGD's
   two rank-4 matmuls (gcodec's rank-4 encode against them), reported as a fraction of the copy
   bandwidth (bytes read + bytes written).

Anything missing (no GPU, no torch, no CuPy) is reported and skipped, never counted as passed; the
exit status is 1 if any check failed. This script has never run on a real GPU as of its first
commit (docs/gpu.md): expect first-run fixes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CODECS: list[tuple[str, dict[str, Any]]] = [
    ("fp16", {"id": "fp16"}),
    ("bf16", {"id": "bf16"}),
    ("uniform8", {"id": "uniform", "bits": 8}),
    ("uniform4", {"id": "uniform", "bits": 4}),
    ("uniform2", {"id": "uniform", "bits": 2}),
    ("uniform8-sto", {"id": "uniform", "bits": 8, "rounding": "stochastic", "seed": 1}),
    ("uniform4-f16", {"id": "uniform", "bits": 4, "scale_dtype": "float16"}),
    ("qsgd15", {"id": "qsgd", "levels": 15, "seed": 2}),
    ("terngrad", {"id": "terngrad", "seed": 3}),
    ("terngrad-clip", {"id": "terngrad", "clip": 2.5, "seed": 4}),
    ("sign", {"id": "sign"}),
    ("topk1%", {"id": "topk", "ratio": 0.01}),
    ("topk10%-raw", {"id": "topk", "ratio": 0.1, "index_coding": "raw"}),
    ("randomk1%", {"id": "randomk", "ratio": 0.01, "seed": 5}),
    ("threshold", {"id": "threshold", "threshold": 2.0}),
    ("topk1%-fp16", {"id": "topk", "ratio": 0.01, "values": {"id": "fp16"}}),
    ("randomk1%-u8", {"id": "randomk", "ratio": 0.01, "seed": 6, "values": {"id": "uniform", "bits": 8}}),
    ("fp8-e4m3", {"id": "fp8"}),
    ("mxfp8", {"id": "mx", "element": "e4m3"}),
    ("mxfp6-e3m2", {"id": "mx", "element": "e3m2"}),
    ("mxfp4", {"id": "mx"}),
    ("mxfp4-sto", {"id": "mx", "rounding": "stochastic", "seed": 7}),
    ("nvfp4", {"id": "nvfp4"}),
]
LOWRANK: list[tuple[str, dict[str, Any], tuple[int, int]]] = [
    ("powersgd-r1", {"id": "powersgd", "rank": 1}, (256, 384)),
    ("powersgd-r4", {"id": "powersgd", "rank": 4, "iterations": 2}, (1024, 512)),
    ("powersgd-r2-fp16", {"id": "powersgd", "rank": 2, "factors": {"id": "fp16"}}, (512, 512)),
]
EF_CODECS = [
    ("ef-topk", {"id": "topk", "ratio": 0.01}),
    ("ef-uniform4", {"id": "uniform", "bits": 4}),
    ("ef-sign (fused kernel)", {"id": "sign"}),
    ("ef-sign g0 (fused kernel)", {"id": "sign", "group_size": 0}),
    ("ef-fp16 (fused kernel)", {"id": "fp16"}),
    ("ef-bf16 (fused kernel)", {"id": "bf16"}),
]

results: list[tuple[str, str, str]] = []  # (check, status, detail)


def report(check: str, status: str, detail: str = "") -> None:
    results.append((check, status, detail))
    print(f"[{status:4}] {check} {detail}", flush=True)


def check_bytes(cuda: Any, gcodec: Any) -> None:
    rng = np.random.default_rng(0)
    sizes = [1, 7, 64, 1000, 65537, 1 << 20]
    for name, cfg in CODECS:
        bad = []
        for n in sizes:
            for seed in (0, 1, 2):
                x = (rng.standard_normal(n) * 3).astype(np.float32)
                try:
                    cpu = bytes(gcodec.encode(x, cfg, step=seed))
                    p = gcodec.encode(cuda.to_device(x), cfg, step=seed)
                    if bytes(p) != cpu:
                        bad.append(f"n={n} step={seed}: payload differs")
                        continue
                    out = cuda.to_device(np.zeros(n, np.float32))
                    gcodec.decode(cpu, out=out)
                    ref = gcodec.decode(cpu).reshape(-1)
                    if not np.array_equal(out.copy_to_host(), ref):
                        bad.append(f"n={n}: decode differs")
                    gcodec.decode(p, out=out, accumulate=True)
                    if not np.array_equal(out.copy_to_host(), ref + ref):
                        bad.append(f"n={n}: accumulate differs")
                except Exception as e:
                    bad.append(f"n={n}: {type(e).__name__}: {e}")
        report(f"bytes {name}", "FAIL" if bad else "ok", "; ".join(bad[:3]))
    x = np.round(rng.standard_normal(4096) * 2).astype(np.float32)  # heavy ties
    for k in (0, 1, 100, 4096):
        cpu = bytes(gcodec.encode(x, {"id": "topk", "k": k}))
        ok = bytes(gcodec.encode(cuda.to_device(x), {"id": "topk", "k": k})) == cpu
        report(f"bytes topk ties k={k}", "ok" if ok else "FAIL")


def check_lowrank(cuda: Any, gcodec: Any) -> None:
    rng = np.random.default_rng(1)
    for name, cfg, shape in LOWRANK:
        try:
            x = rng.standard_normal(shape).astype(np.float32)
            cpu = bytes(gcodec.encode(x, cfg, step=1))
            p = gcodec.encode(cuda.to_device(x), cfg, step=1)
            ref = gcodec.decode(cpu).reshape(-1)
            err = float(np.abs(gcodec.decode(bytes(p)).reshape(-1) - ref).max()) / max(float(np.abs(ref).max()), 1e-30)
            out = cuda.to_device(np.zeros(x.size, np.float32))
            gcodec.decode(cpu, out=out)
            exact = np.array_equal(out.copy_to_host().view(np.uint32), ref.view(np.uint32))
            tol = 1e-4 if "factors" not in cfg else 5e-2
            ok = exact and err <= tol and len(p) == len(cpu)
            detail = (
                f"device decode of the CPU payload bit-identical: {exact}; relative error of device factors {err:.2e}"
            )
            report(f"powersgd {name}", "ok" if ok else "FAIL", detail)
        except Exception as e:
            report(f"powersgd {name}", "FAIL", f"{type(e).__name__}: {e}")


def check_feedback(cuda: Any, gcodec: Any) -> None:
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(100_000).astype(np.float32) for _ in range(3)]
    for name, cfg in EF_CODECS:
        try:
            a, b = gcodec.ErrorFeedback(cfg), gcodec.ErrorFeedback(cfg)
            same = all(
                bytes(a.encode(x, "w", step=s)) == bytes(b.encode(cuda.to_device(x), "w", step=s))
                for s, x in enumerate(xs)
            )
            same = same and a.residual("w").tobytes() == b.residual("w").copy_to_host().tobytes()
            report(f"error feedback {name}", "ok" if same else "FAIL", "payloads and device residual vs CPU")
        except Exception as e:
            report(f"error feedback {name}", "FAIL", f"{type(e).__name__}: {e}")


def check_torch(gcodec: Any) -> Any:
    try:
        import torch
    except ImportError:
        report("torch round trip", "skip", "torch is not installed")
        return None
    if not torch.cuda.is_available():
        report("torch round trip", "skip", "torch sees no CUDA device")
        return None
    try:
        x = torch.randn(1 << 16, device="cuda")
        before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
        p = gcodec.encode(x, "uniform")
        cpu = bytes(gcodec.encode(x.cpu().numpy(), "uniform"))
        out = torch.empty_like(x)
        gcodec.decode(p, out=out)
        ok = bytes(p) == cpu and torch.equal(out.cpu(), torch.from_numpy(gcodec.decode(cpu)))
        after = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
        report("torch round trip", "ok" if ok else "FAIL", f"torch allocations during the round trip: {after - before}")
    except Exception as e:
        report("torch round trip", "FAIL", f"{type(e).__name__}: {e}")
    try:  # work queued on the caller's current stream (not the default one)
        x = torch.randn(1 << 20, device="cuda")
        cpu = bytes(gcodec.encode(x.cpu().numpy(), {"id": "topk", "ratio": 0.01}))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            p = gcodec.encode(x, {"id": "topk", "ratio": 0.01})
            out = torch.empty_like(x)
            gcodec.decode(p, out=out)
        s.synchronize()
        ok = bytes(p) == cpu and torch.equal(out.cpu(), torch.from_numpy(gcodec.decode(cpu)))
        report("torch current stream", "ok" if ok else "FAIL", "topk encode/decode under torch.cuda.stream(s)")
    except Exception as e:
        report("torch current stream", "FAIL", f"{type(e).__name__}: {e}")
    return torch


def check_protocols(cuda: Any, gcodec: Any) -> None:
    """Every transport protocol on device arrays, over in-process lockstep ranks, against the same
    rank program on NumPy arrays over thread ranks (tests/device_protocols.py: every codec; summable,
    gather, two-phase, PowerSGD, both reduce-scatter paths, the compressed all-gather)."""
    from gcodec.transports import run_blocking
    from tests.device_protocols import APPROXIMATE, CASES, header_bound, rank_program
    from tests.localcomm import run_lockstep, run_threads

    for case in CASES:
        name = f"protocol {case['id']}"
        try:
            cpu = run_threads(case["p"], lambda comm, case=case: run_blocking(rank_program(comm, case, lambda h: h)))
            dev = run_lockstep(case["p"], lambda comm, case=case: rank_program(comm, case, cuda.to_device))
            bad, host = [], 0
            for r, (want, got) in enumerate(zip(cpu, dev)):
                if isinstance(want, BaseException) or isinstance(got, BaseException):
                    bad.append(f"rank {r}: cpu {want!r:.80} / device {got!r:.200}")
                    continue
                for o_cpu, o_dev in zip(want[0], got[0]):
                    ref = np.ascontiguousarray(o_cpu, np.float32).reshape(-1)
                    mine = o_dev.copy_to_host().reshape(-1)
                    if case["id"] in APPROXIMATE:
                        if float(np.abs(mine - ref).max()) > 1e-4 * max(float(np.abs(ref).max()), 1.0):
                            bad.append(f"rank {r}: beyond float32 rounding")
                    elif not np.array_equal(mine.view(np.uint32), ref.view(np.uint32)):
                        bad.append(f"rank {r}: output differs")
                host = max([host, *(int(s["host_bytes"]) for s in got[1])])
            detail = f"max host_bytes per step {host} (header bound {header_bound(case)})"
            report(name, "FAIL" if bad else "ok", "; ".join(bad[:2]) or detail)
        except Exception as e:
            report(name, "FAIL", f"{type(e).__name__}: {e}")


#: (name, codec, mode) of the torch.distributed checks with CUDA tensors.
DIST_CODECS = [
    ("fp16 summable", {"id": "fp16"}, "summable"),
    ("bf16 summable", {"id": "bf16"}, "summable"),
    ("uniform4 gather", {"id": "uniform", "bits": 4}, "gather"),
    ("topk gather", {"id": "topk", "ratio": 0.01}, "gather"),
    ("randomk summable", {"id": "randomk", "ratio": 0.05, "seed": 1}, "summable"),
    ("powersgd", {"id": "powersgd", "rank": 2}, "powersgd"),
]


def _dist_rank(rank: int, world: int, backend: str, path: str, out: Any) -> None:
    """One rank of a torch.distributed group: gcodec.torch.all_reduce of CUDA tensors and of the same
    values on the CPU, per codec; puts {name: (equal, max abs difference, error)} into ``out``."""
    import torch
    import torch.distributed as dist

    import gcodec.torch as gt

    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world)
    res: dict[str, Any] = {}
    for name, cfg, mode in DIST_CODECS:
        try:
            shape = (256, 128) if mode == "powersgd" else (1 << 16,)
            g = torch.Generator().manual_seed(1000 + rank)
            x = torch.randn(shape, generator=g)
            on_dev, on_cpu = x.cuda(), x.clone()
            # a fresh state per run: the same steps, streams and warm start for both
            gt.all_reduce(on_dev, cfg, mode=mode, key="t", state=gt.TransportState(cfg, error_feedback=False))
            if backend == "gloo":
                gt.all_reduce(on_cpu, cfg, mode=mode, key="t", state=gt.TransportState(cfg, error_feedback=False))
                ref = on_cpu
            else:  # NCCL takes no CPU tensors: the one-rank protocol on the CPU is the reference
                ref = torch.from_numpy(gcodec_roundtrip(x.numpy(), cfg, mode))
            d = float((on_dev.cpu() - ref).abs().max())
            res[name] = (bool(torch.equal(on_dev.cpu(), ref)), d, "")
        except Exception as e:
            res[name] = (False, float("nan"), f"{type(e).__name__}: {e}"[:200])
    try:  # DiLoCo on CUDA parameters against the same run on the CPU (a gloo group beside NCCL's)
        cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo")
        on_dev = _diloco_run(torch, gt, "cuda", None, rank)
        on_cpu = _diloco_run(torch, gt, "cpu", cpu_group, rank)
        d = max(float((on_dev[n] - on_cpu[n]).abs().max()) for n in on_dev)
        # the inner steps' products differ in the last bits between cuBLAS and the CPU: close, not equal
        h = hashlib.sha256(b"".join(on_dev[n].numpy().tobytes() for n in sorted(on_dev))).hexdigest()
        res["diloco uniform 4 + EF"] = (d < 1e-4, d, "")
        res["diloco digest"] = (True, 0.0, h)
    except Exception as e:
        res["diloco uniform 4 + EF"] = (False, float("nan"), f"{type(e).__name__}: {e}"[:200])
    out.put((rank, res))
    dist.barrier()
    dist.destroy_process_group()


def _diloco_run(torch: Any, gt: Any, device: str, group: Any, rank: int) -> dict[str, Any]:
    """Four SGD inner steps, H = 2, 4-bit pseudo-gradients with error feedback: the global parameters."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    dl = gt.DiLoCo(net, opt, sync_every=2, codec={"id": "uniform", "bits": 4}, group=group)
    for step in range(4):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(100 * rank + step)).to(device)
        opt.zero_grad()
        (net(x) ** 2).mean().backward()
        opt.step()
    dl.close()
    return {n: t.detach().cpu() for n, t in dl.global_parameters().items()}


def gcodec_roundtrip(x: np.ndarray, cfg: dict[str, Any], mode: str) -> np.ndarray:
    """What a one-rank mean of ``x`` gives on the CPU: the protocol over gcodec's one-rank communicator."""
    from gcodec.transports import TransportState, allreduce_protocol, run_blocking
    from tests.localcomm import LocalComm

    out = np.empty_like(x)
    run_blocking(allreduce_protocol(LocalComm(), TransportState(cfg, error_feedback=False), x, out, "t", "mean", mode))
    return out


def check_dist(torch: Any) -> None:
    """gcodec.torch.all_reduce with CUDA tensors: NCCL at world size 1, and 2 gloo ranks sharing this
    GPU (NCCL cannot run two ranks on one GPU), against the CPU run of the same values."""
    import tempfile

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    for backend, world in (("nccl", 1), ("gloo", 2)):
        path = tempfile.mktemp(prefix="gcodec-dist-")
        q = ctx.Queue()
        procs = [ctx.Process(target=_dist_rank, args=(r, world, backend, path, q)) for r in range(world)]
        for p in procs:
            p.start()
        got = {}
        try:
            for _ in range(world):
                r, res = q.get(timeout=120)
                got[r] = res
        except Exception as e:
            report(f"torch {backend} x{world}", "FAIL", f"no result from every rank: {type(e).__name__}: {e}")
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        dil = [got[r].get("diloco uniform 4 + EF") for r in sorted(got)]
        if dil and all(dil):
            same = len({got[r]["diloco digest"][2] for r in got}) == 1  # every replica's global parameters
            ok = all(e for e, _, _ in dil) and same
            worst = max(d for _, d, _ in dil)
            detail = "; ".join(m for _, _, m in dil if m) or (
                f"max |cuda - cpu| {worst:.2e}, replicas {'bit-identical' if same else 'DIFFER'}"
            )
            report(f"torch {backend} x{world} DiLoCo (CUDA parameters)", "ok" if ok else "FAIL", detail)
        for name, _, mode in DIST_CODECS:
            per = [got[r][name] for r in sorted(got) if name in got[r]]
            if not per:
                continue
            exact = all(e for e, _, _ in per)
            err = "; ".join(m for _, _, m in per if m)
            worst = max(d for _, d, _ in per)
            ok = not err and (exact or (mode == "powersgd" and worst < 1e-3))
            report(f"torch {backend} x{world} {name}", "ok" if ok else "FAIL", err or f"max |device - cpu| {worst:.2e}")


def bench_peers(torch: Any, gcodec: Any) -> list[tuple[str, float, float, str]]:
    """fp16 allreduce at world size 1 (NCCL): torch's fp16_compress_hook's work (half, NCCL all_reduce,
    divide, copy back) against gcodec.torch.all_reduce(x, "fp16"), timed with CUDA events."""
    import tempfile

    import torch.distributed as dist

    import gcodec.torch as gt

    rows: list[tuple[str, float, float, str]] = []
    store = f"file://{tempfile.mktemp(prefix='gcodec-peer-')}"
    dist.init_process_group("nccl", init_method=store, rank=0, world_size=1)
    try:
        n = 1 << 24
        x = torch.randn(n, device="cuda")

        def hook_work() -> None:
            h = x.half()
            dist.all_reduce(h)
            x.copy_(h.div_(1))

        t_hook = timed(torch, hook_work)
        t_gc = timed(torch, lambda: gt.all_reduce(x, "fp16", key="peer"))
        rows.append(("torch fp16_compress_hook's work, 16 M", t_hook, 6 * n / t_hook, "peer"))
        rows.append(("gcodec.torch.all_reduce fp16, 16 M", t_gc, 6 * n / t_gc, f"{t_gc / t_hook:.2f}x the hook's time"))
    finally:
        dist.destroy_process_group()
    return rows


def timed(torch: Any, fn: Any, reps: int = 5) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, with CUDA events, after one warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return float(np.median(times))


def bench(torch: Any, gcodec: Any, gib: float, deadline: float) -> list[tuple[str, float, float, str]]:
    rows: list[tuple[str, float, float, str]] = []
    n = int(gib * (1 << 30)) // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    t = timed(torch, lambda: y.copy_(x))
    copy_bw = 2 * 4 * n / t
    rows.append(("device copy (read + write)", t, copy_bw, "reference"))
    t = timed(torch, lambda: x.half())
    rows.append(("torch x.half()", t, (4 + 2) * n / t, "peer"))
    for name, cfg in CODECS:
        if time.monotonic() > deadline:
            rows.append((name, float("nan"), float("nan"), "skipped: time budget"))
            continue
        try:
            p = gcodec.encode(x, cfg, step=0)
            nbytes = len(p)
            te = timed(torch, lambda cfg=cfg: gcodec.encode(x, cfg, step=0), reps=3)
            rows.append((f"{name} encode", te, (4 * n + nbytes) / te, ""))
            out = torch.empty_like(x)
            td = timed(torch, lambda p=p, out=out: gcodec.decode(p, out=out), reps=3)
            rows.append((f"{name} decode", td, (4 * n + nbytes) / td, ""))
        except Exception as e:
            rows.append((name, float("nan"), float("nan"), f"{type(e).__name__}: {e}"[:120]))
    # error feedback: the fused sign kernel (x + e, scales, bits and the new residual in three
    # passes) and fp16's (one pass) against the generic path of uniform 4-bit (copy, add, encode,
    # decode, subtract)
    ef_rows = (
        ("sign + EF (fused)", {"id": "sign"}),
        ("fp16 + EF (fused)", {"id": "fp16"}),
        ("uniform 4 + EF (generic)", {"id": "uniform", "bits": 4}),
    )
    for name, cfg in ef_rows:
        if time.monotonic() > deadline:
            rows.append((name, float("nan"), float("nan"), "skipped: time budget"))
            continue
        try:
            ef = gcodec.ErrorFeedback(cfg)
            ef.encode(x, "w")
            te = timed(torch, lambda ef=ef: ef.encode(x, "w"), reps=3)
            rows.append((name, te, 3 * 4 * n / te, "bandwidth counts x, e read and e written once"))
        except Exception as e:
            rows.append((name, float("nan"), float("nan"), f"{type(e).__name__}: {e}"[:120]))
    m = 1 << 28
    z = torch.randn(m, device="cuda")
    t = timed(torch, lambda: torch.topk(z.abs(), m // 100, sorted=False), reps=3)
    rows.append(("torch.topk 1 % of 256 M", t, 4 * m / t, "peer"))
    try:
        cfg = {"id": "topk", "ratio": 0.01}
        tg = timed(torch, lambda: gcodec.encode(z, cfg), reps=3)
        speedup = t / tg
        verdict = "meets" if speedup >= 5 else "misses"
        rows.append(
            ("gcodec topk 1 % of 256 M (encode)", tg, 4 * m / tg, f"{speedup:.1f}x torch.topk ({verdict} >= 5x)")
        )
        if speedup < 5:
            report("target topk >= 5x torch.topk", "miss", f"{speedup:.2f}x")
    except Exception as e:
        rows.append(("gcodec topk 1 % of 256 M", float("nan"), float("nan"), f"{type(e).__name__}: {e}"[:120]))
    side = int(np.sqrt(n))
    M = x[: side * side].view(side, side)
    Q = torch.randn(side, 4, device="cuda")
    t = timed(torch, lambda: M.t() @ (M @ Q), reps=3)
    rows.append((f"PowerSGD rank-4 matmuls {side}x{side}", t, 2 * 4 * side * side / t, "peer"))
    if time.monotonic() < deadline:
        try:
            cfg = {"id": "powersgd", "rank": 4, "warm_start": False}
            tg = timed(torch, lambda: gcodec.encode(M, cfg), reps=1)
            import importlib.util

            how = "cuBLAS via CuPy" if importlib.util.find_spec("cupy") else "Numba products: CuPy is not installed"
            note = f"{t / tg:.2f}x the matmuls ({how})"
            rows.append((f"gcodec powersgd rank-4 encode {side}x{side}", tg, 2 * 4 * side * side / tg, note))
        except Exception as e:
            rows.append(("gcodec powersgd rank-4 encode", float("nan"), float("nan"), f"{type(e).__name__}: {e}"[:120]))
    return [(r[0], r[1], r[2] / copy_bw if r[2] == r[2] else float("nan"), r[3]) for r in rows]


def write_doc(rows: list[tuple[str, float, float, str]], device: str, cmd: str) -> None:
    lines = [
        "# GPU performance",
        "",
        f"Written by `{cmd}` on {device} ({platform.node()}, {time.strftime('%Y-%m-%d')}). Throughput is",
        "bytes read + bytes written per second, as a fraction of the measured device-to-device copy",
        "bandwidth; times are medians of CUDA-event timings after a warm-up.",
        "",
        "| what | time (ms) | fraction of copy bandwidth | note |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b * 1e3:.3f} | {c:.2f} | {d} |" for a, b, c, d in rows]
    lines += ["", "## Checks", "", "| check | status | detail |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in results]
    (ROOT / "docs" / "performance-gpu.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="input size for the speed runs (default 1 GiB)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds before remaining speed runs are skipped")
    ap.add_argument("--no-doc", action="store_true", help="do not write docs/performance-gpu.md")
    args = ap.parse_args()
    deadline = time.monotonic() + args.budget
    if os.environ.get("NUMBA_ENABLE_CUDASIM"):
        print(
            "FAIL: NUMBA_ENABLE_CUDASIM is set: this script is for a real GPU (the simulator tests are in pytest)",
            file=sys.stderr,
        )
        return 2
    try:
        from numba import cuda
    except ImportError:
        print("FAIL: numba-cuda is not installed: pip install -e '.[cuda]'", file=sys.stderr)
        return 2
    if not cuda.is_available():
        print("FAIL: no usable CUDA GPU (numba.cuda.is_available() is False): nothing was checked", file=sys.stderr)
        return 2
    import gcodec

    device = cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else str(device)
    print(f"device: {device}", flush=True)
    try:
        check_bytes(cuda, gcodec)
    except Exception:
        report("bytes", "FAIL", traceback.format_exc(limit=3).replace("\n", " "))
    for check in (check_lowrank, check_feedback):
        try:
            check(cuda, gcodec)
        except Exception:
            report(check.__name__, "FAIL", traceback.format_exc(limit=3).replace("\n", " "))
    try:
        check_protocols(cuda, gcodec)
    except Exception:
        report("protocols", "FAIL", traceback.format_exc(limit=3).replace("\n", " "))
    torch = check_torch(gcodec)
    rows: list[tuple[str, float, float, str]] = []
    if torch is not None:
        try:
            check_dist(torch)
        except Exception as e:
            report("torch.distributed", "FAIL", f"{type(e).__name__}: {e}")
        try:
            rows = bench(torch, gcodec, args.gib, deadline)
        except Exception as e:
            report("speed", "FAIL", f"{type(e).__name__}: {e}")
        try:
            rows += bench_peers(torch, gcodec)
        except Exception as e:
            report("speed: fp16 hook peer", "FAIL", f"{type(e).__name__}: {e}")
    else:
        report("speed", "skip", "needs torch with CUDA for events and peers")
    if not args.no_doc:
        write_doc(rows, device, "python bench/gpu_check.py" + (f" --gib {args.gib}" if args.gib != 1.0 else ""))
    return 1 if any(s == "FAIL" for _, s, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
