"""One gloo rank of an FSDP2 job: ``python -m tests.transport_ranks.fsdp_program SCENARIO OUTDIR RANK WORLD PORT``.

Writes ``OUTDIR/rank<r>.json`` (a list of checks) and, on rank 0, ``OUTDIR/runs.json`` (loss
curves and final parameters of each training run) that tests/test_fsdp.py compares.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gcodec
import gcodec.torch
import gcodec.transports.reduce_scatter as rs_mod
from gcodec.transports.protocol_helpers import gather_stream

from ..procs import finish_gloo, run_checked, start_gloo

CHECKS: list[dict] = []
RANK = WORLD = 0
MESH: Any = None


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def build(seed_data: int = 100) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP (each Linear its own FSDP module), on a fixed teacher problem; data per rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128), torch.nn.Tanh(), torch.nn.Linear(128, 8)
    )
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=MESH)
    fully_shard(model, mesh=MESH)
    g = torch.Generator().manual_seed(seed_data + RANK)
    x = torch.randn(64, 32, generator=g)
    teacher = torch.randn(32, 8, generator=torch.Generator().manual_seed(5))
    return model, x, torch.tanh(x @ teacher)


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, state: Any = None) -> list[float]:
    """SGD steps; with ``state`` (an FSDPState), each step's report is checked against the step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        t0 = time.perf_counter()
        loss.backward()  # FSDP2 runs every module's reduce-scatter in here (gloo: synchronously)
        backward_s = time.perf_counter() - t0
        if state is not None:
            report_check(state, i, backward_s)
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(float(t) / WORLD)
    return losses


def report_check(state: Any, i: int, backward_s: float) -> None:
    """The step report of step i: this step's, every module's whole input, parts that add up to
    the time held, no more than the backward pass; dense columns (the biases) once compression
    started, their reduce-scatter share on the wire."""
    rep = state.step_report()["last"]
    raw = sum(4 * WORLD * -(-q.shape[0] // WORLD) * (q[0].numel() if q.dim() > 1 else 1) for q in PARAMS)
    parts = rep["encode_s"] + rep["comm_s"] + rep["decode_s"] + rep["overhead_s"]
    dense = i >= state.start_iter
    ok = (
        rep["step"] == i
        and rep["raw_bytes"] == raw
        and abs(parts - rep["held_s"]) < 1e-9
        and rep["overhead_s"] >= 0
        and 0 < rep["held_s"] <= backward_s
        and (rep["dense_bytes"] > 0) == dense
        and rep["dense_wire_bytes"] == (WORLD - 1) * rep["dense_bytes"] // WORLD
    )
    check(f"step report {i}: this step's, adds up, within the backward pass ({backward_s:.4f} s)", ok, json.dumps(rep))


#: the model's parameter shapes (as FSDP pads them: each dim 0 split over the ranks), set by build()
PARAMS: list[torch.Tensor] = []

# name: (codec, warm-up steps); top-k 1 % gets the recommended 10 uncompressed steps first
RUNS: dict[str, tuple[Any, int]] = {
    "none": (None, 0),
    "fp16": ("fp16", 2),
    "topk": ({"id": "topk", "ratio": 0.01}, 10),
    "uniform4": ({"id": "uniform", "bits": 4}, 2),
    "ag8": ({"id": "uniform", "bits": 4}, 2),  # and the compressed all-gather AG
}
STEPS = 40
#: ZeRO++ qwZ-style parameter all-gather of the "ag8" run (uniform 4-bit reduce-scatter besides)
AG = {"id": "uniform", "bits": 8, "group_size": 128}


def reference_check() -> None:
    """Direct calls of ReduceScatter against a one-process computation of the same arithmetic."""
    from gcodec.torch.fsdp import ReduceScatter

    p, n = WORLD, 4096
    for codec, op, dtype in [
        ({"id": "uniform", "bits": 4}, dist.ReduceOp.AVG, torch.float32),
        ({"id": "topk", "ratio": 0.01}, dist.ReduceOp.SUM, torch.float32),
        ({"id": "topk", "ratio": 0.05}, dist.ReduceOp.PREMUL_SUM(0.25), torch.bfloat16),
        ("fp16", dist.ReduceOp.AVG, torch.float32),  # fp16 and bf16: the values path (no size exchange)
        ("bf16", dist.ReduceOp.SUM, torch.bfloat16),
        ("fp16", dist.ReduceOp.PREMUL_SUM(0.25), torch.bfloat16),
    ]:
        comm = ReduceScatter(codec, name="ref")
        efs = [gcodec.ErrorFeedback(codec) for _ in range(p)]
        scale = {"AVG": 1.0 / p, "SUM": 1.0}.get(str(op).split(".")[-1], 0.25)
        ok, detail = True, ""
        for step in range(3):  # three steps: the residuals matter from the second on
            inputs = [
                torch.randn(p * n, generator=torch.Generator().manual_seed(1000 * step + r)).to(dtype) for r in range(p)
            ]
            out = torch.empty(n, dtype=dtype)
            work = comm(out, inputs[RANK].clone(), None, op, async_op=(step == 1))
            if work is not None:
                work.wait()
            acc = np.zeros(n, np.float32)
            for r in range(p):
                row = gcodec.torch.to_numpy(inputs[r]).reshape(p, n)[RANK]
                pay = efs[r].encode(
                    np.ascontiguousarray(row), f"ref:x[{RANK}/{p}]", step=gather_stream(step, r, RANK, p)
                )
                gcodec.decode(pay, out=acc, accumulate=True)
            acc *= np.float32(scale)
            ref = torch.from_numpy(acc).to(dtype)
            if not torch.equal(out, ref):
                ok, detail = False, f"step {step}: max diff {float((out.float() - ref.float()).abs().max())}"
                break
        check(f"reference arithmetic {codec} {scale} {dtype}", ok, detail)


def _qdq(shard: torch.Tensor, codec: Any) -> torch.Tensor:
    """One process's decode of one rank's encoded shard (float32)."""
    x = gcodec.torch.to_numpy(shard.contiguous())
    out = np.empty(x.size, np.float32)
    gcodec.decode(gcodec.encode(x, codec), out=out)
    return torch.from_numpy(out)


def allgather_reference_check() -> None:
    """Direct calls of QuantizedAllGather (the input a view of the output, as FSDP passes it)
    against a one-process decode of every rank's encoded shard: bit-exact."""
    from gcodec.torch.fsdp import QuantizedAllGather

    p, n = WORLD, 3000  # not a multiple of the group size: a short last group
    for codec, dtype in [(AG, torch.float32), (AG, torch.bfloat16), ({"id": "uniform", "bits": 4}, torch.float32)]:
        comm = QuantizedAllGather(codec, name="agref")
        shards = [torch.randn(n, generator=torch.Generator().manual_seed(7 + r)).to(dtype) * (r + 1) for r in range(p)]
        out = torch.empty(p * n, dtype=dtype)
        inp = out.narrow(0, n * RANK, n)
        inp.copy_(shards[RANK])
        comm(out, inp, None)
        ref = torch.cat([_qdq(s, codec).to(dtype) for s in shards])
        ok = torch.equal(out, ref) and not torch.equal(out, torch.cat(shards))
        check(f"all-gather reference {codec} {dtype}", ok, f"max diff {float((out.float() - ref.float()).abs().max())}")
        v = comm.state.stats()["agref:all_gather"]
        check(
            f"all-gather stats {codec} {dtype}",
            v["raw_bytes"] == shards[0].nbytes
            and 0 < v["payload_bytes"] < v["raw_bytes"]
            and v["wire_bytes"] == v["payload_bytes"] * (p - 1),
            json.dumps(v),
        )


def allgather_model_check() -> None:
    """In an FSDP2 model: forward sees the decode of each rank's encoded shard of the module's
    flat parameters (weight chunk, then bias chunk); the sharded parameters stay exact."""
    model, x, y = build()
    gcodec.torch.compress_fsdp(model, "fp16", all_gather=AG)
    before = {k: v.to_local().detach().clone() for k, v in model.state_dict().items()}
    full = full_params(model)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    lin = [i for i, m in enumerate(model) if isinstance(m, torch.nn.Linear)]
    for i in lin:
        model[i].register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__(
                i, {"weight": m.weight.detach().clone(), "bias": m.bias.detach().clone()}
            )
        )
    torch.nn.functional.mse_loss(model(x), y).backward()
    ok, detail = len(seen) == len(lin), f"hooks saw {sorted(seen)}"
    for i in lin:
        w, b = full[f"{i}.weight"], full[f"{i}.bias"]
        wl, bl = w.numel() // WORLD, b.numel() // WORLD  # 128 and 8 rows: no padding on 2 or 4 ranks
        decoded = [_qdq(torch.cat([w.chunk(WORLD)[r].reshape(-1), b.chunk(WORLD)[r]]), AG) for r in range(WORLD)]
        rw = torch.cat([d[:wl] for d in decoded]).reshape(w.shape)
        rb = torch.cat([d[wl : wl + bl] for d in decoded])
        if i in seen and not (torch.equal(seen[i]["weight"], rw) and torch.equal(seen[i]["bias"], rb)):
            ok, detail = False, f"module {i}: max diff {float((seen[i]['weight'] - rw).abs().max())}"
        if i in seen and torch.equal(seen[i]["weight"], w):
            ok, detail = False, f"module {i}: the gathered weight was not quantized"
    check("forward uses the decoded shards of every rank", ok, detail)
    after = {k: v.to_local().detach() for k, v in model.state_dict().items()}
    check("sharded parameters stay exact", all(torch.equal(before[k], after[k]) for k in before))
    check(
        "gradients reach the shards",
        all(p.grad is not None and torch.isfinite(p.grad.to_local()).all() for p in model.parameters()),
    )


def errors_check() -> None:
    """A corrupt peer payload and a mismatched codec: GcodecError on every rank, no hang."""
    from gcodec.torch.fsdp import ReduceScatter

    comm = ReduceScatter({"id": "uniform", "bits": 8}, name="bad")
    real = rs_mod.encode_into

    def corrupt(*a: Any, **k: Any) -> Any:
        pay = bytearray(real(*a, **k))
        pay[len(pay) // 2] ^= 0x55
        return pay

    if RANK == 1:
        rs_mod.encode_into = corrupt  # type: ignore[assignment]
    try:
        comm(torch.empty(1024), torch.randn(1024 * WORLD), None, dist.ReduceOp.AVG)
        check("corrupt payload raises", False, "no error")
    except gcodec.GcodecError as e:
        check("corrupt payload raises", True, repr(e))
    finally:
        rs_mod.encode_into = real

    # fp16's values path: a failed encode on one rank travels in the final agreement, not the sizes
    def failing(*a: Any, **k: Any) -> Any:
        raise gcodec.PayloadValueError("injected encode failure")

    real_cast = rs_mod._cast_values
    if RANK == 1:
        rs_mod._cast_values = failing  # type: ignore[assignment]
    try:
        ReduceScatter("fp16", name="bad16")(torch.empty(1024), torch.randn(1024 * WORLD), None, dist.ReduceOp.AVG)
        check("failed fp16 encode raises on every rank", False, "no error")
    except gcodec.PayloadValueError as e:
        check("failed fp16 encode raises on every rank", True, repr(e))
    except gcodec.GcodecError as e:
        check("failed fp16 encode raises on every rank", False, f"other class: {e!r}")
    finally:
        rs_mod._cast_values = real_cast
    out = torch.empty(1024)
    # the group still works (a fresh comm: the failed call's residuals would blur the check)
    ReduceScatter({"id": "uniform", "bits": 8}, name="clean")(out, torch.ones(1024 * WORLD), None, dist.ReduceOp.AVG)
    check("clean call after the error", bool(torch.allclose(out, torch.ones(1024), atol=0.01)))

    model, x, y = build()
    gcodec.torch.compress_fsdp(model, {"id": "uniform", "bits": 4 if RANK == 0 else 8}, start_iter=0)
    try:
        torch.nn.functional.mse_loss(model(x), y).backward()
        check("mismatched codec raises from backward", False, "no error")
    except Exception as e:
        ok = isinstance(e, gcodec.ConfigError) or "ConfigError" in str(e)
        check("mismatched codec raises from backward", ok, f"{type(e).__name__}: {str(e)[:300]}")


def scenario_train(outdir: Path) -> None:
    reference_check()
    allgather_reference_check()
    allgather_model_check()
    runs: dict[str, Any] = {}
    for name, (codec, start_iter) in RUNS.items():
        model, x, y = build()
        state = None
        if codec is not None:
            state = gcodec.torch.compress_fsdp(
                model, codec, start_iter=start_iter, all_gather=AG if name == "ag8" else None
            )
            if name == "uniform4":  # off by default: FSDP's own all-gather stays
                from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

                comms = [
                    pg._all_gather_comm
                    for m in model.modules()
                    if hasattr(m, "_get_fsdp_state")
                    for pg in m._get_fsdp_state()._fsdp_param_groups
                ]
                check("all-gather off by default", bool(comms) and all(type(c) is DefaultAllGather for c in comms))
        PARAMS[:] = [torch.empty(tuple(q.shape)) for q in full_params(model).values()] if name == "uniform4" else []
        losses = train(model, x, y, STEPS, state if name == "uniform4" else None)
        params = full_params(model)
        runs[name] = {"losses": losses, "params": torch.cat([v.reshape(-1) for v in params.values()]).tolist()}
        if state is not None:
            runs[name]["stats"] = state.stats()
            if name == "topk":
                torch.save(state.state_dict(), outdir / f"gcodec_rank{RANK}.pt")
                dcp_check(state, outdir)
                if RANK == 0:
                    torch.save(params, outdir / "params.pt")
    errors_check()
    if RANK == 0:
        (outdir / "runs.json").write_text(json.dumps(runs))


def _full(sd: dict) -> dict[str, np.ndarray]:
    """Each parameter's flat residual, whatever ranges the state dict holds."""
    from gcodec.torch.fsdp import _assemble

    shapes = {k: tuple(v) for k, v in sd["shapes"].items()}
    return _assemble(sd["residuals"], shapes)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def dcp_check(state: Any, outdir: Path) -> None:
    """torch.distributed.checkpoint: every rank's residuals saved under keys of its own, and
    loaded back on the same world size exactly."""
    import torch.distributed.checkpoint as dcp

    path = str(outdir / "dcp")
    dcp.save({"step": torch.tensor(40), **state.dcp_state_dict()}, checkpoint_id=path)
    fresh = gcodec.torch.FSDPState({"id": "topk", "ratio": 0.01})
    fresh.load_dcp(path)
    mine = _full(state.state_dict())
    check("dcp keeps every rank's residuals", bool(mine) and _same(mine, _full(fresh.state_dict())))


def scenario_resume(outdir: Path) -> None:
    """Resume the 4-rank top-k job on WORLD ranks with its residuals, re-partitioned."""
    old = sorted(outdir.glob("gcodec_rank*.pt"))
    sds = [torch.load(f, weights_only=True) for f in old]
    new = gcodec.torch.reshard_state_dicts(sds, WORLD)
    via_dcp = gcodec.torch.FSDPState({"id": "topk", "ratio": 0.01})
    via_dcp.load_dcp(str(outdir / "dcp"))  # saved on 4 ranks, loaded on WORLD
    check("dcp checkpoint reshards like reshard_state_dicts", _same(_full(via_dcp.state_dict()), _full(new[RANK])))
    params = torch.load(outdir / "params.pt", weights_only=True)

    def resumed(with_state: bool) -> tuple[torch.nn.Module, Any, torch.Tensor, torch.Tensor]:
        model, x, y = build()
        for k, v in model.state_dict().items():
            v.to_local().copy_(params[k].reshape(-1)[:0] if False else params[k].chunk(WORLD)[RANK])
        state = gcodec.torch.compress_fsdp(model, {"id": "topk", "ratio": 0.01}, start_iter=2)
        if with_state:
            state.load_state_dict(new[RANK])
        return model, state, x, y

    # With zero gradients, what reaches the optimizer is only what the residuals carried over:
    # top-k of the mean of the 4 old ranks' residuals, chunk by chunk.
    model, state, x, y = resumed(True)
    (0.0 * model(x).sum()).backward()
    mean: dict[str, np.ndarray] = {}
    for sd in sds:
        for k, v in sd["residuals"].items():
            fqn, rng = k.split("[")
            a, b = (int(t) for t in rng[:-1].split(":"))
            shape = tuple(sd["shapes"][fqn])
            m = mean.setdefault(fqn, np.zeros(int(np.prod(shape)), np.float32))
            m[a:b] += v.numpy() / len(sds)
    ok, detail, used = True, "", 0
    for fqn, arr in mean.items():
        prm = dict(model.named_parameters())[fqn]
        shape = tuple(prm.shape)
        rowlen = int(np.prod(shape[1:]))
        clen = -(-shape[0] // WORLD) * rowlen
        chunk = np.zeros(clen, np.float32)
        piece = arr[RANK * clen : (RANK + 1) * clen]
        chunk[: piece.shape[0]] = piece
        pay = gcodec.encode(chunk, {"id": "topk", "ratio": 0.01})
        ref = np.zeros(clen, np.float32)
        gcodec.decode(pay, out=ref, accumulate=True)
        ref = ref * np.float32(WORLD) * np.float32(1.0 / WORLD)
        got = prm.grad.to_local().reshape(-1).numpy()
        used += int(np.count_nonzero(got))
        if not np.array_equal(got, ref[: got.shape[0]]):
            ok, detail = False, f"{fqn}: max diff {np.abs(got - ref[: got.shape[0]]).max()}"
    check("resumed residuals reach the gradients exactly", ok and used > 0, f"{detail} nonzero={used}")

    fresh, _, x2, _ = resumed(False)
    (0.0 * fresh(x2).sum()).backward()
    zero = all(float(p.grad.to_local().abs().sum()) == 0 for p in fresh.parameters())
    check("without the residuals the same step sends nothing", zero)

    model, state, x, y = resumed(True)
    losses = train(model, x, y, 10)
    check("training continues after the resume", losses[-1] < losses[0], str(losses))
    if RANK == 0:
        (outdir / f"resume{WORLD}.json").write_text(json.dumps({"losses": losses, "stats": state.stats()}))


def main() -> None:
    global RANK, WORLD, MESH
    scenario, outdir = sys.argv[1], Path(sys.argv[2])
    RANK, WORLD, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start_gloo(RANK, WORLD, port, 30)
    MESH = init_device_mesh("cpu", (WORLD,))
    run_checked(lambda: globals()[f"scenario_{scenario}"](outdir), CHECKS, outdir, RANK)
    dist.barrier()  # no rank tears the group down while a peer still uses it
    finish_gloo()


if __name__ == "__main__":
    main()
