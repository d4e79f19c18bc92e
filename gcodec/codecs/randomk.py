"""``randomk``: k elements chosen by the spec's generator; only values travel (specs/codecs/randomk.md).

Random-K keeps k elements picked uniformly at random. The indices are not sent: they follow from
``(numel, k, seed, stream)`` through Robert Floyd's sampling algorithm driven by Philox4x32-10
(specs/rng.md), so the payload is the header plus k values, and its size never depends on the data
(steady, predictable traffic). Workers that share ``seed`` and ``stream`` (pass the same ``step``)
pick the same indices, so their payloads can be **summed before decoding**: add the value sections
(:func:`gcodec.sum_payloads`), decode once. With ``values={"id": "fp16"}`` the values travel as binary16
and stay summable; a nested codec with per-payload scales (``uniform``) makes the payload
gather-only.

NaN or infinite input raises :class:`~gcodec.PayloadValueError` (a dropped NaN would otherwise
vanish as zero), and so does an element, drawn or not, that the nested value codec would decode to
±inf (``fp16`` values: ``|x| >= 65520``). Random-K is unbiased only after scaling by numel/k; gcodec
sends the values as they are (the scaled form amplifies noise) and relies on
:class:`gcodec.ErrorFeedback`, as Top-K does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import kernels
from ..arrays import backend_of
from ..arrays import dtype_name as _dtype_name
from ..errors import ConfigError, HeaderError, PayloadValueError
from ..sections import TensorEntry, numel
from . import compose
from .base import Aggregation, EncodeContext, EncodePlan, Param
from .registry import register_codec
from .seeds import SHARED_SEED, STREAM_PARAM
from .sparse import (
    ValuesHost,
    check_nested_values_finite,
    check_ratio_k,
    decode_values,
    expected_values,
    k_for,
    kept_feedback_plan,
    key_bits,
    nested_overflow,
    nested_overflow_key,
    plan_values,
)

__all__ = ["RandomK", "randomk_indices", "value_codec"]

_NONE = type(None)


def randomk_indices(n: int, k: int, seed: int, stream: int, *, backend: str = "cpu") -> Any:
    """The k increasing indices a ``randomk`` payload with these params covers (int64), computed
    by ``backend``'s kernels."""
    if not 0 <= k <= n:
        raise ConfigError(f"randomk: k={k} must lie in [0, numel={n}]")
    K = kernels.get(backend)
    words = K.philox.random_u32(seed, stream, 2 * k) if k < n else np.empty(0, np.uint32)
    out = K.memory.empty(k, np.int64, "randomk indices")
    K.sparse.randomk_indices(n, k, words, out)
    return out


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
        "seed": SHARED_SEED,
        "values": Param((dict, str, _NONE), None, "codec config for the kept values, or None for raw"),
    }
    WIRE = {
        "k": Param(int, 0, "number of kept elements", min=0),
        "seed": SHARED_SEED,
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

    @classmethod
    def wire_schema(cls) -> dict[str, Param]:
        return cls.WIRE

    @classmethod
    def _check_config(cls, params: dict[str, Any], err: type[Exception], where: str) -> None:
        check_ratio_k(params, err, where)

    def k_for(self, n: int) -> int:
        """The number of elements kept from a tensor of ``n`` elements."""
        return k_for(self._params, n)

    def summable_values(self, shape: tuple[int, ...], dtype: Any) -> tuple[int, np.dtype] | None:
        """k values, raw in the tensor's dtype or in the nested cast codec's type (else not summable)."""
        if self.aggregation is not Aggregation.SUMMABLE:
            return None
        got = None if self._nested is None else self._nested.summable_values((1,), dtype)
        return self.k_for(numel(shape)), np.dtype(dtype) if got is None else got[1]

    def plan(self, x: np.ndarray, ctx: EncodeContext) -> EncodePlan:
        return self._plan_drawn(x.reshape(-1), ctx)[0]

    def plan_feedback(self, x: Any, residual: Any, new_residual: Any, ctx: EncodeContext) -> EncodePlan | None:
        """Error feedback without a decode of the whole tensor
        (:func:`gcodec.codecs.sparse.kept_feedback_plan`). The stream is taken once, as the generic
        path takes it."""
        return kept_feedback_plan(self, x, residual, new_residual, lambda c: self._plan_drawn(c, ctx))

    def _plan_drawn(self, flat: np.ndarray, ctx: EncodeContext) -> tuple[EncodePlan, Any]:
        """The plan for ``flat`` and the indices it drew."""
        dname = _dtype_name(flat.dtype)
        n = flat.shape[0]
        k = self.k_for(n)
        # Taken before the input is checked: every call advances the key's counter, refused or not,
        # so workers calling in lockstep keep sharing streams after one of them refused NaN input.
        stream = ctx.take_stream()
        bits, mask, infkey = key_bits(flat, dname)
        K = kernels.of(bits)
        # Elements the nested codec would decode to ±infinity (fp16 beyond its range) break R2, and
        # like NaN they are refused anywhere, drawn or not, so that whether a tensor is refused does
        # not depend on the stream (one counting pass finds both).
        kt = None if self._nested is None else nested_overflow_key(self._nested, dname)
        over = 0
        if kt is None:
            bad = K.sparse.count_nonfinite(bits, mask, infkey)
        else:
            over, bad = K.sparse.count_ge(bits, mask, infkey, bits.dtype.type(kt))
        if bad:
            raise PayloadValueError(
                f"randomk: input has NaN or infinite values ({bad} found); see specs/codecs/randomk.md"
            )
        if over:
            assert self._nested is not None and kt is not None
            raise nested_overflow("randomk", "R2", self._nested, over, "element(s)", kt, dname, ctx.key)
        seed = self._params["seed"]
        idx = randomk_indices(n, k, seed, stream, backend=backend_of(flat))
        vwire, sections, vfill = plan_values(self._nested, flat, idx, dname, ctx)
        params = {"k": k, "seed": seed, "stream": stream, "values": vwire}
        return EncodePlan(params, sections, vfill), idx

    # ---- header ----------------------------------------------------------------------------
    @classmethod
    def expected_sections(
        cls, params: dict[str, Any], shape: tuple[int, ...], dtype: str = "float32"
    ) -> list[tuple[str, str, int]]:
        n = numel(shape)
        if params["k"] > n:
            raise HeaderError(f"R1: k={params['k']} exceeds the tensor's {n} elements")
        return expected_values(params, dtype, params["k"])

    # ---- values -----------------------------------------------------------------------------
    @classmethod
    def _values(cls, params: dict[str, Any], entry: TensorEntry, views: Mapping[str, np.ndarray]) -> np.ndarray:
        vals = decode_values(params, entry, views, params["k"])
        if params["values"] is None:
            bad = kernels.of(vals).sparse.count_nonfinite_values(vals)
            if bad:
                raise PayloadValueError(f"R2: {bad} value(s) are NaN or infinite")
        else:
            check_nested_values_finite(vals, "R2")
        return vals

    @classmethod
    def decode_scratch_bytes(cls, params: dict[str, Any], entry: TensorEntry) -> int:
        """2k random words (uint32) and a bitmap of numel bits (uint64 words) when 0 < k < numel,
        k int64 indices, and the values."""
        k, n = params["k"], entry.numel
        draws = 8 * k + 8 * ((n + 63) // 64) if 0 < k < n else 0
        return draws + 8 * k + cls.values_scratch_bytes(params, entry)

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
        idx = randomk_indices(entry.numel, params["k"], params["seed"], params["stream"], backend=backend_of(out))
        K = kernels.of(out)
        if not accumulate:
            K.memory.zero(out, 0, out.shape[0])
        K.sparse.scatter(idx, vals, out, accumulate)


def value_codec(params: dict[str, Any]) -> dict[str, Any] | None:
    v = params["values"]
    if v is None:
        return None
    return {"id": v["codec"], **v["params"]}
