"""Error feedback: remember what compression dropped and send it next time.

For each key (usually a parameter name) :class:`ErrorFeedback` keeps a residual ``e`` and encodes
``x + e`` instead of ``x``; afterwards ``e <- (x + e) - decode(payload)``. Over T steps the sum of
what was decoded plus the final residual equals the sum of the inputs (up to float rounding), so
biased or lossy codecs (Top-K, sign, low bit widths) still converge (Seide et al. 2014, "1-bit SGD";
Karimireddy et al. 2019, "EF-SignSGD"; Stich et al. 2018, "Sparsified SGD with memory").

Works with every codec: it only calls ``codec.encode`` and ``gcodec.decode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from .arrays import as_numpy, dtype_name
from .codecs.base import Codec, EncodeContext, EncodePlan
from .codecs.registry import get_codec
from .errors import ConfigError, PayloadValueError
from .format.container import PendingTensor, write_payload
from .kernels import run_chunks, threads_for
from .kernels.quant_cpu import CHUNK
from .limits import get_limits

__all__ = ["ErrorFeedback"]


@njit(cache=True, nogil=True)
def _residual_range(corrected, decoded, lo, hi):  # pragma: no cover - jitted
    """corrected[lo:hi] -= decoded[lo:hi]; returns how many results are NaN or infinite."""
    bad = 0
    for i in range(lo, hi):
        r = corrected[i] - decoded[i]
        corrected[i] = r
        bad += not (abs(r) <= 1.7976931348623157e308)
    return bad


def _residual_inplace(corrected: np.ndarray, decoded: np.ndarray) -> int:
    """corrected -= decoded; returns how many results are NaN or infinite."""
    return run_chunks(_residual_range, corrected.shape[0], CHUNK, corrected, decoded)


def _write_one(
    codec: Codec, arr: np.ndarray, plan: EncodePlan, checksum: bool, meta: Mapping[str, str] | None
) -> memoryview:
    """Write a single-tensor payload from a plan (what ``gcodec.api.encode_with`` does after ``plan``)."""
    lim = get_limits()
    lim.check("ndim", arr.ndim, "max_ndim")
    lim.check("element count", arr.size, "max_elements")
    pend = PendingTensor(
        codec.codec_id,
        codec.version,
        dtype_name(arr.dtype),
        tuple(int(d) for d in arr.shape),
        plan.params,
        plan.sections,
        plan.fill,
        None,
    )
    with threads_for(arr.size):  # as the API layer does: small tensors stay on this thread
        return write_payload([pend], meta=meta, checksum=checksum, limits=lim)


class ErrorFeedback:
    """Residual memory around any codec.

    Args:
        codec: the codec (or its id / config dict) that compresses ``x + residual``.
        residual_dtype: dtype of the residuals. Default: float64 for float64 input, else float32
            (16-bit inputs are accumulated in float32 so small residuals are not rounded away).

    The payload declares the residual dtype (the corrected tensor is what gets encoded).
    """

    def __init__(self, codec: Codec | str | dict[str, Any], *, residual_dtype: Any = None) -> None:
        self.codec = get_codec(codec)
        self.residual_dtype = None if residual_dtype is None else np.dtype(residual_dtype)
        if self.residual_dtype is not None and self.residual_dtype not in (np.float32, np.float64):
            raise ConfigError("residual_dtype must be float32 or float64")
        self._residuals: dict[str, np.ndarray] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self._disabled: set[str] = set()

    def _work_dtype(self, arr: np.ndarray) -> np.dtype:
        if self.residual_dtype is not None:
            return self.residual_dtype
        return np.dtype(np.float64) if arr.dtype == np.float64 else np.dtype(np.float32)

    def encode(
        self,
        x: Any,
        key: str,
        *,
        step: int | None = None,
        checksum: bool = True,
        meta: Mapping[str, str] | None = None,
    ) -> memoryview:
        """Encode ``x + residual[key]`` and keep the new residual. Returns the payload.

        If encoding fails (non-finite values), the residual is left as it was.
        """
        from .api import decode

        arr = as_numpy(x)
        if key in self._disabled:
            return self.codec.encode(arr, key=key, step=step, checksum=checksum, meta=meta)
        wd = self._work_dtype(arr)
        e = self._residuals.get(key)
        if e is not None and e.shape != arr.shape:
            raise ConfigError(f"error feedback key {key!r}: shape {arr.shape} differs from its residual's {e.shape}")
        if e is not None and e.dtype != wd:
            e = e.astype(wd)
        scratch = self._scratch.get(key)
        if scratch is None or scratch.shape != arr.shape or scratch.dtype != wd:
            scratch = np.empty(arr.shape, dtype=wd)
        # Fast path: a codec with a fused kernel reads x and e once and writes the new residual
        # into the scratch buffer (bit-identical to the generic path below); then the two swap.
        fused = getattr(self.codec, "plan_feedback", None)
        if fused is not None and arr.dtype == wd:
            plan = fused(arr, e, scratch, EncodeContext(key, step))
            if plan is not None:
                buf = _write_one(self.codec, arr, plan, checksum, meta)
                self._residuals[key] = scratch
                if e is not None:
                    self._scratch[key] = e
                else:
                    self._scratch.pop(key, None)
                return buf
        # Generic path: corrected = x + e; encode it; e <- corrected - decode(payload).
        if e is not None and arr.dtype == wd:
            corrected = np.add(arr, e)
        else:
            corrected = arr.astype(wd, copy=True)
            if e is not None:
                corrected += e
        buf = self.codec.encode(corrected, key=key, step=step, checksum=checksum, meta=meta)
        self._scratch[key] = scratch
        decode(buf, out=scratch)
        with threads_for(arr.size):
            bad = _residual_inplace(corrected.reshape(-1), scratch.reshape(-1))
        if bad:
            raise PayloadValueError(
                f"error feedback key {key!r}: {bad} residual value(s) would be NaN or infinite "
                "(non-finite input, or a codec that overflowed); the residual was left unchanged"
            )
        self._residuals[key] = corrected
        return buf

    # ---- state ---------------------------------------------------------------------------
    def residual(self, key: str) -> np.ndarray | None:
        """The current residual of ``key`` (a copy), or None when it has none yet."""
        e = self._residuals.get(key)
        return None if e is None else e.copy()

    def reset(self, key: str | None = None) -> None:
        """Forget the residual of ``key``, or of every key."""
        if key is None:
            self._residuals.clear()
            self._scratch.clear()
        else:
            self._residuals.pop(key, None)
            self._scratch.pop(key, None)

    def disable(self, key: str) -> None:
        """Encode ``key`` without feedback from now on (its residual is dropped)."""
        self._disabled.add(key)
        self.reset(key)

    def enable(self, key: str) -> None:
        self._disabled.discard(key)

    def keys(self) -> list[str]:
        return list(self._residuals)

    def state_dict(self) -> dict[str, Any]:
        """Residuals (copied), disabled keys, the codec config and, for stochastic codecs, each key's
        next random stream; restorable with load_state_dict (``torch.save`` / pickle friendly)."""
        state: dict[str, Any] = {
            "codec": self.codec.get_config(),
            "residuals": {k: v.copy() for k, v in self._residuals.items()},
            "disabled": sorted(self._disabled),
        }
        streams = getattr(self.codec, "stream_state", None)
        if streams is not None:  # stochastic codecs: where each key's random stream continues
            state["streams"] = streams()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            residuals = state["residuals"]
            disabled = state.get("disabled", [])
        except (KeyError, TypeError):
            raise ConfigError("state dict lacks 'residuals'") from None
        if "codec" in state and get_codec(state["codec"]) != self.codec:
            raise ConfigError(f"state was saved with codec {state['codec']}, not {self.codec.get_config()}")
        new = {}
        for k, v in residuals.items():
            a = np.array(v, copy=True)
            if a.dtype not in (np.float32, np.float64):
                raise ConfigError(f"residual {k!r} has dtype {a.dtype}; expected float32 or float64")
            new[k] = a
        streams = state.get("streams")
        if streams is not None and hasattr(self.codec, "load_stream_state"):
            self.codec.load_stream_state(streams)
        self._residuals = new
        self._scratch.clear()
        self._disabled = set(disabled)
