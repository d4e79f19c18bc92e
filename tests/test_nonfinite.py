"""The NaN / ±Inf policy, per codec (docs/nonfinite.md is the prose of this file).

Each registered codec must appear in :data:`NONFINITE` with one of two policies (listed per
configuration, so a configuration that changes the policy is caught):

``"reject"``
    encoding an input that holds NaN or ±Inf raises ``PayloadValueError`` (no payload comes back);
``"carry"``
    NaN stays NaN and ±Inf stays ±Inf at the same positions after a round trip;
Whatever the policy, a non-finite input never silently becomes finite garbage. ``ErrorFeedback`` refuses
(``PayloadValueError``) to store a residual that would be NaN or infinite, and leaves the residual
it had unchanged, so one bad step does not poison every later one without the user being told.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import gcodec
from gcodec import PayloadValueError
from gcodec.arrays import DTYPES
from tests.codec_kit import Case, all_cases, encode_case, parse_payload, rebuild, serial_kernels


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


#: (case, policy). Policies (docs/nonfinite.md):
#:   "carry":  NaN stays NaN and ±Inf stays ±Inf, at the same positions;
#:   "reject": NaN or ±Inf in the input raises PayloadValueError.
NONFINITE: list[tuple[Case, str]] = [
    (Case("fp16", {}, (130,)), "carry"),
    (Case("bf16", {}, (130,)), "carry"),
    (Case("uniform", {"bits": 8}, (130,)), "reject"),
    (Case("uniform", {"bits": 4, "rounding": "stochastic"}, (130,)), "reject"),
    (Case("qsgd", {}, (130,)), "reject"),
    (Case("terngrad", {"group_size": 32}, (130,)), "reject"),
    (Case("sign", {"group_size": 16}, (130,)), "reject"),
    (Case("fp8", {}, (130,)), "reject"),
    (Case("fp8", {"element": "e5m2", "scale_dtype": "e8m0", "rounding": "stochastic"}, (130,)), "reject"),
    (Case("mx", {}, (130,)), "reject"),
    (Case("mx", {"element": "e4m3", "rounding": "stochastic"}, (130,)), "reject"),
    (Case("nvfp4", {}, (130,)), "reject"),
    (Case("topk", {"ratio": 0.1}, (130,)), "reject"),
    (Case("topk", {"ratio": 0.1, "values": {"id": "uniform"}}, (130,)), "reject"),
    (Case("topk", {"ratio": 0.1, "values": {"id": "fp16"}}, (130,)), "reject"),
    (Case("chunktopk", {"chunk": 32, "k": 4}, (130,)), "reject"),
    (Case("chunktopk", {"chunk": 64, "k": 64, "index_coding": "packed", "values": {"id": "fp16"}}, (130,)), "reject"),
    (Case("dct", {"chunk": 16, "k": 2}, (130,)), "reject"),
    (Case("threshold", {"threshold": 0.5}, (130,)), "reject"),
    (Case("randomk", {"ratio": 0.1}, (130,)), "reject"),
    (Case("randomk", {"ratio": 0.1, "values": "fp16"}, (130,)), "reject"),
    (Case("powersgd", {"rank": 2, "min_compression_rate": 0.0}, (10, 13)), "reject"),
    (Case("powersgd", {}, (130,)), "reject"),  # a vector, passed through as fp32
    (Case("powersgd", {"passthrough": "fp16"}, (2, 65)), "reject"),  # too small to compress: fp16
]

SPECIALS = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}
POSITIONS = (0, 65, 129)  # first element, inside a later group, last element


def _entries() -> list:
    out = []
    for case, policy in NONFINITE:
        marks = [] if case.codec in gcodec.list_codecs() else [pytest.mark.skip(reason=f"{case.codec} not registered")]
        out.append(pytest.param(case, policy, id=f"{case.id}-{policy}", marks=marks))
    return out


def test_every_codec_declares_a_policy():
    missing = sorted(set(gcodec.list_codecs()) - {c.codec for c, _ in NONFINITE})
    assert not missing, (
        f"codec(s) {missing} have no NaN/Inf policy in tests/test_nonfinite.py NONFINITE (and docs/nonfinite.md)"
    )


def _input(case: Case, dtype: str, where: int, value: float) -> np.ndarray:
    n = int(np.prod(case.shape))
    x = np.linspace(-2.0, 2.0, n).astype(DTYPES[dtype])
    x[where] = value
    return x.reshape(case.shape)


@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case,policy", _entries())
def test_policy(case, policy, dtype, special):
    codec = gcodec.get_codec(case.codec, **case.params)
    rejects = policy == "reject"
    for where in POSITIONS:
        x = _input(case, dtype, where, SPECIALS[special])
        if rejects:
            with pytest.raises(PayloadValueError):
                codec.encode(x, key="t", step=0)
            continue
        y = gcodec.decode(codec.encode(x, key="t", step=0)).reshape(-1)
        bad_out = np.flatnonzero(~np.isfinite(y.astype(np.float64)))
        assert bad_out.tolist() == [where], f"{case.id}: non-finite outputs at {bad_out.tolist()}, input at {where}"
        if special == "nan":
            assert np.isnan(y[where].astype(np.float64))
        else:
            assert y[where].astype(np.float64) == SPECIALS[special]


@pytest.mark.parametrize("case,policy", _entries())
def test_finite_input_never_decodes_to_nan(case, policy):
    """Big and tiny finite values may overflow to ±Inf (fp16) but never become NaN."""
    codec = gcodec.get_codec(case.codec, **case.params)
    n = int(np.prod(case.shape))
    pattern = np.array([3e38, -3e38, 1e-45, -1e-45, 0.0, -0.0, 65504, 65520, 1e5, -1e5], np.float32)
    x = np.resize(pattern, n).reshape(case.shape)
    try:
        b = codec.encode(x, key="t", step=0)
    except PayloadValueError:
        return  # refusing is allowed (e.g. a norm that overflows float32); inventing NaN is not
    y = gcodec.decode(b)  # and what the encoder wrote decodes (specs/codecs/hybrid.md §3.1)
    assert not np.isnan(y).any(), case.id


@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("case", all_cases())
def test_payload_float_sections_must_be_finite(case, special):
    """Decoding holds payloads to the encoder's policy: a non-finite value in a float section (a scale,
    a factor, a kept value) is refused with PayloadValueError by validate and decode."""
    header, data = parse_payload(encode_case(case))
    found = 0
    for t in header["tensors"]:
        for _name, dt, off, nb in t["sections"]:
            if dt not in ("f2", "f4", "f8") or nb == 0:
                continue
            found += 1
            bad = bytearray(data)
            v = np.array(SPECIALS[special], dt).tobytes()
            bad[off : off + len(v)] = v
            p = rebuild(header, bytes(bad))
            for fn in (gcodec.validate, gcodec.decode):
                with pytest.raises(PayloadValueError):
                    fn(p)
    if not found:
        pytest.skip(f"{case.id} has no float sections")


# ---------------------------------------------------------------------------------------------
# codec-specific details of the policy


def test_uniform_rejects_float64_beyond_float32_range():
    """uniform's scales are float32: a float64 input beyond ±3.4e38 cannot be represented."""
    x = np.ones(70)
    x[66] = 1e300
    with pytest.raises(PayloadValueError, match="NaN or infinite"):
        gcodec.get_codec("uniform").encode(x)


def test_uniform_error_names_the_groups():
    x = np.ones(200, np.float32)
    x[[0, 1, 150]] = np.nan
    with pytest.raises(PayloadValueError, match="2 group"):
        gcodec.get_codec("uniform", group_size=64).encode(x)


@pytest.mark.parametrize("scale", [np.nan, np.inf, -np.inf, -1.0, -0.0])
def test_uniform_payload_with_non_finite_or_negative_scale_is_refused(scale):
    b = bytes(gcodec.get_codec("uniform").encode(np.linspace(-1, 1, 10, dtype=np.float32)))
    h, data = parse_payload(b)
    bad = np.frombuffer(data, np.uint8).copy()
    bad[:4] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)
    p = rebuild(h, bad.tobytes())
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(PayloadValueError, match="U1"):
            fn(p)


@pytest.mark.parametrize("cid", ["fp16", "bf16"])
def test_cast_codecs_keep_signed_zero_and_nan_sign(cid):
    x = np.array([-0.0, 0.0, -np.nan, np.nan, -np.inf, np.inf], np.float32)
    y = gcodec.decode(gcodec.get_codec(cid).encode(x))
    np.testing.assert_array_equal(np.signbit(y), np.signbit(x))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(x))


def test_fp16_overflow_is_ieee_infinity():
    y = gcodec.decode(gcodec.get_codec("fp16").encode(np.array([65504, 65519, 65520, 1e9, -1e9], np.float32)))
    np.testing.assert_array_equal(y, np.array([65504, 65504, np.inf, np.inf, -np.inf], np.float32))


# ---------------------------------------------------------------------------------------------
# error feedback


@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("case,policy", _entries())
def test_error_feedback_refuses_non_finite_and_keeps_residual(case, policy, special):
    ef = gcodec.ErrorFeedback(gcodec.get_codec(case.codec, **case.params))
    x = np.linspace(-1, 1, int(np.prod(case.shape)), dtype=np.float32).reshape(case.shape)
    # first step, no residual yet: a bad input leaves no residual behind
    with pytest.raises(PayloadValueError):
        ef.encode(_input(case, "float32", 7, SPECIALS[special]), key="w", step=0)
    assert ef.residual("w") is None
    # a good step makes a residual; a bad one raises and leaves it bit for bit
    ef.encode(x * 1.37, key="w", step=1)
    before = ef.residual("w")
    assert before is not None and np.isfinite(before).all()
    with pytest.raises(PayloadValueError):
        ef.encode(_input(case, "float32", 50, SPECIALS[special]), key="w", step=2)
    np.testing.assert_array_equal(ef.residual("w"), before)
    # and the stream goes on from there
    ef.encode(x, key="w", step=3)
    assert np.isfinite(ef.residual("w")).all()


@pytest.mark.parametrize("case,policy", [p for p in _entries() if p.values[1] != "carry"])
def test_refused_encode_leaves_codec_state_unchanged(case, policy):
    """A stateful codec (PowerSGD's warm start, per-key counters) must not learn from an input it refused."""
    rng = np.random.default_rng(1)
    x1, x2 = (rng.standard_normal(case.shape).astype(np.float32) for _ in range(2))
    a = gcodec.get_codec(case.codec, **case.params)
    b = gcodec.get_codec(case.codec, **case.params)
    a.encode(x1, key="t", step=0)
    b.encode(x1, key="t", step=0)
    with pytest.raises(PayloadValueError):
        a.encode(_input(case, "float32", 3, np.nan), key="t", step=1)
    assert bytes(a.encode(x2, key="t", step=2)) == bytes(b.encode(x2, key="t", step=2))


def test_error_feedback_refuses_codec_overflow():
    """fp16 turns 1e6 into +inf: the residual 1e6 - inf would be -inf, so the step is refused."""
    ef = gcodec.ErrorFeedback("fp16")
    with pytest.raises(PayloadValueError, match="residual"):
        ef.encode(np.full(8, 1e6, np.float32), key="w")
    assert ef.residual("w") is None


def test_error_feedback_other_keys_unaffected():
    ef = gcodec.ErrorFeedback("uniform")
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    ef.encode(x, key="a")
    a = ef.residual("a")
    with pytest.raises(PayloadValueError):
        ef.encode(_input(Case("uniform", {}, (100,)), "float32", 3, np.nan), key="b")
    np.testing.assert_array_equal(ef.residual("a"), a)
    assert ef.keys() == ["a"]


# ---------------------------------------------------------------------------------------------
# reject-policy codecs: a hostile payload (valid CRCs) cannot decode to NaN or ±Inf (docs/nonfinite.md)

FLT_MAX = float(np.finfo(np.float32).max)


def _edit(b: bytes, section: str, fn) -> bytes:
    """Rewrite one section's bytes with ``fn(uint8 array)``; CRCs are recomputed."""
    h, data = parse_payload(b)
    data = bytearray(data)
    for name, _dt, off, nb in h["tensors"][0]["sections"]:
        if name == section:
            view = np.frombuffer(memoryview(data)[off : off + nb], np.uint8)
            fn(view)
            return rebuild(h, bytes(data))
    raise KeyError(section)


def _f32(view: np.ndarray, value: float, count: int | None = None) -> None:
    v = view.view(np.float32)
    v[: count if count is not None else v.size] = value


def _hostile() -> dict[str, Callable[[], bytes]]:
    """Label -> a function making the payload: encoding compiles kernels, so the payloads are made
    by the test that uses them, not at collection (which every pytest-xdist worker repeats)."""
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    m = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    out: dict[str, Callable[[], bytes]] = {}

    def uniform() -> bytes:
        b = bytes(gcodec.get_codec("uniform").encode(x))
        b = _edit(b, "scales", lambda v: _f32(v, FLT_MAX, 1))
        return _edit(b, "codes", lambda v: v.__setitem__(0, 0x7F))

    def qsgd() -> bytes:
        return _edit(bytes(gcodec.get_codec("qsgd").encode(x, step=0)), "scales", lambda v: _f32(v, 3e38))

    def powersgd() -> bytes:
        b = bytes(gcodec.get_codec("powersgd", rank=2, min_compression_rate=1.0).encode(m))
        b = _edit(b, "p", lambda v: _f32(v, 1e30))
        return _edit(b, "q", lambda v: _f32(v, 1e30))

    out["uniform scale FLT_MAX, code 127"] = uniform
    out["qsgd step 3e38"] = qsgd
    out["powersgd factors 1e30"] = powersgd
    for cid, kw in (("topk", {"ratio": 0.1}), ("threshold", {"threshold": 0.5}), ("randomk", {"ratio": 0.1})):
        for vid, nan_bits in (("fp16", 0x7E00), ("bf16", 0x7F80)):

            def nested(cid: str = cid, kw: dict = kw, vid: str = vid, n: int = nan_bits) -> bytes:
                b = bytes(gcodec.get_codec(cid, values={"id": vid}, **kw).encode(x, step=0))
                return _edit(b, "values.data", lambda v: v.view("<u2").__setitem__(0, n))

            out[f"{cid} nested {vid} non-finite"] = nested
    for vid, bits in (("fp16", 0x7C00), ("bf16", 0xFFC0)):

        def factors(vid: str = vid, n: int = bits) -> bytes:
            b = bytes(gcodec.get_codec("powersgd", rank=2, min_compression_rate=1.0, factors={"id": vid}).encode(m))
            return _edit(b, "p.data", lambda v: v.view("<u2").__setitem__(3, n))

        out[f"powersgd nested {vid} factor non-finite"] = factors
    return out


HOSTILE = _hostile()


@pytest.mark.parametrize("label", sorted(HOSTILE))
def test_reject_policy_payloads_never_decode_non_finite(label):
    b = HOSTILE[label]()
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(PayloadValueError):
            fn(b)
    acc = np.zeros(gcodec.api.inspect_header(b).shape, np.float32)
    with pytest.raises(PayloadValueError):
        gcodec.decode(b, out=acc, accumulate=True)
    assert np.isfinite(acc).all() and not acc.any()


def test_largest_valid_uniform_scale_decodes_finite():
    """The rule's edge: float32(127 * scale) finite passes and decodes to a finite value."""
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    s = np.float32(FLT_MAX / 127)
    while np.isinf(np.float32(127) * s):  # the largest scale whose 127 * s is finite in float32
        s = np.nextafter(s, np.float32(0))
    b = _edit(bytes(gcodec.get_codec("uniform").encode(x)), "scales", lambda v: _f32(v, float(s), 1))
    b = _edit(b, "codes", lambda v: v.__setitem__(0, 0x7F))
    y = gcodec.decode(b)
    assert np.isfinite(y).all() and y[0] == np.float32(127) * s
    bigger = _edit(b, "scales", lambda v: _f32(v, float(np.nextafter(s, np.float32(np.inf))), 1))
    with pytest.raises(PayloadValueError, match="U1"):
        gcodec.validate(bigger)


# ---------------------------------------------------------------------------------------------
# encoders write a valid payload or raise: an encoder never writes what its decoder refuses


@pytest.mark.parametrize(
    "cid,params,x",
    [
        ("qsgd", {"levels": 3, "bucket_size": 0}, np.float32([3e38, 3e38, 1.0])),
        ("qsgd", {"levels": 15, "bucket_size": 4}, np.float64([2e38, -2e38, 2e38, 1])),
        ("uniform", {}, np.float32([FLT_MAX, 1.0])),
        ("powersgd", {"rank": 1, "min_compression_rate": 1.0}, np.full((8, 8), 1e300)),
        ("powersgd", {"rank": 1, "min_compression_rate": 1.0}, np.full((8, 8), 3e37, np.float32)),
    ],
    ids=["qsgd-f32", "qsgd-f64", "uniform-fltmax", "powersgd-f64-beyond-f32", "powersgd-product"],
)
def test_encoders_refuse_finite_inputs_they_cannot_represent(cid, params, x):
    codec = gcodec.get_codec(cid, **params)
    try:
        b = codec.encode(x, step=0)
    except PayloadValueError:
        return
    gcodec.validate(b)  # if it writes a payload, the payload must be valid
    assert np.isfinite(gcodec.decode(b)).all()
