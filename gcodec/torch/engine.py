"""What every engine's state shares: the DDP hook's :class:`~gcodec.torch.HookState` and FSDP2's
:class:`~gcodec.torch.FSDPState` derive from :class:`EngineState`; DiLoCo uses its checks.

* the configuration (codec, policy, controller, size rules, error feedback, threads) and the one
  :class:`~gcodec.transports.Router` built from it, changed through :meth:`EngineState.configure`;
* statistics per key (:meth:`EngineState.stats`) and per step (:meth:`EngineState.step_report`);
* pickling: the configuration and :meth:`state_dict`, never a process group;
* the checks a loaded state passes: saved by this rank of a job of this world size
  (:func:`check_owner`), with this configuration (:func:`config_diff`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from ..codecs import Codec, get_codec
from ..deprecation import REMOVED_IN
from ..errors import ConfigError
from ..policy import DEFAULTS
from ..policy import Policy as CodecPolicy
from ..transports import Router, TransportState
from ..transports.router import split_controller
from ..transports.stats import StepReports

__all__ = ["EngineState", "check_owner", "config_diff", "rank_and_world"]

_POLICY_MARK = "gcodec.policy.Policy"  # how a pickled state tells a Policy from a pattern dict


def rank_and_world(group: Any = None) -> tuple[int | None, int | None]:
    """(this rank, the world size) of ``group`` (None: the default group), or (None, None) before
    the process group is up."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    return dist.get_rank(group), dist.get_world_size(group)


def config_diff(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> str:
    """The fields in which two configurations differ, each with both values ("" when none)."""
    diff = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
    return "; ".join(f"{k}: saved {saved.get(k)!r}, here {mine.get(k)!r}" for k in diff)


def check_owner(what: str, saved: tuple[Any, Any], here: tuple[Any, Any], hint: str) -> None:
    """Raise ConfigError when a state saved by rank ``saved[0]`` of ``saved[1]`` is loaded by
    another world size or rank (``here``); an unknown (None) side is not compared. Every rank's
    residuals are its own: loading one file everywhere would give every rank rank 0's, silently."""
    (sr, sw), (r, w) = saved, here
    if sw is not None and w is not None and int(sw) != w:
        raise ConfigError(f"this {what} was saved by a job of {int(sw)} ranks; this job has {w}: {hint}")
    if sr is not None and r is not None and int(sr) != r:
        raise ConfigError(f"this {what} was saved by rank {int(sr)} of {sw}; this is rank {r} of {w}: {hint}")


class _Setting:
    """``state.codec``, ``state.min_numel``, ``state.policy``: read as attributes; assigning one
    still reconfigures the router but is deprecated in favour of :meth:`EngineState.configure`,
    whose name says that it does."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj: Any, value: Any) -> None:
        warnings.warn(
            f"assigning {type(obj).__name__}.{self.name} is deprecated: call configure({self.name}=...), which "
            f"reconfigures the router (the assignment goes in gcodec {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        obj.configure(**{self.name: value})


class EngineState:
    """The configuration, router, statistics and pickling an engine's state shares (module docstring).

    Subclasses call :meth:`_setup` with the arguments every engine takes, and extend
    :meth:`_config` (the constructor's keyword arguments that pickling keeps) with their own."""

    codec = _Setting()
    min_numel = _Setting()
    policy = _Setting()

    def _setup(
        self,
        codec: Codec | str | dict[str, Any],
        *,
        policy: Any,
        controller: Any,
        start_iter: int,
        min_numel: int,
        error_feedback: bool,
        num_threads: int | None,
        mode: str = "auto",
        telemetry: Any = None,
    ) -> None:
        policy, controller = split_controller(policy, controller, stacklevel=4)
        self._policy = policy
        self._codec = get_codec(codec)
        self._min_numel = int(min_numel)
        self.start_iter = int(start_iter)
        self.error_feedback = bool(error_feedback)
        self.num_threads = num_threads
        self.telemetry = telemetry
        self.router = Router(
            policy,
            controller=controller,
            codec=self._codec,
            min_numel=self._min_numel,
            dense_1d=DEFAULTS.dense_1d,
            error_feedback=self.error_feedback,
            mode=mode,
            num_threads=num_threads,
            telemetry=telemetry,
        )
        self.mode = self.router.mode
        #: per-step totals over every bucket or module (:meth:`step_report`)
        self.reports = StepReports()
        self._agreed: dict[str, str] = {}  # exchange -> the plan it last agreed on

    def configure(self, *, codec: Any = None, min_numel: int | None = None, policy: Any = ...) -> None:
        """Change the default ``codec``, the ``min_numel`` size rule or the ``policy``: the router
        adapts its chooser from the next choice, which must be the same on every rank (the
        exchange that follows refuses a plan the ranks do not share)."""
        if codec is not None:
            self._codec = get_codec(codec)
            self.router.configure(codec=self._codec)
        if min_numel is not None:
            self._min_numel = int(min_numel)
            self.router.configure(min_numel=self._min_numel)
        if policy is not ...:
            self.router.policy = self._policy = policy

    @property
    def controller(self) -> Any:
        """The adaptive controller (None: the policy decides)."""
        return self.router.controller

    def state_for(self, codec: Codec) -> TransportState:
        """The transport state (residuals, statistics) of one codec of this engine."""
        return self.router.state_for(codec)

    # ---- statistics --------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, Any]]:
        """Per key (parameter group) and codec: bytes and seconds of the last step and totals."""
        out: dict[str, dict[str, Any]] = {}
        for st in self.router.states.values():
            for k, v in st.stats().items():
                out[k] = {**v, "codec": st.codec.get_config()}
        return out

    def step_report(self) -> dict[str, Any]:
        """What the engine did per step, every bucket or module together: the last finished step
        (``"last"``: raw, encoded, received and dense bytes, encode, communication, decode and
        overhead seconds that add up to ``held_s``, the time the engine held the gradients;
        ``step`` counts warm-up steps too), the number of steps and the totals
        (:class:`gcodec.transports.stats.StepReports`)."""
        return self.reports.as_dict()

    # ---- configuration and pickling ----------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        """The constructor's keyword arguments that pickling keeps (plain values)."""
        policy: Any = self.policy
        if isinstance(policy, CodecPolicy):
            policy = {_POLICY_MARK: policy.to_dict()}
        elif isinstance(policy, Mapping):
            policy = {k: (v if v is None else get_codec(v).get_config()) for k, v in policy.items()}
        return {
            "codec": self.codec.get_config(),
            "start_iter": self.start_iter,
            "min_numel": self.min_numel,
            "error_feedback": self.error_feedback,
            "policy": policy,
            "controller": self.controller,
            "num_threads": self.num_threads,
        }

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - every engine has its own
        raise NotImplementedError

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:  # pragma: no cover - every engine has its own
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        # Like torch's PowerSGDState: the configuration and the state, not the process group (nor
        # the live adapter, nor parameter identities, which name parameters of this process only).
        return {**self._config(), "state": self.state_dict()}

    def __setstate__(self, d: dict[str, Any]) -> None:
        kw = {k: v for k, v in d.items() if k != "state"}
        if isinstance(kw.get("policy"), Mapping) and _POLICY_MARK in kw["policy"]:
            kw["policy"] = CodecPolicy.from_dict(kw["policy"][_POLICY_MARK])
        self.__init__(**kw)  # type: ignore[misc]
        self.load_state_dict(d["state"])
