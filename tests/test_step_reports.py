"""Per-step reports (gcodec.transports.stats.StepReports, KeyRounds) and the reports of the engines
called one key at a time: a TransportState's (gcodec.mpi / gcodec.torch.all_reduce with a codec)
and a Router's (with a policy), run here on thread ranks. The DDP hook's and FSDP2's reports are
checked on real gloo ranks (tests/transport_ranks/torch_program.py, fsdp_program.py), these
engines' also on real mpiexec ranks (tests/transport_ranks/mpi_program.py, scenario ``report``)."""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec.transports import Router, TransportState, run_blocking
from gcodec.transports.allreduce import allreduce_protocol
from gcodec.transports.stats import DENSE, REPORT_FIELDS, KeyRounds, StepReports, StepStats
from tests.localcomm import run_threads
from tests.transport_ranks.report_checks import N_B, check_rounds


def _stats(mode: str, payload: int, wire: int, enc: float = 0.0, comm: float = 0.0, dec: float = 0.0) -> StepStats:
    st = StepStats("k", 0, mode, payload)
    st.add("payload_bytes", payload)
    st.add("wire_bytes", wire)
    st.add("encode_s", enc)
    st.add("comm_s", comm)
    st.add("decode_s", dec)
    return st


def _bytes(last: dict) -> tuple[int, int, int, int]:
    return last["payload_bytes"], last["wire_bytes"], last["dense_bytes"], last["dense_wire_bytes"]


def test_a_part_sent_dense_as_a_whole_is_dense_bytes_in_a_compressed_step_and_payload_otherwise() -> None:
    r = StepReports()
    # step 0 compresses nothing: what the dense part sent is the step's payload (it was sent)
    r.add(0, [_stats(DENSE, 400, 300)], raw_bytes=400, held_s=0.5, last=True)
    last = r.as_dict()["last"]
    assert _bytes(last) == (400, 300, 0, 0)
    # step 1: one part compressed, another sent dense as a whole: it shows beside the compressed one
    r.add(1, [_stats("summable", 100, 75, 0.1, 0.1, 0.1)], raw_bytes=400, held_s=0.4)
    r.add(1, [_stats(DENSE, 400, 300, comm=0.2)], raw_bytes=400, held_s=0.3, last=True)
    last = r.as_dict()["last"]
    assert _bytes(last) == (100, 75, 400, 300)
    assert last["comm_s"] == pytest.approx(0.3) and last["held_s"] == pytest.approx(0.7)
    assert last["overhead_s"] == pytest.approx(0.7 - 0.5)
    tot = r.as_dict()["total"]
    assert r.as_dict()["steps"] == 2 and tot["raw_bytes"] == 1200 and tot["payload_bytes"] == 500
    assert tot["dense_bytes"] == 400


def test_a_step_closes_once_its_parts_are_in_and_a_failed_step_is_dropped() -> None:
    r = StepReports()
    r.add(0, [_stats("gather", 10, 10)], raw_bytes=40, held_s=0.1, parts=2)
    assert r.as_dict()["last"] is None  # one part of two
    r.add(0, [_stats("gather", 10, 10)], raw_bytes=40, held_s=0.1, parts=2)
    assert r.as_dict()["last"]["raw_bytes"] == 80
    r.add(1, [_stats("gather", 10, 10)], raw_bytes=40, held_s=0.1, parts=2)  # its second part failed
    r.add(2, [_stats("gather", 10, 10)], raw_bytes=40, held_s=0.1, last=True)
    d = r.as_dict()
    assert d["last"]["step"] == 2 and d["steps"] == 2 and d["total"]["raw_bytes"] == 120
    assert set(d["last"]) == {"step", *REPORT_FIELDS}  # no bookkeeping field leaks


def test_key_rounds_end_when_a_key_comes_back_and_a_late_key_joins_the_round_in_progress() -> None:
    r = KeyRounds()
    r.add_call("a", [_stats("summable", 1, 1)], raw_bytes=10, held_s=0.1)
    r.add_call("b", [_stats("summable", 1, 1)], raw_bytes=20, held_s=0.1)
    assert r.as_dict()["last"] is None  # the round is still open
    r.add_call("a", [_stats("summable", 1, 1)], raw_bytes=10, held_s=0.1)  # a is back: round 0 ends
    assert r.as_dict()["last"]["step"] == 0 and r.as_dict()["last"]["raw_bytes"] == 30
    r.add_call("c", [_stats("summable", 1, 1)], raw_bytes=40, held_s=0.1)  # first seen now: round 1
    r.add_call("b", [_stats("summable", 1, 1)], raw_bytes=20, held_s=0.1)
    r.end_step()
    assert r.as_dict()["last"]["step"] == 1 and r.as_dict()["last"]["raw_bytes"] == 70
    r.end_step()  # nothing since: no empty round
    assert r.as_dict()["steps"] == 2
    r.reset()
    assert r.as_dict() == {"last": None, "steps": 0, "total": dict.fromkeys(REPORT_FIELDS, 0)}


@pytest.mark.parametrize("end_each", [True, False])
def test_a_routers_report_covers_every_key_dense_ones_included_and_adds_up(end_each: bool) -> None:
    def rank(comm):  # type: ignore[no-untyped-def]
        router = Router({"b": None}, codec={"id": "uniform", "bits": 4}, mode="gather")

        def run_key(k: str, x: np.ndarray) -> None:
            run_blocking(router.protocol(comm, x, x, k, "mean"))

        return check_rounds(comm.rank, comm.size, run_key, router, end_each, dense=4 * N_B)

    for got in run_threads(2, rank):
        assert got == [], got


@pytest.mark.parametrize("end_each", [True, False])
def test_a_transport_states_report_covers_its_keys_and_adds_up(end_each: bool) -> None:
    codec = gcodec.get_codec({"id": "uniform", "bits": 4})

    def rank(comm):  # type: ignore[no-untyped-def]
        state = TransportState(codec, mode="gather")

        def run_key(k: str, x: np.ndarray) -> None:
            run_blocking(allreduce_protocol(comm, state, x, x, k, "mean", "gather"))

        bad = check_rounds(comm.rank, comm.size, run_key, state, end_each, dense=0)
        if state.step_report()["steps"] != (3 if end_each else 2):
            bad.append(f"{state.step_report()['steps']} rounds")
        state.reset_stats()
        if state.step_report()["steps"] != 0 or state.stats():
            bad.append("reset_stats left figures")
        return bad

    for got in run_threads(2, rank):
        assert got == [], got
