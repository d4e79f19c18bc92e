"""PowerSGD's 16-bit factors in the two-allreduce protocol (gcodec/transports/lowrank.py,
specs/codecs/powersgd.md §8): with ``factors`` ``fp16`` or ``bf16`` each rank rounds its P and Q to
that format and the allreduces sum them in it. Thread ranks (tests/localcomm.ThreadComm) with real
collectives over shared slots; the torch communicator's bfloat16 path on one gloo rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.errors import ConfigError, PayloadValueError
from gcodec.transports import TransportState, allreduce_protocol, run_blocking
from tests.localcomm import ThreadComm, run_threads

from .gloo import one_rank  # noqa: F401  (a fixture)

SHAPE = (96, 64)


def _inputs(size: int, scale: float = 1e-2) -> list[np.ndarray]:
    """Per rank, a matrix of rank 3 plus noise (PowerSGD r2 keeps most of it, not all)."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((SHAPE[0], 3)) @ rng.standard_normal((3, SHAPE[1]))
    return [((base + 0.3 * rng.standard_normal(SHAPE)) * scale).astype(np.float32) for _ in range(size)]


class Recording(ThreadComm):
    """Records the element type of every allreduce a rank starts."""

    def __init__(self, base: ThreadComm) -> None:
        super().__init__(base.hub, base.rank)
        self.dtypes: list[str] = []

    def allreduce(self, arr: np.ndarray, op: str = "sum") -> Any:
        self.dtypes.append(str(arr.dtype))
        return super().allreduce(arr, op)


def _run(factors: Any, xs: list[np.ndarray], steps: int, comm_type: type = Recording) -> list[Any]:
    def rank(base: ThreadComm) -> dict[str, Any]:
        comm = comm_type(base)
        codec = gcodec.get_codec("powersgd", rank=2, factors=factors, seed=3)
        st = TransportState(codec, error_feedback=True)
        outs = []
        for _ in range(steps):
            outs.append(
                run_blocking(
                    allreduce_protocol(comm, st, xs[base.rank], np.empty(SHAPE, np.float32), "w", "mean", "auto")
                ).copy()
            )
        return {
            "outs": outs,
            "residual": np.array(st.lowrank_residuals["w"]),
            "payload": st.stats()["w"]["payload_bytes"],
            "dtypes": comm.dtypes,
        }

    return run_threads(len(xs), rank)


@pytest.mark.parametrize("factors, wire", [("fp16", "float16"), ("bf16", "bfloat16")])
def test_16_bit_factors_travel_in_16_bits_and_error_feedback_stays_exact(factors: str, wire: str) -> None:
    """Every rank ends each step with the same output; P and Q travel in the 16-bit type, half
    the bytes of float32 factors; and error feedback still accounts for everything: with the same
    input x_r every step, sum_t out_t + mean_r e_r(T) = T * mean_r x_r, because each rank's
    residual is its M minus the reconstruction from the rounded, summed factors (rounding and rank
    truncation alike). The identity holds up to float32 rounding of the T running sums (relative
    2**-24 each: 1e-5 of the norm bounds it generously for T = 12); a residual that missed the
    16-bit rounding would break it by the rounding itself, about 2**-11 of each factor."""
    size, steps = 2, 12
    xs = _inputs(size)
    got = _run(factors, xs, steps)
    ref = _run(None, xs, steps)
    for r in got + ref:
        assert not isinstance(r, BaseException), r
    for t in range(steps):
        assert np.array_equal(got[0]["outs"][t], got[1]["outs"][t])
    # the factors' allreduces carry the 16-bit type (after the control words' exchange, none float32 here:
    # the tensor is compressed whole, nothing rides in a float32 head)
    assert set(got[0]["dtypes"]) - {"int64"} == {wire}
    assert set(ref[0]["dtypes"]) - {"int64"} == {"float32"}
    assert got[0]["payload"] * 2 == ref[0]["payload"]
    mean = (xs[0].astype(np.float64) + xs[1]) / 2
    total = sum(o.astype(np.float64) for o in got[0]["outs"])
    resid = (got[0]["residual"].astype(np.float64) + got[1]["residual"]) / 2
    err = np.linalg.norm(total + resid - steps * mean) / np.linalg.norm(steps * mean)
    assert err < 1e-5, err
    # and it is not the float32 path under another name: the outputs differ, by little
    diff = np.linalg.norm(got[0]["outs"][-1] - ref[0]["outs"][-1]) / np.linalg.norm(ref[0]["outs"][-1])
    assert 0 < diff < 0.05, diff


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the thread ranks' NumPy sum of inf
def test_factors_beyond_binary16_are_refused_on_every_rank() -> None:
    """P = M Q of a matrix with entries near 1e4 exceeds binary16's 65504: the rounded factor is
    infinite, its sum too, and every rank raises PayloadValueError (none waits for the others)."""
    xs = _inputs(2, scale=1e4)
    got = _run("fp16", xs, 1)
    for r in got:
        assert isinstance(r, PayloadValueError), r
    ok = _run("bf16", xs, 1)  # bfloat16 has float32's range
    for r in ok:
        assert not isinstance(r, BaseException), r


def test_a_factor_codec_that_does_not_sum_is_refused_by_every_rank() -> None:
    got = _run({"id": "uniform", "bits": 8}, _inputs(2), 1)
    for r in got:
        assert isinstance(r, ConfigError) and "cannot be summed" in str(r), r


def test_ranks_that_disagree_on_the_factors_all_raise() -> None:
    """The factors are part of the codec's configuration, which the exchange's fingerprint compares."""

    xs = _inputs(2)

    def rank(base: ThreadComm) -> Any:
        codec = gcodec.get_codec("powersgd", rank=2, factors="fp16" if base.rank else None)
        st = TransportState(codec, error_feedback=True)
        return run_blocking(
            allreduce_protocol(base, st, xs[base.rank], np.empty(SHAPE, np.float32), "w", "mean", "auto")
        )

    got = run_threads(2, rank)
    for r in got:
        assert isinstance(r, ConfigError) and "factors" in str(r), r


class NoBfloat16(Recording):
    sums_bfloat16 = False  # as gcodec.mpi's communicator


def test_a_communicator_without_bfloat16_sums_refuses_bf16_factors_on_every_rank() -> None:
    got = _run("bf16", _inputs(2), 1, NoBfloat16)
    for r in got:
        assert isinstance(r, ConfigError) and "bfloat16" in str(r), r


@pytest.mark.torch
@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("factors", ["fp16", "bf16"])
def test_the_torch_communicator_sums_16_bit_factors(factors: str) -> None:
    """gcodec.torch.all_reduce on one gloo rank, each codec with a fresh state (the same initial
    Q): the factors go through gloo in 16 bits (NumPy's bfloat16 viewed through its bits) and come
    back as the rank's own rank-2 projection, the same as the float32 path's to the factors'
    rounding (2**-9 relative per factor entry for bfloat16, 2**-12 for binary16; 2e-2 bounds
    their effect on the product with room)."""
    torch = pytest.importorskip("torch")
    import gcodec.torch

    x = torch.from_numpy(_inputs(1)[0])
    ys = {}
    for f in (factors, None):
        y = x.clone()
        codec = gcodec.get_codec("powersgd", rank=2, factors=f, seed=3)
        gcodec.torch.all_reduce(y, codec, key="w", state=TransportState(codec, error_feedback=False))
        ys[f] = y
    rel = float((ys[factors] - ys[None]).norm() / ys[None].norm())
    assert 0 < rel < 2e-2, rel
