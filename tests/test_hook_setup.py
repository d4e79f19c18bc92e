"""What the DDP hook does when it is configured and at its first compressed step: the configured
codecs' kernels are loaded at construction (``HookState(warm=True)``, the default), and a codec that
cannot shrink its gradients (fp16 or bf16 on 16-bit gradients) is warned about once. One gloo rank
in this process."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcodec.torch  # noqa: E402

from .gloo import one_rank  # noqa: E402, F401  (a fixture)

pytestmark = [pytest.mark.torch]


def _steps(model: torch.nn.Module, state: gcodec.torch.HookState, dtype: torch.dtype, n: int = 3) -> list[str]:
    ddp = DDP(model)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    x = torch.randn(8, 256, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            ddp(x).float().sum().backward()
        gcodec.torch.synchronize()
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_cast_on_16_bit_gradients_is_warned_about_once(codec: str, dtype: torch.dtype) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)).to(dtype)
    st = gcodec.torch.HookState(codec, start_iter=0, min_numel=16, module=model)
    got = [m for m in _steps(model, st, dtype) if "does not shrink" in m]
    assert len(got) == 1, got
    assert codec in got[0] and str(dtype).replace("torch.", "") in got[0]


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("codec", ["fp16", {"id": "uniform", "bits": 8}])
def test_no_warning_where_the_codec_shrinks_the_gradients(codec: object) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10))
    st = gcodec.torch.HookState(codec, start_iter=0, min_numel=16, module=model)
    assert not [m for m in _steps(model, st, torch.float32) if "does not shrink" in m]


def test_the_configured_codecs_kernels_are_loaded_at_construction() -> None:
    """After HookState(...) the kernels its first step runs have a compiled signature: the fused
    error-feedback binary16 encode of float32 gradients and the decode of its payload; warm=False
    leaves them to that first step (not checked: another test may have loaded them already)."""
    from gcodec.kernels.cpu import cast

    st = gcodec.torch.HookState("fp16", error_feedback=True)
    assert st.warm_s > 0
    fused = cast._feedback_f16_range_v if cast.simd.HAS_F16 else cast._feedback_f16_range
    assert fused.signatures, "the fused encode was not compiled or loaded"
    assert (cast._decode_f16_range_v if cast.simd.HAS_F16 else cast._decode_f16_range).signatures
    assert gcodec.torch.HookState("fp16", warm=False).warm_s == 0.0


def test_the_warm_up_names_every_configured_codec() -> None:
    from gcodec.adaptive import AdaptiveController
    from gcodec.policy import Policy
    from gcodec.torch.hook import _configured_codecs

    u8 = gcodec.get_codec("uniform", bits=8)
    got = _configured_codecs(u8, gcodec.get_codec("fp16"), {"*.bias": None, "*embed*": "bf16"}, None)
    assert [gcodec.get_codec(c).codec_id for c in got] == ["uniform", "fp16", "bf16"]
    pol = Policy([{"name": "a*", "codec": {"id": "topk", "ratio": 0.01}}], default="sign")
    assert {gcodec.get_codec(c).codec_id for c in _configured_codecs(u8, None, pol, None)} == {
        "uniform",
        "topk",
        "sign",
    }
    ctl = AdaptiveController(probe=False)
    ids = {gcodec.get_codec(c).codec_id for c in _configured_codecs(u8, None, None, ctl)}
    assert len(ids) >= 3 and "fp16" in ids


@pytest.mark.usefixtures("one_rank")
def test_a_steady_job_plans_each_bucket_once_and_plans_again_when_the_codec_changes() -> None:
    """The hook's plan of a bucket (groups, placed residuals, fingerprint) is kept in the router
    and reused while the bucket's tensors and codecs stay the same; a new codec plans again, and
    moving the residuals into its groups forgets the old plan."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10))
    st = gcodec.torch.HookState({"id": "uniform", "bits": 8}, start_iter=0, min_numel=16, module=model)
    ddp = DDP(model)
    ddp.register_comm_hook(st, gcodec.torch.comm_hook)
    x = torch.randn(8, 256)

    def steps(n: int) -> None:
        for _ in range(n):
            ddp(x).sum().backward()
        gcodec.torch.synchronize()

    steps(3)  # past DDP's bucket rebuild after the first iteration
    kept = dict(st.router.plans)
    assert len(kept) == 1  # one bucket
    steps(3)
    assert st.router.plans.keys() == kept.keys()
    assert all(st.router.plans[k] is v for k, v in kept.items())  # reused, not planned again
    st.configure(codec={"id": "uniform", "bits": 4})
    steps(2)
    (now,) = st.router.plans.values()  # the residuals moved to the new groups: the old plan forgotten
    assert [g.codec.params["bits"] for g in now.groups] == [4] * len(now.groups) and now.groups
    assert now.text != next(iter(kept.values())).text
