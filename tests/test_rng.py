"""specs/rng.md: Philox4x32-10, how words are addressed, and the 16-bit draws of stochastic rounding."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from gcodec import rng as rng_facts
from gcodec.kernels.cpu import philox as rng

# Random123's known-answer vectors for philox4x32 with 10 rounds (kat_vectors, "philox4x32 10"):
# counter words, key words, expected output words.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_reference_philox_matches_random123(ctr, key, want):
    assert tuple(int(v) for v in rng.philox4x32(*ctr, *key)) == want


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_vectorised_blocks_match_random123(ctr, key, want):
    # fill_blocks takes the block index as the 64-bit counter (c0, c1) and the stream as (c2, c3)
    block = ctr[0] | (ctr[1] << 32)
    ks = rng.key_schedule(np.uint32(key[0]), np.uint32(key[1]))
    buf = np.zeros(4, np.uint32)

    @njit
    def one(buf, block, s0, s1, ks):
        rng.fill_blocks(buf, block, 1, s0, s1, ks)

    one(buf, np.uint64(block), np.uint32(ctr[2]), np.uint32(ctr[3]), ks)
    assert tuple(int(v) for v in buf) == want


def test_random_u32_addresses_words_as_specified():
    """Word j of (seed, stream) is word j % 4 of the block with counter (j // 4, stream), key seed."""
    seed, stream = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    w = rng.random_u32(seed, stream, 4 * 3 + 2, start=4 * ((1 << 32) - 1))  # crosses 2**32 blocks
    for j in range(w.size):
        b = (1 << 32) - 1 + j // 4
        words = rng.philox4x32(
            b & 0xFFFFFFFF, b >> 32, stream & 0xFFFFFFFF, stream >> 32, seed & 0xFFFFFFFF, seed >> 32
        )
        assert int(w[j]) == int(words[j % 4])


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1000, 70001])
def test_fast_fill_equals_word_by_word(n):
    @njit
    def ref(n, sl, sh, tl, th):
        out = np.empty(n, np.uint32)
        for i in range(n):
            out[i] = rng.word_at(sl, sh, tl, th, i)
        return out

    seed, stream = 2**64 - 1, 12345
    got = rng.random_u32(seed, stream, n)
    np.testing.assert_array_equal(got, ref(n, *rng_facts.split64(seed), *rng_facts.split64(stream)))
    if n > 8:
        np.testing.assert_array_equal(rng.random_u32(seed, stream, n - 8, start=8), got[8:])


def test_u16_draws_are_the_little_endian_halves():
    w = rng.random_u32(7, 9, 6)
    r = rng.random_u16(7, 9, 11)
    for i in range(11):
        assert int(r[i]) == (int(w[i // 2]) >> (16 * (i % 2))) & 0xFFFF
    np.testing.assert_array_equal(rng.random_u16(7, 9, 3, start=8), rng.random_u16(7, 9, 11)[8:])


def test_open01_is_the_cell_midpoint():
    @njit
    def f(r):
        return rng.u16_to_open01(r)

    assert f(np.uint16(0)) == np.float32(2.0**-17)
    assert f(np.uint16(0xFFFF)) == np.float32(1 - 2.0**-17)
    assert f(np.uint16(0x8000)) == np.float32(0.5 + 2.0**-17)


def test_seeds_and_streams_give_different_words():
    base = rng.random_u32(1, 0, 64)
    assert not np.array_equal(base, rng.random_u32(2, 0, 64))
    assert not np.array_equal(base, rng.random_u32(1, 1, 64))
    assert not np.array_equal(base, rng.random_u32(1 << 32, 0, 64))  # the seed's high word counts
    assert not np.array_equal(base, rng.random_u32(1, 1 << 32, 64))  # so does the stream's


def test_words_look_uniform():
    """Each of the 32 bits of 2**20 words is set with frequency 1/2 within 6 standard deviations
    (sd = sqrt(N/4) = 512), and the 16 four-bit nibbles of the low half are equally frequent
    (chi-square with 15 degrees of freedom below 60, p < 1e-6)."""
    n = 1 << 20
    w = rng.random_u32(99, 5, n)
    for b in range(32):
        ones = int(((w >> np.uint32(b)) & np.uint32(1)).sum())
        assert abs(ones - n / 2) < 6 * 512, b
    counts = np.bincount((w & np.uint32(0xF)).astype(np.int64), minlength=16)
    chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
    assert chi2 < 60


def test_no_global_random_state_is_touched():
    np.random.seed(5)  # noqa: NPY002  (the legacy global state is what must stay untouched)
    a = np.random.random(3)  # noqa: NPY002
    np.random.seed(5)  # noqa: NPY002  (the legacy global state is what must stay untouched)
    rng.random_u32(1, 2, 100)
    rng.random_u16(1, 2, 100)
    np.testing.assert_array_equal(np.random.random(3), a)  # noqa: NPY002


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_seed_and_stream_ranges(bad):
    with pytest.raises(ValueError):
        rng.random_u32(bad, 0, 4)
    with pytest.raises(ValueError):
        rng.random_u32(0, bad, 4)
