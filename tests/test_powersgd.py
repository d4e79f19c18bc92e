"""``powersgd`` (specs/codecs/powersgd.md): reconstruction, convergence, warm start, the protocol, rules."""

from __future__ import annotations

import itertools
import pickle
import tracemalloc

import numpy as np
import pytest
from vector_cases.sparse import INVALID, psgd_rank2_base
from vector_cases.sparse import _powersgd_payload as powersgd_payload

import gcodec
from gcodec.api import _checked
from gcodec.arrays import BFLOAT16
from gcodec.codecs.powersgd import initial_q, matrix_shape, orthogonalize, should_compress
from gcodec.kernels.cpu.philox import random_u32

from .rules import assert_refused


def rel_err(y: np.ndarray, m: np.ndarray) -> float:
    m64 = m.astype(np.float64)
    return float(np.linalg.norm(y.astype(np.float64) - m64) / np.linalg.norm(m64))


def best_rank_err(m: np.ndarray, r: int) -> float:
    s = np.linalg.svd(m.astype(np.float64).reshape(m.shape[0], -1), compute_uv=False)
    return float(np.sqrt((s[r:] ** 2).sum() / (s**2).sum()))


def spectrum_matrix(m: int, n: int, decay: float, seed: int) -> np.ndarray:
    """U diag(decay**i) V^T with random orthonormal U, V (float64)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, min(m, n))))
    v, _ = np.linalg.qr(rng.standard_normal((n, min(m, n))))
    return (u * decay ** np.arange(min(m, n))) @ v.T


def factors(buf) -> tuple[np.ndarray, np.ndarray]:
    p, checked = _checked(buf, None, full=True)
    e, cls, params = checked[0]
    return cls._factors(params, e, p.views(e))


# ---------------------------------------------------------------------------------------------
# reconstruction and convergence


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("r", [1, 2, 3, 5])
def test_exact_rank_is_reconstructed(dtype, r):
    """M = A B^T of rank r: one power iteration from a random Q spans col(A) exactly.

    What is left is rounding, u = 2**-24 (the factors travel as float32, and float32 input is
    computed in float32), amplified by the conditioning of P = M Q0: the subspace P spans is off by
    about u * cond(M Q0), and so is the reconstruction. Q0 is the spec's initial Q (seed 0, stream 0).
    """
    rng = np.random.default_rng(r)
    m = (rng.standard_normal((120, r)) @ rng.standard_normal((r, 90))).astype(dtype)
    q0 = initial_q(90, r, 0, 0, np.float64)
    kappa = np.linalg.cond(m.astype(np.float64) @ np.linalg.qr(q0)[0])
    y = gcodec.decode(gcodec.get_codec("powersgd", rank=r, warm_start=False).encode(m))
    assert y.dtype == dtype
    assert rel_err(y, m) < 64 * 2.0**-24 * (kappa + 1) * np.sqrt(r)


def test_reshape_is_first_dim_by_the_rest():
    rng = np.random.default_rng(1)
    mat = rng.standard_normal((20, 2)) @ rng.standard_normal((2, 30))
    x = mat.reshape(20, 5, 6).astype(np.float32)
    assert matrix_shape(x.shape) == (20, 30)
    buf = gcodec.get_codec("powersgd", rank=2).encode(x)
    p, q = factors(buf)
    assert p.shape == (20, 2) and q.shape == (30, 2)
    assert rel_err(gcodec.decode(buf), x) < 1e-5


def test_error_approaches_best_rank_r_with_iterations():
    """Subspace iteration: with sigma_i = 0.8**i the excess error shrinks like (0.8**2)**iterations."""
    m = spectrum_matrix(96, 128, 0.8, seed=2)
    best = best_rank_err(m, 4)
    errs = []
    for it in (1, 2, 4, 8, 16, 32):
        c = gcodec.get_codec("powersgd", rank=4, iterations=it, warm_start=False)
        errs.append(rel_err(gcodec.decode(c.encode(m)), m))
    assert all(e >= best * (1 - 1e-9) for e in errs)  # nothing beats the SVD (Eckart-Young)
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(errs))  # never worse with more iterations
    assert errs[0] - best > 1e-3 * best  # one iteration is visibly short of the optimum ...
    assert errs[-1] - best < 1e-6 * best  # ... 32 are at it: 0.64**32 ~ 6e-7


def test_error_approaches_best_rank_r_on_gaussian_matrices():
    """No spectral gap to speak of: convergence is slow, but the gap to the SVD still closes."""
    m = np.random.default_rng(3).standard_normal((128, 256)).astype(np.float32)
    best = best_rank_err(m, 4)
    gaps = []
    for it in (1, 4, 32):
        c = gcodec.get_codec("powersgd", rank=4, iterations=it, warm_start=False)
        gaps.append(rel_err(gcodec.decode(c.encode(m)), m) - best)
    assert gaps[0] > gaps[1] > gaps[2] > -1e-6
    assert gaps[2] < gaps[0] / 10


def test_warm_start_continues_the_power_iteration():
    """Encoding the same matrix again and again with warm start is power iteration across calls."""
    m = spectrum_matrix(64, 80, 0.7, seed=4).astype(np.float32)
    best = best_rank_err(m, 2)
    warm = gcodec.get_codec("powersgd", rank=2)
    cold = gcodec.get_codec("powersgd", rank=2, warm_start=False)
    for _ in range(20):
        e_warm = rel_err(gcodec.decode(warm.encode(m, key="w")), m)
        e_cold = rel_err(gcodec.decode(cold.encode(m, key="w")), m)
    assert e_warm < best * (1 + 1e-4)
    assert e_cold > best * (1 + 1e-3)


# ---------------------------------------------------------------------------------------------
# state and the initial Q


def test_initial_q_follows_the_spec_and_is_shared():
    q = initial_q(7, 3, seed=5, stream=2)
    w = random_u32(5, 2, 21).reshape(7, 3)
    want = 2 * ((w >> np.uint32(8)).astype(np.float64) * 2.0**-24) - 1
    np.testing.assert_array_equal(q, want.astype(np.float32))
    x = np.random.default_rng(5).standard_normal((40, 30)).astype(np.float32)
    a = gcodec.get_codec("powersgd", rank=2, seed=5).encode(x, key="k")
    b = gcodec.get_codec("powersgd", rank=2, seed=5).encode(x, key="k")
    assert bytes(a) == bytes(b)  # two "ranks" with the same seed start from the same Q


def test_state_dict_round_trip():
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((50, 40)).astype(np.float32) for _ in range(4)]
    a = gcodec.get_codec("powersgd", rank=3)
    for x in xs[:3]:
        a.encode(x, key="layer")
    state = pickle.loads(pickle.dumps(a.default_state().state_dict()))
    assert state["arrays"]["q"]["layer"].shape == (40, 3)  # the warm-start Q of the key
    b = gcodec.get_codec("powersgd", rank=3)
    b.default_state().load_state_dict(state)
    assert bytes(a.encode(xs[3], key="layer")) == bytes(b.encode(xs[3], key="layer"))
    c = gcodec.get_codec("powersgd", rank=3)
    assert bytes(c.encode(xs[3], key="layer")) != bytes(b.encode(xs[3], key="layer"))
    with pytest.raises(gcodec.ConfigError):
        gcodec.CodecState().load_state_dict({"streams": {"layer": -1}})


# ---------------------------------------------------------------------------------------------
# the distributed two-round protocol


def test_two_round_protocol_with_two_workers():
    """Both workers end with the same P_hat (P_hat^T (M1 + M2)) / 2; exact when M1 + M2 has rank r."""
    rng = np.random.default_rng(7)
    b = rng.standard_normal((30, 2))
    m1 = (rng.standard_normal((40, 2)) @ b.T).astype(np.float32)
    m2 = (rng.standard_normal((40, 2)) @ b.T).astype(np.float32)
    w1 = gcodec.get_codec("powersgd", rank=2, seed=1)
    w2 = gcodec.get_codec("powersgd", rank=2, seed=1)
    r1, r2 = w1.begin(m1, key="w"), w2.begin(m2, key="w")
    p = r1.p + r2.p  # allreduce P
    r1.p[...] = p
    r2.p[...] = p
    q = r1.compute_q() + r2.compute_q()  # allreduce Q
    r1.q[...] = q
    r2.q[...] = q
    out1 = r1.decompress(scale=0.5)
    out2 = r2.decompress(scale=0.5)
    np.testing.assert_array_equal(out1, out2)
    avg = (m1.astype(np.float64) + m2) / 2
    assert rel_err(out1, avg) < 1e-5
    ph = r1.p.astype(np.float64)
    np.testing.assert_allclose(ph.T @ ph, np.eye(2), atol=1e-6)
    np.testing.assert_array_equal(w1.default_state().get_array("q", "w"), q)  # warm start: the summed Q


def test_begin_refuses_tensors_that_pass_through():
    c = gcodec.get_codec("powersgd", rank=4)
    assert not c.compresses((100,)) and not c.compresses((8, 8)) and c.compresses((64, 64))
    with pytest.raises(gcodec.ConfigError):
        c.begin(np.ones(100, np.float32))


# ---------------------------------------------------------------------------------------------
# pass-through


def test_should_compress_is_torchs_rule():
    # (m + n) * r * rate < m * n
    assert not should_compress(8, 8, 2, 2.0)  # 16*2*2 = 64 == 64
    assert should_compress(9, 8, 2, 2.0)  # 68 < 72
    assert not should_compress(0, 8, 2, 0.0)


def test_passthrough_fp32_and_fp16():
    x = np.random.default_rng(8).standard_normal(37).astype(np.float32)
    buf = gcodec.get_codec("powersgd").encode(x)
    assert gcodec.validate(buf).params == {"mode": "fp32", "rank": 0, "p": None, "q": None}
    np.testing.assert_array_equal(gcodec.decode(buf), x)
    small = x[:12].reshape(3, 4)
    buf16 = gcodec.get_codec("powersgd", passthrough="fp16").encode(small)
    assert gcodec.validate(buf16).params["mode"] == "fp16"
    np.testing.assert_array_equal(gcodec.decode(buf16), small.astype(np.float16).astype(np.float32))
    for shape in ((), (0,), (2, 0, 3)):
        z = np.ones(shape, np.float32)
        np.testing.assert_array_equal(gcodec.decode(gcodec.get_codec("powersgd").encode(z)), z)


@pytest.mark.parametrize("special", [np.nan, np.inf])
@pytest.mark.parametrize("shape", [(64, 64), (10,)])
def test_nonfinite_input_is_rejected(special, shape):
    x = np.ones(shape, np.float32)
    x.reshape(-1)[3] = special
    with pytest.raises(gcodec.PayloadValueError, match="NaN or infinite"):
        gcodec.get_codec("powersgd", rank=2).encode(x)


def test_passthrough_refuses_overflow():
    """Rule P3 holds pass-through data to finite values, so the encoder refuses to overflow binary16."""
    x = np.array([1.0, 1e5, -2.0], np.float32)
    with pytest.raises(gcodec.PayloadValueError, match="overflow"):
        gcodec.get_codec("powersgd", passthrough="fp16").encode(x)
    with pytest.raises(gcodec.PayloadValueError, match="overflow"):
        gcodec.get_codec("powersgd").encode(np.array([1e300, 1.0]))
    np.testing.assert_array_equal(gcodec.decode(gcodec.get_codec("powersgd").encode(x)), x)


# ---------------------------------------------------------------------------------------------
# orthogonalisation


def test_gram_schmidt_keeps_zero_columns_at_zero():
    a = np.random.default_rng(9).standard_normal((50, 2)).astype(np.float32)
    a[:, 0] = 0
    orthogonalize(a, 1e-8)
    assert np.isfinite(a).all() and not a[:, 0].any()
    assert abs(np.linalg.norm(a[:, 1]) - 1) < 1e-6


@pytest.mark.parametrize("r", [1, 2, 4, 9])
def test_orthogonalize_gives_orthonormal_columns(r):
    a = np.random.default_rng(r).standard_normal((300, r))
    orthogonalize(a)
    np.testing.assert_allclose(a.T @ a, np.eye(r), atol=1e-7)


# ---------------------------------------------------------------------------------------------
# the wire: layout, decoding into out=, rules


def test_factor_layout_is_row_major_p_then_q():
    """specs/codecs/powersgd.md section 3: M_hat[i, j] = sum_c P[i*r + c] * Q[j*r + c]."""
    buf = psgd_rank2_base()
    p, checked = _checked(buf, None, full=True)
    views = p.views(checked[0][0])
    pv = np.asarray(views["p"], np.float64).reshape(6, 2)
    qv = np.asarray(views["q"], np.float64).reshape(5, 2)
    np.testing.assert_array_equal(gcodec.decode(buf), (pv @ qv.T).astype(np.float32))


@pytest.mark.parametrize("rank", [4, 12])
def test_decode_accumulates_without_a_full_size_temporary(rank):
    """Every rank reconstructs tiles of rows in place; the only temporaries are per-thread tiles."""
    m = np.random.default_rng(10).standard_normal((1024, 2048)).astype(np.float32)
    buf = gcodec.get_codec("powersgd", rank=rank).encode(m)
    y = gcodec.decode(buf)
    out = np.ones_like(m)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, np.float32(1) + y)  # one add of the finished sum
    tracemalloc.start()
    gcodec.decode(buf, out=out, accumulate=True)
    gcodec.decode(buf, out=out)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < m.nbytes / 8, peak  # includes the header packer's 256 KiB buffer


def spec_reconstruct(p: np.ndarray, q: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """specs/codecs/powersgd.md §6 literally: from +0, add the rounded products for c = 0 .. r-1 in
    order (separate NumPy multiplies and adds: no fused operations), then one add into ``out``."""
    s = np.zeros(out.shape, out.dtype)
    for c in range(p.shape[1]):
        s = s + p[:, c, None].astype(out.dtype) * q[None, :, c].astype(out.dtype)
    out[...] = out + s if accumulate else s


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16])
@pytest.mark.parametrize("r", [1, 2, 4, 7, 9, 16, 33])
def test_decode_follows_the_spec_order_bit_for_bit(dtype, r):
    """Every rank, every output dtype, with and without accumulate: the exact sums of §6 (no BLAS,
    no FMA, no reassociation), so another conforming decoder (a GPU backend) gets the same bits."""
    m, n = 37, 600  # n above one reconstruct tile (512 columns)
    rng = np.random.default_rng(r)
    p = rng.standard_normal((m, r)).astype(np.float32)
    q = rng.standard_normal((n, r)).astype(np.float32)
    buf = powersgd_payload((m, n), p, q, "bfloat16" if dtype == BFLOAT16 else np.dtype(dtype).name)
    work = np.float64 if dtype == np.float64 else np.float32
    want = np.zeros((m, n), work)
    spec_reconstruct(p, q, want, False)
    np.testing.assert_array_equal(gcodec.decode(buf).view(np.uint8), want.astype(dtype).view(np.uint8))
    start = rng.standard_normal((m, n)).astype(dtype)
    got = start.copy()
    gcodec.decode(buf, out=got, accumulate=True)
    want = start.astype(work)
    spec_reconstruct(p, q, want, True)
    np.testing.assert_array_equal(got.view(np.uint8), want.astype(dtype).view(np.uint8))


def test_inexact_vectors_pin_the_summation_order():
    """valid/powersgd_inexact_rank6*: another order, pairwise sums, fused multiply-adds or a float64
    sum would each change many of the 72 decoded elements, so the vector pins §6's order."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "specs" / "vectors" / "valid"
    p, q = factors((root / "powersgd_inexact_rank6.gcd").read_bytes())
    want = np.load(root / "powersgd_inexact_rank6.npy")

    def ordered(cs):
        s = np.zeros((8, 9), np.float32)
        for c in cs:
            s = s + p[:, c, None] * q[None, :, c]
        return s

    fused = np.zeros((8, 9), np.float32)
    for c in range(6):  # fma(a, b, s): the exact product (float64) added, then one rounding
        fused = (fused + p[:, c, None].astype(np.float64) * q[None, :, c]).astype(np.float32)
    t = [p[:, c, None] * q[None, :, c] for c in range(6)]
    pairwise = ((t[0] + t[1]) + (t[2] + t[3])) + (t[4] + t[5])
    np.testing.assert_array_equal(ordered(range(6)).view(np.uint32), want.view(np.uint32))
    for alt in (ordered(range(5, -1, -1)), fused, pairwise, (p.astype(np.float64) @ q.T).astype(np.float32)):
        assert (alt.view(np.uint32) != want.view(np.uint32)).sum() > 20


def test_error_feedback_works_with_powersgd():
    ef = gcodec.ErrorFeedback(gcodec.get_codec("powersgd", rank=1))
    rng = np.random.default_rng(11)
    total_in = np.zeros((30, 20))
    total_out = np.zeros((30, 20))
    for _ in range(10):
        g = rng.standard_normal((30, 20)).astype(np.float32)
        total_in += g
        total_out += gcodec.decode(ef.encode(g, key="w"))
    np.testing.assert_allclose(total_out + ef.residual("w"), total_in, atol=1e-4)


@pytest.mark.parametrize("name, make, error, rule", [c for c in INVALID if "_powersgd_" in c[0]])
def test_rule(name, make, error, rule):
    assert_refused(make(), error, rule)


# ---------------------------------------------------------------------------------------------
# decode work is a limit (max_decode_work, docs/limits.md; specs/codecs/powersgd.md)


def _zero_payload(codec: str, shape: list[int], params: dict) -> bytes:
    """A structurally valid payload with every section zero (valid CRCs), built from the header alone."""
    from tests.codec_kit import rebuild

    cls = gcodec.codec_class(codec)
    secs, pos = [], 0
    for name, dt, nb in cls.expected_sections(params, tuple(shape)):
        pos = (pos + 7) // 8 * 8
        secs.append([name, dt, pos, nb])
        pos += nb
    length = (pos + 7) // 8 * 8
    t = {"codec": codec, "version": 1, "dtype": "float32", "shape": shape, "params": params, "sections": secs}
    return rebuild({"tensors": [t], "data_length": length}, bytes(length))


def test_decode_work_limit_refuses_huge_rank_before_decoding():
    """8192 x 8192 at rank 1024 with 1-bit factors: a 2 MiB payload asking for 2**36 multiply-adds."""
    sign = {"codec": "sign", "params": {"group_size": 256}, "version": 1}
    params = {"mode": "lowrank", "p": sign, "q": sign, "rank": 1024}
    b = _zero_payload("powersgd", [8192, 8192], params)
    assert len(b) < 3 << 20
    for fn in (gcodec.validate, gcodec.decode):
        with pytest.raises(
            gcodec.LimitExceededError, match=r"68719476736 exceeds max_decode_work=.*gcodec\.scoped_limits"
        ):
            fn(b)
    # the same shape at rank 32 is within the default
    ok = _zero_payload("powersgd", [8192, 8192], {**params, "rank": 32})
    assert gcodec.validate(ok).shape == (8192, 8192)
    with pytest.raises(gcodec.LimitExceededError, match="max_decode_work"):
        gcodec.validate(ok, limits=gcodec.Limits(max_decode_work=(8192 * 8192 * 32) - 1))


def test_encoder_refuses_what_exceeds_the_work_limit():
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    codec = gcodec.get_codec("powersgd", rank=8)
    with gcodec.scoped_limits(max_decode_work=64 * 64 * 8 - 1):
        with pytest.raises(gcodec.LimitExceededError, match="max_decode_work"):
            codec.encode(x)
    with gcodec.scoped_limits(max_decode_work=64 * 64 * 8):
        gcodec.decode(codec.encode(x))
