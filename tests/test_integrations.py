"""gcodec's DDP hook in the training code people use, each with 2 real gloo ranks on 127.0.0.1 and
the recipe of docs/integrations.md: a Lightning ``Trainer`` (``strategy="ddp"`` and
``"ddp_find_unused_parameters_true"``, and the warning when Lightning's own hook arguments are
dropped on the CPU), an accelerate loop with gradient accumulation, the Hugging Face ``Trainer``
with its defaults, and a nanoGPT-style loop (no_sync micro-steps, bf16 autocast, clipping).

Each asserts that the hook really ran (one hook iteration per optimizer step, compressed after the
warm-up), that the ranks agree (parameters bit-identical at the end) and that training works (the
loss falls, close to the same run without the hook). The ranks are started as torchrun would start
them (tests/transport_ranks/integ_common.py); the framework starts the process group itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from .procs import checks_of, run_ranks

pytestmark = [pytest.mark.torch]
pytest.importorskip("torch")

WORLD = 2


def _run(module: str, tmp_path: Path, timeout: float = 300) -> list[dict]:
    codes = run_ranks(f"tests.transport_ranks.{module}", [str(tmp_path)], WORLD, timeout, tmp_path)
    assert codes == [0] * WORLD
    return checks_of(tmp_path, range(WORLD))


def _covered(checks: list[dict], label: str) -> None:
    """Every rank ran the three checks for ``label`` (a program that skipped them must not pass)."""
    for what in (
        "one hook iteration per optimizer step",
        "compressed every step after the warm-up",
        "parameters bit-identical on every rank",
        "loss falls",
        "loss close to the run without the hook",
    ):
        got = [c for c in checks if c["name"] == f"{label}: {what}"]
        assert len(got) == WORLD, (label, what, len(got))


def test_lightning_trainer(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="Lightning is not installed (pip install 'gcodec[test]')")
    checks = _run("lightning_program", tmp_path)
    for strategy in ("ddp", "ddp_find_unused_parameters_true"):
        _covered(checks, strategy)
    warned = [c for c in checks if c["name"].endswith("HookNotCalledWarning, once")]
    assert len(warned) == 2 * WORLD  # Lightning's own hook arguments, with and without module=


def test_accelerate_loop(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'gcodec[test]')")
    checks = _run("accelerate_program", tmp_path)
    _covered(checks, "accelerate, powersgd rank 4 + EF")


def test_hugging_face_trainer(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'gcodec[test]')")
    pytest.importorskip("accelerate", reason="the Hugging Face Trainer needs accelerate")
    checks = _run("hf_program", tmp_path)
    _covered(checks, "HF Trainer, top-k 10 % + EF")
    assert any(c["name"].endswith("default DDP finds unused parameters") for c in checks)


def test_nanogpt_loop(tmp_path: Path) -> None:
    checks = _run("nanogpt_program", tmp_path)
    _covered(checks, "nanoGPT loop, uniform 4-bit + EF")
