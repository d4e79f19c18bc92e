"""Limits (docs/limits.md): a huge shape is refused before any allocation.

Every field of :class:`gcodec.Limits` is enforced on decode (a peer's payload) and on encode (so a
sender cannot produce what its peers would refuse), through both ``gcodec.scoped_limits(...)`` and the
``limits=`` argument. A header declaring an absurd size is refused with ``LimitExceededError`` while
the traced allocation stays tiny.
"""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

import gcodec
from gcodec import LimitExceededError, Limits
from gcodec.limits import MAX_NESTING_CAP
from tests.codec_kit import encode_case, parse_payload, rebuild, serial_kernels, usable_cases


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


SMALL_PEAK = 256 * 1024  # bytes: parsing a ~200-byte header, nowhere near the declared sizes


def _fp16_payload(shape: list[int], dtype: str = "float32", *, nbytes: int | None = None) -> bytes:
    """A fp16 payload whose header declares ``shape``; its section length says ``nbytes`` (default: 8)."""
    b = bytes(gcodec.get_codec("fp16").encode(np.ones(4, np.float32)))
    h, data = parse_payload(b)
    t = h["tensors"][0]
    t["shape"], t["dtype"] = shape, dtype
    if nbytes is not None:
        t["sections"][0][3] = nbytes
        h["data_length"] = (nbytes + 7) // 8 * 8
        if nbytes <= len(data):
            data = data[:nbytes] + bytes(h["data_length"] - nbytes)
    return rebuild(h, data)


def _peak(fn) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        err = None
    except Exception as e:
        err = e
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak


HUGE = [
    ("2**40 elements", [1 << 40], None),
    ("2**40 elements, matching section", [1 << 40], 1 << 41),
    ("2**20 x 2**20", [1 << 20, 1 << 20], None),
    ("one huge dimension, zero elements", [1 << 40, 0], None),
    ("2**34 float64 = 128 GiB output", [1 << 34], None),
    ("many dimensions", [2] * 33, None),
]


@pytest.mark.parametrize("label,shape,nbytes", HUGE, ids=[h[0] for h in HUGE])
@pytest.mark.parametrize("fn", ["decode", "validate", "inspect_header"])
def test_huge_declared_shape_is_refused_before_allocating(label, shape, nbytes, fn):
    dtype = "float64" if "float64" in label else "float32"
    b = _fp16_payload(shape, dtype, nbytes=nbytes)
    f = getattr(gcodec.api, fn)
    f(_fp16_payload([4]))  # warm up imports and JIT
    err, peak = _peak(lambda: f(b))
    assert isinstance(err, LimitExceededError), f"{label}: {err!r}"
    assert peak < SMALL_PEAK, f"{label}: {peak} bytes allocated before the refusal"


def test_limit_messages_name_the_field_and_limit():
    with pytest.raises(LimitExceededError, match=r"max_elements.*tensors\[0\]\.shape"):
        gcodec.decode(_fp16_payload([1 << 40]))


def _topk_declaring(shape: list[int], dtype: str = "float32") -> bytes:
    """A ~200-byte topk payload with k = 0 whose header declares ``shape``."""
    b = bytes(gcodec.get_codec("topk", k=0).encode(np.ones(4, np.float32)))
    h, data = parse_payload(b)
    t = h["tensors"][0]
    t["shape"], t["dtype"] = shape, dtype
    t["sections"][-1][1] = {"float32": "f4", "float64": "f8", "float16": "f2", "bfloat16": "u2"}[dtype]
    return rebuild(h, data)


def test_default_limits_admit_realistic_tensors():
    """The defaults serve a receiver of untrusted payloads (docs/limits.md): one layer of up to 2**28
    elements and 1 GiB decoded passes; a 200-byte payload cannot ask for gigabytes."""
    lim = gcodec.get_limits()
    assert lim.max_ndim >= 8 and lim.max_tensors >= 4096
    assert lim.max_elements == 1 << 28 and lim.max_output_bytes == 1 << 30
    gcodec.validate(_topk_declaring([1 << 14, 1 << 14]))  # 2**28 float32: exactly 1 GiB
    gcodec.validate(_topk_declaring([1 << 14, 1 << 14], "bfloat16"))  # + 1 GiB float32 staging
    tiny = _topk_declaring([1 << 29])  # 204 bytes declaring 2 GiB of float32
    assert len(tiny) < 300
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(LimitExceededError, match=r"max_elements=268435456.*gcodec\.scoped_limits\(max_elements="):
            fn(tiny)


def test_a_billion_parameter_tensor_decodes_with_explicit_limits():
    big = _topk_declaring([1_000_000_000])
    with pytest.raises(LimitExceededError):
        gcodec.validate(big)
    lim = dataclasses.replace(gcodec.get_limits(), max_elements=1 << 31, max_output_bytes=8 << 30)
    info = gcodec.validate(big, limits=lim)
    assert info.original_nbytes == 4_000_000_000


# ---------------------------------------------------------------------------------------------
# every field, on decode and on encode

X = np.linspace(-1, 1, 100, dtype=np.float32).reshape(4, 25)


def _encode_one():
    return gcodec.get_codec("uniform").encode(X)


def _encode_bundle():
    return gcodec.encode_bundle({"a": X, "b": X[0].astype(np.float16)}, "uniform")


PAYLOAD = bytes(gcodec.get_codec("uniform").encode(X))
BUNDLE = bytes(_encode_bundle())

#: field -> a value that the 2-tensor uniform bundle (4 x 25 float32, 25 float16: 100 bytes of
#: float32 staging) exceeds
TIGHT = {
    "max_header_bytes": 100,
    "max_tensors": 1,
    "max_sections": 3,
    "max_ndim": 1,
    "max_elements": 99,
    "max_output_bytes": 399,
    "max_payload_bytes": 200,
    "max_nesting": 3,
    "max_header_containers": 5,
    "max_decode_work": 99,
    "max_scratch_bytes": 99,
}


#: the largest value a field accepts, where it is below 2**40
LARGEST = {"max_nesting": MAX_NESTING_CAP}


def test_every_limits_field_is_covered():
    assert set(TIGHT) == {f.name for f in dataclasses.fields(Limits)}


@pytest.mark.parametrize("field", sorted(TIGHT))
def test_limit_enforced_on_decode(field):
    with gcodec.scoped_limits(**{field: TIGHT[field]}):
        for fn in (gcodec.decode, gcodec.validate):
            with pytest.raises(LimitExceededError, match=field):
                fn(BUNDLE)
    lim = dataclasses.replace(gcodec.get_limits(), **{field: TIGHT[field]})
    with pytest.raises(LimitExceededError, match=field):
        gcodec.decode(BUNDLE, limits=lim)
    gcodec.decode(BUNDLE)  # the context manager restored the defaults


@pytest.mark.parametrize("field", sorted(TIGHT))
def test_limit_enforced_on_encode(field):
    """A sender cannot write a payload that a peer with the same limits refuses."""
    with gcodec.scoped_limits(**{field: TIGHT[field]}):
        with pytest.raises(LimitExceededError, match=field):
            _encode_bundle()
    lim = dataclasses.replace(gcodec.get_limits(), **{field: TIGHT[field]})
    with pytest.raises(LimitExceededError, match=field):
        gcodec.encode_bundle({"a": X, "b": X[0].astype(np.float16)}, "uniform", limits=lim)


@pytest.mark.parametrize("field", sorted(TIGHT))
def test_what_encode_accepts_decode_accepts(field):
    """Under any limit, encode and decode agree: either both refuse or both pass. Both directions:
    what the encoder writes under the limit decodes under it, and the payload written without the
    limit is refused on decode exactly when the encoder refuses to write it."""
    free = bytes(_encode_one())  # the same tensor, written under the default limits
    for value in (TIGHT[field], TIGHT[field] * 4, LARGEST.get(field, 1 << 40)):
        with gcodec.scoped_limits(**{field: value}):
            try:
                b: bytes | None = bytes(_encode_one())
            except LimitExceededError:
                b = None
            try:
                gcodec.decode(free)
                gcodec.validate(free)
                decodes = True
            except LimitExceededError:
                decodes = False
            assert decodes == (b is not None), (field, value, decodes)
            if b is not None:
                gcodec.decode(b)
                gcodec.validate(b)


def test_limits_context_manager_nests_and_restores():
    before = gcodec.get_limits()
    with gcodec.scoped_limits(max_elements=1000) as outer:
        assert gcodec.get_limits() is outer and outer.max_elements == 1000
        with gcodec.scoped_limits(max_ndim=3) as inner:
            assert inner.max_elements == 1000 and inner.max_ndim == 3
        assert gcodec.get_limits() is outer
    assert gcodec.get_limits() == before
    with pytest.raises(RuntimeError), gcodec.scoped_limits(max_elements=1):
        raise RuntimeError
    assert gcodec.get_limits() == before


def test_set_limits_returns_previous():
    old = gcodec.set_limits(Limits(max_elements=10))
    try:
        with pytest.raises(LimitExceededError):
            gcodec.decode(PAYLOAD)
    finally:
        gcodec.set_limits(old)
    gcodec.decode(PAYLOAD)


def test_limits_per_call_override_global():
    with gcodec.scoped_limits(max_elements=10):
        gcodec.decode(PAYLOAD, limits=Limits())
        gcodec.validate(PAYLOAD, limits=Limits())


def test_raised_ndim_limit_never_leaks_a_numpy_error():
    """NumPy arrays have at most 64 dimensions: a raised max_ndim must not let a ValueError escape."""
    b = _fp16_payload([1] * 70, nbytes=2)
    with gcodec.scoped_limits(max_ndim=100):
        for fn in (gcodec.validate, gcodec.decode):
            with pytest.raises(gcodec.GcodecError):
                fn(b)


@pytest.mark.parametrize("case", usable_cases(), ids=lambda c: c.id)
def test_element_limit_per_codec(case):
    b = encode_case(case)
    n = int(np.prod(case.shape))
    with gcodec.scoped_limits(max_elements=n - 1):
        with pytest.raises(LimitExceededError):
            gcodec.decode(b)
        with pytest.raises(LimitExceededError):
            encode_case(case)
    with gcodec.scoped_limits(max_elements=n):
        gcodec.decode(b)


def test_max_sections_below_a_bundle_is_a_limit_error():
    """msgpack's max_array_len must not pre-empt the limits with a HeaderError."""
    xs = {f"t{i}": np.ones(4, np.float32) for i in range(40)}
    b = gcodec.encode_bundle(xs, "fp16")
    lim = Limits(max_sections=4)
    for fn in (gcodec.decode, gcodec.validate):
        with pytest.raises(LimitExceededError, match="max_sections"):
            fn(b, limits=lim)
    with pytest.raises(LimitExceededError, match="max_tensors"):
        gcodec.validate(b, limits=Limits(max_tensors=4))


# ---------------------------------------------------------------------------------------------
# peak memory of a decode stays within the documented bound (docs/limits.md)


def _memory_cases():
    from gcodec.arrays import BFLOAT16

    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    m = x.reshape(1024, 1024)
    return {
        "randomk bf16": (gcodec.get_codec("randomk", ratio=0.25), x.astype(BFLOAT16)),
        "topk bf16": (gcodec.get_codec("topk", ratio=0.25), x.astype(BFLOAT16)),
        "topk nested fp16": (gcodec.get_codec("topk", ratio=0.25, values={"id": "fp16"}), x),
        "randomk nested uniform f16": (gcodec.get_codec("randomk", ratio=0.25, values="uniform"), x.astype(np.float16)),
        "threshold raw": (gcodec.get_codec("threshold", threshold=0.5, index_coding="raw"), x),
        "powersgd bf16 r16": (gcodec.get_codec("powersgd", rank=16), m.astype(BFLOAT16)),
        "powersgd f64 r12": (gcodec.get_codec("powersgd", rank=12), m.astype(np.float64)),
        "uniform f16": (gcodec.get_codec("uniform"), x.astype(np.float16)),
    }


@pytest.mark.parametrize("label", sorted(_memory_cases()))
def test_the_scratch_limit_refuses_before_allocating_scratch(label):
    """A payload whose scratch (as counted against max_scratch_bytes) exceeds the limit is refused up
    front, having allocated almost nothing. (What decoding allocates within the limits is held to the
    bound of docs/limits.md by tests/test_memory_bound.py.)"""
    from gcodec.api import _checked
    from gcodec.resources import scratch_bytes

    codec, x = _memory_cases()[label]
    b = bytes(codec.encode(x, step=0))
    _, checked = _checked(b, None, full=False)
    e, cls, params = checked[0]
    lim = dataclasses.replace(gcodec.get_limits(), max_scratch_bytes=scratch_bytes(cls, params, e) - 1)
    for fn in (gcodec.validate, gcodec.decode):
        fn(b)  # warm up
        err, peak = _peak(lambda f=fn: f(b, limits=lim))
        assert isinstance(err, LimitExceededError) and "max_scratch_bytes" in str(err)
        assert peak < SMALL_PEAK + 4 * len(b)


def test_sparse_index_temporaries_count_against_the_scratch_limit():
    """A found case: an 18.9 MB topk payload (k = 2**27, 1-bit values) made validate allocate 1.5 GiB.
    Its k-sized temporaries (8k index bytes + 4k decoded values = 1.5 GiB) are now counted against
    max_scratch_bytes, and refused before they exist when they exceed it."""
    from tests.test_powersgd import _zero_payload

    sign = {"codec": "sign", "params": {"group_size": 256}, "version": 1}
    k = 1 << 27
    params = {"k": k, "index_coding": "delta", "index_bytes": 0, "values": sign}
    b = _zero_payload("topk", [k], params)
    assert len(b) < 21 << 20  # index_widths (k / 64 bytes) and 1-bit values; zero-width gaps
    with gcodec.scoped_limits(max_scratch_bytes=(12 * k) - 1):
        for fn in (gcodec.validate, gcodec.decode):
            err, peak = _peak(lambda f=fn: f(b))
            assert isinstance(err, LimitExceededError) and "max_scratch_bytes" in str(err), repr(err)
            assert peak < SMALL_PEAK + 4 * len(b)


def test_limits_is_the_module_and_calling_it_is_deprecated():
    """``import gcodec.limits as L`` gives the module; ``gcodec.scoped_limits(...)`` scopes limits;
    the old call of the module, ``gcodec.limits(...)``, still does, with a DeprecationWarning."""
    import importlib

    L = importlib.import_module("gcodec.limits")
    assert L is gcodec.limits and L.Limits is gcodec.Limits and L.set_limits is gcodec.set_limits
    before = gcodec.get_limits().max_elements
    with gcodec.scoped_limits(max_elements=7) as lim:
        assert lim.max_elements == 7 and gcodec.get_limits().max_elements == 7
    assert gcodec.get_limits().max_elements == before
    with pytest.warns(DeprecationWarning, match=r"gcodec.limits\(...\) is renamed gcodec.scoped_limits"):
        with gcodec.limits(max_elements=9) as lim:  # type: ignore[operator]
            assert lim.max_elements == 9 and gcodec.get_limits().max_elements == 9
    assert gcodec.get_limits().max_elements == before
    with pytest.warns(DeprecationWarning, match="renamed gcodec.limits.scoped_limits"):
        assert L.limits is gcodec.scoped_limits


def test_a_header_of_tiny_containers_is_refused_before_it_becomes_tens_of_mib():
    """An empty array is 1 byte of msgpack and ~64 bytes of Python object: max_header_containers
    bounds what a hostile 1 MiB header can cost (docs/limits.md: the header's part of the memory
    bound, HEADER_BYTE_COST x header bytes + CONTAINER_COST x containers)."""
    import tracemalloc

    from gcodec.format.header import unpack_strict
    from gcodec.resources import CONTAINER_COST, HEADER_BYTE_COST

    lim = gcodec.get_limits()
    n = (1 << 20) - 16
    flood = b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n  # one array of a million empty arrays
    tracemalloc.start()
    try:
        with pytest.raises(gcodec.LimitExceededError, match="max_header_containers"):
            unpack_strict(flood, lim)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bound = HEADER_BYTE_COST * len(flood) + CONTAINER_COST * lim.max_header_containers
    assert peak <= bound, (peak, bound)
    # at the limit exactly, it parses
    k = lim.max_header_containers - 1
    ok = b"\xdd" + k.to_bytes(4, "big") + b"\x80" * k
    assert len(unpack_strict(ok, lim)) == k
