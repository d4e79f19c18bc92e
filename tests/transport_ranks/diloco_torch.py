"""One gloo rank of DiLoCo's checks: ``python -m tests.transport_ranks.diloco_torch OUTDIR PHASE RANK WORLD PORT``.

Phases (tests/test_diloco.py runs each with its own processes):

* ``reference``: uncompressed DiLoCo against the algorithm written out here (every rank's local
  parameters all-gathered, their pseudo-gradients averaged in float64, a fresh Nesterov SGD step),
  and the replicas' global parameters bit-identical after every outer step;
* ``streaming``: Streaming DiLoCo (2 fragments, overlap 1 step, mix 0.5) with 4-bit values and
  error feedback: the send/apply schedule, the global parameters bit-identical, the wire bytes;
* ``resume``: a run checkpointed mid-way (an exchange in flight), loaded with
  ``torch.load(weights_only=True)`` into a fresh model and continued, ends bit-identical to the
  uninterrupted run, whether the model is loaded after DiLoCo is built or before (when the
  constructor's broadcast of rank 0's parameters overwrites it); another rank's state, another
  configuration's, are refused;
* ``diverge``: rank 1 syncs every 3 steps, rank 0 every 4: both raise ConfigError.
* ``mismatch``: replicas whose models differ in a parameter's shape (transposed: the same element
  count) or in their number of parameters: every rank raises a ConfigError naming the first
  parameter that differs and what each rank holds, before any broadcast (gloo aborted on it).

Writes OUTDIR/rank<r>.json (checks) and OUTDIR/globals<r>.json (digests of the global parameters).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import gcodec.torch
from gcodec.errors import ConfigError

from ..procs import finish_gloo, run_checked, start_gloo

CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def model(seed: int, hidden: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 4))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 16, generator=g)
    return x, torch.sin(x[:, :4] * 2.0)


def inner(net: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> float:
    x, y = batch(rank, step)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    return float(loss)


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def same_on_all(tensors: dict[str, torch.Tensor]) -> bool:
    mine = digest(tensors)
    got: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    return all(g == mine for g in got)


def reference(rank: int, world: int) -> None:
    net = model(rank)  # different initial weights per rank: DiLoCo must start from rank 0's
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    dl = gcodec.torch.DiLoCo(net, opt, sync_every=3, hook=False)
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    check("every replica starts from rank 0's parameters", same_on_all(start))
    ref_params = {n: t.clone().double() for n, t in start.items()}
    ref_opt = torch.optim.SGD(list(ref_params.values()), lr=0.7, momentum=0.9, nesterov=True)
    worst, rounds = 0.0, 0
    for step in range(1, 10):
        inner(net, opt, rank, step)
        if step % 3 == 0:
            locals_ = {}
            for n, p in net.named_parameters():
                parts = [torch.empty_like(p) for _ in range(world)]
                dist.all_gather(parts, p.detach())
                locals_[n] = parts
            with torch.no_grad():
                for n, t in ref_params.items():
                    t.grad = sum(t.detach() - q.double() for q in locals_[n]) / world
            ref_opt.step()
        dl.step()
        if step % 3 == 0:
            rounds += 1
            g = dl.global_parameters()
            check(f"global parameters bit-identical on every replica after outer step {rounds}", same_on_all(g))
            for n, p in net.named_parameters():
                worst = max(worst, float((g[n].double() - ref_params[n]).abs().max()))
                if not torch.equal(p.detach(), g[n]):
                    check(f"{n} replaced by the global value after the outer step", False)
    # float32 sums of 2 pseudo-gradients against float64: |error| <= a few ulp of values ~1
    check("global parameters follow the written-out algorithm (float32 vs float64 reference)", worst < 1e-5, str(worst))
    st = dl.stats()
    check("3 outer steps of 9 inner steps", st["outer_steps"] == 3 and st["inner_steps"] == 9, str(st))
    n_elems = sum(p.numel() for p in net.parameters())
    # dense float32 sums: 4 bytes per element a round
    check("uncompressed: raw bytes are 4 per element per round", st["raw_bytes"] == 3 * 4 * n_elems, str(st))
    # the control messages are counted: wire bytes are the data plus them; after the first round's
    # fingerprint (its JSON names every parameter), each round costs a few control words only
    check(
        "control bytes counted in wire_bytes",
        st["control_bytes"] > 0 and st["wire_bytes"] == st["data_wire_bytes"] + st["control_bytes"],
        str(st),
    )
    before = dl.stats()["control_bytes"]
    for step in range(10, 13):
        inner(net, opt, rank, step)
        dl.step()
    per_round = dl.stats()["control_bytes"] - before
    words = (5 + world) * 8 * (world - 1)  # one control message, to each peer
    check("a later round's control traffic is a few control messages", 0 < per_round <= 4 * words, f"{per_round} B")


def streaming(rank: int, world: int, outdir: Path) -> None:
    net = model(0, hidden=512)  # large enough that the headers are a small part of the payloads
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    codec = {"id": "uniform", "bits": 4, "group_size": 32}
    dl = gcodec.torch.DiLoCo(net, opt, sync_every=4, codec=codec, fragments=2, delay=1, mix=0.5)
    for step in range(1, 17):
        inner(net, opt, rank, step)  # the post-step hook counts the step
    # fragment 1 is offset by H * 1 // 2 = 2 steps; each average is applied 1 step after its send
    expect = []
    for t in range(1, 17):
        expect += [(t, f, "send") for f in (1, 0) if t % 4 == (2 if f else 0)]
        expect += [(t, f, "apply") for f in (1, 0) if (t - 1) % 4 == (2 if f else 0) and t > 1]
    ok = sorted(dl.log) == sorted(expect)
    check("the staggered schedule: sends and applies at the expected steps", ok, str(dl.log))
    check(
        "mixing keeps part of the local values (local != global after an apply)",
        not all(torch.equal(p.detach(), dl.global_parameters()[n]) for n, p in net.named_parameters()),
    )
    dl.close()
    check("global parameters bit-identical on every replica", same_on_all(dl.global_parameters()))
    st = dl.stats()
    # 4-bit codes + one float32 scale per 32 elements = 5 bits per element, plus headers: the
    # bytes put on the wire for the averages are under 1/4 of the raw float32 pseudo-gradients
    # (gather mode sends each rank's payload once to each of the world - 1 peers).
    ratio = st["wire_bytes"] / (st["raw_bytes"] * (world - 1))
    check("4-bit pseudo-gradients: wire bytes below 1/4 of float32", 0 < ratio < 0.25, str(st))
    (outdir / f"globals{rank}.json").write_text(json.dumps({"streaming": digest(dl.global_parameters())}))


def _run(net: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        inner(net, opt, rank, step)


def resume(rank: int, world: int, outdir: Path) -> None:
    cfg = dict(sync_every=4, codec={"id": "uniform", "bits": 4}, fragments=2, delay=2, mix=0.5)
    net = model(0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    dl = gcodec.torch.DiLoCo(net, opt, **cfg)
    _run(net, opt, rank, range(1, 15))
    dl.close()
    straight = ({n: p.detach().clone() for n, p in net.named_parameters()}, dl.global_parameters())

    net = model(0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    dl = gcodec.torch.DiLoCo(net, opt, **cfg)
    _run(net, opt, rank, range(1, 8))  # step 7: fragment 1 sent at step 6, applied at step 8
    check("a fragment's exchange is in flight at the checkpoint", 1 in dl._pending, str(dl.log))
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "diloco": dl.state_dict()}, buf)
    dl.close()

    net = model(7)  # other weights: everything must come from the checkpoint
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    dl = gcodec.torch.DiLoCo(net, opt, **cfg)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    net.load_state_dict(sd["model"])
    opt.load_state_dict(sd["opt"])
    dl.load_state_dict(sd["diloco"])
    _run(net, opt, rank, range(8, 15))
    dl.close()
    resumed = ({n: p.detach().clone() for n, p in net.named_parameters()}, dl.global_parameters())
    for what, a, b in (("local", straight[0], resumed[0]), ("global", straight[1], resumed[1])):
        bad = [n for n in a if not torch.equal(a[n], b[n])]
        check(f"resumed run's {what} parameters bit-identical to the uninterrupted run's", not bad, str(bad))

    # the model loaded before DiLoCo is built: the constructor broadcasts rank 0's parameters over
    # it, and load_state_dict puts this replica's own local parameters back (the checkpoint read
    # anew: loaded optimizer states share the tensors they were loaded from, and the run above
    # moved them)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    net = model(7)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net.load_state_dict(sd["model"])
    opt.load_state_dict(sd["opt"])
    dl = gcodec.torch.DiLoCo(net, opt, **cfg)
    dl.load_state_dict(sd["diloco"])
    _run(net, opt, rank, range(8, 15))
    dl.close()
    bad = [n for n, p in net.named_parameters() if not torch.equal(p.detach(), straight[0][n])]
    check("the model loaded before DiLoCo is built: resumed bit-identical too", not bad, str(bad))

    # every rank's state gathered into one file (the single-file habit): each loads its own; rank 0's
    # on rank 1 is refused, naming both ranks
    states: list = [None] * world
    dist.all_gather_object(states, sd["diloco"])
    net = model(0)
    dl = gcodec.torch.DiLoCo(net, torch.optim.AdamW(net.parameters(), lr=1e-2), **cfg)
    try:
        dl.load_state_dict(states[(rank + 1) % world])
        check("another replica's state is refused", False, "loaded")
    except ConfigError as e:
        check("another replica's state is refused", f"saved by rank {(rank + 1) % world}" in str(e), str(e))
    dl.close()

    other = gcodec.torch.DiLoCo(model(0), torch.optim.SGD(model(0).parameters(), lr=0.1), sync_every=5)
    try:
        other.load_state_dict(sd["diloco"])
        check("a state saved with another configuration is refused", False)
    except ConfigError as e:
        check(
            "a state saved with another configuration is refused, naming the field",
            "configuration" in str(e) and "schedule: saved" in str(e),
            str(e),
        )
    other.close()


def diverge(rank: int, world: int) -> None:
    net = model(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    dl = gcodec.torch.DiLoCo(net, opt, sync_every=4 if rank == 0 else 3)
    try:
        _run(net, opt, rank, range(1, 6))
        check("replicas with different sync_every raise", False, "no error")
    except ConfigError as e:
        check("replicas with different sync_every raise ConfigError naming it", "sync_every" in str(e), str(e))
    check("no outer step was applied from the mismatched exchange", dl.stats()["outer_steps"] == 0, str(dl.log))
    gcodec.torch.synchronize()


def mismatch(rank: int, world: int) -> None:
    """Rank 1's first Linear is transposed (the same element count), then it has one parameter
    more: every rank raises ConfigError naming the parameter, before anything is broadcast."""
    import time

    for kind in ("transposed", "extra"):
        net = model(0)
        if rank == 1 and kind == "transposed":
            w = net[0].weight
            net[0].weight = torch.nn.Parameter(w.detach().t().contiguous())
        if rank == 1 and kind == "extra":
            net.register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
        t0 = time.monotonic()
        try:
            gcodec.torch.DiLoCo(net, torch.optim.SGD(net.parameters(), lr=0.1), sync_every=4)
            check(f"{kind}: the replicas' models differ: ConfigError", False, "no error")
        except ConfigError as e:
            msg = str(e)
            named = (
                ("'0.weight'" in msg and "[32, 16]" in msg and "[16, 32]" in msg)
                if kind == "transposed"
                else "'extra'" in msg
            )
            check(f"{kind}: ConfigError on every rank naming the first parameter that differs", named, msg[:400])
            check(f"{kind}: ... at once", time.monotonic() - t0 < 20, f"{time.monotonic() - t0:.1f} s")
    dist.barrier()


def main() -> None:
    outdir, phase = Path(sys.argv[1]), sys.argv[2]
    rank, world, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start_gloo(rank, world, port, 60)
    bodies = {
        "reference": lambda: reference(rank, world),
        "streaming": lambda: streaming(rank, world, outdir),
        "resume": lambda: resume(rank, world, outdir),
        "diverge": lambda: diverge(rank, world),
        "mismatch": lambda: mismatch(rank, world),
    }
    run_checked(bodies[phase], CHECKS, outdir, rank)
    finish_gloo()


if __name__ == "__main__":
    main()
