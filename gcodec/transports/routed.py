"""Per-key codec choice inside a transport: a policy or an adaptive controller picks each key's codec
(or dense) at each step, and the error-feedback residual follows the key when its codec changes.

:class:`PolicyState` keeps one :class:`TransportState` per codec it has used. When a key moves from
codec A to codec B, its worker residual (what A dropped and has not sent yet) moves into B's state,
in B's layout (whole, per two-phase chunk, or as PowerSGD's matrix residual); when the key goes
dense, the residual is added to the tensor and sent with it. Nothing the codec dropped is lost on a
switch. (Two-phase *server* residuals, a second-order correction, start again from zero.)

The chooser is any object with ``codec_for(key, shape, step) -> codec or None`` (a
:class:`gcodec.policy.Policy`), or with a protocol method ``select(comm, state, key, shape, step)``
that may run collectives before it returns (the adaptive controller agrees on figures with an
allreduce, so every rank switches at the same step). Either must decide the same on every rank.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..arrays import dtype_name
from ..codecs import Codec, get_codec
from ..errors import ConfigError
from .comm import Communicator, Protocol, Work
from .common import timed, work_dtype
from .control import Exchange
from .exchange import allreduce_protocol
from .handshake import fingerprint
from .state import MODES, TransportState, resolve_mode
from .stats import StepStats
from .two_phase import owner_bounds

__all__ = ["DENSE", "PolicyState"]

#: The name of the uncompressed path in statistics and switch records.
DENSE = "dense"


def _collective(work: Work) -> Protocol:
    yield work


class PolicyState:
    """Transport state for a per-key codec chooser (a :class:`gcodec.policy.Policy` or a controller).

    Args:
        chooser: decides each key's codec per step (module docstring).
        error_feedback, mode, num_threads, telemetry: as for :class:`TransportState`, applied to the
            state of every codec the chooser picks.
    """

    def __init__(
        self,
        chooser: Any,
        *,
        error_feedback: bool = True,
        mode: str = "auto",
        num_threads: int | None = None,
        telemetry: Any = None,
    ) -> None:
        if not (hasattr(chooser, "codec_for") or hasattr(chooser, "select")):
            raise TypeError(f"a chooser needs codec_for() or select(), not {type(chooser).__name__}")
        if mode not in MODES:
            raise ConfigError(f"mode {mode!r} is not one of {list(MODES)}")
        self.chooser = chooser
        self.error_feedback, self.mode = bool(error_feedback), mode
        self.num_threads, self.telemetry = num_threads, telemetry
        self.states: dict[str, TransportState] = {}
        self.current: dict[str, str] = {}  # key -> codec json, or DENSE
        self.steps: dict[str, int] = {}
        #: (key, step, from, to) for every codec change, from/to as codec configs or "dense".
        self.switches: list[tuple[str, int, Any, Any]] = []
        self._last: dict[str, dict[str, Any]] = {}
        self._codecs: dict[str, Codec] = {}
        self.agreed: dict[str, str] = {}  # the dense exchanges' agreements (codecs' are in their states)

    # ---- states ------------------------------------------------------------------------------
    def codec(self, choice: Any) -> Codec | None:
        if choice is None:
            return None
        c = choice if isinstance(choice, Codec) else None
        k = json.dumps(c.get_config() if c is not None else get_codec(choice).get_config(), sort_keys=True)
        got = self._codecs.get(k)
        if got is None:
            got = self._codecs[k] = c if c is not None else get_codec(choice)
        return got

    def state_for(self, codec: Codec) -> TransportState:
        k = json.dumps(codec.get_config(), sort_keys=True)
        st = self.states.get(k)
        if st is None:
            st = self.states[k] = TransportState(
                codec,
                error_feedback=self.error_feedback,
                mode=self.mode,
                num_threads=self.num_threads,
                telemetry=self.telemetry,
            )
        return st

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per key: the last step's record (bytes, seconds, mode, ``codec``: config or "dense", and
        ``quality`` when telemetry sampled it)."""
        return {k: dict(v) for k, v in self._last.items()}

    def last(self, key: str) -> dict[str, Any] | None:
        """``key``'s last record (as in :meth:`stats`, not copied), or None before its first step."""
        return self._last.get(key)

    def residual_norm(self, key: str) -> float:
        """The norm of ``key``'s pending worker residual under its current codec (0 when none)."""
        ck = self.current.get(key)
        if ck is None or ck == DENSE:
            return 0.0
        res = self._peek_residual(self.states[ck], key)
        return 0.0 if res is None else float(np.linalg.norm(res.astype(np.float64)))

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every codec's transport state (residuals, warm starts, steps), each key's current codec and
        step, and the chooser's own state when it has one (plain arrays, ints, strings, dicts)."""
        chooser_sd = getattr(self.chooser, "state_dict", None)
        return {
            "states": {k: ts.state_dict() for k, ts in self.states.items()},
            "current": dict(self.current),
            "steps": dict(self.steps),
            "chooser": chooser_sd() if callable(chooser_sd) else None,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (the chooser must be configured as it was)."""
        for k, part in sd["states"].items():
            self.state_for(self.codec(json.loads(k))).load_state_dict(part)  # type: ignore[arg-type]
        self.agreed.clear()  # agree again after a restore: the peers may have changed
        self.current = {str(k): str(v) for k, v in sd["current"].items()}
        self.steps = {str(k): int(v) for k, v in sd["steps"].items()}
        loader = getattr(self.chooser, "load_state_dict", None)
        if sd.get("chooser") is not None and callable(loader):
            loader(sd["chooser"])

    # ---- residual carry-over -----------------------------------------------------------------
    @staticmethod
    def _chunk_keys(ts: TransportState, key: str) -> list[str]:
        if ts.worker is None:
            return []
        ks = [k for k in ts.worker.keys() if k.startswith(key + "[")]
        ks.sort(key=lambda k: int(k[len(key) + 1 :].split("/")[0]))
        return ks

    def _peek_residual(self, ts: TransportState, key: str) -> np.ndarray | None:
        if key in ts.lowrank_residuals:
            return ts.lowrank_residuals[key].reshape(-1)
        if ts.worker is None:
            return None
        e = ts.worker.residual(key)
        if e is not None:
            return e.reshape(-1)
        chunks = self._chunk_keys(ts, key)
        return np.concatenate([ts.worker.residual(k).reshape(-1) for k in chunks]) if chunks else None  # type: ignore[union-attr]

    def _take_residual(self, ts: TransportState, key: str) -> np.ndarray | None:
        res = self._peek_residual(ts, key)
        ts.lowrank_residuals.pop(key, None)
        if ts.worker is not None:
            for k in [key, *self._chunk_keys(ts, key)]:
                ts.worker.reset(k)
        return res

    @staticmethod
    def _put_residual(ts: TransportState, key: str, res: np.ndarray, shape: tuple[int, ...], size: int) -> None:
        mode = resolve_mode(ts.codec, ts.mode, size)
        if mode == "powersgd":
            ts.lowrank_residuals[key] = res.reshape(shape).astype(np.float32)
            return
        if ts.worker is None:
            return
        sd = ts.worker.state_dict()
        if mode == "two_phase":
            b = owner_bounds(res.shape[0], size)
            for j in range(size):
                sd["residuals"][f"{key}[{j}/{size}]"] = res[b[j] : b[j + 1]].copy()
        else:  # worker residuals keep the tensor's shape
            sd["residuals"][key] = res.reshape(shape).copy()
        ts.worker.load_state_dict(sd)

    # ---- the exchange ------------------------------------------------------------------------
    def protocol(self, comm: Communicator, x: np.ndarray, out: np.ndarray, key: str, op: str) -> Protocol:
        """Choose ``key``'s codec for this step, carry its residual over on a change, exchange."""
        step = self.steps.get(key, 0)
        self.steps[key] = step + 1
        select = getattr(self.chooser, "select", None)
        if select is not None:
            choice = yield from select(comm, self, key, tuple(x.shape), step)
        else:
            choice = self.chooser.codec_for(key, tuple(x.shape), step)
        codec = self.codec(choice)
        new = DENSE if codec is None else json.dumps(codec.get_config(), sort_keys=True)
        old = self.current.get(key)
        carried: np.ndarray | None = None
        if old is not None and old != new:
            if old != DENSE:
                carried = self._take_residual(self.states[old], key)
            self.switches.append(
                (key, step, DENSE if old == DENSE else json.loads(old), DENSE if codec is None else codec.get_config())
            )
        self.current[key] = new
        if codec is None:
            yield from self._dense(comm, x, out, key, op, step, carried)
            return out
        ts = self.state_for(codec)
        if carried is not None and carried.size == x.size and ts.error_feedback:
            self._put_residual(ts, key, carried, tuple(x.shape), comm.size)
        elif carried is not None:  # no feedback in the new codec: send what is pending with this step
            x = (x.reshape(-1).astype(work_dtype(x.dtype)) + carried).astype(x.dtype).reshape(x.shape)
        yield from allreduce_protocol(comm, ts, x, out, key, op, self.mode)
        rec = dict(ts._stats._last[key])
        rec["codec"] = codec.get_config()
        q = ts.telemetry.records().get(key) if ts.telemetry is not None else None
        if q is not None and q["step"] == ts.steps[key] - 1:
            rec["quality"] = q
        self._last[key] = rec
        return out

    def _dense(
        self, comm: Communicator, x: np.ndarray, out: np.ndarray, key: str, op: str, step: int, carried: Any
    ) -> Protocol:
        p = comm.size
        fp = fingerprint(key=key, codec=DENSE, shape=list(x.shape), dtype=dtype_name(x.dtype), op=op, size=p)
        ex = Exchange(comm, fp, self.agreed, key, f"dense allreduce of {key!r}")
        yield from ex.begin()  # the sum's size follows from the configuration: agree on it first
        buf = x.reshape(-1).astype(work_dtype(x.dtype))
        if carried is not None and carried.size == buf.size:
            buf += carried.astype(buf.dtype)
        st = StepStats(key, step, DENSE, x.nbytes)
        st.add("payload_bytes", buf.nbytes)
        st.add("wire_bytes", 2 * (p - 1) * buf.nbytes // p)
        yield from timed(st, _collective(comm.allreduce(buf, "sum")))
        if op == "mean":
            buf *= buf.dtype.type(1.0 / p)
        out.reshape(-1)[...] = buf
        self._last[key] = {"step": step, "mode": DENSE, **st.values, "codec": DENSE}
