"""Kill and resume a real 2-rank DDP job with gcodec's hook (AdamW, a small language model with a
tied embedding over three DDP buckets), against the same job run without interruption
(docs/transports.md, "Checkpoints"). Every rank's hook state is gathered into one file by rank 0,
as single-file checkpoint habits do, and each rank loads its own; another rank's state, or one saved
with another codec, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from .procs import checks_of, run_ranks

pytestmark = [pytest.mark.torch]
pytest.importorskip("torch")

#: Continue bit for bit: each element's encoding does not depend on which tensors share its DDP
#: bucket (fp16; uniform's groups of 64 align with this model's tensors; PowerSGD works per matrix).
EXACT = ("fp16", "uniform4", "powersgd")
#: Their encoding of a bucket depends on its layout (top-k selects over the group; sign's groups of
#: 256 span tensors), and DDP's first iteration after a restart uses its initial layout where the
#: uninterrupted job had its rebuilt one: they continue within the bound below.
BOUNDED = ("sign", "topk")


def test_a_killed_and_resumed_job_continues_as_the_uninterrupted_one(tmp_path: Path) -> None:
    import torch

    from .transport_ranks import resume_torch as job

    assert run_ranks("tests.transport_ranks.resume_torch", [str(tmp_path), "full"], 2, 420, tmp_path) == [0, 0]
    codes = run_ranks("tests.transport_ranks.resume_torch", [str(tmp_path), "first"], 2, 420, tmp_path)
    assert codes == [-9, -9]  # killed after the checkpoint and two steps more
    assert run_ranks("tests.transport_ranks.resume_torch", [str(tmp_path), "second"], 2, 420, tmp_path) == [0, 0]
    assert len(checks_of(tmp_path, range(2))) == 2 * 2  # the two refusals, on both ranks
    assert set(job.CODECS) == set(EXACT) | set(BOUNDED)
    for name in job.CODECS:
        full = [torch.load(tmp_path / f"full_{name}_rank{r}.pt") for r in range(2)]
        resumed = [torch.load(tmp_path / f"second_{name}_rank{r}.pt") for r in range(2)]
        for r in range(2):  # the ranks agree in either run
            assert all(
                torch.equal(full[0][k], full[r][k]) and torch.equal(resumed[0][k], resumed[r][k]) for k in full[0]
            )
        delta = max(float((full[0][k] - resumed[0][k]).abs().max()) for k in full[0])
        if name in EXACT:
            assert delta == 0.0, (name, delta)
        else:
            # AdamW moves an element by at most lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.17 lr per step
            # (bias-corrected, first step the largest), plus lr * wd * |theta| of decay; both runs
            # start equal at the checkpoint, so they differ by at most twice that over the steps after it
            steps = job.STEPS - job.SAVE_AT
            bound = 2 * steps * job.LR * (3.17 + 0.1 * 5.0)
            assert delta <= bound, (name, delta, bound)
