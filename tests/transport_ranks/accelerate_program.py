"""One rank of an accelerate training loop with gcodec's DDP hook, the recipe of
docs/integrations.md: ``python -m tests.transport_ranks.accelerate_program OUTDIR RANK WORLD PORT``;
writes OUTDIR/rank<r>.json.

``Accelerator(cpu=True, gradient_accumulation_steps=2)`` on ranks that torchrun's environment
describes (accelerate starts the gloo group itself); ``accelerator.prepare(model, optimizer,
loader)`` hands back the DDP model, and the hook goes on it. The loop is accelerate's documented
one: ``with accelerator.accumulate(model)``, ``accelerator.backward(loss)``, ``optimizer.step()``
on every batch (accelerate skips the step and DDP's all-reduce on the accumulating ones). The same
loop without the hook is the reference.
"""

from __future__ import annotations

import time
from typing import Any

from ..procs import run_checked
from .integ_common import CHECKS, NotCalled, check, close_to, hook_ran, loss_falls, params_agree, rank_args

BATCHES = 32  # per rank and epoch: 16 optimizer steps at 2 accumulation steps
ACCUMULATE = 2
START_ITER = 2


def main() -> None:
    outdir, rank, world = rank_args()
    t0 = time.perf_counter()

    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    import gcodec.torch

    print(f"imports: {time.perf_counter() - t0:.1f} s", flush=True)

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCHES * 16 * world, 32, generator=g)
    y = torch.tanh(0.3 * x @ torch.randn(32, 4, generator=g))

    def train(hook_args: dict[str, Any] | None) -> tuple[torch.nn.Module, list[float], int, Any, Any]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(32, 128),
            torch.nn.Tanh(),
            torch.nn.Linear(128, 128),
            torch.nn.Tanh(),
            torch.nn.Linear(128, 4),
        )
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
        model, opt, loader = accelerator.prepare(net, opt, loader)
        state = None
        if hook_args is not None:  # the recipe: two lines after prepare
            state = gcodec.torch.HookState(module=accelerator.unwrap_model(model), **hook_args)
            model.register_comm_hook(state, gcodec.torch.comm_hook)
        losses, steps = [], 0
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                steps += accelerator.sync_gradients  # an optimizer step follows
                opt.step()
                opt.zero_grad()
            losses.append(float(loss.detach()))
        return net, losses, steps, state, model

    def body() -> None:
        t = time.perf_counter()
        base, base_losses, base_steps, _, _ = train(None)
        print(f"reference: {time.perf_counter() - t:.1f} s", flush=True)
        check("reference: optimizer steps", base_steps == BATCHES // ACCUMULATE, str(base_steps))
        label = "accelerate, powersgd rank 4 + EF"
        t = time.perf_counter()
        with NotCalled() as seen:
            net, losses, steps, state, model = train(
                {"codec": {"id": "powersgd", "rank": 4}, "start_iter": START_ITER, "min_numel": 1024}
            )
        print(f"with the hook: {time.perf_counter() - t:.1f} s", flush=True)
        check(f"{label}: prepare gave DDP", type(model).__name__ == "DistributedDataParallel", type(model).__name__)
        check(f"{label}: no HookNotCalledWarning", seen.count() == 0, f"{seen.count()} warnings")
        check(f"{label}: optimizer steps", steps == BATCHES // ACCUMULATE, str(steps))
        hook_ran(label, state, steps)
        params_agree(label, net)
        loss_falls(label, losses, base_losses)
        close_to(label, net, base)

    run_checked(body, CHECKS, outdir, rank)
    accelerator.end_training()  # destroys the process group accelerate made


if __name__ == "__main__":
    main()
