"""Planning an exchange (gcodec/transports/plan.py), one test per rule: each item's codec, the
groups (codec, dtype, memory; a codec that reads shapes alone), their modes, keys and residual
forms, what dense items and codecs without feedback still owe, and the fingerprint kept while
the plan does not change. No ranks: a plan is local."""

from __future__ import annotations

import numpy as np

import gcodec
from gcodec.policy import Policy, as_policy
from gcodec.transports import Router
from gcodec.transports.plan import Choice, Item, Piece, plan, policy_chooser

U8 = {"id": "uniform", "bits": 8}
FP16 = {"id": "fp16"}
DCT2 = {"id": "dct", "dims": 2, "chunk": 16, "k": 4}
PSGD = {"id": "powersgd", "rank": 2}


def _items(*specs: tuple[str, tuple[int, ...], str]) -> list[Item]:
    return [Item(n, s, d, tensor=np.zeros(s, d)) for n, s, d in specs]


def _plan(router: Router, items: list[Item], size: int = 2, **kw):  # type: ignore[no-untyped-def]
    return plan(router, items, policy_chooser(router, 0), size=size, **kw)


def test_items_of_one_codec_dtype_and_memory_form_one_group_in_the_order_of_their_first_item() -> None:
    r = Router(as_policy({"a*": U8, "b*": FP16, "*": U8}, min_numel=0))
    items = _items(("b1", (8,), "float32"), ("a1", (4, 4), "float32"), ("a2", (3,), "float64"), ("a3", (5,), "float32"))
    items[3].device = "cuda"  # another memory never joins a group in host memory
    pl = _plan(r, items)
    assert [g.idx for g in pl.groups] == [[0], [1], [2], [3]]
    same = _items(("a1", (4, 4), "float32"), ("b1", (8,), "float32"), ("a2", (3,), "float32"))
    pl = _plan(r, same)
    assert [g.idx for g in pl.groups] == [[0, 2], [1]]
    assert pl.groups[0].shape == (19,) and pl.groups[0].form == "flat" and pl.groups[0].mode == "gather"
    assert pl.groups[0].key == r.group_key("", r.codec(U8), ["a1", "a2"])  # type: ignore[arg-type]
    assert pl.dense == [] and pl.carried is None


def test_each_group_s_mode_follows_its_codec_and_the_world_size() -> None:
    r = Router(as_policy({"*": U8}, min_numel=0))
    pl = _plan(r, _items(("w", (64,), "float32")), size=4)
    assert pl.groups[0].mode == "two_phase" and pl.groups[0].form == "split"  # owners' chunks
    pl = _plan(Router(as_policy({"*": FP16}, min_numel=0)), _items(("w", (64,), "float32")), size=4)
    assert pl.groups[0].mode == "summable" and pl.groups[0].form == "flat"


def test_a_codec_that_reads_shapes_goes_alone_in_its_shape() -> None:
    r = Router(as_policy({"*": DCT2}, min_numel=0, dense_1d=False))
    pl = _plan(r, _items(("t1", (16, 16), "float32"), ("t2", (16, 16), "float32")))
    assert [g.idx for g in pl.groups] == [[0], [1]]
    assert [g.shape for g in pl.groups] == [(16, 16), (16, 16)]


def test_low_rank_matrices_share_one_round_when_the_engine_joins_them() -> None:
    r = Router(as_policy({"*": PSGD}, min_numel=0))
    items = _items(("m1", (64, 32), "float32"), ("m2", (48, 64), "float32"))
    joined = _plan(r, items)
    assert [g.idx for g in joined.groups] == [[0, 1]]
    g = joined.groups[0]
    assert g.mode == "lowrank" and g.form == "lowrank" and g.key.startswith("lowrank:")
    apart = _plan(Router(as_policy({"*": PSGD}, min_numel=0)), items, join_lowrank=False)
    assert [g.idx for g in apart.groups] == [[0], [1]]


def test_a_group_of_one_under_its_own_name_is_sent_in_its_shape() -> None:
    r = Router(as_policy({"*": U8}, min_numel=0))
    pl = _plan(r, _items(("w", (4, 8), "float32")), alone_by_name=True)
    assert pl.groups[0].key == "w" and pl.groups[0].shape == (4, 8)
    pl = _plan(r, _items(("w", (4, 8), "float32"), ("v", (8,), "float32")), alone_by_name=True)
    assert pl.groups[0].key != "w" and pl.groups[0].shape == (40,)  # joined: a group key, flat


def test_items_in_rows_keep_one_residual_per_destination() -> None:
    # two parameters of 10 and 6 elements in chunks of 3 and 2 over 4 destinations, as FSDP2 pads
    r = Router(as_policy({"*": U8}, min_numel=0, dense_1d=False))

    def rows(name: str, numel: int, clen: int) -> tuple[Piece, ...]:
        return tuple(Piece(name, min(j * clen, numel), min((j + 1) * clen, numel), clen) for j in range(4))

    items = [
        Item("a", (10,), "float32", pieces=rows("a", 10, 3), tensor=np.zeros(10, np.float32)),
        Item("b", (6,), "float32", pieces=rows("b", 6, 2), tensor=np.zeros(6, np.float32)),
    ]
    pl = plan(r, items, policy_chooser(r, 0), size=4, collective="reduce_scatter", prefix="m:", salt=(4,))
    (g,) = pl.groups
    assert g.idx == [0, 1] and g.form == "rows" and g.mode == "reduce_scatter" and g.key.startswith("m:a..b")
    owed = np.arange(5, dtype=np.float32)  # destination 1's row: a[3:6], then b[2:4]
    g.state.worker.set_residual(f"{g.key}[1/4]", owed)  # type: ignore[union-attr]
    assert r.ranges()["a[3:6]"].tolist() == [0, 1, 2] and r.ranges()["b[2:4]"].tolist() == [3, 4]


def test_a_dense_item_gets_back_what_its_codec_still_owed() -> None:
    r = Router(as_policy({"*": U8}, min_numel=0))
    items = _items(("w", (6,), "float32"), ("v", (4,), "float32"))
    pl = _plan(r, items)
    ts = pl.groups[0].state
    ts.worker.set_residual(pl.groups[0].key, np.arange(10, dtype=np.float32))  # type: ignore[union-attr]
    r.policy = as_policy({"v": None, "*": U8}, min_numel=0)  # v leaves its codec
    pl = _plan(r, items)
    assert pl.dense == [1] and pl.carried is not None
    np.testing.assert_array_equal(pl.carried[0], np.arange(6, 10, dtype=np.float32))
    assert "v[0:4]" not in r.ranges()  # sent now, owed no more
    np.testing.assert_array_equal(r.ranges()["w[0:6]"], np.arange(6, dtype=np.float32))


def test_a_codec_without_feedback_sends_what_is_owed_with_this_step() -> None:
    r = Router(as_policy({"*": U8}, min_numel=0), error_feedback=False)
    r.hold({"w[0:8]": np.ones(8, np.float32)})  # owed from a checkpoint of a job with feedback
    pl = _plan(r, _items(("w", (8,), "float32")))
    assert pl.groups[0].flush is not None
    np.testing.assert_array_equal(pl.groups[0].flush[0], np.ones(8, np.float32))
    assert _plan(r, _items(("w", (8,), "float32"))).groups[0].flush is None  # sent once, not twice


def test_a_rung_obeys_the_size_rules_and_a_policy_decides_alone() -> None:
    r = Router({"*": U8}, min_numel=16)  # the shorthand: the size rules of the policy and of a rung
    items = _items(("big", (8, 8), "float32"), ("small", (3,), "float32"))
    rung = gcodec.get_codec("fp16")
    pl = plan(r, items, policy_chooser(r, 0, rung), size=2)
    assert pl.dense == [1] and pl.groups[0].codec == rung
    pl = _plan(r, items)
    assert pl.dense == [1] and pl.groups[0].codec == gcodec.get_codec(U8)


def test_an_agreed_plan_is_kept_while_it_follows_from_the_same_and_no_residual_moves() -> None:
    r = Router(as_policy({"*": U8}, min_numel=0))
    items = _items(("w", (8,), "float32"), ("v", (4,), "float32"))
    asked: list[str] = []
    chooser = policy_chooser(r, 0)

    def counting(item: Item):  # type: ignore[no-untyped-def]
        asked.append(item.name)
        return chooser(item)

    a = plan(r, items, counting, size=2, agree={"ef": True, "bucket": 0})
    again = _items(("w", (8,), "float32"), ("v", (4,), "float32"))
    b = plan(r, again, counting, size=2, agree={"ef": True, "bucket": 0})
    assert asked == ["w", "v"] * 2  # a chooser that does not say it is settled is asked every time
    assert b.text is a.text and b.fingerprint["groups"] == [a.groups[0].key]
    assert b.items[0] is again[0] and b.groups[0] is not a.groups[0] and b.groups[0].idx == a.groups[0].idx
    a = _plan(r, items, agree={"ef": True, "bucket": 0})  # settled: kept under what the policy follows from
    assert a.text == b.text and a.text is not b.text and _plan(r, items, agree={"ef": True, "bucket": 0}).text is a.text
    r.configure(codec=FP16)  # a new chooser: planned again, to the same plan ({"*": U8} still decides)
    a2 = _plan(r, items, agree={"ef": True, "bucket": 0})
    assert a2.text == a.text and a2.text is not a.text
    a = a2
    c = _plan(r, items, agree={"ef": False, "bucket": 0})  # another configuration: written again
    assert c.text != a.text and c.fingerprint["ef"] is False
    e = _plan(r, items, agree={"ef": True, "bucket": 0}, derived=lambda pl: {"groups_seen": len(pl.groups)})
    assert e.text != a.text and e.fingerprint["groups_seen"] == 1  # derived fields are the plan's
    assert _plan(r, items, agree={"ef": True, "bucket": 0}).text is a.text  # each kept under its own
    d = _plan(r, _items(("w", (8,), "float32"), ("v", (5,), "float32")), agree={"ef": True, "bucket": 0})
    assert d.fingerprint["tensors"] == [[["w", [8], "float32"], ["v", [5], "float32"]]]
    assert [q.text for q in r.plans.values()] == [d.text]  # its residuals moved: the others forgotten
    r.policy = {"*": FP16}  # another codec for the same items: planned again
    f = _plan(r, items, agree={"ef": True, "bucket": 0})
    assert f.groups[0].codec == gcodec.get_codec(FP16) and f.text != a.text
    assert r.plans  # a residual that moves in the router forgets every kept plan
    r.hold({"w[0:8]": np.ones(8, np.float32)})
    assert not r.plans
    g = _plan(r, items, agree={"ef": True, "bucket": 0})
    assert g.text == f.text and g.text is not f.text


def test_a_settled_policy_is_not_asked_again_for_a_kept_plan_and_an_unsettled_one_is() -> None:
    def asked_at(router: Router, step: int, items: list[Item]) -> int:
        base = policy_chooser(router, step)
        calls: list[str] = []

        def counting(item: Item):  # type: ignore[no-untyped-def]
            calls.append(item.name)
            return base(item)

        plan(router, items, Choice(counting, base.settled), size=2, agree={"ef": True})
        return len(calls)

    items = _items(("w", (64,), "float32"), ("v", (32,), "float32"))
    rules = Policy([{"codec": U8, "from_step": 3}], default=None, min_numel=0, dense_1d=False)
    assert rules.settled_step == 3
    r = Router(rules)
    assert [asked_at(r, step, items) for step in range(6)] == [2, 2, 2, 2, 0, 0]  # step 3 plans the kept one
    r.policy = Policy([{"codec": FP16}], default=None, min_numel=0, dense_1d=False)  # a new policy: asked again
    assert [asked_at(r, step, items) for step in range(2)] == [2, 0]
    assert plan(r, items, policy_chooser(r, 5), size=2, agree={"ef": True}).groups[0].codec == gcodec.get_codec(FP16)
    called = Router(as_policy(lambda name, t: U8, min_numel=0))  # a callable may answer anything: always asked
    assert policy_chooser(called, 9).settled is None
    assert [asked_at(called, step, items) for step in range(3)] == [2, 2, 2]
    assert policy_chooser(Router(as_policy({"w": U8}, min_numel=0)), 0).settled is not None  # patterns: from step 0
