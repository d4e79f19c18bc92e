"""The sum that the gather and two-phase modes take of decoded payloads: rank order from +0, then
scaled for a mean (docs/transports.md, "Modes"). The gather mode scales the sum straight into the
output after the ranks agree (one pass instead of a scaling and a copy); the result must stay the
sum begun at +0 bit for bit, signed zeros included. Thread ranks, real collectives over shared
slots (tests/localcomm.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.transports import TransportState, allreduce_protocol, run_blocking
from tests.localcomm import ThreadComm, run_threads


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _expected_gather(codec: str, xs: list[np.ndarray], op: str) -> np.ndarray:
    """Each rank's payload (deterministic codecs: what the codec encodes alone), decoded and added
    in rank order into a buffer of +0, then multiplied by 1/p in float32 for a mean."""
    acc = np.zeros(xs[0].size, np.float32)
    for x in xs:
        gcodec.decode(gcodec.encode(x, codec), out=acc, accumulate=True)
    return acc * np.float32(1 / len(xs)) if op == "mean" else acc


def _run(codec: str, xs: list[np.ndarray], op: str, mode: str) -> list[Any]:
    def rank(comm: ThreadComm) -> Any:
        st = TransportState(gcodec.get_codec(codec), error_feedback=False)
        out = np.full_like(xs[comm.rank], 7.0)
        run_blocking(allreduce_protocol(comm, st, xs[comm.rank], out, "w", op, mode))
        return np.array(out)

    return run_threads(len(xs), rank)


@pytest.mark.parametrize("codec", ["fp16", "uniform", "topk", "sign"])
@pytest.mark.parametrize("op", ["mean", "sum"])
def test_gather_mode_sums_from_plus_zero_in_rank_order(codec: str, op: str) -> None:
    """Two ranks in gather mode get, bit for bit, the rank-order sum from +0 of the decoded
    payloads: where both ranks send -0 (fp16 and top-k keep the sign of a stored zero) the sum is
    +0, as -0 + -0 from a +0 start gives."""
    rng = np.random.default_rng(3)
    xs = []
    for _ in range(2):
        x = rng.standard_normal(4099).astype(np.float32)
        x[:64] = -0.0  # the same on both ranks
        x[64:70] = [0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0]
        xs.append(x)
    expected = _expected_gather(codec, xs, op)
    got = _run(codec, xs, op, "gather")
    for r in got:
        assert isinstance(r, np.ndarray), r
        assert np.array_equal(_bits(r), _bits(expected))


@pytest.mark.parametrize("codec", ["topk", "fp16"])
def test_two_phase_owner_sum_of_negative_zeros_is_plus_zero(codec: str) -> None:
    """Three ranks in two-phase mode whose tensors are all -0: each chunk owner's sum (re-encoded
    by a codec that keeps the sign of a stored zero) is +0, so every element comes back +0, as
    from a sum begun at +0 (a sum begun with the first payload would be -0)."""
    xs = [np.full(3 * 512, -0.0, np.float32) for _ in range(3)]
    for r in _run(codec, xs, "mean", "two_phase"):
        assert isinstance(r, np.ndarray), r
        assert not _bits(r).any(), "an element came back -0 (or not zero)"
