"""HookNotCalledWarning: a HookState that no bucket reached by the first optimizer step of its model
says so (a framework that takes the hook and drops it, as Lightning's DDPStrategy does on the CPU,
or a hook registered on another DDP than the one that trains), once, and costs nothing after the
first bucket. One process, a gloo group of one rank; the 2-rank Lightning case is in
tests/test_integrations.py."""

from __future__ import annotations

import gc
import warnings

import pytest

pytestmark = [pytest.mark.torch]
torch = pytest.importorskip("torch")

from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcodec.torch  # noqa: E402
import gcodec.torch.hook as hook_module  # noqa: E402

from .gloo import one_rank  # noqa: E402, F401  (a fixture)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def _steps(ddp: torch.nn.Module, opt: torch.optim.Optimizer, n: int) -> int:
    """``n`` training steps; the number of HookNotCalledWarnings they raised."""
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
    return sum(issubclass(w.category, gcodec.torch.HookNotCalledWarning) for w in caught)


@pytest.mark.usefixtures("one_rank")
def test_registered_hook_never_warns_and_leaves_no_watch() -> None:
    model = _model()
    ddp = DDP(model)
    state = gcodec.torch.HookState("uniform", start_iter=1, min_numel=256, module=model)
    ddp.register_comm_hook(state, gcodec.torch.comm_hook)
    assert _watching(state)  # until the first bucket
    assert _steps(ddp, torch.optim.SGD(model.parameters(), lr=0.1), 3) == 0
    assert state.step_report()["steps"] == 3
    assert not _watching(state)  # nothing of it runs on later optimizer steps


@pytest.mark.usefixtures("one_rank")
def test_unregistered_hook_warns_once_at_its_models_first_step() -> None:
    model, other = _model(), _model()
    ddp = DDP(model)
    state = gcodec.torch.HookState("uniform", module=model)  # never registered: DDP averages alone
    # another model's optimizer stepping is none of this state's business
    assert _steps(other, torch.optim.SGD(other.parameters(), lr=0.1), 2) == 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(gcodec.torch.HookNotCalledWarning, match="on_fit_start"):
        opt.zero_grad()
        ddp(torch.randn(4, 64)).sum().backward()
        opt.step()
    assert _steps(ddp, opt, 3) == 0  # once per state
    assert state.step_report()["steps"] == 0
    assert not _watching(state)


@pytest.mark.usefixtures("one_rank")
def test_without_module_any_first_step_of_a_process_without_buckets_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hook_module, "_any_bucket", False)  # as in a fresh process
    model = _model()
    state = gcodec.torch.HookState("uniform")  # as Lightning's docs build theirs: no module
    assert _steps(DDP(model), torch.optim.SGD(model.parameters(), lr=0.1), 2) == 1
    # once a bucket reached any state, a state without module no longer counts others' steps
    monkeypatch.setattr(hook_module, "_any_bucket", True)
    quiet = gcodec.torch.HookState("uniform")
    assert _steps(DDP(model), torch.optim.SGD(model.parameters(), lr=0.1), 1) == 0
    assert not _watching(state) and _watching(quiet)
    handle = quiet._watch_handle
    del state, quiet
    gc.collect()
    assert handle.id not in _post_hooks()  # a state that is gone watches no more


@pytest.mark.usefixtures("one_rank")
def test_several_states_warn_at_one_step_without_breaking_torchs_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch calls its global post-step hooks while iterating their OrderedDict: a watcher that
    # removed itself there before the last one ran made opt.step() raise "OrderedDict mutated
    # during iteration" (three states without a module, as bench/transports.py builds them)
    monkeypatch.setattr(hook_module, "_any_bucket", False)
    model = _model()
    states = [gcodec.torch.HookState("uniform", warm=False) for _ in range(3)]
    assert _steps(DDP(model), torch.optim.SGD(model.parameters(), lr=0.1), 2) == 3  # each once
    assert not any(_watching(s) for s in states)


def _post_hooks() -> dict:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    return _global_optimizer_post_hooks


def _watching(state: gcodec.torch.HookState) -> bool:
    return state._watch_handle.id in _post_hooks()
