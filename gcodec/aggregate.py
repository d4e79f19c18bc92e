"""Aggregation of payloads without decoding them: the summable codecs' side of the transports.

Payloads of a *summable* codec (``Aggregation.SUMMABLE``) from several workers can be combined into
one payload whose decode is the sum of theirs, so a receiver decodes once. :func:`sum_payloads`
does it for ``randomk`` payloads that share their indices (same seed and stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .api import _checked, write_pending
from .arrays import DTYPES
from .codecs import compose
from .codecs.base import Aggregation, EncodeContext
from .codecs.randomk import RandomK, value_codec
from .codecs.sparse import decode_values, plan_values
from .errors import ConfigError, PayloadValueError
from .format.container import PendingTensor
from .limits import get_limits

__all__ = ["sum_payloads"]


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
