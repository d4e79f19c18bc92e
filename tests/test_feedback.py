"""ErrorFeedback: residual memory per key around any codec."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import gcodec

CODECS = [
    ("uniform", {"bits": 4}),
    ("uniform", {"bits": 2, "rounding": "stochastic", "seed": 1}),
    ("qsgd", {"levels": 1}),
    ("terngrad", {"clip": 2.5}),
    ("sign", {}),  # the fused kernel
    ("sign", {"group_size": 0}),  # a whole-tensor scale: the generic path for large tensors
    ("fp16", {}),
]
if "topk" in gcodec.list_codecs():
    CODECS.append(("topk", {"ratio": 0.05}))


def _steps(seed, t, shape, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * (1 + k % 3)).astype(dtype) for k in range(t)]


@pytest.mark.parametrize("cid, kw", CODECS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_of_decoded_plus_residual_equals_sum_of_inputs(cid, kw, dtype):
    """Over T steps, sum_t decode_t + e_T = sum_t x_t exactly in real arithmetic, because
    e_t = (x_t + e_{t-1}) - decode_t. In floating point each step rounds twice (forming x + e and
    the subtraction), each with relative error at most u = 2**-24 (2**-53 for float64) of its
    result, so the identity holds within 2u * sum_t (|x_t + e_{t-1}| + |e_t|) per element."""
    if dtype == np.float64 and np.finfo(np.longdouble).nmant < 60:
        pytest.skip("float64 residuals need an extended-precision long double to check")
    ef = gcodec.ErrorFeedback(gcodec.get_codec(cid, **kw))
    u = 2.0**-24 if dtype == np.float32 else 2.0**-53
    xs = _steps(1, 25, (37, 29), dtype)
    # the test's own sums are kept in extended precision so that their rounding stays far below the bound
    total_x = np.zeros(xs[0].shape, np.longdouble)
    total_y = np.zeros(xs[0].shape, np.longdouble)
    bound = np.zeros(xs[0].shape)
    e_prev = np.zeros(xs[0].shape)
    for x in xs:
        buf = ef.encode(x, "layer")
        y = gcodec.decode(buf)
        assert y.dtype == dtype
        total_x += x.astype(np.longdouble)
        total_y += y.astype(np.longdouble)
        e = ef.residual("layer").astype(np.float64)
        bound += 2 * u * (np.abs(x + e_prev) + np.abs(e))
        e_prev = e
    assert ef.residual("layer").dtype == dtype
    err = np.abs(total_y + ef.residual("layer").astype(np.longdouble) - total_x).astype(np.float64)
    assert (err <= bound + 1e-300).all()
    assert np.abs(ef.residual("layer")).max() > 0 or cid == "fp16"  # the codec did drop something


def test_sixteen_bit_inputs_keep_float32_residuals():
    ef = gcodec.ErrorFeedback("sign")
    ef.encode(np.ones(10, np.float16), "k")
    assert ef.residual("k").dtype == np.float32
    ef64 = gcodec.ErrorFeedback("sign", residual_dtype=np.float64)
    ef64.encode(np.ones(10, np.float32), "k")
    assert ef64.residual("k").dtype == np.float64


@pytest.mark.parametrize("group", [7, 64, 256])
def test_fused_sign_feedback_is_bit_identical_to_the_generic_path(group):
    fused = gcodec.ErrorFeedback(gcodec.get_codec("sign", group_size=group))
    plain_codec = gcodec.get_codec("sign", group_size=group)
    plain_codec.plan_feedback = None  # forces the generic path
    plain = gcodec.ErrorFeedback(plain_codec)
    for k, x in enumerate(_steps(2, 12, 3001)):
        if k == 4:
            x[:100] = 0.0
        a, b = fused.encode(x, "w"), plain.encode(x, "w")
        assert bytes(a) == bytes(b)
        np.testing.assert_array_equal(fused.residual("w"), plain.residual("w"))


def _edge_values(n: int, seed: int, cid: str) -> np.ndarray:
    """Gaussian values with the 16-bit formats' edges mixed in: ties between two representable
    values, subnormals of the 16-bit format, the largest finite values and just beyond them
    (fp16: 65504 and 65519, which still rounds down), zeros of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    big = 65504.0 if cid == "fp16" else 3.0e38
    edge = np.array([0.0, -0.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-24, 3 * 2.0**-25, 6e-8, big, -big], np.float32)
    if cid == "fp16":
        edge = np.concatenate([edge, np.array([65519.0, -65519.0, 2.0**-15 + 2.0**-25], np.float32)])
    x[rng.choice(n, edge.size, replace=False)] = edge
    return x


@pytest.mark.parametrize("cid", ["fp16", "bf16"])
@pytest.mark.parametrize("decay", [1.0, 0.9])
@pytest.mark.parametrize("n", [1, 15, 16, 33, 3001, 70_003])
def test_fused_16_bit_feedback_is_bit_identical_to_the_generic_path(cid, decay, n):
    """The fused kernel (x + e, the cast, its exact widening and the subtraction in one pass; the
    binary16 one 16 lanes at a time) against the generic path's separate passes: the same payload
    bytes and the same residual bits at every step, over lengths that leave every tail size, and
    values at the formats' edges (ties, 16-bit subnormals, the largest finite values). A largest
    value plus its residual can round to infinity at a later step: then both paths refuse it and
    keep the same residual."""
    fused = gcodec.ErrorFeedback(cid, decay=decay)
    plain_codec = gcodec.get_codec(cid)
    plain_codec.plan_feedback = None  # forces the generic path
    plain = gcodec.ErrorFeedback(plain_codec, decay=decay)

    def outcome(ef, x):
        try:
            return bytes(ef.encode(x, "w"))
        except gcodec.PayloadValueError:
            return "refused"

    for k in range(4):
        x = (
            _edge_values(n, 100 * n + k, cid)
            if n > 12
            else np.random.default_rng(k).standard_normal(n).astype(np.float32)
        )
        assert outcome(fused, x) == outcome(plain, x)
        assert fused.residual("w").tobytes() == plain.residual("w").tobytes()


@pytest.mark.parametrize("cid", ["fp16", "bf16"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, "overflow"])
def test_fused_16_bit_feedback_refuses_a_residual_that_is_not_finite_and_keeps_the_old_one(cid, bad):
    """A NaN or infinite input, or (fp16) a value that rounds to infinity, makes the residual
    c - float32(bits) NaN or infinite: both paths refuse the step with PayloadValueError, the old
    residual stays, and the next step encodes as if the refused one had not happened."""
    value = (70000.0 if cid == "fp16" else 3.4e38 * 2) if bad == "overflow" else bad
    if cid == "bf16" and bad == "overflow":
        value = np.float32(3.4028235e38)  # rounds up to bf16's infinity (above its largest, 0x7F7F)
    for plan in (True, False):
        codec = gcodec.get_codec(cid)
        if not plan:
            codec.plan_feedback = None
        ef = gcodec.ErrorFeedback(codec)
        ef.encode(np.linspace(-1, 1, 100, dtype=np.float32), "k")
        before = ef.residual("k").copy()
        x = np.ones(100, np.float32)
        x[37] = value
        with pytest.raises(gcodec.PayloadValueError):
            ef.encode(x, "k")
        assert ef.residual("k").tobytes() == before.tobytes()
        ef.encode(np.ones(100, np.float32), "k")


@pytest.mark.parametrize(
    "cid,params",
    [
        ("topk", {"ratio": 0.01}),
        ("topk", {"ratio": 0.3}),
        ("topk", {"k": 1}),
        ("topk", {"ratio": 0.01, "index_coding": "raw"}),
        ("threshold", {"threshold": 1.5}),
        ("threshold", {"threshold": 0.0}),
        ("threshold", {"threshold": 100.0, "index_coding": "raw"}),
        ("randomk", {"ratio": 0.1}),
        ("randomk", {"k": 1, "seed": 7}),
        # kept values through a nested codec: decoded from the payload, only where kept
        ("topk", {"ratio": 0.05, "values": {"id": "uniform", "bits": 8}}),
        ("threshold", {"threshold": 1.0, "values": {"id": "sign"}}),
        ("randomk", {"ratio": 0.1, "values": {"id": "fp16"}}),
        ("chunktopk", {"chunk": 256, "k": 16}),
        ("chunktopk", {"chunk": 4096, "k": 256, "values": {"id": "uniform", "bits": 2, "group_size": 64}}),
        ("chunktopk", {"chunk": 100, "k": 7, "index_coding": "packed", "values": {"id": "uniform", "bits": 4}}),
        ("chunktopk", {"chunk": 64, "k": 64, "values": {"id": "sign"}}),
    ],
)
@pytest.mark.parametrize("decay", [1.0, 0.95])
@pytest.mark.parametrize("n", [1, 17, 3001, 70_003])
def test_fused_sparse_feedback_is_bit_identical_to_the_generic_path(cid, params, decay, n):
    """Top-k's, threshold's, random-k's and chunked top-k's feedback without a decode of the whole
    tensor (c = x + e, the kept elements set to c - v for the value v the receiver decodes: +0 for
    raw values) against the generic path's decode and subtraction: the same payload bytes and the
    same residual bits at every step, zeros of both signs and ties of magnitude included (a tie is
    kept by the lowest index on both paths, and -0 stays -0 in the residual where it is not kept; a
    threshold of 0 keeps every element, one of 100 none); after a refused step both paths draw
    random-k's next stream alike."""
    fused = gcodec.ErrorFeedback(gcodec.get_codec(cid, **params), decay=decay)
    plain_codec = gcodec.get_codec(cid, **params)
    plain_codec.plan_feedback = None  # forces the generic path
    plain = gcodec.ErrorFeedback(plain_codec, decay=decay)
    rng = np.random.default_rng(n)
    for k in range(4):
        x = rng.standard_normal(n).astype(np.float32)
        if n > 12:
            x[rng.choice(n, 6, replace=False)] = [0.0, -0.0, -0.0, 1.5, -1.5, 1.5]  # signed zeros, ties
        if k == 2:
            x[: n // 2] = 0.0
        assert bytes(fused.encode(x, "w")) == bytes(plain.encode(x, "w"))
        assert fused.residual("w").tobytes() == plain.residual("w").tobytes()
    # a non-finite input is refused by both and leaves the residual as it was
    before = fused.residual("w").copy()
    x = np.ones(n, np.float32)
    x[n // 2] = np.nan
    for ef in (fused, plain):
        with pytest.raises(gcodec.PayloadValueError):
            ef.encode(x, "w")
    assert fused.residual("w").tobytes() == before.tobytes() == plain.residual("w").tobytes()
    x = rng.standard_normal(n).astype(np.float32)
    assert bytes(fused.encode(x, "w")) == bytes(plain.encode(x, "w"))
    assert fused.residual("w").tobytes() == plain.residual("w").tobytes()


def test_fused_sparse_feedback_leaves_other_dtypes_and_the_dct_to_the_generic_path():
    """float64 work keeps float64 residuals, and the DCT selects coefficients while its residual
    lives in the tensor's domain: neither takes the shortcut (plan_feedback answers None); float32
    work with nested values does."""
    from gcodec.codecs.base import EncodeContext
    from gcodec.codecs.state import CodecState

    def ctx():
        return EncodeContext("w", None, CodecState())

    x = np.ones(100, np.float32)
    x64 = np.ones(100, np.float64)
    plain = gcodec.get_codec("topk", ratio=0.1)
    assert plain.plan_feedback(x64, None, np.empty_like(x64), ctx()) is None
    assert plain.plan_feedback(x, None, np.empty_like(x), ctx()) is not None
    hybrid = gcodec.get_codec("chunktopk", chunk=64, k=4, values={"id": "uniform", "bits": 2})
    assert hybrid.plan_feedback(x64, None, np.empty_like(x64), ctx()) is None
    assert hybrid.plan_feedback(x, None, np.empty_like(x), ctx()) is not None
    dct = gcodec.get_codec("dct", chunk=64, k=4)
    assert dct.plan_feedback(x, None, np.empty_like(x), ctx()) is None


@pytest.mark.parametrize("decay", [1.0, 0.95])
def test_fused_nested_feedback_agrees_with_the_generic_path_at_the_float32_limit(decay):
    """Kept values near the float32 limit through a nested codec: the fused path refuses exactly
    what the generic path refuses (a value the nested codec would overflow, or a residual that is
    not finite) and keeps the old residual, or writes the same bytes and bits."""
    rng = np.random.default_rng(3)
    for values in ({"id": "uniform", "bits": 2}, {"id": "fp16"}, {"id": "sign"}):
        codec = gcodec.get_codec("chunktopk", chunk=64, k=8, values=values)
        plain_codec = gcodec.get_codec("chunktopk", chunk=64, k=8, values=values)
        plain_codec.plan_feedback = None
        fused, plain = gcodec.ErrorFeedback(codec, decay=decay), gcodec.ErrorFeedback(plain_codec, decay=decay)
        for step in range(3):
            x = rng.standard_normal(640).astype(np.float32)
            x[rng.choice(640, 20, replace=False)] = np.float32(3.4e38) * rng.choice([-1, 1], 20)
            outcomes = []
            for ef in (fused, plain):
                try:
                    outcomes.append(bytes(ef.encode(x, "w")))
                except gcodec.PayloadValueError:
                    outcomes.append("refused")
            assert outcomes[0] == outcomes[1], (values, step)
            r = [ef.residual("w") for ef in (fused, plain)]
            assert (r[0] is None and r[1] is None) or r[0].tobytes() == r[1].tobytes()


@pytest.mark.parametrize("cid", ["sign", "uniform", "qsgd"])
def test_failed_encode_leaves_the_residual(cid):
    ef = gcodec.ErrorFeedback(cid)
    ef.encode(np.linspace(-1, 1, 100, dtype=np.float32), "k")
    before = ef.residual("k")
    x = np.ones(100, np.float32)
    x[5] = np.nan
    with pytest.raises(gcodec.PayloadValueError):
        ef.encode(x, "k")
    np.testing.assert_array_equal(ef.residual("k"), before)
    ef.encode(np.ones(100, np.float32), "k")  # and it keeps working


def test_state_dict_round_trip_continues_identically():
    """Saving after 3 steps and restoring into a fresh ErrorFeedback (through pickle, as a
    checkpoint would) gives the same next payloads, random streams included."""
    xs = _steps(3, 6, 500)
    make = lambda: gcodec.ErrorFeedback(gcodec.get_codec("qsgd", levels=3, seed=9))  # noqa: E731
    a = make()
    for x in xs[:3]:
        a.encode(x, "p")
        a.encode(2 * x, "q")
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b = make()
    b.load_state_dict(state)
    assert sorted(b.keys()) == ["p", "q"]
    for x in xs[3:]:
        assert bytes(a.encode(x, "p")) == bytes(b.encode(x, "p"))
        assert bytes(a.encode(x, "q")) == bytes(b.encode(x, "q"))
    np.testing.assert_array_equal(a.residual("p"), b.residual("p"))


def test_state_dict_is_a_copy():
    ef = gcodec.ErrorFeedback("sign")
    ef.encode(np.arange(10, dtype=np.float32), "k")
    st = ef.state_dict()
    st["residuals"]["k"][:] = 123
    assert not (ef.residual("k") == 123).any()
    r = ef.residual("k")
    r[:] = 5
    assert not (ef.residual("k") == 5).any()


def test_load_state_dict_checks():
    ef = gcodec.ErrorFeedback("sign")
    with pytest.raises(gcodec.ConfigError):
        ef.load_state_dict({"nothing": 1})
    with pytest.raises(gcodec.ConfigError):
        ef.load_state_dict({"codec": {"id": "fp16"}, "residuals": {}})
    with pytest.raises(gcodec.ConfigError):
        ef.load_state_dict({"residuals": {"k": np.zeros(3, np.int32)}})
    with pytest.raises(gcodec.ConfigError):
        gcodec.ErrorFeedback("qsgd").load_state_dict({"residuals": {}, "streams": {"k": -1}})


def test_reset_forgets_residuals():
    c = gcodec.get_codec("uniform", bits=2)
    ef = gcodec.ErrorFeedback(c)
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    ef.encode(x, "a")
    ef.encode(x, "b")
    ef.reset("a")
    assert ef.residual("a") is None and ef.residual("b") is not None
    assert bytes(ef.encode(x, "a")) == bytes(c.encode(x))  # a fresh start: encodes x itself
    ef.reset()
    assert ef.keys() == []


def test_disable_and_enable_per_key():
    c = gcodec.get_codec("sign")
    ef = gcodec.ErrorFeedback(c)
    x = np.random.default_rng(1).standard_normal(300).astype(np.float32)
    ef.encode(x, "a")
    ef.disable("a")
    assert ef.residual("a") is None
    for _ in range(2):
        assert bytes(ef.encode(x, "a")) == bytes(c.encode(x))  # no memory while disabled
    assert ef.residual("a") is None and "a" not in ef.keys()
    assert "a" in ef.state_dict()["disabled"]
    ef.enable("a")
    ef.encode(x, "a")
    assert ef.residual("a") is not None
    second = ef.encode(x, "a")
    assert bytes(second) != bytes(c.encode(x))  # feedback is back


def test_shape_change_is_refused():
    ef = gcodec.ErrorFeedback("sign")
    ef.encode(np.ones((4, 5), np.float32), "k")
    with pytest.raises(gcodec.ConfigError):
        ef.encode(np.ones((5, 4), np.float32), "k")


def test_feedback_makes_sign_track_the_mean():
    """The point of the residual: with a constant input, EF-sign's running mean of decodes
    converges to the input (|mean - x| <= max|e_T| / T), while plain sign keeps its bias."""
    x = np.linspace(-1, 3, 256).astype(np.float32)
    ef = gcodec.ErrorFeedback(gcodec.get_codec("sign", group_size=0))
    t = 200
    acc = np.zeros(256)
    for _ in range(t):
        acc += gcodec.decode(ef.encode(x, "k"))
    assert np.abs(acc / t - x).max() <= np.abs(ef.residual("k")).max() / t + 1e-5
    plain = gcodec.decode(gcodec.get_codec("sign", group_size=0).encode(x))
    assert np.abs(plain - x).max() > 0.5


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encode_values_is_encode_without_the_payload(codec: str, dtype: type) -> None:
    # the FSDP reduce-scatter's values path: same 16-bit values and residuals as encode, bit for bit
    rng = np.random.default_rng(5)
    a, b = gcodec.ErrorFeedback(codec), gcodec.ErrorFeedback(codec)
    for step in range(3):
        x = (rng.standard_normal(1000) * 10 ** rng.uniform(-3, 3, 1000)).astype(dtype)
        pay = a.encode(x, "k", step=step)
        out = np.empty(1000, np.uint16)
        b.encode_values(x, "k", out)
        assert np.array_equal(gcodec.aggregate.summable_values(pay).view(np.uint16), out)
        assert np.array_equal(a.residual("k"), b.residual("k"))
    with pytest.raises(gcodec.PayloadValueError):
        b.encode_values(np.full(1000, np.inf, dtype), "k", out)
    assert np.array_equal(a.residual("k"), b.residual("k"))  # left unchanged
    with pytest.raises(gcodec.ConfigError):
        gcodec.ErrorFeedback("uniform").encode_values(x, "k", out)


# ---- decay: c_t = x_t + fl(decay * e_(t-1)), e_t = c_t - decode(c_t) (docs/error-feedback.md) -----


@pytest.mark.parametrize("decay", [0.0, -0.5, 1.5, float("nan"), True, "0.9"])
def test_decay_outside_its_range_is_refused(decay):
    with pytest.raises(gcodec.ConfigError):
        gcodec.ErrorFeedback("sign", decay=decay)


@pytest.mark.parametrize("decay", [1.0, 0.95, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decay_follows_its_formula_bit_for_bit(decay, dtype):
    """The residual after each step is c - decode(c) with c = x + fl(decay * e) computed in the
    residual dtype, two roundings (the product, then the sum): checked bit for bit against NumPy."""
    codec = gcodec.get_codec("uniform", bits=2, group_size=16)
    ef = gcodec.ErrorFeedback(codec, decay=decay)
    e = np.zeros((13, 11), dtype)
    for x in _steps(3, 6, (13, 11), dtype):
        buf = ef.encode(x, "w")
        c = x + np.multiply(dtype(decay), e)
        assert bytes(buf) == bytes(codec.encode(c))
        e = c - gcodec.decode(buf)
        np.testing.assert_array_equal(ef.residual("w"), e)


def test_decay_with_a_codec_that_keeps_nothing_is_a_geometric_sum():
    """top-k with k = 0 decodes to zeros, so e_T = sum_t decay^(T-t) x_t. With x_t = 1 for every t
    that is (1 - decay^T) / (1 - decay) (float32 rounding: T steps of relative error 2u each, so
    within 2 T u of the value; 1e-5 relative covers T = 30), which decay = 1 (T) would exceed."""
    decay, T = 0.5, 30
    ef = gcodec.ErrorFeedback(gcodec.get_codec("topk", k=0), decay=decay)
    for _ in range(T):
        ef.encode(np.ones(8, np.float32), "w")
    want = (1 - decay**T) / (1 - decay)
    np.testing.assert_allclose(ef.residual("w"), want, rtol=1e-5)


@pytest.mark.parametrize("decay", [1.0, 0.95, 0.7])
def test_decayed_residual_norm_is_bounded_by_the_geometric_series(decay):
    """Top-k keeps the k largest of n squares, so the dropped part has |c - D(c)|^2 <= (1 - k/n)|c|^2:
    q = sqrt(1 - k/n). With |x_t| <= G, |e_t| <= q (|x_t| + decay |e_(t-1)|), hence
    |e_T| <= q G (1 - (q decay)^T) / (1 - q decay). The float32 roundings add at most a relative
    2^-22 per step to these norms (slack 1e-5 relative). Fixed seed; the chunked codec too."""
    n, k, T = 4096, 64, 40
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(T)]
    G = max(float(np.linalg.norm(x.astype(np.float64))) for x in xs)
    q = np.sqrt(1 - k / n)
    bound = q * G * (1 - (q * decay) ** T) / (1 - q * decay)
    for codec in (gcodec.get_codec("topk", k=k), gcodec.get_codec("chunktopk", chunk=n, k=k)):
        ef = gcodec.ErrorFeedback(codec, decay=decay)
        for x in xs:
            ef.encode(x, "w")
        norm = float(np.linalg.norm(ef.residual("w").astype(np.float64)))
        assert norm <= bound * (1 + 1e-5), (codec, norm, bound)
        if decay < 1:  # and the decay is what keeps it there: without it the residual grows past
            plain = gcodec.ErrorFeedback(codec)
            for x in xs:
                plain.encode(x, "w")
            assert float(np.linalg.norm(plain.residual("w").astype(np.float64))) > norm


@pytest.mark.parametrize("group", [7, 256])
def test_fused_sign_feedback_with_decay_is_bit_identical_to_the_generic_path(group):
    fused = gcodec.ErrorFeedback(gcodec.get_codec("sign", group_size=group), decay=0.95)
    plain_codec = gcodec.get_codec("sign", group_size=group)
    plain_codec.plan_feedback = None  # forces the generic path
    plain = gcodec.ErrorFeedback(plain_codec, decay=0.95)
    for x in _steps(4, 8, 3001):
        a, b = fused.encode(x, "w"), plain.encode(x, "w")
        assert bytes(a) == bytes(b)
        np.testing.assert_array_equal(fused.residual("w"), plain.residual("w"))


def test_decay_is_saved_and_checked_by_the_state_dict():
    ef = gcodec.ErrorFeedback("sign", decay=0.95)
    xs = _steps(5, 5, 200)
    for x in xs[:3]:
        ef.encode(x, "w")
    state = pickle.loads(pickle.dumps(ef.state_dict()))
    assert state["decay"] == 0.95
    again = gcodec.ErrorFeedback("sign", decay=0.95)
    again.load_state_dict(state)
    for x in xs[3:]:
        assert bytes(again.encode(x, "w")) == bytes(ef.encode(x, "w"))
    with pytest.raises(gcodec.ConfigError, match="decay"):
        gcodec.ErrorFeedback("sign").load_state_dict(state)
    old = {k: v for k, v in state.items() if k != "decay"}  # a checkpoint from before decay existed
    gcodec.ErrorFeedback("sign", decay=0.95).load_state_dict(old)


def test_failed_encode_with_decay_leaves_the_residual():
    ef = gcodec.ErrorFeedback("sign", decay=0.9)
    ef.encode(np.linspace(-1, 1, 100, dtype=np.float32), "k")
    before = ef.residual("k")
    x = np.ones(100, np.float32)
    x[5] = np.inf
    with pytest.raises(gcodec.PayloadValueError):
        ef.encode(x, "k")
    np.testing.assert_array_equal(ef.residual("k"), before)
