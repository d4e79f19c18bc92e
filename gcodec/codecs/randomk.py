"""``randomk``: k elements chosen by the spec's generator; only values travel (specs/codecs/randomk.md).

Random-K keeps k elements picked uniformly at random. The indices are not sent: they follow from
``(numel, k, seed, stream)`` through Robert Floyd's sampling algorithm driven by Philox4x32-10
(specs/rng.md), so the payload is the header plus k values, and its size never depends on the data
(steady, predictable traffic). Workers that share ``seed`` and ``stream`` (pass the same ``step``)
pick the same indices, so their payloads can be **summed before decoding**: add the value sections
(:func:`sum_payloads`), decode once. With ``values={"id": "fp16"}`` the values travel as binary16
and stay summable; a nested codec with per-payload scales (``uniform``) makes the payload
gather-only.

NaN or infinite input raises :class:`~gcodec.PayloadValueError` (a dropped NaN would otherwise
vanish as zero). Random-K is unbiased only after scaling by numel/k; gcodec sends the values as they are (the scaled
form amplifies noise) and relies on :class:`gcodec.ErrorFeedback`, as Top-K does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..arrays import DTYPES
from ..arrays import dtype_name as _dtype_name
from ..errors import ConfigError, HeaderError, PayloadValueError
from ..format.container import PendingTensor, TensorEntry, write_payload
from ..kernels import sparse_cpu
from ..rng import random_u32
from . import compose
from .base import Aggregation, EncodeContext, EncodePlan, Param
from .kcount import check_ratio_k, k_for
from .quantizer import SEED_PARAM, STREAM_PARAM, StreamCounter
from .registry import register_codec
from .topk import ValuesHost, check_nested_values_finite, decode_values, expected_values, key_bits, plan_values

__all__ = ["RandomK", "randomk_indices", "sum_payloads"]

_NONE = type(None)


def randomk_indices(numel: int, k: int, seed: int, stream: int) -> np.ndarray:
    """The k increasing indices a ``randomk`` payload with these params covers (int64)."""
    if not 0 <= k <= numel:
        raise ConfigError(f"randomk: k={k} must lie in [0, numel={numel}]")
    words = random_u32(seed, stream, 2 * k) if k < numel else np.empty(0, np.uint32)
    out = np.empty(k, np.int64)
    sparse_cpu.randomk_indices(numel, k, words, out)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@register_codec
class RandomK(ValuesHost):
    """k uniformly random elements, indices regenerated from ``seed`` and ``stream``.

    Parameters:
        ratio: fraction kept, ``k = max(1, floor(ratio * numel))`` (at most numel). Default 0.01.
        k: keep exactly this many instead (capped at numel). Give ``ratio`` or ``k``.
        seed: Philox key (0 .. 2**64-1). All workers must use the same seed for their payloads to
            be summable.
        values: ``None`` (raw, input dtype) or a nested codec config, e.g. ``{"id": "fp16"}``.

    The stream of a call is ``step`` when given (all workers pass the same step), otherwise a
    per-key counter starting at 0, as for the other stochastic codecs. The header records it.
    """

    codec_id = "randomk"
    aggregation = Aggregation.SUMMABLE
    NESTED_ROLES = ("values",)
    PARAMS = {
        "ratio": Param((float, _NONE), 0.01, "fraction of elements kept"),
        "k": Param((int, _NONE), None, "number of elements kept (instead of ratio)"),
        "seed": SEED_PARAM,
        "values": Param((dict, str, _NONE), None, "codec config for the kept values, or None for raw"),
    }
    WIRE = {
        "k": Param(int, 0, "number of kept elements", min=0),
        "seed": SEED_PARAM,
        "stream": STREAM_PARAM,
        "values": Param((dict, _NONE), None, "nested value codec, or nil for raw values"),
    }

    def __init__(self, **params: Any) -> None:
        if params.get("k") is not None and "ratio" not in params:
            params["ratio"] = None
        super().__init__(**params)
        nested = compose.nested_codec_from_config("values", self._params["values"], self.codec_id)
        self._nested = nested
        self._params["values"] = None if nested is None else nested.get_config()
        agg = compose.combined_aggregation(Aggregation.SUMMABLE, nested)
        if agg is not Aggregation.SUMMABLE:
            self.aggregation = agg  # type: ignore[misc]  # per instance: depends on the value codec
        self._streams = StreamCounter()

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return cls.WIRE

    @classmethod
    def _check_config(cls, params: dict[str, Any], err: type[Exception], where: str) -> None:
        check_ratio_k(params, err, where)

    def k_for(self, n: int) -> int:
        """The number of elements kept from a tensor of ``n`` elements."""
        return k_for(self._params, n)

    def next_stream(self, key: str | None = None) -> int:
        """The stream the next encode of ``key`` without ``step=`` will use."""
        return self._streams.peek(key)

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        flat = x.reshape(-1)
        dname = _dtype_name(flat.dtype)
        n = flat.shape[0]
        k = self.k_for(n)
        # Taken before the input is checked: every call advances the key's counter, refused or not,
        # so workers calling in lockstep keep sharing streams after one of them refused NaN input.
        stream = self._streams.take(ctx)
        bits, mask, infkey = key_bits(flat, dname)
        bad = sparse_cpu.count_nonfinite(bits, mask, infkey)
        if bad:
            raise PayloadValueError(
                f"randomk: input has NaN or infinite values ({bad} found); see specs/codecs/randomk.md"
            )
        seed = self._params["seed"]
        idx = randomk_indices(n, k, seed, stream)
        vwire, sections, vfill = plan_values(self._nested, flat, idx, dname, ctx)
        params = {"k": k, "seed": seed, "stream": stream, "values": vwire}
        return EncodePlan(params, sections, vfill)

    # ---- header ----------------------------------------------------------------------------
    @classmethod
    def expected_sections(
        cls, params: dict[str, Any], shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[tuple[str, str, int]]:
        n = _numel(shape)
        if params["k"] > n:
            raise HeaderError(f"R1: k={params['k']} exceeds the tensor's {n} elements")
        return expected_values(params, dtype, params["k"])

    # ---- values -----------------------------------------------------------------------------
    @classmethod
    def _values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        vals = decode_values(params, entry, views, params["k"])
        if params["values"] is None:
            bad = sparse_cpu.count_nonfinite_values(vals)
            if bad:
                raise PayloadValueError(f"R2: {bad} value(s) are NaN or infinite")
        else:
            check_nested_values_finite(vals, "R2")
        return vals

    @classmethod
    def decode_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """2k random words (uint32), k int64 indices, and the values."""
        k = params["k"]
        words = 8 * k if k < entry.numel else 0
        return words + 8 * k + cls.values_scratch_bytes(params, entry)

    @classmethod
    def check_values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> None:
        compose.check_role_values(params, "values", entry, views, params["k"])
        cls._values(params, entry, views)

    @classmethod
    def decode_into(
        cls,
        params: dict[str, Any],
        entry: TensorEntry,
        views: Mapping[str, np.ndarray],
        out: np.ndarray,
        accumulate: bool,
    ) -> None:
        vals = cls._values(params, entry, views)  # every check before ``out`` is touched
        idx = randomk_indices(entry.numel, params["k"], params["seed"], params["stream"])
        if not accumulate:
            out[:] = 0
        sparse_cpu.scatter(idx, vals, out, accumulate)


def sum_payloads(payloads: Sequence[Any], *, checksum: bool = True) -> memoryview:
    """Sum ``randomk`` payloads that share shape, dtype, k, seed and stream, without decoding them.

    The values are added in float64 and written back in the payloads' value form (raw in the
    tensor dtype, or re-encoded by the nested codec, e.g. rounded once to binary16). Decoding the
    result equals the sum of the decodes up to that one rounding. Raises ConfigError when the
    payloads do not share their indices or their value codec is not summable.
    """
    from ..api import _checked

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
        ident = (e.shape, e.dtype, params["k"], params["seed"], params["stream"], _value_codec(params))
        if first is None:
            first = (e, params, ident)
        elif ident != first[2]:
            raise ConfigError(f"payloads select different indices or value codecs: {ident} vs {first[2]}")
        vals = np.asarray(decode_values(params, e, p.views(e), params["k"]), np.float64)
        acc = vals.copy() if acc is None else acc + vals
    assert first is not None and acc is not None
    e, params, _ = first
    if params["values"] is not None:
        nested = compose.nested_codec_from_config("values", _value_codec(params), "randomk")
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
    out = write_payload([pend], checksum=checksum)
    try:  # the sum of valid payloads may overflow the value type: never hand out an invalid payload
        _checked(out, None, full=True)
    except PayloadValueError as err:
        raise PayloadValueError(f"sum_payloads: the summed values cannot be sent: {err}") from None
    return out


def _value_codec(params: dict[str, Any]) -> dict[str, Any] | None:
    v = params["values"]
    if v is None:
        return None
    return {"id": v["codec"], **v["params"]}
