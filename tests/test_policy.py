"""The declarative policy: the order of its decisions, PowerSGD's minimum rate, dict/JSON round trips,
validation errors naming the rule, and its use by gcodec.mpi's Router (in process) and the hook."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gcodec
from gcodec.errors import ConfigError
from gcodec.policy import Policy, Rule
from gcodec.transports import DENSE, Router, run_blocking
from tests.localcomm import LocalComm

U8 = {"id": "uniform", "bits": 8}


def _policy(**kw) -> Policy:
    rules = [
        {"name": "*embed*", "codec": "fp16"},
        {"ndim": 2, "min_numel": 65536, "codec": {"id": "powersgd", "rank": 4}},
        {"name": "head.*", "codec": None},
        {"from_step": 100, "codec": {"id": "uniform", "bits": 4}},
    ]
    return Policy(rules, default=U8, **kw)


def test_warmup_steps_are_dense() -> None:
    p = _policy(warmup_steps=10)
    assert p.decide("w", (512, 512), 9).codec is None and "warm-up" in p.decide("w", (512, 512), 9).reason
    assert p.decide("w", (512, 512), 10).codec is not None


def test_tensors_under_min_numel_are_dense() -> None:
    p = _policy(min_numel=1000)
    assert p.decide("w", (10, 99), 0).codec is None
    assert p.decide("w", (10, 100), 0).codec == gcodec.get_codec(U8).get_config()


def test_one_dimensional_tensors_are_dense_unless_turned_off() -> None:
    assert _policy().decide("b", (4096,), 0).codec is None
    assert _policy(dense_1d=False).decide("b", (4096,), 0).codec is not None


def test_first_matching_rule_wins_by_name_size_ndim_and_step() -> None:
    p = _policy()
    assert p.decide("tok_embed.weight", (1000, 512), 0).codec["id"] == "fp16"
    assert p.decide("layer.weight", (512, 512), 0).codec["id"] == "powersgd"
    assert p.decide("head.weight", (10, 512), 0).codec is None
    assert p.decide("conv.weight", (64, 64, 3, 3), 0).codec["bits"] == 8  # default: no rule matches
    assert p.decide("conv.weight", (64, 64, 3, 3), 100).codec["bits"] == 4  # from_step
    assert Rule.from_dict({"ndim": [3, 4], "codec": None}).matches("x", (2, 2, 2), 0)
    assert not Rule.from_dict({"max_numel": 7, "codec": None}).matches("x", (2, 2, 2), 0)
    assert not Rule.from_dict({"until_step": 5, "codec": None}).matches("x", (2,), 5)


def test_powersgd_below_its_minimum_rate_is_dense() -> None:
    p = Policy(default={"id": "powersgd", "rank": 4}, powersgd_min_rate=8.0, dense_1d=False)
    # 64 x 64 at rank 4: rate 64*64/(128*4) = 8 (compressed); 48 x 64: 3072/448 = 6.9 (dense)
    assert p.decide("a", (64, 64), 0).codec is not None
    d = p.decide("b", (48, 64), 0)
    assert d.codec is None and "rate 6.86 < 8" in d.reason
    assert p.decide("c", (4096,), 0).codec is None  # not a matrix


def test_dict_and_json_round_trip(tmp_path: Path) -> None:
    p = _policy(warmup_steps=3, min_numel=10, powersgd_min_rate=3.0)
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d and Policy.from_dict(d) == p
    path = tmp_path / "policy.json"
    p.save(path)
    q = Policy.load(path)
    assert q == p
    for name, shape, step in [("a", (512, 512), 0), ("b.embed", (100, 100), 4), ("c", (9,), 1)]:
        assert q.decide(name, shape, step) == p.decide(name, shape, step)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            {"rules": [{"codec": None}, {"name": "*.bias", "nmae": 1, "codec": None}]},
            r"rule 1 \(name '\*.bias'\).*nmae",
        ),
        ({"rules": [{"name": "x"}]}, r"rule 0 \(name 'x'\): no 'codec'"),
        ({"rules": [{"codec": {"id": "uniform", "bits": 7}}]}, r"rule 0: bad codec"),
        ({"rules": [{"codec": "nosuchcodec"}]}, r"rule 0: bad codec"),
        ({"rules": [{"min_numel": 10, "max_numel": 5, "codec": None}]}, r"rule 0: min_numel 10 > max_numel 5"),
        ({"rules": [{"from_step": 5, "until_step": 5, "codec": None}]}, r"rule 0: from_step 5 >= until_step 5"),
        ({"rules": [{"ndim": -1, "codec": None}]}, r"rule 0: ndim"),
        ({"rules": [{"min_numel": "big", "codec": None}]}, r"rule 0: min_numel"),
        ({"rules": ["*.bias"]}, r"rule 0: must be a dict"),
        ({"rules": {"*.bias": None}}, r"list of rules"),
        ({"warmup": 3}, r"unknown field\(s\) \['warmup'\]"),
        ({"version": 2}, r"version 2"),
        ({"default": {"id": "qsgd", "levels": 0}}, r"policy default: bad codec"),
        ({"powersgd_min_rate": -1}, r"powersgd_min_rate"),
        ({"dense_1d": "yes"}, r"dense_1d"),
    ],
)
def test_bad_policies_raise_config_errors_naming_the_rule(bad: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Policy.from_dict(bad)


def test_load_of_a_non_json_file_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        Policy.load(f)


def test_policy_state_routes_each_key_and_goes_dense_when_told() -> None:
    p = Policy([{"name": "bias*", "codec": None}], default=U8, warmup_steps=1, min_numel=0, dense_1d=False)
    ps = Router(p, error_feedback=True)
    comm = LocalComm()
    rng = np.random.default_rng(0)
    for _step in range(3):
        for key in ("w", "bias"):
            x = rng.standard_normal(4096).astype(np.float32)
            out = run_blocking(ps.protocol(comm, x, np.empty_like(x), key, "mean"))
            if key == "bias" or _step == 0:
                assert np.array_equal(out, x)  # dense and one rank: exact
    s = ps.stats()
    assert s["bias"]["codec"] == DENSE and s["w"]["codec"]["id"] == "uniform"
    assert ps.switches == [("w", 1, DENSE, gcodec.get_codec(U8).get_config())]


def test_a_codec_switch_carries_the_residual_over() -> None:
    class Switch:
        def codec_for(self, key, shape, step):
            return {"id": "topk", "ratio": 0.01} if step < 2 else ({"id": "uniform", "bits": 4} if step < 4 else None)

    ps = Router(Switch(), error_feedback=True)
    comm = LocalComm()
    rng = np.random.default_rng(1)
    sent = np.zeros((64, 128))
    total = np.zeros((64, 128))
    for _ in range(5):
        x = rng.standard_normal((64, 128)).astype(np.float32)  # 2-D: residuals keep the tensor's shape
        total += x
        sent += run_blocking(ps.protocol(comm, x, np.empty_like(x), "k", "mean"))
    # top-k dropped 99 % twice, uniform-4 carried that on, and the dense step flushed all of it
    assert np.allclose(sent, total, atol=1e-4)
    assert [s[1] for s in ps.switches] == [2, 4]


@pytest.mark.torch
def test_ddp_hook_takes_a_policy_and_telemetry(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.procs import checks_of, run_ranks

    codes = run_ranks("tests.transport_ranks.policy_torch", [str(tmp_path)], 2, 150, tmp_path)
    assert codes == [0, 0]
    checks = checks_of(tmp_path, range(2))
    assert len(checks) == 2 * 11


def test_policy_state_checkpoint_resumes_identically() -> None:
    p = Policy(
        [{"until_step": 3, "codec": {"id": "topk", "ratio": 0.05}}], default={"id": "qsgd", "levels": 7}, min_numel=0
    )
    comm = LocalComm()
    xs = [np.random.default_rng(s).standard_normal((32, 64)).astype(np.float32) for s in range(8)]

    def run(ps: Router, steps: list[np.ndarray]) -> list[np.ndarray]:
        return [run_blocking(ps.protocol(comm, x, np.empty_like(x), "w", "mean")) for x in steps]

    whole = run(Router(p), xs)
    first = Router(p)
    head = run(first, xs[:2])
    again = Router(Policy.from_dict(p.to_dict()))
    again.load_state_dict(first.state_dict())
    tail = run(again, xs[2:])
    assert all(np.array_equal(a, b) for a, b in zip(whole, head + tail))
    assert [s[1] for s in again.switches] == [3]
