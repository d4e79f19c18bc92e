"""Decoding and validating where memory is short: only GcodecError subclasses, never MemoryError.

The limits admit payloads whose decoding needs hundreds of MiB (docs/limits.md), and a receiver may
have less. Every buffer a payload sizes then comes from gcodec's one allocator (gcodec/alloc.py),
which turns a failed allocation into a LimitExceededError naming what it was for. This test runs
tests/oom_worker.py in a child process that caps its own address space (RLIMIT_AS) at what it maps
plus 48 MiB, and calls validate, decode and decode(out=) on every golden valid vector and on valid
payloads of every codec that declare 2**24 to 2**26 elements (tests/codec_kit.py ``declaring``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import oom_worker

ROOT = Path(__file__).resolve().parents[1]
HEADROOM = 48 << 20  # above what the calls need besides payload-sized buffers, below any of those

#: Calls whose payload-sized buffer cannot fit under the cap: they must be refused, naming it (so the
#: cap really bites and the refusal says what was being allocated).
REFUSED = {
    ("bf16 tensor", "decode out="): "the float32 staging buffer",
    ("topk bf16 raw k=numel/2", "decode out="): "the float32 staging buffer",
    ("randomk bf16 raw k=numel/2", "decode out="): "the float32 staging buffer",
    ("randomk raw k=numel/8", "decode out="): "random words",
    ("randomk bitmap", "decode out="): "the randomk index bitmap",
    ("powersgd f64 rank 64", "decode out="): "PowerSGD's factor P",
    # the sparse codecs' index and value buffers, and the nested codecs' values
    ("topk k=numel sign values", "validate"): "topk indices",
    ("topk k=numel sign values", "decode out="): "topk indices",
    ("topk bf16 raw k=numel/2", "validate"): "topk indices",
    ("randomk bf16 raw k=numel/2", "validate"): "the decoded values of a sparse payload",
    ("threshold k=numel sign values", "validate"): "threshold indices",
    ("threshold k=numel sign values", "decode out="): "threshold indices",
    ("randomk k=numel-1 sign values", "validate"): "the values of the nested codec in role 'values'",
    ("randomk k=numel-1 sign values", "decode out="): "the values of the nested codec in role 'values'",
    ("powersgd sign factors", "validate"): "the values of the nested codec in role 'p'",
    ("powersgd sign factors", "decode out="): "the values of the nested codec in role 'p'",
    **{(case, "decode"): "the decoded tensor" for case in oom_worker.CASES},
}


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, str], tuple[str, str]]:
    # glibc serves allocations from memory it already maps when its mmap threshold has grown after
    # earlier frees; a fixed threshold makes every large allocation map new address space, which the
    # cap then counts
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_ARENA_MAX="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "oom_worker.py"), str(ROOT), str(HEADROOM)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return {(case, call): (outcome, msg) for case, call, outcome, msg in rows}


def test_golden_vectors_decode_under_the_cap(outcomes):
    rows = {k: v for k, v in outcomes.items() if k[0].startswith("vector ")}
    assert len(rows) >= 3 * 100
    bad = {k: v for k, v in rows.items() if v[0] != "ok"}
    assert not bad, bad


def _params():
    out = []
    for case in oom_worker.CASES:
        for call in oom_worker.CALLS:
            out.append(pytest.param(case, call, id=f"{case}-{call}"))
    return out


@pytest.mark.parametrize("case,call", _params())
def test_large_payload_under_the_cap(outcomes, case, call):
    outcome, msg = outcomes[case, call]
    assert not outcome.startswith("ESCAPED"), f"{case}, {call}: {outcome}: {msg}"
    if (case, call) in REFUSED:
        assert outcome == "LimitExceededError", (outcome, msg)
        assert msg.startswith("out of memory: cannot allocate ") and REFUSED[case, call] in msg, msg
    else:
        assert outcome == "ok", (outcome, msg)
