"""DiLoCo and Streaming DiLoCo: the schedule (gcodec.lowcomm) and the torch loop on real gloo ranks
(tests/transport_ranks/diloco_torch.py)."""

from __future__ import annotations

import json

import pytest

from gcodec.errors import ConfigError
from gcodec.lowcomm import Schedule, assign_fragments


def test_plain_diloco_sends_and_applies_every_h_steps() -> None:
    s = Schedule(5)
    events = [(t, s.sends(t), s.applies(t)) for t in range(0, 16)]
    assert [t for t, snd, _ in events if snd] == [5, 10, 15]
    assert all(snd == app for _, snd, app in events)  # delay 0: applied at once


def test_streaming_fragments_are_staggered_and_applied_after_the_delay() -> None:
    s = Schedule(8, fragments=4, delay=1)
    sends = {t: s.sends(t) for t in range(1, 17) if s.sends(t)}
    # fragment p sends at p * H / P within each period of H = 8 steps
    assert sends == {2: [1], 4: [2], 6: [3], 8: [0], 10: [1], 12: [2], 14: [3], 16: [0]}
    applies = {t: s.applies(t) for t in range(1, 18) if s.applies(t)}
    assert applies == {t + 1: f for t, f in sends.items()}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sync_every": 0},
        {"sync_every": 4, "fragments": 5},
        {"sync_every": 4, "delay": 4},
        {"sync_every": 4, "delay": -1},
        {"sync_every": 4, "mix": 1.0},
        {"sync_every": 4, "mix": True},
        {"sync_every": 2.0},
    ],
)
def test_schedule_refuses_settings_that_cannot_run(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        Schedule(**kwargs)


def test_fragments_are_contiguous_balanced_and_never_empty() -> None:
    assert assign_fragments([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert assign_fragments([100, 1, 1, 1], 2) == [0, 1, 1, 1]  # one big parameter fills its share
    assert assign_fragments([1, 1, 1, 100], 3) == [0, 0, 1, 2]  # the rest still get one each
    assert assign_fragments([1, 2, 3], 3) == [0, 1, 2]
    with pytest.raises(ConfigError):
        assign_fragments([1, 2], 3)


@pytest.mark.parametrize("phase", ["reference", "streaming", "resume", "diverge", "mismatch"])
def test_diloco_on_two_gloo_ranks(tmp_path, phase: str) -> None:
    """Each phase's checks are listed in the rank program's docstring."""
    pytest.importorskip("torch")
    from tests.procs import checks_of, run_ranks

    codes = run_ranks("tests.transport_ranks.diloco_torch", [str(tmp_path), phase], 2, 240, tmp_path)
    assert codes == [0, 0]
    checks = checks_of(tmp_path, range(2))
    assert len(checks) >= 2
    if phase == "streaming":
        got = [json.loads((tmp_path / f"globals{r}.json").read_text()) for r in range(2)]
        assert got[0] == got[1]


@pytest.mark.mpi
def test_the_same_outer_all_reduce_from_gcodec_mpi(tmp_path) -> None:
    """DiLoCo written with NumPy over gcodec.mpi (tests/transport_ranks/diloco_mpi.py): both ranks
    hold the same global parameters after every outer step, and the global model's loss falls."""
    pytest.importorskip("mpi4py")
    from tests.procs import run_mpi

    proc = run_mpi("tests.transport_ranks.diloco_mpi", [str(tmp_path)], 2, 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert r["ok"], r.get("error")
    assert res[0]["digests"] == res[1]["digests"]
    # fragment 1 (the bias) at steps 3, 9, ...; fragment 0 (the weights) at 6, 12, ...: 12 syncs
    assert [d[:2] for d in res[0]["digests"]][:4] == [[3, 1], [6, 0], [9, 1], [12, 0]]
    assert res[0]["steps"] == {"w": 6, "b": 6}
    losses = res[0]["losses"]
    # At zero weights the loss is E|x w_true + 0.5|^2 = 64 + 0.25 per output. The run is
    # deterministic (it ends near 2.6, after Nesterov's overshoots); global parameters that never
    # moved (averages lost) stay at ~63, so a 10x drop tells the exchanges worked.
    assert losses[-1] < 0.1 * 64.25, losses
