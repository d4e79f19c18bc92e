"""Headers at the deepest nesting F8 admits (specs/format.md F8: ``max_nesting`` up to 1000), and the
canonical msgpack reader and writer of gcodec/format/header.py.

F8 lets a receiver raise ``max_nesting`` to 1000. Every walk over header data (the parser, the
F11 re-encoding, quoting a value in an error message, params of nested codecs, a bundle's records,
``PayloadInfo.to_dict`` and ``json_safe``) must then work at depth 1000, where Python's frame limit
(1000 by default, some frames already taken) stops any recursive walk. The tests below run those
paths under a frame limit far below the depth, so any recursion that grows with the depth fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gcodec
from gcodec.excerpt import short
from gcodec.format.header import pack_canonical, unpack_strict
from gcodec.jsonsafe import json_safe
from gcodec.limits import MAX_NESTING_CAP
from tests.codec_kit import parse_payload, rebuild
from tests.procs import run

ROOT = Path(__file__).resolve().parents[1]
CAP = gcodec.Limits(max_nesting=MAX_NESTING_CAP)


def _nested(levels: int) -> Any:
    """``levels`` arrays around a string: the string lies ``levels`` below the outermost array."""
    v: Any = "x"
    for _ in range(levels):
        v = [v]
    return v


def _frames() -> int:
    f, n = sys._getframe(), 0
    while f is not None:
        f, n = f.f_back, n + 1
    return n


@contextlib.contextmanager
def shallow_stack(spare: int = 120):
    """Python's frame limit set to ``spare`` frames above the caller's: far below the 1000 levels of
    the headers under test, so a walk that recurses once per level raises RecursionError."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_frames() + spare)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _fp16() -> bytes:
    return bytes(gcodec.get_codec("fp16").encode(np.arange(4, dtype=np.float32)))


def _topk_uniform() -> bytes:
    codec = gcodec.get_codec("topk", k=3, values={"id": "uniform", "bits": 8})
    return bytes(codec.encode(np.arange(12, dtype=np.float32)))


def _deep_at(base: bytes, place: str, depth: int, *, minor: int = 0) -> bytes:
    """``base`` with a value whose deepest object lies at ``depth`` put at ``place`` in its header."""
    h, data = parse_payload(base)
    t = h["tensors"][0]
    if place == "meta":  # meta (1), the value of "k" (2)
        h["meta"] = {"k": _nested(depth - 2)}
    elif place == "top key":  # the value of the key (1)
        h["x_future"] = _nested(depth - 1)
    elif place == "record key":  # tensors (1), record (2), the value (3)
        t["x_future"] = _nested(depth - 3)
    elif place == "param":  # tensors, record, params, the value (4)
        t["params"]["x_future"] = _nested(depth - 4)
    elif place == "nested param":  # ..., params, values, params, the value (6)
        t["params"]["values"]["params"]["x_future"] = _nested(depth - 6)
    elif place == "known param":
        t["params"]["values"]["params"]["bits"] = _nested(depth - 6)
    elif place == "dtype":
        t["dtype"] = _nested(depth - 3)
    elif place == "section type":  # tensors, record, sections, entry, the type (5)
        t["sections"][0][1] = _nested(depth - 5)
    elif place == "bundle name":
        t["name"] = _nested(depth - 3)
    else:
        raise AssertionError(place)
    return rebuild(h, data, minor=minor)


#: (base, where the deep value goes, minor version, what a reader with max_nesting 1000 says)
DEEP = [
    (_fp16, "meta", 0, "F9"),  # meta values are strings (the golden vector f09_meta_nested_1000)
    (_fp16, "top key", 0, "F9"),  # unknown top-level key under minor 0
    (_fp16, "top key", 1, None),  # ... ignored under a newer minor
    (_fp16, "record key", 0, "F9"),
    (_fp16, "record key", 1, None),
    (_fp16, "param", 0, "C1"),  # unknown codec parameter
    (_fp16, "param", 1, None),
    (_fp16, "dtype", 0, "F9"),  # the message quotes the value
    (_fp16, "section type", 0, "F9"),
    (_fp16, "bundle name", 1, "F9"),
    (_topk_uniform, "nested param", 0, "H1"),  # unknown parameter of a nested codec
    (_topk_uniform, "nested param", 1, None),
    (_topk_uniform, "known param", 0, "H1"),  # a nested codec's bits= of the wrong type, quoted
]


@pytest.mark.parametrize("base,place,minor,rule", DEEP, ids=[f"{p}-minor{m}" for _, p, m, _ in DEEP])
def test_a_header_1000_levels_deep_is_read_without_recursion(base, place, minor, rule):
    b = _deep_at(base(), place, MAX_NESTING_CAP, minor=minor)
    gcodec.decode(base())  # kernels compiled and caches filled at the normal frame limit
    with shallow_stack():
        for fn in (gcodec.api.inspect_header, gcodec.validate, gcodec.decode):
            if rule is None or (fn is gcodec.api.inspect_header and rule[0] in "CH"):
                fn(b, limits=CAP)  # the container rules pass; the codec rules come later
                continue
            with pytest.raises(gcodec.HeaderError, match=rf"^{rule}:"):
                fn(b, limits=CAP)
        if rule is None:
            info = gcodec.validate(b, limits=CAP)
            json_safe(info.to_dict())  # what `gcodec inspect --json` writes
    # one level deeper is the F8 limit, whatever comes after
    deeper = _deep_at(base(), place, MAX_NESTING_CAP + 1, minor=minor)
    with shallow_stack():
        for fn in (gcodec.api.inspect_header, gcodec.validate, gcodec.decode):
            with pytest.raises(gcodec.LimitExceededError, match=r"^F8: .*max_nesting=1000"):
                fn(deeper, limits=CAP)


def test_a_bundle_with_deep_records_decodes():
    """A bundle under a newer minor whose every record carries an ignored key 1000 levels deep."""
    b = bytes(gcodec.encode_bundle({f"t{i}": np.full(3, i, np.float32) for i in range(4)}, "fp16"))
    h, data = parse_payload(b)
    for t in h["tensors"]:
        t["x_future"] = _nested(MAX_NESTING_CAP - 3)
    deep = rebuild(h, data, minor=1)
    with shallow_stack():
        out = gcodec.decode(deep, limits=CAP)
        assert list(out) == ["t0", "t1", "t2", "t3"]
        assert gcodec.validate(deep, limits=CAP).is_bundle


def test_writing_a_header_at_the_cap():
    """The writer's F8 check, container count and canonical packing at depth 1000. (Comparing two
    such objects with ``==`` would itself recurse: the round trip is compared as bytes.)"""
    deep = _nested(MAX_NESTING_CAP - 4)
    header = {"data_length": 0, "tensors": [{"params": {"x": deep}}]}  # keys in canonical order
    with shallow_stack():
        hb = pack_canonical(header)
        assert pack_canonical(unpack_strict(hb, CAP)) == hb
        gcodec.format.header.check_tree(header, MAX_NESTING_CAP)
        with pytest.raises(gcodec.LimitExceededError, match="F8"):
            gcodec.format.header.check_tree(header, MAX_NESTING_CAP - 1)
        assert gcodec.format.header.count_containers(header) == 4 + (MAX_NESTING_CAP - 4)  # maps, lists
    assert hb == msgpack.packb(header)  # what msgpack's C packer writes for the same (sorted) content


def test_quoting_and_json_of_deep_values():
    deep = _nested(5000)
    with shallow_stack():
        text = short(deep)
        assert text.startswith("[[[[") and text.endswith("…") and len(text) == 200
        assert short({"a": deep}).startswith("{'a': [[[")
        j = json_safe({"k": (deep, float("nan"), np.float32(1.5))})
    assert j["k"][1] is None and j["k"][2] == 1.5 and isinstance(j["k"][2], float)
    assert short(10**5000) == "<int of 16610 bits>"  # too long for str(): still quoted


def test_header_reading_and_writing_need_no_msgpack_package(tmp_path):
    """gcodec parses and writes headers itself: msgpack-python's pure-Python fallback (used under
    MSGPACK_PUREPYTHON=1 or without its C extension) recurses once per level, and its C extension
    stops at 1024 levels with errors of its own. So gcodec must work with msgpack absent."""
    vector = tmp_path / "deep.gcd"
    vector.write_bytes(_deep_at(_fp16(), "meta", MAX_NESTING_CAP))
    script = f"""
import sys
sys.modules["msgpack"] = None  # any import of msgpack fails
import numpy as np, gcodec
b = gcodec.get_codec("uniform").encode(np.arange(100, dtype=np.float32))
assert gcodec.decode(b).shape == (100,) and gcodec.validate(b).codec == "uniform"
try:
    gcodec.validate(open({str(vector)!r}, "rb").read(), limits=gcodec.Limits(max_nesting=1000))
except gcodec.HeaderError as e:
    assert str(e).startswith("F9:"), e
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1")
    proc = run([sys.executable, "-c", script], 600, env=env, cwd=os.getcwd())
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# the reader and writer against msgpack-python's C extension, on what both accept

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
)
_objects = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=20) | st.dictionaries(st.text(max_size=10), kids, max_size=20),
    max_leaves=80,
)
BUDGET = settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sorted(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _sorted(o[k]) for k in sorted(o, key=lambda k: k.encode("utf-8"))}
    if isinstance(o, list):
        return [_sorted(v) for v in o]
    return o


@BUDGET
@given(_objects)
def test_canonical_writer_matches_msgpack_and_reads_back(obj):
    hb = pack_canonical(obj)
    assert hb == msgpack.packb(_sorted(obj), use_bin_type=True)
    assert unpack_strict(hb, gcodec.Limits(max_nesting=64)) == obj


def _c_parse(b: bytes) -> tuple[bool, Any]:
    """msgpack's C parser with F8's rules (text keys, no duplicates, no bin, no ext)."""

    def pairs(kv):
        d = {}
        for k, v in kv:
            if type(k) is not str or k in d:
                raise ValueError("key")
            d[k] = v
        return d

    try:
        obj = msgpack.unpackb(b, raw=False, strict_map_key=True, object_pairs_hook=pairs, max_bin_len=0, max_ext_len=0)
    except Exception:
        return False, None
    todo = [obj]
    while todo:  # bin or ext of length 0 slip through msgpack's length limits
        o = todo.pop()
        if isinstance(o, (bytes, msgpack.ExtType)):
            return False, None
        todo.extend(o.values() if isinstance(o, dict) else o if isinstance(o, list) else ())
    return True, obj


@BUDGET
@given(_objects, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4), st.integers(0, 8))
def test_reader_agrees_with_msgpack_on_damaged_headers(obj, edits, cut):
    """Any bytes: both parsers accept them with the same result, or gcodec's refuses them with a
    HeaderError (F8); with nesting and container limits high enough not to matter."""
    b = bytearray(pack_canonical(obj))
    for pos, value in edits:
        b[pos % len(b)] = value
    b = bytes(b[: len(b) - cut]) if cut < len(b) else bytes(b)
    ok, want = _c_parse(b)
    lim = gcodec.Limits(max_nesting=1000, max_header_containers=1 << 20)
    try:
        got = unpack_strict(b, lim)
    except gcodec.HeaderError:
        assert not ok, f"gcodec refused what msgpack parses: {b!r}"
        return
    assert ok and got == want, b
