"""bench/link.py's emulated link: the namespace is shaped as asked and always removed."""

from __future__ import annotations

import math
import os
import shutil
import subprocess

import pytest

from bench import link


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    name = f"gcodec-probe-{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


needs_netns = pytest.mark.skipif(not _can_make_namespaces(), reason="needs root and iproute2 (network namespaces)")


@needs_netns
def test_namespace_has_a_shaped_loopback_at_mtu_1500_and_is_removed():
    with link.namespace("100mbit") as prefix:
        name = prefix[-1]
        assert name in _namespaces()
        lo = subprocess.run([*prefix, "ip", "link", "show", "lo"], capture_output=True, text=True).stdout
        assert "mtu 1500" in lo and "UP" in lo
        qdisc = subprocess.run([*prefix, "tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        assert "burst 16Kb" in qdisc, qdisc  # a millisecond of 100 Mbit/s is under the 16 KiB floor
    assert name not in _namespaces()


def test_the_burst_is_a_millisecond_of_the_rate_and_at_least_16_kib():
    """tbf passes a full bucket's burst at the device's own speed: a burst sized by the rate keeps
    a compressed payload from crossing a slow link faster than the rate (bench/link.py's
    ``burst_bytes``)."""
    assert link.burst_bytes("100mbit") == 16 << 10  # 12,500 bytes a millisecond: the floor
    assert link.burst_bytes("1gbit") == 125_000
    assert link.burst_bytes("10gbit") == 1_250_000


@needs_netns
def test_namespace_is_removed_when_the_body_raises():
    with pytest.raises(RuntimeError), link.namespace("unlimited") as prefix:
        name = prefix[-1]
        qdisc = subprocess.run([*prefix, "tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
        assert "tbf" not in qdisc
        raise RuntimeError("boom")
    assert name not in _namespaces()


def test_steps_to_target_is_the_first_evaluation_at_or_above_it():
    curve = [{"step": 11, "accuracy": 0.5}, {"step": 22, "accuracy": 0.96}, {"step": 33, "accuracy": 0.95}]
    assert link.steps_to(curve, 0.96) == 22
    assert link.steps_to(curve, 0.97) is None


@needs_netns
@pytest.mark.torch
def test_the_probe_sees_half_the_shaped_rate_that_two_ranks_share():
    """Two gloo ranks share the one shaped loopback: a ring allreduce of n bytes per rank on 2 ranks
    sends n per rank, 2n through the 100 Mbit/s qdisc, in t = 2n / 12.5 MB/s; the model's
    t = 2(p-1)/p n / beta = n / beta then fits beta = 50 Mbit/s, and the all-gather, (p-1) S / beta
    for 2S through the qdisc, the same. Seen: 49 to 60 Mbit/s on an idle machine; with the test
    suite running beside it, the small sizes slow down (alpha 1.5 ms), the line flattens and the
    fit reads up to 88 Mbit/s. So the bounds: below the nominal rate, which is what the probe is
    for, and above 30 Mbit/s (TCP's headers take a few %)."""
    pytest.importorskip("torch")
    got = link.probe_rate("100mbit", 2)
    assert got is not None
    assert 30e6 < got["bandwidth_bps"] < 100e6, got
    assert 30e6 < got["gather"]["bandwidth_bps"] < 100e6, got


def test_gcodec_choice_reads_the_picked_contenders_time_and_none_means_all_dense():
    def row(label, tta):
        return {"label": label, "rates": {"1gbit": {"time_to_target_s": tta}, "unlimited": {"time_to_target_s": tta}}}

    res = {
        "rates": ["1gbit", "unlimited"],
        "rows": [row("uncompressed", 10.0), row("gcodec uniform 4", 6.0), row(link.ALL_DENSE, 10.4)],
        "advise_choice": {"1gbit": "gcodec uniform 4", "unlimited": None},
        "unlimited_bps": 40e9,
    }
    lines = link.choice_lines(res)
    assert "- 1gbit: advise picks gcodec uniform 4; time to target 6.0 s (0.60x uncompressed)" in lines
    assert "- unlimited: advise picks none; time to target 10.4 s (1.04x uncompressed)" in lines
    assert any("40 Gbit/s" in x for x in lines)
    assert link.choice_lines({**res, "advise_choice": {}}) == []
    probed = {"bandwidth_bps": 0.45e9, "latency_s": 2e-4, "gather": {"bandwidth_bps": 0.2e9, "latency_s": 4e-4}}
    lines = link.choice_lines({**res, "links": {"1gbit": probed, "unlimited": None}})
    assert any("measured there with `gcodec advise --probe torch`" in x for x in lines)
    assert "- probed at 1gbit: allreduce 0.45 Gbit/s (alpha 200 us), all-gather 0.2 Gbit/s" in lines


def test_advise_picks_the_largest_measured_saving_where_the_probe_timed_the_exchange():
    """With the probe's measured column at a rate the pick is the codec that measured the largest
    saving over the dense exchange (none when none saved anything); at a rate without it, the
    model's prediction decides."""
    pytest.importorskip("gcodec.advise")
    import json

    from gcodec import get_codec

    def k(c):
        return json.dumps(get_codec(c).get_config(), sort_keys=True)

    cands = [c for c in link.CONTENDERS if c["label"] in ("gcodec fp16", "gcodec uniform 4")]
    fp16, u4 = cands[0]["codec"], cands[1]["codec"]
    probed = {"bandwidth_bps": 1e9, "latency_s": 1e-4, "gather": {"bandwidth_bps": 1e9, "latency_s": 1e-4}}
    links = {
        "1gbit": {**probed, "measured": {"null": 0.010, k(fp16): 0.009, k(u4): 0.006}},
        "10gbit": {**probed, "measured": {"null": 0.010, k(fp16): 0.012, k(u4): 0.011}},
    }
    got = link.advise_choices(cands, [256], 2, ["1gbit", "10gbit"], link.UNLIMITED_BPS, links)
    assert got == {"1gbit": "gcodec uniform 4", "10gbit": None}


def test_a_contender_that_follows_the_link_reads_its_own_run_at_each_rate():
    """The adaptive contender's row: per rate, the steps to the target from that rate's own curve and
    the wall time of its steps up to there (not the fixed contenders' steps x step time)."""

    c = next(c for c in link.CONTENDERS if link.follows_link(c))
    assert not link._priced(c)  # advise does not price a controller as one codec

    def run(curve, decisions):
        return {
            "ok": True,
            "curve": curve,
            "step_ms": 50.0,
            "bytes_per_step": 1e5,
            "decisions": decisions,
            "accuracy": curve[-1]["accuracy"],
            "bits_per_element": 0.2,
        }

    slow = run(
        [{"step": 11, "train_s": 9.0, "accuracy": 0.5}, {"step": 22, "train_s": 12.5, "accuracy": 0.98}],
        [{"step": 2, "from": 1, "to": 4}],
    )
    fast = run([{"step": 11, "train_s": 0.6, "accuracy": 0.97}, {"step": 22, "train_s": 1.1, "accuracy": 0.99}], [])
    row = link._whole_row(
        c, {"100mbit": {c["label"]: slow}, "unlimited": {c["label"]: fast}}, ["100mbit", "unlimited"], 0.975
    )
    assert row["rates"]["100mbit"]["time_to_target_s"] == 12.5 and row["rates"]["100mbit"]["steps_to_target"] == 22
    assert row["rates"]["unlimited"]["time_to_target_s"] == 1.1 and row["steps_to_target"] == 22
    assert row["accuracy"] == 0.99 and row["rates"]["100mbit"]["decisions"] == [{"step": 2, "from": 1, "to": 4}]
    failed = link._whole_row(c, {"100mbit": {c["label"]: {"ok": False, "error": "boom"}}}, ["100mbit"], 0.975)
    assert failed["rates"]["100mbit"]["time_to_target_s"] is None and failed["accuracy"] is None


def test_the_adaptive_contender_is_compared_with_wall_times_where_both_sides_have_one():
    """At the accuracy runs' rate the uncompressed run's wall time is known, and the controller's
    (a wall time) is set against it as well as against torch's best hook (steps x median step); a
    rate without the reference's wall time gets the hook comparison only."""

    def rates(tta, wall=None):
        return {"step_ms": 1.0, "time_to_target_s": tta, **({} if wall is None else {"wall_to_target_s": wall})}

    res = {
        "rates": ["1gbit", "unlimited"],
        "rows": [
            {"label": "uncompressed", "hook": "none", "rates": {"1gbit": rates(40.0), "unlimited": rates(5.0, 6.0)}},
            {"label": "torch fp16", "hook": "torch-fp16", "rates": {"1gbit": rates(20.0), "unlimited": rates(5.5)}},
            {
                "label": "torch psgd",
                "hook": "torch-powersgd",
                "rates": {"1gbit": rates(None), "unlimited": rates(None)},
            },
            {"label": link.ADAPTIVE, "hook": "gcodec", "rates": {"1gbit": rates(8.0), "unlimited": rates(6.3)}},
        ],
    }
    lines = link.adaptive_lines(res)
    assert lines[0] == "- 1gbit: the adaptive controller 8.0 s, 0.40x torch's best hook"
    assert lines[1] == (
        "- unlimited: the adaptive controller 6.3 s, 1.15x torch's best hook, "
        "1.05x the uncompressed run's wall time (6.0 s)"
    )
    res["rows"][3]["rates"]["unlimited"]["setup_s"] = 0.6  # its calibration, before the first step
    assert link.adaptive_lines(res)[1].endswith("; its setup (DDP and the hook's kernels) 0.60 s, 1.15x with it")
    assert link.adaptive_lines({"rates": res["rates"], "rows": res["rows"][:3]}) == []


def test_the_crossover_is_interpolated_in_one_over_bandwidth_between_the_rates_that_bracket_it():
    """A step of compute c plus bytes / B: the contender's difference to the dense step is
    d(B) = a + b / B, linear in 1/B, so two rates on either side of the crossover give it exactly.
    Here a = 10 ms (the codec's compute), b = -8e9 bit·ms/s (bytes saved): d = 0 at 0.8 Gbit/s.
    The rates are ordered by the bandwidth measured there, not by name."""
    a, b = 10.0, -8e9

    def d(bps):
        return a + b / bps

    pts = [
        ("unlimited", 6e9, d(6e9)),
        ("100mbit", 0.05e9, d(0.05e9)),
        ("1gbit", 0.4e9, d(0.4e9)),
        ("10gbit", 3e9, d(3e9)),
    ]
    got = link.crossover(pts)
    assert got["kind"] == "crosses" and (got["below"], got["above"]) == ("1gbit", "10gbit")
    assert abs(got["bps"] - 0.8e9) < 1e-3 * 0.8e9
    # pays everywhere / nowhere: the bound is the fastest / slowest rate's measured bandwidth
    assert link.crossover([(q, bps, -1.0) for q, bps, _ in pts]) == {"kind": "pays", "rate": "unlimited", "at_bps": 6e9}
    assert link.crossover([(q, bps, 1.0) for q, bps, _ in pts]) == {
        "kind": "never",
        "rate": "100mbit",
        "at_bps": 0.05e9,
    }
    # a noisy rate that pays above a rate that does not: the fastest paying rate brackets it
    got = link.crossover([("a", 1e9, -1.0), ("b", 2e9, 0.5), ("c", 4e9, -0.1), ("d", 8e9, 2.0)])
    assert (got["below"], got["above"]) == ("c", "d")


def test_the_crossover_factor_is_the_gap_between_what_each_side_allows():
    """Each side is a bandwidth (bracketed), or a bound (pays at every rate: above the fastest;
    at none: below the slowest); the factor is the ratio of the nearest ends, 1 where they meet."""

    def at(bps):
        return {"kind": "crosses", "bps": bps}

    pays, never = {"kind": "pays", "at_bps": 6e9}, {"kind": "never", "at_bps": 0.05e9}
    assert link.crossover_factor(at(1e9), at(2e9)) == 2.0 and link.crossover_factor(at(1e9), at(0.25e9)) == 4.0
    assert link.crossover_factor(pays, at(7e9)) == 1.0 and link.crossover_factor(pays, pays) == 1.0
    assert link.crossover_factor(pays, at(2e9)) == 3.0 and link.crossover_factor(at(2e9), pays) == 3.0
    assert link.crossover_factor(never, at(0.02e9)) == 1.0 and link.crossover_factor(never, never) == 1.0
    assert link.crossover_factor(never, at(0.5e9)) == pytest.approx(10.0)
    assert link.crossover_factor(never, pays) == pytest.approx(6e9 / 0.05e9)


def test_advise_check_adds_advises_exchange_to_the_compute_floor_and_flags_a_slower_pick():
    """On a synthetic run of the small model: the uncompressed row's prediction is the measured
    no-communication step plus the dense allreduce of the model on the probed link (alpha-beta
    model: 2 (p-1) alpha + 2 (p-1)/p bytes / beta), the codec rows carry a crossover, and a pick
    measured slower than the uncompressed step is flagged."""
    pytest.importorskip("gcodec.advise")
    hidden = [256, 256]
    n = sum(math.prod(s) for s in link._shapes(hidden).values())
    probed = {
        "1gbit": {"bandwidth_bps": 0.4e9, "latency_s": 2e-4, "gather": {"bandwidth_bps": 0.3e9, "latency_s": 4e-4}},
        "unlimited": {"bandwidth_bps": 6e9, "latency_s": 2e-4, "gather": {"bandwidth_bps": 2e9, "latency_s": 4e-4}},
    }

    def row(label, codec, ms):
        return {"label": label, "codec": codec, "rates": {q: {"step_ms": ms[i]} for i, q in enumerate(probed)}}

    res = {
        "model": "MLP 64-256-256-10",
        "workers": 2,
        "rates": list(probed),
        "links": probed,
        "local_step_ms": {"1gbit": 3.0, "unlimited": 3.0},
        "rows": [
            row("uncompressed (DDP allreduce)", None, [9.0, 4.0]),
            row("gcodec uniform 4", {"id": "uniform", "bits": 4}, [5.0, 6.0]),
            row(link.ALL_DENSE, None, [9.5, 4.5]),
        ],
        "advise_choice": {"1gbit": "gcodec uniform 4", "unlimited": "gcodec uniform 4"},
    }
    none = link.advise_check({**res, "advise_choice": {"1gbit": None, "unlimited": None}})["verdicts"]
    # no codec recommended: nothing to call slower; the all-dense hook's step is reported
    assert none["unlimited"]["slower"] is None and none["unlimited"]["pick_ms"] == 4.5
    chk = link.advise_check(res)
    dense = next(r for r in chk["rows"] if r["label"] == "uncompressed (DDP allreduce)")
    for q, lk in probed.items():
        comm = 2 * lk["latency_s"] + 4 * n / (lk["bandwidth_bps"] / 8)  # p = 2: 2 (p-1)/p = 1
        assert dense["rates"][q]["predicted_ms"] == pytest.approx(3.0 + 1e3 * comm, rel=1e-9)
    u4 = next(r for r in chk["rows"] if r["label"] == "gcodec uniform 4")
    assert u4["crossover"]["measured"]["kind"] == "crosses" and "crossover" not in dense
    # the predicted crossover is read off the predicted steps the same way
    pred = link.crossover(
        [
            (q, lk["bandwidth_bps"], u4["rates"][q]["predicted_ms"] - dense["rates"][q]["predicted_ms"])
            for q, lk in probed.items()
        ]
    )
    assert u4["crossover"]["predicted"] == pred
    assert u4["crossover"]["factor"] == link.crossover_factor(u4["crossover"]["measured"], pred)
    assert chk["verdicts"]["1gbit"]["slower"] is False and chk["verdicts"]["unlimited"]["slower"] is True
    lines = link.advise_check_lines(chk)
    assert any("unlimited: advise picks gcodec uniform 4" in x and "SLOWER" in x for x in lines)


def test_the_adaptive_contender_is_given_the_link_its_rate_probed():
    """The controller of a rate's whole runs is handed the link ``gcodec advise --probe`` measured
    there (so it does not probe again), as a mapping the controller accepts; a contender without
    a controller, a rate without a probe, or a controller with a link of its own is left alone."""
    from gcodec.adaptive import AdaptiveController

    probed = {"bandwidth_bps": 4.8e7, "latency_s": 1.1e-3, "gather": {"bandwidth_bps": 4.7e7}, "measured": {}}
    ad = next(c for c in link.CONTENDERS if c["label"] == link.ADAPTIVE)
    got = link.with_link(ad, probed)
    assert got["adaptive"]["link"] == {"bandwidth_bps": 4.8e7, "latency_s": 1.1e-3} and "link" not in ad["adaptive"]
    ctl = AdaptiveController(**got["adaptive"])
    assert ctl.probed.link.bandwidth_bps == 4.8e7 and ctl.latency_s == 1.1e-3
    assert link.with_link(ad, None) is ad and link.with_link(link.CONTENDERS[0], probed) is link.CONTENDERS[0]
    own = {**ad, "adaptive": {"bandwidth": "1Gbit"}}
    assert link.with_link(own, probed) is own


def test_the_hidden_share_is_the_exchange_the_step_does_not_show_over_the_exchange():
    """A compute-only step of 40 ms and an exchange (the hook's held seconds) of 20 ms: a 50 ms
    step hid 10 of the 20 ms (50 %), a 40 ms step all of it, a 60 ms step none, a 70 ms step less
    than none (-50 %: compute and exchange slowed each other); a missing figure gives None. The
    table shows it per rate, blank where a contender has none."""
    assert link.hidden_share(50.0, 20.0, 40.0) == 0.5
    assert link.hidden_share(40.0, 20.0, 40.0) == 1.0
    assert link.hidden_share(60.0, 20.0, 40.0) == 0.0
    assert link.hidden_share(70.0, 20.0, 40.0) == -0.5
    assert link.hidden_share(None, 20.0, 40.0) is None and link.hidden_share(50.0, None, 40.0) is None
    assert link.hidden_share(50.0, 20.0, None) is None

    def row(label, hook, step_ms, held_ms):
        rates = {"1gbit": {"step_ms": step_ms, "time_to_target_s": 5.0, "held_ms": held_ms}}
        rates["1gbit"]["hidden"] = link.hidden_share(step_ms, held_ms, 40.0)
        return {"label": label, "hook": hook, "codec": None, "bits_per_element": 1.0, "accuracy": 0.97}, rates

    rows = []
    for label, hook, step, held in (("ddp", "none", 45.0, None), ("gcodec x", "gcodec", 50.0, 20.0)):
        r, rates = row(label, hook, step, held)
        rows.append({**r, "steps_to_target": 10, "rates": rates, "advise_break_even_bps": None})
    res = {"model": "MLP 64-8-10", "params": 1, "workers": 2, "target": 0.97, "elapsed_s": 60.0}
    res.update(rates=["1gbit"], rows=rows, local_step_ms={"1gbit": 40.0})
    md = link.markdown(res)
    table = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert table[0].endswith("| hidden @ 1gbit |")
    assert table[1].endswith("|  |") and table[2].endswith("| 50 % |")
    assert "compute-only step being DDP with a hook that sends nothing (40 ms @ 1gbit)" in md


def test_the_zero_communication_bound_is_steps_times_the_compute_only_step():
    """121 steps to the target at a compute-only step of 40 ms: 4.84 s, which a contender that took
    6.05 s is 1.25x of; the table beside the main one says so per rate, blank without a bound."""
    assert link.zero_comm_bound(121, 40.0) == pytest.approx(4.84)
    assert link.zero_comm_bound(None, 40.0) is None and link.zero_comm_bound(121, None) is None
    rates = {"1gbit": {"time_to_target_s": 6.05, "bound_s": link.zero_comm_bound(121, 40.0)}}
    rates["unlimited"] = {"time_to_target_s": 5.0, "bound_s": None}
    res = {"rates": ["1gbit", "unlimited"], "rows": [{"label": "gcodec x", "rates": rates}]}
    lines = link.bound_lines(res)
    assert lines[-2:] == ["| gcodec x | 1.25x (4.8 s) |  |", ""]  # the list after it needs a blank line
    rates["1gbit"]["bound_s"] = None
    assert link.bound_lines(res) == []
