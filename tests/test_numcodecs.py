"""numcodecs and zarr interop (docs/interop.md): gcodec codecs as numcodecs codecs and as a zarr v3 serializer."""

from __future__ import annotations

import json
import os
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

import gcodec
from tests.codec_kit import cases_for, sample_input, serial_kernels
from tests.procs import own_env, run

numcodecs = pytest.importorskip("numcodecs")
gnc = pytest.importorskip("gcodec.interop.numcodecs")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


def _configs() -> list:
    out = []
    for cid in gcodec.list_codecs():
        case = cases_for(cid)[0]
        out.append(pytest.param(case, id=case.id))
    return out


@pytest.mark.parametrize("case", _configs())
def test_round_trip_through_the_numcodecs_registry(case):
    c = numcodecs.get_codec({"id": "gcodec", "codec": case.codec, **case.params})
    assert isinstance(c, gnc.GcodecNumcodec)
    x = sample_input((6, 11))
    buf = c.encode(x)
    assert isinstance(buf, bytes)
    info = gcodec.validate(buf)  # every chunk is a complete gcodec payload
    assert info.codec == case.codec and info.shape == x.shape
    y = c.decode(buf)
    np.testing.assert_array_equal(y, gcodec.decode(buf))
    assert y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("case", _configs())
def test_config_is_json_and_round_trips(case):
    c = gnc.GcodecNumcodec(codec=case.codec, **case.params)
    cfg = c.get_config()
    assert cfg["id"] == "gcodec" and cfg["codec"] == case.codec
    cfg2 = json.loads(json.dumps(cfg))
    c2 = numcodecs.get_codec(cfg2)
    assert c2.get_config() == cfg and c2 == c
    assert "GcodecNumcodec(" in repr(c)


def test_decode_into_out():
    c = gnc.GcodecNumcodec(codec="fp16")
    x = sample_input((4, 8))
    buf = c.encode(x)
    out = np.empty_like(x)
    assert c.decode(buf, out=out) is out
    np.testing.assert_array_equal(out, c.decode(buf))
    raw = bytearray(x.nbytes)  # numcodecs also passes plain byte buffers
    c.decode(buf, out=raw)
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(x.shape), out)
    flat = np.empty(x.size, np.float32)  # same size, other shape: copied in
    c.decode(np.frombuffer(buf, np.uint8), out=flat)
    np.testing.assert_array_equal(flat, out.reshape(-1))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_dtypes(dtype):
    from gcodec.arrays import DTYPES

    c = gnc.GcodecNumcodec(codec="bf16")
    x = sample_input((3, 5)).astype(DTYPES[dtype])
    y = c.decode(c.encode(x))
    assert y.dtype == x.dtype and y.shape == x.shape


def test_bad_input_gives_gcodec_errors():
    c = gnc.GcodecNumcodec(codec="uniform")
    with pytest.raises(gcodec.ConfigError):
        c.encode(np.arange(10, dtype=np.int32))  # a compressor's raw bytes are not a float array
    with pytest.raises(gcodec.GcodecError):
        c.decode(b"not a payload")
    bundle = bytes(gcodec.encode_bundle({"a": np.ones(3, np.float32)}))
    with pytest.raises(gcodec.ConfigError, match="bundle"):
        c.decode(bundle)
    with pytest.raises(gcodec.ConfigError, match="reserved"):
        gnc.GcodecNumcodec(codec="fp16", id=3)
    with pytest.raises(gcodec.UnknownCodecError):
        numcodecs.get_codec({"id": "gcodec", "codec": "nope"})


def test_checksum_switch():
    x = sample_input((50,))
    on, off = gnc.GcodecNumcodec(codec="fp16"), gnc.GcodecNumcodec(codec="fp16", checksum=False)
    assert gcodec.validate(on.encode(x)).checksum and not gcodec.validate(off.encode(x)).checksum
    assert off.get_config()["checksum"] is False


def test_entry_point_is_declared():
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    assert '[project.entry-points."numcodecs.codecs"]' in text, "pyproject.toml lacks the numcodecs.codecs entry point"
    assert 'gcodec = "gcodec.interop.numcodecs:GcodecNumcodec"' in text


def test_entry_point_resolves_without_importing_the_adapter():
    if "gcodec" not in {e.name for e in entry_points(group="numcodecs.codecs")}:
        pytest.skip("gcodec is installed without its numcodecs.codecs entry point (reinstall: pip install -e .)")
    code = (
        "import numcodecs, numpy as np, sys\n"
        "c = numcodecs.get_codec({'id': 'gcodec', 'codec': 'fp16'})\n"
        "assert c.decode(c.encode(np.ones(4, np.float32))).tolist() == [1.0] * 4\n"
        "print(type(c).__module__)\n"
    )
    out = run([sys.executable, "-c", code], 120, cwd=os.getcwd(), env=own_env(), check=True)
    assert out.stdout.strip() == "gcodec.interop.numcodecs"


# ---------------------------------------------------------------------------------------------
# zarr

zarr = pytest.importorskip("zarr")
ZARR3 = int(zarr.__version__.split(".")[0]) >= 3
gzc = pytest.importorskip("gcodec.interop.zarr") if ZARR3 else None


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr warns that numcodecs codecs are not in the v3 spec
        yield


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
@pytest.mark.parametrize("case", _configs())
@pytest.mark.parametrize("compressors", [None, "auto"], ids=["raw", "zstd"])
def test_zarr_v3_serializer(case, compressors, tmp_path):
    store = zarr.storage.LocalStore(tmp_path / "grads.zarr")
    x = sample_input((40, 24))
    kw = {} if compressors == "auto" else {"compressors": None}
    z = zarr.create_array(
        store, shape=x.shape, chunks=(16, 24), dtype="float32",
        serializer=gzc.GcodecZarrCodec(codec=case.codec, **case.params), **kw,
    )  # fmt: skip
    z[:] = x
    meta = json.loads((tmp_path / "grads.zarr" / "zarr.json").read_text())
    ser = [c for c in meta["codecs"] if c["name"] == "gcodec"]
    assert ser and ser[0]["configuration"]["codec"] == case.codec
    # every chunk equals decoding it on its own; the edge chunk (8 of 16 rows) is padded by zarr
    z2 = zarr.open_array(zarr.storage.LocalStore(tmp_path / "grads.zarr", read_only=True))
    y = z2[:]
    assert y.shape == x.shape and y.dtype == np.float32
    codec = gcodec.get_codec(case.codec, **case.params)
    first = gcodec.decode(codec.encode(np.ascontiguousarray(x[:16])))
    if case.codec in ("fp16", "bf16", "uniform"):  # deterministic codecs: bit-identical
        np.testing.assert_array_equal(y[:16], first)
    if not compressors:
        raw = (tmp_path / "grads.zarr" / "c" / "0" / "0").read_bytes()
        assert gcodec.validate(raw).shape == (16, 24)


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
@pytest.mark.parametrize("cid, kw", [("uniform", {"bits": 4, "rounding": "stochastic"}), ("randomk", {"k": 5})])
def test_zarr_v3_chunks_of_a_stochastic_codec_take_different_streams(cid, kw):
    """zarr rebuilds the codec per chunk; the stream counter lives outside it, so two identical chunks
    are not rounded (or sampled) identically."""
    x = np.tile(sample_input((1, 64)), (2, 1))  # two identical chunks
    z = zarr.create_array(
        zarr.storage.MemoryStore(), shape=x.shape, chunks=(1, 64), dtype="float32", compressors=None,
        serializer=gzc.GcodecZarrCodec(codec=cid, **kw),
    )  # fmt: skip
    z[:] = x
    raw = [bytes(z.store._store_dict[f"c/{i}/0"].to_bytes()) for i in range(2)]
    streams = [gcodec.validate(r).params["stream"] for r in raw]
    assert streams[0] != streams[1]
    assert raw[0] != raw[1]


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
def test_zarr_v3_stores_bfloat16_values_as_float32_arrays_with_the_bf16_codec():
    """docs/interop.md: zarr has no bfloat16 dtype; a float32 array with the bf16 codec stores 2 bytes
    per element and reads back the bfloat16 values exactly."""
    import ml_dtypes

    x = sample_input((4, 64)).astype(ml_dtypes.bfloat16)
    z = zarr.create_array(
        zarr.storage.MemoryStore(), shape=x.shape, chunks=(4, 64), dtype="float32", compressors=None,
        serializer=gzc.GcodecZarrCodec(codec="bf16"),
    )  # fmt: skip
    z[:] = x.astype(np.float32)
    raw = bytes(z.store._store_dict["c/0/0"].to_bytes())
    assert gcodec.validate(raw).nbytes - gcodec.validate(raw).header_nbytes < 2 * x.size + 64
    np.testing.assert_array_equal(z[:], x.astype(np.float32))


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
def test_zarr_v3_step_pins_one_stream_for_every_chunk():
    x = np.tile(sample_input((1, 64)), (2, 1))
    z = zarr.create_array(
        zarr.storage.MemoryStore(), shape=x.shape, chunks=(1, 64), dtype="float32", compressors=None,
        serializer=gzc.GcodecZarrCodec(codec="uniform", bits=4, rounding="stochastic", step=9),
    )  # fmt: skip
    z[:] = x
    raw = [bytes(z.store._store_dict[f"c/{i}/0"].to_bytes()) for i in range(2)]
    assert raw[0] == raw[1] and gcodec.validate(raw[0]).params["stream"] == 9


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
def test_zarr_v3_reopen_in_fresh_process(tmp_path):
    """zarr finds the codec from the stored metadata alone, through the zarr.codecs entry point."""
    if "gcodec" not in {e.name for e in entry_points(group="zarr.codecs")}:
        pytest.skip("gcodec is installed without its zarr.codecs entry point (reinstall: pip install -e .)")
    store = zarr.storage.LocalStore(tmp_path / "a.zarr")
    z = zarr.create_array(store, shape=(8,), chunks=(8,), dtype="float32", serializer=gzc.GcodecZarrCodec())
    z[:] = np.arange(8, dtype=np.float32)
    code = f"import zarr; print(zarr.open_array({str(tmp_path / 'a.zarr')!r}, mode='r')[:].tolist())"
    out = run([sys.executable, "-c", code], 120, cwd=os.getcwd(), env=own_env(), check=True)
    assert out.stdout.strip() == str([float(i) for i in range(8)])


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
def test_zarr_v3_refuses_non_float_arrays(tmp_path):
    with pytest.raises(ValueError, match="float"):
        zarr.create_array(
            zarr.storage.MemoryStore(), shape=(8,), chunks=(8,), dtype="int32", serializer=gzc.GcodecZarrCodec()
        )


@pytest.mark.skipif(not ZARR3, reason="zarr 3 needed")
def test_zarr_v3_config_round_trip():
    c = gzc.GcodecZarrCodec(codec="uniform", bits=4, group_size=32)
    d = c.to_dict()
    params = gcodec.get_codec("uniform", bits=4, group_size=32).params  # every param filled in
    assert d == {"name": "gcodec", "configuration": {"codec": "uniform", "checksum": True, **params}}
    assert gzc.GcodecZarrCodec.from_dict(json.loads(json.dumps(d))) == c


def test_numcodec_keeps_the_memory_order_of_fortran_arrays():
    """numcodecs codecs see a chunk as its memory: the decoded buffer must hold the same values in the
    same memory order (numcodecs' own check flattens both with order="A")."""
    c = gnc.GcodecNumcodec(codec="fp16")
    x = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = c.decode(c.encode(x))
    np.testing.assert_array_equal(np.asarray(y).reshape(-1, order="A"), x.reshape(-1, order="A"))
    from numcodecs.tests.common import compare_arrays  # numcodecs' own round-trip comparison

    compare_arrays(x, y)
    assert y.shape == x.shape and y.flags.f_contiguous


def test_numcodec_stochastic_streams_advance_per_chunk():
    c = gnc.GcodecNumcodec(codec="uniform", bits=4, rounding="stochastic")
    x = sample_input((64,))
    assert [gcodec.validate(c.encode(x)).params["stream"] for _ in range(3)] == [0, 1, 2]


def test_zarr_format_2_filter_fortran_order(tmp_path, quiet):
    """zarr format 2 arrays with order="F" read back as written, not transposed."""
    x = sample_input((6, 8))
    c = numcodecs.get_codec({"id": "gcodec", "codec": "fp16"})
    store = zarr.storage.LocalStore(tmp_path / "f.zarr")
    z = zarr.create_array(store, shape=x.shape, chunks=(3, 8), dtype="float32", filters=[c], zarr_format=2, order="F")
    z[:] = x
    y = zarr.open_array(zarr.storage.LocalStore(tmp_path / "f.zarr", read_only=True), zarr_format=2)[:]
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))


def test_zarr_format_2_filter(tmp_path, quiet):
    """zarr format 2 (the numcodecs path): the gcodec codec is a filter, it sees each chunk as an array."""
    x = sample_input((30, 7))
    c = numcodecs.get_codec({"id": "gcodec", "codec": "uniform", "bits": 8})
    store = zarr.storage.LocalStore(tmp_path / "v2.zarr")
    z = zarr.create_array(store, shape=x.shape, chunks=(10, 7), dtype="float32", filters=[c], zarr_format=2)
    z[:] = x
    z2 = zarr.open_array(zarr.storage.LocalStore(tmp_path / "v2.zarr", read_only=True), zarr_format=2)
    y = z2[:]
    np.testing.assert_array_equal(y[:10], c.decode(c.encode(np.ascontiguousarray(x[:10]))))
    assert np.abs(y - x).max() <= np.abs(x).max() / 127
