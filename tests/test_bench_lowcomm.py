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
