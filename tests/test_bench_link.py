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


def test_advise_hook_returns_none_until_gcodec_advise_exists():
    # the comparison with `gcodec advise` is a marked hook; without the module it reports nothing
    try:
        import gcodec.advise  # noqa: F401
    except ImportError:
        assert link.advise_break_even({"id": "fp16"}, [256], 2, False) is None


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
