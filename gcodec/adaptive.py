"""Adaptive compression: pick, per tensor and every few steps, the rung of a codec ladder that
minimises the predicted step time, while the quality telemetry stays within bounds.

>>> ctl = AdaptiveController(bandwidth="1Gbit", interval=20)            # doctest: +SKIP
>>> state = gcodec.mpi.Router(controller=ctl, error_feedback=True, telemetry=Telemetry(every=10))
>>> mean = gcodec.mpi.allreduce(comm, grad, None, key="layer1", state=state)  # doctest: +SKIP

The ladder runs from light to strong: none (fp32 allreduce) → fp16 → uniform 8 → uniform 4 →
top-k 1 % → PowerSGD rank 2 (with the state's error feedback). PowerSGD compresses matrices only: it
is priced on the key's tensor shapes when the engine gives them (the DDP hook gives a bucket's), its
vectors travelling dense beside it, and never picked for a key that has no matrix to compress.
At each decision step of a key (its first step, by default: the cost model picks the rung to
start on, compressed where it pays, and the rung is on trial for ``trial_steps`` steps, which time
it; then every ``interval`` steps; with ``warmup_steps``, the first decision waits that many steps
on ``start``, or with ``warmup_rungs`` is taken among the light rungs only until then) the
controller

1. updates, per rung, what it measured through the transport statistics (encode, decode seconds,
   payload bytes; seconds as the median of the last 5 samples, bytes as a moving average) and
   prices the rungs it has not run yet from a prior (:data:`PRIOR_SPEEDS`, the protocol's seconds
   per element measured once on a reference machine; no timing run in the job: the calibration
   is the job's own first compressed steps) scaled by how much slower than the prior the rungs
   it has run were in the job (:meth:`AdaptiveController.load_factor`); a rung without a prior
   (a ladder of one's own) is timed once on this machine, at its first decision
   (:func:`gcodec.advise.measure_protocol_speed`), and ``calibration="setup"`` times every rung
   when a router takes the controller, as earlier releases did;
2. takes the link as given (``bandwidth=``, or ``link=``: what ``gcodec advise --probe`` measured),
   or probes it once with a few dense allreduces, or measures it as received bytes over
   communication seconds;
3. marks a rung *out of bounds* when its sampled telemetry broke the bound: a moving average of the
   norm ratio under ``min_norm_ratio`` (the article's 0.9), or, with error feedback, a residual norm
   above ``max_residual_ratio`` times the gradient's norm (a backlog that keeps growing). Stronger
   rungs than one out of bounds are out too;
4. allreduces these figures (element-wise maximum: the slowest rank and the worst quality count;
   for the link, the rank that waited least for its peers),
   so every rank holds the same numbers and takes the same decision at the same step, then picks
   the rung with the least predicted step time (:func:`gcodec.advise.predict`), switching only for
   a gain of more than ``hysteresis``. A rung that has run is priced with what the model left out
   of it: its measured exchange seconds (the median of its last 5 steps, the slowest rank's) less
   the model's price on the link believed then, when positive, added to today's price. So a rung
   that ran slower than dense goes back to dense at the next decision and is not taken again for
   that link, and a change of link moves the prices as the model says.

The :class:`~gcodec.transports.Router` carries the residual over when a key changes rung, so
what one codec dropped is sent by the next (or flushed with the dense allreduce).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .advise import CodecSpeed, Link, LinkFit, fit_link, measure_protocol_speed, parse_bandwidth, predict
from .codecs import get_codec
from .errors import ConfigError
from .transports import DENSE, Communicator, Protocol, Router
from .transports.control import Exchange
from .transports.handshake import fingerprint

__all__ = ["DEFAULT_LADDER", "AdaptiveController"]

#: none → fp16 → uniform 8 → uniform 4 → top-k 1 % → PowerSGD rank 2 (error feedback from the state).
#: PowerSGD is the strongest: its two rank-2 factors of an m x n matrix are 8 (m + n) bytes, less
#: than top-k 1 %'s 0.08 m n once m n / (m + n) > 100 (any matrix of more than about 200 x 200).
DEFAULT_LADDER: tuple[dict[str, Any] | None, ...] = (
    None,
    {"id": "fp16"},
    {"id": "uniform", "bits": 8},
    {"id": "uniform", "bits": 4},
    {"id": "topk", "ratio": 0.01},
    {"id": "powersgd", "rank": 2},
)

#: elements of the dense allreduces the controller's link probe times (16 KB to 4 MB per rank)
PROBE_SIZES = (1 << 12, 1 << 16, 1 << 20)
#: the probe takes the next size (16 times the bytes) only when its four allreduces, priced at 16
#: times the last size's median, would take less than this (seconds). At 100 Mbit/s on the link
#: benchmark's loopback a 4 MB allreduce takes 0.7 s: the probe stops at 256 KB and costs about
#: 0.2 s, where taking every size cost 3.2 s (bench/controller_cost.py)
PROBE_MAX_S = 0.1
#: ... unless the last size took less than this many times the smallest one: its time is still the
#: latency, not the bytes (see :meth:`AdaptiveController._probe_link`)
PROBE_GROWTH = 4.0


#: What a rung of the default ladder is taken to cost before the job has run it: the transports'
#: protocol with error feedback (encode with the residual's passes, decode of 2 ranks' payloads),
#: seconds per element and payload bytes per element, as
#: ``gcodec.advise.measure_protocol_speed(codec, 2, error_feedback=True)`` measured them at 64 Ki
#: and 4 Mi elements on the 2-core development machine (2026-12-07, rounded; the payloads are the
#: codecs' own: 2, 1 + 4/64, 0.5 + 4/64 bytes per element, top-k 1 % about 5.2 bytes a kept
#: value with its delta-coded index). A prior, not a measurement of this machine: once a rung of
#: a key has run, :meth:`AdaptiveController.load_factor` scales every unrun rung by how much
#: slower than this the job ran it, and a rung's own figures replace its prior. PowerSGD's payload
#: follows the shapes (the model sizes its factors); its seconds are priced per element.
PRIOR_SPEEDS: dict[str, CodecSpeed] = {
    json.dumps(get_codec(c).get_config(), sort_keys=True): CodecSpeed(*v)
    for c, v in (  # encode s + s/element, decode s + s/element, payload bytes + bytes/element
        ({"id": "fp16"}, (0.5e-3, 2.0e-9, 0.0, 0.5e-9, 128.0, 2.0)),
        ({"id": "uniform", "bits": 8}, (0.5e-3, 3.5e-9, 0.5e-3, 3.5e-9, 212.0, 1.0625)),
        ({"id": "uniform", "bits": 4}, (0.5e-3, 3.5e-9, 0.5e-3, 4.0e-9, 212.0, 0.5625)),
        ({"id": "topk", "ratio": 0.01}, (1.0e-3, 1.5e-9, 1.0e-3, 0.8e-9, 232.0, 0.052)),
        ({"id": "powersgd", "rank": 2}, (0.0, 3.5e-9, 0.0, 1.2e-9, 0.0, 0.0)),
    )
}

_EMA = 0.3  # weight of the newest measurement (payload bytes, telemetry)
_WINDOW = 5  # seconds are the median of this many latest samples


def _median_window(m: dict[str, Any], field: str, value: float) -> float:
    """Append ``value`` to ``m``'s window of ``field`` (kept in ``m[field + "_last"]``) and return the
    window's median."""
    last = [*(float(v) for v in m.get(field + "_last", [])[-(_WINDOW - 1) :]), value]
    m[field + "_last"] = last
    return float(np.median(last))


def _given_link(link: Any) -> LinkFit:
    """A link given to the controller (``link=``) as the :class:`LinkFit` a probe would have set."""
    if isinstance(link, LinkFit):
        return link
    if isinstance(link, Link):
        return LinkFit(link, 0, (), 0.0, "given")
    if isinstance(link, Mapping):
        try:
            bw, lat = float(link["bandwidth_bps"]), float(link.get("latency_s", 50e-6))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"link={dict(link)!r}: needs bandwidth_bps (and latency_s), as advise writes it") from e
        if not (math.isfinite(bw) and bw > 0 and math.isfinite(lat) and lat >= 0):
            raise ConfigError(f"link={dict(link)!r}: bandwidth_bps must be positive and latency_s not negative")
        return LinkFit(Link(bw, lat), int(link.get("workers", 0) or 0), (), 0.0, str(link.get("transport", "given")))
    raise ConfigError(f"link must be a mapping (gcodec advise's link), a Link or a LinkFit, not {type(link).__name__}")


class AdaptiveController:
    """Chooses each key's rung of ``ladder`` (module docstring); pass it to ``Router``.

    Args:
        ladder: codec configs from light to strong; None is the dense fp32 allreduce.
        bandwidth: the link, e.g. ``"1Gbit"`` or bits/s; None measures it from the transfers.
        latency_s: alpha of the cost model, seconds per message.
        interval: steps between decisions of a key (each costs one small allreduce).
        warmup_steps: steps on ``start`` before the first decision (or, with ``warmup_rungs``,
            steps restricted to the light rungs). 0 (the default): a key's first step is a
            decision among every rung, so a job starts compressed where the cost model says it
            pays, with error feedback from its first step (docs/convergence.md has the evidence
            that no dense warm-up is needed).
        start: the rung keys start on (index into ``ladder``).
        warmup_rungs: warm-up as a decision: the controller decides at a key's first step too, among
            the first ``warmup_rungs`` rungs of the ladder only (the default ladder's 3: none, fp16,
            uniform 8), keeps that rung through ``warmup_steps`` (early gradients are large and change
            fast; a biased or low-rank rung from the first step can cost the run its accuracy), then
            decides among all rungs. So a fast link warms up dense and a slow one through the
            cheapest light codec. None: ``start`` through warm-up, as without it.
        trial_steps: a rung the job has not run yet for a key is taken on trial: the key decides
            again after this many steps instead of ``interval``, from what the rung measured (its
            first step, which loads kernels and moves residuals, does not count). The calibration
            prices an unrun rung on an idle rank; in a job that shares its cores with the backward
            pass and the peers its codec seconds run several times that (docs/telemetry.md has the
            figures), and a wrong guess costs ``trial_steps`` steps instead of ``interval``. Once
            per key and rung; None: no trials.
        prior_load: how much slower than its calibration a codec is taken to run in the job until
            a rung of the key has run and measured it (:meth:`load_factor`). Where the ranks'
            threads and the backward pass share the cores, a codec's protocol runs about twice its
            calibration (docs/telemetry.md, "Unrun rungs pay a prior load").
        min_norm_ratio: the telemetry bound without error feedback (default 0.9).
        max_residual_ratio: the bound with error feedback: residual norm / gradient norm.
        hysteresis: switch only when the predicted step time falls by more than this fraction.
        speeds: calibrated :class:`gcodec.advise.CodecSpeed` per codec config (JSON, sorted keys),
            to skip the calibration (and for tests).
        probe: without ``bandwidth``, measure the link once, at the first decision, with dense
            float32 allreduces of :data:`PROBE_SIZES` elements (the slowest rank's median of three
            per size, alpha and beta fitted as ``gcodec advise --probe`` does), instead of
            trusting the exchanges' own communication seconds alone: on a fast link those are
            mostly a rank waiting for its peers (measured on the 2-core loopback: fp16's
            all-gather priced the link 2-3x slower than a dense allreduce runs). After two sizes
            it takes a larger one only when that one's four allreduces would take under
            :data:`PROBE_MAX_S` (priced by the last size's time), or the last size's time is not
            yet :data:`PROBE_GROWTH` times the smallest one's (latency, not bytes), so a slow
            link pays about 0.2 s.
            False, or a probe whose times do not grow with the size: the exchanges' seconds.
        link: the link as already measured, instead of probing it again: what ``gcodec advise
            --probe`` found (the ``link`` object of its ``--json`` output, a mapping with
            ``bandwidth_bps`` and ``latency_s``), or a :class:`gcodec.advise.Link` or
            :class:`~gcodec.advise.LinkFit`. Priced as a probed link (the job's measured excess
            over the model counts), unlike a declared ``bandwidth``.
        calibration: where the codec seconds of rungs not run yet come from. ``"steps"`` (the
            default): :data:`PRIOR_SPEEDS`, scaled by the job's own first compressed steps
            (:meth:`load_factor`); a rung with no prior is timed on this machine at its first
            decision. ``"setup"``: every rung timed through the protocol when a router takes the
            controller (:meth:`calibrate`; about 1.3 s on the 2-core machine, and 2.8 s of the
            link benchmark's set-up).
    """

    def __init__(
        self,
        ladder: Sequence[Mapping[str, Any] | str | None] = DEFAULT_LADDER,
        *,
        bandwidth: str | float | None = None,
        latency_s: float = 50e-6,
        interval: int = 20,
        warmup_steps: int = 0,
        start: int = 0,
        min_norm_ratio: float = 0.9,
        max_residual_ratio: float = 20.0,
        hysteresis: float = 0.1,
        speeds: Mapping[str, CodecSpeed] | None = None,
        probe: bool = True,
        warmup_rungs: int | None = None,
        trial_steps: int | None = 3,
        prior_load: float = 2.0,
        link: Any = None,
        calibration: str = "steps",
    ) -> None:
        if not ladder:
            raise ConfigError("the ladder needs at least one rung")
        self.ladder = [None if c is None else get_codec(c).get_config() for c in ladder]  # type: ignore[arg-type]
        self._keys = [json.dumps(c, sort_keys=True) for c in self.ladder]
        self._codecs = [None if c is None else get_codec(c) for c in self.ladder]
        self._low_rank = [c is not None and c.low_rank for c in self._codecs]
        if not 0 <= start < len(self.ladder):
            raise ConfigError(f"start={start} is not a rung of a {len(self.ladder)}-rung ladder")
        if interval < 1 or warmup_steps < 0:
            raise ConfigError("interval must be >= 1 and warmup_steps >= 0")
        if warmup_rungs is not None and not 1 <= warmup_rungs <= len(self.ladder):
            raise ConfigError(f"warmup_rungs={warmup_rungs} is not 1 to the {len(self.ladder)} rungs of the ladder")
        self.warmup_rungs = warmup_rungs
        if trial_steps is not None and trial_steps < 2:
            raise ConfigError(f"trial_steps={trial_steps}: a trial needs 2 steps or more (its first is not counted)")
        self.trial_steps = trial_steps
        if not (math.isfinite(prior_load) and prior_load > 0):
            raise ConfigError(f"prior_load={prior_load} must be a positive number")
        self.prior_load = float(prior_load)
        if calibration not in ("steps", "setup"):
            raise ConfigError(f"calibration={calibration!r}: use 'steps' or 'setup'")
        self.calibration = calibration
        self.bandwidth_bps = None if bandwidth is None else parse_bandwidth(bandwidth)
        self.latency_s, self.interval, self.warmup_steps, self.start = latency_s, interval, warmup_steps, start
        self.min_norm_ratio, self.max_residual_ratio, self.hysteresis = min_norm_ratio, max_residual_ratio, hysteresis
        self._speeds: dict[str, CodecSpeed] = dict(speeds or {})
        self._cal_ef, self._cal_mode = False, "auto"  # what calibrate() was told (the engine's)
        self.level: dict[str, int] = {}
        #: per key and rung: {"encode_s", "decode_s", "payload_bytes", "bad"} measured
        self.measured: dict[str, list[dict[str, float]]] = {}
        self._seen: dict[str, tuple[Any, int]] = {}
        self._on: dict[str, int] = {}  # key -> the rung of its last record (a first step on a rung is not timed)
        #: key -> its next decision step (the same on every rank: it follows the agreed decisions)
        self.next_decision: dict[str, int] = {}
        self._tried: set[tuple[str, int]] = set()  # (key, rung) taken on trial once
        self._spb: float | None = None  # measured seconds per received byte
        self._spb_last: list[float] = []
        self.probe = bool(probe)
        #: the link the probe measured (:class:`gcodec.advise.LinkFit`), None before or without one
        self.probed: Any = None
        self._probe_done = False
        if link is not None:
            self.probed = _given_link(link)
            self.latency_s = self.probed.link.latency_s
            self._probe_done = True
        #: every decision: key, step, from and to rung, predicted seconds per rung (inf: out of bounds)
        self.decisions: list[dict[str, Any]] = []

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Each key's rung and measured figures, the measured link and the calibrated speeds (saved
        with ``Router.state_dict()``; a restored job keeps its rungs instead of starting over)."""
        return {
            "level": dict(self.level),
            "measured": {k: [dict(m) for m in v] for k, v in self.measured.items()},
            "spb": self._spb,
            "probed": None if self.probed is None else [self.probed.link.bandwidth_bps, self.probed.link.latency_s],
            "speeds": {k: list(dataclasses.astuple(v)) for k, v in self._speeds.items()},
            "next_decision": dict(self.next_decision),
            "tried": sorted([k, r] for k, r in self._tried),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        levels = {str(k): int(v) for k, v in sd["level"].items()}
        if any(not 0 <= v < len(self.ladder) for v in levels.values()):
            raise ConfigError(f"saved rungs {levels} do not fit a {len(self.ladder)}-rung ladder")
        self.level = levels
        self.measured = {str(k): [dict(m) for m in v] for k, v in sd.get("measured", {}).items()}
        self._spb = sd.get("spb")
        self._spb_last = [] if self._spb is None else [float(self._spb)]
        probed = sd.get("probed")
        if probed is not None:
            self.probed = LinkFit(Link(float(probed[0]), float(probed[1])), 0, (), 0.0, "restored")
            self.latency_s = self.probed.link.latency_s
        self._probe_done = probed is not None
        self._speeds.update({str(k): CodecSpeed(*v) for k, v in sd.get("speeds", {}).items()})
        self.next_decision = {str(k): int(v) for k, v in sd.get("next_decision", {}).items()}
        self._tried = {(str(k), int(r)) for k, r in sd.get("tried", [])}
        self._seen.clear()
        self._on.clear()

    # ---- what the transports measured ---------------------------------------------------------
    def _rung_of(self, codec: Any) -> int | None:
        k = json.dumps(None if codec == DENSE else codec, sort_keys=True)
        return self._keys.index(k) if k in self._keys else None

    def observe(self, key: str, record: Mapping[str, Any], error_feedback: bool) -> None:
        """Fold one step's transport record (``Router.stats()[key]``) into the figures."""
        rung = self._rung_of(record.get("codec"))
        if rung is None or self._seen.get(key) == (record.get("codec"), record["step"]):
            return
        self._seen[key] = (record.get("codec"), record["step"])
        m = self.measured.setdefault(key, [{} for _ in self.ladder])[rung]
        # A key's first step on a rung (its first ever, or after a switch) loads the rung's kernels
        # and moves residuals between layouts: one-off costs, not the rung's step. Its bytes and
        # quality count; its seconds do not.
        timed = self._on.get(key) == rung
        self._on[key] = rung
        if timed:
            self._observe_seconds(m, record)
        m["payload_bytes"] = (
            record["payload_bytes"]
            if "payload_bytes" not in m
            else (1 - _EMA) * m["payload_bytes"] + _EMA * record["payload_bytes"]
        )
        q = record.get("quality")
        if q is not None and self.ladder[rung] is not None and math.isfinite(q["norm_ratio"]):
            # a moving average: one noisy sample (about 5 % of top-k + EF steps dip under 0.9) must
            # not close a rung that keeps the signal on average
            r = q["norm_ratio"]
            m["norm_ratio"] = r if "norm_ratio" not in m else (1 - _EMA) * m["norm_ratio"] + _EMA * r
            bad = m["norm_ratio"] < self.min_norm_ratio
            if error_feedback and q.get("residual_norm") is not None:
                bad = bad or q["residual_norm"] > self.max_residual_ratio * max(q["norm"], 1e-30)
            m["bad"] = 1.0 if bad else 0.0

    def _observe_seconds(self, m: dict[str, Any], record: Mapping[str, Any]) -> None:
        """Fold one record's seconds into a rung's figures ``m`` (and the link's)."""
        # Seconds: the median of the last few samples. A rank descheduled once on a busy machine
        # measures one step 100x slower; a moving average would carry that spike into the figures
        # of a rung it then leaves (and never measures again), a median drops it.
        for f in ("encode_s", "decode_s"):
            m[f] = _median_window(m, f, float(record[f]))
        # What the exchange took in the job, the peers' waits included: what :meth:`choose` sets
        # against the model's price of this rung (its excess). The engine's held seconds where it
        # measures them (the DDP hook: agreement and dense riders included), else the exchange's
        # own parts.
        held = record.get("held_s")
        if held is None:
            held = float(record["encode_s"]) + float(record["comm_s"]) + float(record["decode_s"])
        m["exchange_s"] = _median_window(m, "exchange_s", float(held))
        # The link: seconds per received byte. A rank's comm seconds include waiting for peers that
        # reached the collective later; the decision takes the least any rank measured (figures).
        if record["wire_bytes"] > 0 and record["comm_s"] > 0:
            spb = record["comm_s"] / record["wire_bytes"]
            self._spb_last = [*self._spb_last, spb][-_WINDOW:]
            self._spb = float(np.median(self._spb_last))
        m["exchange_spb"] = self._link_spb()  # the link the exchange seconds were measured on

    def _speed(self, rung: int) -> CodecSpeed:
        """Rung ``rung``'s codec seconds and payload before the job has run it: as given
        (``speeds``) or timed here, else its prior (:data:`PRIOR_SPEEDS`, with
        ``calibration="steps"``), else timed here now, once."""
        k = self._keys[rung]
        s = self._speeds.get(k)
        if s is None and self.calibration == "steps" and self.ladder[rung] is None:
            return measure_protocol_speed(None)  # dense: nothing to time
        if s is None and self.calibration == "steps" and k in PRIOR_SPEEDS:
            return PRIOR_SPEEDS[k]
        if s is None:
            # through the protocol a job's step runs, with its error feedback and mode, at 64 Ki and
            # 4 Mi elements: past the caches, where a gradient's codec work runs from memory (a line
            # through 1 Mi read top-k's codec seconds at 4.35 M elements 40 % low)
            s = self._speeds[k] = measure_protocol_speed(
                self.ladder[rung], 2, error_feedback=self._cal_ef, mode=self._cal_mode, sizes=(1 << 16, 1 << 22)
            )
        return s

    def calibrate(self, *, error_feedback: bool = False, mode: str = "auto") -> None:
        """Take the engine's error feedback and mode for any timing of a rung on this machine; the
        router calls it once, when it is built with this controller (``controller=``). With
        ``calibration="setup"`` it also times every rung now (those not given as ``speeds`` and
        not timed yet) through the transports' protocol (:func:`gcodec.advise.measure_protocol_speed`:
        the residual's passes and the decode of the peers' payloads included, which the codec's
        own encode and decode leave out), so that the engine's setup pays it, and the kernels a
        rung's first step calls are loaded by then (docs/telemetry.md has what both cost). With
        ``"steps"`` (the default) nothing is timed here: the rungs are priced from their priors
        until the job's own steps measured them. Local: no collectives."""
        self._cal_ef, self._cal_mode = bool(error_feedback), mode
        if self.calibration == "setup":
            for r in range(len(self.ladder)):
                self._speed(r)

    def load_factor(self, key: str, numel: int) -> float:
        """How much slower than its calibration the codec work of ``key`` runs in the job: the
        median over the rungs ``key`` has run of measured (encode + decode) seconds over the
        calibrated (or prior) ones at ``numel`` elements; ``prior_load`` before any was measured.
        So the job's first compressed steps calibrate every rung it has not run: a machine twice
        as slow as the one :data:`PRIOR_SPEEDS` were measured on prices them twice as dear. The
        calibration times one codec on an otherwise idle rank; in the job the kernels share the
        cores with the backward pass and the peers (measured on 2 cores: fp16's encode 3-5x its
        calibration, uniform 8's decode of the peers' payloads 10x), and a rung priced on the bare
        calibration looks cheaper than the one that is running."""
        ratios = []
        for r, m in enumerate(self.measured.get(key, [])):
            if self.ladder[r] is None or "encode_s" not in m:
                continue
            sp = self._speed(r)
            cal = sp.encode_seconds(numel) + sp.decode_seconds(numel)
            if cal > 0:
                ratios.append((m["encode_s"] + m["decode_s"]) / cal)
        return float(np.median(ratios)) if ratios else self.prior_load

    def figures(self, key: str, numel: int) -> np.ndarray:
        """This rank's figures for ``key``: per rung encode s, decode s, payload bytes, out-of-bounds
        flag, measured exchange seconds (0 for a rung not run yet) and the negated seconds per byte
        of the link believed when they were measured, then the negated seconds per byte of the link
        now (the vector the ranks allreduce with max: the slowest rank's seconds, the worst quality,
        and the *least* seconds per byte any rank measured, see :meth:`observe`)."""
        n = len(self.ladder)
        v = np.zeros(6 * n + 1)
        meas = self.measured.get(key, [{} for _ in self.ladder])
        load = self.load_factor(key, numel)
        for r in range(n):
            m = meas[r]
            sp = self._speed(r)
            v[r] = m.get("encode_s", load * sp.encode_seconds(numel))
            v[n + r] = m.get("decode_s", load * sp.decode_seconds(numel))
            v[2 * n + r] = m.get("payload_bytes", sp.payload_bytes(numel))
            v[3 * n + r] = m.get("bad", 0.0)
            v[4 * n + r] = m.get("exchange_s", 0.0)
            v[5 * n + r] = -m.get("exchange_spb", 0.0)
        v[6 * n] = -self._link_spb()
        return v

    def _link_spb(self) -> float:
        """The link this rank believes in now, as seconds per byte: as given, as probed, or as the
        exchanges measured it (1 Gbit/s before any)."""
        if self.bandwidth_bps is not None:
            return 8.0 / self.bandwidth_bps
        if self.probed is not None:
            return 8.0 / self.probed.link.bandwidth_bps
        return self._spb if self._spb is not None else 8.0 / 1e9

    # ---- the decision -------------------------------------------------------------------------
    def choose(
        self,
        figures: np.ndarray,
        shape: Sequence[int],
        workers: int,
        current: int,
        shapes: Sequence[Sequence[int]] | None = None,
        rungs: int | None = None,
    ) -> tuple[int, list[float]]:
        """The rung for a key of ``shape`` (its elements as one tensor) on ``workers`` ranks from
        (agreed) ``figures``, and the predicted step seconds of every rung (inf when out of
        bounds, or for a low-rank rung that would compress none of the key's tensors). ``shapes``:
        the key's tensors, when the engine knows them; a low-rank rung is priced on them (the
        tensors it passes through as dense), every other rung on the measured figures of the key as
        a whole. ``rungs``: only the first ``rungs`` rungs may be taken (warm-up); the others are
        priced inf. Pure: same figures, same answer."""
        n = len(self.ladder)
        allowed = n if rungs is None else rungs
        link = Link(8.0 / -figures[6 * n], self.latency_s)
        tensors = [tuple(int(d) for d in s) for s in shapes] if shapes else [tuple(shape)]
        times: list[float] = []
        excess: dict[int, float] = {}
        out = False
        for r in range(n):
            out = out or figures[3 * n + r] > 0
            if out or r >= allowed:
                times.append(math.inf)
                continue
            t = self._predict_rung(r, figures, shape, tensors, workers, link)
            # (a rung some rank measured and another did not carries no link: no excess, no 8 / 0)
            if self.bandwidth_bps is None and math.isfinite(t) and figures[4 * n + r] > 0 > figures[5 * n + r]:
                # What the model left out of a rung that ran, on the link the job runs on: its
                # measured exchange less the model's price on the link believed when it was measured.
                then = Link(8.0 / -figures[5 * n + r], self.latency_s)
                excess[r] = max(0.0, figures[4 * n + r] - self._predict_rung(r, figures, shape, tensors, workers, then))
            times.append(t)
        if excess:
            # Each rung pays its excess on top of today's price (the cores the backward pass and the
            # peers take, gloo's per-collective costs; on the 2-core loopback top-k, priced 1 % under
            # dense, ran its bucket 1.67x slower), and a rung not run yet the least excess of those
            # that ran: the waits for peers that every rung measures alike. So a figure measured on
            # another link neither holds a rung back nor pins it once the link changes, and an
            # unmeasured rung does not look cheaper only for lacking the waits. A declared bandwidth
            # is priced by the model alone: the job's seconds were not measured on it.
            base = min(excess.values())
            times = [t + excess.get(r, base) if math.isfinite(t) else t for r, t in enumerate(times)]
        best = min(range(n), key=lambda r: (times[r], r))
        if math.isfinite(times[current]) and times[best] >= (1 - self.hysteresis) * times[current]:
            best = current
        return best, times

    def _predict_rung(
        self,
        r: int,
        figures: np.ndarray,
        shape: Sequence[int],
        tensors: Sequence[tuple[int, ...]],
        workers: int,
        link: Link,
    ) -> float:
        """The model's step seconds of rung ``r`` on ``link`` from the agreed figures (inf for a
        low-rank rung that compresses none of ``tensors``)."""
        n = len(self.ladder)
        if self._low_rank[r]:
            # Its factors' sizes follow the shapes (predict sizes them), its seconds the agreed
            # figures of the key as a whole, spread per element: every rank prices alike.
            codec = self._codecs[r]
            assert codec is not None
            mats = [s for s in tensors if codec.compresses(s)]
            if not mats:
                return math.inf
            rest = [s for s in tensors if not codec.compresses(s)]
            k = max(1, int(np.prod(shape)))
            sp = CodecSpeed(0.0, figures[r] / k, 0.0, figures[n + r] / k, 0.0, 0.0)
            return float(predict(self.ladder[r], sp, mats, workers, link, dense_tensors=rest)["step_seconds"])
        sp = CodecSpeed(figures[r], 0.0, figures[n + r], 0.0, figures[2 * n + r], 0.0)
        return float(predict(self.ladder[r], sp, [tuple(shape)], workers, link)["step_seconds"])

    def _probe_link(self, comm: Communicator) -> Protocol:
        """Time dense float32 allreduces through ``comm`` (every rank runs the same collectives:
        each size's median is agreed with a max before the next size is chosen) and fit the link;
        sets :attr:`probed` and the latency, or leaves them when the fit fails."""
        self._probe_done = True
        samples = []
        for i, n in enumerate(PROBE_SIZES):
            buf = np.ones(n, np.float32)
            yield comm.allreduce(buf, "sum")  # untimed: connections, buffers, and the ranks in step
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                yield comm.allreduce(buf, "sum")
                ts.append(time.perf_counter() - t0)
            med = np.array([float(np.median(ts))])
            yield comm.allreduce(med, "max")
            samples.append((buf.nbytes, float(med[0])))
            if i + 1 == len(PROBE_SIZES):
                break
            # The next size's four allreduces, priced at this one's median scaled by the bytes, are
            # skipped when dear, but only once the bytes show: this size took PROBE_GROWTH times the
            # smallest one. Until then the times are the latency (gloo on the loopback moves 256 KB
            # about as fast as 16 KB), a line through them says nothing of the bandwidth, and one
            # under load priced the unlimited loopback slow enough to take top-k over dense.
            dear = 4 * med[0] * PROBE_SIZES[i + 1] / n > PROBE_MAX_S
            if len(samples) >= 2 and dear and med[0] >= PROBE_GROWTH * samples[0][1]:
                break
        try:
            self.probed = fit_link(samples, comm.size, "controller")
        except ConfigError:  # too fast or too noisy to fit: the exchanges' seconds stay the measure
            return
        self.latency_s = self.probed.link.latency_s

    def select(
        self,
        comm: Communicator,
        state: Router,
        key: str,
        shape: tuple[int, ...],
        step: int,
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> Protocol:
        """The chooser protocol :class:`~gcodec.transports.Router` runs before each exchange
        (``shapes``: the key's tensors, when the engine knows them; see :meth:`choose`)."""
        cur = self.level.setdefault(key, self.start)
        rec = state.last(key)
        if rec is not None:
            self.observe(key, rec, state.error_feedback)
        # Decision steps: warmup_steps, then every interval (after a rung taken on trial, sooner);
        # with warmup_rungs, from step 0, among the light rungs only until warmup_steps.
        first = 0 if self.warmup_rungs is not None and self.warmup_steps > 0 else self.warmup_steps
        if step < self.next_decision.setdefault(key, first):
            return self.ladder[cur]
        warm = step < self.warmup_steps
        numel = int(np.prod(shape)) if shape else 1
        if comm.size > 1:
            # The figures' size follows from the ladder: agree on the ladder (and that every rank
            # decides at this step, and whether it probes) before they travel, as any exchange does.
            probe = self.probe and self.bandwidth_bps is None and not self._probe_done
            fp = fingerprint(
                key=key,
                controller=self.ladder,
                interval=self.interval,
                warmup_steps=self.warmup_steps,
                warmup_rungs=self.warmup_rungs,
                probe=probe,
            )
            ex = Exchange(comm, fp, state.agreed, f"{key}#controller", f"adaptive controller's figures for {key!r}")
            yield from ex.begin()
            if probe:
                yield from self._probe_link(comm)
            figs = self.figures(key, numel)
            yield comm.allreduce(figs, "max")  # same figures on every rank: same decision, same step
        else:
            figs = self.figures(key, numel)
        new, times = self.choose(figs, shape, comm.size, cur, shapes, self.warmup_rungs if warm else None)
        self.decisions.append({"key": key, "step": step, "from": cur, "to": new, "predicted_s": times})
        self.level[key] = new
        # A rung no rank has run for this key (no agreed exchange seconds) is on trial: decided again
        # once it has measured, not after a whole interval on the calibration's guess.
        n = len(self.ladder)
        gap = self.interval
        if self.trial_steps is not None and new != cur and figs[4 * n + new] <= 0 and (key, new) not in self._tried:
            self._tried.add((key, new))
            gap = min(gap, self.trial_steps)
        nxt = step + gap
        if warm:  # the whole ladder opens at warmup_steps
            nxt = min(nxt, self.warmup_steps)
        self.next_decision[key] = nxt
        return self.ladder[new]
