"""One torchft replica group (of one process) training a small MLP with torchft's DiLoCo, its
pseudo-gradients through gcodec's compressed allreduce (``gcodec.torch.torchft.Manager``).

Run by tests/test_torchft.py, which starts torchft's lighthouse, several replicas, and kills,
stops or restarts them. Usage::

    python -m tests.transport_ranks.torchft_replica OUTDIR INDEX LIGHTHOUSE CODEC TIMEOUT_S [LIFE [STOP_AT [ALGO]]]

The replica trains until torchft's step (committed outer steps) reaches the number in
``OUTDIR/target`` (written by the test; none yet: keep going), then writes
``OUTDIR/replica<INDEX>_<LIFE>.json``: the SHA-256 of the global parameters (torchft's DiLoCo's
backup of them) and of the model, torchft's step, the world size of each committed step, gcodec's
re-plans, rolled-back steps and figures. ``OUTDIR/progress<INDEX>`` holds its latest step and world
size, rewritten after every outer step, for the test to act on. CODEC is a JSON codec config or
``null`` (uncompressed). STOP_AT >= 0: the replica stops itself (SIGSTOP) right after it started
its first exchange of that outer step, so that its peers are inside an exchange with a stopped
process. ALGO: ``diloco`` (the default), ``streaming`` (torchft's Streaming DiLoCo, the two linear layers
as two fragments synced in turn), ``localsgd`` (torchft's LocalSGD, parameters averaged
every 4 steps) or ``ddp`` (torchft's DistributedDataParallel and OptimizerWrapper: gradients
averaged every step).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path


def _write(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)  # the test never reads half a file


def _digest(tensors: list) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(
    outdir: Path, index: int, lighthouse: str, codec: object, timeout_s: float, life: int, stop_at: int, algo: str
) -> None:
    import torch
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo, LocalSGD
    from torchft.optim import OptimizerWrapper

    from gcodec.torch.torchft import Manager

    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model everywhere (torchft also syncs it at step 0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=timeout_s)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        min_replica_size=2,
        replica_id=f"replica{index}",
        lighthouse_addr=lighthouse,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        hostname="localhost",
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=datetime.timedelta(seconds=120),
        connect_timeout=datetime.timedelta(seconds=30),
        codec=codec,
        error_feedback=True,
        fragments=2 if algo == "streaming" else 1,  # the key of a call names the fragment synced
    )
    if stop_at >= 0:
        compressed = manager.allreduce

        def allreduce(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
            work = compressed(tensor, *args, **kwargs)
            if manager.current_step() == stop_at:
                os.kill(os.getpid(), signal.SIGSTOP)  # the exchange has started: stop inside it
            return work

        manager.allreduce = allreduce  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(1000 * index + life)  # each replica (and life) its own data
    w_true = torch.randn(32, 8, generator=torch.Generator().manual_seed(7)) / 4
    target_file = outdir / "target"
    committed: list[dict] = []
    started = time.time()
    if algo == "diloco":
        engine = DiLoCo(manager, [model], inner, outer, sync_every=4)
        net, opt = model, inner
    elif algo == "streaming":  # two fragments (the two linear layers), synced in turn
        # an outer optimizer per fragment (one over the whole model would step the other fragment
        # with its local gradients, which differ between replicas)
        outers = [torch.optim.SGD(m.parameters(), lr=0.7, momentum=0.9, nesterov=True) for m in (model[0], model[2])]
        engine = DiLoCo(manager, [model[0], model[2]], inner, outers, sync_every=4)
        net, opt = model, inner
    elif algo == "localsgd":
        engine = LocalSGD(manager, model, inner, sync_every=4)
        net, opt = model, inner
    else:  # torchft's DDP: every bucket's gradient through the manager's allreduce, every step
        engine = contextlib.nullcontext()
        net, opt = DistributedDataParallel(manager, model), OptimizerWrapper(manager, inner)
    with engine:
        last = manager.current_step()
        while True:
            target = int(target_file.read_text()) if target_file.exists() else 1 << 30
            if manager.current_step() >= target:
                break
            x = torch.randn(32, 32, generator=gen)
            y = torch.tanh(x @ w_true)
            opt.zero_grad()  # DDP: torchft's quorum
            torch.nn.functional.mse_loss(net(x), y).backward()  # DDP: the compressed exchanges
            opt.step()  # DiLoCo, LocalSGD: every 4th, the quorum and the exchanges; all: the commit vote
            time.sleep(0.01)  # a paced loop: the test's own processes share the machine's cores
            step = manager.current_step()
            if step != last:
                world = manager.replans[-1]["world_size"] if manager.replans else 0
                committed.append({"step": step, "world": world, "t": time.time() - started})
                _write(outdir / f"progress{index}", {"step": step, "world": world, "pid": os.getpid()})
                last = step
        # DiLoCo's global parameters are its backup copy; LocalSGD and DDP hold the same in the model
        glob = (
            [t for f in engine._fragments for t in f.original_parameters.values()]
            if algo in ("diloco", "streaming")
            else list(model.parameters())
        )
        result = {
            "index": index,
            "life": life,
            "algo": algo,
            "step": manager.current_step(),
            "global": _digest(glob),
            "model": _digest(list(model.parameters())),
            "committed": committed,
            "replans": manager.replans,
            "rollbacks": manager.rollbacks,
            "stats": manager.gcodec_stats(),
            "router": {k: v.get("codec") for k, v in manager.router.stats().items()},
        }
    _write(outdir / f"replica{index}_{life}.json", result)
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)  # torchft's threads (quorum, checkpoint server) need not be joined


if __name__ == "__main__":
    a = sys.argv[1:]
    life, stop_at = (int(a[5]) if len(a) > 5 else 0), (int(a[6]) if len(a) > 6 else -1)
    main(Path(a[0]), int(a[1]), a[2], json.loads(a[3]), float(a[4]), life, stop_at, a[7] if len(a) > 7 else "diloco")
