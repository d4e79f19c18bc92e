"""One set of defaults: every engine that plans a model's parameters (the DDP hook, FSDP2, DiLoCo),
built with nothing but what it cannot do without, keeps the same tensors dense and compresses the
others with the same codec, as a default :class:`gcodec.policy.Policy` and the shorthand
:class:`gcodec.policy.Rules` do; and the size rules are applied the same way to a controller's
rung. One gloo rank in this process (DiLoCo broadcasts at construction)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


import gcodec  # noqa: E402
import gcodec.torch  # noqa: E402
from gcodec.policy import DEFAULTS, Policy, Rules  # noqa: E402

from .gloo import one_rank  # noqa: E402, F401  (a fixture)

pytestmark = [pytest.mark.torch]

#: parameters of every kind the size rules tell apart: a scalar, small and large vectors (1-D:
#: biases and norm scales), a matrix under ``min_numel``, large matrices, a thin matrix (PowerSGD
#: passes it through), a convolution kernel and an embedding
SHAPES = {
    "gain": (),
    "ln.weight": (64,),
    "fc.bias": (4096,),
    "small.weight": (16, 32),
    "fc.weight": (256, 512),
    "thin.weight": (4096, 1),
    "conv.weight": (64, 32, 3, 3),
    "wte.weight": (1000, 64),
}


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name, shape in SHAPES.items():
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.zeros(shape)))


def _plans(codec: gcodec.Codec | None = None) -> dict[str, dict[str, str | None]]:
    """What each engine (and the two policy forms) does with every parameter of SHAPES after its
    warm-up: the codec's id, or None for dense."""
    model = Model()
    step = DEFAULTS.start_iter
    kw = {} if codec is None else {"codec": codec}
    hook = gcodec.torch.HookState(module=model, warm=False, **kw)
    fsdp = gcodec.torch.FSDPState(**kw)
    diloco = gcodec.torch.DiLoCo(
        model, torch.optim.SGD(model.parameters(), lr=0.1), hook=False, codec=codec or DEFAULTS.codec
    )
    routers = {"ddp hook": hook.router, "fsdp2": fsdp.router, "diloco": diloco.router}
    out: dict[str, dict[str, str | None]] = {}
    for engine, router in routers.items():
        out[engine] = {}
        for name, shape in SHAPES.items():
            c = router.choose(name, shape, step, torch.empty(shape, device="meta"))
            out[engine][name] = None if c is None else c.codec_id
    default = codec or gcodec.get_codec(DEFAULTS.codec)
    for label, chooser in (("Policy()", Policy(default=default)), ("Rules()", Rules(codec=default))):
        out[label] = {}
        for name, shape in SHAPES.items():
            cfg = chooser.decide(name, shape, step).codec
            out[label][name] = None if cfg is None else cfg["id"]
    diloco.close()
    return out


@pytest.mark.usefixtures("one_rank")
def test_every_engine_built_with_its_defaults_plans_the_same_tensors_the_same_way() -> None:
    plans = _plans()
    first = plans["ddp hook"]
    for engine, plan in plans.items():
        assert plan == first, f"{engine} plans {plan}, the DDP hook {first}"
    # and what that one plan is, from the documented defaults (docs/guide.md, "Defaults")
    assert first == {
        "gain": None,  # 1 element < min_numel
        "ln.weight": None,  # 64 < 1024
        "fc.bias": None,  # 1-D: dense_1d
        "small.weight": None,  # 512 < 1024
        "fc.weight": DEFAULTS.codec,
        "thin.weight": DEFAULTS.codec,  # fp16 compresses any shape
        "conv.weight": DEFAULTS.codec,
        "wte.weight": DEFAULTS.codec,
    }


@pytest.mark.usefixtures("one_rank")
def test_the_engines_agree_on_a_codec_that_cannot_compress_every_shape() -> None:
    """PowerSGD passes a thin matrix through (its rate is under powersgd_min_rate): dense everywhere.
    FSDP2 refuses low-rank codecs (its row chunks are not matrices), so it is left out here."""
    codec = gcodec.get_codec("powersgd", rank=2)
    model = Model()
    step = DEFAULTS.start_iter
    hook = gcodec.torch.HookState(codec, module=model, warm=False)
    diloco = gcodec.torch.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), hook=False, codec=codec)
    policy, rules = Policy(default=codec), Rules(codec=codec)
    for name, shape in SHAPES.items():
        got = {
            "ddp hook": hook.router.choose(name, shape, step),
            "diloco": diloco.router.choose(name, shape, step),
            "Policy()": policy.codec_for(name, shape, step),
            "Rules()": rules.codec_for(name, shape, step),
        }
        ids = {k: None if c is None else c.codec_id for k, c in got.items()}
        assert len(set(ids.values())) == 1, f"{name} {shape}: {ids}"
    assert hook.router.choose("thin.weight", (4096, 1), step) is None
    assert hook.router.choose("fc.weight", (256, 512), step) is not None
    diloco.close()


def test_a_controllers_rung_obeys_the_same_size_rules_in_every_engine() -> None:
    """Under an adaptive controller (or a compressed warm-up) the bucket's or module's rung is
    applied to each tensor through Router.rung_for, with the same rules as a policy's choice."""
    rung = gcodec.get_codec("uniform", bits=4)
    hook = gcodec.torch.HookState(warm=False)
    fsdp = gcodec.torch.FSDPState()
    rules = Rules(codec=rung)
    for name, shape in SHAPES.items():
        want = rules.codec_for(name, shape)
        for router in (hook.router, fsdp.router):
            got = router.rung_for(shape, rung)
            assert (got is None) == (want is None), f"{name} {shape}: rung {got}, policy {want}"
    assert hook.router.rung_for((64,), None) is None


def test_the_guides_defaults_table_states_the_warm_up_the_engines_take() -> None:
    """docs/guide.md's "Defaults" table gives DEFAULTS.start_iter, and the DDP hook and FSDP2 built
    with their defaults take it (DiLoCo has no warm-up phase)."""
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    row = next(line for line in guide.splitlines() if line.startswith("| `start_iter` |"))
    assert row.split("|")[2].strip() == str(DEFAULTS.start_iter), row
    assert gcodec.torch.HookState(warm=False).start_iter == DEFAULTS.start_iter
    assert gcodec.torch.FSDPState().start_iter == DEFAULTS.start_iter
