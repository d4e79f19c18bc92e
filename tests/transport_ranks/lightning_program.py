"""One rank of a Lightning ``Trainer(accelerator="cpu", devices=2, strategy=...)`` run with gcodec's
DDP hook registered by the callback recipe of docs/integrations.md: ``python -m
tests.transport_ranks.lightning_program OUTDIR RANK WORLD PORT``; writes OUTDIR/rank<r>.json.

The rank gets the environment torchrun would give it, so Lightning runs its DDP strategy on
externally launched processes (TorchElasticEnvironment) and starts the gloo group itself. In order:

* ``DDPStrategy(ddp_comm_hook=gcodec.torch.comm_hook, ddp_comm_state=state)``, Lightning's own
  hook arguments: on the CPU Lightning drops them without a word; gcodec's
  HookNotCalledWarning says so at the first optimizer step (a state without ``module``, as
  Lightning's docs build theirs, then one with it);
* ``strategy="ddp"`` without a hook (the reference run);
* ``strategy="ddp"`` with the callback of docs/integrations.md (the page's block, executed);
* ``strategy="ddp_find_unused_parameters_true"`` with the callback recipe, on a model with a
  parameter that forward never uses (what the setting is for).
"""

from __future__ import annotations

import time
from typing import Any

from ..procs import run_checked
from .integ_common import (
    CHECKS,
    NotCalled,
    check,
    close_to,
    hook_ran,
    loss_falls,
    params_agree,
    rank_args,
    recipe,
)

STEPS = 16
START_ITER = 2


def main() -> None:
    outdir, rank, world = rank_args()
    t0 = time.perf_counter()

    import lightning.pytorch as L
    import torch
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    import gcodec.torch

    print(f"imports: {time.perf_counter() - t0:.1f} s", flush=True)

    class Net(L.LightningModule):
        def __init__(self, unused: bool = False) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128), torch.nn.Tanh()
            )
            self.head = torch.nn.Linear(128, 4)
            # a layer forward never uses: why users turn find_unused_parameters on
            self.spare = torch.nn.Linear(128, 128) if unused else None
            self.losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=3e-3)

    GcodecHook = recipe("lightning")["GcodecHook"]  # the callback of docs/integrations.md, as written

    g = torch.Generator().manual_seed(7)
    x = torch.randn(STEPS * 32 * world, 32, generator=g)
    y = torch.tanh(0.3 * x @ torch.randn(32, 4, generator=g))
    data = TensorDataset(x, y)

    def model(unused: bool = False) -> Net:
        torch.manual_seed(0)
        return Net(unused)

    def fit(net: Net, strategy: Any, callbacks: list[Any], steps: int = STEPS) -> L.Trainer:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=world,
            num_nodes=1,
            strategy=strategy,
            max_steps=steps,
            callbacks=callbacks,
            default_root_dir=str(outdir / "lightning"),
        )
        t0 = time.perf_counter()
        trainer.fit(net, DataLoader(data, batch_size=32, shuffle=True))
        print(f"fit {type(trainer.strategy).__name__}: {time.perf_counter() - t0:.1f} s", flush=True)
        return trainer

    def body() -> None:
        # Lightning's own hook arguments on the CPU: dropped, and gcodec says so
        for with_module in (False, True):
            net = model()
            state = gcodec.torch.HookState(codec="uniform", start_iter=0, module=net if with_module else None)
            with NotCalled() as seen:
                fit(net, DDPStrategy(ddp_comm_hook=gcodec.torch.comm_hook, ddp_comm_state=state), [], steps=3)
            label = f"DDPStrategy(ddp_comm_hook=...) on the CPU, {'with' if with_module else 'without'} module"
            check(f"{label}: Lightning never called the hook", state.step_report()["steps"] == 0)
            check(f"{label}: HookNotCalledWarning, once", seen.count() == 1, f"{seen.count()} warnings")

        base = model()
        trainer = fit(base, "ddp", [])
        check("reference run: trained every step", trainer.global_step == STEPS, str(trainer.global_step))

        for strategy, unused, codec in (
            ("ddp", False, {"id": "uniform", "bits": 8}),
            ("ddp_find_unused_parameters_true", True, "fp16"),
        ):
            cb = GcodecHook(codec=codec, start_iter=START_ITER, min_numel=1024)
            with NotCalled() as seen:
                net = model(unused)
                trainer = fit(net, strategy, [cb])
            assert cb.state is not None
            check(f"{strategy}: no HookNotCalledWarning", seen.count() == 0, f"{seen.count()} warnings")
            hook_ran(strategy, cb.state, trainer.global_step)
            check(f"{strategy}: every step trained", trainer.global_step == STEPS, str(trainer.global_step))
            params_agree(strategy, net)
            loss_falls(strategy, net.losses, base.losses)
            # the same initial weights as the reference (the spare layer is made after them)
            close_to(strategy, net, base)

    run_checked(body, CHECKS, outdir, rank)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
