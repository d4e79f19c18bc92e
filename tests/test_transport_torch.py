"""gcodec.torch with two real gloo processes on 127.0.0.1 (free ports picked at run time).

The rank program is tests/transport_ranks/torch_program.py; each scenario starts two ranks as
subprocesses with a timeout, so nothing here can hang the suite. torch.distributed itself runs with
``timeout=20 s`` on init_process_group, the configured limit for a dead peer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 150


from tests.procs import checks_of, scaled  # noqa: E402  (one helper for the multi-process tests)
from tests.procs import run_ranks as _run_ranks  # noqa: E402


def run_ranks(scenario: str, outdir: Path, timeout: float = TIMEOUT, world: int = 2) -> list[int]:
    return _run_ranks("tests.transport_ranks.torch_program", [scenario, str(outdir)], world, timeout, outdir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("train")
    codes = run_ranks("train", out)
    assert codes == [0, 0]
    assert len(checks_of(out, [0, 1])) >= 2 * 10
    return json.loads((out / "train.json").read_text())


GCODEC_RUNS = [
    '{"id": "fp16"}',
    '{"id": "bf16"}',
    '{"id": "uniform", "bits": 4}',
    '{"id": "topk", "ratio": 0.05}',
    '{"id": "sign"}',
    '{"id": "randomk", "ratio": 0.25}',
    '{"id": "powersgd", "rank": 2}',
    "topk-through-rebuild",
    "uniform4-through-rebuild",
]


@pytest.mark.parametrize("run", GCODEC_RUNS)
def test_ddp_hook_loss_falls_with_each_codec(trained: dict, run: str) -> None:
    losses = trained[run]["losses"]
    assert losses[-1] < 0.4 * losses[0], losses[::8]
    # within 15 % of the uncompressed run's final loss: the codecs train, not just move
    assert losses[-1] < 1.15 * trained["none"]["losses"][-1]


@pytest.mark.parametrize(
    "run", ["uniform-torch.float16", "fp16-torch.float16", "uniform-torch.bfloat16", "fp16-torch.bfloat16"]
)
def test_ddp_hook_handles_16_bit_gradients(trained: dict, run: str) -> None:
    losses = trained[run]["losses"]
    assert losses[-1] < 0.6 * losses[0], losses[::8]


def test_fp16_hook_ends_close_to_uncompressed_and_to_torchs_fp16_hook(trained: dict) -> None:
    ours = np.array(trained['{"id": "fp16"}']["params"])
    base = np.array(trained["none"]["params"])
    theirs = np.array(trained["torch-fp16"]["params"])
    assert np.linalg.norm(ours - base) / np.linalg.norm(base) < 1e-3
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(base) < 1e-3


def test_powersgd_rank2_trains_as_well_as_torchs_powersgd_hook(trained: dict) -> None:
    ours = trained["powersgd-one-bucket"]["losses"]
    theirs = trained["torch-powersgd"]["losses"]
    assert ours[-1] <= 1.05 * theirs[-1], (ours[-1], theirs[-1])


def test_bucket_rebuild_gives_new_groups_not_errors(trained: dict) -> None:
    # the groups compressed before DDP's rebuild and after it are different keys, both used
    rebuilt, steady = trained["uniform4-through-rebuild"]["keys"], trained['{"id": "uniform", "bits": 4}']["keys"]
    assert len(rebuilt) > len(steady), (rebuilt, steady)
    # top-k's encoding depends on the whole tensor: each weight is a group of its own, before the
    # rebuild and after it (gcodec.transports.shares_flat_group)
    for run in ('{"id": "topk", "ratio": 0.05}', "topk-through-rebuild"):
        assert all("(1 tensors, topk" in k for k in trained[run]["keys"]), trained[run]["keys"]


def test_the_step_reports_of_the_hook_and_all_reduce_add_up_against_the_measured_steps(tmp_path: Path) -> None:
    # the hook: 4 checks a step for 5 steps and the count; all_reduce: 2 states x 2 ways to close a round
    assert run_ranks("report", tmp_path) == [0, 0]
    assert len(checks_of(tmp_path, [0, 1])) == 2 * (5 * 4 + 1 + 4)


def test_all_reduce_modes_and_dtypes(tmp_path: Path) -> None:
    assert run_ranks("all_reduce", tmp_path) == [0, 0]
    assert len(checks_of(tmp_path, [0, 1])) == 2 * 5


@pytest.mark.parametrize("world", [2, 3])
def test_dense_tensors_ride_with_the_compressed_group_exactly(tmp_path: Path, world: int) -> None:
    # 2 ranks: the one all-gather form of the summable sum; 3: reduce-scatter + all-gather
    assert run_ranks("riders", tmp_path, world=world) == [0] * world
    # per rank: 2 layouts x 5 configurations x 4 steps x 2 checks, and the collectives counted
    # in the steady step of the two uniform configurations
    assert len(checks_of(tmp_path, list(range(world)))) == world * 2 * (5 * 4 * 2 + 2)


@pytest.mark.parametrize("world", [2, 3])
def test_a_codec_that_reads_shapes_compresses_each_weight_in_its_shape(tmp_path: Path, world: int) -> None:
    assert run_ranks("shaped", tmp_path, world=world) == [0] * world
    assert len(checks_of(tmp_path, list(range(world)))) == world * 2 * 2


def test_hook_state_checkpoint_resumes_bit_identically(tmp_path: Path) -> None:
    assert run_ranks("checkpoint", tmp_path) == [0, 0]
    assert len(checks_of(tmp_path, [0, 1])) == 2 * 6


@pytest.mark.parametrize("scenario", ["mismatch", "corrupt"])
def test_bad_peers_raise_on_every_rank(tmp_path: Path, scenario: str) -> None:
    assert run_ranks(scenario, tmp_path) == [0, 0]
    assert len(checks_of(tmp_path, [0, 1])) == 2


def test_a_killed_rank_makes_the_survivor_raise_within_the_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    codes = run_ranks("kill", tmp_path, timeout=90)
    assert codes[1] == 3 and codes[0] == 0
    assert time.monotonic() - t0 < scaled(90)
    assert len(checks_of(tmp_path, [0])) == 1


def test_a_failed_protocol_leaves_no_tensors_or_works_pinned_by_its_error() -> None:
    """The queue's error lives on in the future (DDP keeps it); the protocol's frames must not keep
    its tensors and works with it, or they live as long as DDP keeps the error. The queue itself
    holds a protocol's works until the next protocol completes (so that their last reference is
    dropped on its thread, never on gloo's worker: see FutureQueue._serve), and no longer.
    In-process: a protocol of size-1 works (no process group is needed to run the queue)."""
    import gc
    import weakref

    import torch

    from gcodec.torch.comm import FutureQueue
    from gcodec.transports import DoneWork

    refs: list[weakref.ref] = []

    def proto():  # type: ignore[no-untyped-def]
        buf = torch.ones(1 << 16)
        work = DoneWork(torch.zeros(8))
        refs.extend([weakref.ref(buf), weakref.ref(work)])
        yield work
        raise RuntimeError("peer said no")

    q = FutureQueue()
    fut = q.submit(proto())
    with pytest.raises(RuntimeError, match="peer said no") as info:
        fut.wait()
    gc.collect()
    assert len(refs) == 2 and refs[0]() is None  # the frame's tensor: gone with the frame
    q.run(iter(()))  # the next protocol: the queue lets go of the failed one's works
    gc.collect()
    assert refs[1]() is None
    # the error still says where it came from
    assert any(f.name == "proto" for f in __import__("traceback").extract_tb(info.value.__traceback__))


def test_a_protocols_collectives_are_released_by_the_queue_after_the_next_protocol_completes() -> None:
    """The last reference to a completed collective is the queue's, dropped on its own thread one
    protocol later (or at close), never the caller's drop racing the transport's worker: a gloo
    work whose last holder is gloo's worker thread takes the GIL there to free its tensors, and a
    program that frees DDP's reducer (joining that worker with the GIL held) right after the last
    step hung that way. In-process, as the test above."""
    import gc
    import weakref

    from gcodec.torch.comm import FutureQueue
    from gcodec.transports import DoneWork

    refs: list[weakref.ref] = []

    def one(name: str):  # type: ignore[no-untyped-def]
        work = DoneWork(name)
        refs.append(weakref.ref(work))
        yield work
        return name

    q = FutureQueue()
    try:
        assert q.submit(one("a")).wait() == "a"
        gc.collect()
        assert refs[0]() is not None  # held by the queue after its future completed
        assert q.submit(one("b")).wait() == "b"
        gc.collect()
        assert refs[0]() is None and refs[1]() is not None  # released when the next one completed
    finally:
        q.close(30.0)
    gc.collect()
    assert refs[1]() is None  # and the last at close


EXIT_RACE = """
import time, torch
from gcodec.torch.comm import FutureQueue
from gcodec.transports import DoneWork

class SlowWork(DoneWork):
    def wait(self):
        time.sleep(0.2)  # so that the callback below is registered before the future completes
        return super().wait()

def proto():
    yield SlowWork(None)
    return torch.zeros(4)

fut = FutureQueue().submit(proto())
fut.then(lambda f: time.sleep(0.5))  # as DDP's reducer does: runs on the queue's thread, in set_result
fut.wait()
print("main exits", flush=True)
"""


def test_the_program_may_end_while_the_queue_still_completes_a_future(tmp_path: Path) -> None:
    """The training thread wakes when the future completes and may end the program while the
    queue's thread is still running the future's callbacks in torch's C++. Without the join at
    exit, finalization ends that thread with pthread_exit and the process aborts ("terminate called
    without an active exception", SIGABRT), every time with this program."""
    import sys

    from tests.procs import run

    (tmp_path / "race.py").write_text(EXIT_RACE)
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    proc = run([sys.executable, "race.py"], 60, cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "main exits" in proc.stdout, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr
