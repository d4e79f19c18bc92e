"""The adaptive controller: synthetic timings move it up the ladder on a slow link and back down on
a fast one; quality bounds close rungs; a 2-rank mpiexec run switches at the same step on every rank
while the loss keeps falling."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gcodec.adaptive import DEFAULT_LADDER, AdaptiveController
from gcodec.advise import CodecSpeed
from gcodec.codecs import get_codec
from gcodec.errors import ConfigError
from gcodec.transports import Communicator, DoneWork, Router, Work, run_blocking

# Synthetic speeds per rung (seconds per element; bytes per element): fp16 cheap, top-k dearest.
# Keyed as the controller keys its ladder (each codec's full config), so that no rung falls back
# to a calibration on this machine, whose timings would make the decisions vary between runs.
SPEEDS = {
    json.dumps(None if c is None else get_codec(c).get_config(), sort_keys=True): CodecSpeed(0.0, enc, 0.0, dec, 0.0, b)
    for c, enc, dec, b in zip(
        DEFAULT_LADDER,
        [0.0, 0.2e-9, 0.5e-9, 0.6e-9, 4e-9, 3e-9],
        [0.0, 0.2e-9, 0.4e-9, 0.5e-9, 1e-9, 1e-9],
        [4.0, 2.0, 1.07, 0.57, 0.08, 0.0],  # PowerSGD's payload follows the shapes (predict's model)
    )
}
SHAPE = (25_000_000,)  # one vector: PowerSGD, the last rung, has no matrix to compress


class FakeComm(Communicator):
    """p ranks that all measured the same and agree: allreduce max is the identity, and an all-gather
    (the exchanges' control messages) returns p copies of this rank's words."""

    rank = 0

    def __init__(self, size: int) -> None:
        self.size = size
        self.reductions = 0

    def allreduce(self, arr: np.ndarray, op: str = "sum") -> Work:
        self.reductions += 1
        return DoneWork(arr)

    def allgather(self, arr: np.ndarray) -> Work:
        return DoneWork(np.stack([arr] * self.size))

    def allgatherv(self, buf: np.ndarray, counts: Sequence[int]) -> Work:
        return DoneWork([np.array(buf) for _ in counts])

    def alltoallv(self, bufs: Sequence[np.ndarray], recv_counts: Sequence[int]) -> Work:
        raise AssertionError("not used")


def _observe_loaded(ctl: AdaptiveController, rung: int, speed: CodecSpeed, n: int, payload: float) -> None:
    """Three steps of ``rung`` at ``n`` elements whose codec work took 10, 3 and 3 times ``speed``'s
    (the first step, which loads kernels, is not counted: the load factor becomes 3)."""
    for step, f in ((0, 10.0), (1, 3.0), (2, 3.0)):
        rec = {"codec": ctl.ladder[rung], "step": step, "encode_s": f * speed.encode_seconds(n)}
        rec.update(decode_s=f * speed.decode_seconds(n), payload_bytes=payload, wire_bytes=payload, comm_s=0.01)
        ctl.observe("w", rec, error_feedback=True)


def _ctl(bandwidth: str, **kw) -> AdaptiveController:
    # prior_load=1: SPEEDS are the job's own figures here (the prior: its own test)
    settings = {"interval": 10, "warmup_steps": 0, "prior_load": 1.0, **kw}
    return AdaptiveController(bandwidth=bandwidth, speeds=SPEEDS, **settings)


def test_the_synthetic_speeds_cover_every_rung() -> None:
    ctl = _ctl("1Gbit")
    assert all(k in SPEEDS for k in ctl._keys)  # else a rung would be timed on this machine


def _rung(ctl: AdaptiveController, workers: int = 4, current: int = 0) -> int:
    return ctl.choose(ctl.figures("w", int(np.prod(SHAPE))), SHAPE, workers, current)[0]


def test_powersgd_is_never_priced_for_a_key_without_a_matrix() -> None:
    ctl = _ctl("100Mbit")
    _, times = ctl.choose(ctl.figures("w", int(np.prod(SHAPE))), SHAPE, 4, 0)
    assert ctl.ladder[5]["id"] == "powersgd" and times[5] == float("inf") and np.isfinite(times[4])


# A DDP bucket of a 5000 x 5000 weight and its bias: 25 M elements as in SHAPE.
BUCKET = [(5000, 5000), (5000,)]


def test_a_bucket_of_matrices_on_a_slow_link_takes_powersgd() -> None:
    """At 100 Mbit/s on 4 ranks, PowerSGD rank 2's factors are 4 (5000 + 5000) 2 = 80 kB, summed
    (1.5 x that on the wire: 10 ms) with the 20 kB bias dense beside them, against top-k 1 %'s 2 MB
    in two phases (1.5 x that: 0.24 s); their codec seconds are alike (SPEEDS), so PowerSGD's step
    is predicted at well under half of top-k's."""
    ctl = _ctl("100Mbit")
    figs = ctl.figures("w", 25_005_000)
    rung, times = ctl.choose(figs, (25_005_000,), 4, 0, BUCKET)
    assert rung == 5 and times[5] < times[4] / 2, times
    assert _rung(_ctl("10Tbit"), current=5) == 0  # and a fast link still goes back to dense


def test_every_rank_prices_the_low_rank_rung_from_the_agreed_figures() -> None:
    """Two ranks whose own calibrations of PowerSGD differ 100x, handed the same (allreduced)
    figures, predict the same seconds for every rung, so they take the same rung: a rank-local
    calibration in the price would let them disagree and fail the exchange."""
    key = json.dumps(get_codec({"id": "powersgd", "rank": 2}).get_config(), sort_keys=True)
    slow = dict(SPEEDS)
    slow[key] = CodecSpeed(0.0, 3e-7, 0.0, 1e-7, 0.0, 0.0)
    a = _ctl("1Gbit")
    b = AdaptiveController(bandwidth="1Gbit", speeds=slow, interval=10, warmup_steps=0, prior_load=1.0)
    agreed = np.maximum(a.figures("w", 25_005_000), b.figures("w", 25_005_000))
    ta = a.choose(agreed, (25_005_000,), 2, 0, BUCKET)
    tb = b.choose(agreed, (25_005_000,), 2, 0, BUCKET)
    assert ta == tb
    # the agreed figures carry the slower rank's PowerSGD seconds: 100x its encode prices it out
    assert ta[0] != 5 and a.choose(a.figures("w", 25_005_000), (25_005_000,), 2, 0, BUCKET)[0] == 5


def test_slow_link_moves_to_a_strong_codec() -> None:
    assert _rung(_ctl("100Mbit")) == 4  # top-k: 100 MB at 12.5 MB/s is seconds; top-k's 0.1 s encode is nothing
    assert _rung(_ctl("1Gbit")) >= 2


def test_fast_link_goes_back_to_fp16_or_none() -> None:
    assert _rung(_ctl("100Gbit"), current=4) in (0, 1)
    assert _rung(_ctl("10Tbit"), current=4) == 0


def test_hysteresis_keeps_the_current_rung_for_small_gains() -> None:
    ctl = _ctl("1Gbit", hysteresis=0.99)
    assert _rung(ctl, current=1) == 1


def test_a_rung_out_of_bounds_closes_it_and_every_stronger_one() -> None:
    ctl = _ctl("100Mbit")
    ctl.measured["w"] = [{} for _ in DEFAULT_LADDER]
    ctl.measured["w"][3]["bad"] = 1.0
    rung, times = ctl.choose(ctl.figures("w", int(np.prod(SHAPE))), SHAPE, 4, 0)
    assert rung == 2 and times[3] == times[4] == float("inf")


def test_low_norm_ratio_without_feedback_marks_the_rung_bad() -> None:
    ctl = _ctl("100Mbit")
    rec = {
        "codec": ctl.ladder[4],
        "step": 3,
        "encode_s": 0.1,
        "decode_s": 0.01,
        "payload_bytes": 1000,
        "wire_bytes": 1000,
        "comm_s": 0.01,
        "quality": {"norm_ratio": 0.3, "norm": 1.0, "residual_norm": None},
    }
    ctl.observe("w", rec, error_feedback=False)
    assert ctl.measured["w"][4]["bad"] == 1.0
    for step in range(4, 12):  # healthy samples pull the moving average back over 0.9
        ctl.observe("w", dict(rec, step=step, quality={"norm_ratio": 1.0, "norm": 1.0, "residual_norm": 5.0}), True)
    assert ctl.measured["w"][4]["bad"] == 0.0
    ctl.observe("w", dict(rec, step=12, quality={"norm_ratio": 1.0, "norm": 1.0, "residual_norm": 50.0}), True)
    assert ctl.measured["w"][4]["bad"] == 1.0  # with feedback, a residual backlog over 20 x the norm


def _probed(bandwidth_bps: float, **kw) -> AdaptiveController:
    """A controller whose link was probed (not declared) at ``bandwidth_bps``."""
    from gcodec.advise import Link, LinkFit

    ctl = AdaptiveController(speeds=SPEEDS, **{"interval": 10, "warmup_steps": 0, "prior_load": 1.0, **kw})
    ctl.probed, ctl._probe_done = LinkFit(Link(bandwidth_bps, ctl.latency_s), 0, (), 0.0, "test"), True
    return ctl


def _ran(ctl: AdaptiveController, rung: int, held_s: float, steps: range) -> None:
    """Records of ``steps`` steps on ``rung`` whose codec seconds are SPEEDS' (so the load factor
    stays 1) and whose bucket was held ``held_s``."""
    for step in steps:
        ctl.observe("w", _record(ctl, rung, held_s, step), error_feedback=True)


def _record(ctl: AdaptiveController, rung: int, held_s: float, step: int) -> dict:
    """An engine's record of one step of key "w" on ``rung``: SPEEDS' codec seconds and bytes for
    SHAPE, the bucket held ``held_s``."""
    n = int(np.prod(SHAPE))
    sp = SPEEDS[ctl._keys[rung]]
    return {
        "codec": "dense" if ctl.ladder[rung] is None else ctl.ladder[rung],
        "step": step,
        "mode": "summable",
        "encode_s": sp.encode_seconds(n),
        "decode_s": sp.decode_seconds(n),
        "payload_bytes": sp.payload_bytes(n),
        "wire_bytes": sp.payload_bytes(n),
        "comm_s": 0.01,
        "held_s": held_s,
    }


def test_a_rung_measured_slower_than_dense_goes_back_to_dense_and_stays() -> None:
    """A ladder of dense and top-k 1 % on a probed 300 Mbit/s link, 2 ranks: the model prices
    dense's 100 MB at 2.67 s, top-k at its codec seconds (0.125 s for 25 M elements) plus 2 MB of
    indices and values, 0.2 s, so it takes top-k. Measured in the job, the top-k bucket took 4 s
    (cores shared with the backward pass), dense 2.7 s: back to dense at the next decision, and not
    up again while the link is the same."""
    ladder = (None, {"id": "topk", "ratio": 0.01})
    ctl = _probed(3e8, ladder=ladder)
    assert _rung(ctl, workers=2) == 1  # the model alone
    _ran(ctl, 0, 2.7, range(0, 5))
    _ran(ctl, 1, 4.0, range(5, 10))
    rung, times = ctl.choose(ctl.figures("w", int(np.prod(SHAPE))), SHAPE, 2, 1)
    assert rung == 0 and times == pytest.approx([2.7, 4.0]), times
    assert _rung(ctl, workers=2, current=0) == 0
    # a rank that did not measure the rung (no link for it) agreed with one that did: no excess
    figs = ctl.figures("w", int(np.prod(SHAPE)))
    figs[5 * 2 + 1] = 0.0
    assert ctl.choose(figs, SHAPE, 2, 0)[0] == 1
    # a declared link is priced by the model alone: the job's seconds were not measured on it
    declared = _ctl("300Mbit", ladder=ladder)
    declared.measured = ctl.measured
    assert _rung(declared, workers=2, current=0) == 1


def test_a_measured_excess_moves_with_the_link_and_unmeasured_rungs_pay_the_least_one() -> None:
    """The excess a rung measured over the model (top-k: 4 s held against its 0.2 s price at
    300 Mbit/s) is added to its price on a later link, not frozen as a figure: at 10 Mbit/s dense's
    100 MB take 80 s, uniform 4 bits 11.4 s, and top-k (1.75 s + 3.8 s) pays again. A rung never
    run pays the least excess of those that ran (the waits every rung measures), here dense's
    0.05 s."""
    ctl = _probed(3e8)
    fresh = ctl.choose(ctl.figures("w", int(np.prod(SHAPE))), SHAPE, 2, 0)[1]
    _ran(ctl, 0, fresh[0] + 0.05, range(0, 5))
    _ran(ctl, 4, 4.0, range(5, 10))
    rung, times = ctl.choose(ctl.figures("w", int(np.prod(SHAPE))), SHAPE, 2, 0)
    assert rung == 3 and times[4] == pytest.approx(4.0), times
    for r in (1, 2, 3):
        assert times[r] == pytest.approx(fresh[r] + 0.05), (r, times, fresh)
    slow = _probed(1e7)
    slow.measured = ctl.measured
    bare = _probed(1e7)
    fresh_slow = bare.choose(bare.figures("w", int(np.prod(SHAPE))), SHAPE, 2, 0)[1]
    rung, times = slow.choose(slow.figures("w", int(np.prod(SHAPE))), SHAPE, 2, 0)
    assert rung == 4 and times[4] == pytest.approx(fresh_slow[4] + (4.0 - fresh[4])), (times, fresh_slow)


def test_decisions_through_select_follow_the_link_and_agree_with_an_allreduce() -> None:
    ctl = _ctl("100Mbit", trial_steps=None)  # the interval's grid (trials: the test below)
    ps = Router(controller=ctl)
    comm = FakeComm(4)
    got = []
    for step in range(40):
        if step == 20:
            ctl.bandwidth_bps = 1e13
        got.append(run_blocking(ctl.select(comm, ps, "w", SHAPE, step)))
    assert got[0] == ctl.ladder[4] and got[19] == got[0]
    assert got[20] is None and got[39] is None
    assert comm.reductions == 4  # one per decision step (0, 10, 20, 30), none in between
    assert [(d["step"], d["from"], d["to"]) for d in ctl.decisions if d["from"] != d["to"]] == [(0, 0, 4), (20, 4, 0)]


def test_warmup_rungs_decide_the_first_step_among_the_light_rungs_then_the_whole_ladder() -> None:
    """With ``warmup_rungs=3`` the controller decides at step 0 too, among none / fp16 / uniform 8
    only, keeps that rung through the 10 warm-up steps, and decides among every rung from step 10.
    At 100 Mbit/s on 4 ranks the 25 M-element key's step is its bytes on the wire: uniform 8 (1.07
    bytes per element) is the cheapest light rung and top-k (0.08) the cheapest of all; at 10 Tbit/s
    dense costs nothing on the wire and no codec seconds, so it warms up dense."""
    for bandwidth, warm, after in (("100Mbit", 2, 4), ("10Tbit", 0, 0)):
        ctl = _ctl(bandwidth, warmup_rungs=3, trial_steps=None)  # (trials: the test below)
        ctl.warmup_steps = 10
        comm = FakeComm(4)
        ps = Router(controller=ctl)
        got = [run_blocking(ctl.select(comm, ps, "w", SHAPE, step)) for step in range(30)]
        assert got[:10] == [ctl.ladder[warm]] * 10 and got[10:] == [ctl.ladder[after]] * 20, bandwidth
        assert [d["step"] for d in ctl.decisions] == [0, 10, 20]  # no decision inside the warm-up
        assert comm.reductions == 3
        assert all(t == float("inf") for t in ctl.decisions[0]["predicted_s"][3:])  # strong rungs closed
        assert np.isfinite(ctl.decisions[1]["predicted_s"][3])
    # without it, warm-up is ``start`` and the first decision is at warmup_steps
    ctl = AdaptiveController(bandwidth="100Mbit", speeds=SPEEDS, interval=10, warmup_steps=10, start=1)
    got = [run_blocking(ctl.select(FakeComm(4), Router(controller=ctl), "w", SHAPE, step)) for step in range(11)]
    assert got[:10] == [ctl.ladder[1]] * 10 and got[10] == ctl.ladder[4]


def test_an_unrun_rung_is_taken_on_trial_and_its_first_step_is_not_timed() -> None:
    """Dense and top-k 1 % on a probed 300 Mbit/s link, 2 ranks. Dense runs 5 warm-up steps (held
    2.7 s); the model then prices top-k at 0.2 s plus dense's measured excess and takes it, on
    trial: the key decides again 3 steps later, not 10. Top-k's first step (40 s: kernels loaded,
    residuals moved) is not a sample; its next two (4 s each) are, so the decision at step 8 sets
    4 s against dense's 2.7 and goes back to dense, which it has run: no trial, the next decision
    an interval later."""
    ladder = (None, {"id": "topk", "ratio": 0.01})
    ctl = _probed(3e8, ladder=ladder, warmup_steps=5)
    ps = Router(controller=ctl)
    comm = FakeComm(2)
    held = {0: 2.7, 1: 4.0}
    got = []
    for step in range(20):
        codec = run_blocking(ctl.select(comm, ps, "w", SHAPE, step))
        rung = ctl._rung_of(codec)
        got.append(rung)
        first = step > 0 and got[-2] != rung
        _ran_one(ctl, ps, rung, 40.0 if first else held[rung], step)
    assert got == [0] * 5 + [1] * 3 + [0] * 12, got
    assert [(d["step"], d["from"], d["to"]) for d in ctl.decisions] == [(5, 0, 1), (8, 1, 0), (18, 0, 0)]
    assert ctl.measured["w"][1]["exchange_s"] == 4.0 and ctl.measured["w"][0]["exchange_s"] == 2.7
    assert ctl.next_decision["w"] == 28
    # the same without trials: top-k for the whole interval
    ctl = _probed(3e8, ladder=ladder, warmup_steps=5, trial_steps=None)
    ps = Router(controller=ctl)
    got = []
    for step in range(16):
        rung = ctl._rung_of(run_blocking(ctl.select(comm, ps, "w", SHAPE, step)))
        got.append(rung)
        _ran_one(ctl, ps, rung, held[rung], step)
    assert got == [0] * 5 + [1] * 10 + [0], got


def test_unmeasured_codec_seconds_are_the_calibration_times_the_prior_load_until_a_rung_ran() -> None:
    """Before any rung of a key ran, its codec seconds are SPEEDS' times ``prior_load`` (2); once
    fp16 ran at 3x its calibration (its first step, 10x, not counted), every unrun rung is priced at
    3x, the measured factor."""
    ctl = AdaptiveController(bandwidth="1Gbit", speeds=SPEEDS, interval=10, warmup_steps=0)
    n = int(np.prod(SHAPE))
    nr = len(ctl.ladder)
    sp = [SPEEDS[k] for k in ctl._keys]
    figs = ctl.figures("w", n)
    for r in range(1, nr):
        assert figs[r] == pytest.approx(2 * sp[r].encode_seconds(n)) and figs[nr + r] == pytest.approx(
            2 * sp[r].decode_seconds(n)
        )
    _observe_loaded(ctl, 1, sp[1], n, 2 * n)
    assert ctl.load_factor("w", n) == pytest.approx(3.0)
    figs = ctl.figures("w", n)
    assert figs[1] == pytest.approx(3 * sp[1].encode_seconds(n))  # fp16's own (measured) seconds
    assert figs[2] == pytest.approx(3 * sp[2].encode_seconds(n)) and figs[nr + 4] == pytest.approx(
        3 * sp[4].decode_seconds(n)
    )


def _ran_one(ctl: AdaptiveController, ps: Router, rung: int, held_s: float, step: int) -> None:
    """Record one step of key "w" on ``rung`` in ``ps`` as an engine does (the controller reads it
    at the next select)."""
    ps.record("w", _record(ctl, rung, held_s, step))


def test_controller_state_round_trips() -> None:
    ctl = _ctl("100Mbit")
    ps = Router(controller=ctl)
    run_blocking(ctl.select(FakeComm(4), ps, "w", SHAPE, 0))
    back = _ctl("100Mbit")
    back.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert back.level == {"w": 4} and back.state_dict() == ctl.state_dict()
    with pytest.raises(ConfigError):
        AdaptiveController(ladder=[None, "fp16"]).load_state_dict({"level": {"w": 4}})


@pytest.mark.parametrize(
    "kw",
    [
        {"ladder": []},
        {"start": 9},
        {"interval": 0},
        {"bandwidth": "slow"},
        {"warmup_rungs": 0},
        {"warmup_rungs": 7},
        {"trial_steps": 1},
        {"prior_load": 0.0},
        {"prior_load": float("nan")},
        {"calibration": "never"},
        {"link": {"latency_s": 1e-4}},
        {"link": {"bandwidth_bps": 0.0}},
        {"link": 1e9},
    ],
)
def test_bad_settings_are_config_errors(kw) -> None:
    with pytest.raises(ConfigError):
        AdaptiveController(**kw)


@pytest.mark.mpi
def test_two_mpi_ranks_switch_at_the_same_step_and_the_loss_keeps_falling(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    from tests.procs import run_mpi

    proc = run_mpi("tests.transport_ranks.adaptive_mpi", [str(tmp_path)], 2, 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert r["ok"], r.get("error")
    assert res[0]["switches"] == res[1]["switches"] and res[0]["decisions"] == res[1]["decisions"]
    sw = res[0]["switches"]
    assert len(sw) >= 2, sw
    assert sw[0][2] is not None and sw[0][0] == 5  # up the ladder at the first decision (slow link)
    # and down at the first decision after the change (every 10 steps, sooner after a trial of 3)
    assert 60 <= sw[-1][0] <= 70 and (sw[-1][2] == "dense" or sw[-1][2]["id"] == "fp16"), sw
    assert sw[-1][0] in [dd[0] for dd in res[0]["decisions"]]
    losses = res[0]["losses"]
    assert losses == res[1]["losses"]
    assert losses[-1] < 1e-2 * losses[0]
    windows = [np.mean(losses[i : i + 20]) for i in range(0, 120, 20)]
    assert all(b < a for a, b in itertools.pairwise(windows)), windows


def test_controller_drives_the_ddp_hook_and_fsdp2_on_two_gloo_ranks(tmp_path: Path) -> None:
    """The same controller through the router of the DDP hook (one rung per bucket) and of FSDP2's
    reduce-scatter (one rung per module): on a slow link it leaves dense, on a fast one it comes
    back, both ranks take the same decisions at the same steps, and training still converges
    with the replicas' parameters bit-identical (DDP's are replicas; FSDP's full parameters are
    gathered on both ranks)."""
    pytest.importorskip("torch")
    from tests.procs import checks_of, run_ranks

    codes = run_ranks("tests.transport_ranks.adaptive_torch", [str(tmp_path)], 2, 300, tmp_path)
    assert codes == [0, 0]
    checks = checks_of(tmp_path, range(2))
    assert len(checks) == 2 * 11
    res = [json.loads((tmp_path / f"decisions{r}.json").read_text()) for r in range(2)]
    for engine in ("ddp", "fsdp"):
        assert res[0][engine]["switches"] == res[1][engine]["switches"], engine
        assert res[0][engine]["decisions"] == res[1][engine]["decisions"], engine
        assert res[0][engine]["params"] == res[1][engine]["params"], engine
    assert {d[0] for d in res[0]["fsdp"]["decisions"]} >= {"0", "1"}  # each FSDP module decides for itself


def test_one_slow_step_does_not_move_a_key_off_its_rung() -> None:
    """A rank descheduled once (a 100x slower encode on a busy machine) must not poison the rung's
    figures: seconds are the median of the last 5 samples, so one spike among steady ones is dropped
    and the slow-link choice stays; a sustained slowdown (3 of 5) does move the median."""
    ctl = _ctl("100Mbit")
    rec = {"codec": ctl.ladder[4], "encode_s": 0.1, "decode_s": 0.01, "payload_bytes": 1000, "wire_bytes": 1000}
    rec["comm_s"] = 0.01
    for step in range(4):
        ctl.observe("w", dict(rec, step=step), error_feedback=True)
    ctl.observe("w", dict(rec, step=4, encode_s=100.0), error_feedback=True)  # the spike
    assert ctl.measured["w"][4]["encode_s"] == 0.1
    assert _rung(ctl, current=4) == 4
    for step in range(5, 8):
        ctl.observe("w", dict(rec, step=step, encode_s=100.0), error_feedback=True)
    assert ctl.measured["w"][4]["encode_s"] == 100.0
    assert _rung(ctl, current=4) != 4
    sd = ctl.state_dict()
    again = _ctl("100Mbit")
    again.load_state_dict(json.loads(json.dumps(sd)))  # the windows are plain lists: JSON-safe
    assert again.measured["w"][4]["encode_s_last"] == sd["measured"]["w"][4]["encode_s_last"]


class TimedComm(FakeComm):
    """FakeComm whose allreduces of more than a handful of elements take ``alpha`` plus
    ``s_per_byte`` seconds per byte: a link of known alpha and beta for the probe to measure."""

    def __init__(self, size: int, alpha: float, s_per_byte: float) -> None:
        super().__init__(size)
        self.alpha, self.s_per_byte = alpha, s_per_byte

    def allreduce(self, arr: np.ndarray, op: str = "sum") -> Work:
        if arr.size > 64:
            time.sleep(self.alpha + arr.nbytes * self.s_per_byte)
        return super().allreduce(arr, op)


def test_the_probe_measures_the_link_once_and_prices_the_decision_with_it() -> None:
    # t = 2 alpha + bytes * s at p = 2 (fit_link's ring model): beta = 1 / s bytes per second
    ctl = AdaptiveController(speeds=SPEEDS, interval=10, warmup_steps=0)
    comm = TimedComm(2, 1e-3, 4e-9)
    ps = Router(controller=ctl)
    run_blocking(ctl.select(comm, ps, "w", SHAPE, 0))
    assert ctl.probed is not None
    bw = ctl.probed.link.bandwidth_bps
    # time.sleep overshoots by up to about a millisecond on a loaded machine: against 1 to 18 ms
    # per sample that moves the slope by well under half and alpha (0.5 ms) by under 0.5 ms
    assert 0.5 * 8 / 4e-9 < bw < 1.5 * 8 / 4e-9
    assert 0.2e-3 < ctl.latency_s < 1.5e-3
    assert ctl.figures("w", 1000)[-1] == -8.0 / bw  # the decision's link is the probe's
    n = comm.reductions
    run_blocking(ctl.select(comm, ps, "w", SHAPE, 10))
    assert comm.reductions == n + 1  # later decisions: the figures' allreduce only
    back = AdaptiveController(speeds=SPEEDS, interval=10, warmup_steps=0)
    back.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert back.probed.link.bandwidth_bps == bw and back._probe_done  # a resumed job does not probe again


def test_a_slow_link_stops_the_probe_after_two_sizes() -> None:
    ctl = AdaptiveController(speeds=SPEEDS, interval=10, warmup_steps=0)
    comm = TimedComm(2, 0.0, 1e-6)  # 16 KB take 16 ms, 256 KB 0.26 s: 4 MB would take 4 x 4.2 s
    run_blocking(ctl.select(comm, Router(controller=ctl), "w", SHAPE, 0))
    assert ctl.probed is not None and len(ctl.probed.samples) == 2
    assert 0.7 * 8e6 < ctl.probed.link.bandwidth_bps < 1.3 * 8e6


def test_a_fast_link_takes_every_probe_size() -> None:
    """At 1e-11 s per byte (800 Gbit/s) the 256 KB allreduce takes 2.6 us of link (plus sleep's
    overshoot, under a millisecond on a loaded machine): 16 x that, four times, stays under
    PROBE_MAX_S (0.1 s) unless one sample overshoots by over 1.5 ms, so the probe goes on to 4 MB."""
    from gcodec.adaptive import PROBE_SIZES

    ctl = AdaptiveController(speeds=SPEEDS, interval=10, warmup_steps=0)
    run_blocking(ctl.select(TimedComm(2, 0.0, 1e-11), Router(controller=ctl), "w", SHAPE, 0))
    assert [b for b, _ in (ctl.probed.samples if ctl.probed else [])] == [4 * n for n in PROBE_SIZES]


def test_a_probe_whose_times_are_still_the_latency_takes_the_next_size_even_when_dear() -> None:
    """3 ms a message and 1e-10 s a byte: 16 KB and 256 KB both take about 3 ms (the latency), so
    the bandwidth does not show yet; the 4 MB size, priced at 4 x 16 x 3 ms = 0.19 s (over
    PROBE_MAX_S), is taken anyway. (time.sleep overshoots by up to about a millisecond on a loaded
    machine: 256 KB could read up to 4 ms against 16 KB's 3, under PROBE_GROWTH's 4 times.)"""
    ctl = AdaptiveController(speeds=SPEEDS, interval=10, warmup_steps=0)
    run_blocking(ctl.select(TimedComm(2, 3e-3, 1e-10), Router(controller=ctl), "w", SHAPE, 0))
    assert ctl.probed is not None and len(ctl.probed.samples) == 3


def test_a_given_link_is_not_probed_again_and_is_priced_as_a_probed_one() -> None:
    """``link=`` (what gcodec advise --probe measured, as its JSON writes it) replaces the probe:
    the first decision runs one allreduce (the figures), not the probe's dozen, prices the rung on
    that link, and decides as a controller that had probed the same link."""
    link = {"bandwidth_bps": 3e8, "latency_s": 2e-4}
    given = AdaptiveController(speeds=SPEEDS, interval=10, prior_load=1.0, link=link)
    assert given.latency_s == 2e-4
    comm = TimedComm(2, 1e-3, 4e-9)
    got = run_blocking(given.select(comm, Router(controller=given), "w", SHAPE, 0))
    assert comm.reductions == 1 and given.figures("w", 1000)[-1] == -8.0 / 3e8
    probed = _probed(3e8, latency_s=2e-4)
    assert got == run_blocking(probed.select(FakeComm(2), Router(controller=probed), "w", SHAPE, 0))
    assert given.decisions[0]["predicted_s"] == pytest.approx(probed.decisions[0]["predicted_s"])
    from gcodec.advise import Link

    assert AdaptiveController(link=Link(1e9, 1e-4)).probed.link == Link(1e9, 1e-4)


def test_by_default_a_key_starts_on_the_rung_the_model_picks_and_times_it_on_trial() -> None:
    """The defaults decide at a key's first step among every rung (no warm-up on dense or a light
    rung): at 100 Mbit/s on 4 ranks the 25 M-element key starts on top-k 1 %, which no rank has
    run, so it decides again 3 steps later from what those steps measured."""
    ctl = AdaptiveController(bandwidth="100Mbit", speeds=SPEEDS, prior_load=1.0)
    ps = Router(controller=ctl)
    got = run_blocking(ctl.select(FakeComm(4), ps, "w", SHAPE, 0))
    assert got == ctl.ladder[4] and ctl.decisions[0]["step"] == 0 and ctl.next_decision["w"] == 3


def test_the_first_compressed_steps_calibrate_the_priors_of_the_rungs_not_run() -> None:
    """Without speeds, an unrun rung costs its prior (PRIOR_SPEEDS) times the prior load (2); once
    uniform 8 ran at 3 times its prior (its first step, 10 times, not counted), every unrun rung
    is priced at 3 times its prior: the job's own steps are the calibration."""
    import gcodec.adaptive as adaptive

    ctl = AdaptiveController(bandwidth="1Gbit")
    n, nr = 1 << 22, len(ctl.ladder)
    prior = [adaptive.PRIOR_SPEEDS.get(k) for k in ctl._keys]
    figs = ctl.figures("w", n)
    assert figs[4] == pytest.approx(2 * prior[4].encode_seconds(n))
    assert figs[nr + 4] == pytest.approx(2 * prior[4].decode_seconds(n))
    _observe_loaded(ctl, 2, prior[2], n, 1.07 * n)
    assert ctl.load_factor("w", n) == pytest.approx(3.0)
    figs = ctl.figures("w", n)
    for r in (1, 3, 4, 5):
        assert figs[r] == pytest.approx(3 * prior[r].encode_seconds(n)), r
        assert figs[nr + r] == pytest.approx(3 * prior[r].decode_seconds(n)), r


def test_a_probe_that_cannot_fit_leaves_the_exchanges_measure() -> None:
    ctl = AdaptiveController(speeds=SPEEDS, interval=10, warmup_steps=0)
    comm = TimedComm(2, 3e-3, -4e-10)  # larger allreduces take less time (3 ms down to 1.3 ms): no beta
    run_blocking(ctl.select(comm, Router(controller=ctl), "w", SHAPE, 0))
    assert ctl.probed is None and ctl.figures("w", 1000)[-1] == -8.0 / 1e9


def test_the_router_calibrates_a_controller_when_it_is_installed(monkeypatch) -> None:
    """With ``calibration="setup"`` the codecs are timed once, through the transports' protocol
    with the engine's error feedback and mode, when an engine's router takes the controller (its
    setup), not at the first decision inside a training step; installing it again times nothing
    more."""
    import gcodec.adaptive as adaptive
    from gcodec.transports.router import Router

    timed: list = []

    def fake(codec, workers=2, **kw):
        if codec is not None:
            timed.append((codec, workers, kw["error_feedback"], kw["mode"]))
        return CodecSpeed(0.0, 1e-9, 0.0, 1e-9, 0.0, 1.0)

    monkeypatch.setattr(adaptive, "measure_protocol_speed", fake)
    ctl = AdaptiveController(ladder=[None, "fp16", {"id": "uniform", "bits": 8}], calibration="setup")
    assert timed == []
    Router(controller=ctl, error_feedback=True, mode="gather")
    assert timed == [(c, 2, True, "gather") for c in ctl.ladder[1:]]  # every codec once, in ladder order
    Router(controller=ctl)
    assert len(timed) == 2


def test_by_default_nothing_is_timed_and_a_rung_without_a_prior_is_timed_at_its_first_decision(monkeypatch) -> None:
    """The default calibration ("steps"): a router that takes the controller times nothing; the
    default ladder's rungs are priced from PRIOR_SPEEDS (times the prior load); a rung of one's own
    with no prior (uniform 2 bits) is timed once, with the engine's error feedback and mode, when
    a decision first prices it."""
    import gcodec.adaptive as adaptive

    timed: list = []

    def fake(codec, workers=2, **kw):
        if codec is not None:
            timed.append((codec, kw["error_feedback"], kw["mode"]))
        return CodecSpeed(0.0, 1e-9, 0.0, 1e-9, 0.0, 0.75)

    monkeypatch.setattr(adaptive, "measure_protocol_speed", fake)
    two = get_codec({"id": "uniform", "bits": 2}).get_config()
    ctl = AdaptiveController(ladder=[None, "fp16", two], bandwidth="1Gbit")
    ps = Router(controller=ctl, error_feedback=True, mode="gather")
    assert timed == []
    n = 1 << 20
    figs = ctl.figures("w", n)
    assert timed == [(two, True, "gather")]
    prior = adaptive.PRIOR_SPEEDS[ctl._keys[1]]
    assert figs[1] == pytest.approx(2.0 * prior.encode_seconds(n)) and figs[3 + 1] == pytest.approx(
        2.0 * prior.decode_seconds(n)
    )
    assert figs[6 + 1] == pytest.approx(prior.payload_bytes(n)) and figs[6 + 2] == pytest.approx(0.75 * n)
    run_blocking(ctl.select(FakeComm(2), ps, "w", (n,), 0))
    assert len(timed) == 1  # once per rung


def test_the_priors_cover_the_default_ladder_and_match_the_codecs_payloads() -> None:
    """Every codec of DEFAULT_LADDER has a prior, and the prior's payload per element is the
    codec's own (as the protocol's statistics count it, within 2 % at 1 Mi elements: top-k's delta
    coded indices vary with the data); PowerSGD's payload follows the shapes (0 here)."""
    import gcodec.adaptive as adaptive
    from gcodec.advise import measure_protocol_speed

    ctl = AdaptiveController()
    for k, cfg in zip(ctl._keys[1:], ctl.ladder[1:]):
        prior = adaptive.PRIOR_SPEEDS[k]
        if cfg["id"] == "powersgd":
            assert prior.payload_per_element == 0.0
            continue
        got = measure_protocol_speed(cfg, 2, error_feedback=True, sizes=(1 << 12, 1 << 20), repeats=1)
        n = 1 << 20
        assert prior.payload_bytes(n) == pytest.approx(got.payload_bytes(n), rel=0.02), cfg


def test_the_protocol_calibration_reads_the_steps_own_figures() -> None:
    """measure_protocol_speed fits its line through what the protocol's step statistics recorded:
    fp16's payload grows by exactly 2 bytes per element (a constant header), its encode and decode
    seconds are positive, and dense is free at 4 bytes per element."""
    from gcodec.advise import measure_protocol_speed

    sp = measure_protocol_speed("fp16", 2, error_feedback=True, sizes=(1 << 12, 1 << 14), repeats=1)
    assert sp.payload_per_element == 2.0 and sp.payload_t0 > 0
    assert sp.encode_seconds(1 << 14) > 0 and sp.decode_seconds(1 << 14) > 0
    dense = measure_protocol_speed(None)
    assert dense.payload_per_element == 4.0 and dense.encode_seconds(1 << 20) == 0.0


def test_the_calibration_loads_the_kernels_a_step_calls() -> None:
    """In a fresh process no signature of the fused fp16 error-feedback kernel is loaded; after
    the protocol's calibration of fp16 with error feedback one is, so a job's first fp16 step does
    not load it."""
    import os
    import sys

    from tests.procs import own_env, run

    code = (
        "import gcodec.kernels.cpu.cast as K\n"
        "from gcodec.advise import measure_protocol_speed\n"
        "ks = (K._feedback_f16_range, K._feedback_f16_range_v)\n"
        "before = sum(len(k.signatures) for k in ks)\n"
        "measure_protocol_speed('fp16', 2, error_feedback=True, sizes=(1024, 4096))\n"
        "print(before, sum(len(k.signatures) for k in ks))\n"
    )
    out = run([sys.executable, "-c", code], 300, cwd=os.getcwd(), env=own_env(), check=True)
    before, after = map(int, out.stdout.split())
    assert before == 0 and after >= 1, out.stdout
