"""bench/lowcomm.py's timing (the median of per-period means) and its DiLoCo schedule lengths."""

from __future__ import annotations

import pytest

from bench import lowcomm


def test_period_median_takes_the_median_of_the_last_windows_means() -> None:
    # 3 warm-up steps, then windows of h = 4 with means 10, 50 (a slow window) and 12: the median
    # is 12, where the mean of all twelve steps would be 24
    times = [99.0, 99.0, 99.0] + [10.0] * 4 + [20.0, 80.0, 50.0, 50.0] + [12.0] * 4
    assert lowcomm.period_median(times, 4, 3) == 12.0
    assert lowcomm.period_median(times, 4, 1) == 12.0  # the last window alone
    assert lowcomm.period_median(times, 2, 4) == 31.0  # windows 50, 50, 12, 12: the middle two averaged
    with pytest.raises(ValueError, match="fewer than"):
        lowcomm.period_median(times[:10], 4, 3)


def test_diloco_steps_default_per_world_and_overrides() -> None:
    assert lowcomm.diloco_steps("", 600, 2) == 900  # 1.5 x DDP's steps at 2 workers
    assert lowcomm.diloco_steps("", 600, 4) == 2400  # 4 x at more: the replicas drift further
    assert lowcomm.diloco_steps("700", 600, 4) == 700
    assert lowcomm.diloco_steps("2=800,4=1600", 600, 4) == 1600
    assert lowcomm.diloco_steps("2=800,4=1600", 600, 2) == 800
    with pytest.raises(SystemExit, match="no value for 8 workers"):
        lowcomm.diloco_steps("2=800,4=1600", 600, 8)


def test_timing_rounds_rotate_the_contenders_and_keep_each_rounds_ratio() -> None:
    cons = [{"label": c} for c in "abcd"]
    orders = ["".join(c["label"] for c in lowcomm.rotated(cons, i)) for i in range(5)]
    assert orders == ["abcd", "bcda", "cdab", "dabc", "abcd"]  # each contender at every position once
    assert lowcomm.round_median([0.3, None, 0.1, 0.2]) == 0.2  # the rounds that ran
    assert lowcomm.round_median([None]) is None
    # 525 steps at 11, 14 and 12 ms against a reference's 500 at 22, 28 and 30 ms: each round's ratio
    # uses that round's two times; a failed round on either side gives no ratio
    got = lowcomm.round_ratios(525, [0.011, 0.014, 0.012, None], 500, [0.022, 0.028, 0.030, 0.025])
    assert got[:3] == pytest.approx([0.525, 0.525, 0.42]) and got[3] is None
    assert lowcomm.round_ratios(None, [0.01], 500, [0.02]) == [None]  # never reached the target
    assert lowcomm.round_ratios(525, [0.01], None, [0.02]) == [None]


def test_the_table_shows_the_rounds_spread_and_every_seed() -> None:
    h = 25
    curve = [{"step": 25, "val_loss": 2.0, "tokens": 1}]

    def row(label: str, steps: int, times: list[float], seed1: int | None) -> dict:
        return {
            "label": label,
            "ok": True,
            "val_loss": 2.0,
            "loss_vs_ddp": 0.0,
            "bytes_per_inner_step": 1000.0,
            "steps_to_target": steps,
            "step_s": {"100mbit": lowcomm.round_median(times)},
            "step_s_rounds": {"100mbit": times},
            "time_to_target_s": {"100mbit": steps * lowcomm.round_median(times)},
            "curve": curve,
            "seeds": {"0": {"steps_to_target": steps}, "1": {"steps_to_target": seed1}},
        }

    rows = [row("DDP fp32", 450, [0.3, 0.3], 500), row(f"torchft DiLoCo H={h} fp32", 500, [0.02, 0.03], 600)]
    rows += [row("mine", 500, [0.012, 0.012], 660), row("slow", 700, [0.012, 0.012], None)]
    lowcomm._ratios(rows, [], h)
    mine = rows[2]
    assert mine["time_vs_torchft_rounds"]["100mbit"] == pytest.approx([0.6, 0.4])
    assert mine["time_vs_torchft"]["100mbit"] == pytest.approx(0.012 / 0.025)  # medians' ratio
    # per seed: that seed's step counts, the median step times: 500/500 and 660/600 steps
    assert mine["time_vs_torchft_seeds"]["100mbit"] == pytest.approx({"0": 0.48, "1": 0.528})
    assert rows[3]["time_vs_torchft_seeds"]["100mbit"]["1"] is None  # seed 1 never reached its target
    res = {
        "settings": {"layers": 2, "d_model": 128, "context": 64, "steps": 600, "batch": 4},
        "corpus": {"python": "3.11", "corpus_sha256": "0" * 64},
        "margin": 0.02,
        "worlds": {"2": {"target": 2.0, "diloco_steps": 900, "rows": rows}},
    }
    text = lowcomm.markdown(res, ["100mbit"]).splitlines()
    assert next(x for x in text if x.startswith("| mine")).endswith("| 0.480 (0.400-0.600) |")
    seed_rows = [x for x in text if x.startswith("| mine") or x.startswith("| slow")][2:]
    assert seed_rows == [
        "| mine | 500 | 660 | 0.480 | 0.528 | 0.504 |",
        "| slow | 700 | not reached | 0.672 | - | 0.672 |",
    ]
    single = [{**r, "seeds": {"0": r["seeds"]["0"]}} for r in rows]
    one = {**res, "worlds": {"2": {**res["worlds"]["2"], "rows": single}}}
    assert not any("seed 0" in x for x in lowcomm.markdown(one, ["100mbit"]).splitlines())  # one seed: no table


def test_stored_curves_by_world_and_seed() -> None:
    old = {"settings": {"seed": 0}, "curves": {"2": "c2", "4": "c4"}}  # a file written before --seeds
    assert lowcomm.stored_curves(old) == {"2": {0: "c2"}, "4": {0: "c4"}}
    new = {"settings": {"seed": 0}, "curves": {"2": "a"}, "curves_seeds": {"2": {"0": "a", "3": "b"}}}
    assert lowcomm.stored_curves(new) == {"2": {0: "a", 3: "b"}}
