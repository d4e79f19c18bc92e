"""Error feedback: remember what compression dropped and send it next time.

For each key (usually a parameter name) :class:`ErrorFeedback` keeps a residual ``e`` and encodes
``c = x + decay * e`` instead of ``x``; afterwards ``e <- c - decode(payload)``. With ``decay = 1``
(the default) the sum of what was decoded over T steps plus the final residual equals the sum of
the inputs (up to float rounding), so biased or lossy codecs (Top-K, sign, low bit widths) still
converge (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "EF-SignSGD"; Stich et al. 2018,
"Sparsified SGD with memory"). A decay below 1 forgets old residuals geometrically (SparseLoCo uses
0.95): a residual of T steps ago weighs ``decay**T``, so stale corrections cannot pile up.

Works with every codec: it encodes through ``gcodec.encode`` with its own
:class:`~gcodec.CodecState` (:attr:`ErrorFeedback.codec_state`) and decodes with ``gcodec.decode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import kernels
from .api import decode, encode, pending_from_plan, write_pending
from .arrays import backend_of, host_array, intake, tensors_from_arrays
from .codecs.base import Codec, EncodeContext
from .codecs.registry import get_codec
from .codecs.state import CodecState, owned_array
from .errors import ConfigError, PayloadValueError
from .limits import get_limits

__all__ = ["ErrorFeedback"]


def _copy(a: Any) -> Any:
    """A copy of ``a`` in the memory it lives in."""
    if backend_of(a) == "cpu":
        return a.copy()
    K = kernels.of(a)
    c = K.memory.empty(int(a.size), a.dtype)
    K.memory.copy(c, a.reshape(int(a.size)))
    return c.reshape(tuple(a.shape))


def _host_copy(a: Any) -> np.ndarray:
    if backend_of(a) == "cpu":
        return a.copy()
    return np.asarray(kernels.of(a).launch.host(a))  # copied on gcodec's current stream, after its work


class ErrorFeedback:
    """Residual memory around any codec.

    Args:
        codec: the codec (or its id / config dict) that compresses ``x + residual``.
        residual_dtype: dtype of the residuals. Default: float64 for float64 input, else float32
            (16-bit inputs are accumulated in float32 so small residuals are not rounded away).
        decay: ``0 < decay <= 1``, the factor the residual is multiplied by before it is added:
            ``c = x + decay * e``, the product rounded to the residual dtype first, then the sum
            (no fused multiply-add, on every backend). 1.0 (default) is classic error feedback;
            SparseLoCo uses 0.95 with chunked top-k. A smaller decay keeps the residual smaller
            (``|e_T| <= q G (1 - (q decay)^T) / (1 - q decay)`` for a codec that keeps at least
            ``1 - q^2`` of the energy and inputs of norm at most G) at the cost of forgetting part
            of what was dropped.

    The payload declares the residual dtype (the corrected tensor is what gets encoded).
    """

    def __init__(self, codec: Codec | str | dict[str, Any], *, residual_dtype: Any = None, decay: float = 1.0) -> None:
        self.codec = get_codec(codec)
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < float(decay) <= 1.0:
            raise ConfigError(f"decay must be a number in (0, 1], got {decay!r}")
        self.decay = float(decay)
        self.residual_dtype = None if residual_dtype is None else np.dtype(residual_dtype)
        if self.residual_dtype is not None and self.residual_dtype not in (np.float32, np.float64):
            raise ConfigError("residual_dtype must be float32 or float64")
        #: Streams and warm starts of the wrapped codec (its per-key state), saved with the residuals.
        self.codec_state = CodecState()
        self._residuals: dict[str, np.ndarray] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self._disabled: set[str] = set()
        self._torch_in = False  # were inputs torch tensors? Then state_dict() holds tensors

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
        out: Any = None,
    ) -> memoryview:
        """Encode ``x + residual[key]`` and keep the new residual. Returns the payload.

        ``out`` is a send buffer to write the payload into (as for :func:`gcodec.encode`). If encoding
        fails (non-finite values, or ``out`` too small), the residual is left as it was.
        """
        if type(x).__module__.startswith("torch"):
            self._torch_in = True
        if backend_of(x) != "cpu":
            return self._encode_device(x, key, step=step, checksum=checksum, meta=meta, out=out)
        arr = host_array(x)
        lim = get_limits()
        if key in self._disabled:
            return encode(
                arr, self.codec, key=key, step=step, state=self.codec_state, checksum=checksum, meta=meta, out=out
            )
        wd, e, scratch = self._host_buffers(key, arr)
        if e is not None and self.decay != 1.0:
            # c = x + fl(decay * e) first; both paths below then encode c with no residual, so the
            # fused path stays bit-identical to the generic one
            arr = self._corrected(arr, e, wd)
            e = None
        # Fast path: a codec with a fused kernel reads x and e once and writes the new residual
        # into the scratch buffer (bit-identical to the generic path below); then the two swap.
        fused = getattr(self.codec, "plan_feedback", None)
        if fused is not None and arr.dtype == wd:
            plan = fused(arr, e, scratch, EncodeContext(key, step, self.codec_state))
            if plan is not None:
                lim.check_ndim(arr.ndim)
                lim.check("element count", arr.size, "max_elements")
                pend = pending_from_plan(self.codec, arr, plan)
                buf = write_pending([pend], meta=meta, checksum=checksum, limits=lim, out=out)
                self._residuals[key] = scratch
                if e is not None:
                    self._scratch[key] = e
                else:
                    self._scratch.pop(key, None)
                return buf
        # Generic path: corrected = x + e; encode it; e <- corrected - decode(payload).
        corrected = self._corrected(arr, e, wd)
        buf = encode(
            corrected, self.codec, key=key, step=step, state=self.codec_state, checksum=checksum, meta=meta, out=out
        )
        self._scratch[key] = scratch
        decode(buf, out=scratch)
        K = kernels.of(corrected)
        with K.threads_for(arr.size):
            bad = K.feedback.residual_inplace(corrected.reshape(-1), scratch.reshape(-1))
        self._keep_residual(key, corrected, bad)
        return buf

    def encode_values(self, x: np.ndarray, key: str, out: np.ndarray) -> None:
        """For codecs with a values section (``codec.values_dtype``: fp16, bf16): write the values of
        ``x + residual[key]`` into ``out`` (``x.size`` elements) and keep the new residual, without
        a payload.

        The same arithmetic as :meth:`encode` (bit for bit, residual included): for transports that
        send the values alone (the FSDP reduce-scatter's values path), host or device arrays (the
        residual stays where ``x`` lives). If the new residual is not finite, raises
        :class:`~gcodec.PayloadValueError` and keeps the old one.
        """
        codec = self.codec
        if codec.values_dtype is None:
            raise ConfigError(f"encode_values needs a codec with a values section (fp16, bf16), not {codec.codec_id!r}")
        if backend_of(x) != "cpu":
            self._encode_values_device(x, key, out)
            return
        arr = np.asarray(x)
        K = kernels.of(arr)
        if key in self._disabled:
            flat = arr.reshape(-1)
            codec.encode_values(flat if flat.dtype in (np.float32, np.float64) else flat.astype(np.float32), out)
            return
        wd, e, scratch = self._host_buffers(key, arr)
        corrected = self._corrected(arr, e, wd)
        self._scratch[key] = scratch
        codec.encode_values(corrected.reshape(-1), out)
        codec.decode_values(out, scratch.reshape(-1), False)
        with K.threads_for(arr.size):
            bad = K.feedback.residual_inplace(corrected.reshape(-1), scratch.reshape(-1))
        self._keep_residual(key, corrected, bad)

    def _host_buffers(self, key: str, arr: np.ndarray) -> tuple[np.dtype, np.ndarray | None, np.ndarray]:
        """(work dtype, ``key``'s residual in it or None, a scratch array of ``arr``'s shape) for a
        host encode; a residual of another shape is a ConfigError."""
        wd = self._work_dtype(arr)
        e = self._residuals.get(key)
        if e is not None and e.shape != arr.shape:
            raise ConfigError(f"error feedback key {key!r}: shape {arr.shape} differs from its residual's {e.shape}")
        if e is not None and e.dtype != wd:
            e = e.astype(wd)
        scratch = self._scratch.get(key)
        if scratch is None or scratch.shape != arr.shape or scratch.dtype != wd:
            scratch = np.empty(arr.shape, dtype=wd)
        return wd, e, scratch

    def _corrected(self, arr: np.ndarray, e: np.ndarray | None, wd: np.dtype) -> np.ndarray:
        """A new array ``x + decay * e`` in the work dtype (``x`` itself is never written). The sum
        follows specs/format.md §10's NaN rule (a NaN sum is a positive NaN), as the fused kernels'."""
        if e is None:
            return arr.astype(wd, copy=True)
        K = kernels.of(arr)
        if self.decay != 1.0:
            corrected = arr.astype(wd, copy=True)
            with K.threads_for(corrected.size):
                K.feedback.add_decayed(corrected.reshape(-1), e.reshape(-1), self.decay)
            return corrected
        if arr.dtype == wd and arr.flags.c_contiguous:
            corrected = np.empty(arr.shape, wd)
            src = arr
        else:  # widened (or made contiguous) first, exactly, then added in place
            corrected = src = arr.astype(wd, copy=True)
        with K.threads_for(corrected.size):
            K.feedback.add(corrected.reshape(-1), src.reshape(-1), e.reshape(-1))
        return corrected

    def _keep_residual(self, key: str, residual: np.ndarray, bad: int) -> None:
        """Store ``key``'s new residual, or raise (keeping the old one) when ``bad`` of its values are
        not finite."""
        if bad:
            raise PayloadValueError(
                f"error feedback key {key!r}: {bad} residual value(s) would be NaN or infinite "
                "(non-finite input, or a codec that overflowed); the residual was left unchanged"
            )
        self._residuals[key] = residual

    def _encode_device(
        self, x: Any, key: str, *, step: int | None, checksum: bool, meta: Mapping[str, str] | None, out: Any
    ) -> Any:
        """The generic path with every array in device memory (docs/gpu.md): the residual stays on the
        device, ``x + e`` and ``e <- corrected - decode(payload)`` run there, bit-identical to the CPU.
        A host residual (from ``load_state_dict``) is copied to the device once."""
        arr = intake(x)
        K = kernels.get(arr.backend)
        dev = K.view(arr.array)
        if key in self._disabled:
            return encode(
                dev, self.codec, key=key, step=step, state=self.codec_state, checksum=checksum, meta=meta, out=out
            )
        fused = getattr(self.codec, "plan_feedback", None)
        if fused is not None:
            buf = self._encode_device_fused(K, dev, key, fused, step=step, checksum=checksum, meta=meta, out=out)
            if buf is not None:
                return buf
        K, corrected, shape, scratch = self._device_corrected(K, dev, key)
        buf = encode(
            corrected.reshape(shape),
            self.codec,
            key=key,
            step=step,
            state=self.codec_state,
            checksum=checksum,
            meta=meta,
            out=out,
        )
        decode(buf, out=scratch)
        bad = K.feedback.residual_inplace(corrected, scratch)
        self._keep_residual(key, corrected.reshape(shape), bad)
        return buf

    def _encode_device_fused(
        self,
        K: Any,
        dev: Any,
        key: str,
        fused: Any,
        *,
        step: int | None,
        checksum: bool,
        meta: Mapping[str, str] | None,
        out: Any,
    ) -> Any:
        """The codec's fused kernel on the device (``plan_feedback``: it reads ``x`` and ``e`` and
        writes the new residual into the key's scratch while it encodes); None when the codec has
        none for this array (after the checks of :meth:`_device_state`), and the caller takes the
        generic path. A decay other than 1 is applied first (``x + fl(decay * e)``), and the fused
        kernel then runs without a residual, as on the host. The old residual's buffer becomes the
        next scratch (it is the new residual's size)."""
        wd, shape, e, scratch = self._device_state(K, dev, key)
        n = int(dev.size)
        src, free = dev, None
        if e is not None and self.decay != 1.0:
            c = K.memory.empty(n, wd)
            K.memory.copy(c, dev.reshape(n))
            K.feedback.add_decayed(c, e, self.decay)
            src, free, e = c.reshape(shape), e, None
        plan = fused(src, e, scratch, EncodeContext(key, step, self.codec_state))
        if plan is None:
            return None
        lim = get_limits()
        lim.check_ndim(len(shape))
        lim.check("element count", n, "max_elements")
        pend = pending_from_plan(self.codec, src, plan)
        buf = write_pending([pend], meta=meta, checksum=checksum, limits=lim, out=out)
        self._residuals[key] = scratch.reshape(shape)
        old = e if e is not None else free
        if old is not None:
            self._scratch[key] = old
        else:
            self._scratch.pop(key, None)
        return buf

    def _device_state(self, K: Any, dev: Any, key: str) -> tuple[np.dtype, tuple[int, ...], Any, Any]:
        """(work dtype, x's shape, the key's residual as a flat device array or None, a device
        scratch of x's size) for a device encode with feedback; a host residual (from
        ``load_state_dict``) is copied to the device here, once. Raises ConfigError for an input
        whose dtype or shape the residual cannot take."""
        wd = self._work_dtype(dev)
        if np.dtype(dev.dtype) != wd:
            raise ConfigError(
                f"error feedback on device arrays needs {wd} input (residual dtype), got {dev.dtype}: cast it first"
            )
        shape = tuple(int(d) for d in dev.shape)
        n = int(dev.size)
        e = self._residuals.get(key)
        if e is not None:
            if tuple(e.shape) != shape:
                raise ConfigError(
                    f"error feedback key {key!r}: shape {shape} differs from its residual's {tuple(e.shape)}"
                )
            if backend_of(e) == "cpu":
                e = K.launch.upload(np.ascontiguousarray(e).reshape(n))
            e = e.reshape(n)
        scratch = self._scratch.get(key)
        if scratch is None or backend_of(scratch) == "cpu" or tuple(scratch.shape) != (n,):
            scratch = K.memory.empty(n, wd)
        return wd, shape, e, scratch

    def _device_corrected(self, K: Any, dev: Any, key: str) -> tuple[Any, Any, tuple[int, ...], Any]:
        """(kernels, ``x + e`` as a new flat device array, x's shape, the key's device scratch of
        that size): the first half of every device encode with feedback."""
        wd, shape, e, scratch = self._device_state(K, dev, key)
        n = int(dev.size)
        corrected = K.memory.empty(n, wd)
        if e is not None and self.decay == 1.0:
            K.feedback.add(corrected, dev.reshape(n), e)  # x + e: one IEEE addition, as on the host
        else:
            K.memory.copy(corrected, dev.reshape(n))
            if e is not None:
                K.feedback.add_decayed(corrected, e, self.decay)  # x + fl(decay * e), as on the host
        self._scratch[key] = scratch
        return K, corrected, shape, scratch

    def _encode_values_device(self, x: Any, key: str, out: Any) -> None:
        """:meth:`encode_values` with every array in device memory: ``x + e``, the values, their
        decode and ``e <- corrected - decoded`` run there, bit-identical to the CPU."""
        arr = intake(x)
        K = kernels.get(arr.backend)
        dev = K.view(arr.array)
        if key in self._disabled:
            self.codec.encode_values(dev.reshape(int(dev.size)), out)
            return
        K, corrected, shape, scratch = self._device_corrected(K, dev, key)
        self.codec.encode_values(corrected, out)
        self.codec.decode_values(out, scratch, False)
        bad = K.feedback.residual_inplace(corrected, scratch)
        self._keep_residual(key, corrected.reshape(shape), bad)

    # ---- state ---------------------------------------------------------------------------
    def residual(self, key: str) -> np.ndarray | None:
        """The current residual of ``key`` (a copy, in the memory it lives in), or None when it has none yet."""
        e = self._residuals.get(key)
        return None if e is None else _copy(e)

    def set_residual(self, key: str, residual: Any) -> None:
        """Make ``residual`` (float32 or float64, any memory it lives in; kept as given, not copied)
        the residual of ``key``: what a transport that re-lays residuals out (a bucket rebuild, a
        codec switch) hands over. The next encode of ``key`` checks its shape as for any residual."""
        if residual.dtype not in (np.float32, np.float64):
            raise ConfigError(f"residual {key!r} has dtype {residual.dtype}; expected float32 or float64")
        self._residuals[key] = residual
        self._scratch.pop(key, None)

    def reset(self, key: str | None = None) -> None:
        """Forget the residual of ``key``, or of every key (the codec's streams carry on)."""
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

    def state_dict(self, *, tensors: bool | None = None) -> dict[str, Any]:
        """Residuals (copied), disabled keys, the codec config, and the codec's per-key state (random
        streams, warm starts); restorable with :meth:`load_state_dict`.

        Arrays are NumPy arrays, or torch tensors when ``tensors=True`` (default: when the inputs
        were torch tensors: tensors in, tensors out), so that ``torch.load(..., weights_only=True)``,
        torch's default loader, accepts a ``torch.save``-d state.
        """
        state: dict[str, Any] = {
            "codec": self.codec.get_config(),
            "decay": self.decay,
            "residuals": {k: _host_copy(v) for k, v in self._residuals.items()},  # device residuals: host copies
            "disabled": sorted(self._disabled),
            "codec_state": self.codec_state.state_dict(),  # streams and warm starts per key
        }
        if self._torch_in if tensors is None else tensors:
            state = tensors_from_arrays(state)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            residuals = state["residuals"]
            disabled = state.get("disabled", [])
        except (KeyError, TypeError):
            raise ConfigError("state dict lacks 'residuals'") from None
        if "codec" in state and get_codec(state["codec"]) != self.codec:
            raise ConfigError(f"state was saved with codec {state['codec']}, not {self.codec.get_config()}")
        if "decay" in state:  # (checkpoints written before decay existed do not say)
            decay = state["decay"]
            decay = float(decay.item() if hasattr(decay, "item") else decay)
            if decay != self.decay:
                raise ConfigError(f"state was saved with decay={decay}, not {self.decay}")
        new = {}
        for k, v in residuals.items():
            a = owned_array(v)
            if a.dtype not in (np.float32, np.float64):
                raise ConfigError(f"residual {k!r} has dtype {a.dtype}; expected float32 or float64")
            new[k] = a
        cstate = CodecState()
        if "codec_state" in state:
            cstate.load_state_dict(state["codec_state"])
        elif "streams" in state:  # checkpoints written before the codec state had its own object
            cstate.load_state_dict({"streams": state["streams"]})
        self.codec_state = cstate
        self._residuals = new
        self._scratch.clear()
        self._disabled = set(disabled)
