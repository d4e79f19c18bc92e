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


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize(
    ("mode", "p"), [("summable", 2), ("summable", 3), ("gather", 2), ("gather", 3), ("two_phase", 3)]
)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_peers_nonfinite_value_is_refused_on_every_rank_in_every_mode(
    codec: str, mode: str, p: int, bad: float
) -> None:
    """A codec that carries NaN and infinity (fp16, bf16) puts one rank's non-finite input into
    every rank's sum; whichever mode runs the exchange, every rank refuses that sum with the same
    PayloadValueError (the mode ``auto`` picks must not decide whether it reaches the result)."""
    xs = [np.linspace(-1, 1, 1000, dtype=np.float32) * (r + 1) for r in range(p)]
    xs[p - 1][123] = bad
    got = _run(codec, xs, "mean", mode)
    assert all(isinstance(g, gcodec.PayloadValueError) for g in got), got
    # the rank that found it says what (in two-phase, the owner of the chunk; the others name it)
    assert any("summed value(s) are NaN or infinite" in str(g) for g in got), got


def test_a_two_phase_sum_beyond_fp16s_range_is_refused_on_every_rank() -> None:
    """The owners' sums re-encoded in fp16: 3 x 30000 rounds to infinity there, which every rank
    then decodes; all refuse it, as the summable mode refuses 65504 + 65504."""
    xs = [np.full(1000, 30000.0, np.float32) for _ in range(3)]
    for g in _run("fp16", xs, "sum", "two_phase"):
        assert isinstance(g, gcodec.PayloadValueError), g


def test_finite_sums_of_carrying_codecs_still_pass_in_gather_and_two_phase() -> None:
    """The refusal costs nothing to a finite exchange: the same bits as before."""
    xs = [np.linspace(-1, 1, 1000, dtype=np.float32) * (r + 1) for r in range(3)]
    want = _expected_gather("fp16", xs, "sum")
    for g in _run("fp16", xs, "sum", "gather"):
        assert not isinstance(g, BaseException), g
        assert _bits(g).tolist() == _bits(want).tolist()


_DENSEST = [
    {"id": "threshold", "threshold": 0.0},
    {"id": "topk", "ratio": 1.0, "index_coding": "raw"},
    {"id": "topk", "ratio": 1.0},
    {"id": "chunktopk", "chunk": 64, "k": 64},
    {"id": "dct", "chunk": 64, "k": 64},
    {"id": "randomk", "ratio": 1.0},
    {"id": "powersgd", "rank": 4},
    {"id": "topk", "ratio": 1.0, "values": {"id": "uniform", "bits": 8}},
    "qsgd",
    "terngrad",
    "sign",
    "uniform",
    "fp8",
    "mx",
    "nvfp4",
    "fp16",
    "bf16",
]


@pytest.mark.parametrize("cfg", _DENSEST, ids=lambda c: str(c))
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (7,), (1000,), (128, 96), (65_537,)])
def test_no_payload_exceeds_its_codecs_max_payload_bytes(cfg: Any, dtype: Any, shape: tuple[int, ...]) -> None:
    """What a receiver accepts from a peer (Codec.max_payload_bytes) holds every honest payload,
    the densest settings of every codec included (a sparse codec keeping everything in raw float64
    values and raw indices is the largest); for fp16/bf16 it is exact but for the header."""
    codec = gcodec.get_codec(cfg)
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    n = len(codec.encode(x, key="t", step=0))
    bound = codec.max_payload_bytes(shape, np.dtype(dtype))
    assert n <= bound, (n, bound)
    if codec.codec_id in ("fp16", "bf16"):
        assert bound - n < 4096 + 2 * len(codec.config_key)
