"""``python -m tests.rank_boot -m MODULE ARGS...``: run ``python -m MODULE ARGS...`` with the test
watchdog's pulse started first (tests/procs.py: what a launcher reads to tell a rank that works from
one that hangs, and the stacks a stopped rank prints). The launchers of tests/procs.py start rank
programs this way when they do not fork them from tests/zygote.py (under ``mpiexec``, or with the
fork server turned off)."""

from __future__ import annotations

import runpy
import sys

from tests.procs import start_pulse


def main() -> None:
    if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
        raise SystemExit("usage: python -m tests.rank_boot -m MODULE [ARGS...]")
    start_pulse()
    module = sys.argv[2]
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
