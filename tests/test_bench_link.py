"""bench/link.py's emulated link: the namespace is shaped as asked and always removed."""

from __future__ import annotations

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
    assert name not in _namespaces()


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
    assert link.adaptive_lines(res)[1].endswith("; its setup (DDP and the calibration) 0.60 s, 1.15x with it")
    assert link.adaptive_lines({"rates": res["rates"], "rows": res["rows"][:3]}) == []
