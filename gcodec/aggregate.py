"""Summing payloads without decoding them: the summable values of a payload, resealing its CRC, and
:func:`sum_payloads` for whole ``randomk`` payloads.

A *summable* codec (``fp16``, ``bf16``, ``randomk`` with raw or fp16/bf16 values) writes values that
several workers can add elementwise before anyone decodes: same params, same section layout, and the
decoded value is linear in the stored one. Transports reduce those values across ranks (in place,
in the payload's own buffer) and then decode once. This module is the one place that knows which
section of such a payload holds the values and what number type they are, so transports never
parse payload bytes by hand:

>>> import gcodec, numpy as np
>>> from gcodec.aggregate import summable_values, reseal
>>> buf = gcodec.get_codec("fp16").encode(np.ones(4, np.float32))
>>> v = summable_values(buf)          # a writable float16 view into buf
>>> v += v                            # what an allreduce of two workers would leave
>>> reseal(buf)                       # recompute the payload CRC32C over the new values
>>> gcodec.decode(buf).tolist()
[2.0, 2.0, 2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import kernels, xp
from .api import _checked, write_pending
from .arrays import BFLOAT16, DTYPES, dtype_name
from .codecs import compose
from .codecs.base import Aggregation, EncodeContext
from .codecs.randomk import RandomK, value_codec
from .codecs.sparse import decode_values, key_bits, plan_values
from .errors import ConfigError, FormatError, PayloadValueError, SizeMismatchError
from .excerpt import short
from .format.container import PREAMBLE_SIZE, PendingTensor, read_payload
from .limits import get_limits

__all__ = [
    "add_values",
    "count_nonfinite",
    "reseal",
    "round_values",
    "sum_pair",
    "sum_payloads",
    "summable_section",
    "summable_values",
    "values_dtype",
]

# The number type of the stored values of each summable cast codec (their section is raw bits, u2).
_CAST_TYPES = {"fp16": np.dtype(np.float16), "bf16": BFLOAT16}


def _values_section(entry: Any) -> tuple[str, np.dtype]:
    """(section name, number type) of the summable values of one tensor entry, or ConfigError."""
    if entry.codec in _CAST_TYPES:
        return "data", _CAST_TYPES[entry.codec]
    if entry.codec == "randomk":
        nested = entry.params.get("values")
        if nested is None:  # raw values in the tensor's dtype
            return "values", DTYPES[entry.dtype]
        # Only the container is checked here (rules F1-F15), not C1: ``values`` may be anything.
        cid = nested.get("codec") if isinstance(nested, dict) else nested
        if isinstance(cid, str) and cid in _CAST_TYPES:
            return "values.data", _CAST_TYPES[cid]
        raise ConfigError(f"randomk payload with {short(cid)} values is not summable")
    raise ConfigError(f"codec {entry.codec!r} payloads are not summable; gather and decode them instead")


def _single_entry(buf: Any, verify_checksum: bool) -> tuple[Any, Any]:
    p = read_payload(buf, verify_checksum=verify_checksum)
    if p.header.is_bundle or len(p.header.tensors) != 1:
        raise FormatError("summable values: expected a single-tensor payload, not a bundle")
    return p, p.header.tensors[0]


def values_dtype(buf: Any) -> np.dtype:
    """The number type (float16, bfloat16, float32 or float64) of a summable payload's values."""
    _, entry = _single_entry(buf, True)
    return _values_section(entry)[1]


def summable_values(buf: Any, *, verify_checksum: bool = True) -> np.ndarray:
    """A writable, zero-copy 1-D view of the values of a summable single-tensor payload.

    The view has the values' number type (``float16`` for fp16 and fp16-valued randomk, ml_dtypes
    ``bfloat16`` for bf16, the tensor dtype for raw randomk values). The container is checked (with
    its CRC) before the view is handed out. After changing the values, call :func:`reseal`.
    Raises :class:`~gcodec.ConfigError` for payloads whose codec is not summable.
    """
    view, dt = summable_section(buf, verify_checksum=verify_checksum)
    return view.view(dt)


def summable_section(buf: Any, *, verify_checksum: bool = True) -> tuple[Any, np.dtype]:
    """(values, number type) of a summable single-tensor payload: the values a writable zero-copy
    1-D view in the payload's own memory. For a payload in device memory the view is a device view,
    and 16-bit values are held as their uint16 bits (Numba has no bfloat16): pass the number type
    on to :func:`add_values`, :func:`sum_pair`, :func:`round_values`, :func:`count_nonfinite`."""
    p, entry = _single_entry(buf, verify_checksum)
    name, dt = _values_section(entry)
    sec = next((s for s in entry.sections if s.name == name), None)
    if sec is None:
        raise SizeMismatchError(f"C2: the {entry.codec} payload has no section {name!r} for its values")
    if xp.on_device(buf):
        lo = p.data_start + sec.offset
        raw = xp.as_bytes(buf)[lo : lo + sec.nbytes]
        return raw.view(np.uint16 if dt.itemsize == 2 else dt), dt
    view = p.view(sec)
    if not view.flags.writeable:
        raise ConfigError("summable_values needs a writable payload buffer (e.g. the memoryview encode returns)")
    return view.view(dt), dt


def reseal(buf: Any) -> None:
    """Recompute the payload CRC32C of ``buf`` in place after its section data changed.

    The header (and its CRC) is untouched, so only data the header does not describe may have
    changed; the container rules are checked again, except the payload CRC itself. A payload
    written without a payload CRC is left as it is.
    """
    p, _ = _single_entry(buf, False)
    if not p.checksummed:
        return
    b = p.buffer
    n = int(b.shape[0])
    kernels.of(b).memory.crc32c_store(b, PREAMBLE_SIZE + p.header_length, n - 4, n - 4)


def _bits(values: Any, dtype: Any) -> tuple[Any, np.dtype]:
    """(the array, its number type): ``dtype`` names the type when ``values`` holds its bits (device
    memory keeps bfloat16 and float16 values as uint16), else the array's own type is meant."""
    dt = np.dtype(dtype) if dtype is not None else values.dtype
    if dt in (np.float16, BFLOAT16) and values.dtype != np.uint16:
        values = values.view(np.uint16)
    return values, dt


def add_values(values: Any, acc: Any, dtype: Any = None) -> None:
    """``acc += values``, exactly widened: ``acc`` is float32 (float64 for float64 values), 1-D, on
    the memory of ``values`` (host or device). ``dtype``: the values' number type when they are held
    as bits (uint16), as in device memory.

    16-bit values go through gcodec's cast kernels (NumPy's float16 conversion is scalar and about
    ten times slower); the widening is exact, so the result equals ``acc + values.astype(acc.dtype)``.
    """
    if values.shape != acc.shape:
        raise ConfigError(f"add_values: {values.shape} values for an accumulator of {acc.shape}")
    bits, dt = _bits(values, dtype)
    K = kernels.of(acc)
    with K.threads_for(acc.size):
        if dt == np.float16:
            K.cast.decode_f16(bits, acc, True)
        elif dt == BFLOAT16:
            K.cast.decode_bf16(bits, acc, True)
        else:
            xp.add(acc, values)


def round_values(acc: Any, values: Any, dtype: Any = None) -> None:
    """Write ``acc`` into ``values``, rounded once to nearest-even in the values' type (as the fp16
    and bf16 codecs round; beyond the type's range the result is infinite). ``dtype`` as for
    :func:`add_values`."""
    if values.shape != acc.shape:
        raise ConfigError(f"round_values: {acc.shape} sums for {values.shape} values")
    bits, dt = _bits(values, dtype)
    K = kernels.of(acc)
    with K.threads_for(acc.size):
        if dt == np.float16:
            K.cast.encode_f16(acc, bits)
        elif dt == BFLOAT16:
            K.cast.encode_bf16(acc, bits)
        else:
            with np.errstate(over="ignore"):
                xp.copy(values, acc)


def sum_pair(a: Any, b: Any, out: Any, dtype: Any = None) -> int:
    """``out = (0 + a) + b`` for values of one type, added in float32 (float64 for float64) and
    rounded once to the type: bit for bit what :func:`add_values` twice into a zeroed accumulator
    and then :func:`round_values` give (-0 + -0 is +0 there too), in one pass. ``out`` may be ``a``.
    Returns how many results are NaN or infinite (what :func:`count_nonfinite` of ``out`` says).
    ``dtype`` as for :func:`add_values`."""
    if not (a.shape == b.shape == out.shape and a.dtype == b.dtype == out.dtype):
        raise ConfigError(f"sum_pair: {a.dtype}{a.shape} + {b.dtype}{b.shape} into {out.dtype}{out.shape}")
    (ab, dt), (bb, _), (ob, _) = _bits(a, dtype), _bits(b, dtype), _bits(out, dtype)
    K = kernels.of(out)
    with K.threads_for(out.size):
        if dt == np.float16:
            return int(K.cast.sum2_f16(ab, bb, ob))
        if dt == BFLOAT16:
            return int(K.cast.sum2_bf16(ab, bb, ob))
        if isinstance(out, np.ndarray):
            with np.errstate(over="ignore", invalid="ignore"):  # one rounding, as the accumulator's
                np.add(a, out.dtype.type(0), out=out)
            xp.add(out, b)  # a NaN sum is a positive NaN (format.md §10), as on a device
        else:  # +0 first, then a and b: -0 + -0 comes out +0, as on the host
            xp.fill(out, 0)
            xp.add(out, a)
            xp.add(out, b)
    return count_nonfinite(out.reshape(-1), dt)


def count_nonfinite(values: Any, dtype: Any = None) -> int:
    """How many of ``values`` (any of the four float types, 1-D, host or device; ``dtype`` as for
    :func:`add_values`) are NaN or infinite: one pass of the backend's bit-test kernel (NumPy's
    ``isfinite`` converts 16-bit values one by one, and its bit masks build temporaries: 50 ms for
    4 Mi float16 values on the 2-core VM); only the count comes back from a device."""
    dt = np.dtype(dtype) if dtype is not None else values.dtype
    bits, mask, infkey = key_bits(values.reshape(-1).view(_UINT_OF[dt.itemsize]), dtype_name(dt))
    return int(kernels.of(values).sparse.count_nonfinite(bits, mask, infkey))


_UINT_OF = {2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def sum_payloads(payloads: Sequence[Any], *, checksum: bool = True, out: Any = None) -> memoryview:
    """Sum ``randomk`` payloads that share shape, dtype, k, seed and stream, without decoding them.

    The values are added in float64 and written back in the payloads' value form (raw in the
    tensor dtype, or re-encoded by the nested codec, e.g. rounded once to binary16). Decoding the
    result equals the sum of the decodes up to that one rounding. Raises ConfigError when the
    payloads do not share their indices or their value codec is not summable.
    """
    if not payloads:
        raise ConfigError("sum_payloads needs at least one payload")
    first = None
    acc = None
    for buf in payloads:
        p, checked = _checked(buf, None, full=True)
        if p.header.is_bundle or len(checked) != 1:
            raise ConfigError("sum_payloads takes single-tensor randomk payloads")
        e, _, params = checked[0]
        if e.codec != "randomk":
            raise ConfigError(f"sum_payloads takes randomk payloads, not {e.codec!r}")
        ident = (e.shape, e.dtype, params["k"], params["seed"], params["stream"], value_codec(params))
        if first is None:
            first = (e, params, ident)
        elif ident != first[2]:
            raise ConfigError(f"payloads select different indices or value codecs: {ident} vs {first[2]}")
        vals = np.asarray(decode_values(params, e, p.views(e), params["k"]), np.float64)
        acc = vals.copy() if acc is None else acc + vals
    assert first is not None and acc is not None
    e, params, _ = first
    if params["values"] is not None:
        nested = compose.nested_codec_from_config("values", value_codec(params), "randomk")
        assert nested is not None
        if nested.aggregation is not Aggregation.SUMMABLE:
            raise ConfigError(f"value codec {nested.codec_id!r} is not summable")
    else:
        nested = None
    dt = DTYPES[e.dtype]
    with np.errstate(over="ignore"):  # an overflow is refused below, with the payload it would make
        summed = acc.astype(dt)
    idx = np.arange(params["k"], dtype=np.int64)
    vwire, sections, vfill = plan_values(nested, summed, idx, e.dtype, EncodeContext())
    new_params = {**params, "values": vwire}
    pend = PendingTensor("randomk", RandomK.version, e.dtype, e.shape, new_params, sections, vfill)
    result = write_pending([pend], meta=None, checksum=checksum, limits=get_limits(), out=out)
    try:  # the sum of valid payloads may overflow the value type: never hand out an invalid payload
        _checked(result, None, full=True)
    except PayloadValueError as err:
        raise PayloadValueError(f"sum_payloads: the summed values cannot be sent: {err}") from None
    return result
