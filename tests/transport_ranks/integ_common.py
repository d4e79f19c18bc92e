"""What the framework rank programs share (lightning_program, accelerate_program, hf_program,
nanogpt_program): the environment torchrun gives each rank, the cross-rank checks and the checks
that gcodec's hook really ran.

The frameworks start the process group themselves from the environment (Lightning's
TorchElasticEnvironment, accelerate's PartialState, the Hugging Face Trainer through accelerate), as
they do under ``torchrun --nproc-per-node 2``: the test starts the two ranks itself
(tests/procs.run_ranks) and sets the variables torchrun would set."""

from __future__ import annotations

import faulthandler
import hashlib
import os
import re
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"

CHECKS: list[dict] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def recipe(name: str) -> dict[str, Any]:
    """The names defined by the python block that follows ``<!-- recipe: NAME -->`` in
    docs/integrations.md: the tests run the page's callbacks as users copy them."""
    m = re.search(rf"<!-- recipe: {re.escape(name)} -->\n```python\n(.*?)```", PAGE.read_text(), re.S)
    assert m is not None, f"docs/integrations.md has no recipe {name!r}"
    scope: dict[str, Any] = {"__name__": f"recipe_{name}"}
    exec(compile(m.group(1), f"{PAGE}:recipe:{name}", "exec"), scope)
    return scope


def rank_args() -> tuple[Path, int, int]:
    """This rank program's arguments (output folder, rank, world size, port), with the port and
    ranks put where torchrun puts them (:func:`torchrun_env`); returns (folder, rank, world)."""
    outdir = Path(sys.argv[1])
    rank, world, port = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torchrun_env(rank, world, port)
    return outdir, rank, world


def torchrun_env(rank: int, world: int, port: int) -> None:
    """The variables ``torchrun --nproc-per-node WORLD`` sets for one rank on one node, before any
    framework reads them; one kernel thread per rank (the ranks share the machine's cores)."""
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "TORCHELASTIC_RUN_ID": f"gcodec-test-{port}",
            "OMP_NUM_THREADS": "1",
            # nothing reaches out to a hub or a tracker from a test
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "WANDB_DISABLED": "true",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    faulthandler.enable(all_threads=True)
    import torch

    torch.set_num_threads(1)


def digest(tensors: Iterable[Any]) -> str:
    """SHA-256 of the tensors' bytes, in order: equal digests on two ranks are equal bits."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def same_on_every_rank(what: Any) -> bool:
    import torch.distributed as dist

    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, what)
    return all(g == got[0] for g in got)


def params_agree(label: str, model: Any) -> None:
    """(b): every parameter bit-identical on every rank."""
    check(f"{label}: parameters bit-identical on every rank", same_on_every_rank(digest(model.parameters())))


def hook_ran(label: str, state: Any, optimizer_steps: int) -> None:
    """(a): the hook saw every optimizer step's buckets, and compressed every step after its
    warm-up: the hook's iterations (every bucket together) are the optimizer's steps."""
    report = state.step_report()
    stats = state.stats()
    compressed = max((s["steps"] for s in stats.values()), default=0)
    check(
        f"{label}: one hook iteration per optimizer step",
        optimizer_steps > 0 and report["steps"] == optimizer_steps and state.iter == optimizer_steps,
        f"hook iterations {report['steps']} (iter {state.iter}), optimizer steps {optimizer_steps}",
    )
    check(
        f"{label}: compressed every step after the warm-up",
        compressed == optimizer_steps - state.start_iter and compressed > 0,
        f"compressed steps {compressed}, start_iter {state.start_iter}, keys {sorted(stats)}",
    )
    total = report["total"]
    check(
        f"{label}: fewer bytes on the wire than the gradients",
        0 < total["payload_bytes"] + total["dense_bytes"] < total["raw_bytes"],
        f"payload {total['payload_bytes']} + dense {total['dense_bytes']} of raw {total['raw_bytes']}",
    )


def loss_falls(label: str, losses: list[float], base: list[float] | None = None, tol: float = 0.1) -> None:
    """(c): the loss falls, and where the run without the hook is known, stays within ``tol`` of
    its start's scale from it at the end."""
    n = max(1, len(losses) // 4)
    first, last = sum(losses[:n]) / n, sum(losses[-n:]) / n
    check(f"{label}: loss falls", last < 0.9 * first, f"{first:.4f} -> {last:.4f} ({len(losses)} steps)")
    if base is not None:
        b_last = sum(base[-n:]) / n
        check(
            f"{label}: loss close to the run without the hook",
            abs(last - b_last) < tol * first,
            f"with the hook {first:.4f} -> {last:.4f}, without {sum(base[:n]) / n:.4f} -> {b_last:.4f}",
        )


def close_to(label: str, model: Any, base: Any, tol: float = 0.05) -> None:
    """(c): every parameter of the reference run (by name) within ``tol`` of this run's."""
    ours = dict(model.named_parameters())
    drift = max(float((ours[n] - q).detach().abs().max()) for n, q in base.named_parameters())
    check(f"{label}: parameters close to the run without the hook", drift < tol, f"max |delta| {drift:.4f}")


class NotCalled:
    """Records every warning raised inside, for the HookNotCalledWarning checks."""

    def __enter__(self) -> NotCalled:
        self._cm = warnings.catch_warnings(record=True)
        self.caught = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)

    def count(self) -> int:
        import gcodec.torch

        return sum(issubclass(w.category, gcodec.torch.HookNotCalledWarning) for w in self.caught)
