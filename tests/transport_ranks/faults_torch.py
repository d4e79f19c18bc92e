"""One gloo rank: ``python -m tests.transport_ranks.faults_torch SCENARIO OUTDIR [ARGS] RANK WORLD PORT``.

gcodec.torch with faults on purpose (tests/transport_ranks/faults.py). Writes ``OUTDIR/rank<r>.json``.
The process group starts with start_gloo's generous timeout (a peer slowed down by a loaded machine
is not a dead one); the exchange in which a rank dies runs with the group's timeout set to 15 s,
after a barrier, so that only the kill can run into it.

* ``kill PROTOCOL N``: rank 1 dies before collective N of the second exchange; the survivor must
  raise within the 15 s timeout. PROTOCOL is one of faults.PROTOCOLS (through ``all_reduce``), or
  ``fsdp-values`` / ``fsdp-payloads`` (FSDP2's reduce-scatter, fp16 / uniform) or ``all-gather``
  (the quantized parameter all-gather);
* ``stop``: rank 0 stops rank 1 for 3 s during 40 exchanges per protocol; every result exact;
* ``corrupt``: DDP training with the hook; at step 5 rank 1 flips a byte of what it sends; every
  rank's ``backward()`` raises at that step, and the parameters agree on every rank before it;
* ``soak N``: N DDP-hook steps; memory, threads and file descriptors must stay flat.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec
import gcodec.torch
import gcodec.torch.comm as tcomm

from ..procs import finish_gloo, run_checked, start_gloo
from .faults import PROTOCOLS, corrupting, dying, exact_inputs, soak, stopped_run, stopper

CHECKS: list[dict] = []
RANK = WORLD = 0
TIMEOUT = 15.0


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def all_reduce(proto: str, x: np.ndarray, key: str) -> np.ndarray:
    codec, mode, _ = PROTOCOLS[proto]
    t = torch.from_numpy(x.copy())
    gcodec.torch.all_reduce(t, codec, key=key, mode=mode)
    return t.numpy()


def _fsdp_call(proto: str, step: int) -> None:
    st = _FSDP.setdefault(proto, gcodec.torch.FSDPState("fp16", start_iter=0, min_numel=64, error_feedback=False))
    if proto == "all-gather":
        st.all_gather = gcodec.get_codec({"id": "uniform", "bits": 8})
        ag = gcodec.torch.QuantizedAllGather(st, name="ag")
        x = torch.from_numpy(exact_inputs(RANK, step).reshape(-1))
        ag(torch.empty(WORLD * x.numel()), x, None)
        return
    cfg = {"id": "fp16"} if proto == "fsdp-values" else {"id": "uniform", "bits": 8}
    st.configure(policy={"*": cfg})  # the flat layout without an FSDP module is 1-D: compressed when named
    rs = gcodec.torch.ReduceScatter(st, None, name=proto)
    x = torch.from_numpy(np.concatenate([exact_inputs(RANK, step).reshape(-1)] * WORLD))
    rs(torch.empty(x.numel() // WORLD), x, None, dist.ReduceOp.AVG)


_FSDP: dict[str, Any] = {}


def scenario_kill(proto: str, target: str) -> None:
    comm = dying(tcomm.TorchCommunicator, int(target))(None)
    tcomm._comms[0] = (None, comm)  # the default group's one communicator (on the group itself)

    def exchange(step: int) -> None:
        if proto in PROTOCOLS:
            all_reduce(proto, exact_inputs(RANK, step), "k")
        else:
            _fsdp_call(proto, step)

    exchange(0)  # agreement and one clean exchange
    dist.barrier()  # both ranks are here: from now on only the kill can keep a collective waiting
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=TIMEOUT))
    if RANK == 1:
        comm.arm()
    t0 = time.monotonic()
    try:
        exchange(1)
        check("the survivor raised", False, "returned a result")
    except Exception as e:
        took = time.monotonic() - t0
        check(
            f"kill {proto} #{target}: the survivor raises within the timeout",
            took < TIMEOUT + 10,
            f"{took:.1f} s: {type(e).__name__}: {str(e)[:200]}",
        )


def scenario_stop() -> None:
    pids = [0] * WORLD
    dist.all_gather_object(pids, os.getpid())
    for proto in PROTOCOLS:
        dist.barrier()
        bad, ys, took = stopped_run(RANK, pids, proto, lambda x, key, proto=proto: all_reduce(proto, x, key))
        first = [torch.from_numpy(y) for y in ys]
        for t in first:
            dist.broadcast(t, 0)
        same = all(np.array_equal(a, b.numpy()) for a, b in zip(ys, first))
        check(
            f"stop {proto}: 40 results exact (or in bound) through a 3 s SIGSTOP", not bad and same, "; ".join(bad[:3])
        )
        check(f"stop {proto}: the stop was inside the loop", took >= 3.0 or RANK == 1, f"{took:.1f} s")
    # wait(timeout=) on an async all-reduce whose peer is stopped raises at its timeout, and the
    # exchange, not cancelled, ends with the right result once the peer goes on
    import datetime

    dist.barrier()
    if RANK == 0:
        stopper(pids[1], after=0.0, hold=3.0)
    x = torch.full((4096,), float(RANK + 1))
    work = gcodec.torch.all_reduce(x, "fp16", op="sum", async_op=True, key="stop-wait")
    t0 = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=1))
        raised = "no error"
    except gcodec.WaitTimeoutError as e:
        raised = f"{time.monotonic() - t0:.2f} s: {e}"
    if RANK == 0:
        check("stop: wait(timeout=1 s) raises WaitTimeoutError at its timeout", raised[:1].isdigit(), raised)
        check(
            "stop: ... within 1-2.5 s",
            1.0 <= float(raised.split(" ")[0]) < 2.5 if raised[:1].isdigit() else False,
            raised,
        )
    work.wait()
    check("stop: the exchange ends with the exact sum after the timeout", bool((x == WORLD * (WORLD + 1) / 2).all()))


def _mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    g = torch.Generator().manual_seed(100 + RANK)
    x = torch.randn(64, 32, generator=g)
    return model, x, torch.tanh(x[:, :8])


def scenario_corrupt() -> None:
    model, x, y = _mlp()
    ddp = DDP(model)
    st = gcodec.torch.HookState(codec={"id": "uniform", "bits": 8}, start_iter=2, min_numel=64)
    ddp.register_comm_hook(st, gcodec.torch.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    base = st.comm()

    comm = corrupting(type(base))(base.group) if RANK == 1 else base  # the hook's own group
    comm._control_seq = getattr(base, "_control_seq", 0)  # type: ignore[attr-defined]
    st._comm = comm
    failed_at, agreed = None, True
    for step in range(10):
        comm.armed = step == 5  # type: ignore[attr-defined]
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        except RuntimeError as e:
            # DDP hands the hook's error over as a RuntimeError with its message only: the message
            # names the class, and the hook state keeps the error itself
            failed_at = (step, "gcodec.ChecksumError: " in str(e), str(e)[:200])
            check(
                "corrupt: the hook state keeps the error, a ChecksumError on every rank",
                isinstance(st.last_error, gcodec.ChecksumError) and str(st.last_error) in str(e),
                repr(st.last_error)[:300],
            )
            break
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(WORLD)]
        dist.all_gather(everyone, flat)
        agreed = agreed and all(torch.equal(e, flat) for e in everyone)
    check(
        "corrupt: every rank's backward raises the ChecksumError at step 5",
        failed_at is not None and failed_at[:2] == (5, True),
        str(failed_at),
    )
    check("corrupt: the parameters agree on every rank before it", agreed)


def scenario_soak(n: str) -> None:
    steps = int(n)
    model, x, y = _mlp()
    ddp = DDP(model)
    st = gcodec.torch.HookState(codec={"id": "uniform", "bits": 8}, start_iter=2, min_numel=64)
    ddp.register_comm_hook(st, gcodec.torch.comm_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    soak(steps, step, f"{steps} DDP-hook steps", check)


def main() -> None:
    global RANK, WORLD
    scenario, outdir, *args = sys.argv[1:-3]
    RANK, WORLD, port = (int(a) for a in sys.argv[-3:])
    start_gloo(RANK, WORLD, port, TIMEOUT)
    run_checked(lambda: globals()[f"scenario_{scenario}"](*args), CHECKS, Path(outdir), RANK)
    finish_gloo(destroy=scenario != "kill")  # a group with a dead peer cannot be torn down cleanly


if __name__ == "__main__":
    main()
