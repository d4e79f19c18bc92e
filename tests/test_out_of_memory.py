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
import sys
from pathlib import Path

import numpy as np
import pytest

import gcodec
from tests import oom_worker
from tests.procs import run

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
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_ARENA_MAX="1", PYTHONFAULTHANDLER="1")
    rows = _worker_rows("oom_worker.py", [str(ROOT), str(HEADROOM)], env, 900)
    return {(case, call): (outcome, msg) for case, call, outcome, msg in rows}


def _worker_rows(worker: str, args: list[str], env: dict[str, str], timeout: float) -> list:
    """Run ``tests/<worker> *args`` in a fresh child process (tests/procs.py run: under the
    watchdog) and return the JSON rows of its last line."""
    proc = run([sys.executable, str(ROOT / "tests" / worker), *args], timeout, env=env, cwd=os.getcwd())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


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


# Every codec at settings that take its threaded decode path (65,536 elements and more).
_COLD = [
    "fp16",
    "bf16",
    "uniform",
    {"id": "uniform", "bits": 4},
    "qsgd",
    "terngrad",
    "sign",
    "fp8",
    "mx",
    "nvfp4",
    {"id": "topk", "ratio": 0.01},
    {"id": "chunktopk", "chunk": 4096, "k": 64, "values": {"id": "uniform", "bits": 2}},
    "dct",
    {"id": "randomk", "ratio": 0.1},
    {"id": "threshold", "threshold": 1.5},
    {"id": "powersgd", "rank": 2},
]


@pytest.mark.parametrize("headroom_mib", [128, 32])
def test_the_first_decode_of_a_fresh_process_under_a_cap(tmp_path, headroom_mib):
    """A fresh process, capped right after ``import gcodec``: each codec's first decode loads its
    kernels from Numba's cache and starts the kernel threads under the cap. Every decode succeeds
    or raises a GcodecError (LimitExceededError), never a MemoryError, a crash or a hang; where no
    thread fits under the cap, the kernels run on the calling thread (glibc aborts a process whose
    new thread cannot get its thread-local data). Below about 32 MiB for all sixteen codecs'
    kernels, LLVM's own allocator aborts the process (``std::bad_alloc``), which no Python code can
    catch: docs/limits.md states that floor."""
    x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32)
    for i, cfg in enumerate(_COLD):
        codec = gcodec.get_codec(cfg)
        buf = bytes(codec.encode(x, key="t", step=0))
        gcodec.decode(buf)  # fills Numba's disk cache here, so the child only loads it
        (tmp_path / f"{i:02d}_{codec.codec_id}.gcd").write_bytes(buf)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GCODEC_NUM_THREADS": "2"}
    rows = _worker_rows("oom_cold_worker.py", [str(tmp_path), str(headroom_mib << 20)], env, 300)
    assert len(rows) == len(_COLD)
    escaped = [r for r in rows if r[1].startswith("ESCAPED")]
    assert not escaped, escaped
    bad = [r for r in rows if r[1] not in ("ok", "LimitExceededError")]
    assert not bad, bad
    assert all(r[1] == "ok" for r in rows), rows  # 32 MiB is room enough for every codec's kernels
