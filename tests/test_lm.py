"""The language-model workload: the standard-library corpus, its split and batches, and the
``gcodec demo --diloco`` job on real gloo workers."""

from __future__ import annotations

import json
import subprocess
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
    p = subprocess.run(
        [sys.executable, "-m", "gcodec", "demo", "--diloco", "--quick", "--no-progress", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
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
