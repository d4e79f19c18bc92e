"""The public API: registry, configs, out= and accumulate, errors on misuse."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest

import gcodec
from gcodec.arrays import BFLOAT16
from gcodec.codecs import registry


def test_error_hierarchy():
    names = [
        "FormatError", "UnsupportedVersionError", "UnsupportedFeatureError", "UnknownCodecError", "HeaderError",
        "LimitExceededError", "LayoutError", "SizeMismatchError", "ChecksumError", "PayloadValueError", "ConfigError",
    ]  # fmt: skip
    assert issubclass(gcodec.GcodecError, ValueError)
    for n in names:
        assert issubclass(getattr(gcodec, n), gcodec.GcodecError), n


@pytest.mark.parametrize("cid", ["fp16", "bf16", "uniform"])
def test_config_roundtrip_eq_repr(cid):
    c = gcodec.get_codec(cid)
    cfg = c.get_config()
    assert json.loads(json.dumps(cfg)) == cfg
    assert gcodec.get_codec(cfg) == c
    assert type(c).from_config(cfg) == c
    assert eval(repr(c), {"gcodec": gcodec}) == c
    assert hash(eval(repr(c), {"gcodec": gcodec})) == hash(c)


def test_equality_is_by_config():
    assert gcodec.get_codec("uniform", bits=4) == gcodec.get_codec({"id": "uniform", "bits": 4})
    assert gcodec.get_codec("uniform", bits=4) != gcodec.get_codec("uniform", bits=8)
    assert gcodec.get_codec("fp16") != gcodec.get_codec("bf16")


@pytest.mark.parametrize(
    "params, match",
    [
        ({"bits": 3}, "bits"),
        ({"bits": "8"}, "bits"),
        ({"bits": True}, "bits"),
        ({"group_size": 0}, "group_size"),
        ({"rounding": "up"}, "rounding"),
        ({"colour": "red"}, "unknown parameter"),
    ],
)
def test_bad_config(params, match):
    with pytest.raises(gcodec.ConfigError, match=match):
        gcodec.get_codec("uniform", **params)


def test_unknown_codec():
    with pytest.raises(gcodec.UnknownCodecError, match="nope"):
        gcodec.get_codec("nope")


def test_aggregation_declared():
    for cid in gcodec.list_codecs():
        assert isinstance(gcodec.codec_class(cid).aggregation, gcodec.Aggregation)
    assert gcodec.codec_class("fp16").aggregation is gcodec.Aggregation.SUMMABLE
    assert gcodec.codec_class("uniform").aggregation is gcodec.Aggregation.GATHER


def test_config_key_is_the_canonical_json_of_the_config_and_names_equal_codecs_alike():
    # the engines key states and groups by it (made once per instance): it must be what the
    # configuration's sorted JSON is, for every codec, nested ones included
    for cid in gcodec.list_codecs():
        c = gcodec.get_codec(cid)
        assert c.config_key == json.dumps(c.get_config(), sort_keys=True), cid
        twin = gcodec.get_codec(c.get_config())
        assert twin.config_key == c.config_key and hash(twin) == hash(c) and twin == c
    a = gcodec.get_codec("randomk", ratio=0.1, values={"id": "fp16"})
    b = gcodec.get_codec("randomk", ratio=0.2, values={"id": "fp16"})
    assert a.config_key != b.config_key and json.loads(a.config_key)["values"] == {"id": "fp16"}


def test_entry_point_registration(tmp_path, monkeypatch):
    (tmp_path / "gcodec_fake_plugin.py").write_text(
        textwrap.dedent(
            """
            from gcodec.codecs.cast import FP16

            class Fake(FP16):
                codec_id = "fake16"
            """
        )
    )
    dist = tmp_path / "gcodec_fake_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gcodec-fake-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gcodec.codecs]\nfake16 = gcodec_fake_plugin:Fake\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    c = gcodec.get_codec("fake16")
    x = np.arange(5, dtype=np.float32)
    buf = c.encode(x)
    assert gcodec.validate(buf).codec == "fake16"
    np.testing.assert_array_equal(gcodec.decode(buf), x)
    sys.modules.pop("gcodec_fake_plugin", None)


def test_decoding_payload_of_unregistered_codec(monkeypatch):
    buf = gcodec.get_codec("fp16").encode(np.ones(3, np.float32))
    monkeypatch.setattr(registry, "_REGISTRY", {k: v for k, v in registry._REGISTRY.items() if k != "fp16"})
    monkeypatch.setattr(registry, "_entry_points_loaded", True)
    with pytest.raises(gcodec.UnknownCodecError, match="fp16"):
        gcodec.decode(buf)


@pytest.mark.parametrize("cid", ["fp16", "bf16", "uniform"])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float64, np.float16, BFLOAT16])
def test_accumulate_sums_workers(cid, out_dtype):
    rng = np.random.default_rng(0)
    codec = gcodec.get_codec(cid)
    xs = [rng.standard_normal((13, 17)).astype(np.float32) for _ in range(4)]
    bufs = [codec.encode(x) for x in xs]
    out = np.zeros((13, 17), out_dtype)
    for b in bufs:
        gcodec.decode(b, out=out, accumulate=True)
    expect = np.zeros((13, 17), np.float64)
    for b in bufs:
        expect += gcodec.decode(b).astype(np.float64)
    tol = 1e-5 if out_dtype in (np.float32, np.float64) else 0.1
    np.testing.assert_allclose(out.astype(np.float64), expect, atol=tol)


def test_accumulate_no_temporary_for_float32():
    x = np.ones(1 << 20, np.float32)
    buf = gcodec.get_codec("uniform").encode(x)
    out = np.zeros(1 << 20, np.float32)
    import tracemalloc

    gcodec.decode(buf, out=out, accumulate=True)  # warm up the kernels
    tracemalloc.start()
    gcodec.decode(buf, out=out, accumulate=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < (1 << 20)  # far below the 4 MiB a temporary array would take
    np.testing.assert_allclose(out, 2.0, rtol=1e-6)


def test_bad_out():
    buf = gcodec.get_codec("fp16").encode(np.ones((2, 3), np.float32))
    with pytest.raises(gcodec.ConfigError, match="elements"):
        gcodec.decode(buf, out=np.empty(5, np.float32))
    with pytest.raises(gcodec.ConfigError, match="contiguous"):
        gcodec.decode(buf, out=np.empty((3, 4), np.float32)[:2, :3])
    with pytest.raises(gcodec.ConfigError, match="dtype"):
        gcodec.decode(buf, out=np.empty(6, np.int32))
    with pytest.raises(gcodec.ConfigError, match="out="):
        gcodec.decode(buf, accumulate=True)
    # a flat out of the right size is fine
    o = np.empty(6, np.float32)
    gcodec.decode(buf, out=o)
    np.testing.assert_array_equal(o, 1.0)


def test_bad_payload_leaves_accumulator_untouched():
    x = np.ones(100, np.float32)
    buf = bytearray(gcodec.get_codec("uniform").encode(x))
    buf[-10] ^= 0xFF
    out = np.full(100, 7.0, np.float32)
    with pytest.raises(gcodec.ChecksumError):
        gcodec.decode(buf, out=out, accumulate=True)
    np.testing.assert_array_equal(out, 7.0)


def test_codec_decode_checks_codec_id():
    buf = gcodec.get_codec("fp16").encode(np.ones(3, np.float32))
    np.testing.assert_array_equal(gcodec.get_codec("fp16").decode(buf), 1.0)
    with pytest.raises(gcodec.ConfigError, match="fp16"):
        gcodec.get_codec("bf16").decode(buf)


def test_unsupported_input_dtype():
    with pytest.raises(gcodec.ConfigError, match="int32"):
        gcodec.get_codec("fp16").encode(np.ones(3, np.int32))
    with pytest.raises(gcodec.ConfigError):
        gcodec.get_codec("fp16").encode("abc")


def test_non_contiguous_and_torch_inputs():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    y = gcodec.decode(gcodec.get_codec("fp16").encode(x))
    np.testing.assert_array_equal(y, x)
    torch = pytest.importorskip("torch")
    t = torch.arange(10, dtype=torch.bfloat16)
    y = gcodec.decode(gcodec.get_codec("bf16").encode(t))
    assert y.dtype == BFLOAT16
    np.testing.assert_array_equal(y.astype(np.float32), np.arange(10, dtype=np.float32))


def test_info_fields():
    x = np.zeros((8, 8), np.float64)
    buf = gcodec.get_codec("uniform", bits=4).encode(x, meta={"step": "12"})
    info = gcodec.validate(buf)
    assert info.codec == "uniform" and info.shape == (8, 8) and info.dtype == np.float64
    assert info.params["bits"] == 4 and info.nbytes == len(buf) and info.meta == {"step": "12"}
    assert info.ratio == pytest.approx(8 * 64 / len(buf))
    d = info.to_dict()
    assert json.loads(json.dumps(d)) == d


def test_limits_on_encode():
    with gcodec.scoped_limits(max_elements=100), pytest.raises(gcodec.LimitExceededError):
        gcodec.get_codec("fp16").encode(np.ones(101, np.float32))
    with gcodec.scoped_limits(max_ndim=2), pytest.raises(gcodec.LimitExceededError):
        gcodec.get_codec("fp16").encode(np.ones((1, 1, 1), np.float32))


# ---------------------------------------------------------------------------------------------
# out=: anything that is not exactly what the kernels need is refused, or handled (docs/limits.md, out=)


def _codec_payloads(n: int = 4096) -> list[bytes]:
    x = np.linspace(-2, 2, n, dtype=np.float32).reshape(2, n // 2)
    return [bytes(gcodec.get_codec(cid, **kw).encode(x, key="t", step=0)) for cid, kw in _OUT_CODECS]


_OUT_CODECS = [("fp16", {}), ("uniform", {}), ("topk", {"ratio": 0.1}), ("randomk", {"ratio": 0.1}), ("powersgd", {})]


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("i", range(len(_OUT_CODECS)), ids=[c for c, _ in _OUT_CODECS])
def test_out_matrix_subclass_is_decoded_correctly(i, accumulate):
    """np.matrix stays 2-D under reshape(-1): a kernel given it would write past its end."""
    b = _codec_payloads()[i]
    want = gcodec.decode(b)
    m = np.matrix(np.zeros((2, 2048), np.float32))
    got = gcodec.decode(b, out=m, accumulate=accumulate)
    assert got is m
    np.testing.assert_array_equal(np.asarray(m), want)


def test_out_refusals():
    b = bytes(gcodec.get_codec("fp16").encode(np.ones((2, 4), np.float32)))
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(gcodec.ConfigError, match="writeable"):
        gcodec.decode(b, out=ro)
    with pytest.raises(gcodec.ConfigError, match="dtype"):
        gcodec.decode(b, out=np.zeros(8, ">f4"))
    unaligned = np.zeros(8 * 4 + 1, np.uint8)[1:].view(np.float32)
    assert not unaligned.flags.aligned
    with pytest.raises(gcodec.ConfigError, match="aligned"):
        gcodec.decode(b, out=unaligned)
    with pytest.raises(gcodec.ConfigError, match="contiguous"):
        gcodec.decode(b, out=np.zeros(16, np.float32)[::2])
    with pytest.raises(gcodec.ConfigError, match="numpy array"):
        gcodec.decode(b, out=[0.0] * 8)


def test_out_overlapping_the_payload_is_refused():
    x = np.arange(64, dtype=np.float32)
    b = bytearray(gcodec.get_codec("fp16").encode(x))
    raw = np.frombuffer(b, np.uint8)
    start = len(b) - 4 - 128  # the data section: 64 binary16 values
    out = raw[start : start + 128].view(np.float16)
    assert out.size == 64 and out.flags.aligned
    with pytest.raises(gcodec.ConfigError, match="overlaps the payload"):
        gcodec.decode(raw, out=out)
    with pytest.raises(gcodec.ConfigError, match="overlaps the payload"):
        gcodec.decode(b, out=out)


def test_bundle_outs_must_not_overlap_each_other():
    x = np.ones(8, np.float32)
    b = gcodec.encode_bundle({"a": x, "b": x})
    shared = np.zeros(8, np.float32)
    with pytest.raises(gcodec.ConfigError, match="overlap"):
        gcodec.decode(b, out={"a": shared, "b": shared})
    np.testing.assert_array_equal(shared, 0.0)


# ---------------------------------------------------------------------------------------------
# bundles with accumulate=True: the whole bundle is checked before any output is touched (item 4)


def _bundle_with_bad_b() -> bytes:
    from tests.codec_kit import parse_payload, rebuild

    x = np.linspace(-1, 1, 64, dtype=np.float32)
    b = bytes(gcodec.encode_bundle({"a": x, "b": x}, "uniform"))
    h, data = parse_payload(b)
    name, _, off, _nb = h["tensors"][1]["sections"][1]
    assert name == "codes"
    data = bytearray(data)
    data[off] = 0x80  # code -128: outside [-127, 127] (rule U2), CRCs recomputed by rebuild
    return rebuild(h, bytes(data))


def test_bundle_accumulate_with_a_bad_value_touches_nothing():
    b = _bundle_with_bad_b()
    outs = {"a": np.full(64, 7.0, np.float32), "b": np.full(64, 7.0, np.float32)}
    with pytest.raises(gcodec.PayloadValueError, match="U2"):
        gcodec.decode(b, out=outs, accumulate=True)
    np.testing.assert_array_equal(outs["a"], 7.0)
    np.testing.assert_array_equal(outs["b"], 7.0)


@pytest.mark.parametrize("bad", ["missing", "size", "readonly", "dtype"])
def test_bundle_accumulate_with_a_bad_out_entry_touches_nothing(bad):
    x = np.ones(8, np.float32)
    b = gcodec.encode_bundle({"a": x, "b": x}, "fp16")
    outs = {"a": np.zeros(8, np.float32), "b": np.zeros(8, np.float32)}
    if bad == "missing":
        del outs["b"]
    elif bad == "size":
        outs["b"] = np.zeros(9, np.float32)
    elif bad == "readonly":
        outs["b"].flags.writeable = False
    else:
        outs["b"] = np.zeros(8, np.int32)
    with pytest.raises(gcodec.ConfigError):
        gcodec.decode(b, out=outs, accumulate=True)
    np.testing.assert_array_equal(outs["a"], 0.0)


def test_encode_of_array_subclasses():
    with pytest.raises(gcodec.ConfigError, match="matrix"):
        gcodec.get_codec("uniform").encode(np.matrix(np.ones((2, 3), np.float32)))
    with pytest.raises(gcodec.ConfigError, match="mask"):
        gcodec.get_codec("fp16").encode(np.ma.masked_array(np.ones(3, np.float32), mask=[0, 1, 0]))
    with pytest.raises(gcodec.ConfigError, match="dtype"):
        gcodec.get_codec("fp16").encode(np.array([1.0, 2.0], dtype=object))


def test_encode_of_unsupported_torch_tensors_is_a_config_error():
    torch = pytest.importorskip("torch")
    codec = gcodec.get_codec("fp16")
    bad = [torch.empty(4, device="meta"), torch.ones(4).to_sparse()]
    if hasattr(torch, "float8_e4m3fn"):
        bad.append(torch.ones(4).to(torch.float8_e4m3fn))
    bad.append(torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8))
    for t in bad:
        with pytest.raises(gcodec.ConfigError):
            codec.encode(t)
