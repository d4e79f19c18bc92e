"""Property tests: the fuzz oracles of docs/fuzzing.md under Hypothesis, with a bounded budget.

The oracles (tests/codec_kit.py ``check_payload``), on payloads mutated at the byte level (with the
CRCs recomputed, so mutations reach the structural and semantic rules) and at the header level
(any field replaced by any msgpack value):

* only ``GcodecError`` subclasses escape ``decode``, ``validate`` and ``inspect_header``;
* ``validate`` success implies ``decode`` success with the declared shape and dtype;
* a payload that fails to decode leaves an ``accumulate=True`` target untouched;
* peak traced memory stays within ``codec_kit.memory_bound``.

And on canonical payloads: re-encoding the input with the params recorded in the header (and the
same key and step, which fix the random stream) reproduces the bytes; for projection codecs
re-encoding the *decoded* values does too; arbitrary shapes and dtypes round trip.

And on the encoders (``codec_kit.check_encoder``): every host with every codec that nests, on
wide-range tensors, raises a ``GcodecError`` or writes a payload that validates and decodes.

``tools/fuzz.py`` runs the same oracles, coverage-guided, for as long as you like.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gcodec
from gcodec.arrays import DTYPES
from tests.codec_kit import (
    NESTED_CASES,
    NOT_FROM_HEADER,
    check_encoder,
    check_payload,
    header_paths,
    is_projection,
    mutate_header,
    parse_payload,
    rebuild,
    reencode_matches,
    reseal,
    seed_payloads,
    serial_kernels,
    usable_cases,
    wide_input,
)


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


BUDGET = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CASES = usable_cases()
#: seed_payloads() encodes every usable case twice, then two bundles. Encoding compiles kernels,
#: so the payloads are made when a test first needs them, not at collection, which every
#: pytest-xdist worker repeats for every module.
N_SEEDS = 2 * len(CASES) + 2


@functools.cache
def seeds() -> list[bytes]:
    out = seed_payloads()
    assert len(out) == N_SEEDS, (len(out), N_SEEDS)
    return out


# ---------------------------------------------------------------------------------------------
# byte-level mutations

_mutation = st.tuples(
    st.sampled_from(["flip", "set", "delete", "insert", "truncate", "extend"]),
    st.floats(0, 1, exclude_max=True),
    st.integers(0, 255),
)


@BUDGET
@given(
    seed=st.sampled_from(range(N_SEEDS)),
    mutations=st.lists(_mutation, min_size=1, max_size=6),
    resealed=st.booleans(),
)
def test_byte_mutations_only_raise_gcodec_errors(seed, mutations, resealed):
    b = bytearray(seeds()[seed])
    for op, where, v in mutations:
        i = int(where * len(b)) if b else 0
        if op == "flip" and b:
            b[i] ^= v or 1
        elif op == "set" and b:
            b[i] = v
        elif op == "delete" and b:
            del b[i]
        elif op == "insert":
            b.insert(i, v)
        elif op == "truncate":
            del b[i:]
        elif op == "extend":
            b += bytes([v]) * (1 + i % 16)
    check_payload(reseal(b) if resealed else bytes(b))


# ---------------------------------------------------------------------------------------------
# header-level mutations

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, 63, 64, 65, 255, 2**24, 2**31, 2**32, 2**34, 2**40, 2**62]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            *("float32", "float16", "bfloat16", "float64", "u1", "u2", "u4", "f4", "f2", "i8"),
            *("data", "codes", "scales", *sorted(gcodec.list_codecs())),
        ]
    ),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.text(max_size=10), inner, max_size=4),
    ),
    max_leaves=12,
)


@BUDGET
@given(
    seed=st.sampled_from(range(N_SEEDS)),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), _values | st.just(...)), min_size=1, max_size=3),
    minor=st.sampled_from([0, 0, 0, 1]),
    canonical=st.booleans(),
    data_edit=st.none() | st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
)
def test_header_mutations_only_raise_gcodec_errors(seed, edits, minor, canonical, data_edit):
    header, data = parse_payload(seeds()[seed])
    for where, value in edits:
        paths = header_paths(header)
        path = paths[int(where * len(paths))]
        if value is ... and not path:
            continue
        header = mutate_header(header, path, value)
    if data_edit and data:
        d = bytearray(data)
        d[int(data_edit[0] * len(d))] ^= data_edit[1]
        data = bytes(d)
    try:
        b = rebuild(header, data, checksum=bool(seeds()[seed][6] & 1), minor=minor, canonical=canonical)
    except (gcodec.GcodecError, ValueError, TypeError, OverflowError):
        return  # not representable as a header at all (e.g. an int beyond 64 bits)
    check_payload(b, memory=True)


@pytest.mark.parametrize("i", range(N_SEEDS))
def test_seeds_are_valid(i):
    assert check_payload(seeds()[i], memory=True) == "valid"


# ---------------------------------------------------------------------------------------------
# canonical payloads

_shapes = st.lists(st.integers(0, 9), max_size=4).map(tuple)


@st.composite
def _arrays(draw, dtypes=tuple(DTYPES)):
    """Any shape of up to 4 dims, any wire dtype, values from one of several patterns (drawn from a
    seed, so big tensors cost Hypothesis nothing)."""
    shape = draw(_shapes)
    dtype = draw(st.sampled_from(dtypes))
    pattern = draw(st.sampled_from(["normal", "heavy", "zeros", "constant", "ramp", "spikes", "tiny"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 1e3]))
    n = int(np.prod(shape))
    x = {
        "normal": lambda: rng.standard_normal(n),
        "heavy": lambda: rng.standard_t(2, n),
        "zeros": lambda: np.zeros(n),
        "constant": lambda: np.full(n, -1.5),
        "ramp": lambda: np.linspace(-1, 1, n),
        "spikes": lambda: rng.standard_normal(n) * (rng.random(n) < 0.05) * 100,
        "tiny": lambda: rng.standard_normal(n) * 1e-40,
    }[pattern]() * scale
    big = float(np.finfo(np.float16).max) / 2 if dtype == "float16" else 1e30
    return np.clip(x, -big, big).reshape(shape).astype(DTYPES[dtype])


@BUDGET
@given(ci=st.sampled_from(range(len(CASES))), x=_arrays())
def test_round_trip_any_shape_and_dtype(ci, x):
    case = CASES[ci]
    codec = gcodec.get_codec(case.codec, **case.params)
    try:
        b = codec.encode(x, key="t", step=0)
    except gcodec.ConfigError:
        return  # the codec does not take this shape (e.g. a 2-D-only codec); that must be a ConfigError
    info = gcodec.validate(b)
    assert info.shape == x.shape and info.dtype == x.dtype and info.codec == case.codec
    y = gcodec.decode(b)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.isfinite(y.astype(np.float64)).all() or case.codec == "fp16"  # fp16 may overflow to inf
    assert check_payload(bytes(b)) == "valid"


@BUDGET
@given(ci=st.sampled_from(range(len(CASES))), x=_arrays(), checksum=st.booleans())
def test_reencode_with_recorded_params_reproduces_bytes(ci, x, checksum):
    case = CASES[ci]
    if case.codec in NOT_FROM_HEADER:
        return
    codec = gcodec.get_codec(case.codec, **case.params)
    try:
        b = bytes(codec.encode(x, key="t", step=0, checksum=checksum))
    except gcodec.ConfigError:
        return
    assert reencode_matches(b, x, key="t", step=0), f"{case.id}: re-encoding with the header's params differs"


@BUDGET
@given(ci=st.sampled_from(range(len(CASES))), x=_arrays(("float32", "float64")))
def test_decoded_projection_payloads_reencode_to_the_same_bytes(ci, x):
    case = CASES[ci]
    if not is_projection(case):
        return
    codec = gcodec.get_codec(case.codec, **case.params)
    b = bytes(codec.encode(x, key="t", step=0))
    y = gcodec.decode(b)
    assert bytes(codec.encode(y, key="t", step=0)) == b, f"{case.id}: decode is not a projection"


def test_reencode_oracle_covers_most_codecs():
    """Only codecs listed (with a reason) in NOT_FROM_HEADER escape the re-encoding oracle."""
    assert set(NOT_FROM_HEADER) <= set(gcodec.list_codecs())
    assert any(is_projection(c) for c in CASES)


# ---------------------------------------------------------------------------------------------
# encoders: what they write always decodes (specs/codecs/hybrid.md §3.1)


@st.composite
def _wide_arrays(draw, shape):
    """A wide-range tensor (codec_kit.wide_input) of any wire dtype; sometimes with one NaN or ±inf."""
    dtype = draw(st.sampled_from(list(DTYPES)))
    pattern = draw(st.sampled_from(["wide", "edges", "scaled"]))
    x = wide_input(shape, dtype, draw(st.integers(0, 2**32 - 1)), pattern)
    special = draw(st.sampled_from([None, None, None, np.nan, np.inf, -np.inf]))
    if special is not None:
        x.reshape(-1)[draw(st.integers(0, x.size - 1))] = special
    return x


@BUDGET
@given(ci=st.sampled_from(range(len(NESTED_CASES))), data=st.data())
def test_encoder_output_always_decodes(ci, data):
    case = NESTED_CASES[ci]
    x = data.draw(_wide_arrays(case.shape))
    with np.errstate(over="ignore"):  # a float16 output may round what is decoded to infinity
        outcome = check_encoder(case, x)
    if not np.isfinite(x.astype(np.float64)).all():
        assert outcome == "refused", f"{case.id}: a host encoded NaN or infinity"


# ---------------------------------------------------------------------------------------------
# inputs found by fuzzing (tools/fuzz.py), kept as regression tests


def _with_section_field(field: int, value) -> bytes:
    header, data = parse_payload(bytes(gcodec.get_codec("fp16").encode(np.ones(4, np.float32))))
    header["tensors"][0]["sections"][0][field] = value
    return rebuild(header, data)


@pytest.mark.parametrize("value", [[], {}, [1, 2], {"a": 1}], ids=["list", "map", "list2", "map2"])
def test_found_section_type_that_is_not_a_string(value):
    """fuzz crash 2f4b399c: a section's element type given as a list or map made the reader raise
    TypeError (unhashable type) from ``sdt in SECTION_DTYPES`` instead of a HeaderError (F9)."""
    with pytest.raises(gcodec.HeaderError, match="F9"):
        gcodec.api.inspect_header(_with_section_field(1, value))
    assert check_payload(_with_section_field(1, value)) == "rejected"


@pytest.mark.parametrize("field", [0, 2, 3])
@pytest.mark.parametrize("value", [[], {}, None, 1.5, "x", True])
def test_other_section_fields_of_the_wrong_type(field, value):
    assert check_payload(_with_section_field(field, value)) == "rejected"


@pytest.mark.parametrize("case", [c for c in CASES if c.codec in ("uniform", "qsgd", "terngrad")], ids=lambda c: c.id)
def test_failing_accumulate_does_not_touch_out(case):
    """A code outside [-qmax, qmax] (rules U2, Q2, T2) is found while decoding. With accumulate=True
    every value check runs first, so the sum is untouched; without, ``out`` may be partly written
    (documented in gcodec.decode), but the error is raised all the same."""
    header, data = parse_payload(bytes(gcodec.get_codec(case.codec, **case.params).encode(
        np.linspace(-1, 1, 64, dtype=np.float32), key="t", step=0)))  # fmt: skip
    _, _, off, nb = next(s for s in header["tensors"][0]["sections"] if s[0] == "codes")
    bad = bytearray(data)
    bad[off + nb - 1] = 0xAA if case.codec == "terngrad" else 0x80  # a forbidden code in the last byte
    payload = rebuild(header, bytes(bad))
    out = np.full(64, 7.0, np.float32)
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.decode(payload, out=out, accumulate=True)
    assert (out == 7.0).all(), "a failing decode(accumulate=True) modified out"
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.decode(payload, out=out)
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.validate(payload)
