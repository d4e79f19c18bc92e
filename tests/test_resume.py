"""Kill and resume a real 2-rank DDP job with gcodec's hook (AdamW, a small language model with a
tied embedding over three DDP buckets), against the same job run without interruption
(docs/transports.md, "Checkpoints"), for one codec of every family: the parameters must be equal
bit for bit. Every rank's hook state is gathered into one file by rank 0,
as single-file checkpoint habits do, and each rank loads its own; another rank's state, or one saved
with another codec, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from .procs import checks_of, run_ranks

pytestmark = [pytest.mark.torch]
pytest.importorskip("torch")


def test_a_killed_and_resumed_job_continues_as_the_uninterrupted_one(tmp_path: Path) -> None:
    import torch

    from .transport_ranks import resume_torch as job

    assert run_ranks("tests.transport_ranks.resume_torch", [str(tmp_path), "full"], 2, 420, tmp_path) == [0, 0]
    codes = run_ranks("tests.transport_ranks.resume_torch", [str(tmp_path), "first"], 2, 420, tmp_path)
    assert codes == [-9, -9]  # killed after the checkpoint and two steps more
    assert run_ranks("tests.transport_ranks.resume_torch", [str(tmp_path), "second"], 2, 420, tmp_path) == [0, 0]
    assert len(checks_of(tmp_path, range(2))) == 2 * 3  # the two refusals and the layouts, on both ranks
    for name in job.CODECS:
        full = [torch.load(tmp_path / f"full_{name}_rank{r}.pt") for r in range(2)]
        resumed = [torch.load(tmp_path / f"second_{name}_rank{r}.pt") for r in range(2)]
        for r in range(2):  # the ranks agree in either run
            assert all(
                torch.equal(full[0][k], full[r][k]) and torch.equal(resumed[0][k], resumed[r][k]) for k in full[0]
            )
        # Bit for bit, every codec: no tensor's encoding depends on which tensors share its DDP
        # bucket, and the restarted DDP's first iteration runs its initial bucket layout where the
        # uninterrupted job had its rebuilt one (docs/transports.md, "Checkpoints").
        differ = [k for k in full[0] if not torch.equal(full[0][k], resumed[0][k])]
        delta = max((float((full[0][k] - resumed[0][k]).abs().max()) for k in differ), default=0.0)
        assert not differ, (name, differ, delta)
