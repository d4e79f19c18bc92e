"""Encode, decode and validate whole payloads: the layer that joins the lower ones.

:mod:`gcodec.arrays` takes user tensors in and names their backend, :mod:`gcodec.kernels` picks that
backend's kernels, a :class:`~gcodec.codecs.base.Codec` turns arrays into sections (with the
caller's :class:`~gcodec.CodecState`), and :mod:`gcodec.format` turns sections into bytes (and back,
with every check of specs/format.md). Everything that writes a payload ends in :func:`write_pending`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from . import alloc, kernels
from .arrays import DTYPES, backend_of, dtype_name, intake
from .codecs import base as _codec_base
from .codecs.base import Codec, EncodeContext, EncodePlan
from .codecs.registry import codec_class, get_codec
from .codecs.state import CodecState
from .errors import BufferTooSmallError, ConfigError, FormatError, UnsupportedVersionError
from .excerpt import short
from .format.container import (
    MAJOR,
    MINOR,
    ParsedPayload,
    PendingTensor,
    TensorEntry,
    read_payload,
    write_payload,
)
from .limits import Limits, get_limits
from .out_buffer import flat_out, refuse_overlaps
from .resources import check_pending_resources, check_resources, staging_bytes
from .sections import numel

__all__ = [
    "PayloadInfo",
    "TensorInfo",
    "decode",
    "decode_bundle",
    "encode",
    "encode_bundle",
    "pending_from_plan",
    "validate",
    "write_pending",
]


# --------------------------------------------------------------------------------------------
# encoding


_F = TypeVar("_F", bound=Callable[..., Any])


def _memory_is_a_limit(fn: _F) -> _F:
    """Run ``fn`` so that running out of memory anywhere inside it (a buffer, the first load of a
    kernel from Numba's cache in a fresh process, a header's objects) is a
    :class:`~gcodec.LimitExceededError`, never a ``MemoryError`` (specs/format.md §9)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MemoryError:
            raise alloc.out_of_memory(f"gcodec.{fn.__name__} (its buffers, or its kernels' first load)") from None

    return wrapper  # type: ignore[return-value]


def _pending(codec: Codec, x: Any, name: str | None, lim: Limits, ctx: EncodeContext) -> PendingTensor:
    arr = intake(x)
    dtype_name(arr.dtype)  # ConfigError for dtypes the wire format does not know
    lim.check_ndim(len(arr.shape))
    lim.check("element count", numel(arr.shape), "max_elements")
    K = kernels.get(arr.backend)
    x = K.view(arr.array)  # the backend's own array type (a NumPy array, a Numba device array), no copy
    with K.threads_for(x.size):
        plan = codec.plan(x, ctx)
    return pending_from_plan(codec, x, plan, name)


def pending_from_plan(codec: Codec, arr: np.ndarray, plan: EncodePlan, name: str | None = None) -> PendingTensor:
    """The tensor record the writer lays out for ``plan`` (made by ``codec`` from ``arr``)."""
    fill = plan.fill
    K = kernels.of(arr)

    def fill_sized(views: Mapping[str, np.ndarray]) -> None:
        with K.threads_for(arr.size):  # small tensors stay on the calling thread
            fill(views)

    return PendingTensor(
        codec.codec_id,
        codec.version,
        dtype_name(arr.dtype),
        tuple(int(d) for d in arr.shape),
        plan.params,
        plan.sections,
        fill_sized,
        name,
        backend_of(arr),
    )


def _into(out: Any) -> Callable[[int], np.ndarray] | None:
    """The payload allocator for ``encode(..., out=buf)``: the first bytes of a writable buffer."""
    if out is None:
        return None
    if backend_of(out) != "cpu":  # a device send buffer: the payload is written in device memory
        dev = kernels.of(out).view(out)
        if dev.dtype != np.uint8 or dev.ndim != 1:
            raise ConfigError("a device out= must be a flat uint8 device array")

        def alloc_device(nbytes: int) -> Any:
            if nbytes > dev.shape[0]:
                raise BufferTooSmallError(f"out= holds {dev.shape[0]} bytes; this payload needs {nbytes}", nbytes)
            return dev[:nbytes]

        return alloc_device
    try:
        mem = np.frombuffer(out, dtype=np.uint8) if not isinstance(out, np.ndarray) else out
    except (TypeError, ValueError) as e:
        raise ConfigError(f"out= must be a writable bytes-like buffer: {e}") from None
    if mem.dtype != np.uint8 or mem.ndim != 1 or not mem.flags.c_contiguous or not mem.flags.writeable:
        raise ConfigError("out= must be a writable, C-contiguous 1-D uint8 buffer (bytearray, numpy uint8 array)")

    def alloc(nbytes: int) -> np.ndarray:
        if nbytes > mem.shape[0]:
            raise BufferTooSmallError(f"out= holds {mem.shape[0]} bytes; this payload needs {nbytes}", nbytes)
        return mem[:nbytes]

    return alloc


def write_pending(
    pend: list[PendingTensor],
    *,
    meta: Mapping[str, str] | None,
    checksum: bool,
    limits: Limits,
    out: Any = None,
) -> memoryview:
    """Lay out and fill the payload of ``pend``, in ``out`` when given (every encode ends here).

    A sender refuses what its peers' default limits would refuse (decode work, scratch memory)."""
    check_pending_resources(pend, limits)
    return write_payload(pend, meta=meta, checksum=checksum, limits=limits, alloc=_into(out))


@_memory_is_a_limit
def encode(
    x: Any,
    codec: Codec | str | dict[str, Any],
    *,
    key: str | None = None,
    step: int | None = None,
    state: CodecState | None = None,
    checksum: bool = True,
    meta: Mapping[str, str] | None = None,
    out: Any = None,
    limits: Limits | None = None,
) -> memoryview:
    """Encode one tensor into a complete, self-describing payload.

    Args:
        x: any array gcodec takes in (:func:`gcodec.arrays.intake`).
        codec: a codec, its id, or its config dict.
        key, step: see :class:`~gcodec.codecs.base.EncodeContext` (stateful and stochastic codecs).
        state: the :class:`~gcodec.CodecState` that holds per-key streams and warm starts; default
            the codec object's own (:meth:`Codec.default_state`).
        checksum: ``False`` drops the payload CRC32C (the header CRC stays) for trusted paths.
        out: a writable byte buffer (bytearray, uint8 array) to write the payload into, from its
            first byte; the result is a view of it. Reusing one send buffer across steps avoids the
            page faults a fresh buffer costs (they halve the speed of the fastest codecs).
    """
    c = get_codec(codec)
    st = c.default_state() if state is None else state
    lim = limits or get_limits()
    pend = _pending(c, x, None, lim, EncodeContext(key, step, st))
    return write_pending([pend], meta=meta, checksum=checksum, limits=lim, out=out)


@_memory_is_a_limit
def encode_bundle(
    tensors: Mapping[str, Any],
    codec: Codec | str | Mapping[str, Codec | str] = "fp16",
    *,
    step: int | None = None,
    state: CodecState | Mapping[str, CodecState] | None = None,
    checksum: bool = True,
    meta: Mapping[str, str] | None = None,
    out: Any = None,
    limits: Limits | None = None,
) -> memoryview:
    """Encode several named tensors into one payload with one header.

    ``codec`` is one codec for all, or a mapping from tensor name to codec (missing names raise).
    The order of ``tensors`` is the order on the wire. Each tensor's name is its state ``key``;
    ``state`` is one state for all, a mapping from name to state, or None (each codec object's own).
    """
    lim = limits or get_limits()
    if not tensors:
        raise ConfigError("encode_bundle needs at least one tensor")
    pend = []
    for name, x in tensors.items():
        if not isinstance(name, str):
            raise ConfigError(f"bundle tensor names must be strings, got {name!r}")
        if isinstance(codec, Mapping):
            if name not in codec:
                raise ConfigError(f"no codec given for bundle tensor {name!r}")
            c = get_codec(codec[name])
        else:
            c = get_codec(codec)
        st = state.get(name) if isinstance(state, Mapping) else state
        pend.append(_pending(c, x, name, lim, EncodeContext(name, step, c.default_state() if st is None else st)))
    return write_pending(pend, meta=meta, checksum=checksum, limits=lim, out=out)


# --------------------------------------------------------------------------------------------
# inspection


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """What one tensor record of a payload declares."""

    name: str | None
    codec: str
    codec_version: int
    shape: tuple[int, ...]
    dtype: np.dtype
    params: dict[str, Any]
    sections: tuple[tuple[str, str, int, int], ...]  # name, element type, offset, nbytes

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def original_nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class PayloadInfo:
    """The result of :func:`validate`: what a payload holds, after every check passed.

    For a single-tensor payload ``codec``, ``shape``, ``dtype`` and ``params`` describe that
    tensor; for a bundle they are those of the first tensor and ``tensors`` lists them all.
    """

    version: tuple[int, int]
    nbytes: int
    header_nbytes: int
    checksum: bool
    is_bundle: bool
    tensors: tuple[TensorInfo, ...]
    meta: dict[str, str]

    @property
    def codec(self) -> str:
        return self.tensors[0].codec

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensors[0].shape

    @property
    def dtype(self) -> np.dtype:
        return self.tensors[0].dtype

    @property
    def params(self) -> dict[str, Any]:
        return self.tensors[0].params

    @property
    def original_nbytes(self) -> int:
        return sum(t.original_nbytes for t in self.tensors)

    @property
    def ratio(self) -> float:
        """Original bytes over payload bytes (higher is better)."""
        return self.original_nbytes / self.nbytes

    @property
    def bits_per_element(self) -> float:
        n = sum(t.numel for t in self.tensors)
        return 8.0 * self.nbytes / n if n else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": f"{self.version[0]}.{self.version[1]}",
            "nbytes": self.nbytes,
            "header_nbytes": self.header_nbytes,
            "checksum": self.checksum,
            "bundle": self.is_bundle,
            "original_nbytes": self.original_nbytes,
            "ratio": self.ratio,
            "bits_per_element": self.bits_per_element,
            "meta": self.meta,
            "tensors": [
                {
                    "name": t.name,
                    "codec": t.codec,
                    "codec_version": t.codec_version,
                    "shape": list(t.shape),
                    "dtype": dtype_name(t.dtype),
                    "params": t.params,
                    "sections": [{"name": s[0], "dtype": s[1], "offset": s[2], "nbytes": s[3]} for s in t.sections],
                }
                for t in self.tensors
            ],
        }


def _checked(
    buf: Any, limits: Limits | None, *, full: bool
) -> tuple[ParsedPayload, list[tuple[TensorEntry, type[Codec], dict[str, Any]]]]:
    lim = limits or get_limits()
    p = read_payload(buf, limits=lim)
    strict = p.minor <= MINOR
    out = []
    work = 0
    for i, e in enumerate(p.header.tensors):
        cls = codec_class(e.codec)
        where = f"tensors[{i}]"
        if e.version > cls.version:
            raise UnsupportedVersionError(
                f"C0: {where} uses {e.codec!r} codec version {e.version}; this reader knows up to {cls.version}"
            )
        if e.version < 1:
            raise UnsupportedVersionError(f"C0: {where} codec version {e.version} does not exist")
        params = cls.check_entry(e, where, strict=strict)
        check_resources(cls, params, e, lim, where)
        work += cls.decode_work(params, e)
        lim.check("decode work (multiply-adds)", work, "max_decode_work", where)
        if full:
            cls.check_values(params, e, _reader_views(p, e, cls, None))
        out.append((e, cls, params))
    return p, out


def _reader_views(p: ParsedPayload, e: TensorEntry, cls: type[Codec], out: Any) -> Mapping[str, Any]:
    """The sections a codec checks and decodes from: views of the payload where it lies, unless it
    lies on a device and either the codec cannot check device sections (``device_checks``) or the
    output is in host memory; then one host copy of the entry's sections (docs/gpu.md)."""
    if p.on_host or (cls.device_checks and (out is None or backend_of(out) != "cpu")):
        return p.views(e)
    return p.host_views(e)


def _info(p: ParsedPayload) -> PayloadInfo:
    return PayloadInfo(
        version=(MAJOR, p.minor),
        nbytes=int(p.buffer.shape[0]),
        header_nbytes=p.header_length,
        checksum=p.checksummed,
        is_bundle=p.header.is_bundle,
        tensors=tuple(
            TensorInfo(
                e.name,
                e.codec,
                e.version,
                e.shape,
                DTYPES[e.dtype],
                dict(e.params),
                tuple((s.name, s.dtype, s.offset, s.nbytes) for s in e.sections),
            )
            for e in p.header.tensors
        ),
        meta=p.header.meta,  # the parsed map itself: the parsed payload is not kept
    )


@_memory_is_a_limit
def validate(buf: Any, *, limits: Limits | None = None) -> PayloadInfo:
    """Run every structural and semantic check of the spec; return what the payload declares.

    Raises a :class:`~gcodec.GcodecError` subclass naming the first broken rule.
    """
    p, _ = _checked(buf, limits, full=True)
    return _info(p)


@_memory_is_a_limit
def inspect_header(buf: Any, *, limits: Limits | None = None, verify_checksum: bool = True) -> PayloadInfo:
    """Check only the container (not codec rules or values) and describe it. Used by ``gcodec inspect``.

    ``verify_checksum=False`` skips the payload CRC (rule F14), to describe a damaged payload.
    """
    return _info(read_payload(buf, limits=limits, verify_checksum=verify_checksum))


# --------------------------------------------------------------------------------------------
# decoding

_KERNEL_OUT = (np.dtype(np.float32), np.dtype(np.float64))


def _label(e: TensorEntry) -> str:
    """How an allocation names its tensor: the bundle name, or the codec and shape."""
    return short(e.name, 60) if e.name is not None else f"({e.codec}, {e.dtype}, shape {list(e.shape)})"


def _decode_entry(
    p: ParsedPayload,
    e: TensorEntry,
    cls: type[Codec],
    params: dict[str, Any],
    out: np.ndarray | None,
    accumulate: bool,
) -> np.ndarray:
    dtype = DTYPES[e.dtype]
    if out is None:
        if accumulate:
            raise ConfigError("accumulate=True needs out=")
        result = alloc.empty(f"the decoded tensor {_label(e)}", e.shape, dtype)
        flat = result.reshape(-1)
    else:
        flat = flat_out(out, e.numel, e.shape)
        if p.on_host:  # device memory never overlaps host bytes
            refuse_overlaps(p.buffer, [("out=", flat)])
        result = out
    views = _reader_views(p, e, cls, flat)
    with kernels.of(flat).threads_for(flat.size):
        if flat.dtype in _KERNEL_OUT:
            cls.decode_into(params, e, views, flat, accumulate)
        else:  # 16-bit outputs: decode in float32, then round once into the output
            if out is not None:  # the header's dtype was accounted for; out= may differ
                get_limits().check(
                    "decode scratch bytes",
                    cls.decode_scratch_bytes(params, e) + staging_bytes(e.numel, flat.dtype),
                    "max_scratch_bytes",
                )
            tmp = alloc.empty(f"the float32 staging buffer of {_label(e)}", flat.size, np.float32)
            if accumulate:
                tmp[...] = flat
            cls.decode_into(params, e, views, tmp, accumulate)
            flat[...] = tmp
    return result


@_memory_is_a_limit
def decode(
    buf: Any,
    out: np.ndarray | Mapping[str, np.ndarray] | None = None,
    *,
    accumulate: bool = False,
    limits: Limits | None = None,
) -> np.ndarray | dict[str, np.ndarray]:
    """Decode a payload; the codec and its params come from the header.

    A single-tensor payload gives an array of the original dtype and shape; a bundle gives a dict
    from name to array. ``out`` (an array, or for bundles a dict of arrays) receives the result;
    with ``accumulate=True`` the decoded values are *added* to ``out`` without a temporary, so
    summing N workers' payloads costs one pass each. Every container, header and
    section-size check runs before ``out`` is touched; with ``accumulate=True`` every value check
    runs first too, so a bad payload never half-updates a sum (for a bundle: no entry of ``out`` is
    touched unless every tensor and every ``out`` entry passed). ``out`` must be exactly what the
    kernels write: a C-contiguous, aligned, writeable, native-endian array of the tensor's element
    count (an ndarray subclass such as ``np.matrix`` is written through a plain view of its memory)
    that does not overlap the payload's bytes; anything else raises :class:`~gcodec.ConfigError`.
    Without ``accumulate``, a value rule that a kernel checks while it decodes (e.g. a forbidden
    uniform code) may raise after ``out`` was partly overwritten.
    """
    p, checked = _checked(buf, limits, full=False)
    if not p.header.is_bundle:
        if isinstance(out, Mapping):
            raise ConfigError("out= is a dict but the payload holds a single tensor")
        e, cls, params = checked[0]
        return _decode_entry(p, e, cls, params, out, accumulate)
    if out is not None and not isinstance(out, Mapping):
        raise ConfigError("out= must be a dict of arrays for a bundle payload")
    return _decode_many(p, checked, out, accumulate)


@_memory_is_a_limit
def decode_single(buf: Any, *, out: np.ndarray | None, accumulate: bool, expect_codec: str | None = None) -> np.ndarray:
    p, checked = _checked(buf, None, full=False)
    if p.header.is_bundle:
        raise FormatError("payload is a bundle; use gcodec.decode_bundle")
    e, cls, params = checked[0]
    if expect_codec is not None and e.codec != expect_codec:
        raise ConfigError(f"payload was written by codec {e.codec!r}, not {expect_codec!r}")
    return _decode_entry(p, e, cls, params, out, accumulate)


@_memory_is_a_limit
def decode_bundle(
    buf: Any,
    out: Mapping[str, np.ndarray] | None = None,
    *,
    accumulate: bool = False,
    limits: Limits | None = None,
) -> dict[str, np.ndarray]:
    """Decode any payload into ``{name: array}``; a single-tensor payload's name is ``""``."""
    p, checked = _checked(buf, limits, full=False)
    return _decode_many(p, checked, out, accumulate)


def _decode_many(
    p: ParsedPayload,
    checked: list[tuple[TensorEntry, type[Codec], dict[str, Any]]],
    out: Mapping[str, np.ndarray] | None,
    accumulate: bool,
) -> dict[str, np.ndarray]:
    if out is not None and not isinstance(out, Mapping):
        raise ConfigError("out= must be a dict of arrays for decode_bundle")
    # The whole bundle is checked before any output is touched: every out= entry (present, of the
    # right size and kind, not overlapping the payload or each other), and with accumulate=True every
    # value rule of every tensor, so that a bad tensor "b" never leaves tensor "a" already summed.
    targets: list[tuple[str, np.ndarray | None]] = []
    flats: list[tuple[str, np.ndarray]] = []
    for e, _, _ in checked:
        name = e.name if e.name is not None else ""
        o = out.get(name) if out is not None else None
        if accumulate and o is None:
            raise ConfigError(f"accumulate=True needs out[{name!r}]")
        if o is not None:
            flats.append((f"out[{name!r}]", flat_out(o, e.numel, e.shape, f"out[{name!r}]")))
        targets.append((name, o))
    if p.on_host:
        refuse_overlaps(p.buffer, flats)
    if accumulate:
        for (e, cls, params), (_, o) in zip(checked, targets):
            cls.check_values(params, e, _reader_views(p, e, cls, o))
    result = {}
    for (e, cls, params), (name, o) in zip(checked, targets):
        result[name] = _decode_entry(p, e, cls, params, o, accumulate)
    return result


# ``codec.encode(x)`` / ``codec.decode(buf)`` are facades over this module; codecs do not import it.
_codec_base.install_api(sys.modules[__name__])
