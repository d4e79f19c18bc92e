"""bench/lowcomm.py's timing: the median of per-period means."""

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
