"""A rank whose own work fails, with any exception, takes part in the exchange with an error code
(docs/transports.md "Agreement"): every rank raises at that step, the failing rank its own error,
the peers a :class:`gcodec.GcodecError` naming it, and the next exchange works. Thread ranks
(tests/localcomm.ThreadComm) with real collectives over shared slots: a rank that waits for a
message its peers never send fails with ``BrokenBarrierError`` after the hub's timeout instead of
hanging, so a rank left alone fails these tests.

The failure is injected by a codec subclass (same id and parameters, so the ranks agree on the
configuration) whose encode raises a ``RuntimeError`` on one rank at one step: a bug or an
exhausted resource in a rank's local work, not a gcodec error. The real DDP hook and FSDP2 with a
user's policy that raises on one rank: tests/transport_ranks/diverge_torch.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.codecs import get_codec
from gcodec.transports import Router, TransportState, allreduce_protocol, run_blocking
from tests.localcomm import ThreadComm, run_threads

SHAPE = (48, 40)
#: (codec config, mode): one per protocol of the allreduce (summable, gather, two-phase, PowerSGD,
#: shared-seed Random-K, which is summable)
CASES = [
    ({"id": "fp16"}, "summable"),
    ({"id": "uniform", "bits": 8}, "gather"),
    ({"id": "uniform", "bits": 8}, "two_phase"),
    ({"id": "powersgd", "rank": 2}, "powersgd"),
    ({"id": "randomk", "ratio": 0.25, "seed": 5}, "summable"),
]


class Injected(RuntimeError):
    """The failure a faulty rank's encode raises."""


def faulty(cfg: dict[str, Any], fail: list[bool]) -> gcodec.Codec:
    """``cfg``'s codec, whose encode (and PowerSGD's first round) raises :class:`Injected` while
    ``fail[0]`` is set."""
    base = type(get_codec(cfg))

    def plan(self: Any, x: Any, ctx: Any) -> Any:
        if fail[0]:
            raise Injected("injected failure in this rank's encode")
        return base.plan(self, x, ctx)

    def begin(self: Any, x: Any, **kw: Any) -> Any:
        if fail[0]:
            raise Injected("injected failure in this rank's first PowerSGD round")
        return base.begin(self, x, **kw)  # type: ignore[attr-defined]

    attrs: dict[str, Any] = {"plan": plan}
    if hasattr(base, "begin"):
        attrs["begin"] = begin
    cls = type(f"Faulty{base.__name__}", (base,), attrs)
    params = {k: v for k, v in cfg.items() if k != "id"}
    return cls(**params)  # type: ignore[no-any-return]


def inputs(rank: int, step: int) -> np.ndarray:
    return np.random.default_rng(100 * step + rank).standard_normal(SHAPE).astype(np.float32)


def three_steps(step: Callable[[int], Any]) -> list[Any]:
    """``step(0)``, ``step(1)``, ``step(2)`` on one rank: each one's result or the exception it
    raised (every rank's outcome is checked by the test, whatever it is)."""
    outcome: list[Any] = []
    for i in range(3):
        try:
            outcome.append(step(i))
        except Exception as e:
            outcome.append(e)
    return outcome


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("cfg, mode", CASES, ids=[f"{c['id']}-{m}" for c, m in CASES])
def test_a_rank_whose_encode_raises_any_error_makes_every_rank_raise(cfg: dict[str, Any], mode: str, size: int) -> None:
    bad = size - 1

    def rank(comm: ThreadComm) -> Any:
        fail = [False]
        codec = faulty(cfg, fail) if comm.rank == bad else get_codec(cfg)
        st = TransportState(codec, error_feedback=False, mode=mode)

        def step(i: int) -> np.ndarray:
            fail[0] = i == 1
            x = inputs(comm.rank, i)
            out = np.empty_like(x)
            run_blocking(allreduce_protocol(comm, st, x, out, "w", "mean", mode))
            return out

        return three_steps(step)

    got = run_threads(size, rank)
    for r, outcome in enumerate(got):
        assert not isinstance(outcome, BaseException), f"rank {r}: {outcome!r}"
        first, failed, after = outcome
        assert isinstance(first, np.ndarray), f"rank {r}, agreed step: {first!r}"
        if r == bad:
            assert isinstance(failed, Injected), f"rank {r}: {failed!r}"
        else:
            # the peers raise the gcodec error class of the failing rank's code, naming it; PowerSGD
            # and summable codecs learn it from the NaN the failing rank sent instead of its values
            assert isinstance(failed, gcodec.GcodecError), f"rank {r}: {failed!r}"
            assert f"rank {bad}" in str(failed) or "NaN" in str(failed), str(failed)
        # the next exchange works: the mean of every rank's input within the codec's error
        assert isinstance(after, np.ndarray), f"rank {r}, step after: {after!r}"
        assert np.all(np.isfinite(after))
        if cfg["id"] in ("fp16", "uniform"):
            xs = [inputs(q, 2) for q in range(size)]
            # fp16 (|x| < 8): x / p and the sum round once each, half an ulp of 2**-7 each;
            # uniform 8 bits: half a step max|x| / 127 per term, and two-phase's re-encode another
            step = max(float(np.abs(a).max()) for a in xs) / 127
            bound = 2.0**-8 if cfg["id"] == "fp16" else step * 1.01 + 1e-7
            assert float(np.abs(after - np.mean(xs, axis=0)).max()) <= bound


class RaisingPolicy:
    """A user's policy (``codec_for(name, shape, step)``) with a bug on one rank at one step."""

    def __init__(self, raise_at: int | None) -> None:
        self.raise_at = raise_at

    def codec_for(self, name: str, shape: tuple[int, ...], step: int) -> Any:
        if step == self.raise_at:
            raise KeyError(f"no rule for {name!r}")
        return {"id": "uniform", "bits": 8}


@pytest.mark.parametrize("size", [2, 3])
def test_a_policy_that_raises_on_one_rank_makes_every_rank_raise(size: int) -> None:
    bad = size - 1

    def rank(comm: ThreadComm) -> Any:
        router = Router(RaisingPolicy(1 if comm.rank == bad else None), error_feedback=False)

        def step(i: int) -> Any:
            x = inputs(comm.rank, i)
            return run_blocking(router.protocol(comm, x, np.empty_like(x), "w", "mean"))

        return three_steps(step)

    got = run_threads(size, rank)
    for r, outcome in enumerate(got):
        assert not isinstance(outcome, BaseException), f"rank {r}: {outcome!r}"
        first, failed, after = outcome
        assert not isinstance(first, BaseException), f"rank {r}, agreed step: {first!r}"
        if r == bad:
            assert isinstance(failed, KeyError), f"rank {r}: {failed!r}"
        else:
            assert isinstance(failed, gcodec.GcodecError) and f"rank {bad}" in str(failed), f"rank {r}: {failed!r}"
        assert not isinstance(after, BaseException), f"rank {r}, step after: {after!r}"
