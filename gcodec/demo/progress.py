"""The demos' progress bar over rank 0's ``@progress`` lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class Progress:
    """One tqdm bar over ``len(labels) * steps`` training steps, one run after another.

    Its text says what the job waits for (``phase``: "compiling kernels" while the launcher fills
    Numba's kernel cache, "starting workers" until rank 0 reports), then the label of the run that is
    training. The waits are kept out of the bar's rate: a fresh install spends a minute or more
    compiling before the first step, and counted in, that minute made the first estimate of the time
    left read tens of hours. So the time from a run's start to its first step (process-group setup,
    a worker's first kernel calls) is dropped from the timer, and the estimate counts training steps
    only. ``bar`` is for tests (a tqdm of their own); None makes one on standard error."""

    def __init__(self, labels: Sequence[str], steps: int, width: int = 26, bar: Any = None) -> None:
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=len(labels) * steps, unit="step", dynamic_ncols=True, leave=False)
        self.bar = bar
        self._labels = list(labels)
        self._steps = steps
        self._width = width
        self._run = -1
        self._first = False
        self._phase = ""

    def phase(self, text: str) -> None:
        """Show what the job is waiting for."""
        self._phase = text
        self.bar.set_description_str(text)

    def during(self, text: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` wrapped to run under the phase ``text``, its time kept out of the rate; the phase
        before it comes back afterwards."""

        def run() -> Any:
            before = self._phase
            self.phase(text)
            try:
                return fn()
            finally:
                self.bar.unpause()
                self.phase(before)

        return run

    def step(self, run: int, step: int) -> None:
        """Rank 0 reported ``step`` steps of run ``run`` done (``step`` < 0: the run failed)."""
        if run != self._run:
            self._run = run
            label = self._labels[run][: self._width]
            self.bar.set_description_str(f"{label:<{self._width}}", refresh=False)
            self._first = True
        if step < 0:
            return
        if self._first:  # the wait before a run's first step is not a training step's time
            self._first = False
            self.bar.unpause()
        self.bar.update(run * self._steps + step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
