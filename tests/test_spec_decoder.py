"""The golden vectors, decoded by tests/spec_decoder.py: a decoder written from specs/ alone."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

from . import spec_decoder as sd

ROOT = Path(__file__).resolve().parent.parent / "specs" / "vectors"
MANIFEST = json.loads((ROOT / "manifest.json").read_text())
KNOWN = {"fp16", "bf16", "uniform"}
#: chunktopk vectors whose nested value codec the independent decoder does not implement
NESTED_ELSEWHERE = {"chunktopk_values_sign", "dct_values_sign"}


def _supported(entry: dict) -> bool:
    """The core module's vectors (fp16, bf16 and deterministic uniform; others use codec features it
    lacks), every powersgd vector (raw, pass-through, and fp16 / uniform-nearest factors), and every
    fp8, mx and nvfp4 vector (the formats module), and every chunktopk vector whose values are raw
    or coded by fp16, bf16 or uniform."""
    codecs = set(entry.get("codecs") or [entry.get("codec")])
    return (
        (entry["module"] == "core" and codecs <= KNOWN)
        or codecs == {"powersgd"}
        or entry["module"] == "formats"
        or (codecs <= {"chunktopk", "dct"} and entry["name"] not in NESTED_ELSEWHERE)
    )


def _header_rule_of_topk(entry: dict) -> bool:
    """topk's header rules are implemented (not its decoding), with nil or fp16/bf16/uniform values."""
    return entry["codecs"] == ["topk"] and entry["rule"][:2] in ("C0", "C1", "C2", "C3", "T1", "H1")


VALID = [e for e in MANIFEST["vectors"] if e["kind"] == "valid" and _supported(e)]
INVALID = [
    e
    for e in MANIFEST["vectors"]
    if e["kind"] == "invalid" and (e["module"] == "core" or _supported(e) or _header_rule_of_topk(e))
]


def test_the_independent_decoder_covers_many_vectors():
    assert len(VALID) >= 40 and len(INVALID) >= 100
    assert sum(e["codecs"] == ["powersgd"] for e in VALID) == 11
    assert sum(e["module"] == "formats" for e in VALID) == 42 and sum(e["module"] == "formats" for e in INVALID) == 57


@pytest.mark.parametrize("entry", VALID, ids=lambda e: e["name"])
def test_valid_vector_decodes_identically(entry):
    y = sd.read((ROOT / entry["file"]).read_bytes())
    want = sd.load(str(ROOT) + "/", entry["decoded"]["file"], entry["decoded"])
    if isinstance(want, dict):
        assert set(y) == set(want)
        assert all(sd.same(y[k], want[k]) for k in want)
    else:
        assert sd.same(y, want)


@contextlib.contextmanager
def _reader_limits(entry: dict):
    """The limits the manifest gives a vector (``limits``), in place of the defaults meanwhile. This
    plain decoder recurses once per nesting level, so a vector near max_nesting's cap of 1000 also
    needs a higher frame limit."""
    old, old_frames = dict(sd.LIM), sys.getrecursionlimit()
    sd.LIM.update(entry.get("limits", {}))
    sys.setrecursionlimit(max(old_frames, 4 * sd.LIM["max_nesting"] + 500))
    try:
        yield
    finally:
        sd.LIM.clear()
        sd.LIM.update(old)
        sys.setrecursionlimit(old_frames)


@pytest.mark.parametrize("entry", INVALID, ids=lambda e: e["name"])
def test_invalid_vector_refused_with_named_error(entry):
    with _reader_limits(entry), pytest.raises(sd.E) as ei:
        sd.read((ROOT / entry["file"]).read_bytes())
    assert ei.value.cls == entry["error"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("r", [1, 5, 12])
def test_powersgd_with_inexact_sums_decodes_identically(dtype, r):
    """Random factors (sums that round, unlike the vectors' dyadic ones): the spec's order of
    powersgd.md §6 gives gcodec's bits, whatever the rank (the kernel has no BLAS path)."""
    import numpy as np
    from vector_cases.sparse import _powersgd_payload

    import gcodec

    rng = np.random.default_rng(r)
    p = rng.standard_normal((13, r)).astype(np.float32)
    q = rng.standard_normal((700, r)).astype(np.float32)
    buf = _powersgd_payload((13, 700), p, q, dtype)
    y = gcodec.decode(buf)
    assert sd.same(sd.read(buf), y.view(sd.BF16) if dtype == "bfloat16" else y)


@pytest.mark.parametrize(
    "codec, params",
    [("mx", {"element": e}) for e in ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8")]
    + [
        ("fp8", {"group_size": 7}),
        ("fp8", {"element": "e5m2", "scale_dtype": "e8m0", "group_size": 20}),
        ("fp8", {"rounding": "stochastic", "seed": 4}),
        ("nvfp4", {}),
        ("nvfp4", {"rounding": "stochastic"}),
    ],
)
def test_low_precision_floats_on_random_inputs_decode_identically(codec, params):
    """Random values over a wide range of magnitudes (binary32 subnormals included), in every element
    format: the spec text's arithmetic gives gcodec's bits."""
    import numpy as np

    import gcodec

    rng = np.random.default_rng(len(str(params)))
    x = (rng.standard_normal(301) * 2.0 ** rng.integers(-140, 100, 301)).astype(np.float32)
    buf = bytes(gcodec.get_codec(codec, **params).encode(x, step=3))
    assert sd.same(sd.read(buf), gcodec.decode(buf))


def _overlap_cases():
    """Payloads that break two or three header rules at once (specs/format.md §7.3, "Order"):
    (name, payload maker, error class, rule that reports it)."""
    import numpy as np
    from vector_cases import edit, encode

    def psgd_passthrough(**params):
        def make():
            p = encode("powersgd", np.float32([1.0, 2.0, 3.0]))

            def f(h):
                h["tensors"][0]["params"].update(params)

            return edit(p, header=f)

        return make

    def topk(**params):
        def make():
            p = encode("topk", np.float32([0.5, -3.0, 0.0, 2.0, -2.0, 1.0, 2.0, 0.25]), k=3)

            def f(h):
                h["tensors"][0]["params"].update(params)

            return edit(p, header=f)

        return make

    unknown = {"codec": "nope", "params": {}, "version": 1}
    extra_key = {"codec": "fp16", "params": {}, "version": 1, "x": 1}
    fp16 = {"codec": "fp16", "params": {}, "version": 1}
    return [
        # powersgd: P2 (pass-through with rank or a nested factor) against H1 and C1
        ("p2_vs_h1_unknown", psgd_passthrough(rank=2, p=unknown), "UnknownCodecError", "H1"),
        ("p2_vs_h1_extra_key", psgd_passthrough(q=extra_key), "HeaderError", "H1"),
        ("p2_with_valid_nested", psgd_passthrough(p=fp16), "HeaderError", "P2"),
        ("p2_vs_c1", psgd_passthrough(rank=1, mode="fp8"), "HeaderError", "C1"),
        # topk: H1, then C1, then T1
        ("t1_vs_c1", topk(k=99, index_coding="zip"), "HeaderError", "C1"),
        ("t1_vs_h1", topk(k=99, values=unknown), "UnknownCodecError", "H1"),
        ("c1_vs_h1", topk(index_coding="zip", values=extra_key), "HeaderError", "H1"),
        ("t1_vs_c3", topk(k=9), "HeaderError", "T1"),
    ]


@pytest.mark.parametrize("name, make, error, rule", _overlap_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_overlapping_rules_report_the_first_in_the_spec_order(name, make, error, rule):
    """A payload breaking several header rules gets the error of the first one in the order of
    specs/format.md §7.3 (C0, H1, C1, the codec's header rules, C2, C3), from gcodec and from the
    independent decoder alike."""
    import gcodec

    buf = make()
    with pytest.raises(gcodec.GcodecError) as ei:
        gcodec.validate(buf)
    assert type(ei.value).__name__ == error and str(ei.value).startswith(rule + ":"), str(ei.value)
    with pytest.raises(sd.E) as si:
        sd.read(buf)
    assert si.value.cls == error and str(si.value).split(": ", 1)[1].startswith(rule), str(si.value)


@pytest.mark.parametrize("coding", ["gap", "packed"])
@pytest.mark.parametrize(
    "n, chunk, k, values",
    [
        (1000, 64, 5, None),
        (999, 100, 100, None),
        (4096 * 2 + 17, 4096, 64, {"id": "uniform", "bits": 2, "group_size": 64}),
        (300, 7, 3, {"id": "fp16"}),
        (50, 1, 1, None),
    ],
)
def test_chunktopk_on_random_inputs_decodes_identically(coding, n, chunk, k, values):
    """Random values with ties: the decoder written from chunktopk.md gives gcodec's bits."""
    import numpy as np

    import gcodec

    rng = np.random.default_rng(n + chunk)
    x = rng.standard_normal(n).astype(np.float32)
    x[::3] = np.round(x[::3])
    buf = bytes(gcodec.get_codec("chunktopk", chunk=chunk, k=k, index_coding=coding, values=values).encode(x))
    assert sd.same(sd.read(buf), gcodec.decode(buf))


@pytest.mark.parametrize("coding", ["gap", "packed"])
@pytest.mark.parametrize(
    "n, chunk, k, values",
    [
        (1000, 64, 5, None),
        (100, 8, 8, None),
        (300, 256, 17, {"id": "uniform", "bits": 2, "group_size": 17}),
        (77, 16, 3, {"id": "fp16"}),
        (9, 1, 1, None),
    ],
)
def test_dct_on_random_inputs_decodes_identically(coding, n, chunk, k, values):
    """The reconstruction written from dct.md §3 and §6 gives gcodec's bits."""
    import numpy as np

    import gcodec

    rng = np.random.default_rng(n + chunk)
    top = 4 if values == {"id": "fp16"} else 20  # fp16 values stay below 65520
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, top, n)).astype(np.float32)
    buf = bytes(gcodec.get_codec("dct", chunk=chunk, k=k, index_coding=coding, values=values).encode(x))
    assert sd.same(sd.read(buf), gcodec.decode(buf))


def _accounting_cases():
    """Payloads of every codec (raw and nested values, every dtype, chunks with a short last one,
    tiles, empty tensors): (label, payload maker)."""
    import numpy as np

    import gcodec
    from gcodec.arrays import BFLOAT16

    rng = np.random.default_rng(9)
    x = rng.standard_normal(2000)
    u2 = {"id": "uniform", "bits": 2, "group_size": 16}
    lowrank = {"min_compression_rate": 0.0}

    def enc(codec, shape, dtype, **params):
        def make():
            n = int(np.prod(shape))
            return bytes(gcodec.get_codec(codec, **params).encode(x[:n].reshape(shape).astype(dtype), step=1))

        return make

    f16, f32, f64, bf16 = np.float16, np.float32, np.float64, BFLOAT16
    return [
        ("fp16 f32", enc("fp16", (7, 3), f32)),
        ("bf16 bf16", enc("bf16", (5,), bf16)),
        ("uniform f16", enc("uniform", (40,), f16)),
        ("qsgd f64", enc("qsgd", (100,), f64)),
        ("sign bf16", enc("sign", (33,), bf16)),
        ("terngrad f32", enc("terngrad", (10, 10), f32)),
        ("fp8 f16", enc("fp8", (50,), f16)),
        ("mx f64", enc("mx", (70,), f64)),
        ("nvfp4 bf16", enc("nvfp4", (40,), bf16)),
        ("nvfp4 empty", enc("nvfp4", (0, 4), f32)),
        ("topk raw f32", enc("topk", (300,), f32, k=17)),
        ("topk raw bf16", enc("topk", (300,), bf16, k=17, index_coding="raw")),
        ("topk fp16 f64", enc("topk", (300,), f64, k=17, values={"id": "fp16"})),
        ("topk uniform f16", enc("topk", (300,), f16, k=17, values=u2)),
        ("threshold raw f16", enc("threshold", (200,), f16, threshold=0.5)),
        ("threshold sign f32", enc("threshold", (200,), f32, threshold=0.5, values={"id": "sign"})),
        ("randomk raw f32", enc("randomk", (1000,), f32, k=33)),
        ("randomk all bf16", enc("randomk", (64,), bf16, k=64)),
        ("randomk none f32", enc("randomk", (64,), f32, k=0)),
        ("randomk uniform f64", enc("randomk", (130,), f64, k=9, values=u2)),
        ("chunktopk raw f32", enc("chunktopk", (1000,), f32, chunk=64, k=5)),
        ("chunktopk short last", enc("chunktopk", (999,), f32, chunk=100, k=100, index_coding="packed")),
        ("chunktopk bf16", enc("chunktopk", (300,), bf16, chunk=7, k=3)),
        ("chunktopk uniform f64", enc("chunktopk", (500,), f64, chunk=64, k=4, values=u2)),
        ("dct f32", enc("dct", (40, 50), f32, chunk=64, k=4)),
        ("dct f16 raw", enc("dct", (300,), f16, chunk=16, k=3)),
        ("dct tiles f64 sign", enc("dct", (40, 50), f64, dims=2, chunk=256, k=8, values={"id": "sign"})),
        ("dct tiles bf16 uniform", enc("dct", (40, 50), bf16, dims=2, chunk=256, k=8, values=u2)),
        ("dct tiles f64 raw", enc("dct", (3, 5, 7), f64, dims=2, chunk=16, k=2)),
        ("dct tiles empty rows", enc("dct", (0, 5), f32, dims=2, chunk=16, k=2)),
        ("powersgd f32", enc("powersgd", (40, 50), f32, rank=4, **lowrank)),
        ("powersgd f64 nested", enc("powersgd", (20, 30), f64, rank=3, factors={"id": "fp16"}, **lowrank)),
        ("powersgd bf16 nested", enc("powersgd", (20, 30), bf16, rank=2, factors=u2, **lowrank)),
        ("powersgd pass-through", enc("powersgd", (30,), f32)),
        ("powersgd pass-through fp16", enc("powersgd", (30,), bf16, passthrough="fp16")),
    ]


def _records(buf):
    """The header's tensor records as the independent decoder parses them, with numel."""
    import struct

    hl = struct.unpack_from("<I", buf, 8)[0]
    h = sd.P(buf[16 : 16 + hl]).obj(0)
    for t in h["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        t["numel"] = n
    return h["tensors"]


@pytest.mark.parametrize("label, make", _accounting_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_decode_work_and_scratch_are_the_formulas_of_format_md_9_1(label, make):
    """specs/format.md §9.1, computed from the header alone by the independent decoder, gives
    gcodec's own accounting (what it checks against max_decode_work and max_scratch_bytes) for every
    codec; and both readers refuse the payload one unit below either figure and accept it at it."""
    import dataclasses

    import gcodec
    from gcodec.api import _checked
    from gcodec.resources import scratch_bytes

    buf = make()
    _, checked = _checked(buf, None, full=False)
    (e, cls, params), (t,) = checked[0], _records(buf)
    work, scratch = sd.decode_work(t), sd.scratch_bytes(t)
    assert (work, scratch) == (cls.decode_work(params, e), scratch_bytes(cls, params, e)), label
    base = gcodec.get_limits()
    for field, figure in (("max_decode_work", work), ("max_scratch_bytes", scratch)):
        gcodec.validate(buf, limits=dataclasses.replace(base, **{field: figure}))
        if figure:
            with pytest.raises(gcodec.LimitExceededError, match=field):
                gcodec.validate(buf, limits=dataclasses.replace(base, **{field: figure - 1}))
        if t["codec"] not in sd.KNOWN:
            continue
        with _reader_limits({"limits": {field: figure}}):
            try:
                sd.read(buf)
            except sd.E as ex:  # topk: header rules only; a nested codec it does not implement
                if ex.cls == "UnknownCodecError":
                    continue
                assert ex.cls == "NotImplemented", str(ex)
            if figure:
                sd.LIM[field] = figure - 1
                with pytest.raises(sd.E) as ei:
                    sd.read(buf)
                assert ei.value.cls == "LimitExceededError", str(ei.value)


def test_the_worked_figures_of_format_md_9_1():
    """The examples the text gives: dct chunk=64 k=4 on float32 [40, 50], and dims=2 chunk=256 k=8
    with a nested codec on float64 and bfloat16 [40, 50]."""
    import numpy as np

    import gcodec
    from gcodec.arrays import BFLOAT16

    x = np.random.default_rng(1).standard_normal((40, 50))
    figures = []
    for dtype, params in (
        (np.float32, {"chunk": 64, "k": 4}),
        (np.float64, {"dims": 2, "chunk": 256, "k": 8, "values": {"id": "sign"}}),
        (BFLOAT16, {"dims": 2, "chunk": 256, "k": 8, "values": {"id": "sign"}}),
    ):
        (t,) = _records(bytes(gcodec.get_codec("dct", **params).encode(x.astype(dtype))))
        figures.append((sd.decode_work(t), sd.scratch_bytes(t)))
    assert figures == [(8000, 1024), (16000, 1152), (16000, 9152)]
