"""The summable transport's two-rank sum: the ranks' 16-bit values added in float32 from +0, rounded
once, decoded once (docs/transports.md, "Summable"); with fp16 and bf16 the sum and the decode are
one pass into the caller's output (``Codec.decode_values_sum``). Two thread ranks, real collectives
over shared slots (tests/localcomm.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.aggregate import reseal, sum_pair, summable_section
from gcodec.errors import PayloadValueError
from gcodec.transports import TransportState, allreduce_protocol, run_blocking
from tests.localcomm import ThreadComm, run_threads


def _inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    xs = []
    for r in range(2):
        x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 14, n))).astype(np.float32)
        x[:4] = [0.0, -0.0, 30000.0, -1e-8] if r == 0 else [-0.0, -0.0, 32000.0, 1e-8]
        xs.append(x)
    return xs


def _expected(codec: str, xs: list[np.ndarray], op: str) -> np.ndarray:
    """From the codec's own payloads: each rank's x (x / 2 for a mean) encoded, the two values
    sections summed as the transport sums (sum_pair), the sum decoded."""
    secs = []
    for x in xs:
        p = bytearray(gcodec.encode(x * np.float32(0.5) if op == "mean" else x, codec))
        secs.append((p, *summable_section(p)))
    (p0, v0, dt), (_, v1, _) = secs
    bad = sum_pair(v0, v1, v0, dt)
    assert bad == 0
    reseal(p0)
    return np.asarray(gcodec.decode(bytes(p0)), np.float32).reshape(-1)


def _run(codec: str, xs: list[np.ndarray], op: str, dtype: Any = np.float32) -> list[Any]:
    def rank(comm: ThreadComm) -> Any:
        st = TransportState(gcodec.get_codec(codec), error_feedback=False)
        x = xs[comm.rank].astype(dtype)
        out = np.empty_like(x)
        run_blocking(allreduce_protocol(comm, st, x, out, "w", op, "summable"))
        return np.array(out)

    return run_threads(2, rank)


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize("op", ["mean", "sum"])
@pytest.mark.parametrize("n", [4, 17, 70_001])
def test_two_ranks_decode_the_rounded_sum_of_their_values(codec: str, op: str, n: int) -> None:
    """Every rank gets, bit for bit, the decode of the two values sections summed as sum_pair sums
    (-0 + -0 gives +0; ties and subnormals as the spec rounds them), for a mean and a sum."""
    xs = _inputs(n)
    want = _expected(codec, xs, op)
    got = _run(codec, xs, op)
    for g in got:
        assert not isinstance(g, BaseException), g
        assert g.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
def test_a_float16_gradient_gets_the_same_sums_in_its_own_type(codec: str) -> None:
    """A float16 tensor (no float32 output to decode the sum into in one pass) takes the sum, then
    the codec's decode: the same sums, rounded to the tensor's type."""
    xs = [x.astype(np.float16).astype(np.float32) for x in _inputs(1001)]
    want = _expected(codec, xs, "mean").astype(np.float16)
    for g in _run(codec, xs, "mean", np.float16):
        assert not isinstance(g, BaseException), g
        assert g.dtype == np.float16 and g.view(np.uint16).tolist() == want.view(np.uint16).tolist()


def test_a_sum_beyond_the_range_is_refused_on_both_ranks() -> None:
    """65504 + 65504 rounds to infinity in binary16: both ranks raise the same PayloadValueError,
    which counts the non-finite sums."""
    xs = [np.full(40, 65504.0, np.float32), np.full(40, 65504.0, np.float32)]
    xs[1][:3] = 0.0
    got = _run("fp16", xs, "sum")
    for g in got:
        assert isinstance(g, PayloadValueError), g
        assert "37 summed value(s)" in str(g)
