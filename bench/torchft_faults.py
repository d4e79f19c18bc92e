"""torchft's DiLoCo with a replica killed and restarted: float32 (torchft's own allreduce) against
gcodec's 4-bit + error feedback inside it (:mod:`gcodec.torch.torchft`), on the language-model
workload of bench/lowcomm.py (a smaller transformer), three replica groups on 127.0.0.1.

    python bench/torchft_faults.py --json torchft_faults.json
    sudo python bench/torchft_faults.py --rate 100mbit      # every process behind a shaped loopback

For each contender, two runs of the same number of committed outer steps: without a fault, and
with replica 2 killed (SIGKILL) at a random outer step and restarted at once (torchft heals it from
a peer; the two others go on meanwhile). Reported: the global model's validation loss at the end
(every replica's global parameters are compared bit for bit), the bytes each replica encoded per
outer step (gcodec's payload; float32: 4 bytes per parameter), and whether the job finished with
no manual step. torchft's lighthouse runs in a process of its own
(tests/transport_ranks/torchft_lighthouse.py). ``--rate`` runs the lighthouse and the replicas in
bench/link.py's network namespace, its loopback shaped by a token bucket (root and iproute2). Each
job's wall time is reported but compares nothing on a loaded machine, and little where the model's
exchange is small next to its inner steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

U4 = {"id": "uniform", "bits": 4}


def _write(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def replica(a: argparse.Namespace) -> None:
    """One replica group of one process (the ``--replica`` mode)."""
    import datetime

    import torch
    from torch.distributed import TCPStore
    from torchft import Manager as TorchftManager
    from torchft import ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    from gcodec.demo import corpus
    from gcodec.demo.lm_worker import lm_loss, make_model
    from gcodec.demo.runs import LMSettings

    torch.set_num_threads(1)
    out = Path(a.out)
    s = LMSettings(d_model=64, layers=1, heads=2, context=32, batch=8, seed=0)
    data = corpus.load()
    torch.manual_seed(0)
    model = make_model(s)
    inner = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.1)
    outer = torch.optim.SGD(model.parameters(), lr=1.0)  # averaging (docs/lowcomm.md)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=30)
    codec = json.loads(a.codec)
    kw: dict[str, Any] = {} if codec is None else {"codec": codec, "error_feedback": True}
    cls = TorchftManager
    if codec is not None:
        from gcodec.torch.torchft import Manager as cls  # type: ignore[assignment]
    manager = cls(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        min_replica_size=2,
        replica_id=f"replica{a.index}",
        lighthouse_addr=a.lighthouse,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        hostname="localhost",
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=datetime.timedelta(seconds=300),
        **kw,
    )
    val = torch.from_numpy(corpus.val_windows(data.val, 64, s.context))
    n_params = sum(p.numel() for p in model.parameters())
    inner_step = 0
    with DiLoCo(manager, [model], inner, outer, sync_every=a.sync_every, use_bucketization=codec is not None) as dl:
        last = manager.current_step()
        while manager.current_step() < a.outer_steps:
            # each replica (and life) its own batches; the step counter keeps them apart over time
            x = torch.from_numpy(corpus.batch(data.train, s.batch, s.context, 1000 * a.life, inner_step, a.index))
            inner.zero_grad()
            lm_loss(model, x).backward()
            inner.step()
            inner_step += 1
            time.sleep(a.pace)
            if manager.current_step() != last:
                last = manager.current_step()
                _write(out / f"progress{a.index}", {"step": last, "pid": os.getpid()})
        glob = dict(dl._fragments[0].original_parameters)
    evaluator = make_model(s)
    evaluator.load_state_dict(glob)
    with torch.no_grad():
        loss = float(lm_loss(evaluator, val))
    h = hashlib.sha256()
    for t in glob.values():
        h.update(t.numpy().tobytes())
    stats = manager.gcodec_stats() if codec is not None else None
    res = {
        "index": a.index,
        "life": a.life,
        "step": manager.current_step(),
        "val_loss": loss,
        "global": h.hexdigest(),
        "params": n_params,
        "stats": stats,
    }
    _write(out / f"replica{a.index}_{a.life}.json", res)
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)


def _start(args: list[str], log: Path, prefix: list[str]) -> subprocess.Popen:
    """``prefix``: the command that runs a process inside the shaped link's namespace (``ip netns
    exec NAME``, which execs: the process is the Python one), or nothing."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    with open(log, "a") as f:
        cmd = [*prefix, sys.executable, *args]
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def _progress(out: Path, i: int) -> dict[str, Any]:
    f = out / f"progress{i}"
    return json.loads(f.read_text()) if f.exists() else {"step": -1, "pid": 0}


def one_run(a: argparse.Namespace, codec: Any, kill: bool, out: Path, seed: int, prefix: list[str]) -> dict[str, Any]:
    """One job: a lighthouse, three replicas, optionally replica 2 killed and restarted."""
    from tests.procs import free_port

    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        f.unlink()
    port = free_port()
    procs: dict[int, subprocess.Popen] = {}
    lighthouse = ["-m", "tests.transport_ranks.torchft_lighthouse", str(port), "2", "2000", "2000"]
    lh = _start(lighthouse, out / "lh.log", prefix)
    addr = f"http://localhost:{port}"
    lives = {0: 0, 1: 0, 2: 0}

    def start(i: int) -> None:
        cmd = [__file__, "--replica", "--out", str(out), "--index", str(i), "--lighthouse", addr]
        cmd += ["--codec", json.dumps(codec), "--life", str(lives[i]), "--outer-steps", str(a.outer_steps)]
        cmd += ["--sync-every", str(a.sync_every), "--pace", str(a.pace)]
        procs[i] = _start(cmd, out / f"replica{i}.log", prefix)

    events: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        time.sleep(1.0)
        for i in range(3):
            start(i)
        if kill:
            at = random.Random(seed).randint(3, max(3, a.outer_steps // 4))
            while _progress(out, 2)["step"] < at:
                if time.monotonic() - t0 > a.deadline or procs[2].poll() is not None:
                    raise RuntimeError(f"replica 2 never reached outer step {at}")
                time.sleep(0.05)
            procs[2].send_signal(signal.SIGKILL)
            procs[2].wait()
            events["killed_at"] = _progress(out, 2)["step"]
            lives[2] += 1
            start(2)
        for p in procs.values():
            p.wait(timeout=max(1.0, a.deadline - (time.monotonic() - t0)))
    except (subprocess.TimeoutExpired, RuntimeError) as e:
        events["error"] = str(e)
    finally:
        for p in [*procs.values(), lh]:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = {i: p.returncode for i, p in procs.items()}
    res = [json.loads(f.read_text()) for f in sorted(out.glob("replica*_*.json"))]
    finals = [r for r in res if r["life"] == lives[r["index"]]]
    ok = len(finals) == 3 and all(c == 0 for c in codes.values())
    return {
        "codec": codec,
        "kill": kill,
        "ok": ok,
        "codes": codes,
        **events,
        "identical": ok and len({r["global"] for r in finals}) == 1,
        "val_loss": finals[0]["val_loss"] if finals else None,
        "params": finals[0]["params"] if finals else None,
        # gcodec: what each replica encoded per exchange (one per outer step: bucketized); float32: 4 B each
        "payload_per_outer_step": [
            r["stats"]["payload_bytes"] / max(1, r["stats"]["exchanges"]) if r["stats"] else 4 * r["params"]
            for r in finals
        ],
        "wall_s": time.monotonic() - t0,
        "replicas": finals,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--lighthouse", default="")
    ap.add_argument("--codec", default="null")
    ap.add_argument("--life", type=int, default=0)
    ap.add_argument("--outer-steps", type=int, default=60, help="committed outer steps of every run")
    ap.add_argument("--sync-every", type=int, default=10, help="DiLoCo's H")
    ap.add_argument("--pace", type=float, default=0.05, help="seconds slept per inner step (sites' slower steps)")
    ap.add_argument("--seed", type=int, default=0, help="the kill's outer step")
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds per run")
    ap.add_argument(
        "--contenders",
        default=json.dumps([None, U4]),
        help="JSON list of codec configs (null: torchft's own float32 allreduce)",
    )
    ap.add_argument(
        "--rate",
        default="",
        help="run every process inside a network namespace whose loopback is shaped to this tc rate "
        "(bench/link.py's link, e.g. 100mbit; needs root and iproute2); default: the host's loopback",
    )
    ap.add_argument("--json", help="write the results")
    a = ap.parse_args()
    if a.replica:
        replica(a)
        return 0
    if a.rate:
        sys.path.insert(0, str(ROOT / "bench"))
        from link import NoNamespace, namespace

        try:
            with namespace(a.rate) as prefix:
                return runs(a, prefix)
        except NoNamespace as e:
            print(f"no shaped link: {e}", file=sys.stderr)
            return 0
    return runs(a, [])


def runs(a: argparse.Namespace, prefix: list[str]) -> int:
    """Every contender without and with the kill; ``wall_s`` is the seconds of each whole job (its
    committed outer steps, the kill's recovery included): a figure only on a shaped link and a
    quiet machine."""
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"torchft_faults_{os.getpid()}"
    rows = []
    for n, codec in enumerate(json.loads(a.contenders)):
        for kill in (False, True):
            r = one_run(a, codec, kill, work / f"c{n}_{int(kill)}", a.seed, prefix)
            r["rate"] = a.rate or "host loopback"
            rows.append(r)
            label = "fp32" if codec is None else "gcodec " + json.dumps(codec, sort_keys=True) + " + EF"
            print(
                f"{label:18} kill={kill!s:5} ok={r['ok']} identical={r['identical']} "
                f"val_loss={r['val_loss']} bytes/outer step={r['payload_per_outer_step']} "
                f"killed_at={r.get('killed_at')} wall={r['wall_s']:.0f} s {r.get('error', '')}",
                flush=True,
            )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
