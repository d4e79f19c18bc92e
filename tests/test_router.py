"""The router's residual placement: every element range a codec still owes reaches the new layout
exactly (a DDP bucket rebuild, a two-phase split, FSDP's rows at another world size, a codec switch,
a parameter going dense, a checkpoint), and the engines' policy forms all speak one language."""

from __future__ import annotations

import numpy as np
import pytest

import gcodec
from gcodec.errors import ConfigError
from gcodec.policy import Policy, Rules, as_policy
from gcodec.transports import Piece, Router
from gcodec.transports.two_phase import owner_bounds

U8 = {"id": "uniform", "bits": 8}


def _res(n: int, seed: int, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def _flat(router: Router, codec: dict, key: str, names: list[tuple[str, int]]) -> np.ndarray | None:
    ts = router.state_for(router.codec(codec))  # type: ignore[arg-type]
    router.place(ts, key, "flat", [[Piece.whole(n, c) for n, c in names]], [(sum(c for _, c in names),)])
    return ts.worker.residual(key)  # type: ignore[union-attr]


def test_a_bucket_rebuild_moves_every_parameter_slice() -> None:
    r = Router(codec=U8)
    ts = r.state_for(r.codec(U8))  # type: ignore[arg-type]
    assert _flat(r, U8, "A", [("w1", 5), ("w2", 7)]) is None  # a new group owes nothing
    a = _res(12, 0)
    ts.worker.set_residual("A", a.copy())  # type: ignore[union-attr]  # what an encode left
    # DDP rebuilds: w2 now first in a group with w3, w1 alone
    b = _flat(r, U8, "B", [("w2", 7), ("w3", 4)])
    c = _flat(r, U8, "C", [("w1", 5)])
    np.testing.assert_array_equal(b, np.concatenate([a[5:], np.zeros(4, np.float32)]))
    np.testing.assert_array_equal(c, a[:5])
    assert ts.worker.residual("A") is None  # type: ignore[union-attr]  # nothing left behind twice
    # steady: placing the same layout again changes nothing
    ts.worker.set_residual("B", b * 2)  # type: ignore[union-attr]
    np.testing.assert_array_equal(_flat(r, U8, "B", [("w2", 7), ("w3", 4)]), b * 2)


def test_two_phase_chunks_and_flat_groups_exchange_residuals() -> None:
    r = Router(codec=U8)
    ts = r.state_for(r.codec(U8))  # type: ignore[arg-type]
    vec = [[Piece.whole("w", 10), Piece.whole("v", 3)]]
    r.place(ts, "G", "split", vec, [(3,)])
    a = _res(13, 1)
    b = owner_bounds(13, 3)
    for j in range(3):
        ts.worker.set_residual(f"G[{j}/3]", a[b[j] : b[j + 1]].copy())  # type: ignore[union-attr]
    got = _flat(r, U8, "H", [("v", 3), ("w", 10)])
    np.testing.assert_array_equal(got, np.concatenate([a[10:], a[:10]]))
    assert all(ts.worker.residual(f"G[{j}/3]") is None for j in range(3))  # type: ignore[union-attr]


def test_a_two_phase_group_at_a_new_world_size_re_slices_its_residual() -> None:
    """The same tensors under the same key, now split among 2 owners instead of 3 (a quorum that
    lost a replica): every element the 3 chunks owed is in the 2 new ones, none in the old keys."""
    r = Router(codec=U8)
    ts = r.state_for(r.codec(U8))  # type: ignore[arg-type]
    vec = [[Piece.whole("w", 10), Piece.whole("v", 3)]]
    r.place(ts, "G", "split", vec, [(3,)])
    a = _res(13, 3)
    b3 = owner_bounds(13, 3)
    for j in range(3):
        ts.worker.set_residual(f"G[{j}/3]", a[b3[j] : b3[j + 1]].copy())  # type: ignore[union-attr]
    r.place(ts, "G", "split", vec, [(2,)])
    b2 = owner_bounds(13, 2)
    for j in range(2):
        np.testing.assert_array_equal(ts.worker.residual(f"G[{j}/2]"), a[b2[j] : b2[j + 1]])  # type: ignore[union-attr]
    assert all(ts.worker.residual(f"G[{j}/3]") is None for j in range(3))  # type: ignore[union-attr]


def _rows(name: str, numel: int, p: int) -> list[list[Piece]]:
    clen = -(-numel // p)
    return [[Piece(name, min(j * clen, numel), min((j + 1) * clen, numel), clen)] for j in range(p)]


def test_fsdp_rows_saved_on_4_ranks_are_placed_on_2() -> None:
    """FSDP pads dim 0: 10 elements on 4 ranks are rows of 3 (the last holds 1 and 2 of padding);
    saved by element range, they fill rows of 5 on 2 ranks."""
    r4 = Router(codec=U8)
    ts = r4.state_for(r4.codec(U8))  # type: ignore[arg-type]
    r4.place(ts, "M", "rows", _rows("fc", 10, 4))
    full = _res(10, 2)
    for j in range(4):
        row = np.zeros(3, np.float32)
        part = full[3 * j : 3 * j + 3]
        row[: part.shape[0]] = part
        ts.worker.set_residual(f"M[{j}/4]", row)  # type: ignore[union-attr]
    saved = r4.ranges()
    assert sorted(saved) == ["fc[0:3]", "fc[3:6]", "fc[6:9]", "fc[9:10]"]
    r2 = Router(codec=U8)
    r2.hold(saved)
    ts2 = r2.state_for(r2.codec(U8))  # type: ignore[arg-type]
    r2.place(ts2, "M2", "rows", _rows("fc", 10, 2))
    np.testing.assert_array_equal(ts2.worker.residual("M2[0/2]"), full[:5])  # type: ignore[union-attr]
    np.testing.assert_array_equal(ts2.worker.residual("M2[1/2]"), full[5:])  # type: ignore[union-attr]
    assert r2.ranges().keys() == {"fc[0:5]", "fc[5:10]"}


def test_a_bucket_rebuild_keeps_every_matrixs_lowrank_residual() -> None:
    """PowerSGD keeps its residuals by matrix. A rebuild that splits a group {w1, w2} into {w2}
    placed first and {w1} placed second must keep both: releasing the old group once its last
    matrix has left must not drop the residual that w2's new group already holds (it did: error
    feedback then lost a step's residual at DDP's rebuild, and a resumed job drifted)."""
    r = Router(codec={"id": "powersgd", "rank": 1})
    tp = r.state_for(r.codec({"id": "powersgd", "rank": 1}))  # type: ignore[arg-type]
    r.place(tp, "A", "lowrank", [[Piece.whole("w1", 6)], [Piece.whole("w2", 4)]], [(2, 3), (2, 2)])
    a1, a2 = _res(6, 1).reshape(2, 3), _res(4, 2).reshape(2, 2)
    tp.lowrank_residuals["w1"], tp.lowrank_residuals["w2"] = a1.copy(), a2.copy()  # what a step left
    r.place(tp, "B", "lowrank", [[Piece.whole("w2", 4)]], [(2, 2)])
    r.place(tp, "C", "lowrank", [[Piece.whole("w1", 6)], [Piece.whole("w3", 9)]], [(2, 3), (3, 3)])
    np.testing.assert_array_equal(tp.lowrank_residuals["w2"], a2)
    np.testing.assert_array_equal(tp.lowrank_residuals["w1"], a1)
    assert "w3" not in tp.lowrank_residuals  # a new matrix owes nothing
    assert sorted(r.ranges()) == ["w1[0:6]", "w2[0:4]"]


def test_a_codec_switch_and_a_dense_step_lose_nothing() -> None:
    r = Router(codec=U8)
    tu = r.state_for(r.codec(U8))  # type: ignore[arg-type]
    r.place(tu, "k", "flat", [[Piece.whole("w", 6)]], [(2, 3)])
    a = _res(6, 3).reshape(2, 3)
    tu.worker.set_residual("k", a.copy())  # type: ignore[union-attr]
    topk = {"id": "topk", "ratio": 0.5}
    tt = r.state_for(r.codec(topk))  # type: ignore[arg-type]
    r.place(tt, "k", "flat", [[Piece.whole("w", 6)]], [(2, 3)])
    np.testing.assert_array_equal(tt.worker.residual("k"), a)  # type: ignore[union-attr]  # the tensor's shape
    assert tu.worker.residual("k") is None  # type: ignore[union-attr]
    # PowerSGD keeps it as the parameter's matrix
    tp = r.state_for(r.codec({"id": "powersgd", "rank": 1}))  # type: ignore[arg-type]
    r.place(tp, "p", "lowrank", [[Piece.whole("w", 6)]], [(2, 3)])
    np.testing.assert_array_equal(tp.lowrank_residuals["w"], a)
    assert tt.worker.residual("k") is None  # type: ignore[union-attr]
    assert r.residual_norm("w") == pytest.approx(float(np.linalg.norm(a)), rel=1e-6)
    taken = r.take([[Piece.whole("w", 6)]])
    assert taken is not None
    np.testing.assert_array_equal(taken[0], a.reshape(-1))
    assert "w" not in tp.lowrank_residuals and r.take([[Piece.whole("w", 6)]]) is None
    assert r.ranges() == {}


def test_a_codec_without_feedback_gets_the_pending_residual_to_send() -> None:
    r = Router(codec=U8, error_feedback=False)
    a = _res(8, 4, np.float64)  # float64 residuals stay float64 through every move
    r.hold({"w[0:8]": a})
    ts = r.state_for(r.codec(U8))  # type: ignore[arg-type]
    with pytest.raises(gcodec.ConfigError, match="keeps no residuals"):
        r.place(ts, "k", "flat", [[Piece.whole("w", 8)]], [(8,)])
    flush = r.take([[Piece.whole("w", 8)]])
    assert flush is not None and flush[0] is not None and flush[0].dtype == np.float64
    np.testing.assert_array_equal(flush[0], a)
    assert r.take([[Piece.whole("w", 8)]]) is None  # sent once, not twice


def test_a_checkpoint_of_the_router_restores_every_range() -> None:
    r = Router(codec=U8)
    ts = r.state_for(r.codec(U8))  # type: ignore[arg-type]
    r.place(ts, "A", "flat", [[Piece.whole("w1", 4), Piece.whole("w2", 4)]], [(8,)])
    a = _res(8, 5)
    ts.worker.set_residual("A", a.copy())  # type: ignore[union-attr]
    sd = r.state_dict()
    back = Router(codec=U8)
    back.load_state_dict(sd)
    got = _flat(back, U8, "A", [("w1", 4), ("w2", 4)])
    np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize("bad", ["w", "w[3:1]", "w[a:2]", "w[0:2"])
def test_held_ranges_are_checked(bad: str) -> None:
    with pytest.raises(ConfigError):
        Router().hold({bad: np.zeros(2, np.float32)})
    with pytest.raises(ConfigError):
        Router().hold({"w[0:3]": np.zeros(2, np.float32)})  # 2 values for 3 elements
    with pytest.raises(ConfigError):
        Router().hold({"w[0:2]": np.zeros(2, np.int32)})


def test_the_engines_policy_forms_speak_one_language() -> None:
    p = Policy([{"name": "a.*", "codec": U8}], default="bf16", min_numel=4)
    assert as_policy(p) is p
    rules = as_policy({"a.*": U8, "b.*": None}, codec="fp16", min_numel=4, dense_1d=True)
    assert isinstance(rules, Rules)
    assert rules.codec_for("a.weight", (4, 4)).get_config() == gcodec.get_codec(U8).get_config()  # type: ignore[union-attr]
    assert rules.codec_for("b.weight", (4, 4)) is None  # the pattern says dense
    assert rules.codec_for("c.weight", (1, 2)) is None  # under min_numel
    assert rules.codec_for("c.bias", (16,)) is None  # 1-D, not named explicitly
    assert rules.codec_for("a.bias", (16,)) is not None  # 1-D, named by a pattern
    assert rules.codec_for("c.weight", (4, 4)).codec_id == "fp16"  # type: ignore[union-attr]
    seen = []
    call = as_policy(lambda name, t: seen.append(t) or "bf16", codec="fp16", min_numel=0)
    assert call.codec_for("w", (3, 3), 0, "TENSOR").codec_id == "bf16"  # the engine's tensor is handed over
    assert seen == ["TENSOR"]
    # a codec that would pass a shape through keeps it dense (PowerSGD on a thin matrix)
    thin = as_policy(None, codec={"id": "powersgd", "rank": 4}, min_numel=0)
    assert thin.codec_for("w", (4, 2)) is None and thin.codec_for("w", (256, 256)) is not None
    with pytest.raises(ConfigError):
        Rules(42)


def test_fsdp_state_follows_a_policy() -> None:
    """FSDP2 asks its router, which takes a Policy as it is (it once took only callables and
    pattern dicts, and compressed every tensor with the default codec under a Policy)."""
    pytest.importorskip("torch")
    from gcodec.torch import FSDPState

    p = Policy([{"name": "0.*", "codec": U8}], default="bf16", min_numel=64, warmup_steps=2)
    st = FSDPState(policy=p)
    assert st.codec_for("0.weight", (64, 128), step=0) is None  # the policy's warm-up
    assert st.codec_for("0.weight", (64, 128), step=2).codec_id == "uniform"  # type: ignore[union-attr]
    assert st.codec_for("1.weight", (64, 64), step=2).codec_id == "bf16"  # type: ignore[union-attr]
    assert st.codec_for("1.bias", (64,), step=2) is None
    with pytest.raises(ConfigError, match="row chunks"):
        FSDPState(policy=Policy(default={"id": "powersgd"}, min_numel=0)).codec_for("w", (64, 64), step=0)


def test_changing_the_engine_settings_takes_effect_at_the_next_choice() -> None:
    r = Router(codec=U8, min_numel=10)
    assert r.choose("w", (4, 4), 0).codec_id == "uniform"  # type: ignore[union-attr]
    r.configure(min_numel=100)
    assert r.choose("w", (4, 4), 0) is None
    r.configure(codec="bf16", min_numel=0)
    assert r.choose("w", (4, 4), 0).codec_id == "bf16"  # type: ignore[union-attr]
    r.policy = {"w": None}
    assert r.choose("w", (4, 4), 0) is None and r.choose("v", (4, 4), 0).codec_id == "bf16"  # type: ignore[union-attr]
    with pytest.raises(ConfigError):
        r.configure(bits=3)


class _Counting:
    """A rank's communicator that counts the collectives its protocols start."""

    def __init__(self, comm) -> None:  # type: ignore[no-untyped-def]
        self.comm, self.calls = comm, 0
        self.rank, self.size = comm.rank, comm.size

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        fn = getattr(self.comm, name)
        if name in ("allreduce", "allgather", "allgatherv", "alltoallv"):

            def counted(*a, **k):  # type: ignore[no-untyped-def]
                self.calls += 1
                return fn(*a, **k)

            return counted
        return fn


# Three dense keys (a policy keeps the 1-D ones dense) and two compressed ones under two codecs
# (so each goes alone), two steps, three ranks, error feedback on: all keys at once must give
# every key the bits of one key at a time, with the dense keys in one agreement and one allreduce
# instead of two collectives each.
_KEYS = [("w1", (8, 16)), ("b1", (16,)), ("w2", (16, 4)), ("b2", (4,)), ("g", (7,))]


def _many_run(joined: bool) -> list:  # type: ignore[type-arg]
    from gcodec.transports import run_blocking

    from .localcomm import run_threads

    def rank(comm):  # type: ignore[no-untyped-def]
        c = _Counting(comm)
        r = Router(as_policy({"w1": U8, "w2": {**U8, "group_size": 32}, "*": None}, min_numel=0))
        outs, calls = [], []
        for step in range(2):
            xs = [
                np.random.default_rng([comm.rank, step, i]).standard_normal(s).astype(np.float32)
                for i, (_, s) in enumerate(_KEYS)
            ]
            before = c.calls
            if joined:
                run_blocking(r.protocol_many(c, [(k, x, x) for (k, _), x in zip(_KEYS, xs)], "mean"))
            else:
                for (k, _), x in zip(_KEYS, xs):
                    run_blocking(r.protocol(c, x, x, k, "mean"))
            outs.append([x.copy() for x in xs])
            calls.append(c.calls - before)
        return outs, calls, {k: r.last(k)["payload_bytes"] for k, _ in _KEYS}

    return run_threads(3, rank)


def test_protocol_many_joins_the_dense_keys_and_changes_no_bit() -> None:
    one, many = _many_run(False), _many_run(True)
    for a, b in zip(one, many):
        assert not isinstance(a, BaseException) and not isinstance(b, BaseException), (a, b)
        for xs, ys in zip(a[0], b[0]):
            for x, y in zip(xs, ys):
                np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))
        assert a[2] == b[2]  # every key's own bytes in its record
        # one at a time, a dense key costs 4 collectives at its first step (a BEGIN, its fingerprint
        # agreed in full in 2, the allreduce) and 2 later (a BEGIN with the digest, the allreduce),
        # and each compressed key (two-phase at 3 ranks) agrees on its own fingerprint (2 more at the
        # first step). Joined, the call agrees once: the second key's BEGIN becomes its size
        # exchange (the same collective) and its handshake goes (2 fewer at the first step), and the
        # three dense keys ride with the first key's data in one allreduce started beside it:
        # 3 x 4 - 1 + 2 = 13 fewer at the first step, 3 x 2 - 1 = 5 later
        assert [c - m for c, m in zip(a[1], b[1])] == [13, 5]
    assert one[0][0][1][1].tolist() == one[1][0][1][1].tolist()  # every rank holds the same average


def _joined_run(policies: list[dict], keys: list[tuple[str, tuple[int, ...]]], ref: bool) -> list:  # type: ignore[type-arg]
    """``keys`` through protocol_many over len(policies) steps (step s under policies[s]) on 3
    thread ranks with error feedback, or (``ref``) the reference: the concatenation of the keys
    that share a codec sent as one key through protocol(), each other key alone. Returns per rank
    the outputs per step, the collectives per step and the pending residuals at the end."""
    from gcodec.transports import run_blocking

    from .localcomm import run_threads

    def rank(comm):  # type: ignore[no-untyped-def]
        c = _Counting(comm)
        r = Router()
        outs, calls = [], []
        for step, pol in enumerate(policies):
            by: dict[str, list[str]] = {}
            for k, _ in keys:
                by.setdefault(str(pol[k]), []).append(k)
            cats = {"+".join(names): pol[names[0]] for names in by.values() if len(names) > 1}  # the reference's keys
            r.policy = as_policy({**pol, **cats} if ref else pol, min_numel=0)
            xs = {
                k: np.random.default_rng([comm.rank, step, i]).standard_normal(s).astype(np.float32)
                for i, (k, s) in enumerate(keys)
            }
            before = c.calls
            if not ref:
                run_blocking(r.protocol_many(c, [(k, x, x) for k, x in xs.items()], "mean"))
            else:
                for names in by.values():
                    if len(names) == 1:  # alone, in its shape
                        run_blocking(r.protocol(c, xs[names[0]], xs[names[0]], names[0], "mean"))
                        continue
                    cat = np.concatenate([xs[k].reshape(-1) for k in names])
                    run_blocking(r.protocol(c, cat, cat, "+".join(names), "mean"))
                    o = 0
                    for k in names:
                        xs[k].reshape(-1)[...] = cat[o : o + xs[k].size]
                        o += xs[k].size
            outs.append({k: x.copy() for k, x in xs.items()})
            calls.append(c.calls - before)
        return outs, calls, r

    return run_threads(3, rank)


_DCT2 = {"id": "dct", "dims": 2, "chunk": 16, "k": 4}


def test_protocol_many_joins_the_keys_of_one_codec_as_one_flat_group() -> None:
    # w1, w2 and w3 share a codec: one exchange of their concatenation, the bits of sending the
    # concatenation as one key; t reads shapes (a 2-D DCT of 4 x 4 tiles) and goes alone in its
    # shape. Three steps, error feedback on: the residuals are the concatenation's, per key.
    keys = [("w1", (8, 16)), ("t", (8, 8)), ("w2", (40,)), ("w3", (3, 5))]
    pol = {"w1": U8, "w2": U8, "w3": U8, "t": _DCT2}
    many, ref = _joined_run([pol] * 3, keys, False), _joined_run([pol] * 3, keys, True)
    for a, b in zip(many, ref):
        assert not isinstance(a, BaseException) and not isinstance(b, BaseException), (a, b)
        for xs, ys in zip(a[0], b[0]):
            for k, _ in keys:
                np.testing.assert_array_equal(xs[k].view(np.uint32), ys[k].view(np.uint32))
        # one exchange per group, agreed once: the reference's collectives less the second group's
        # handshake at the first step (a FINGERPRINT message and the JSON's all-gather); both groups
        # begin with a size exchange (two-phase, gather), so later steps cost the same
        assert a[1] == [b[1][0] - 2, *b[1][1:]]
        got, want = a[2].ranges(), b[2].ranges()
        cat = want["w1+w2+w3[0:183]"]  # 128 + 40 + 15 elements
        assert np.abs(cat).max() > 0
        o = 0
        for k in ("w1", "w2", "w3"):
            n = int(np.prod(dict(keys)[k]))
            np.testing.assert_array_equal(got[f"{k}[0:{n}]"], cat[o : o + n])
            o += n
        np.testing.assert_array_equal(got["t[0:64]"], want["t[0:64]"])
    assert many[0][0][2]["w2"].tolist() == many[1][0][2]["w2"].tolist()  # every rank holds the same average


def _conserved(steps: list[tuple[dict, list[str]]], shapes: dict[str, tuple[int, ...]]) -> list:  # type: ignore[type-arg]
    """Each step's keys through protocol_many under its policy on 3 thread ranks (gather mode:
    two-phase owners re-encode, which breaks the identity below), checking that error feedback
    conserves what is sent: on every rank x + r_old = decoded + r_new, so the mean over ranks of
    x + r_old - r_new is the average every rank receives. A residual lost or left behind breaks it
    by the residual's mean, about a quantization step (1e-2 here); float32 rounding of the sums
    stays below 1e-5 for values of order 1. Returns per rank, per step: inputs, residuals before
    and after, outputs."""
    from gcodec.transports import run_blocking

    from .localcomm import run_threads

    def rank(comm):  # type: ignore[no-untyped-def]
        r = Router(error_feedback=True, mode="gather")
        got = []
        for step, (pol, keys) in enumerate(steps):
            r.policy = as_policy(pol, min_numel=0)
            xs = {
                k: np.random.default_rng([comm.rank, step, list(shapes).index(k)]).standard_normal(shapes[k])
                for k in keys
            }
            xs = {k: x.astype(np.float32) for k, x in xs.items()}
            before = r.ranges()
            outs = {k: np.empty_like(x) for k, x in xs.items()}
            run_blocking(r.protocol_many(comm, [(k, xs[k], outs[k]) for k in keys], "mean"))
            got.append((xs, before, r.ranges(), outs))
        return got

    res = run_threads(3, rank)
    assert not any(isinstance(g, BaseException) for g in res), res
    for step, (_, keys) in enumerate(steps):
        for k in keys:
            rk = f"{k}[0:{int(np.prod(shapes[k]))}]"
            sent = [g[step][0][k].reshape(-1).astype(np.float64) + g[step][1].get(rk, 0) - g[step][2][rk] for g in res]
            out = res[0][step][3][k].reshape(-1)
            np.testing.assert_allclose(np.mean(sent, axis=0), out, atol=1e-5, err_msg=f"{k} at step {step}")
            if any(k in ks for _, ks in steps[:step]):  # sent before: a residual was owed
                assert np.abs(res[0][step][1][rk]).max() > 1e-3
    return res


def test_a_key_that_leaves_and_rejoins_a_group_keeps_what_it_is_owed() -> None:
    # w2 leaves the group of w1 and w3 at step 2 (another codec) and rejoins it at step 3: its
    # residual must follow it both times (_conserved).
    U4 = {"id": "uniform", "bits": 4}
    shapes = {"w1": (8, 16), "w2": (40,), "w3": (3, 5)}
    pols = [{k: U8 for k in shapes}] * 2 + [{"w1": U8, "w2": U4, "w3": U8}, {k: U8 for k in shapes}]
    res = _conserved([(pol, list(shapes)) for pol in pols], shapes)
    assert res[0][2][3]["w2"].tolist() == res[2][2][3]["w2"].tolist()


def test_a_key_in_two_key_sets_takes_its_residual_to_each() -> None:
    # protocol_many keeps each key set's plan while no residual moves: w2 alternates between the
    # calls of {w1, w2} and {w2, w3}, so every call moves its residual into the other group and
    # the plan kept from two calls before is stale; using it would leave w2's residual under the
    # other group's key (_conserved).
    shapes = {"w1": (8, 16), "w2": (40,), "w3": (3, 5)}
    _conserved([({k: U8 for k in shapes}, keys) for keys in [["w1", "w2"], ["w2", "w3"]] * 3], shapes)


def test_protocol_many_refuses_ranks_whose_dense_keys_differ() -> None:
    from gcodec.transports import run_blocking

    from .localcomm import run_threads

    def rank(comm):  # type: ignore[no-untyped-def]
        r = Router(as_policy({"*": None}))
        keys = ["a", "b"] if comm.rank == 0 else ["a", "c"]
        run_blocking(r.protocol_many(comm, [(k, np.ones(4, np.float32), np.ones(4, np.float32)) for k in keys], "sum"))

    got = run_threads(2, rank)
    assert all(isinstance(g, gcodec.GcodecError) for g in got), got
