"""One rank of a nanoGPT-style training loop with gcodec's DDP hook, the raw-loop recipe of
docs/integrations.md: ``python -m tests.transport_ranks.nanogpt_program OUTDIR RANK WORLD PORT``;
writes OUTDIR/rank<r>.json.

What nanoGPT's model.py and train.py do, small: token and position embeddings, two blocks of causal
self-attention and MLP, the lm_head tied to the token embedding; AdamW with weight decay on the
matrices only; a warm-up and cosine learning rate; gradient accumulation over micro-steps under
``ddp.no_sync()``; the forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``; gradient
clipping before the step. The hook: uniform 4-bit with error feedback. The same loop without the
hook is the reference.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from ..procs import finish_gloo, run_checked, start_gloo
from .integ_common import CHECKS, NotCalled, check, close_to, hook_ran, loss_falls, params_agree

ITERS = 16  # optimizer steps
MICRO = 2  # micro-steps per optimizer step
START_ITER = 2
VOCAB, BLOCK, EMBD, HEADS, LAYERS, BATCH = 64, 32, 64, 4, 2, 8


def main() -> None:
    outdir = Path(sys.argv[1])
    rank, world, port = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    t0 = time.perf_counter()
    start_gloo(rank, world, port, timeout=120.0)
    print(f"torch and the group: {time.perf_counter() - t0:.1f} s", flush=True)

    import torch
    import torch.nn as nn
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gcodec.torch

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(EMBD, 3 * EMBD)
            self.c_proj = nn.Linear(EMBD, EMBD)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(EMBD, dim=2)
            q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = nn.Linear(EMBD, 4 * EMBD)
            self.c_proj = nn.Linear(4 * EMBD, EMBD)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c_proj(F.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(EMBD), CausalSelfAttention()
            self.ln_2, self.mlp = nn.LayerNorm(EMBD), MLP()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
            self.h = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(EMBD)
            self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
            self.wte.weight = self.lm_head.weight  # weight tying
            self.apply(self._init_weights)
            for n, p in self.named_parameters():
                if n.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * LAYERS))

        def _init_weights(self, m: nn.Module) -> None:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            pos = torch.arange(idx.shape[1])
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return logits, F.cross_entropy(logits.view(-1, VOCAB).float(), targets.reshape(-1))

        def configure_optimizers(self, weight_decay: float, lr: float) -> torch.optim.AdamW:
            params = dict(self.named_parameters())
            decay = [p for p in params.values() if p.dim() >= 2]
            no_decay = [p for p in params.values() if p.dim() < 2]
            groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
            return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))

    # a Markov chain of tokens, each followed by one of two successors: learnable in a few steps
    table = torch.randint(0, VOCAB, (VOCAB, 2), generator=torch.Generator().manual_seed(11))

    def get_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.empty(BATCH, BLOCK + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
        pick = torch.randint(0, 2, (BATCH, BLOCK), generator=g)
        for t in range(BLOCK):
            seq[:, t + 1] = table[seq[:, t], pick[:, t]]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def get_lr(it: int, max_lr: float = 3e-3, warmup: int = 2) -> float:
        if it < warmup:
            return max_lr * (it + 1) / warmup
        ratio = (it - warmup) / (ITERS - warmup)
        return 0.1 * max_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * 0.9 * max_lr

    def train(hook: bool) -> tuple[GPT, list[float], gcodec.torch.HookState | None]:
        torch.manual_seed(1337)
        model = GPT()
        ddp = DDP(model)
        state = None
        if hook:  # the recipe: two lines after DDP(model)
            state = gcodec.torch.HookState(codec={"id": "uniform", "bits": 4}, start_iter=START_ITER, module=model)
            ddp.register_comm_hook(state, gcodec.torch.comm_hook)
        optimizer = model.configure_optimizers(weight_decay=0.1, lr=3e-3)
        g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        x, y = get_batch(g)
        losses = []
        for it in range(ITERS):
            for group in optimizer.param_groups:
                group["lr"] = get_lr(it)
            total = 0.0
            for micro in range(MICRO):
                # DDP all-reduces (and calls the hook) on the last micro-step only
                with ddp.no_sync() if micro < MICRO - 1 else nullcontext():
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        _, loss = ddp(x, y)
                        loss = loss / MICRO
                    x, y = get_batch(g)
                    loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
        return model, losses, state

    def body() -> None:
        t, c = time.perf_counter(), time.process_time()
        base, base_losses, _ = train(hook=False)
        print(f"reference: {time.perf_counter() - t:.1f} s, cpu {time.process_time() - c:.1f} s", flush=True)
        label = "nanoGPT loop, uniform 4-bit + EF"
        t, c = time.perf_counter(), time.process_time()
        with NotCalled() as seen:
            model, losses, state = train(hook=True)
        print(f"with the hook: {time.perf_counter() - t:.1f} s, cpu {time.process_time() - c:.1f} s", flush=True)
        check(f"{label}: no HookNotCalledWarning", seen.count() == 0, f"{seen.count()} warnings")
        hook_ran(label, state, ITERS)
        params_agree(label, model)
        check(f"{label}: lm_head still tied to wte", model.lm_head.weight is model.wte.weight)
        loss_falls(label, losses, base_losses)
        close_to(label, model, base)

    run_checked(body, CHECKS, outdir, rank)
    finish_gloo()


if __name__ == "__main__":
    main()
