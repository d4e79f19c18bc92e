"""Time to accuracy under an emulated link: real gloo ranks whose traffic crosses a token bucket.

    sudo python bench/link.py                         # 100 Mbit/s, 1 Gbit/s, 10 Gbit/s, unlimited
    sudo python bench/link.py --quick                 # small model, one link, 6 contenders
    sudo python bench/link.py --rates 100mbit,unlimited --markdown docs/link.md --plot docs/link.png

**The link.** A network namespace of our own (``ip netns add gcodec-link-<pid>``) whose loopback is
set to MTU 1500 and brought up, with a token-bucket qdisc ``tc qdisc add dev lo root tbf rate R
burst B latency 100ms``, B a millisecond of the rate and at least 16 KiB (:func:`burst_bytes`). The
ranks start with ``ip netns exec`` and talk over gloo/TCP to 127.0.0.1 inside that namespace only
(``GLOO_SOCKET_IFNAME=lo``); the qdisc shapes both directions, since both cross the one loopback
device. The namespace is deleted on exit, error or Ctrl-C. Needs root (``CAP_NET_ADMIN``) and
iproute2; where a namespace cannot be created the benchmark says so and exits 0 without results.

**The training** is the demo's with the design guide's model: an MLP 64-2048-2048-10 (4.35 M
parameters) on the bundled digits, 2 gloo workers, plain SGD with a cosine learning rate.
Contenders: plain DDP (uncompressed), torch's ``fp16_compress_hook``, ``bf16_compress_hook`` and
``powerSGD_hook`` (ranks 1, 2 and 4, each at its shortest warm-up of 2 dense steps), and gcodec's
hook with several codecs, from its default warm-up (``--warmup``: HookState's ``start_iter``).

**The method.** The trajectory of a run does not depend on the link (same weights, batches and
arithmetic), only its wall time does. So:

1. through the last rate's link (no limit by default), every contender trains the full schedule
   once: its accuracy curve gives the steps it needs to reach the *target*, the uncompressed run's
   final test accuracy (``--target`` to override);
2. at every rate, every contender trains ``--timed-steps`` steps after a 2-step warm-up, and its
   median step time (forward, backward with the hook, optimizer step) is measured, all contenders
   of a rate in one short job (with ``--quick``, the runs of step 1 give the one rate's timings);
3. time to accuracy at a rate = warm-up steps (``--warmup``, or the contender's own ``start_iter``:
   torch's PowerSGD takes its shortest, 2) x that rate's uncompressed step time (or, for a
   contender with a ``warmup_codec``, the step time of the contender named by its ``warmup_like``)
   + the remaining steps to the target x the contender's step time. A contender that never reaches the target in
   the schedule shows "not reached".

**gcodec advise.** At every rate the ranks first run ``gcodec advise --probe torch`` in that
rate's namespace (:func:`probe_rate`): the one shaped loopback carries both ranks' traffic, so each
sees about half the nominal rate, and advise is priced on what they measure, not on the qdisc's
figure. Its choice per rate (:func:`advise_choices`) and its break-even bandwidths
(:func:`advise_break_even`) are set beside the measured times. Every rate's timing job also times
DDP with a hook that sends nothing (:data:`LOCAL`): the compute floor that :func:`advise_check`
adds advise's predicted exchange to, for each contender's predicted step at that rate and the
crossover bandwidth read off the predicted steps, both against the measured ones
(``python bench/advise_check.py --link-json FILE`` re-checks a saved run).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gcodec.demo.launch import run_job  # noqa: E402
from gcodec.demo.runs import Settings, run_spec  # noqa: E402
from gcodec.policy import DEFAULTS  # noqa: E402

RATES = ["100mbit", "1gbit", "10gbit", "unlimited"]
RATE_BITS = {"100mbit": 100e6, "1gbit": 1e9, "10gbit": 10e9, "unlimited": math.inf}

#: The contender that stands for "no codec" in gcodec's choice.
ALL_DENSE = "gcodec hook, every tensor dense"
#: The adaptive controller's contender: its codecs, and so its trajectory, follow the link.
ADAPTIVE = "gcodec adaptive controller + EF"
#: The bandwidth ``gcodec advise`` is given for the unlimited loopback (``--unlimited-bps``).
UNLIMITED_BPS = 40e9

CONTENDERS: list[dict[str, Any]] = [
    run_spec("uncompressed (DDP allreduce)", None, False, hook="none"),
    run_spec("torch fp16_compress_hook", None, False, hook="torch-fp16"),
    # torch's PowerSGD at its shortest warm-up: it needs at least 2 dense steps (warm start and EF)
    {**run_spec("torch powerSGD_hook r2", None, True, hook="torch-powersgd"), "rank": 2, "start_iter": 2},
    run_spec("gcodec fp16", {"id": "fp16"}, False),
    run_spec("gcodec uniform 8", {"id": "uniform", "bits": 8}, False),
    run_spec("gcodec uniform 4", {"id": "uniform", "bits": 4}, False),
    run_spec("gcodec sign + EF", {"id": "sign"}, True),
    run_spec("gcodec top-k 1% + EF", {"id": "topk", "ratio": 0.01}, True),
    run_spec("gcodec powersgd r2 + EF", {"id": "powersgd", "rank": 2}, True),
    run_spec(
        "gcodec top-k 1% + uniform 8 + EF", {"id": "topk", "ratio": 0.01, "values": {"id": "uniform", "bits": 8}}, True
    ),
    # what a job keeps running when gcodec advise says no codec pays: the hook stays registered and
    # its policy sends every tensor dense
    {**run_spec(ALL_DENSE, {"id": "fp16"}, False), "policy": {"*": None}},
    # warm-up as a policy decision: the first steps through fp16 (half the dense bytes, early
    # gradients kept to 11 bits), then top-k; its warm-up steps cost what "gcodec fp16" steps cost
    {
        **run_spec("gcodec top-k 1% + EF, fp16 warm-up", {"id": "topk", "ratio": 0.01}, True),
        "warmup_codec": {"id": "fp16"},
        "warmup_like": "gcodec fp16",
    },
    # the adaptive controller in the DDP hook at its defaults: at step 0 it picks, among none /
    # fp16 / uniform 8 / uniform 4 / top-k 1 % / PowerSGD r2 (EF on), the rung with the least
    # predicted step time on the link `gcodec advise --probe` measured at that rate (given to it
    # as link=, :func:`run`: no probe of its own), its codecs priced from their priors; the rung
    # is on trial for 3 steps, which calibrate the priors, then it decides every 10 steps. Its
    # trajectory depends on the link, so it trains the whole schedule at every rate and its time
    # to target is the wall time of its training steps up to the target.
    {
        **run_spec(ADAPTIVE, {"id": "fp16"}, True),
        "adaptive": {"interval": 10},
        "start_iter": 0,  # the controller decides from the first step
    },
    # torch's other hooks, each at its own best warm-up: bf16 (no warm-up), PowerSGD at ranks 1
    # and 4 with its shortest warm-up (2 dense steps), so that the best of ranks 1, 2 and 4 is torch's
    run_spec("torch bf16_compress_hook", None, False, hook="torch-bf16"),
    {**run_spec("torch powerSGD_hook r1", None, True, hook="torch-powersgd"), "rank": 1, "start_iter": 2},
    {**run_spec("torch powerSGD_hook r4", None, True, hook="torch-powersgd"), "rank": 4, "start_iter": 2},
    # PowerSGD's factors summed in bfloat16: half the bytes of the float32 factors
    run_spec("gcodec powersgd r2 + EF, bf16 factors", {"id": "powersgd", "rank": 2, "factors": "bf16"}, True),
]
#: Timed at every rate beside the contenders, never trained to the target: DDP with a hook that
#: sends nothing (each rank keeps its own gradients, so the replicas drift apart). Its step is the
#: compute (forward, backward, optimizer) that every contender adds its exchange to, and the floor
#: that advise's predicted exchange is added to in :func:`advise_check`.
LOCAL = run_spec("no communication (local gradients)", None, False, hook="local")

#: indices into CONTENDERS for --quick: plain DDP, torch fp16, gcodec fp16, top-k with and without
#: a compressed warm-up, and the all-dense hook (what "none" in gcodec's choice runs)
QUICK = [0, 1, 3, 7, 10, 11, 12]


def follows_link(c: dict[str, Any]) -> bool:
    """Whether a contender's trajectory depends on the link (it decides from what it measures)."""
    return c.get("adaptive") is not None


def with_link(c: dict[str, Any], probed: dict[str, Any] | None) -> dict[str, Any]:
    """An adaptive contender given the link a rate's probe measured (:func:`probe_rate`: the
    allreduce's bandwidth and latency, as ``gcodec advise --probe --json`` writes them), so that
    its controller does not probe the link again; unchanged without a probe or a controller, or
    where the contender sets a link or bandwidth of its own."""
    ad = c.get("adaptive")
    if ad is None or probed is None or "link" in ad or "bandwidth" in ad:
        return c
    link = {"bandwidth_bps": probed["bandwidth_bps"], "latency_s": probed["latency_s"]}
    return {**c, "adaptive": {**ad, "link": link}}


def _priced(c: dict[str, Any]) -> bool:
    """A gcodec contender with one codec, which advise can price."""
    return c["hook"] == "gcodec" and c["codec"] is not None and not c.get("policy") and not follows_link(c)


class NoNamespace(RuntimeError):
    """Network namespaces cannot be created here (not root, no iproute2, or a sandbox)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def burst_bytes(rate: str) -> int:
    """The token bucket's burst at ``rate``: what the rate moves in a millisecond, and at least 16
    KiB (above the loopback's 1500-byte MTU). A fixed 256 KiB let every message under it through
    at the loopback's own speed once the bucket had refilled, which a step's pause does: at 100
    Mbit/s a compressed payload of 0.23 MB then crossed in a fraction of the 37 ms the rate gives
    it, so that the link the codecs saw was not the one the probe's large messages measured. A
    millisecond of the rate is the least that still lets the kernel's timer keep the rate (1.25
    MB at 10 Gbit/s)."""
    return max(16 << 10, int(RATE_BITS[rate] / 8 / 1000))


@contextlib.contextmanager
def namespace(rate: str) -> Iterator[list[str]]:
    """A fresh namespace with lo at MTU 1500, up, shaped to ``rate`` ("unlimited": no qdisc).
    Yields the command prefix that runs a process inside it; always deletes it."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise NoNamespace("iproute2 (ip, tc) is not installed: apt-get install iproute2")
    name = f"gcodec-link-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as e:
        raise NoNamespace(f"cannot create a network namespace ({e.stderr.strip()}); run as root") from e
    try:
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "mtu", "1500", "up")
        if rate != "unlimited":
            subprocess.run(
                [
                    *("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate),
                    *("burst", str(burst_bytes(rate)), "latency", "100ms"),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        yield ["ip", "netns", "exec", name]
    finally:
        _ip("netns", "del", name, check=False)


def _shapes(hidden: list[int]) -> dict[str, list[int]]:
    """The benchmark MLP's parameter shapes, named as torch names them."""
    dims = [64, *hidden, 10]
    shapes = {}
    for k, (a, b) in enumerate(itertools.pairwise(dims)):
        shapes[f"{2 * k}.weight"], shapes[f"{2 * k}.bias"] = [b, a], [b]
    return shapes


def _advise_module() -> Any:
    try:
        from gcodec import advise as adv
    except ImportError:
        return None
    return adv


def advise_break_even(
    codec: dict[str, Any] | None, hidden: list[int], workers: int, error_feedback: bool
) -> float | None:
    """The bandwidth (bit/s) above which ``gcodec advise`` predicts that ``codec`` costs more than an
    uncompressed allreduce of the benchmark's model (``inf``: it always pays; 0: it never does),
    for comparison with the measured crossover.

    Returns None where ``gcodec.advise`` is not installed or cannot price the codec (torch's own
    hooks, no codec). Uses ``gcodec.advise.advise(model=...)`` with the MLP's parameter shapes, this
    machine's measured codec speeds and the default latency.
    """
    adv = _advise_module()
    if codec is None or adv is None:
        return None
    try:
        rows = adv.advise(
            model=_shapes(hidden),
            bandwidth=1e9,
            workers=workers,
            candidates=[codec],
            error_feedback=error_feedback,
            repeats=2,
        )
    except Exception as e:  # an API change on the other side must not sink the benchmark
        print(f"gcodec advise failed for {codec}: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    if not rows:
        return None
    be = rows[0].get("break_even_bps")
    if be is None:
        return math.inf if rows[0].get("saving_seconds", 0) > 0 else 0.0
    return float(be)


def probe_rate(
    rate: str, workers: int, model: dict[str, list[int]] | None = None, codecs: list[Any] | None = None
) -> dict[str, Any] | None:
    """The link as the ranks see it at ``rate``: ``gcodec advise --probe torch`` run by ``workers``
    gloo ranks inside a namespace shaped to ``rate``, as the training ranks run. The one shaped
    loopback carries every rank's traffic, so a rank sees less than the nominal rate; advise must
    be told what the ranks see, not the qdisc's figure. Returns the probe's ``link`` (allreduce
    and all-gather bandwidth and latency), or None when the probe fails. Given the benchmark's
    ``model`` and the gcodec contenders' ``codecs``, advise also times each codec's exchange of the
    model's gradients on that link (its measured column) and the link carries them as
    ``measured``: ``{codec config as canonical JSON ("null": dense): seconds}``."""
    import tempfile

    from gcodec.demo.launch import free_port, torchrun_env

    with tempfile.TemporaryDirectory(prefix="gcodec-probe-") as tmp, namespace(rate) as prefix:
        out, port = Path(tmp) / "advise.json", free_port()
        cmd = [*prefix, sys.executable, "-m", "gcodec", "advise", "--probe", "torch"]
        if model is None:
            cmd += ["--numel", "4096", "--codec", "fp16", "--codec-only", "--repeats", "1", "--no-measure"]
        else:
            (Path(tmp) / "model.json").write_text(json.dumps(model))
            cmd += ["--model", str(Path(tmp) / "model.json"), "--repeats", "5"]
            for c in codecs or []:
                cmd += ["--codec", json.dumps(c)]
        # advise's own probe sizes, up to 16 MiB: the model's 17 MB bucket moves at the rate of the
        # large sizes, which a token bucket's burst and gloo's small messages do not show
        cmd += ["--json", str(out)]
        procs = []
        for r in range(workers):
            env = torchrun_env(r, workers, port)
            env.update({"GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(ROOT)})
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        texts = [p.communicate(timeout=600)[0] for p in procs]
        if any(p.returncode for p in procs) or not out.exists():
            print(f"probe at {rate} failed:\n{texts[0][-2000:]}", file=sys.stderr)
            return None
        rows = json.loads(out.read_text())
        link: dict[str, Any] = rows[0]["link"]
        if model is not None:
            link["measured"] = {
                json.dumps(r["codec"], sort_keys=True): r["measured_step_seconds"]
                for r in rows
                if r.get("measured_step_seconds") is not None
            }
        print(
            f"probe at {rate}: allreduce {link['bandwidth_bps'] / 1e9:.3g} Gbit/s, alpha "
            f"{link['latency_s'] * 1e6:.0f} us; all-gather {link['gather']['bandwidth_bps'] / 1e9:.3g} Gbit/s",
            file=sys.stderr,
        )
        return link


def _probed_link(adv: Any, probed: dict[str, Any]) -> Any:
    """The ``gcodec.advise.Link`` a rate's probe measured (:func:`probe_rate`), its all-gather's
    link included."""
    g = probed["gather"]
    return adv.Link(probed["bandwidth_bps"], probed["latency_s"], adv.Link(g["bandwidth_bps"], g["latency_s"]))


def _link_of(adv: Any, probed: dict[str, Any] | None, nominal_bps: float) -> dict[str, Any]:
    """advise()'s link arguments: the probed link, or the nominal rate (and advise's default alpha)."""
    if probed is None:
        return {"bandwidth": nominal_bps}
    link = _probed_link(adv, probed)
    return {"bandwidth": link.bandwidth_bps, "latency_s": link.latency_s, "gather_link": link.gather}


def advise_choices(
    contenders: list[dict[str, Any]],
    hidden: list[int],
    workers: int,
    rates: list[str],
    unlimited_bps: float,
    links: dict[str, dict[str, Any] | None] | None = None,
) -> dict[str, str | None]:
    """Per rate, the gcodec contender ``gcodec advise`` picks at that bandwidth, or None when it
    says that none pays: the largest *measured* saving over the dense exchange where the rate's
    probe timed each codec's exchange on the link (``links[rate]["measured"]``, the column a user
    of ``--probe`` reads), else the largest predicted saving per step.

    This is what a user who follows ``gcodec advise`` runs; the benchmark then reads that
    contender's measured time (the all-dense hook's for None). Each rate is priced on the link
    the ranks measured there (``links``, :func:`probe_rate`), else on its nominal figure (the
    unlimited loopback at ``unlimited_bps``).
    """
    adv = _advise_module()
    cands = [c for c in contenders if _priced(c)]
    if adv is None or not cands:
        return {}
    from gcodec import get_codec

    def key(c: dict[str, Any]) -> str:
        return json.dumps(get_codec(c["codec"]).get_config(), sort_keys=True)

    speeds = {}
    for c in cands:
        speeds[key(c)] = adv.measure_speed(c["codec"])
    out: dict[str, str | None] = {}
    for rate in rates:
        bps = RATE_BITS[rate] if math.isfinite(RATE_BITS[rate]) else unlimited_bps
        best, saving = None, 0.0
        measured = ((links or {}).get(rate) or {}).get("measured")
        for c in cands:
            if measured and "null" in measured and key(c) in measured:
                got = measured["null"] - measured[key(c)]
                close = adv.verdict(got, measured["null"]) != "pays"
            else:
                row = adv.advise(
                    model=_shapes(hidden),
                    **_link_of(adv, (links or {}).get(rate), bps),
                    workers=workers,
                    candidates=[c["codec"]],
                    error_feedback=c["error_feedback"],
                    speeds=speeds,
                )[0]
                got = float(row["saving_seconds"])
                close = row["verdict"] != "pays"
            if got > saving and not close:  # a close call recommends nothing (advise.CLOSE_FRACTION)
                best, saving = c["label"], got
        out[rate] = best
    return out


def measured_crossover(row: dict[str, Any], base: dict[str, Any], rates: list[str]) -> str:
    """The rates between which the contender's time to target first exceeds the uncompressed run's."""
    prev = None
    for q in sorted(rates, key=lambda r: RATE_BITS[r]):
        t, b = row["rates"][q]["time_to_target_s"], base["rates"][q]["time_to_target_s"]
        if t is None or b is None:
            return "n/a"
        if t > b:
            return f"< {q}" if prev is None else f"{prev}..{q}"
        prev = q
    return "pays at every rate"


def crossover(points: list[tuple[str, float, float]]) -> dict[str, Any]:
    """Where a contender stops paying, from ``(rate, bandwidth the ranks measured there, its step time
    less the uncompressed step time there)`` per rate.

    Ordered by the measured bandwidth (not the nominal rate: the unlimited loopback can measure
    slower than a shaped one), the last rate where the contender pays (difference <= 0) and the
    next one bracket the crossover, found by interpolating the difference linearly in 1/bandwidth:
    each step is compute plus bytes / bandwidth, so the difference is a + b / bandwidth exactly
    where the alpha-beta model holds. ``kind`` is ``crosses`` (with ``bps``, ``below`` and
    ``above``), ``pays`` (at every rate: the crossover lies above ``at_bps``) or ``never`` (at no
    rate: it lies below ``at_bps``, or nowhere)."""
    pts = sorted(points, key=lambda t: t[1])
    paying = [i for i, (_, _, d) in enumerate(pts) if d <= 0]
    if not paying:
        return {"kind": "never", "rate": pts[0][0], "at_bps": pts[0][1]}
    i = paying[-1]
    if i == len(pts) - 1:
        return {"kind": "pays", "rate": pts[-1][0], "at_bps": pts[-1][1]}
    (q1, b1, d1), (q2, b2, d2) = pts[i], pts[i + 1]
    x1, x2 = 1 / b1, 1 / b2
    x = x1 + (-d1) * (x2 - x1) / (d2 - d1)  # d1 <= 0 < d2: x lies in (x2, x1]
    return {"kind": "crosses", "bps": 1 / x, "below": q1, "above": q2}


def _factor(pred: float, meas: float) -> float:
    return max(pred / meas, meas / pred) if pred > 0 and meas > 0 else math.inf


def _bounds(m: dict[str, Any]) -> tuple[float, float]:
    """The bandwidths a :func:`crossover` result allows the crossover to lie between."""
    if m["kind"] == "crosses":
        return m["bps"], m["bps"]
    return (m["at_bps"], math.inf) if m["kind"] == "pays" else (0.0, m["at_bps"])


def crossover_factor(measured: dict[str, Any], predicted: dict[str, Any]) -> float:
    """How far apart two :func:`crossover` results are: the ratio of the nearest ends of the
    bandwidths each allows (1 where they overlap). Two bracketed crossovers give their ratio; a
    contender measured to pay at every rate and predicted to stop at B gives the fastest rate / B
    (1 if B lies above it)."""
    (lo_m, hi_m), (lo_p, hi_p) = _bounds(measured), _bounds(predicted)
    gaps = [1.0]
    if hi_m > 0 and lo_p > hi_m:
        gaps.append(lo_p / hi_m)
    if hi_p > 0 and lo_m > hi_p:
        gaps.append(lo_m / hi_p)
    if hi_m == 0 or hi_p == 0:  # "never" at a zero bandwidth: no finite ratio
        gaps.append(math.inf)
    return max(gaps)


def advise_check(
    res: dict[str, Any], contenders: list[dict[str, Any]] | None = None, cold: bool = True
) -> dict[str, Any] | None:
    """``gcodec advise`` against the run, on the link the ranks measured at each rate: per contender
    it can price (one codec, plain DDP, the all-dense hook) and rate, the predicted step (the
    no-communication contender's measured step, :data:`LOCAL`, plus advise's exchange of the
    model's tensors on the probed link, with the transports' protocol timed here as advise does)
    against the measured step; per codec, the measured crossover bandwidth (:func:`crossover`)
    against the bandwidth where the predicted steps cross the predicted uncompressed step (the
    same interpolation on the same links), with advise's own break-even on the probed link
    nearest to the crossover beside them; and per rate, whether the
    contender advise picked (``advise_choice``) measured slower than the uncompressed step.

    None where advise is not installed, or no rate has both a probed link and the compute floor.
    Its codec timings are taken here, after the runs, so they see an idle machine, each step after
    the caches are read over (:class:`gcodec.advise.CacheEvictor`), as advise takes them (``cold``;
    False: back to back, the caches warm)."""
    adv = _advise_module()
    local, links = res.get("local_step_ms") or {}, res.get("links") or {}
    rates = [q for q in res["rates"] if local.get(q) is not None and links.get(q)]
    if adv is None or not rates:
        return None

    hidden = [int(h) for h in res["model"].split("-")[1:-1]]
    by_label = {c["label"]: c for c in (contenders or CONTENDERS)}
    tensors, dense = adv.job_tensors(model=_shapes(hidden))
    sizes = adv.transport_sizes(math.prod(t) for t in tensors)
    workers = int(res["workers"])
    base = res["rows"][0]
    # timed with the caches read over before each step, as advise times them: the job's forward and
    # backward passes run between two exchanges (gcodec.advise.CacheEvictor)
    evict = adv.CacheEvictor() if cold else None
    dense_pred: dict[str, float] = {}
    rows = []
    for r in res["rows"]:
        c = by_label.get(r["label"])
        if c is None or not (_priced(c) or c["hook"] == "none" or r["label"] == ALL_DENSE):
            continue
        cfg = c["codec"] if _priced(c) else None
        ef = bool(c["error_feedback"]) and cfg is not None
        speed = adv.measure_speed(cfg, evict=evict)
        tspeed = None
        if cfg is not None:
            tspeed = adv.measure_transport(cfg, workers, error_feedback=ef, sizes=sizes, shapes=tensors, evict=evict)
        per: dict[str, dict[str, Any]] = {}
        for q in rates:
            link = _probed_link(adv, links[q])
            p = adv.predict(
                cfg, speed, tensors, workers, link, dense_tensors=dense, error_feedback=ef, transport=tspeed
            )
            pred, meas = local[q] + 1e3 * p["step_seconds"], r["rates"][q]["step_ms"]
            be = p["break_even_bps"]
            per[q] = {
                "predicted_ms": pred,
                "measured_ms": meas,
                "factor": None if meas is None else _factor(pred, meas),
                # advise's break-even on this link (None from advise: always pays or never does)
                "break_even_bps": be if be is not None else (math.inf if p["saving_seconds"] > 0 else 0.0),
            }
        row: dict[str, Any] = {"label": r["label"], "codec": cfg, "error_feedback": ef, "rates": per}
        pts = [
            (q, links[q]["bandwidth_bps"], r["rates"][q]["step_ms"] - base["rates"][q]["step_ms"])
            for q in rates
            if r["rates"][q]["step_ms"] is not None and base["rates"][q]["step_ms"] is not None
        ]
        if cfg is not None and pts:
            # both sides the same way: where the measured steps cross the uncompressed ones, and
            # where the predicted steps cross the predicted uncompressed ones, on the same links
            m = crossover(pts)
            pred = crossover([(q, bw, per[q]["predicted_ms"] - dense_pred[q]) for q, bw, _ in pts])
            near = m["above"] if m["kind"] == "crosses" else m["rate"]
            row["crossover"] = {
                "measured": m,
                "predicted": pred,
                "factor": crossover_factor(m, pred),
                # advise's own break-even, extrapolated from the one link nearest the crossover
                "break_even_bps": per[near]["break_even_bps"],
                "link_of": near,
            }
        if cfg is None and r is base:
            dense_pred = {q: v["predicted_ms"] for q, v in per.items()}
        rows.append(row)
    verdicts = {}
    for q in rates:
        if q not in (res.get("advise_choice") or {}):
            continue
        # advise recommends a codec, or none; "none" is no codec to judge (the user runs plain DDP,
        # or keeps the hook with every tensor dense, whose own cost is reported beside it)
        pick = res["advise_choice"][q]
        got = next((r["rates"][q]["step_ms"] for r in res["rows"] if r["label"] == (pick or ALL_DENSE)), None)
        dense_ms = base["rates"][q]["step_ms"]
        verdicts[q] = {
            "pick": pick,
            "pick_ms": got,
            "uncompressed_ms": dense_ms,
            "slower": None if pick is None or got is None or dense_ms is None else got > dense_ms,
        }
    factors = [v["factor"] for r in rows for v in r["rates"].values() if v["factor"] is not None]
    cross = [r["crossover"]["factor"] for r in rows if "crossover" in r]
    return {
        "rates": rates,
        "rows": rows,
        "verdicts": verdicts,
        "worst_step_factor": max(factors, default=None),
        "median_step_factor": sorted(factors)[len(factors) // 2] if factors else None,
        "worst_crossover_factor": max(cross, default=None),
    }


def advise_check_lines(chk: dict[str, Any] | None) -> list[str]:
    """The markdown of :func:`advise_check`: a table of predicted / measured step times per rate
    and the crossovers, then the picks."""
    if not chk:
        return []
    rates = chk["rates"]
    head = ["contender", *[f"@ {q}: predicted / measured ms" for q in rates]]
    head += ["crossover measured", "predicted", "factor", "advise's break-even"]
    out = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]

    def bps(v: float | None) -> str:
        if v is None:
            return ""
        return "always pays" if v == math.inf else ("never pays" if v == 0 else f"{v / 1e9:.2f} Gbit/s")

    def where(m: dict[str, Any]) -> str:
        if m["kind"] == "crosses":
            return f"{bps(m['bps'])} ({m['below']}..{m['above']})"
        return f"{'above' if m['kind'] == 'pays' else 'below'} {bps(m['at_bps'])}"

    for r in chk["rows"]:
        cells = [r["label"]]
        for q in rates:
            v = r["rates"][q]
            m = "" if v["measured_ms"] is None else f"{v['measured_ms']:.0f}"
            f = "" if v["factor"] is None else f" ({v['factor']:.2f})"
            cells.append(f"{v['predicted_ms']:.0f} / {m}{f}")
        x = r.get("crossover")
        if x is None:
            cells += ["", "", "", ""]
        else:
            cells += [
                where(x["measured"]),
                where(x["predicted"]),
                f"{x['factor']:.2f}",
                f"{bps(x['break_even_bps'])} (link of {x['link_of']})",
            ]
        out.append("| " + " | ".join(cells) + " |")
    if chk["worst_step_factor"] is not None:
        out.append(
            f"\nstep time predicted against measured: worst factor {chk['worst_step_factor']:.2f}, "
            f"median {chk['median_step_factor']:.2f}"
            + (
                ""
                if chk["worst_crossover_factor"] is None
                else f"; crossover: worst factor {chk['worst_crossover_factor']:.2f}"
            )
        )
    for q, v in chk["verdicts"].items():
        if v["pick"] is None and v["pick_ms"] is not None and v["uncompressed_ms"] is not None:
            out.append(
                f"- {q}: advise recommends no codec (the hook with every tensor dense measured "
                f"{v['pick_ms']:.0f} ms a step against {v['uncompressed_ms']:.0f} for plain DDP)"
            )
        if v["slower"] is None:
            continue
        out.append(
            f"- {q}: advise picks {v['pick']}, measured {v['pick_ms']:.0f} ms a step against "
            f"{v['uncompressed_ms']:.0f} uncompressed: {'SLOWER' if v['slower'] else 'not slower'}"
        )
    return out


def steps_to(curve: list[dict[str, Any]], target: float) -> int | None:
    for c in curve:
        if c["accuracy"] >= target - 1e-9:
            return int(c["step"])
    return None


def wall_to(curve: list[dict[str, Any]], target: float) -> float | None:
    """The wall time of a run's training steps up to the target (first-call costs and every slow
    step included), or None when it never reaches it."""
    n = steps_to(curve, target)
    return next((float(p["train_s"]) for p in curve if p["step"] == n), None)


def run(
    args: argparse.Namespace, contenders: list[dict[str, Any]] | None = None, hidden: list[int] | None = None
) -> dict[str, Any]:
    """The accuracy runs and the timing runs of ``contenders`` (default: this file's; the first one
    is the uncompressed reference: its final accuracy is the target, its step time the warm-up's).
    ``args``: rates, epochs, warmup, timed_steps, target, workers, quick, accuracy_from."""
    if contenders is None:
        contenders = [CONTENDERS[i] for i in QUICK] if args.quick else CONTENDERS
    fixed = [c for c in contenders if not follows_link(c)]
    if hidden is None:
        hidden = [256, 256] if args.quick else [2048, 2048]
    env = {"GLOO_SOCKET_IFNAME": "lo"}
    base = Settings(hidden=hidden, epochs=args.epochs, evals_per_epoch=2, start_iter=args.warmup)
    t0 = time.perf_counter()
    last = args.rates[-1]
    info: dict[str, dict[str, Any]] = {}  # per contender: accuracy, steps to target, bytes
    timed: dict[str, dict[str, Any]] = {}
    if args.accuracy_from:  # reuse the accuracy runs of an earlier --json (same contenders and schedule)
        prev = json.loads(Path(args.accuracy_from).read_text())
        target = float(prev["target"])
        info = {r["label"]: r for r in prev["rows"] if r["accuracy"] is not None}
        params = prev["params"]
    else:
        # The accuracy runs go through the last rate's link (by default "unlimited"): their
        # trajectory does not depend on it. With --quick their step times are that rate's timings.
        print(f"accuracy runs at {last}: {len(fixed)} contenders, {args.epochs} epochs", file=sys.stderr)
        with namespace(last) as prefix:
            acc = run_job(fixed, base, args.workers, prefix=prefix, env=env)["runs"]
        ok = {r["label"]: r for r in acc if r.get("ok")}
        base_run = ok.get(contenders[0]["label"])
        target = args.target if args.target else (base_run["accuracy"] if base_run else 0.9)
        params = next((r["params"] for r in acc if r.get("ok")), None)
        for label, a in ok.items():
            info[label] = {
                **a,
                "steps_to_target": steps_to(a["curve"], target),
                "wall_to_target_s": wall_to(a["curve"], target),
            }
        if args.quick:
            timed[last] = {r["label"]: r for r in acc}
            with namespace(last) as prefix:  # the compute floor at that rate, for advise_check
                s = Settings(hidden=hidden, epochs=1, evals_per_epoch=0, start_iter=2, max_steps=2 + 2 + 3)
                runs = run_job([LOCAL], s, args.workers, prefix=prefix, env=env)["runs"]
                timed[last].update({r["label"]: r for r in runs})
    # Timing runs: a few steps per contender at every rate, all in one short job per rate, so that
    # the contenders of one rate are measured minutes apart at most (the machine is shared).
    for rate in args.rates:
        if rate in timed:
            continue
        print(f"timing at {rate}: {args.timed_steps} steps per contender", file=sys.stderr, flush=True)
        s = Settings(hidden=hidden, epochs=1, evals_per_epoch=0, start_iter=2, max_steps=2 + 2 + args.timed_steps)
        with namespace(rate) as prefix:
            runs = run_job([*fixed, LOCAL], s, args.workers, prefix=prefix, env=env)["runs"]
            timed[rate] = {r["label"]: r for r in runs}
    # What the ranks see at each rate, for advise: measured as a user would, with --probe
    gcodecs = [c["codec"] for c in contenders if _priced(c)]
    links = {rate: probe_rate(rate, args.workers, _shapes(hidden), gcodecs) for rate in args.rates}
    # Contenders that decide from what they measure train the whole schedule at every rate, given
    # the link that rate's probe measured (as a user hands advise's --json to the controller)
    whole: dict[str, dict[str, Any]] = {}
    if len(fixed) < len(contenders):
        for rate in args.rates:
            print(f"whole runs at {rate}: {len(contenders) - len(fixed)} contender(s)", file=sys.stderr, flush=True)
            deciding = [with_link(c, links.get(rate)) for c in contenders if follows_link(c)]
            with namespace(rate) as prefix:
                runs = run_job(deciding, base, args.workers, prefix=prefix, env=env)
            whole[rate] = {r["label"]: r for r in runs["runs"]}
    local = {q: _ok_step_ms(timed[q].get(LOCAL["label"])) for q in args.rates}
    rows = []
    for c in contenders:
        if follows_link(c):
            rows.append(_whole_row(c, whole, args.rates, target, local))
            continue
        a = info.get(c["label"])
        n = a["steps_to_target"] if a else None
        row: dict[str, Any] = {
            "label": c["label"],
            "codec": c["codec"],
            "hook": c["hook"],
            "accuracy": a["accuracy"] if a else None,
            "steps_to_target": n,
            "bytes_per_step": a["bytes_per_step"] if a else None,
            "all_gather_bytes_per_step": a.get("all_gather_bytes_per_step") if a else None,
            "bits_per_element": a["bits_per_element"] if a else None,
            "advise_break_even_bps": None
            if not _priced(c)
            else advise_break_even(c["codec"], hidden, args.workers, c["error_feedback"]),
            "rates": {},
        }
        for rate in args.rates:
            t = timed[rate].get(c["label"], {})
            # the warm-up steps cost a dense step, or the step of the contender running the
            # warm-up codec (``warmup_like``)
            dense = timed[rate].get(c.get("warmup_like") or contenders[0]["label"], {}).get("step_ms")
            step_ms = t.get("step_ms") if t.get("ok") else None
            tta = None
            if n is not None and step_ms is not None and dense is not None:
                w = min(n, c.get("start_iter", base.start_iter))  # the contender's own warm-up
                tta = (w * dense + (n - w) * step_ms) / 1e3
            held = t.get("held_ms") if t.get("ok") else None
            row["rates"][rate] = {
                "step_ms": step_ms,
                "time_to_target_s": tta,
                "bound_s": zero_comm_bound(n, local[rate]),
                "held_ms": held,
                "hidden": hidden_share(step_ms, held, local[rate]),
                "error": t.get("error"),
            }
        if a and a.get("wall_to_target_s") is not None:
            # the accuracy run went through the last rate's link: its wall time there, to compare
            # like with like with a contender whose time is a whole run's wall time
            row["rates"][last]["wall_to_target_s"] = a["wall_to_target_s"]
        rows.append(row)
    res = {
        "model": f"MLP 64-{'-'.join(map(str, hidden))}-10",
        "params": params,
        "workers": args.workers,
        "epochs": args.epochs,
        "target": target,
        "rates": args.rates,
        "elapsed_s": time.perf_counter() - t0,
        "rows": rows,
        "advise_choice": advise_choices(
            contenders, hidden, args.workers, args.rates, getattr(args, "unlimited_bps", UNLIMITED_BPS), links
        ),
        "links": links,
        "unlimited_bps": getattr(args, "unlimited_bps", UNLIMITED_BPS),
        "local_step_ms": local,
    }
    res["advise_check"] = advise_check(res, contenders)
    return res


def hidden_share(step_ms: float | None, held_ms: float | None, local_ms: float | None) -> float | None:
    """The share of a step's exchange hidden behind the backward pass: the exchange (``held_ms``,
    the seconds gcodec's hook held the gradients in a step: every bucket's encode, communication,
    decode and planning, from its step report) less what the step took beyond the compute-only
    step (``local_ms``, :data:`LOCAL` at the same rate), over the exchange. 1: the exchange cost
    the step nothing; 0: the step paid all of it; below 0: the step took longer than compute and
    exchange one after the other (the ranks' threads and the backward pass slowing each other on
    shared cores). None where a figure is missing (torch's hooks and plain DDP have no hook
    statistics)."""
    if step_ms is None or held_ms is None or local_ms is None or held_ms <= 0:
        return None
    return (local_ms + held_ms - step_ms) / held_ms


def zero_comm_bound(steps: int | None, local_ms: float | None) -> float | None:
    """The zero-communication bound of a contender's time to target: its steps to the target x the
    compute-only step at the rate (:data:`LOCAL`), in seconds; what no exchange, however hidden,
    gets under. None where either is missing."""
    return None if steps is None or local_ms is None else steps * local_ms / 1e3


def _ok_step_ms(run: dict[str, Any] | None) -> float | None:
    return run["step_ms"] if run and run.get("ok") else None


def _whole_row(
    c: dict[str, Any],
    whole: dict[str, dict[str, Any]],
    rates: list[str],
    target: float,
    local: dict[str, float | None] | None = None,
) -> dict[str, Any]:
    """The row of a contender that trained the whole schedule at every rate: per rate its steps to
    the target, the wall time of its training steps up to there (first-call costs and its
    decisions included), its median step, the share of its exchange hidden behind the backward
    pass (:func:`hidden_share`, with ``local``: the compute-only step per rate) and its rung
    changes; the row's accuracy, steps and bytes are the last rate's."""
    row: dict[str, Any] = {"label": c["label"], "codec": c["codec"], "hook": c["hook"], "rates": {}}
    for rate in rates:
        a = whole.get(rate, {}).get(c["label"], {})
        n, tta = None, None
        if a.get("ok"):
            n, tta = steps_to(a["curve"], target), wall_to(a["curve"], target)
        step_ms = a.get("step_ms") if a.get("ok") else None
        held = a.get("held_ms") if a.get("ok") else None
        row["rates"][rate] = {
            "step_ms": step_ms,
            "held_ms": held,
            "hidden": hidden_share(step_ms, held, (local or {}).get(rate)),
            "time_to_target_s": tta,
            "bound_s": zero_comm_bound(n, (local or {}).get(rate)),
            "steps_to_target": n,
            "bytes_per_step": a.get("bytes_per_step"),
            "decisions": a.get("decisions"),
            "setup_s": a.get("setup_s"),
            "error": a.get("error"),
        }
    a = whole.get(rates[-1], {}).get(c["label"], {})
    ok = bool(a.get("ok"))
    row.update(
        accuracy=a.get("accuracy") if ok else None,
        steps_to_target=row["rates"][rates[-1]]["steps_to_target"],
        bytes_per_step=a.get("bytes_per_step") if ok else None,
        all_gather_bytes_per_step=None,
        bits_per_element=a.get("bits_per_element") if ok else None,
        advise_break_even_bps=None,
    )
    return row


def _fmt_s(v: float | None) -> str:
    return "not reached" if v is None else f"{v:.1f} s"


def _fmt_share(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.0f} %"


def _fmt_bps(v: float) -> str:
    if math.isinf(v):
        return "pays at any bandwidth"
    if v == 0:
        return "never pays"
    return f"break-even at {v / 1e9:.2f} Gbit/s"


def choice_lines(res: dict[str, Any]) -> list[str]:
    """gcodec's choice per rate: the contender ``gcodec advise`` picks there, its measured time to
    accuracy, and that time against the uncompressed run's."""
    choice = res.get("advise_choice") or {}
    if not choice:
        return []
    by_label = {r["label"]: r for r in res["rows"]}
    base = res["rows"][0]
    gbit = res.get("unlimited_bps", UNLIMITED_BPS) / 1e9
    links = res.get("links") or {}
    how = (
        "each rate's pick the largest saving that `gcodec advise --probe torch` measured for the model's "
        "exchange on the link the ranks see there, if more than a quarter of the dense exchange "
        "(a closer call picks none)"
        if any((lk or {}).get("measured") for lk in links.values())
        else "each rate priced on the link the ranks measured there with `gcodec advise --probe torch`"
        if any(links.values())
        else f"the unlimited loopback priced at {gbit:.0f} Gbit/s"
    )
    out = [
        "",
        f"gcodec's choice (the contender `gcodec advise` picks at each rate, {how}; "
        "none: the hook with every tensor dense):",
    ]
    for q in res["rates"]:
        lk = links.get(q)
        if lk:
            meas = lk.get("measured") or {}
            steps = ", ".join(
                f"{'dense' if k == 'null' else json.loads(k)['id']} {1e3 * v:.1f} ms" for k, v in meas.items()
            )
            out.append(
                f"- probed at {q}: allreduce {lk['bandwidth_bps'] / 1e9:.3g} Gbit/s (alpha "
                f"{lk['latency_s'] * 1e6:.0f} us), all-gather {lk['gather']['bandwidth_bps'] / 1e9:.3g} Gbit/s"
                + (f"; measured exchange: {steps}" if steps else "")
            )
    for q in res["rates"]:
        if q not in choice:
            continue
        label = choice[q] or ALL_DENSE
        row = by_label.get(label)
        t = row["rates"][q]["time_to_target_s"] if row else None
        b = base["rates"][q]["time_to_target_s"]
        ratio = f"{t / b:.2f}x uncompressed" if t is not None and b else "n/a"
        out.append(f"- {q}: advise picks {choice[q] or 'none'}; time to target {_fmt_s(t)} ({ratio})")
    return out


def adaptive_lines(res: dict[str, Any]) -> list[str]:
    """The adaptive controller's time to target against torch's best hook at every rate, and at
    the accuracy runs' rate also against the uncompressed run's wall time: the controller's times
    are wall times of whole runs (its probe, its calibration and every first-call cost included),
    the others' steps x median step, which leaves those out; the accuracy runs give the
    uncompressed run's wall time through the same link."""
    rows = [r for r in res["rows"] if r["label"] == ADAPTIVE]
    if not rows:
        return []
    ad, base, out = rows[0], res["rows"][0], []
    for q in res["rates"]:
        t = ad["rates"][q]["time_to_target_s"]
        torch = [r["rates"][q]["time_to_target_s"] for r in res["rows"] if r["hook"].startswith("torch-")]
        best = min((v for v in torch if v is not None), default=None)
        if t is None or best is None:
            continue
        line = f"- {q}: the adaptive controller {t:.1f} s, {t / best:.2f}x torch's best hook"
        wall = base["rates"][q].get("wall_to_target_s")
        if wall:
            line += f", {t / wall:.2f}x the uncompressed run's wall time ({wall:.1f} s)"
        setup = ad["rates"][q].get("setup_s")
        if setup is not None:  # DDP and the hook's set-up (its kernels loaded), before the first step
            line += f"; its setup (DDP and the hook's kernels) {setup:.2f} s"
            if wall:
                line += f", {(t + setup) / wall:.2f}x with it"
        out.append(line)
    return out


def bound_lines(res: dict[str, Any]) -> list[str]:
    """A table beside the main one: per contender and rate, its time to target over its
    zero-communication bound (:func:`zero_comm_bound`), the bound in brackets: the distance to
    shrink next. Empty where no rate has a bound (a run before the compute-only step was timed)."""
    rates = res["rates"]
    if not any(r["rates"][q].get("bound_s") for r in res["rows"] for q in rates):
        return []
    out = [
        "",
        "Time to target over the zero-communication bound (steps to the target x the compute-only step at "
        "that rate, in brackets):",
        "",
        "| contender | " + " | ".join(f"@ {q}" for q in rates) + " |",
        "|---" + "|---:" * len(rates) + "|",
    ]
    for r in res["rows"]:
        cells = []
        for q in rates:
            t, b = r["rates"][q]["time_to_target_s"], r["rates"][q].get("bound_s")
            cells.append("" if t is None or not b else f"{t / b:.2f}x ({b:.1f} s)")
        out.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return [*out, ""]


def markdown(res: dict[str, Any]) -> str:
    rates = res["rates"]
    head = ["contender", "bits/el", "final acc", "steps to target"]
    head += [f"step ms @ {r}" for r in rates] + [f"time to target @ {r}" for r in rates]
    head += [f"hidden @ {r}" for r in rates]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in res["rows"]:
        cells = [
            r["label"],
            "" if r["bits_per_element"] is None else f"{r['bits_per_element']:.2f}",
            "" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f} %",
            "not reached" if r["steps_to_target"] is None else str(r["steps_to_target"]),
        ]
        cells += ["" if r["rates"][q]["step_ms"] is None else f"{r['rates'][q]['step_ms']:.0f}" for q in rates]
        cells += [_fmt_s(r["rates"][q]["time_to_target_s"]) for q in rates]
        cells += [_fmt_share(r["rates"][q].get("hidden")) for q in rates]
        lines.append("| " + " | ".join(cells) + " |")
    best = []
    for q in rates:

        def tta(r: dict[str, Any], q: str = q) -> float:
            v = r["rates"][q]["time_to_target_s"]
            return math.inf if v is None else v

        codecs = [r for r in res["rows"] if r["hook"] == "gcodec" and r["label"] != ALL_DENSE]
        g = min(codecs, key=tta, default=None)
        t = min((r for r in res["rows"] if r["hook"].startswith("torch-")), key=tta, default=None)
        if g and t and math.isfinite(tta(g)) and math.isfinite(tta(t)):
            best.append(
                f"- {q}: best gcodec {g['label']} {tta(g):.1f} s, best torch hook {t['label']} {tta(t):.1f} s "
                f"({tta(g) / tta(t):.2f}x)"
            )
    local = res.get("local_step_ms") or {}
    if any(r["rates"][q].get("hidden") is not None for r in res["rows"] for q in rates):
        best.append(
            "- hidden @ rate: the share of gcodec's exchange (the seconds its hook held the gradients a step, "
            "median) hidden behind the backward pass, (compute-only step + exchange - step) / exchange, the "
            "compute-only step being DDP with a hook that sends nothing ("
            + ", ".join(f"{local[q]:.0f} ms @ {q}" for q in rates if local.get(q) is not None)
            + "); torch's hooks and plain DDP keep no such statistics"
        )
    best += adaptive_lines(res)
    best += bound_lines(res)
    base = res["rows"][0]
    cross = [
        f"- {r['label']}: measured, stops paying {measured_crossover(r, base, rates)}"
        + (
            ""
            if r["advise_break_even_bps"] is None
            else f"; gcodec advise predicts {_fmt_bps(r['advise_break_even_bps'])}"
        )
        for r in res["rows"][1:]
        if r["label"] != ALL_DENSE  # uncompressed through the hook: no codec to price
    ]
    if not any(r["advise_break_even_bps"] is not None for r in res["rows"]):
        cross.append("- gcodec advise: not available here (the hook is `advise_break_even` in bench/link.py)")
    rungs = ["none", "fp16", "uniform 8", "uniform 4", "top-k 1%", "PowerSGD r2"]  # gcodec.adaptive.DEFAULT_LADDER
    for r in res["rows"]:
        per = {q: v for q, v in r["rates"].items() if "decisions" in v}
        if not per:
            continue
        parts = []
        for q, v in per.items():
            moves = ", ".join(
                f"step {d['step']} {rungs[d['from']]} -> {rungs[d['to']]}" for d in v.get("decisions") or []
            )
            b = v.get("bytes_per_step")
            parts.append(
                f"{q}: {moves or 'no change'}"
                + ("" if b is None else f", {b / 1e6:.2f} MB a step")
                + ("" if v.get("steps_to_target") is None else f", target at step {v['steps_to_target']}")
            )
        cross.append(
            f"- {r['label']}: trained the whole schedule at every rate (its codecs follow the link; its time "
            "to target is the wall time of its steps up to the target, its decisions included); " + "; ".join(parts)
        )
    chk = advise_check_lines(res.get("advise_check"))
    if chk:
        local = res.get("local_step_ms") or {}
        chk = [
            "",
            "gcodec advise against these runs, on the link the ranks probed at each rate: the predicted step is "
            "the no-communication step ("
            + ", ".join(f"{local[q]:.0f} ms @ {q}" for q in res["advise_check"]["rates"])
            + ") plus advise's exchange; the crossover is where the step stops beating the uncompressed one "
            "(bench/link.py `crossover`), measured and predicted the same way on the same links; advise's own "
            "break-even, extrapolated from one link, beside them:",
            "",
            *chk,
        ]
    note = "\n".join(cross + choice_lines(res) + chk)
    return (
        f"{res['model']} ({res['params']:,} parameters), {res['workers']} gloo workers, target accuracy "
        f"{100 * res['target']:.1f} % (the uncompressed run's final), {res['elapsed_s'] / 60:.1f} min\n\n"
        + "\n".join(lines)
        + "\n\n"
        + "\n".join(best)
        + "\n"
        + note
        + "\n"
    )


def plot(res: dict[str, Any], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'gcodec[bench]')"
    rates = res["rates"]
    xs = [RATE_BITS[q] if math.isfinite(RATE_BITS[q]) else 100e9 for q in rates]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for r in res["rows"]:
        ys = [r["rates"][q]["time_to_target_s"] for q in rates]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            style = "--" if r["hook"].startswith("torch") else ("-" if r["hook"] == "gcodec" else ":")
            ax.plot(*zip(*pts), style, marker="o", label=r["label"], lw=2.2 if r["hook"] == "none" else 1.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs, [q if q != "unlimited" else "no limit" for q in rates])
    ax.set_xlabel("link rate (token bucket on the namespace's loopback)")
    ax.set_ylabel(f"time to {100 * res['target']:.1f} % test accuracy (s)")
    ax.set_title(f"{res['model']}, {res['workers']} gloo workers")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", type=lambda s: s.split(","), default=RATES, help="comma-separated, e.g. 1gbit,unlimited")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument(
        "--warmup",
        type=int,
        default=DEFAULTS.start_iter,
        help="gcodec's uncompressed steps before compression starts (default: HookState's, "
        f"{DEFAULTS.start_iter}); torch's PowerSGD keeps its own shortest, 2",
    )
    ap.add_argument("--timed-steps", type=int, default=10)
    ap.add_argument("--target", type=float, default=None, help="accuracy to reach (default: uncompressed final)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="MLP 64-256-256-10, 6 contenders, 2 epochs at 1gbit")
    ap.add_argument("--accuracy-from", metavar="FILE", help="reuse the accuracy runs of an earlier --json")
    ap.add_argument(
        "--unlimited-bps",
        type=float,
        default=UNLIMITED_BPS,
        help="the bandwidth gcodec advise is given for the unlimited loopback (bit/s)",
    )
    ap.add_argument(
        "--from-json", metavar="FILE", help="re-make the table and plot from an earlier --json (and ask gcodec advise)"
    )
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--markdown", metavar="FILE")
    ap.add_argument("--plot", metavar="FILE")
    args = ap.parse_args(argv)
    for q in args.rates:
        if q not in RATE_BITS:
            ap.error(f"unknown rate {q!r}: use {', '.join(RATES)}")
    if args.quick:
        args.rates, args.epochs, args.timed_steps = ["1gbit"], 2, 3
    try:
        if args.from_json:
            res = json.loads(Path(args.from_json).read_text())
            hidden = [int(h) for h in res["model"].split("-")[1:-1]]
            for r in res["rows"]:
                if r.get("advise_break_even_bps") is None:
                    r["advise_break_even_bps"] = advise_break_even(
                        r["codec"], hidden, res["workers"], r["label"].endswith("+ EF")
                    )
            if res.get("local_step_ms"):
                res["advise_check"] = advise_check(res)
        else:
            res = run(args)
    except NoNamespace as e:
        print(f"bench/link.py: skipped: {e}")
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": str(e)}))
        return 0
    md = markdown(res)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(md)
    if args.plot:
        why = plot(res, args.plot)
        print(why or f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
