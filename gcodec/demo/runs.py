"""What the demo trains: the codecs in order, and the training settings (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: The demo's runs, in order: (label, codec config or None for uncompressed, error feedback).
#: Biased codecs (sign, top-k, random-k, PowerSGD, the hybrid) run with error feedback, as they are
#: meant to; the unbiased or near-lossless ones (fp16, uniform, QSGD, TernGrad) without.
DEMO_RUNS: list[tuple[str, dict[str, Any] | None, bool]] = [
    ("uncompressed", None, False),
    ("fp16", {"id": "fp16"}, False),
    ("uniform 8", {"id": "uniform", "bits": 8}, False),
    ("uniform 4", {"id": "uniform", "bits": 4}, False),
    ("qsgd", {"id": "qsgd"}, False),
    ("terngrad", {"id": "terngrad"}, False),
    ("sign + EF", {"id": "sign"}, True),
    ("top-k 1% + EF", {"id": "topk", "ratio": 0.01}, True),
    ("random-k 10% + EF", {"id": "randomk", "ratio": 0.1}, True),
    ("powersgd r2 + EF", {"id": "powersgd", "rank": 2}, True),
    ("top-k 1% + uniform 8 + EF", {"id": "topk", "ratio": 0.01, "values": {"id": "uniform", "bits": 8}}, True),
]


@dataclass
class Settings:
    """Training settings shared by every run of one job (every rank reads the same)."""

    #: hidden layer widths of the MLP 64 -> hidden... -> 10 (ReLU)
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    epochs: int = 12
    #: examples per worker per step (the global batch is batch * workers)
    batch: int = 32
    #: plain SGD by default: error feedback's guarantees (Karimireddy et al. 2019) are for SGD, and
    #: momentum applied after aggregation amplifies the delayed bursts of residual that EF releases
    #: (measured: random-k 10 % + EF ended 39 points lower with momentum 0.9; docs/convergence.md)
    lr: float = 0.3
    momentum: float = 0.0
    #: learning rate decays from ``lr`` to 0 along a half cosine over the whole run
    cosine: bool = True
    #: HookState's start_iter and min_numel: the first steps and the small tensors stay dense
    start_iter: int = 10
    min_numel: int = 1024
    seed: int = 0
    #: evaluate on the test set this many times per epoch (the accuracy curves' resolution; 0: never)
    evals_per_epoch: int = 1
    #: stop after this many steps (0: train every epoch); the link benchmark times a few steps
    max_steps: int = 0
    #: DDP's bucket size (MB); torch's default is 25
    bucket_cap_mb: float = 25.0
    #: seconds a rank waits for its peers before giving up
    timeout_s: float = 120.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_spec(label: str, codec: dict[str, Any] | None, error_feedback: bool, hook: str = "gcodec") -> dict[str, Any]:
    """One run as the worker reads it. ``hook``: ``gcodec``, or torch's ``torch-fp16`` / ``torch-bf16`` /
    ``torch-powersgd`` or ``torch-allreduce`` (DDP's own allreduce as a Python hook: what any hook's
    step costs more than DDP's; for comparisons), or ``none`` (plain DDP allreduce), or ``local`` (DDP with a
    hook that sends nothing: each rank keeps its own gradients, for timing the compute); or FSDP2 instead of
    DDP: ``fsdp`` (FSDP2's own reduce-scatter; add ``"reduce_dtype": "bf16"`` to the spec) or
    ``fsdp-gcodec`` (:func:`gcodec.torch.compress_fsdp` with ``codec``). A gcodec run may add a
    ``"policy"`` (HookState's pattern dict, e.g. ``{"*": None}``: every tensor dense) and a
    ``"warmup_codec"`` (HookState's: the first ``start_iter`` steps through that codec). Any run may
    set its own ``"start_iter"`` (its warm-up length, in place of the settings')."""
    if codec is None and hook == "gcodec":
        hook = "none"
    return {"label": label, "codec": codec, "error_feedback": error_feedback, "hook": hook}


def demo_specs() -> list[dict[str, Any]]:
    return [run_spec(*r) for r in DEMO_RUNS]


@dataclass
class LMSettings:
    """The language-model workload (:mod:`gcodec.demo.lm_worker`): a byte-level decoder-only
    transformer on the standard library's source (:mod:`gcodec.demo.corpus`)."""

    d_model: int = 128
    layers: int = 2
    heads: int = 4
    context: int = 64
    #: windows per rank per inner step (the global batch is batch * workers)
    batch: int = 16
    steps: int = 300
    #: AdamW (betas 0.9, 0.95; weight decay 0.1) with linear warm-up, then cosine to 10 %
    lr: float = 3e-3
    warmup: int = 20
    #: validation loss every this many steps (and at the end), on ``val_windows`` windows
    eval_every: int = 30
    val_windows: int = 64
    seed: int = 0
    #: the DDP hook's dense warm-up steps and dense size limit (HookState's start_iter, min_numel)
    start_iter: int = 10
    min_numel: int = 1024
    #: stop after this many steps (0: ``steps``), keeping the schedule of ``steps`` (timing runs)
    max_steps: int = 0
    timeout_s: float = 300.0
    #: clip the (averaged) gradient's global norm to this before the optimizer step (0: no clipping;
    #: nanoGPT uses 1.0)
    grad_clip: float = 0.0
    #: record the optimizer's diagnostics on rank 0 every this many steps (0: never; see lm_worker)
    diag_every: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def quick(cls) -> LMSettings:
        return cls(d_model=32, layers=1, heads=2, context=32, batch=4, steps=24, warmup=4, eval_every=8, val_windows=8)


def lm_spec(
    label: str,
    method: str,
    codec: dict[str, Any] | None = None,
    error_feedback: bool = False,
    **diloco: Any,
) -> dict[str, Any]:
    """One language-model run: ``method`` ``ddp`` (plain DDP allreduce), ``ddp-gcodec``
    (:func:`gcodec.torch.comm_hook` with ``codec``), ``diloco`` (:class:`gcodec.torch.DiLoCo` with
    ``codec`` for the pseudo-gradients; ``diloco`` holds ``sync_every``, ``fragments``, ``delay``,
    ``mix``) or ``torchft`` (torchft's DiLoCo: fp32, or with ``codec`` through
    :mod:`gcodec.torch.torchft`).

    A run may override the job's settings: ``lr``, ``start_iter``, ``min_numel`` (the hook's, and
    DiLoCo's, default 0 there), ``optimizer`` (``"adamw"``, the default; ``"adamw-frozen"``, AdamW
    whose second moment stops at step ``freeze_at``, default ``start_iter``; ``"sgd"``, plain SGD with
    ``momentum``, default 0), and give the hook a ``policy`` (HookState's pattern dict) or a
    ``warmup_codec``."""
    if method not in ("ddp", "ddp-gcodec", "diloco", "torchft"):
        raise ValueError(f"unknown method {method!r}")
    return {"label": label, "method": method, "codec": codec, "error_feedback": error_feedback, **diloco}
