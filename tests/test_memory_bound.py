"""The memory bound of docs/limits.md ("Memory while decoding"), measured with tracemalloc.

``gcodec.resources.memory_bound(payload)`` is the one statement of what ``inspect_header``,
``validate`` and ``decode`` may allocate; the fuzz oracle (tests/codec_kit.py ``check_payload``) holds
every input to it. Here it is measured on the costliest valid payloads found: per codec, k = numel
sparse payloads with 16-bit outputs and nested values, PowerSGD with widened factors, and headers
whose Python objects cost the most per byte (bundles of thousands of empty tensors, maps of short
strings under a newer minor, floods of one-entry maps). Each bound must hold, and be tight enough
to mean something: on the worst cases the peak reaches most of it.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.arrays import BFLOAT16
from gcodec.resources import CONTAINER_COST, HEADER_BYTE_COST, MEMORY_SLACK, memory_bound
from tests.codec_kit import _calls, _peak, declaring, parse_payload, rebuild, serial_kernels


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


SIGN = {"codec": "sign", "params": {"group_size": 256}, "version": 1}
FP16 = {"codec": "fp16", "params": {}, "version": 1}
N = 1 << 22
ANY_RATE = {"min_compression_rate": 0.0}
_TWO = ["".join(p) for p in itertools.product(map(chr, range(128)), repeat=2)]
_KEYS = _TWO + ["".join(p) for p in itertools.product(map(chr, range(32, 127)), repeat=3)]  # 2-3 chars


def _fp16_header() -> tuple[dict[str, Any], bytes]:
    return parse_payload(bytes(gcodec.get_codec("fp16").encode(np.ones(4, np.float32))))


def _with(minor: int = 0, **top: Any) -> bytes:
    h, data = _fp16_header()
    return rebuild({**h, **top}, data, minor=minor)


def _params_of_short_strings() -> bytes:
    h, data = _fp16_header()
    t = {**h["tensors"][0], "params": {k: "a" for k in _KEYS[:45_000]}}  # ignored under minor 1
    return rebuild({**h, "tensors": [t]}, data, minor=1)


#: name -> (payload maker, the least fraction of the bound the costliest call must reach, or None)
CASES: dict[str, tuple[Any, float | None]] = {
    # the two reported cases: a bf16 topk of 2**24 elements (k = numel, 1-bit nested values: a
    # 2.5 MiB payload decoding through 128 MiB of indices, 64 MiB of values and a 64 MiB staging
    # buffer) and a bundle of 12 000 empty fp16 tensors (a 1 MiB header)
    "topk bf16 2**24 k=numel sign": (
        lambda: declaring("topk", [1 << 24], "bfloat16", {"k": 1 << 24, "index_bytes": 0, "values": SIGN}),
        0.95,
    ),
    "bundle of 12000 empty fp16": (
        lambda: gcodec.encode_bundle({f"t{i}": np.ones(0, np.float32) for i in range(12000)}, "fp16"),
        0.65,
    ),
    "fp16 f32": (lambda: gcodec.get_codec("fp16").encode(np.ones(N, np.float32)), 0.9),
    "bf16 bf16": (lambda: gcodec.get_codec("bf16").encode(np.ones(N, BFLOAT16)), 0.9),
    "uniform group_size 1": (lambda: declaring("uniform", [N], "float32", None, group_size=1), 0.9),
    "uniform 4-bit f16": (lambda: declaring("uniform", [N], "float16", None, bits=4), 0.9),
    "qsgd f64": (lambda: declaring("qsgd", [N], "float64"), 0.9),
    "terngrad bf16": (lambda: declaring("terngrad", [N], "bfloat16"), 0.9),
    "sign group_size 1": (lambda: declaring("sign", [N], "float32", None, group_size=1), 0.9),
    "topk f32 k=numel raw": (lambda: declaring("topk", [N], "float32", {"k": N, "index_bytes": 0}), 0.9),
    "topk f64 k=numel sign": (
        lambda: declaring("topk", [N], "float64", {"k": N, "index_bytes": 0, "values": SIGN}),
        0.9,
    ),
    "threshold f16 k=numel raw": (
        lambda: declaring("threshold", [N], "float16", {"k": N, "threshold": 0.0, "index_bytes": 0}),
        0.9,
    ),
    "randomk bf16 k=numel-1 raw": (lambda: declaring("randomk", [N], "bfloat16", {"k": N - 1}), 0.9),
    "randomk f32 k=numel-1 fp16": (
        lambda: declaring("randomk", [N], "float32", {"k": N - 1, "values": FP16}),
        0.9,
    ),
    # PowerSGD's counted scratch, 16 (m + n) rank + 8 max(n, 65536), is an over-count (specs/format.md
    # §9): the bound holds with room to spare, so no tightness is asserted
    "powersgd f64 rank 64": (lambda: declaring("powersgd", [1 << 16, 64], "float64", {"rank": 64}, **ANY_RATE), None),
    "powersgd bf16 sign factors": (
        lambda: declaring("powersgd", [1 << 16, 64], "bfloat16", {"rank": 64, "p": SIGN, "q": SIGN}, **ANY_RATE),
        None,
    ),
    # headers whose Python objects cost the most per byte, at a quarter of max_header_bytes (their cost
    # grows linearly, and tracemalloc makes parsing a million small objects slow), where the 1 MiB of
    # MEMORY_SLACK is a larger share of the bound
    "meta of 2-3 character keys": (lambda: _with(meta={k: "ab" for k in _KEYS[:40_000]}), 0.5),
    "minor 1: params of 2-3 character keys": (_params_of_short_strings, 0.8),
    "minor 1: one-entry maps": (lambda: _with(1, x_future=[{"ab": 1} for _ in range(40_000)]), 0.6),
    "minor 1: 2-character strings": (lambda: _with(1, x_future=[_TWO[i % 16384] for i in range(90_000)]), 0.4),
}


#: Measured through validate and decode only, the two calls that build the most (PayloadInfo; the
#: outputs): each measured call of a 12 000-record bundle takes seconds under tracemalloc.
ONLY_VALIDATE_AND_DECODE = {"bundle of 12000 empty fp16"}


@pytest.mark.parametrize("name", list(CASES))
def test_every_call_stays_within_the_memory_bound(name):
    make, tight = CASES[name]
    b = bytes(make())
    gcodec.validate(b)  # valid, within the default limits
    bound = memory_bound(b)
    gcodec.decode(b)  # warm up: kernels compiled, imports done
    peaks = {}
    for label, fn in _calls(b):
        if name in ONLY_VALIDATE_AND_DECODE and label not in ("validate", "decode"):
            continue
        peaks[label] = _peak(fn)
        if peaks[label] > bound:  # as the fuzz oracle does: once more, in case of a one-time cost
            peaks[label] = _peak(fn)
        assert peaks[label] <= bound, f"{label}: peak {peaks[label]} > bound {bound}"
    if tight is not None:
        assert max(peaks.values()) >= tight * bound, f"the bound {bound} is loose: peaks {peaks}"


def test_the_bound_is_the_documented_formula():
    """decoded bytes + largest scratch + HEADER_BYTE_COST x H + CONTAINER_COST x C + MEMORY_SLACK."""
    from gcodec.api import _checked
    from gcodec.resources import scratch_bytes

    b = bytes(
        gcodec.encode_bundle(
            {"a": np.ones(1000, BFLOAT16), "b": np.ones((64, 64), np.float32)},
            {"a": gcodec.get_codec("topk", ratio=0.5), "b": gcodec.get_codec("uniform")},
        )
    )
    p, checked = _checked(b, None, full=False)
    out = sum(e.numel * gcodec.arrays.DTYPES[e.dtype].itemsize for e, _, _ in checked)
    scratch = max(scratch_bytes(cls, params, e) for e, cls, params in checked)
    containers = 1 + 1 + 2 * (1 + 1 + 1 + 1)  # top map, tensors; per record: map, shape, params, sections
    containers += 3 + 2  # section entries: topk's three, uniform's two
    want = out + scratch + HEADER_BYTE_COST * p.header_length + CONTAINER_COST * containers + MEMORY_SLACK
    assert memory_bound(b) == want


def test_a_refused_payload_is_bounded_by_what_comes_before_the_refusal():
    """Records that fail their rules allocate nothing; outputs come only after every record passes."""
    good = bytes(gcodec.get_codec("fp16").encode(np.ones(N, np.float32)))
    h, data = parse_payload(good)
    h["tensors"][0]["params"]["x"] = 1  # C1: unknown parameter
    bad = rebuild(h, data)
    with pytest.raises(gcodec.HeaderError):
        gcodec.decode(bad)
    assert memory_bound(bad) < MEMORY_SLACK + (64 << 10)
    assert memory_bound(good) > MEMORY_SLACK + 4 * N  # the decoded float32 tensor
    assert memory_bound(b"not a payload") == MEMORY_SLACK
