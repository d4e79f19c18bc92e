"""One gloo rank: ``python -m tests.transport_ranks.diverge_torch SCENARIO OUTDIR RANK WORLD PORT``.

A rank that changes its configuration after agreement (tests/transport_ranks/diverge.py), on each
torch engine: ``all_reduce``, the DDP hook and FSDP2's reduce-scatter. Writes ``OUTDIR/rank<r>.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcodec
import gcodec.torch

from ..procs import finish_gloo, run_checked, start_gloo
from .diverge import BASES, CHANGES, other_codec, other_mode, run_cases

CHECKS: list[dict] = []
RANK = WORLD = 0


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})


def scenario_all_reduce() -> None:
    def allreduce(x: np.ndarray, codec: dict[str, Any], mode: str, key: str) -> np.ndarray:
        t = torch.from_numpy(x.copy())
        gcodec.torch.all_reduce(t, codec, key=key, mode=mode)
        return t.numpy()

    run_cases(RANK, WORLD, allreduce, check)


class Bucket:
    """A stand-in for DDP's GradBucket (which has no Python constructor) over given gradients: the
    methods the hook calls. Used where real DDP cannot go: ranks with different dtypes."""

    def __init__(self, grads: list[torch.Tensor], params: list[torch.Tensor]) -> None:
        self._buf = torch.cat([g.reshape(-1) for g in grads])
        self._grads, pos = [], 0
        for g in grads:
            self._grads.append(self._buf[pos : pos + g.numel()].view(g.shape))
            pos += g.numel()
        self._params = params

    def buffer(self) -> torch.Tensor:
        return self._buf

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def model_and_data() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))
    g = torch.Generator().manual_seed(100 + RANK)
    x = torch.randn(64, 32, generator=g)
    return model, x, torch.tanh(x[:, :8])


def hook_bucket_mean(state: gcodec.torch.HookState, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The hook on a stand-in bucket of two gradients: (its result, the exact mean over the ranks)."""
    shapes = [(96, 32), (8, 96)]
    grads = [torch.from_numpy(np.random.default_rng(seed + RANK).standard_normal(s).astype(np.float32)) for s in shapes]
    exact = [
        torch.stack(
            [
                torch.from_numpy(np.random.default_rng(seed + r).standard_normal(s).astype(np.float32))
                for r in range(WORLD)
            ]
        ).mean(0)
        for s in shapes
    ]
    params = state.__dict__.setdefault("_test_params", [torch.zeros(s) for s in shapes])
    b = Bucket([g.to(dtype) for g in grads], params)
    return gcodec.torch.comm_hook(state, b).wait(), torch.cat([e.reshape(-1) for e in exact])  # type: ignore[arg-type]


def hook_works_again(key: str) -> None:
    """After a step where every rank raised: a fresh hook (fp16, stand-in bucket) on the same
    process group gives the mean within fp16's rounding (|x| < 8: half an ulp of 2**-7 twice)."""
    st = gcodec.torch.HookState(codec="fp16", start_iter=0, min_numel=64, error_feedback=False)
    try:
        got, exact = hook_bucket_mean(st, torch.float32, 11)
        err = float((got - exact).abs().max())
        check(f"{key}: the hook works again afterwards", err < 2.0**-8, f"max err {err:.3g}")
    except Exception as e:
        check(f"{key}: the hook works again afterwards", False, repr(e)[:400])


def scenario_hook() -> None:
    changer = WORLD - 1
    fields = {"codec": "codec", "length": "tensors", "dtype": "dtype", "mode": "mode"}
    for name, cfg, mode in BASES:
        for change in CHANGES:
            key = f"hook {name}/{change}"
            model, x, y = model_and_data()
            ddp = DDP(model)
            st = gcodec.torch.HookState(codec=cfg, start_iter=0, min_numel=64, mode=mode, error_feedback=False)
            ddp.register_comm_hook(st, gcodec.torch.comm_hook)
            for _ in range(2):
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            field = fields[change]
            try:
                if change == "dtype":
                    # DDP cannot hold other dtypes on one rank: the hook itself, on a stand-in bucket
                    hook_bucket_mean(st, torch.float32, 7)  # agreed first
                    hook_bucket_mean(st, torch.float64 if RANK == changer else torch.float32, 7)
                else:
                    if RANK == changer:
                        if change == "codec":
                            st.configure(codec=gcodec.get_codec(other_codec(cfg)))
                        elif change == "length":
                            st.configure(min_numel=1000)  # the 8 x 96 weight goes dense: the groups' lengths change
                        else:
                            st.mode = other_mode(cfg, mode, WORLD)
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
                check(f"{key}: the change raises", False, "no error")
            except Exception as e:  # DDP re-raises the hook's error from backward
                msg = str(e)
                check(
                    f"{key}: every rank raises a ConfigError naming {field!r} and rank {changer}",
                    # DDP re-raises the future's error as a RuntimeError with the ConfigError's text
                    "ranks disagree on" in msg and field in msg and f"[{changer}]" in msg,
                    msg[:400],
                )
            hook_works_again(key)


class RaisingChooser:
    """A user's per-tensor policy (``policy(name, grad)``) with a bug on the last rank: it raises a
    KeyError, not a gcodec error, once ``armed``."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg, self.armed = cfg, False

    def __call__(self, name: str, grad: torch.Tensor) -> dict[str, Any]:
        if self.armed and RANK == WORLD - 1:
            raise KeyError(f"no rule for {name}")
        return self.cfg


def _raised_alike(key: str, msg: str) -> None:
    """The check of a step where the last rank's policy raised: it names its own error, every peer
    the failing rank (DDP and FSDP re-raise the engine's error with its text)."""
    changer = WORLD - 1
    want = "no rule for" if RANK == changer else f"rank {changer} failed"
    check(f"{key}: every rank raises, the failing rank its own error", want in msg, msg[:400])


def scenario_hook_policy_raises() -> None:
    """A policy that raises on one rank after agreed steps: every rank raises, none waits."""
    for name, cfg, mode in BASES[:4]:
        key = f"hook {name}/policy raises"
        model, x, y = model_and_data()
        ddp = DDP(model)
        chooser = RaisingChooser(cfg)
        st = gcodec.torch.HookState(
            codec=cfg, start_iter=0, min_numel=64, mode=mode, error_feedback=False, policy=chooser, module=model
        )
        ddp.register_comm_hook(st, gcodec.torch.comm_hook)
        try:
            for _ in range(2):
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            chooser.armed = True
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            check(f"{key}: the failing policy raises", False, "no error")
        except Exception as e:  # DDP re-raises the hook's error from backward
            _raised_alike(key, str(e))
        hook_works_again(key)


def reduce_scatter_works_again(key: str, name: str, S: int, run: Callable[[], torch.Tensor]) -> None:
    """After a step where every rank raised: ``run()``, the agreed reduce-scatter (mean of every
    rank's ``WORLD * S`` Gaussian inputs of seed 3 + rank, codec ``name``), gives this rank's chunk
    of the mean within the codec's rounding: fp16 as above, uniform 8 bits half a step max|x| / 127
    per term (the mean keeps it)."""
    try:
        got = run()
        rows = [np.random.default_rng(3 + r).standard_normal(WORLD * S).astype(np.float32) for r in range(WORLD)]
        exact = np.mean(rows, axis=0)[RANK * S : (RANK + 1) * S]
        bound = 2.0**-8 if name == "fp16" else max(float(np.abs(r).max()) for r in rows) / 127 * 0.51 + 1e-7
        err = float(np.max(np.abs(got.numpy() - exact)))
        check(f"{key}: the agreed configuration works again afterwards", err <= bound, f"max err {err:.3g}")
    except gcodec.GcodecError as e:
        check(f"{key}: the agreed configuration works again afterwards", False, repr(e)[:400])


def scenario_fsdp() -> None:
    changer = WORLD - 1
    fields = {"codec": "codec", "length": "numel", "dtype": "dtype", "mode": "op"}
    S = 3072
    for name, cfg in (("fp16", {"id": "fp16"}), ("uniform", {"id": "uniform", "bits": 8})):
        for change, field in fields.items():
            key = f"fsdp {name}/{change}"
            # the layout without an FSDP module is one flat 1-D tensor: compressed only when a policy
            # names it explicitly
            st = gcodec.torch.FSDPState(cfg, policy={"*": cfg}, start_iter=0, min_numel=64, error_feedback=False)
            rs = gcodec.torch.ReduceScatter(st, None, name=key)

            def call(n: int, dtype: torch.dtype, op: Any, seed: int, rs: Any = rs) -> torch.Tensor:
                inp = torch.from_numpy(np.random.default_rng(seed + RANK).standard_normal(WORLD * n).astype(np.float32))
                out = torch.empty(n, dtype=dtype)
                rs(out, inp.to(dtype), None, op)
                return out

            avg = dist.ReduceOp.AVG
            try:
                for step in range(2):
                    call(S, torch.float32, avg, step)
            except gcodec.GcodecError as e:
                check(f"{key}: agreed steps run", False, repr(e))
                continue
            n, dtype, op = S, torch.float32, avg
            if RANK == changer:
                if change == "codec":
                    st.configure(policy={"*": {"id": "bf16"} if name == "fp16" else {**cfg, "bits": 4}})
                elif change == "length":
                    n = S + 256
                elif change == "dtype":
                    dtype = torch.bfloat16
                else:
                    op = dist.ReduceOp.SUM
            try:
                call(n, dtype, op, 2)
                check(f"{key}: the change raises", False, "no error")
            except gcodec.ConfigError as e:
                check(
                    f"{key}: every rank raises a ConfigError naming {field!r} and rank {changer}",
                    field in str(e) and str(changer) in str(e),
                    str(e)[:400],
                )
            if RANK == changer and change == "codec":
                st.configure(policy={"*": cfg})
            reduce_scatter_works_again(key, name, S, partial(call, S, torch.float32, avg, 3))


def scenario_fsdp_policy_raises() -> None:
    """FSDP2's reduce-scatter with a policy that raises on one rank after agreed steps."""
    S = 3072
    for name, cfg in (("fp16", {"id": "fp16"}), ("uniform", {"id": "uniform", "bits": 8})):
        key = f"fsdp {name}/policy raises"
        chooser = RaisingChooser(cfg)
        st = gcodec.torch.FSDPState(cfg, policy=chooser, start_iter=0, min_numel=64, error_feedback=False)
        rs = gcodec.torch.ReduceScatter(st, None, name=key)

        def call(seed: int, rs: Any = rs) -> torch.Tensor:
            inp = torch.from_numpy(np.random.default_rng(seed + RANK).standard_normal(WORLD * S).astype(np.float32))
            out = torch.empty(S)
            rs(out, inp, None, dist.ReduceOp.AVG)
            return out

        try:
            for step in range(2):
                call(step)
            chooser.armed = True
            call(2)
            check(f"{key}: the failing policy raises", False, "no error")
        except Exception as e:
            _raised_alike(key, str(e))
        chooser.armed = False
        reduce_scatter_works_again(key, name, S, partial(call, 3))


def main() -> None:
    global RANK, WORLD
    scenario, outdir = sys.argv[1], Path(sys.argv[2])
    RANK, WORLD, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    start_gloo(RANK, WORLD, port, 30)

    def body() -> None:
        globals()[f"scenario_{scenario}"]()
        # the process group itself is untouched: a plain all_reduce still sums
        t = torch.tensor([float(RANK + 1)])
        dist.all_reduce(t)
        check("the process group works afterwards", float(t) == WORLD * (WORLD + 1) / 2, str(float(t)))

    run_checked(body, CHECKS, outdir, RANK)
    finish_gloo()


if __name__ == "__main__":
    main()
