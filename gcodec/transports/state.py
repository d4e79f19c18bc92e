"""Per-job transport state: error-feedback residuals, step counters, agreed keys, statistics.

The state is owned by the caller (as torch keeps ``PowerSGDState`` apart from its hook) and is the
only mutable thing a transport touches. :meth:`TransportState.state_dict` holds plain arrays, ints,
strings, lists and dicts, so it can be saved with ``numpy``/``pickle`` (and, converted to tensors by
``gcodec.torch``, loaded by ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..codecs import Aggregation, Codec, get_codec
from ..codecs.state import CodecState
from ..deprecation import REMOVED_IN, RENAMED_MODES
from ..errors import ConfigError
from ..feedback import ErrorFeedback
from ..telemetry import Telemetry
from .sendbuf import SendBuffers
from .stats import KeyRounds, Stats
from .threads import job_threads

__all__ = ["MODES", "OWNER_ALIGN", "TransportState", "check_mode", "resolve_mode", "shares_flat_group"]

#: Accepted ``mode=`` values: the protocols (docs/transports.md), named for what they exchange, never
#: for a codec: ``lowrank`` sums the factors of any codec that declares ``low_rank``.
MODES = ("auto", "summable", "gather", "two_phase", "lowrank")


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES` (an old name: its new one, with a DeprecationWarning);
    else ConfigError."""
    new = RENAMED_MODES.get(mode) if isinstance(mode, str) else None
    if new is not None:
        warnings.warn(
            f"mode {mode!r} is renamed {new!r}; {mode!r} goes in gcodec {REMOVED_IN}", DeprecationWarning, stacklevel=3
        )
        return new
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {list(MODES)}")
    return mode


#: Two-phase owners' chunks start at multiples of this many elements of the flat group
#: (:func:`gcodec.transports.two_phase.owner_bounds`).
OWNER_ALIGN = 256


def shares_flat_group(codec: Codec, numel: int, mode: str) -> bool:
    """Whether an engine may join a tensor of ``numel`` elements with other tensors of ``codec``
    into one flat group (one encode, one exchange) under the resolved ``mode``, with every
    element's encoding the one the tensor would have on its own: the codec works element by
    element, or in groups of g (:attr:`Codec.encoding_unit`) and the tensor has a multiple of g
    elements, so that no group straddles two tensors (two-phase owners re-encode chunks cut at
    multiples of :data:`OWNER_ALIGN`: g must divide it too). Every other tensor is encoded on its
    own, under a key of its own, whatever shares its bucket; so are tensors of a codec that reads
    shapes. Then a tensor's encoding, and its random stream, never depend on how the engine
    happened to group the tensors (docs/transports.md, "Checkpoints")."""
    unit = codec.encoding_unit
    if codec.reads_shape or unit is None:
        return False
    if unit == 1:
        return True
    return numel % unit == 0 and (mode != "two_phase" or OWNER_ALIGN % unit == 0)


#: ``mode="auto"`` gathers payloads up to this many ranks and uses two-phase above: an all-gather
#: sends (p-1) payloads per rank against 2 (p-1)/p for two-phase, equal at p = 2 where gathering
#: saves the second encode and decode.
GATHER_MAX_RANKS = 2


def resolve_mode(codec: Codec, mode: str, size: int) -> str:
    """The protocol a codec runs under ``mode`` on ``size`` ranks (ConfigError when it cannot)."""
    mode = check_mode(mode)
    lowrank = codec.low_rank
    if mode == "auto":
        if lowrank:
            return "lowrank"
        if codec.aggregation is Aggregation.SUMMABLE:
            return "summable"
        # two-phase owners work on flat chunks: a codec that reads shapes keeps them under gather
        return "gather" if size <= GATHER_MAX_RANKS or codec.reads_shape else "two_phase"
    if mode == "summable" and codec.aggregation is not Aggregation.SUMMABLE:
        raise ConfigError(f"codec {codec.codec_id!r} is not summable; use mode 'gather' or 'two_phase'")
    if mode == "lowrank" and not lowrank:
        raise ConfigError(f"mode 'lowrank' needs a codec that declares low_rank (powersgd), not {codec.codec_id!r}")
    if mode == "two_phase" and lowrank:
        raise ConfigError(
            f"{codec.codec_id} cannot run two-phase (its chunks are not matrices); use 'lowrank' or 'gather'"
        )
    if mode == "two_phase" and codec.reads_shape:
        raise ConfigError(
            f"codec {codec.get_config()} reads the tensor's shape and cannot run two-phase (its chunks are flat); "
            "use 'gather'"
        )
    return mode


class TransportState:
    """Everything a transport remembers between steps, for one codec.

    Args:
        codec: the codec (or its id / config dict).
        error_feedback: keep worker residuals (and, in two-phase mode, the chunk owners' *server*
            residuals) so that what compression dropped is sent at the next step. Needed for biased
            codecs (top-k, sign, PowerSGD); harmless but useless for fp16/bf16.
        mode: ``"auto"`` (by the codec's aggregation kind), ``"summable"``, ``"gather"``,
            ``"two_phase"`` or ``"lowrank"`` (see docs/transports.md for the table).
        num_threads: kernel threads per rank; None follows the job (see
            :mod:`gcodec.transports.threads`).
        worker: an existing :class:`~gcodec.ErrorFeedback` to hold the worker residuals (for
            ``gcodec.mpi.allreduce(..., state=gcodec.ErrorFeedback(codec))``).
        decay: error feedback's residual decay (``gcodec.ErrorFeedback(decay=)``: the residual is
            multiplied by it before it is added; SparseLoCo's 0.95); default 1, or ``worker``'s.
            Part of every exchange's agreed configuration.
        telemetry: a :class:`gcodec.telemetry.Telemetry` sampling each key's quality (norm ratio,
            relative error, ...) every ``telemetry.every`` steps; its last record per key appears
            as ``"quality"`` in :meth:`stats`. None (the default) costs nothing.
    """

    def __init__(
        self,
        codec: Codec | str | dict[str, Any],
        *,
        error_feedback: bool = True,
        mode: str = "auto",
        num_threads: int | None = None,
        worker: ErrorFeedback | None = None,
        telemetry: Telemetry | None = None,
        decay: float | None = None,
    ) -> None:
        self.codec = get_codec(codec)
        self.mode = check_mode(mode)
        self.error_feedback = bool(error_feedback or worker is not None)
        if worker is not None and worker.codec != self.codec:
            raise ConfigError(f"ef's codec {worker.codec!r} differs from the transport's {self.codec!r}")
        if decay is None:
            decay = worker.decay if worker is not None else 1.0
        elif worker is not None and worker.decay != decay:
            raise ConfigError(f"ef's decay {worker.decay} differs from the transport's {decay}")
        #: Error feedback's residual decay (``ErrorFeedback(decay=)``), worker and server alike.
        self.decay = float(decay)
        self.worker: ErrorFeedback | None = worker or (
            ErrorFeedback(self.codec, decay=self.decay) if error_feedback else None
        )
        self.server: ErrorFeedback | None = ErrorFeedback(self.codec, decay=self.decay) if self.error_feedback else None
        self.lowrank_residuals: dict[str, np.ndarray] = {}
        #: The codec's own per-key state: PowerSGD's warm-start Qs and stream counters.
        self.codec_state = CodecState()
        self.steps: dict[str, int] = {}
        self.agreed: dict[str, str] = {}
        self.num_threads = num_threads
        self.threads: int | None = num_threads
        self.send_buffers = SendBuffers()
        self._stats = Stats()
        #: per-round totals of this state's calls, every key together (:meth:`step_report`)
        self.reports = KeyRounds()
        self._scratch: dict[str, np.ndarray] = {}
        self.telemetry = telemetry

    # ---- bookkeeping the protocols use -------------------------------------------------------
    def scratch(self, key: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A work array kept per key across steps (a fresh one would page-fault on every step)."""
        a = self._scratch.get(key)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self._scratch[key] = np.empty(shape, dtype)
        return a

    def next_step(self, key: str) -> int:
        step = self.steps.get(key, 0)
        self.steps[key] = step + 1
        return step

    def agreed_on(self, key: str, local_ranks: int) -> None:
        """After a handshake: the kernel thread count follows the ranks sharing this machine."""
        if self.threads is None or self.num_threads is None:
            self.threads = job_threads(local_ranks, self.num_threads)

    def record(self, step_stats: Any) -> None:
        self._stats.record(step_stats)

    # ---- public ------------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per key: the last step's raw/payload/wire bytes and encode/comm/decode seconds, plus totals
        (and ``"quality"``, the last telemetry record of the key, when telemetry sampled it)."""
        out = self._stats.as_dict()
        if self.telemetry is not None:
            for k, rec in self.telemetry.records().items():
                if k in out:
                    out[k]["quality"] = rec
        return out

    def step_report(self) -> dict[str, Any]:
        """What the allreduces under this state did per step, every key together: the last
        finished round (raw, encoded and received bytes; encode, communication, decode and
        overhead seconds that add up to ``held_s``, the time from each call's protocol start to
        its end), the number of rounds and the totals, in the shape every engine's report has
        (:class:`gcodec.transports.stats.KeyRounds`: a round ends when a key comes back, or at
        :meth:`end_step`)."""
        return self.reports.as_dict()

    def end_step(self) -> None:
        """Close the round in progress (:meth:`step_report`), as the next call of a key would."""
        self.reports.end_step()

    def reset_stats(self) -> None:
        """Forget the per-key statistics and the step report."""
        self._stats.reset()
        self.reports.reset()

    def state_dict(self) -> dict[str, Any]:
        """Residuals, warm-start factors and step counters (plain arrays, ints, strings, dicts)."""
        sd: dict[str, Any] = {
            "codec": self.codec.get_config(),
            "mode": self.mode,
            "error_feedback": self.error_feedback,
            "steps": dict(self.steps),
            "worker": None if self.worker is None else self.worker.state_dict(),
            "server": None if self.server is None else self.server.state_dict(),
            "lowrank_residuals": {k: v.copy() for k, v in self.lowrank_residuals.items()},
        }
        sd["codec_state"] = self.codec_state.state_dict()
        return sd

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (the codec config must match)."""
        if get_codec(sd["codec"]) != self.codec:
            raise ConfigError(f"state was saved with codec {sd['codec']}, not {self.codec.get_config()}")
        self.steps = {str(k): int(v) for k, v in sd["steps"].items()}
        for name in ("worker", "server"):
            part = sd.get(name)
            ef = getattr(self, name)
            if part is not None:
                if ef is None:
                    ef = ErrorFeedback(self.codec)
                    setattr(self, name, ef)
                ef.load_state_dict(part)
        self.lowrank_residuals = {str(k): np.array(v, copy=True) for k, v in sd.get("lowrank_residuals", {}).items()}
        cs = CodecState()
        if sd.get("codec_state") is not None:
            cs.load_state_dict(sd["codec_state"])
        self.codec_state = cs
        self.agreed.clear()  # agree again after a restore: the peers may have changed
