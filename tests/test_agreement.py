"""Continuous agreement (gcodec/transports/control.py, docs/transports.md "Agreement").

In-process: thread ranks (tests/localcomm.ThreadComm) with real collectives over shared slots,
where a hostile rank can send any control words. With real processes: ``mpiexec -n 2`` and ``-n 4``
and gloo ranks on 127.0.0.1, where the last rank changes its codec, length, dtype or mode after
two agreed steps, on gcodec.mpi, gcodec.torch.all_reduce, the DDP hook and FSDP2's reduce-scatter
(tests/transport_ranks/diverge.py); every rank must raise a ConfigError naming the field, and the
next exchange must work. A hang fails through the runners' deadlines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.errors import ConfigError
from gcodec.transports import TransportState, allreduce_protocol, run_blocking
from gcodec.transports.control import AGREE, BEGIN, HEAD, TAG, Exchange
from gcodec.transports.handshake import fingerprint
from tests.localcomm import ThreadComm, run_threads
from tests.procs import checks_of

ROOT = Path(__file__).resolve().parents[1]


def _allreduce(comm: ThreadComm, state: TransportState, x: np.ndarray, key: str = "w", mode: str = "auto") -> Any:
    return run_blocking(allreduce_protocol(comm, state, x, np.empty_like(x), key, "mean", mode))


class Counting(ThreadComm):
    """Counts the collectives a rank starts, by kind."""

    def __init__(self, base: ThreadComm) -> None:
        super().__init__(base.hub, base.rank)
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def allgather(self, arr: np.ndarray) -> Any:
        self._count("allgather")
        return super().allgather(arr)

    def allgatherv(self, buf: np.ndarray, counts: Any) -> Any:
        self._count("allgatherv")
        return super().allgatherv(buf, counts)


@pytest.mark.parametrize("codec, collectives", [("fp16", {"allgather": 1, "allgatherv": 1}), ("uniform", None)])
def test_an_agreed_exchange_carries_only_its_digest(codec: str, collectives: dict[str, int] | None) -> None:
    """After the first exchange of a key, no fingerprint travels: summable pays one control
    all-gather before its values, gather none beyond the sizes it exchanges anyway."""

    def rank(base: ThreadComm) -> dict[str, int]:
        comm = Counting(base)
        st = TransportState(codec, error_feedback=False)
        x = np.full(4096, base.rank + 1.0, np.float32)
        _allreduce(comm, st, x)  # first: BEGIN, FINGERPRINT + its JSON, then the protocol
        first = dict(comm.calls)
        comm.calls.clear()
        y = _allreduce(comm, st, x)
        assert np.allclose(y, 1.5, rtol=1e-2)
        return {"first": first, "then": dict(comm.calls)}  # type: ignore[dict-item]

    got = run_threads(2, rank)
    for r in got:
        assert not isinstance(r, BaseException), r
        assert r["first"]["allgatherv"] == r["then"]["allgatherv"] + 1  # the fingerprints' JSON, once
        assert r["first"]["allgather"] == r["then"]["allgather"] + 1  # their lengths, once
        if collectives is not None:
            assert r["then"] == collectives
        else:  # gather: BEGIN with the sizes, payloads, final agreement
            assert r["then"] == {"allgather": 2, "allgatherv": 1}


class _Waited:
    """A work that notes in ``log`` when the protocol waits for it."""

    def __init__(self, work: Any, log: list[str], name: str) -> None:
        self.work, self.log, self.name = work, log, name

    def test(self) -> bool:
        return bool(self.work.test())

    def wait(self) -> Any:
        self.log.append(f"{self.name} waited")
        return self.work.wait()

    def result(self) -> Any:
        return self.work.result()


def test_the_summable_begin_travels_while_the_values_are_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summable protocol starts its BEGIN before the encode and waits for it after (its round
    trip overlaps the encode), and starts the values' collective only once every rank's BEGIN has
    arrived: a changed configuration is still caught before any value travels."""
    import threading

    import gcodec.transports.summable as summable

    local = threading.local()
    real = summable.encode_into

    def encode_into(*a: Any, **k: Any) -> Any:
        local.log.append("encode")
        return real(*a, **k)

    monkeypatch.setattr(summable, "encode_into", encode_into)

    class Logged(ThreadComm):
        def __init__(self, base: ThreadComm) -> None:
            super().__init__(base.hub, base.rank)

        def allgather(self, arr: np.ndarray) -> Any:
            local.log.append("control started")
            return _Waited(super().allgather(arr), local.log, "control")

        def allgatherv(self, buf: np.ndarray, counts: Any) -> Any:
            local.log.append("bytes started")
            return super().allgatherv(buf, counts)

    def rank(base: ThreadComm) -> list[str]:
        local.log = []
        comm = Logged(base)
        st = TransportState("fp16", error_feedback=False)
        x = np.full(4096, base.rank + 1.0, np.float32)
        _allreduce(comm, st, x)  # the first exchange also agrees in full
        local.log = []
        _allreduce(comm, st, x)
        return list(local.log)

    for r in run_threads(2, rank):
        assert not isinstance(r, BaseException), r
        assert r == ["control started", "encode", "control waited", "bytes started"], r


def test_a_change_after_agreement_raises_a_config_error_on_every_rank_and_the_next_exchange_works() -> None:
    def rank(comm: ThreadComm) -> list[str]:
        x = np.ones(4096, np.float32)
        st8, st4 = (
            TransportState({"id": "uniform", "bits": 8}, error_feedback=False),
            TransportState({"id": "uniform", "bits": 4}, error_feedback=False),
        )
        _allreduce(comm, st8, x)
        _allreduce(comm, st8, x)
        out = []
        try:
            _allreduce(comm, st4 if comm.rank == 2 else st8, x)
        except gcodec.ConfigError as e:
            out.append(f"{type(e).__name__}: {e}")
        y = _allreduce(comm, st8, x)
        out.append(str(float(np.max(np.abs(y - 1)))))
        return out

    for r in run_threads(3, rank):
        assert not isinstance(r, BaseException), r
        assert r[0].startswith("ConfigError") and "bits" in r[0] and "[2]" in r[0], r
        assert float(r[1]) == 0.0


def _control(comm: ThreadComm, words: np.ndarray) -> np.ndarray:
    """Send raw control words as a hostile rank would."""
    return np.asarray(comm.allgather(words).wait())


def _good_words(comm: ThreadComm, ex: Exchange, kind: int) -> np.ndarray:
    w = np.zeros(HEAD + comm.size, np.int64)
    w[0], w[1], w[2] = TAG | kind, getattr(comm, "_control_seq", 0), ex.digest
    return w


@pytest.mark.parametrize("lie", ["not a control message", "wrong kind", "wrong sequence number"])
def test_a_message_of_the_wrong_kind_is_a_protocol_order_error_never_data(lie: str) -> None:
    fp = fingerprint(key="k", what="test")

    def rank(comm: ThreadComm) -> Any:
        ex = Exchange(comm, fp, {"k": json.dumps(fp, sort_keys=True)}, "k", "test exchange")
        if comm.rank == 1:
            w = _good_words(comm, ex, BEGIN)
            if lie == "not a control message":
                w[:] = 4096  # what a size message of another protocol looks like
            elif lie == "wrong kind":
                w[0] = TAG | AGREE
            else:
                w[1] += 1
            _control(comm, w)
            return "sent"
        try:
            run_blocking(ex.sizes([10]))
        except gcodec.ProtocolOrderError as e:
            return e
        return "read as data"

    got = run_threads(2, rank)
    assert got[1] == "sent"
    assert isinstance(got[0], gcodec.ProtocolOrderError), got[0]
    assert "rank 1" in str(got[0])


def test_after_an_order_error_every_rank_continues_from_the_same_sequence_number() -> None:
    def rank(comm: ThreadComm) -> Any:
        comm._control_seq = 5 if comm.rank == 0 else 9  # type: ignore[attr-defined]
        st = TransportState("fp16", error_feedback=False)
        x = np.full(256, 2.0, np.float32)
        try:
            _allreduce(comm, st, x)
            return "no error"
        except gcodec.ProtocolOrderError:
            pass
        return float(_allreduce(comm, st, x)[0])

    assert run_threads(2, rank) == [2.0, 2.0]


def test_a_rank_that_cannot_set_up_its_exchange_takes_part_and_every_rank_raises() -> None:
    def rank(comm: ThreadComm) -> Any:
        st = TransportState("uniform", error_feedback=False)
        x = np.ones(512, np.float32)
        try:  # rank 1 asks for a mode the codec cannot run: a local ConfigError before any collective
            _allreduce(comm, st, x, mode="summable" if comm.rank == 1 else "gather")
        except gcodec.ConfigError as e:
            return e
        return "no error"

    got = run_threads(2, rank)
    assert all(isinstance(e, gcodec.ConfigError) for e in got), got
    assert "not summable" in str(got[1]) and "rank 1" in str(got[0])


def test_lying_part_sizes_in_a_reduce_scatter_block_fail_on_every_rank() -> None:
    from gcodec.transports.reduce_scatter import RSGroup, reduce_scatter_protocol

    class Liar(ThreadComm):
        def alltoallv(self, bufs: Any, recv_counts: Any) -> Any:
            bufs = [b.copy() for b in bufs]
            for b in bufs:
                b[:8] = np.array([1 << 40], np.int64).view(np.uint8)  # the first part's size
            return super().alltoallv(bufs, recv_counts)

    def rank(base: ThreadComm) -> Any:
        comm = Liar(base.hub, base.rank) if base.rank == 1 else base
        st = TransportState("uniform", error_feedback=False)
        x = np.ones((2, 1024), np.float32)
        groups = [RSGroup("g", [(0, 512)], st), RSGroup("d", [(512, 1024)], None)]
        fp = fingerprint(key="rs")
        ex = Exchange(comm, fp, None, "rs", "reduce-scatter")
        try:
            run_blocking(reduce_scatter_protocol(ex, x, np.empty(1024, np.float32), groups, 0.5, "rs"))
        except gcodec.GcodecError as e:
            return e
        return "no error"

    got = run_threads(2, rank)
    assert all(isinstance(e, gcodec.GcodecError) for e in got), got
    assert "part sizes" in str(got[0])


# ---- real processes ------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_ranks_that_change_their_minds_all_raise(tmp_path: Path, n: int) -> None:
    pytest.importorskip("mpi4py")
    from tests.procs import run_mpi

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    proc = run_mpi("tests.transport_ranks.diverge_mpi", [str(tmp_path)], n, 180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = checks_of(tmp_path, range(n))
    # 5 protocols x 4 changes x (the error, the next exchange), + MPI itself afterwards
    assert len(checks) == n * (5 * 4 * 2 + 1)


@pytest.mark.torch
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(
    "engine, per_rank",
    # the changes of tests/transport_ranks/diverge.py (2 checks each), and a user's policy that
    # raises a KeyError on the last rank: 4 DDP hook protocols and 2 FSDP codecs, 2 checks each
    # (+1 each: the process group works afterwards)
    [("all_reduce", 41), ("hook", 41), ("fsdp", 17), ("hook_policy_raises", 9), ("fsdp_policy_raises", 5)],
)
def test_gloo_ranks_that_change_their_minds_all_raise(tmp_path: Path, n: int, engine: str, per_rank: int) -> None:
    pytest.importorskip("torch")
    from tests.procs import run_ranks

    codes = run_ranks("tests.transport_ranks.diverge_torch", [engine, str(tmp_path)], n, 240, tmp_path)
    assert codes == [0] * n
    assert len(checks_of(tmp_path, range(n))) == n * per_rank


@pytest.mark.parametrize("size", [-1, 1 << 40])
def test_a_peer_announcing_an_impossible_size_is_refused_before_anything_is_allocated(size: int) -> None:
    fp = fingerprint(key="k")

    def rank(comm: ThreadComm) -> Any:
        ex = Exchange(comm, fp, None, "k", "test exchange")
        if comm.rank == 1:
            w = _good_words(comm, ex, BEGIN)
            w[HEAD] = size
            w[4] = 0  # no handshake asked for: the size itself must be refused
            _control(comm, w)
            return "sent"
        try:
            run_blocking(ex.sizes([10]))
        except gcodec.LimitExceededError as e:
            return e
        return "accepted"

    got = run_threads(2, rank)
    assert isinstance(got[0], gcodec.LimitExceededError) and "rank 1" in str(got[0]), got


def test_a_peer_sequence_number_at_the_end_of_int64_is_an_order_error_not_an_overflow() -> None:
    def rank(comm: ThreadComm) -> Any:
        comm._control_seq = (1 << 63) - 1 if comm.rank == 1 else 0  # type: ignore[attr-defined]
        st = TransportState("fp16", error_feedback=False)
        x = np.full(256, 2.0, np.float32)
        try:
            _allreduce(comm, st, x)
        except gcodec.ProtocolOrderError:
            pass
        return float(_allreduce(comm, st, x)[0])  # both continue from the same (wrapped) number

    assert run_threads(2, rank) == [2.0, 2.0]


def test_ranks_with_different_error_feedback_decays_all_raise() -> None:
    """The decay changes what every rank sends from the next step on (the residual it adds), so it is
    part of the agreed configuration: a rank with another decay makes every rank raise, naming it.
    Without a decay (1.0) the fingerprint is the one it always was (``ef: true``)."""

    def rank(comm: ThreadComm) -> str:
        x = np.linspace(-1, 1, 4096, dtype=np.float32)
        st = TransportState({"id": "topk", "ratio": 0.01}, decay=0.95 if comm.rank == 1 else 1.0)
        try:
            _allreduce(comm, st, x)
        except ConfigError as e:
            return str(e)
        return "no error"

    got = run_threads(2, rank)
    assert all(isinstance(r, str) and "decay" in r and "0.95" in r for r in got), got
    from gcodec.transports.allreduce import ef_fingerprint

    assert ef_fingerprint(TransportState("topk")) is True
    assert ef_fingerprint(TransportState("topk", decay=0.5)) == {"decay": 0.5}
    with pytest.raises(ConfigError, match="decay"):
        TransportState("topk", worker=gcodec.ErrorFeedback("topk", decay=0.9), decay=0.8)


class _Announcing(ThreadComm):
    """A rank that announces ``size`` bytes in every size-carrying control message it sends (what a
    lying or broken peer does), whatever it holds."""

    size_lie = 1 << 30

    def allgather(self, arr: np.ndarray) -> Any:
        a = np.array(arr, copy=True)
        if a.dtype == np.int64 and a.shape[0] == HEAD + self.size and a[0] & ~0xFF == TAG:
            a[HEAD:] = np.where(a[HEAD:] > 0, self.size_lie, a[HEAD:])
        return super().allgather(a)


@pytest.mark.parametrize(("mode", "p"), [("gather", 2), ("gather", 3), ("two_phase", 3)])
@pytest.mark.parametrize("codec", ["uniform", {"id": "topk", "ratio": 0.05}])
def test_a_peer_announcing_more_than_the_plan_can_produce_is_refused_before_any_allocation(
    mode: str, p: int, codec: Any
) -> None:
    """A rank announcing 1 GiB for a payload of a 65,536-element tensor: every rank raises the same
    LimitExceededError naming it, from the size table alone (the bound is the codec's largest
    payload for the agreed shape, Codec.max_payload_bytes, not the 2 GiB max_payload_bytes limit),
    and nothing of that size is allocated."""
    import tracemalloc

    def rank(comm: ThreadComm) -> Any:
        if comm.rank == 1:
            comm = _Announcing(comm.hub, comm.rank)
        st = TransportState(codec, error_feedback=False)
        x = np.linspace(-1, 1, 65_536, dtype=np.float32)
        try:
            _allreduce(comm, st, x, mode=mode)
        except gcodec.GcodecError as e:
            return e
        return "no error"

    tracemalloc.start()
    try:
        got = run_threads(p, rank)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for g in got:
        assert isinstance(g, gcodec.LimitExceededError), g
        assert "rank 1 announced 1073741824 bytes" in str(g) and "largest payload the agreed plan" in str(g), g
    assert peak < 64 << 20, peak  # the tensors and payloads of p ranks, not p x 1 GiB
