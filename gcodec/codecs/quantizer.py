"""What ``uniform``, ``qsgd`` and ``terngrad`` share: scaled integer codes, and random streams.

The three codecs differ only in how a group's scale is chosen and in their parameters; the codes,
their packing, the rounding rules and decoding are the same (specs/codecs/uniform.md §6,
qsgd.md, terngrad.md). :class:`ScaledQuantizer` holds that common part; a subclass says how its
params map onto the kernel (:meth:`ScaledQuantizer._layout`).

:class:`StreamCounter` gives stochastic codecs their random stream per call: ``step`` when the
caller passes one (all workers passing the same step draw the same stream), otherwise a counter
per ``key`` that starts at 0 and advances by one per encode. The stream is written into the header,
so a payload never depends on the encoder's state to be decoded or checked.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, PayloadValueError
from ..format.container import SectionSpec, TensorEntry
from ..kernels import quant_cpu
from ..rng import MASK64, split64
from .base import Codec, EncodeContext, EncodePlan, Param

__all__ = ["SEED_PARAM", "STREAM_PARAM", "QuantLayout", "ScaledQuantizer", "StreamCounter"]

SEED_PARAM = Param(
    int,
    0,
    "Philox key (0 .. 2**64-1). Give each worker its own seed (e.g. base + rank) so that their rounding "
    "errors are independent and average out",
    min=0,
    max=MASK64,
)
STREAM_PARAM = Param(int, 0, "Philox stream of this payload (the step, or the per-key call counter)", min=0, max=MASK64)


class StreamCounter:
    """Per-key call counters for stochastic codecs (thread-safe, picklable)."""

    def __init__(self) -> None:
        self._next: dict[str | None, int] = {}
        self._lock = threading.Lock()

    def take(self, ctx: EncodeContext) -> int:
        """The stream for this call: ``ctx.step`` if given, else the key's counter (then advanced)."""
        if ctx.step is not None:
            step = ctx.step
            if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 0 <= int(step) <= MASK64:
                raise ConfigError(f"step must be an integer in [0, 2**64), got {step!r}")
            return int(step)
        with self._lock:
            s = self._next.get(ctx.key, 0)
            self._next[ctx.key] = (s + 1) & MASK64
            return s

    def peek(self, key: str | None = None) -> int:
        """The stream the next call for ``key`` without a step would use."""
        with self._lock:
            return self._next.get(key, 0)

    def reset(self, key: str | None = None, value: int = 0) -> None:
        with self._lock:
            self._next[key] = value & MASK64

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"next": dict(self._next)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._next = dict(state["next"])
        self._lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class QuantLayout:
    """How a payload's params map onto :mod:`gcodec.kernels.quant_cpu`."""

    group_size: int  # 0: one group for the whole tensor
    width: int  # bits per code, 2..8
    qmax: int  # codes lie in [-qmax, qmax]
    rule: int  # quant_cpu.RULE_*
    stochastic: bool
    clip: float = 0.0
    scale_f16: bool = False

    def ngroups(self, n: int) -> int:
        if n == 0:
            return 0
        return 1 if self.group_size == 0 else (n + self.group_size - 1) // self.group_size

    def sections(self, n: int) -> list[tuple[str, str, int]]:
        ng = self.ngroups(n)
        scales = ("scales", "f2", 2 * ng) if self.scale_f16 else ("scales", "f4", 4 * ng)
        return [scales, ("codes", "u1", (n * self.width + 7) // 8)]


class ScaledQuantizer(Codec):
    """Base of the group-scaled integer codecs. Subclasses define ``PARAMS``, ``_layout`` and the
    rule prefix used in error messages (``U``, ``Q``, ``T``)."""

    rule_prefix: str = "U"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._streams = StreamCounter()

    @classmethod
    def _layout(cls, params: Mapping[str, Any]) -> QuantLayout:
        raise NotImplementedError

    @classmethod
    def _is_stochastic(cls, params: Mapping[str, Any]) -> bool:
        return True

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return {**cls.PARAMS, "stream": STREAM_PARAM}

    @classmethod
    def wire_schema_for(cls, params: Mapping[str, Any]) -> dict[str, Param]:
        return cls.wire_schema() if cls._is_stochastic(params) else dict(cls.PARAMS)

    def next_stream(self, key: str | None = None) -> int:
        """The stream the next encode of ``key`` without ``step=`` will use."""
        return self._streams.peek(key)

    def stream_state(self) -> dict[str | None, int]:
        """Every key's next stream (for checkpoints; see :meth:`load_stream_state`)."""
        return dict(self._streams.__getstate__()["next"])

    def load_stream_state(self, state: Mapping[str | None, int]) -> None:
        for k, v in state.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) <= MASK64:
                raise ConfigError(f"stream state for key {k!r} must be an integer in [0, 2**64), got {v!r}")
        self._streams.__setstate__({"next": {k: int(v) for k, v in state.items()}})

    # ---- encoding ------------------------------------------------------------------------
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        if flat.dtype != np.float32:  # the spec's first step; kernels are compiled for float32 only
            with np.errstate(over="ignore"):  # beyond float32: infinite, refused by the kernel
                flat = flat.astype(np.float32)
        params = dict(self._params)
        lay = self._layout(params)
        stream = 0
        if lay.stochastic:
            stream = self._streams.take(ctx)
            params["stream"] = stream
        n = flat.size
        ng = lay.ngroups(n)
        name = self.codec_id

        def fill(views: Mapping[str, np.ndarray]) -> None:
            codes = views["codes"]
            if lay.scale_f16:
                sc16 = views["scales"].view(np.uint16)
                sc32 = np.empty(ng, np.float32)
            else:
                sc16 = np.empty(0, np.uint16)
                sc32 = views["scales"]
            nbad = encode_into(flat, codes, sc32, sc16, lay, params.get("seed", 0), stream)
            if not nbad and not lay.scale_f16:
                nover = int(np.count_nonzero(scale_overflows(sc32, lay.qmax)))
                if nover:  # a finite input whose largest code would decode to infinity (rule 1)
                    raise PayloadValueError(
                        f"{name}: input too large: in {nover} group(s) the scale times {lay.qmax} overflows float32, "
                        "so the payload would decode to infinity"
                    )
            if nbad:
                why = "NaN or infinite values"
                if lay.scale_f16:
                    why += " (or a scale above the float16 range: use scale_dtype='float32')"
                raise PayloadValueError(f"{name}: input has {why} in {nbad} group(s); the codec cannot represent them")

        sections = [SectionSpec(*s) for s in lay.sections(n)]
        return EncodePlan(params, sections, fill)

    # ---- decoding ------------------------------------------------------------------------
    @classmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        n = int(np.prod(shape, dtype=object))
        return cls._layout(params).sections(n)

    @classmethod
    def _check_scales(cls, lay: QuantLayout, views: Mapping[str, np.ndarray]) -> None:
        p = cls.rule_prefix
        if lay.scale_f16:
            bits = views["scales"].view(np.uint16)
            bad = ((bits & 0x8000) != 0) | ((bits & 0x7C00) == 0x7C00)
        else:
            sc = views["scales"]
            bad = ~np.isfinite(sc) | (sc.view(np.uint32) >> 31).astype(bool)
        if bad.any():
            g = int(np.flatnonzero(bad)[0])
            raise PayloadValueError(
                f"{p}1: scale of group {g} is {views['scales'][g]!r}; scales must be finite and >= +0"
            )
        if not lay.scale_f16:  # float16 scales times qmax <= 127 never overflow float32
            over = scale_overflows(views["scales"], lay.qmax)
            if over.any():
                g = int(np.flatnonzero(over)[0])
                raise PayloadValueError(
                    f"{p}1: scale of group {g} is {views['scales'][g]!r}; float32({lay.qmax} * scale) overflows, "
                    "so its largest code would decode to infinity"
                )

    @classmethod
    def _check_padding(cls, lay: QuantLayout, n: int, views: Mapping[str, np.ndarray]) -> None:
        used = n * lay.width % 8
        codes = views["codes"]
        if used and codes[-1] >> used:
            raise PayloadValueError(
                f"{cls.rule_prefix}3: unused high bits of the last code byte {codes.size - 1} are not zero"
            )

    @classmethod
    def _bad_codes(cls, lay: QuantLayout, nbad: int) -> str:
        return (
            f"{cls.rule_prefix}2: {nbad} code(s) lie outside [-{lay.qmax}, {lay.qmax}] "
            f"(the {lay.width}-bit codes this payload's params allow)"
        )

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        lay = cls._layout(params)
        cls._check_scales(lay, views)
        cls._check_padding(lay, entry.numel, views)
        nbad = quant_cpu.count_bad(views["codes"], entry.numel, lay.width, lay.qmax)
        if nbad:
            raise PayloadValueError(cls._bad_codes(lay, nbad))

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        lay = cls._layout(params)
        if accumulate:  # check everything first: a bad payload must not half-update the sum
            cls.check_values(params, entry, views)
        else:
            cls._check_scales(lay, views)
            cls._check_padding(lay, entry.numel, views)
        n = entry.numel
        g = lay.group_size if lay.group_size > 0 else max(n, 1)
        if lay.scale_f16:
            sc16, sc32 = views["scales"].view(np.uint16), np.empty(0, np.float32)
        else:
            sc16, sc32 = np.empty(0, np.uint16), views["scales"]
        nbad = quant_cpu.scaled_decode(views["codes"], sc32, sc16, out, g, lay.width, lay.qmax, accumulate)
        if nbad:
            raise PayloadValueError(cls._bad_codes(lay, nbad))


def scale_overflows(scales: np.ndarray, qmax: int) -> np.ndarray:
    """Where ``float32(qmax * scale)`` is infinite: the largest code of the group decodes to ±inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isinf(np.asarray(scales, np.float32) * np.float32(qmax))


def encode_into(
    flat: np.ndarray,
    codes: np.ndarray,
    sc32: np.ndarray,
    sc16: np.ndarray,
    lay: QuantLayout,
    seed: int,
    stream: int,
) -> int:
    """Run the kernels for one tensor; returns the number of groups that could not be encoded."""
    n = flat.size
    if n == 0:
        return 0
    g, sub, chunk, fused = quant_cpu.geometry(n, lay.group_size)
    nbad = 0
    if not fused:
        nbad += quant_cpu.large_group_scales(flat, sc32, sc16, g, lay.rule, lay.qmax, lay.clip)
    sl, sh = split64(seed)
    tl, th = split64(stream)
    nbad += quant_cpu.scaled_encode(
        flat,
        codes,
        sc32,
        sc16,
        g,
        sub,
        chunk,
        fused,
        lay.width,
        lay.qmax,
        lay.rule,
        lay.stochastic,
        float(lay.clip),
        sl,
        sh,
        tl,
        th,
    )
    return nbad
