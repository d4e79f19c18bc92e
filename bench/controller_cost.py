"""What the adaptive controller costs a job before its codecs pay: set-up, calibration and decisions.

    sudo python bench/controller_cost.py                                  # this tree, unlimited loopback
    sudo python bench/controller_cost.py --tree /work/main --tree . --rate 100mbit --repeats 3
    sudo python bench/controller_cost.py --settings '{"link": "advise"}'    # given advise's link

Each run starts 2 gloo ranks (inside a namespace shaped as bench/link.py shapes it, when run as
root: ``--rate``), with ``PYTHONPATH`` set to the run's source tree, so that two trees (say main and
a branch) are measured interleaved on the same machine in one invocation. Every rank builds the
link benchmark's MLP 64-2048-2048-10 under DDP, then :class:`gcodec.torch.HookState` with an
:class:`gcodec.adaptive.AdaptiveController` (``--settings``, JSON: the controller's arguments; the
tree's own defaults when left out; ``"link": "advise"`` hands it the link that ``gcodec advise
--probe torch`` measures at the rate, once before the runs) and error feedback, from step 0 (no
dense warm-up), and trains ``--steps`` steps of the digits. Reported per run, rank 0's figures (the ranks agree on every
decision):

- ``setup_s``: ``HookState(...)`` and the hook's registration (a calibration at set-up lands here);
- ``decide_s``: the seconds spent in the controller's decisions (its probe, its figures'
  allreduce and agreement) during the steps;
- ``first_compressed``: the first step with a compressed bucket, and ``to_first_compressed_s``
  the wall time from before ``HookState`` to the end of that step;
- ``steps_s``: the wall time of the ``--steps`` steps; the per-step milliseconds and rungs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


def worker(out: str, settings: dict[str, Any] | None, steps: int) -> None:
    """One rank: DDP + gcodec's hook with the adaptive controller, ``steps`` training steps."""
    import datetime

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gcodec.torch
    from gcodec.adaptive import AdaptiveController
    from gcodec.demo.data import train_test_split
    from gcodec.demo.worker import MLP

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))
    xtr, ytr, _, _ = train_test_split(0)

    class Timed(AdaptiveController):
        """The controller, with the seconds of its decisions (a protocol: timed around it)."""

        spent = 0.0

        def select(self, *a: Any, **kw: Any) -> Any:  # type: ignore[override]
            t0 = time.perf_counter()
            got = yield from super().select(*a, **kw)
            Timed.spent += time.perf_counter() - t0
            return got

    torch.manual_seed(0)
    model = MLP([2048, 2048])
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    t0 = time.perf_counter()
    ctl = Timed(**(settings or {}))
    state = gcodec.torch.HookState(codec="fp16", start_iter=0, error_feedback=True, controller=ctl, module=model)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    setup = time.perf_counter() - t0
    rows, first, to_first = [], None, None
    batch = 32
    t_steps = time.perf_counter()
    for step in range(steps):
        idx = np.arange(step * batch * size + rank * batch, step * batch * size + (rank + 1) * batch) % len(ytr)
        x, y = torch.from_numpy(xtr[idx]), torch.from_numpy(ytr[idx])
        ts = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        now = time.perf_counter()
        rungs = sorted(set(ctl.level.values()))
        rows.append({"ms": 1e3 * (now - ts), "rungs": rungs})
        if first is None and any(r != 0 and ctl.ladder[r] is not None for r in rungs):
            first, to_first = step, now - t0
    steps_s = time.perf_counter() - t_steps
    res = {
        "setup_s": setup,
        "decide_s": Timed.spent,
        "first_compressed": first,
        "to_first_compressed_s": to_first,
        "steps_s": steps_s,
        "steps": rows,
        "decisions": [(d["step"], d["from"], d["to"]) for d in ctl.decisions if d["from"] != d["to"]],
    }
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def launch(tree: Path, prefix: list[str], settings: dict[str, Any] | None, steps: int) -> dict[str, Any]:
    """2 gloo ranks of :func:`worker` with ``tree`` on their path; rank 0's result."""
    sys.path.insert(0, str(ROOT))
    from gcodec.demo.launch import free_port, torchrun_env

    with tempfile.TemporaryDirectory(prefix="gcodec-ctlcost-") as tmp:
        out, port = Path(tmp) / "out.json", free_port()
        cmd = [*prefix, sys.executable, str(HERE), "--worker", str(out), "--steps", str(steps)]
        if settings is not None:
            cmd += ["--settings", json.dumps(settings)]
        procs = []
        for r in range(2):
            env = torchrun_env(r, 2, port)
            env.update({"GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(tree)})
            procs.append(
                subprocess.Popen(cmd, env=env, cwd=str(tree), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        texts = [p.communicate(timeout=900)[0].decode(errors="replace") for p in procs]
        if any(p.returncode for p in procs) or not out.exists():
            raise RuntimeError(f"run failed in {tree}:\n{texts[0][-3000:]}\n{texts[1][-1500:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--tree", action="append", help="a source tree to measure (repeatable; default: this one)")
    ap.add_argument("--settings", action="append", help="the controller's arguments as JSON, one per --tree")
    ap.add_argument("--rate", default="unlimited", help="a bench/link.py rate (needs root), or 'none': no namespace")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, json.loads(args.settings[0]) if args.settings else None, args.steps)
        return 0
    trees = [Path(t).resolve() for t in (args.tree or [str(ROOT)])]
    sets = [json.loads(s) if s not in (None, "", "null") else None for s in (args.settings or [])]
    sets += [None] * (len(trees) - len(sets))
    if any(st and st.get("link") == "advise" for st in sets):
        # the link `gcodec advise --probe torch` measures at that rate, measured once, as a user
        # would before the job: handed to the settings that ask for it ("link": "advise")
        sys.path.insert(0, str(ROOT / "bench"))
        from link import probe_rate

        t = time.perf_counter()
        probed = probe_rate(args.rate, 2)
        print(f"advise's probe at {args.rate}: {time.perf_counter() - t:.1f} s: {probed}", flush=True)
        if probed is None:
            raise SystemExit("advise's probe failed")
        given = {"bandwidth_bps": probed["bandwidth_bps"], "latency_s": probed["latency_s"]}
        sets = [{**st, "link": given} if st and st.get("link") == "advise" else st for st in sets]
    results: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for tree, st in zip(trees, sets):  # interleaved: each repeat runs every tree once
            if args.rate == "none":
                res = launch(tree, [], st, args.steps)
            else:
                sys.path.insert(0, str(ROOT / "bench"))
                from link import namespace

                with namespace(args.rate) as prefix:
                    res = launch(tree, prefix, st, args.steps)
            res.update(tree=str(tree), settings=st, repeat=rep, rate=args.rate)
            results.append(res)
            ms = " ".join(f"{s['ms']:.0f}" for s in res["steps"])
            print(
                f"{tree} rep {rep} @ {args.rate}: setup {res['setup_s']:.2f} s, decisions {res['decide_s']:.2f} s, "
                f"first compressed step {res['first_compressed']} ended {res['to_first_compressed_s'] or 0:.2f} s "
                f"after set-up began; {args.steps} steps {res['steps_s']:.2f} s; moves {res['decisions']}; "
                f"step ms: {ms}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
