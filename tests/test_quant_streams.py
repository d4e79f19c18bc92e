"""Random streams of the stochastic codecs (specs/rng.md §5) and thread-count independence."""

from __future__ import annotations

import copy
import os
import pickle

import numba
import numpy as np
import pytest

import gcodec

from . import quant_model as M

STOCHASTIC = [
    ("uniform", {"rounding": "stochastic", "bits": 4}),
    ("qsgd", {"levels": 3}),
    ("terngrad", {"group_size": 64}),
]
X = np.random.default_rng(0).standard_normal(3001).astype(np.float32)


def _stream(buf):
    return gcodec.validate(buf).params["stream"]


@pytest.mark.parametrize("cid, kw", STOCHASTIC)
def test_same_seed_stream_and_input_give_identical_bytes(cid, kw):
    a = gcodec.get_codec(cid, seed=5, **kw).encode(X, step=9)
    b = gcodec.get_codec(cid, seed=5, **kw).encode(X.copy(), step=9)
    assert bytes(a) == bytes(b)


@pytest.mark.parametrize("cid, kw", STOCHASTIC)
def test_different_seeds_or_streams_give_different_rounding(cid, kw):
    base = M.payload_sections(gcodec.get_codec(cid, seed=5, **kw).encode(X, step=9))[1]["codes"]
    other_seed = M.payload_sections(gcodec.get_codec(cid, seed=6, **kw).encode(X, step=9))[1]["codes"]
    other_step = M.payload_sections(gcodec.get_codec(cid, seed=5, **kw).encode(X, step=10))[1]["codes"]
    assert not np.array_equal(base, other_seed)
    assert not np.array_equal(base, other_step)


@pytest.mark.parametrize("cid, kw", STOCHASTIC)
def test_per_key_counter_advances_per_call_and_is_recorded(cid, kw):
    c = gcodec.get_codec(cid, seed=1, **kw)
    assert [_stream(c.encode(X)) for _ in range(3)] == [0, 1, 2]
    assert [_stream(c.encode(X, key="w")) for _ in range(2)] == [0, 1]  # keys count separately
    assert _stream(c.encode(X, step=77)) == 77  # an explicit step is used as it is ...
    assert _stream(c.encode(X)) == 3  # ... and does not move the counter
    assert c.default_state().next_stream() == 4 and c.default_state().next_stream("w") == 2
    # a counter-chosen stream gives the same bytes as passing that step
    assert bytes(gcodec.get_codec(cid, seed=1, **kw).encode(X, step=3)) == bytes(c.encode(X, step=3))


@pytest.mark.parametrize("cid, kw", [*STOCHASTIC, ("randomk", {"k": 10})])
def test_a_refused_encode_advances_the_counter_like_any_call(cid, kw):
    # Workers that encode in lockstep without step= must keep drawing the same streams even when
    # one of them refuses a call (NaN input is local to a worker): every call takes one stream.
    c = gcodec.get_codec(cid, seed=1, **kw)
    bad = X.copy()
    bad[7] = np.nan
    with pytest.raises(gcodec.PayloadValueError):
        c.encode(bad, key="w")
    assert c.default_state().next_stream("w") == 1
    assert _stream(c.encode(X, key="w")) == 1


@pytest.mark.parametrize("step", [-1, 2**64, 1.5, "3", True])
def test_bad_steps(step):
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("qsgd").encode(X, step=step)


def test_largest_seed_and_stream():
    c = gcodec.get_codec("qsgd", seed=2**64 - 1)
    buf = c.encode(X, step=2**64 - 1)
    assert gcodec.validate(buf).params["seed"] == 2**64 - 1 and _stream(buf) == 2**64 - 1
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("qsgd", seed=2**64)


def test_counters_live_in_the_state_which_survives_pickle_and_copy():
    c = gcodec.get_codec("terngrad", seed=3)
    st = gcodec.CodecState()
    gcodec.encode(X, c, state=st)
    gcodec.encode(X, c, state=st)
    for d in (pickle.loads(pickle.dumps(st)), copy.deepcopy(st)):
        assert d.next_stream() == 2
        assert _stream(gcodec.encode(X, c, state=d)) == 2
    assert st.next_stream() == 2  # the copies moved on, the original did not
    assert c.default_state().next_stream() == 0  # an explicit state leaves the codec's own alone
    c2 = pickle.loads(pickle.dumps(c))
    assert c2 == c and c2.default_state().next_stream() == 0  # a codec is configuration only


def test_separate_states_count_separately():
    c = gcodec.get_codec("qsgd", seed=1)
    a, b = gcodec.CodecState(), gcodec.CodecState()
    assert [_stream(gcodec.encode(X, c, state=a)) for _ in range(2)] == [0, 1]
    assert _stream(gcodec.encode(X, c, state=b)) == 0


def test_nearest_rounding_needs_no_stream_and_ignores_steps():
    c = gcodec.get_codec("uniform", bits=4)
    assert bytes(c.encode(X, step=1)) == bytes(c.encode(X, step=2)) == bytes(c.encode(X))


def test_global_numpy_random_state_untouched():
    np.random.seed(1)  # noqa: NPY002  (the legacy global state is what must stay untouched)
    a = np.random.random(4)  # noqa: NPY002
    np.random.seed(1)  # noqa: NPY002  (the legacy global state is what must stay untouched)
    for cid, kw in STOCHASTIC:
        gcodec.get_codec(cid, **kw).encode(X)
    np.testing.assert_array_equal(np.random.random(4), a)  # noqa: NPY002


@pytest.mark.parametrize(
    "cid, kw",
    [
        *STOCHASTIC,
        ("uniform", {}),
        ("uniform", {"group_size": 100_000, "rounding": "stochastic"}),
        ("qsgd", {"bucket_size": 0}),
        ("terngrad", {"clip": 2.5}),
        ("sign", {}),
        ("sign", {"group_size": 0}),
    ],
)
def test_bytes_do_not_depend_on_the_thread_count(cid, kw):
    x = np.random.default_rng(1).standard_normal(300_001).astype(np.float32)
    with gcodec.num_threads(1):
        one = bytes(gcodec.get_codec(cid, **kw).encode(x, step=4))
        y1 = gcodec.decode(one)
    with gcodec.num_threads(max(2, numba.config.NUMBA_NUM_THREADS)):
        many = bytes(gcodec.get_codec(cid, **kw).encode(x, step=4))
        y2 = gcodec.decode(many)
    assert one == many
    np.testing.assert_array_equal(y1, y2)


def _encode_in_child(conn):  # runs in a forked child
    x = np.random.default_rng(1).standard_normal(300_001).astype(np.float32)
    conn.send(bytes(gcodec.get_codec("qsgd").encode(x, step=4)))
    conn.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_the_thread_pool_works_in_a_forked_child():
    # The kernels' worker threads do not survive fork(); a child must make its own pool (and not
    # inherit a lock held by a parent thread) and still produce the same bytes.
    import multiprocessing as mp

    x = np.random.default_rng(1).standard_normal(300_001).astype(np.float32)
    want = bytes(gcodec.get_codec("qsgd").encode(x, step=4))  # the parent's pool exists now
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_encode_in_child, args=(send,))
    child.start()
    send.close()
    assert recv.poll(120), "the forked child did not answer"
    got = recv.recv()
    child.join(30)
    assert child.exitcode == 0
    assert got == want
