"""The language-model workload: the standard-library corpus, its split and batches, and the
``gcodec demo --diloco`` job on real gloo workers."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from gcodec.demo import corpus
from gcodec.demo.runs import LMSettings


@pytest.fixture(scope="module")
def text() -> corpus.Corpus:
    return corpus.load()


def test_corpus_split_keeps_every_byte_once_and_five_percent_for_validation(text: corpus.Corpus) -> None:
    sizes = [(Path(text.root) / f).stat().st_size for f in corpus.FILES]
    n = len(corpus.FILES)
    # every file's bytes on one side or the other, plus one NUL separator per file per side
    assert text.train.size + text.val.size == sum(sizes) + 2 * n
    held = [max(1, int(s * corpus.VAL_SHARE)) for s in sizes]
    assert text.val.size == sum(held) + n
    assert int((text.train == 0).sum()) >= n and text.val[-1] == 0


def test_corpus_hash_names_the_bytes(text: corpus.Corpus, tmp_path) -> None:
    again = corpus.load()
    assert again.sha256 == text.sha256 and again.python == ".".join(map(str, sys.version_info[:3]))
    # a copy with one byte changed hashes differently
    for f in corpus.FILES:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes((Path(text.root) / f).read_bytes())
    first = tmp_path / corpus.FILES[0]
    data = bytearray(first.read_bytes())
    data[10] ^= 1
    first.write_bytes(bytes(data))
    assert corpus.load(str(tmp_path)).sha256 != text.sha256
    first.unlink()
    with pytest.raises(FileNotFoundError, match=corpus.FILES[0]):
        corpus.load(str(tmp_path))


def test_batches_are_repeatable_per_rank_and_step(text: corpus.Corpus) -> None:
    a = corpus.batch(text.train, 8, 32, 0, 5, 0)
    assert a.shape == (8, 33) and a.dtype == np.int64
    assert np.array_equal(a, corpus.batch(text.train, 8, 32, 0, 5, 0))
    assert not np.array_equal(a, corpus.batch(text.train, 8, 32, 0, 5, 1))  # ranks draw their own
    assert not np.array_equal(a, corpus.batch(text.train, 8, 32, 0, 6, 0))
    v = corpus.val_windows(text.val, 16, 32)
    assert v.shape == (16, 33) and int(v.max()) < 256


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    from gcodec.demo.lm_worker import lr_at

    s = LMSettings(steps=100, warmup=10, lr=1.0)
    assert lr_at(s, 0) == pytest.approx(0.1) and lr_at(s, 9) == pytest.approx(1.0)
    assert lr_at(s, 10) == pytest.approx(1.0)
    assert lr_at(s, 100) == pytest.approx(0.1)
    assert all(lr_at(s, t) >= lr_at(s, t + 1) for t in range(10, 100))


def test_demo_diloco_quick_on_two_gloo_workers(tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "lm.json"
    from tests.procs import own_env, run

    p = run(
        [sys.executable, "-m", "gcodec", "demo", "--diloco", "--quick", "--no-progress", "--json", str(out)],
        600,
        cwd=os.getcwd(),
        env=own_env(),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    runs = {r["label"]: r for r in res["runs"]}
    assert all(r["ok"] for r in runs.values()), runs
    s = LMSettings.quick()
    ddp = runs["DDP fp32"]
    assert ddp["bytes_per_inner_step"] == 4 * ddp["params"]  # float32 gradient every step
    fp32 = runs["DiLoCo H=8 fp32"]
    # the same float32 bytes once every 8 steps (the quick run's 24 steps are 3 whole periods)
    assert s.steps % 8 == 0 and fp32["bytes_per_inner_step"] * 8 == ddp["bytes_per_inner_step"]
    u4 = runs["DiLoCo H=8 uniform 4 + EF"]
    # 4-bit codes and a float32 scale per 64 elements (4.5 bits) plus headers: under a quarter
    assert u4["bytes_per_inner_step"] < fp32["bytes_per_inner_step"] / 4
    assert res["corpus"]["corpus_sha256"] == corpus.load().sha256
    for r in runs.values():
        assert np.isfinite(r["val_loss"]) and r["curve"][-1]["step"] == s.steps
    assert "DiLoCo H=8 uniform 4 + EF" in p.stdout


def test_frozen_variance_adamw_is_torchs_adamw_until_it_freezes_then_keeps_v() -> None:
    torch = pytest.importorskip("torch")
    from gcodec.demo.lm_worker import FrozenVarianceAdamW

    torch.manual_seed(0)
    a, b = torch.nn.Linear(20, 30), torch.nn.Linear(20, 30)
    b.load_state_dict(a.state_dict())
    kw = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1}
    oa, ob = torch.optim.AdamW(a.parameters(), **kw), FrozenVarianceAdamW(b.parameters(), freeze_at=5, **kw)
    xs = torch.randn(8, 8, 20, generator=torch.Generator().manual_seed(1))
    for i, x in enumerate(xs):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
        if i == 4:  # the 5th step: the last with v updated, the same arithmetic as torch's up to rounding
            for p, q in zip(a.parameters(), b.parameters()):
                assert torch.allclose(p, q, rtol=0, atol=1e-6)
            frozen = [ob.state[q]["exp_avg_sq"].clone() for q in b.parameters()]
    for q, v in zip(b.parameters(), frozen):
        assert torch.equal(ob.state[q]["exp_avg_sq"], v)  # v no longer moves
    assert any(not torch.allclose(p, q, rtol=0, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))


def test_dense_shadow_sees_what_the_hook_delivered_on_two_gloo_workers() -> None:
    """The LM worker's diagnostics (``diag_every``) beside a top-k 1 % + EF run: while the hook is
    in its dense warm-up the delivered gradient is the true average (the same two floats summed and
    halved), so the shadow AdamW is the run's own; afterwards top-k leaves most elements at 0 and
    error feedback holds what it left out."""
    pytest.importorskip("torch")
    from gcodec.demo.launch import run_job
    from gcodec.demo.runs import lm_spec

    s = dataclasses.replace(LMSettings.quick(), steps=12, start_iter=6, min_numel=1024, grad_clip=1.0, diag_every=3)
    res = run_job(
        [lm_spec("top-k", "ddp-gcodec", {"id": "topk", "ratio": 0.01}, True)],
        s,
        2,
        module="gcodec.demo.lm_worker",
        timeout_s=300,
    )
    (run,) = res["runs"]
    assert run["ok"], run
    rows = {int(d["step"]): d["layers"] for d in run["diag"]}
    assert sorted(rows) == [3, 6, 9, 12]
    for step in (3, 6):  # steps 1..6: dense
        for name, r in rows[step].items():
            assert r["g_ratio"] == 1.0 and r["g_cos"] == pytest.approx(1.0) and r["resid_ratio"] == 0.0, name
            assert r["u_ratio"] == pytest.approx(1.0, abs=1e-4) and r["u_cos"] == pytest.approx(1.0, abs=1e-4), name
            assert r["v_ratio"] == pytest.approx(1.0, abs=1e-4), name
    for step in (9, 12):
        layers = rows[step].values()
        # each rank sends 1 % of the flat group of 6 tensors (21,504 elements), so at most 2 x 215
        # elements are not 0; all in the smallest tensor (1,024) would give a mean density of 0.07
        assert 0 < sum(r["density"] for r in layers) / len(layers) < 0.08
        assert all(r["resid_ratio"] > 0 and r["density"] < 1 for r in layers)
