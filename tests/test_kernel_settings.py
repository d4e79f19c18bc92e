"""The quantizers compile one kernel per setting (gcodec.kernels.cpu.quant, .scales): a setting's
kernel is made on first use, kept and reused, and every one gives the spec model's bytes.

A fresh process compiles only the settings it uses (the cold-start target of docs/performance.md);
these tests check the dispatch, not timings.
"""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec.codecs.qsgd import code_width
from gcodec.kernels.cpu import quant, scales
from gcodec.layout.quant import RULE_ABSMAX, RULE_L2

from . import quant_model as M


def test_each_setting_gets_its_own_kernel_once():
    k8 = quant.encode_kernel(8, RULE_ABSMAX, False, False, False, 64)
    assert quant.encode_kernel(8, RULE_ABSMAX, False, False, False, 64) is k8
    assert quant.encode_kernel(4, RULE_ABSMAX, False, False, False, 64) is not k8
    assert quant.encode_kernel(8, RULE_ABSMAX, True, False, False, 64) is not k8
    assert quant.encode_kernel(8, RULE_ABSMAX, False, False, False, 32) is not k8
    d = quant.decode_kernel(8, False, False, 64)
    assert quant.decode_kernel(8, False, False, 64) is d
    assert quant.decode_kernel(8, False, True, 64) is not d


# Settings no other test file uses, so that each compiles its own specialisation here: odd widths
# through the literal group-of-64 sub-block (encode) and the generic one (decode), float16 scales on
# a large group, and a tail sub-block.
@pytest.mark.parametrize("levels", [3, 31, 63])
@pytest.mark.parametrize("n", [64, 5000])
def test_new_qsgd_settings_compile_and_match_the_model(levels, n):
    w = code_width(levels)
    x = (np.random.default_rng(levels + n).standard_t(3, n) * 0.1).astype(np.float32)
    buf = gcodec.get_codec("qsgd", levels=levels, bucket_size=64, seed=5).encode(x, step=3)
    assert (w, RULE_L2, True, False, False, 64) in quant._ENCODERS
    _, sec = M.payload_sections(buf)
    sc, codes = M.scaled_sections(x, rule="l2", group_size=64, width=w, qmax=levels, stochastic=True, seed=5, stream=3)
    assert sec["scales"].tobytes() == sc and sec["codes"].tobytes() == codes
    want = M.scaled_decode(sec["scales"], codes, n, 64, w)
    np.testing.assert_array_equal(gcodec.decode(buf), want)
    out = np.ones(n, np.float64)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, 1.0 + want.astype(np.float64))
    assert (w, False, True, 0) in quant._DECODERS  # odd widths: no literal decode path


# The group sizes around the default against the model, for the packed widths and both roundings:
# whole sub-blocks take the literal path where the group size has one, the tail sub-block (n is not
# a multiple of 2048) the generic one, so a slip in either shows as different bytes.
@pytest.mark.parametrize("group", [16, 32, 128])
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_literal_group_sizes_match_the_model(group, bits, rounding):
    n = 3 * 2048 + 77
    x = (np.random.default_rng(group + bits).standard_t(3, n) * 0.1).astype(np.float32)
    x[group : 2 * group] = 0.0  # a zero group: scale 0
    codec = gcodec.get_codec("uniform", bits=bits, group_size=group, rounding=rounding, seed=9)
    buf = codec.encode(x, step=2)
    stoch = rounding == "stochastic"
    assert (
        bits,
        RULE_ABSMAX,
        stoch,
        False,
        False,
        group if group in quant.ENCODE_LITERAL_GROUPS else 0,
    ) in quant._ENCODERS
    _, sec = M.payload_sections(buf)
    qmax = (1 << (bits - 1)) - 1
    sc, codes = M.scaled_sections(
        x, rule="absmax", group_size=group, width=bits, qmax=qmax, stochastic=stoch, seed=9, stream=2
    )
    assert sec["scales"].tobytes() == sc and sec["codes"].tobytes() == codes
    want = M.scaled_decode(sec["scales"], codes, n, group, bits)
    np.testing.assert_array_equal(gcodec.decode(buf), want)
    out = np.full(n, 0.5, np.float32)
    gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, np.float32(0.5) + want)
    assert (bits, False, False, group if group in quant.DECODE_LITERAL_GROUPS else 0) in quant._DECODERS


def test_large_group_float16_scales_compile_their_own_kernels():
    x = (np.random.default_rng(1).standard_normal(10000) * 3).astype(np.float32)
    buf = gcodec.get_codec("uniform", bits=4, group_size=9000, scale_dtype="float16").encode(x)
    assert (RULE_ABSMAX, False, True) in scales._KERNELS
    _, sec = M.payload_sections(buf)
    sc, codes = M.scaled_sections(x, rule="absmax", group_size=9000, width=4, qmax=7, stochastic=False, scale_f16=True)
    assert sec["scales"].tobytes() == sc and sec["codes"].tobytes() == codes
