"""Quality telemetry: how much of a gradient survives compression, measured, sampled, and watched.

Five figures describe one step of a gradient ``x`` whose payload decodes to ``x̂`` (with error
feedback, the codec encodes ``x`` plus the residual, and ``x̂`` is compared with ``x``, the gradient
of the step: what the optimizer receives against what it should have):

* ``relative_error`` ‖x - x̂‖ / ‖x‖;
* ``norm_ratio`` ‖x̂‖ / ‖x‖, the source article's over-compression signal: a ratio that stays below
  about 0.9 says the compressor is dropping signal (top-k without feedback, too few bits, a rank too
  low);
* ``cosine`` ⟨x, x̂⟩ / (‖x‖ ‖x̂‖), whether the direction survives;
* ``bits_per_element`` 8 · payload bytes / elements (header included);
* ``residual_norm`` ‖e‖ of the error-feedback residual after the step (None without feedback).

:func:`quality` computes them from two arrays, :func:`measure` from an array and a codec (one encode,
one decode). :class:`Telemetry` samples them every ``every`` steps per key (through the transports:
``gcodec.mpi.State(..., telemetry=t)`` and ``gcodec.torch.HookState(..., telemetry=t)``), keeps the
last record per key as a plain dict, hands every record to a callback and to :mod:`logging`, and
warns (:class:`LowNormRatioWarning`, and a ``logging`` warning) when a key's norm ratio stays below
``threshold`` for ``patience`` steps. Off (``telemetry=None``) or between samples it costs one
integer test per exchange.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .api import decode, encode
from .arrays import host_array
from .codecs import Codec, get_codec
from .codecs.state import CodecState
from .errors import ConfigError

__all__ = [
    "DEFAULT_THRESHOLD",
    "FIELDS",
    "LowNormRatioWarning",
    "Telemetry",
    "measure",
    "quality",
]

logger = logging.getLogger("gcodec.telemetry")

#: The figures of one record (besides ``key``, ``step``, ``numel``, ``norm``).
FIELDS = ("relative_error", "norm_ratio", "cosine", "bits_per_element", "residual_norm")

#: The source article's rule: a norm ratio below 0.9 for long means over-compression. docs/telemetry.md
#: has the measurement behind keeping it (every codec at its usual setting stays above it, top-k
#: without feedback and sign/2-bit without groups fall below it).
DEFAULT_THRESHOLD = 0.9

_CHUNK = 1 << 16  # float64 accumulation in cache-sized chunks: exact enough, no full-size float64 copy


class LowNormRatioWarning(UserWarning):
    """A key's norm ratio ‖x̂‖/‖x‖ stayed below the threshold for the configured number of steps."""


def _flat(a: Any) -> np.ndarray:
    arr = host_array(a)
    return arr.reshape(-1)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # einsum: no BLAS threads (which contend with the training's own threads and ranks)
    return float(np.einsum("i,i->", a, b))


def _sums(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(Σx², Σy², Σxy, Σ(x-y)²) in float64, chunk by chunk into two reused buffers."""
    xx = yy = xy = dd = 0.0
    ca = np.empty(min(_CHUNK, x.shape[0]), np.float64)
    cb = np.empty_like(ca)
    for i in range(0, x.shape[0], _CHUNK):
        m = min(_CHUNK, x.shape[0] - i)
        a, b = ca[:m], cb[:m]
        a[...] = x[i : i + m]
        b[...] = y[i : i + m]
        xx += _dot(a, a)
        yy += _dot(b, b)
        xy += _dot(a, b)
        a -= b
        dd += _dot(a, a)
    return xx, yy, xy, dd


def _norm(a: np.ndarray) -> float:
    return math.sqrt(_sums(a, a)[0])


def quality(x: Any, decoded: Any, *, payload_bytes: int | None = None, residual: Any = None) -> dict[str, Any]:
    """The quality figures of ``decoded`` as an approximation of ``x`` (any arrays of one size).

    Args:
        x: what the codec was handed.
        decoded: what came back.
        payload_bytes: the payload's size, for ``bits_per_element`` (None leaves it None).
        residual: the error-feedback residual after the step, for ``residual_norm``.

    Returns a plain dict: ``numel``, ``norm`` (‖x‖) and :data:`FIELDS`. Conventions at zero: for
    x = 0 the ratio and relative error are 1 and 0 when x̂ = 0 too, else infinite; the cosine of a
    zero vector with anything is 0, and 1 when both are zero.
    """
    a, b = _flat(x), _flat(decoded)
    if a.shape != b.shape:
        raise ConfigError(f"quality: x has {a.shape[0]} elements, decoded {b.shape[0]}")
    xx, yy, xy, dd = _sums(a, b)
    nx, ny, nd = math.sqrt(xx), math.sqrt(yy), math.sqrt(dd)
    if nx > 0:
        rel, ratio = nd / nx, ny / nx
    else:
        rel, ratio = (0.0, 1.0) if ny == 0 else (math.inf, math.inf)
    if nx > 0 and ny > 0:
        cos = max(-1.0, min(1.0, xy / (nx * ny)))
    else:
        cos = 1.0 if nx == ny == 0 else 0.0
    n = int(a.shape[0])
    return {
        "numel": n,
        "norm": nx,
        "relative_error": rel,
        "norm_ratio": ratio,
        "cosine": cos,
        "bits_per_element": None if payload_bytes is None or n == 0 else 8.0 * payload_bytes / n,
        "residual_norm": None if residual is None else _norm(_flat(residual)),
    }


def measure(
    x: Any,
    codec: Codec | str | dict[str, Any],
    *,
    residual: Any = None,
    key: str | None = None,
    step: int | None = None,
    state: CodecState | None = None,
) -> dict[str, Any]:
    """Encode ``x`` (plus ``residual``, as error feedback would) once, decode, and return :func:`quality`
    of the decoded tensor against ``x``.

    ``state`` is the codec state to draw streams and warm starts from; by default a fresh one, so
    measuring never advances the caller's streams. With ``residual``, ``residual_norm`` is the norm of
    the residual error feedback would keep after this step, ``(x + residual) - x̂``. Error feedback
    sends what earlier steps dropped, so its norm ratio stays near 1 where the codec alone loses
    signal (docs/telemetry.md has the measurement).
    """
    c = get_codec(codec)
    arr = host_array(x)
    work = arr
    if residual is not None:
        wd = np.float64 if arr.dtype == np.float64 else np.float32
        work = arr.astype(wd) + host_array(residual).reshape(arr.shape).astype(wd)
    buf = encode(work, c, key=key, step=step, state=state if state is not None else CodecState())
    dec = decode(buf)
    new_res = None
    if residual is not None:
        new_res = work.reshape(-1) - np.asarray(dec, dtype=work.dtype).reshape(-1)
    rec = quality(arr, dec, payload_bytes=len(memoryview(buf).cast("B")), residual=new_res)
    rec["codec"] = c.get_config()
    return rec


class Telemetry:
    """Sampled quality records per key, a callback, ``logging``, and the low-norm-ratio warning.

    Args:
        every: sample a key at steps 0, every, 2·every, ... (0 turns sampling off). Each sample costs
            one extra encode and decode of that tensor on this rank; 100 keeps it under 1 % for every
            codec (docs/telemetry.md has the measurement).
        threshold: the norm ratio below which a key counts as losing signal (default 0.9).
        patience: steps a key's sampled norm ratio must stay below ``threshold`` before the warning
            fires, from the first low sample to the latest, both included (with ``every=1``,
            consecutive steps; with ``every=100`` and ``patience=100``, two low samples in a row).
            Once per low stretch: a healthy sample re-arms it.
        callback: called with every record (a plain dict), e.g. to send it to a metrics system.
        log_level: the ``logging`` level of the records (logger ``gcodec.telemetry``); warnings are
            always logged at WARNING.
        warn: also raise a :class:`LowNormRatioWarning` through :mod:`warnings`.
    """

    def __init__(
        self,
        every: int = 100,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        patience: int = 100,
        callback: Callable[[dict[str, Any]], None] | None = None,
        log_level: int = logging.DEBUG,
        warn: bool = True,
    ) -> None:
        if not isinstance(every, int) or every < 0:
            raise ConfigError(f"telemetry every= must be an int >= 0, not {every!r}")
        if not (isinstance(threshold, (int, float)) and 0 <= threshold):
            raise ConfigError(f"telemetry threshold= must be a number >= 0, not {threshold!r}")
        if not isinstance(patience, int) or patience < 1:
            raise ConfigError(f"telemetry patience= must be an int >= 1, not {patience!r}")
        self.every, self.threshold, self.patience = every, float(threshold), patience
        self.callback, self.log_level, self.warn = callback, log_level, warn
        self._last: dict[str, dict[str, Any]] = {}
        self._low_since: dict[str, int] = {}
        self._warned: set[str] = set()
        self.warnings: list[dict[str, Any]] = []

    def due(self, step: int) -> bool:
        """Whether ``step`` is sampled."""
        return self.every > 0 and step % self.every == 0

    def observe(self, key: str, step: int, record: dict[str, Any]) -> dict[str, Any]:
        """Take one record (from :func:`quality` or :func:`measure`) of ``key`` at ``step``."""
        rec = {"key": key, "step": int(step), **record}
        self._last[key] = rec
        if logger.isEnabledFor(self.log_level):
            logger.log(
                self.log_level,
                "%s step %d: norm ratio %.4f, relative error %.4f, cosine %.4f, %s bits/element",
                key,
                step,
                rec["norm_ratio"],
                rec["relative_error"],
                rec["cosine"],
                "?" if rec.get("bits_per_element") is None else f"{rec['bits_per_element']:.3f}",
            )
        self._watch(key, step, rec)
        if self.callback is not None:
            self.callback(rec)
        return rec

    def _watch(self, key: str, step: int, rec: dict[str, Any]) -> None:
        if not rec["norm_ratio"] < self.threshold:
            self._low_since.pop(key, None)
            self._warned.discard(key)
            return
        since = self._low_since.setdefault(key, step)
        span = step - since + 1  # steps from the first low sample to this one, both included
        if span >= self.patience and key not in self._warned:
            self._warned.add(key)
            msg = (
                f"gcodec: the norm ratio of {key!r} has stayed below {self.threshold} for {span} steps "
                f"(now {rec['norm_ratio']:.3f} at step {step}): the codec drops too much of the gradient; "
                "enable error feedback or compress less"
            )
            rec["warning"] = msg
            self.warnings.append(dict(rec))
            logger.warning(msg)
            if self.warn:
                warnings.warn(msg, LowNormRatioWarning, stacklevel=3)

    def measure(self, key: str, step: int, x: Any, codec: Codec | str | dict[str, Any], **kw: Any) -> dict | None:
        """:func:`measure` and :meth:`observe` when ``step`` is sampled, else None (nothing computed)."""
        if not self.due(step):
            return None
        return self.observe(key, step, measure(x, codec, key=key, step=step, **kw))

    def records(self) -> dict[str, dict[str, Any]]:
        """The last record of each key (plain dicts, JSON-safe but for infinities)."""
        return {k: dict(v) for k, v in self._last.items()}

    def reset(self) -> None:
        self._last.clear()
        self._low_since.clear()
        self._warned.clear()
        self.warnings.clear()
