"""gcodec's compressed allreduce inside torchft's quorum (gcodec.torch.torchft), with real processes:
torchft's lighthouse and three replica groups on 127.0.0.1, each training with torchft's DiLoCo
(tests/transport_ranks/torchft_replica.py: 4-bit pseudo-gradients with error feedback), one of
them killed and restarted, or stopped.

torchft is an optional extra (``pip install 'gcodec[torchft]'``; the ``test`` extra installs it):
these tests skip only when it cannot be imported.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.procs import Forked, abort_for_stacks, free_port, machine_slowdown, start_program, timeout_scale

pytestmark = pytest.mark.torch

pytest.importorskip("torchft", reason="torchft is not installed (an optional extra: pip install 'gcodec[torchft]')")

CODEC = json.dumps({"id": "uniform", "bits": 4})
#: gloo's collective timeout and torchft's manager timeout in the replicas: a stopped peer ends an
#: exchange after this long at most.
TIMEOUT_S = 10
#: The lighthouse forms a quorum without a replica whose heartbeats stopped this long ago, and
#: waits this long for stragglers to join.
HEARTBEAT_MS = 2000
JOIN_MS = 2000
#: what the lighthouse and the replicas import (torch, torchft, gcodec's manager: ~4 CPU-seconds a
#: process): imported once by the fork servers they start from (tests/procs.py start_program)
PRELOAD = ("torchft", "torchft.coordination", "torchft.local_sgd", "torchft.optim", "gcodec.torch.torchft")


class Job:
    """A lighthouse and the replicas of one test, all killed at the end whatever happened."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[int, subprocess.Popen | Forked] = {}
        self.lives: dict[int, int] = {}
        self.lighthouse: subprocess.Popen | Forked | None = None
        self.addr = ""

    def start_lighthouse(self, min_replicas: int) -> None:
        port = free_port()
        self.lighthouse = start_program(
            "tests.transport_ranks.torchft_lighthouse",
            [str(port), str(min_replicas), str(JOIN_MS), str(HEARTBEAT_MS)],
            self.tmp / "lighthouse.log",
            preload=PRELOAD,
        )
        self.addr = f"http://localhost:{port}"
        self.wait(lambda: _listening(port), 60, "the lighthouse to listen")

    def start(self, index: int, codec: str = CODEC, stop_at: int = -1, algo: str = "diloco") -> None:
        life = self.lives.get(index, -1) + 1
        self.lives[index] = life
        self.procs[index] = start_program(
            "tests.transport_ranks.torchft_replica",
            [str(self.tmp), str(index), self.addr, codec, str(TIMEOUT_S), str(life), str(stop_at), algo],
            self.tmp / f"replica{index}.log",
            preload=PRELOAD,
            slot=index,
        )

    def progress(self, index: int) -> dict:
        f = self.tmp / f"progress{index}"
        return json.loads(f.read_text()) if f.exists() else {"step": -1, "world": 0, "pid": 0}

    def wait(self, cond: Callable[[], bool], seconds: float, what: str) -> float:
        """Poll ``cond`` until it holds and return the idle-machine seconds it took: wall time
        divided by the load per core (at least 1), as tests/procs.py's watchdog counts, so that a
        loaded machine is not taken for a hang; ``seconds`` is scaled by GCODEC_TEST_TIMEOUT_SCALE.
        Past it, every live process prints its threads' stacks to its log (faulthandler, SIGABRT)
        and the test fails with the logs' tails and the load."""
        limit = seconds * timeout_scale()
        used, last = 0.0, time.monotonic()
        while not cond():
            now = time.monotonic()
            used += (now - last) / machine_slowdown()
            last = now
            if used > limit:
                abort_for_stacks([*self.procs.values(), self.lighthouse])
                load = "/".join(f"{x:.1f}" for x in os.getloadavg())
                raise AssertionError(
                    f"not within {limit:.0f} s (idle-machine seconds; load {load}): {what}\n{self.logs()}"
                )
            time.sleep(0.1)
        return used + (time.monotonic() - last) / machine_slowdown()

    def logs(self) -> str:
        out = []
        for f in sorted(self.tmp.glob("*.log")):
            lines = [ln for ln in f.read_text(errors="replace").splitlines() if "[INFO]" not in ln]
            out.append(f"--- {f.name}:\n" + "\n".join(lines[-40:]))
        return "\n".join(out)

    def result(self, index: int) -> dict:
        return json.loads((self.tmp / f"replica{index}_{self.lives[index]}.json").read_text())

    def close(self) -> None:
        for p in [*self.procs.values(), self.lighthouse]:
            if p is not None and p.poll() is None:
                p.kill()  # a stopped process dies of SIGKILL too
                p.wait()


@contextmanager
def job(tmp: Path) -> Iterator[Job]:
    j = Job(tmp)
    try:
        yield j
    finally:
        j.close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _all_in_world(j: Job, indices: list[int], world: int, min_step: int = 0) -> Callable[[], bool]:
    return lambda: all(j.progress(i)["world"] == world and j.progress(i)["step"] >= min_step for i in indices)


def _finish(j: Job, indices: list[int], extra_steps: int = 3) -> int:
    """Set the last step a few outer steps ahead of every replica and wait for them to exit 0."""
    target = max(j.progress(i)["step"] for i in indices) + extra_steps
    (j.tmp / "target").write_text(str(target))
    j.wait(lambda: all(j.procs[i].poll() is not None for i in indices), 240, f"replicas {indices} to finish")
    codes = {i: j.procs[i].returncode for i in indices}
    assert all(c == 0 for c in codes.values()), f"exit codes {codes}\n{j.logs()}"
    return target


def _compressed(r: dict) -> None:
    """Every key of 1024 elements or more went 4-bit (the smaller ones, under the default
    ``min_numel``, dense), and the encoded bytes are under half the raw ones. 4-bit values and one
    float32 scale per 64 are 4.5/32 of float32; two-phase (three ranks) encodes each tensor once in
    chunks and its own chunk again, (1 + 1/3) * 4.5/32 = 0.19 of raw, gather (two ranks) once,
    0.14; plus a header per payload and the 264 dense elements at 4 bytes: about 0.25 of raw on
    this model of 10,504 parameters."""
    big = {k: c for k, c in r["router"].items() if math.prod(json.loads(k[k.index("[") :])) >= 1024}
    assert big and all(c != "dense" and c["id"] == "uniform" and c["bits"] == 4 for c in big.values()), r["router"]
    s = r["stats"]
    assert s["exchanges"] > 0 and 0 < s["payload_bytes"] < s["raw_bytes"] / 2, s
    assert s["wire_bytes"] == s["data_wire_bytes"] + s["control_bytes"], s


def test_a_killed_replica_restarts_and_every_replica_ends_with_the_same_global_parameters(tmp_path) -> None:
    """Three replicas; replica 2 is killed (SIGKILL) at a random moment once all three train
    together; replicas 0 and 1 go on compressing in a quorum of two (a re-plan: world size 2)
    and commit steps; replica 2 restarts, torchft heals it from a peer (model, DiLoCo's global
    copy and outer optimizer, gcodec's shared state), the quorum is three again, and at the end
    every replica holds bit-identical global parameters and model."""
    with job(tmp_path) as j:
        j.start_lighthouse(min_replicas=2)
        for i in range(3):
            j.start(i)
        j.wait(_all_in_world(j, [0, 1, 2], 3, min_step=2), 300, "three replicas training together")
        time.sleep(random.uniform(0.0, 0.5))  # anywhere in the inner steps, the exchange or the vote
        killed_at = j.progress(2)["step"]
        j.procs[2].send_signal(signal.SIGKILL)
        j.procs[2].wait()
        j.wait(_all_in_world(j, [0, 1], 2, min_step=killed_at + 3), 120, "the survivors to go on as two")
        j.start(2)
        j.wait(
            lambda: j.progress(2)["pid"] == j.procs[2].pid and _all_in_world(j, [0, 1, 2], 3)(),
            300,
            "the restarted replica to rejoin",
        )
        target = _finish(j, [0, 1, 2])
        res = [j.result(i) for i in range(3)]
    assert [r["step"] for r in res] == [target] * 3
    assert len({r["global"] for r in res}) == 1, [r["global"] for r in res]
    assert len({r["model"] for r in res}) == 1, [r["model"] for r in res]
    for r in res[:2]:  # the survivors: a quorum of three, of two, of three again, each a re-plan
        worlds = [p["world_size"] for p in r["replans"]]
        assert worlds[worlds.index(3) :].count(2) >= 1 and worlds[-1] == 3, r["replans"]
        two = [c for c in r["committed"] if c["world"] == 2]
        assert len(two) >= 3, r["committed"]  # they went on and committed without replica 2
        _compressed(r)
    restarted = res[2]
    assert restarted["life"] == 1
    # it healed: its first committed step follows the survivors' steps, not its own (zero)
    assert restarted["committed"][0]["step"] > killed_at + 3, restarted["committed"][:3]
    _compressed(restarted)


@pytest.mark.parametrize("where", ["anywhere", "in_exchange"])
def test_a_stopped_replica_is_timed_out_and_dropped(tmp_path, where: str) -> None:
    """Three replicas; replica 2 is stopped (SIGSTOP): at a random moment (``anywhere``), or by
    itself right after it started its first exchange of outer step 4 (``in_exchange``). Inside
    an exchange, the survivors' gloo collective times out after TIMEOUT_S, the step is not
    committed and their residuals are put back (asserted for ``in_exchange``); between
    exchanges, its heartbeats stop and the lighthouse leaves it out after HEARTBEAT_MS. Either
    way replicas 0 and 1 go on as a quorum of two and finish: within TIMEOUT_S + HEARTBEAT_MS
    + a quorum or two, far from gloo's 30-minute default. The bound asserted, 90 s, leaves room
    for a machine that the test's own processes load."""
    stop_at = 4 if where == "in_exchange" else -1
    with job(tmp_path) as j:
        j.start_lighthouse(min_replicas=2)
        for i in range(3):
            j.start(i, stop_at=stop_at if i == 2 else -1)
        if where == "anywhere":
            j.wait(_all_in_world(j, [0, 1, 2], 3, min_step=2), 300, "three replicas training together")
            time.sleep(random.uniform(0.0, 0.5))
            os.kill(j.procs[2].pid, signal.SIGSTOP)
        else:
            j.wait(lambda: _stopped(j.procs[2].pid), 300, "replica 2 to stop itself inside an exchange")
        stopped_at = max(j.progress(i)["step"] for i in range(3))
        took = j.wait(_all_in_world(j, [0, 1], 2, min_step=stopped_at + 1), 90, "the survivors to drop it")
        j.wait(_all_in_world(j, [0, 1], 2, min_step=stopped_at + 3), 60, "the survivors to go on as two")
        _finish(j, [0, 1])
        assert j.procs[2].poll() is None  # still stopped: nobody waited for it
        res = [j.result(i) for i in range(2)]
    assert took < 90
    assert res[0]["global"] == res[1]["global"] and res[0]["model"] == res[1]["model"]
    for r in res:
        assert r["replans"][-1]["world_size"] == 2, r["replans"]
        _compressed(r)
        if where == "in_exchange":  # the exchange with the stopped replica timed out: not committed
            assert stop_at in r["rollbacks"], r["rollbacks"]


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T in /proc; Linux, as the test machines)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_replicas_configured_differently_all_raise_instead_of_retrying(tmp_path) -> None:
    """Replica 1 compresses to 2 bits, replica 0 to 4: the first exchange's agreement makes both
    raise gcodec's ConfigError, naming the field that differs, from torchft's commit vote. torchft
    alone would take it for a transient fault, skip the step and retry the same exchange forever."""
    with job(tmp_path) as j:
        j.start_lighthouse(min_replicas=2)
        j.start(0)
        j.start(1, codec=json.dumps({"id": "uniform", "bits": 2}))
        j.wait(lambda: all(j.procs[i].poll() is not None for i in (0, 1)), 300, "both replicas to raise")
        codes = [j.procs[i].returncode for i in (0, 1)]
        logs = [(tmp_path / f"replica{i}.log").read_text(errors="replace") for i in (0, 1)]
    assert codes[0] != 0 and codes[1] != 0, codes
    for log in logs:
        assert "gcodec.errors.ConfigError" in log and "bits" in log, log[-3000:]


@pytest.mark.parametrize("algo", ["streaming", "localsgd", "ddp"])
def test_torchfts_streaming_diloco_localsgd_and_ddp_compress_through_the_same_manager(tmp_path, algo: str) -> None:
    """torchft's Streaming DiLoCo (two fragments synced in turn, ``fragments=2``: each fragment's
    calls get keys of their own), LocalSGD (parameters averaged every 4 steps) and its
    DistributedDataParallel with OptimizerWrapper (every bucket's gradient, every step) reach the
    network through the same ``Manager.allreduce``: with gcodec's Manager they go 4-bit, and the
    two replicas end with bit-identical global parameters (every rank decodes the same average),
    and, but for Streaming DiLoCo's fragment between its syncs, models."""
    with job(tmp_path) as j:
        j.start_lighthouse(min_replicas=2)
        for i in range(2):
            j.start(i, algo=algo)
        j.wait(_all_in_world(j, [0, 1], 2, min_step=2), 300, "two replicas training together")
        _finish(j, [0, 1])
        res = [j.result(i) for i in range(2)]
    assert res[0]["global"] == res[1]["global"]
    if algo != "streaming":  # streaming: the fragment not synced last holds each replica's own values
        assert res[0]["model"] == res[1]["model"]
    for r in res:
        assert r["algo"] == algo and r["rollbacks"] == []
        _compressed(r)
        if algo == "streaming":  # fragment 0's weight [256, 32] and fragment 1's [8, 256], apart
            assert {k.split("/")[1] for k in r["router"]} == {"0", "1"}, r["router"]


def test_a_step_not_committed_gets_its_residuals_back_and_a_replan_keeps_them(tmp_path) -> None:
    """One replica in this process (a quorum of one, under an in-process lighthouse), 2-bit with
    error feedback in two-phase mode (so that it keeps worker residuals per owner chunk and a
    server residual). A committed step changes the residuals and keeps them; a step whose commit
    fails (an error reported to the manager, as a lost peer would) leaves them exactly as they
    were before it; a re-plan keeps every worker residual range and drops the server residuals."""
    import datetime

    import numpy as np
    import torch
    from torch.distributed import TCPStore
    from torchft import ProcessGroupGloo
    from torchft.coordination import LighthouseServer

    from gcodec.torch.torchft import Manager

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=30)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        replica_id="solo",
        lighthouse_addr=lighthouse.address(),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        hostname="localhost",
        use_async_quorum=False,
        timeout=timeout,
        codec={"id": "uniform", "bits": 2},
        error_feedback=True,
        mode="two_phase",
    )
    gen = torch.Generator().manual_seed(0)

    def step(fail: bool) -> torch.Tensor:
        manager.start_quorum()
        t = torch.randn(4096, generator=gen)
        assert manager.allreduce(t).wait()
        if fail:
            manager.report_error(RuntimeError("a peer was lost"))
        assert manager.should_commit() is not fail
        return t

    def residuals() -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in manager.router.ranges().items()}

    try:
        step(fail=False)
        before = residuals()
        assert before and all(np.abs(v).max() > 0 for v in before.values())  # 2 bits drop something
        step(fail=True)
        after = residuals()
        assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)
        assert manager.rollbacks == [1]
        step(fail=False)
        moved = residuals()
        assert any(not np.array_equal(moved[k], before[k]) for k in before)  # a committed step keeps its own
        servers = [ts.server for ts in manager.router.states.values() if ts.server is not None]
        assert any(s.keys() for s in servers)  # two-phase's owner kept a server residual
        n = len(manager.replans)  # 2: the first quorum's, and the next quorum's (torchft forms a new
        manager.replan()  # quorum after a failed commit, on a new process group)
        assert len(manager.replans) == n + 1 and manager.replans[-1]["residual_ranges"] == len(moved)
        kept = residuals()
        assert kept.keys() == moved.keys() and all(np.array_equal(kept[k], moved[k]) for k in moved)
        assert not any(s.keys() for s in servers)  # dropped (docs/lowcomm.md, "torchft")
        step(fail=False)  # the re-planned exchange runs (agreement again on a new communicator)
        assert manager.gcodec_stats()["replans"] == n + 1  # the same quorum: no re-plan of its own
    finally:
        manager.shutdown(wait=False)
        lighthouse.shutdown()
