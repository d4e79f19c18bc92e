"""The codec base class, its parameter schema, and the aggregation kinds.

A codec is a small pure algorithm. Encoding turns an array into *sections* (named raw arrays)
plus the *params* a decoder needs; decoding turns sections and params back into an array. A codec
never sees bytes, headers or transports: ``gcodec.format`` lays its sections out on the wire and
hands them back as NumPy views.

To add a codec, subclass :class:`Codec`, set ``codec_id``, ``PARAMS`` and ``aggregation``, and
implement :meth:`Codec.plan`, :meth:`Codec.expected_sections` and :meth:`Codec.decode_into`.
Register it with :func:`gcodec.register_codec` or the ``gcodec.codecs`` entry point group.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, HeaderError, SizeMismatchError
from ..excerpt import short
from ..sections import SectionSpec, TensorEntry
from .state import CodecState, default_state

__all__ = ["Aggregation", "Codec", "EncodeContext", "EncodePlan", "Param", "binary32", "check_params"]


class Aggregation(str, enum.Enum):
    """How payloads from several workers combine.

    ``SUMMABLE``: workers' sections can be added elementwise and decoded once (the encoding is
    linear given shared params, e.g. fp16, shared-seed Random-K, PowerSGD factors).
    ``GATHER``: each payload must be decoded on its own and the results summed (per-worker scales,
    data-dependent indices).
    """

    SUMMABLE = "summable"
    GATHER = "gather"


@dataclasses.dataclass(frozen=True)
class Param:
    """One codec parameter: its type, default, allowed values, and what it does."""

    kind: type | tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None

    def check(self, name: str, value: Any, err: type[Exception], where: str) -> Any:
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        ok = any(
            (type(value) is bool) if k is bool else (isinstance(value, k) and not isinstance(value, bool))
            for k in kinds
        )
        if float in kinds and type(value) is int:
            value, ok = float(value), True
        if not ok:
            names = "/".join(k.__name__ for k in kinds)
            raise err(f"{where}{name} must be {names}, got {short(value)}")
        if self.choices is not None and value not in self.choices:
            raise err(f"{where}{name}={short(value)} is not one of {list(self.choices)}")
        if self.min is not None and value < self.min:
            raise err(f"{where}{name}={value!r} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise err(f"{where}{name}={value!r} is above the maximum {self.max}")
        if isinstance(value, float) and not np.isfinite(value):
            raise err(f"{where}{name} must be finite, got {value!r}")
        return value


def check_params(
    schema: Mapping[str, Param],
    given: Mapping[str, Any],
    err: type[Exception],
    where: str = "",
    *,
    fill_defaults: bool,
    allow_unknown: bool = False,
) -> dict[str, Any]:
    """Check ``given`` against ``schema``; raise ``err`` naming the field on the first problem."""
    unknown = sorted(set(given) - set(schema))
    if unknown and not allow_unknown:
        raise err(f"{where}unknown parameter(s) {short(unknown)}; known: {sorted(schema)}")
    out: dict[str, Any] = {}
    for name, p in schema.items():
        if name in given:
            out[name] = p.check(name, given[name], err, where)
        elif fill_defaults:
            out[name] = p.default
        else:
            raise err(f"{where}missing parameter {name!r}")
    return out


def binary32(x: float) -> float:
    """``x`` rounded to binary32 (nearest even; beyond its range: infinity), the first step of every
    codec that computes in binary32 (specs/codecs/fp16.md §3, uniform.md §4)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


@dataclasses.dataclass(frozen=True)
class EncodeContext:
    """Per-call facts, and the caller's state, that a stateful codec may use.

    ``key`` names the tensor (a parameter name, a bundle entry) so that per-tensor state (a stream
    counter, PowerSGD's warm-start Q) is kept apart. ``step``, when given, fixes the random stream
    of a stochastic codec for this call (all workers pass the same step to draw the same stream);
    when ``None`` a stochastic codec uses and advances the key's counter in ``state``. ``state`` is
    the caller's :class:`~gcodec.codecs.state.CodecState` (a fresh, throw-away one when omitted).
    """

    key: str | None = None
    step: int | None = None
    state: CodecState = dataclasses.field(default_factory=CodecState)

    def take_stream(self) -> int:
        """This call's random stream: ``step``, or the key's counter in ``state`` (then advanced)."""
        return self.state.take_stream(self.key, self.step)

    def nested(self, role: str) -> EncodeContext:
        """The context of the nested codec in ``role``: key ``<key>/<role>``, its own child state."""
        return EncodeContext(None if self.key is None else f"{self.key}/{role}", self.step, self.state.child(role))


@dataclasses.dataclass
class EncodePlan:
    """What :meth:`Codec.plan` returns: header params, section list, and the function that fills them."""

    params: dict[str, Any]
    sections: Sequence[SectionSpec]
    fill: Callable[[Mapping[str, np.ndarray]], None]


#: Bytes of a payload besides its sections' contents (preamble, header, section padding, CRCs)
#: that :meth:`Codec.max_payload_bytes` allows for one tensor record (headers of this release's
#: codecs take under 500 bytes; the configuration's own length is added on top).
PAYLOAD_HEADER_ROOM = 4096
#: The most section bytes any codec of this release writes per element (a raw float64 value and
#: a raw 64-bit index of a sparse codec that keeps everything).
PAYLOAD_BYTES_PER_ELEMENT = 16


class Codec(ABC):
    """Base class of every codec.

    Subclasses declare:

    * ``codec_id``: the registry id written into headers;
    * ``version``: bumped when the codec's wire layout changes incompatibly;
    * ``PARAMS``: the parameter schema (used for construction and for header checking);
    * ``aggregation``: a :class:`Aggregation`.

    and what the transports may ask of it (its *capabilities*; no module outside ``gcodec.codecs``
    compares codec ids):

    * ``low_rank``: the codec compresses whole matrices with a protocol of its own (two allreduces
      of factors, ``begin()``/``LowRankRound``), so it cannot run on flat chunks (two-phase, FSDP's
      row chunks, parameter shards);
    * ``fixed_size``: the payload's length follows from the configuration and the tensor's shape
      alone (never from its values), so every rank knows every payload's size in advance;
    * :attr:`values_dtype` and :meth:`encode_values`/:meth:`decode_values`: the payload is a header
      and one section of numbers of that type, which the ranks can sum value by value;
    * :meth:`compresses`: whether a tensor of a shape is worth compressing at all;
    * :attr:`reads_shape`: whether the encoding depends on the tensor's shape beyond its element
      count, so that an engine never joins such a tensor with others into one flat group;
    * :attr:`encoding_unit`: over which elements of a flat tensor the encoding of one element
      depends on others (1: none, element by element; g: its group of g consecutive elements
      counted from the first; None: the whole tensor), so that an engine joins tensors into one
      flat group only where no tensor's encoding changes with its neighbours;
    * :meth:`compression_rate`: the ratio of a shape's elements to what the codec keeps of it,
      when the codec's gain depends on the shape (a low-rank codec's m·n / ((m+n)·r));
    * ``carries_nonfinite``: the codec carries NaN and ±infinity (docs/nonfinite.md, "carry"), so
      its decoded values may be non-finite; every other codec's decoder refuses them, so its
      decoded values are finite and a sum of them can only overflow.

    and what the reader may ask of it:

    * ``device_checks``: :meth:`check_values` and :meth:`decode_into` work on sections in device
      memory (they use only the backend's kernels, ``kernels.of(view)``), so a device payload is
      checked and decoded where it lies; otherwise the reader hands them host copies of the
      entry's sections (docs/gpu.md, "Decoding a device payload").
    """

    codec_id: ClassVar[str]
    version: ClassVar[int] = 1
    PARAMS: ClassVar[dict[str, Param]] = {}
    aggregation: ClassVar[Aggregation] = Aggregation.GATHER
    low_rank: ClassVar[bool] = False
    fixed_size: ClassVar[bool] = False
    device_checks: ClassVar[bool] = False
    carries_nonfinite: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self._params = check_params(self.PARAMS, params, ConfigError, f"{self.codec_id}: ", fill_defaults=True)
        self._check_config(self._params, ConfigError, f"{self.codec_id}: ")

    # ---- configuration -------------------------------------------------------------------
    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    def get_config(self) -> dict[str, Any]:
        """A JSON-safe dict ``{"id": ..., **params}`` that :meth:`from_config` turns back into an equal codec."""
        return {"id": self.codec_id, **self._params}

    @functools.cached_property
    def config_key(self) -> str:
        """The configuration as canonical JSON (sorted keys): equal codecs, equal keys. Made once
        per instance (a codec's configuration does not change after construction), since the
        engines key states and groups by it for every tensor at every step."""
        return json.dumps(self.get_config(), sort_keys=True)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Codec:
        cfg = dict(config)
        cid = cfg.pop("id", cls.codec_id)
        if cid != cls.codec_id:
            raise ConfigError(f"config id {cid!r} does not match codec {cls.codec_id!r}")
        return cls(**cfg)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(self.config_key)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self._params.items())
        return f"gcodec.get_codec({self.codec_id!r}{args})"

    @classmethod
    def _check_config(cls, params: dict[str, Any], err: type[Exception], where: str) -> None:
        """Cross-parameter rules; override when a codec has them."""
        return None

    # ---- the algorithm -------------------------------------------------------------------
    @abstractmethod
    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        """Decide the header params and sections for ``x`` (C-contiguous, one of the four floats)."""

    @classmethod
    @abstractmethod
    def expected_sections(cls, params: dict[str, Any], shape: tuple[int, ...]) -> list[tuple[str, str, int]]:
        """The (name, element type, byte length) list a payload with these params must carry."""

    @classmethod
    @abstractmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        """Write (or add, when ``accumulate``) the decoded values into ``out``: flat float32 or float64."""

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        """Value-level rules (raise PayloadValueError). Decoding checks what it must anyway."""
        return None

    # ---- capabilities the transports ask about (class docstring) ------------------------------
    @property
    def values_dtype(self) -> np.dtype | None:
        """The number type of the one values section a payload of this codec carries when the ranks
        may sum payloads value by value without decoding them (fp16, bf16), else None."""
        return None

    def summable_values(self, shape: tuple[int, ...], dtype: Any) -> tuple[int, np.dtype] | None:
        """(count, number type) of the values a summable payload of a tensor of ``shape`` and
        ``dtype`` carries, the section the ranks sum: fixed by the configuration, whatever the
        data; None where the codec is not summable. The summable transport sends that many NaN in
        place of a payload it failed to encode (every rank then refuses the sum)."""
        return None

    def encode_values(self, flat: Any, out: Any) -> None:
        """Write the values section an encode of the flat float array ``flat`` would carry into
        ``out`` (of :attr:`values_dtype`'s width), without a header. Only where ``values_dtype`` is set."""
        raise ConfigError(f"codec {self.codec_id!r} has no values section to encode alone")

    def decode_values(self, values: Any, out: Any, accumulate: bool) -> None:
        """Decode (or add, when ``accumulate``) a values section written by :meth:`encode_values`."""
        raise ConfigError(f"codec {self.codec_id!r} has no values section to decode alone")

    def decode_values_sum(self, a: Any, b: Any, out: Any) -> int:
        """Decode into ``out`` (flat float32) the values section that two ranks' sections ``a`` and ``b`` sum to
        (:func:`gcodec.aggregate.sum_pair`'s sum: in float32 from +0, rounded once to the values'
        type), without writing that section; returns how many of the summed values are infinite or
        NaN. Only where ``values_dtype`` is set: the summable transport's two-rank decode."""
        raise ConfigError(f"codec {self.codec_id!r} has no values section to decode alone")

    def compresses(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of this shape is compressed (a codec that would only pass it through
        says False, and the engines keep such a tensor dense)."""
        return True

    @property
    def reads_shape(self) -> bool:
        """Whether the encoding depends on the tensor's shape and not only on its flattened values
        (a low-rank codec's matrices, the 2-D DCT's tiles). The engines join tensors of one codec
        into one flat group only when this is False; such a tensor is exchanged in its own shape."""
        return self.low_rank

    @property
    def encoding_unit(self) -> int | None:
        """Over which elements of a flat tensor the encoding (and decoded value) of one element
        depends on the others: ``1`` when it depends on none (a cast); ``g`` when it depends only on
        the others of its group of ``g`` consecutive elements, groups counted from the tensor's
        first element (a scale per group, a selection per chunk); ``None`` when it may depend on
        any element of the tensor (a selection over the whole tensor, a tensor-wide scale) or on
        the element's position (a random stream addressed by position: stochastic rounding, a
        random selection).

        An engine that joins several tensors into one flat vector (a DDP bucket's tensors of one
        codec) keeps a tensor's encoding independent of its neighbours only where every group
        lies inside one tensor: it joins a tensor whose element count is a multiple of ``g`` and
        encodes every other one on its own (:func:`gcodec.transports.shares_flat_group`). That is
        what makes a job's results independent of how the engine happens to group its tensors (a
        DDP job resumed from a checkpoint continues bit for bit although its first buckets differ
        from the rebuilt ones). The default, None, is always right; a codec says more to be joined."""
        return None

    def compression_rate(self, shape: tuple[int, ...]) -> float | None:
        """Elements of ``shape`` per element the codec sends, when that depends on the shape (a
        low-rank codec: m·n / ((m+n)·r), 0 for a tensor that is no matrix); None when it does not."""
        return None

    # ---- what a host codec asks of the codec nested in it (specs/codecs/hybrid.md §3.1) --------
    def max_payload_bytes(self, shape: tuple[int, ...], dtype: Any) -> int:
        """An upper bound of the bytes of any payload this codec writes for one tensor of
        ``shape`` and ``dtype``: what a receiver accepts from a peer under an agreed plan before it
        allocates for it (the transports refuse a larger announced size on every rank).

        The default holds for every codec of this release: the container's preamble, header and
        checksums in :data:`PAYLOAD_HEADER_ROOM` plus twice the configuration's JSON (a nested
        codec's header record is no larger), and at most :data:`PAYLOAD_BYTES_PER_ELEMENT` bytes
        of sections per element (a raw float64 value and a raw 64-bit index, the most any codec
        keeps of one element; PowerSGD compresses only below the tensor's own size) plus each
        section's alignment padding. Codecs whose sections the shape fixes say it exactly."""
        n = math.prod(int(d) for d in shape)
        return PAYLOAD_HEADER_ROOM + 2 * len(self.config_key) + PAYLOAD_BYTES_PER_ELEMENT * n

    def magnitude_bound(self, max_abs: float, count: int) -> float:
        """An upper bound on the magnitude of every value this codec decodes from its encoding of a
        one-dimensional tensor of ``count`` finite values whose largest magnitude is ``max_abs``, or
        ``math.inf`` when such a tensor may decode to ±infinity (``fp16`` carries a value beyond its
        range as an overflow).

        A host codec (``topk``, ``threshold``, ``randomk``, ``powersgd``) asks this of the codec nested
        in it, so that it refuses on encode what its decoder refuses: a value that would decode to
        ±infinity (rules T4, TH4, R2, P3), factors whose decoded product could overflow (P4). Whether
        the bound is infinite must depend on ``max_abs`` alone, and grow with it. The default promises
        nothing, and a codec that promises nothing cannot be nested (``ConfigError``).
        """
        return math.inf

    # ---- resource accounting (checked against gcodec.Limits before anything is allocated) --------
    @classmethod
    def decode_work(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """Multiply-adds the decode of this entry takes (``max_decode_work``); numel by default. The
        figure is normative (specs/format.md §9.1): a codec that overrides it changes that table."""
        return entry.numel

    @classmethod
    def decode_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """An upper bound on the temporaries :meth:`decode_into` and :meth:`check_values` allocate
        besides the output, in bytes (``max_scratch_bytes``); a codec with k-sized or factor-sized
        temporaries overrides this. Allocations proportional to the sections' own bytes are not
        counted here (the documented memory bound covers them as a multiple of the payload). The
        figure is normative (specs/format.md §9.1): a codec that overrides it changes that table."""
        return 0

    # ---- header checking -----------------------------------------------------------------
    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        """The schema of the header's params (defaults to ``PARAMS``)."""
        return cls.PARAMS

    @classmethod
    def wire_schema_for(cls, params: Mapping[str, Any]) -> dict[str, Param]:
        """The header schema for a header with these (not yet checked) params.

        Defaults to :meth:`wire_schema`; a codec whose header fields depend on a mode (``uniform``
        records ``stream`` only when ``rounding="stochastic"``) overrides this.
        """
        return cls.wire_schema()

    @classmethod
    def _entry_sections(cls, params: dict[str, Any], entry: TensorEntry) -> list[tuple[str, str, int]]:
        """:meth:`expected_sections` for this header entry (rule C2/C3's reference). Codecs whose
        sections depend on the tensor's dtype as well as its shape override this."""
        return cls.expected_sections(params, entry.shape)

    @classmethod
    def check_entry(cls, entry: TensorEntry, where: str, *, strict: bool = True) -> dict[str, Any]:
        """Check a header entry's params and section table against this codec (rules C1-C3)."""
        params = check_params(
            cls.wire_schema_for(entry.params),
            entry.params,
            HeaderError,
            f"C1: {where}.params: ",
            fill_defaults=False,
            allow_unknown=not strict,
        )
        cls._check_config(params, HeaderError, f"C1: {where}.params: ")
        want = cls._entry_sections(params, entry)
        got = [(s.name, s.dtype, s.nbytes) for s in entry.sections]
        if [w[:2] for w in want] != [g[:2] for g in got]:
            raise SizeMismatchError(
                f"C2: {where}.sections are {short([g[:2] for g in got[:200]])}; "
                f"codec {cls.codec_id!r} needs {short([w[:2] for w in want[:200]])}"
            )
        for (name, _, nb_want), (_, _, nb_got) in zip(want, got):
            if nb_want != nb_got:
                raise SizeMismatchError(
                    f"C3: {where} section {name!r} is {nb_got} bytes; "
                    f"shape {list(entry.shape)} and params imply {nb_want}"
                )
        return params

    # ---- convenience ---------------------------------------------------------------------
    # A facade over the api layer, which installs itself here when ``gcodec`` is imported: codecs
    # never import the api (the layer contract forbids it), yet ``codec.encode(x)`` works.
    def encode(
        self,
        x: Any,
        *,
        key: str | None = None,
        step: int | None = None,
        state: CodecState | None = None,
        checksum: bool = True,
        meta: Mapping[str, str] | None = None,
        out: Any = None,
    ) -> memoryview:
        """Encode ``x`` into a complete, self-describing payload (``gcodec.encode(x, self, ...)``).

        ``key`` and ``step`` matter only to stateful or stochastic codecs (see :class:`EncodeContext`);
        ``state`` defaults to this codec object's :func:`~gcodec.codecs.state.default_state`.
        ``checksum=False`` drops the payload CRC32C (the header CRC stays) for trusted paths.
        ``out`` is a writable byte buffer to write the payload into (its first bytes; a send buffer
        reused across steps), and the result is a view of it.
        """
        return _api().encode(x, self, key=key, step=step, state=state, checksum=checksum, meta=meta, out=out)

    def decode(self, buf: Any, out: Any = None, *, accumulate: bool = False) -> Any:
        """Decode a payload written by a codec of this id (any params; they come from the header)."""
        return _api().decode_single(buf, out=out, accumulate=accumulate, expect_codec=self.codec_id)

    def default_state(self) -> CodecState:
        """The state :meth:`encode` uses when no ``state=`` is given (one per codec object)."""
        return default_state(self)


_API: Any = None


def install_api(api: Any) -> None:
    """Called once by ``gcodec.api``: the object whose ``encode``/``decode_single`` the facade calls."""
    global _API
    _API = api


def _api() -> Any:
    if _API is None:  # pragma: no cover - gcodec/__init__ imports the api before anything runs
        raise RuntimeError("gcodec.api is not loaded; import gcodec")
    return _API
