"""One gloo rank: ``python -m tests.transport_ranks.torch_program SCENARIO OUTDIR RANK WORLD PORT``.

Writes ``OUTDIR/rank<r>.json`` (a list of checks, as the MPI program does) and, for training
scenarios, the loss curves and final parameters that tests/test_transport_torch.py compares.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec
import gcodec.torch

from ..procs import finish_gloo, run_checked, start_gloo
from .report_checks import N_B, check_rounds

CHECKS: list[dict] = []
RANK = WORLD = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def model_and_data(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP on a fixed teacher problem; each rank gets its own half of the batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8)
    ).to(dtype)
    g = torch.Generator().manual_seed(100 + RANK)
    x = torch.randn(128, 32, generator=g)
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(5))
    y = torch.tanh(x @ teacher)
    return model, x.to(dtype), y.to(dtype)


def train(
    hook: str, steps: int = 40, dtype: torch.dtype = torch.float32, bucket_cap_mb: float = 0.01, start_iter: int = 2
) -> dict:
    model, x, y = model_and_data(dtype)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    state = None
    if hook == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "torch-powersgd":
        ps = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(ps, powerSGD_hook.powerSGD_hook)
    elif hook != "none":
        cfg = json.loads(hook)
        state = gcodec.torch.HookState(codec=cfg, start_iter=start_iter, min_numel=64, module=model)
        ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2 if dtype == torch.float32 else 0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x).float(), y.float())
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).numpy()
    return {"losses": losses, "params": flat.tolist(), "keys": sorted(state.stats()) if state else []}


def scenario_train(outdir: Path) -> None:
    runs = {}
    # torch's powerSGD_hook launches collectives from future callbacks; with several buckets on
    # gloo their order can differ between ranks (a size-mismatch abort here), so it and the gcodec
    # run it is compared with get one bucket.
    runs["torch-powersgd"] = train("torch-powersgd", bucket_cap_mb=25)
    runs["powersgd-one-bucket"] = train('{"id": "powersgd", "rank": 2}', bucket_cap_mb=25)
    hooks = [
        "none",
        "torch-fp16",
        '{"id": "fp16"}',
        '{"id": "bf16"}',
        '{"id": "uniform", "bits": 4}',
        '{"id": "topk", "ratio": 0.05}',
        '{"id": "sign"}',
        '{"id": "randomk", "ratio": 0.25}',
        '{"id": "powersgd", "rank": 2}',
    ]
    for h in hooks:
        runs[h] = train(h)
    # compression from the very first step: DDP rebuilds its buckets after it (other sizes, other
    # groups of parameters) and the residuals must carry over, not fail. Uniform's groups of 64
    # join this model's weights (multiples of 64) into one flat group per bucket, so the groups
    # change; top-k sends each weight alone, before the rebuild and after it.
    runs["topk-through-rebuild"] = train('{"id": "topk", "ratio": 0.05}', start_iter=0)
    runs["uniform4-through-rebuild"] = train('{"id": "uniform", "bits": 4}', start_iter=0)
    for dtype in (torch.float16, torch.bfloat16):
        runs[f"uniform-{dtype}"] = train('{"id": "uniform", "bits": 8}', dtype=dtype)
        runs[f"fp16-{dtype}"] = train('{"id": "fp16"}', dtype=dtype)
    if RANK == 0:
        (outdir / "train.json").write_text(json.dumps(runs))
    # every rank must end with the same parameters (the hook's results are identical everywhere)
    for h, r in runs.items():
        mine = np.array(r["params"], np.float32)
        other = [torch.zeros(mine.size) for _ in range(WORLD)]
        dist.all_gather(other, torch.from_numpy(mine))
        check(f"{h}: same parameters on every rank", all(torch.equal(o, other[0]) for o in other))


def scenario_report(outdir: Path) -> None:
    """The hook's per-step report against the step itself: two codecs by policy, biases dense,
    two warm-up steps; several buckets per step."""
    model, x, y = model_and_data()
    ddp = DDP(model, bucket_cap_mb=0.01)
    policy = {"2.weight": {"id": "uniform", "bits": 4}, "*": "fp16"}
    state = gcodec.torch.HookState(codec="fp16", start_iter=2, min_numel=1024, module=model, policy=policy)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    params = list(model.parameters())
    raw = sum(q.numel() * 4 for q in params)
    dense = sum(q.numel() * 4 for q in params if q.numel() < 1024)  # the biases and the 8 x 96 weight
    for i in range(5):
        t0 = time.perf_counter()
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # DDP waits for every bucket's future here
        backward_s = time.perf_counter() - t0
        rep = state.step_report()["last"]
        parts = rep["encode_s"] + rep["comm_s"] + rep["decode_s"] + rep["overhead_s"]
        warm = i < 2
        check(
            f"step {i}: the report is this iteration's, of every gradient byte",
            rep["step"] == i and rep["raw_bytes"] == raw,
            json.dumps(rep),
        )
        check(
            f"step {i}: dense bytes are the small tensors' ({dense} B) once compression starts, and travel as a ring",
            rep["dense_bytes"] == (0 if warm else dense)
            and rep["dense_wire_bytes"] == 2 * (WORLD - 1) * rep["dense_bytes"] // WORLD,
            json.dumps(rep),
        )
        check(
            f"step {i}: encode + comm + decode + overhead = held <= the backward pass ({backward_s:.4f} s)",
            abs(parts - rep["held_s"]) < 1e-9 and rep["overhead_s"] >= 0 and 0 < rep["held_s"] <= backward_s,
            json.dumps(rep),
        )
        # warm-up: the whole buffer goes dense; then the compressed groups send fewer bytes than raw
        sent = rep["payload_bytes"] + (0 if warm else rep["dense_bytes"])
        check(f"step {i}: bytes sent", sent == raw if warm else sent < raw, json.dumps(rep))
    total = state.step_report()
    check("five steps counted", total["steps"] == 5 and total["total"]["raw_bytes"] == 5 * raw, json.dumps(total))
    # gcodec.torch.all_reduce's two states, in the same shape (report_checks)
    for end_each in (True, False):
        ts = gcodec.torch.TransportState({"id": "uniform", "bits": 4}, mode="gather")

        def by_state(k: str, x: np.ndarray, ts=ts) -> None:  # type: ignore[no-untyped-def]
            gcodec.torch.all_reduce(torch.from_numpy(x), ts.codec, key=k, state=ts, mode="gather")

        bad = check_rounds(RANK, WORLD, by_state, ts, end_each, dense=0)
        check(f"all_reduce: a TransportState's step report adds up (end_step: {end_each})", not bad, "; ".join(bad))
        router = gcodec.torch.Router({"b": None}, codec={"id": "uniform", "bits": 4}, mode="gather")

        def by_router(k: str, x: np.ndarray, router=router) -> None:  # type: ignore[no-untyped-def]
            gcodec.torch.all_reduce(torch.from_numpy(x), None, key=k, state=router)

        bad = check_rounds(RANK, WORLD, by_router, router, end_each, dense=4 * N_B)
        check(
            f"all_reduce: a Router's step report adds up, dense key included (end_step: {end_each})",
            not bad,
            "; ".join(bad),
        )


def scenario_all_reduce(outdir: Path) -> None:
    xs = [torch.from_numpy(np.random.default_rng(r).standard_normal(5000).astype(np.float32)) for r in range(WORLD)]
    mean = torch.stack(xs).mean(0)
    for cfg, tol in ((("fp16"), 2e-3), ("bf16", 2e-2), ({"id": "uniform", "bits": 8}, 5e-2), ("powersgd", None)):
        t = xs[RANK].clone()
        if cfg == "powersgd":
            t = t.reshape(50, 100)
            gcodec.torch.all_reduce(t, cfg, key="p")
            rel = float(torch.linalg.norm(t - mean.reshape(50, 100)) / torch.linalg.norm(mean))
            check("all_reduce powersgd: projection bound", 0 < rel <= 1.0 + 1e-5, str(rel))
            continue
        gcodec.torch.all_reduce(t, cfg, key=str(cfg))
        err = float((t - mean).abs().max())
        check(f"all_reduce {cfg}: close to the mean", err < tol * float(xs[RANK].abs().max() + 1), str(err))
    t = xs[RANK].to(torch.bfloat16)
    w = gcodec.torch.all_reduce(t, "fp16", op="sum", async_op=True, key="bf")
    assert w is not None
    w.wait()
    err = float((t.float() - torch.stack(xs).sum(0)).abs().max())
    check("all_reduce async, bf16 tensor, op=sum", t.dtype == torch.bfloat16 and err < 0.1, str(err))


def scenario_checkpoint(outdir: Path) -> None:
    """Save hook state, model and optimizer at step 5; resume in a fresh DDP from torch.load(weights_only=True)."""
    for cfg in ({"id": "topk", "ratio": 0.05}, {"id": "powersgd", "rank": 2}):

        def make(model_state=None, opt_state=None, hook_state=None, cfg=cfg):  # type: ignore[no-untyped-def]
            model, x, y = model_and_data()
            if model_state is not None:
                model.load_state_dict(model_state)
            ddp = DDP(model, bucket_cap_mb=25)
            st = gcodec.torch.HookState(codec=cfg, start_iter=2, min_numel=64)
            if hook_state is not None:
                st.load_state_dict(hook_state)
            ddp.register_comm_hook(st, gcodec.torch.comm_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
            if opt_state is not None:
                opt.load_state_dict(opt_state)
            return ddp, model, opt, st, x, y

        def steps(ddp, model, opt, x, y, n):  # type: ignore[no-untyped-def]
            for _ in range(n):
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

        ddp, model, opt, st, x, y = make()
        steps(ddp, model, opt, x, y, 5)
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": st.state_dict()}, buf)
        pickled = pickle.dumps(st)
        want = steps(ddp, model, opt, x, y, 5)
        buf.seek(0)
        saved = torch.load(buf, weights_only=True)
        ddp2, model2, opt2, _, x, y = make(saved["model"], saved["opt"], saved["hook"])
        got = steps(ddp2, model2, opt2, x, y, 5)
        check(f"checkpoint {cfg['id']}: resumes bit-identically", torch.equal(want, got))
        unpickled = pickle.loads(pickled)
        check(
            f"checkpoint {cfg['id']}: HookState pickles without its process group",
            unpickled.process_group is None and unpickled.iter == 5 and unpickled.stats() == {},
        )
        ddp3, model3, opt3, _, x, y = make(saved["model"], saved["opt"])
        got3 = steps(ddp3, model3, opt3, x, y, 5)
        check(f"checkpoint {cfg['id']}: the restored residuals matter", not torch.equal(want, got3))


def _local_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[np.ndarray]:
    """Every rank's plain (un-averaged) gradients of ``model``, all-gathered: [rank][param]."""
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    mine = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
    every = [torch.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(every, mine)
    return [e.numpy() for e in every]


class _Collectives:
    """Counts the torch.distributed collectives started while installed (from any thread)."""

    NAMES = ("all_reduce", "all_gather", "all_to_all_single")

    def __init__(self) -> None:
        self.calls = dict.fromkeys(self.NAMES, 0)
        self._orig = {n: getattr(dist, n) for n in self.NAMES}

    def __enter__(self) -> _Collectives:
        for n, f in self._orig.items():

            def counting(*a, _f=f, _n=n, **k):  # type: ignore[no-untyped-def]
                self.calls[_n] += 1
                return _f(*a, **k)

            setattr(dist, n, counting)
        return self

    def __exit__(self, *exc: object) -> None:
        for n, f in self._orig.items():
            setattr(dist, n, f)


# The collectives of one steady bucket whose dense biases ride with a uniform group: the size
# exchange (which is the BEGIN), the payloads (two-phase: an all-to-all, a second size exchange and
# the owners' all-gather), the error agreement, and the riders' one allreduce beside the payloads.
_RIDER_ROUNDS = {"gather": {"all_reduce": 1, "all_gather": 3, "all_to_all_single": 0},
                 "two_phase": {"all_reduce": 1, "all_gather": 4, "all_to_all_single": 1}}  # fmt: skip


def scenario_riders(outdir: Path) -> None:
    """Dense tensors ride in the collectives of the bucket's first group, whatever its protocol
    (fp16's summable sum, PowerSGD's P allreduce, beside the payloads of gather and two-phase, and
    of PowerSGD gathered, which sends each matrix in its own shape as a group of its own); the
    averaged gradients must be exactly what the arithmetic says, for a group that lies back to back
    in the bucket (biases only at its end) and for one interleaved with dense biases. (Riders that
    go through the engine's float32 allreduce, all but fp16's: exact for 2 ranks, within p - 1
    roundings beyond.) Beside gather and two-phase payloads they cost no collective of their own,
    and the bucket sends no BEGIN of its own: the size exchange is it."""
    uniform = {"id": "uniform", "bits": 8}
    for interleaved in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 96, bias=interleaved), torch.nn.Tanh(), torch.nn.Linear(96, 8))
        g = torch.Generator().manual_seed(100 + RANK)
        x, y = torch.randn(64, 32, generator=g), torch.randn(64, 8, generator=g)
        ref = pickle.loads(pickle.dumps(model))
        every = _local_grads(ref, x, y)
        shapes = [tuple(q.shape) for q in model.parameters()]
        sizes = [int(np.prod(s)) for s in shapes]
        dense = [n < 200 for n in sizes]  # biases (96, 8) stay dense with min_numel=200
        where = f"{'interleaved' if interleaved else 'back to back'}"
        psgd = {"id": "powersgd", "rank": 2}
        configs = [("fp16", "auto"), (psgd, "auto"), (uniform, "gather"), (uniform, "two_phase"), (psgd, "gather")]
        for cfg, mode in configs:
            m = pickle.loads(pickle.dumps(model))
            ddp = DDP(m, bucket_cap_mb=25)
            st = gcodec.torch.HookState(
                codec=cfg, start_iter=0, min_numel=200, error_feedback=False, module=m, mode=mode
            )
            ddp.register_comm_hook(st, gcodec.torch.comm_hook)
            for it in range(4):  # the first step, the one after DDP's bucket rebuild, two steady ones
                ddp.zero_grad()
                with _Collectives() as counted:
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
                    gcodec.torch.synchronize()
                got = torch.cat([q.grad.reshape(-1) for q in m.parameters()]).numpy()
                pos, dense_ok, comp_ok, detail = 0, True, True, ""
                for n, d in zip(sizes, dense):
                    parts = [e[pos : pos + n] for e in every]
                    mean = np.float32(0)
                    for q in parts:  # float32, in rank order, then the mean: the dense path's arithmetic
                        mean = mean + q
                    mean = mean * np.float32(1.0 / WORLD)
                    if d and (cfg == "fp16" or WORLD == 2):  # gcodec's own sum, or the engine's of 2 terms
                        dense_ok &= bool(np.array_equal(got[pos : pos + n], mean))
                    elif d:  # the engine's allreduce of p > 2 adds in its own order: p - 1 roundings
                        bound = (WORLD + 1) * np.finfo(np.float32).eps * sum(np.abs(q) for q in parts) / WORLD
                        dense_ok &= bool((np.abs(got[pos : pos + n] - mean) <= bound).all())
                    elif cfg == "fp16":
                        acc = np.zeros(n, np.float32)
                        for q in parts:  # each rank's x / p rounded to binary16, summed in float32, rounded once
                            acc += (q * np.float32(1.0 / WORLD)).astype(np.float16).astype(np.float32)
                        want = acc.astype(np.float16).astype(np.float32)
                        comp_ok &= bool(np.array_equal(got[pos : pos + n], want))
                    elif cfg is uniform:
                        # 8-bit nearest rounding moves an element by at most half a step of its
                        # group, range / 255 / 2 <= max|x| / 255 for each rank's encode, averaged
                        # over the ranks; two-phase re-encodes the mean once more (max|mean| / 255)
                        bound = sum(float(np.abs(q).max()) for q in parts) / (255 * WORLD)
                        bound += float(np.abs(mean).max()) / 255 + 1e-6
                        err = float(np.abs(got[pos : pos + n] - mean).max())
                        comp_ok &= err <= bound
                        detail = f"max error {err:.3g}, bound {bound:.3g}"
                    else:
                        # PowerSGD: a projection of the mean, so never farther from it than the
                        # mean's norm; gathered (each rank's matrix projected, in its own shape,
                        # then averaged): never farther than the average of the ranks' norms
                        err = float(np.linalg.norm(got[pos : pos + n] - mean) / np.linalg.norm(mean))
                        most = 1.0
                        if mode == "gather":
                            most = sum(float(np.linalg.norm(q)) for q in parts) / WORLD / float(np.linalg.norm(mean))
                        comp_ok &= 0 < err <= most + 1e-5 and bool(np.isfinite(got[pos : pos + n]).all())
                        detail = f"relative error {err:.3f}, at most {most:.3f}"
                    pos += n
                name = (cfg if isinstance(cfg, str) else cfg["id"]) + ("" if mode == "auto" else f" {mode}")
                check(f"riders {name} {where} step {it}: dense tensors are the exact float32 mean", dense_ok)
                check(f"riders {name} {where} step {it}: compressed tensors as the codec's arithmetic", comp_ok, detail)
                if it == 3 and cfg is uniform:  # one group: one exchange's collectives
                    want = _RIDER_ROUNDS[mode]
                    check(f"riders {name} {where}: the steady bucket's collectives", counted.calls == want,
                          f"{counted.calls} != {want}")  # fmt: skip


def scenario_shaped(outdir: Path) -> None:
    """A codec that reads shapes (the 2-D DCT, 4 x 4 tiles) compresses each weight of a bucket in
    that weight's shape: the hook's mean is the mean of every rank's decode of its gradient in its
    shape (float32 sums: within a few roundings), and far from what the flattened gradients would
    decode to. At 3 ranks auto mode keeps gather (two-phase chunks are flat)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Tanh(), torch.nn.Linear(48, 16))
    g = torch.Generator().manual_seed(100 + RANK)
    x, y = torch.randn(64, 32, generator=g), torch.randn(64, 16, generator=g)
    every = _local_grads(pickle.loads(pickle.dumps(model)), x, y)
    cfg = {"id": "dct", "dims": 2, "chunk": 16, "k": 3}
    codec = gcodec.get_codec(cfg)
    m = pickle.loads(pickle.dumps(model))
    ddp = DDP(m, bucket_cap_mb=25)
    st = gcodec.torch.HookState(codec=cfg, start_iter=0, min_numel=200, error_feedback=False, module=m)
    ddp.register_comm_hook(st, gcodec.torch.comm_hook)
    for it in range(2):  # the first step and one after DDP's bucket rebuild
        ddp.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        pos = 0
        for q in m.parameters():
            n, shape = q.numel(), tuple(q.shape)
            if n >= 200:
                parts = [e[pos : pos + n] for e in every]
                shaped = sum(gcodec.decode(codec.encode(v.reshape(shape))).reshape(-1) for v in parts) / WORLD
                flat = sum(gcodec.decode(codec.encode(v)) for v in parts) / WORLD
                got = q.grad.reshape(-1).numpy()
                scale = float(np.abs(shaped).max())
                near = float(np.abs(got - shaped).max()) <= 8 * np.finfo(np.float32).eps * scale
                far = float(np.abs(got - flat).max()) > 0.01 * scale
                check(f"shaped dct step {it} {shape}: the mean of decodes in the tensor's shape", near and far)
            pos += n


def scenario_mismatch(outdir: Path) -> None:
    model, x, y = model_and_data()
    ddp = DDP(model)
    codec = {"id": "uniform", "bits": 4 if RANK == 1 else 8}
    ddp.register_comm_hook(gcodec.torch.HookState(codec=codec, start_iter=0, min_numel=64), gcodec.torch.comm_hook)
    try:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        check("mismatched codecs raise", False, "no error")
    except Exception as e:  # DDP re-raises the future's error from backward
        check("mismatched codecs raise a ConfigError naming the field", "disagree on codec" in str(e), str(e)[:300])


def scenario_corrupt(outdir: Path) -> None:
    model, x, y = model_and_data()
    ddp = DDP(model)
    st = gcodec.torch.HookState(codec={"id": "topk", "ratio": 0.1}, start_iter=0, min_numel=64, mode="two_phase")
    ddp.register_comm_hook(st, gcodec.torch.comm_hook)
    torch.nn.functional.mse_loss(ddp(x), y).backward()  # a clean step (and the handshake)
    if RANK == 1:
        base = st.comm()

        class Corrupting(type(base)):  # type: ignore[misc]
            def alltoallv(self, bufs, recv_counts):  # type: ignore[no-untyped-def]
                bufs = [b.copy() for b in bufs]
                for b in bufs:
                    if b.shape[0] > 100:
                        b[-20] ^= 0x5A
                return super().alltoallv(bufs, recv_counts)

        st._comm = Corrupting(base.group)  # the group the hook's exchanges run on
        st._comm._control_seq = base._control_seq  # type: ignore[attr-defined]  # the group's control messages so far
    try:
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        check("corrupt payload raises", False, "no error")
    except Exception as e:
        check(
            "corrupt payload raises a ChecksumError on every rank",
            "ChecksumError" in repr(e) or "CRC" in str(e),
            str(e)[:300],
        )


#: What gloo says when a peer's process is gone: its TCP pair closed or reset, or the collective
#: timed out waiting for it.
LOST_PEER = re.compile(r"(?i)connection (closed|reset)|closed by peer|broken pipe|timed out|timeout")


def scenario_kill(outdir: Path) -> None:
    model, x, y = model_and_data()
    ddp = DDP(model)
    ddp.register_comm_hook(gcodec.torch.HookState(codec="uniform", start_iter=0, min_numel=64), gcodec.torch.comm_hook)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    if RANK == 1:
        os._exit(3)
    try:
        for _ in range(3):
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        check("survivor raised", False, "no error")
    except Exception as e:
        # the engine's own error for a lost peer (DDP re-raises the hook's as a RuntimeError with
        # its text), not any exception: a bug in the hook would raise too, and must fail here
        check(
            "survivor raised the engine's lost-peer error instead of hanging",
            isinstance(e, RuntimeError) and bool(LOST_PEER.search(str(e))),
            f"{type(e).__name__}: {str(e)[:300]}",
        )


def main() -> None:
    global RANK, WORLD
    scenario, outdir = sys.argv[1], Path(sys.argv[2])
    RANK, WORLD, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start_gloo(RANK, WORLD, port, 20)
    run_checked(lambda: globals()[f"scenario_{scenario}"](outdir), CHECKS, outdir, RANK)
    finish_gloo(destroy=scenario != "kill")  # a group with a dead peer cannot be torn down cleanly


if __name__ == "__main__":
    main()
