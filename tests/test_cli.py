"""The ``gcodec`` command line: every subcommand, its exit codes and its JSON, in-process and once as a process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import gcodec
import gcodec.warmup
from gcodec.arrays import BFLOAT16
from gcodec.cli import main
from gcodec.format.container import PendingTensor, SectionSpec, align_up, write_payload
from tests.procs import run as run_watched

ROOT = Path(__file__).resolve().parents[1]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def grad(shape=(37, 65), seed=0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_t(4, size=shape) * 1e-2).astype(dtype)


def write(path: Path, buf) -> Path:
    path.write_bytes(bytes(buf))
    return path


@pytest.fixture
def payload_file(tmp_path: Path) -> Path:
    return write(tmp_path / "g.gcd", gcodec.get_codec("uniform").encode(grad()))


def data_start(buf: bytes | bytearray) -> int:
    return align_up(16 + int.from_bytes(buf[8:12], "little"))


# --------------------------------------------------------------------------------------------
# top level


def test_version(capsys):
    rc, out, _ = run(capsys, "--version")
    assert rc == 0
    assert out.strip().startswith(f"gcodec {gcodec.__version__}")


def test_no_command_is_a_usage_error(capsys):
    rc, _, err = run(capsys)
    assert rc == 2
    assert "usage" in err


def test_unknown_option_is_a_usage_error(capsys):
    rc, _, _ = run(capsys, "validate", "--frobnicate", "x")
    assert rc == 2


def test_help_exits_zero(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for cmd in ("inspect", "validate", "encode", "decode", "codecs", "demo", "tour"):
        assert cmd in out


# --------------------------------------------------------------------------------------------
# codecs


def test_codecs_json_lists_every_registered_codec_with_its_schema(capsys):
    rc, out, _ = run(capsys, "codecs", "--json")
    assert rc == 0
    table = json.loads(out)
    assert [c["id"] for c in table] == gcodec.list_codecs()
    for c in table:
        cls = gcodec.codec_class(c["id"])
        assert c["aggregation"] == cls.aggregation.value
        assert [p["name"] for p in c["params"]] == list(cls.PARAMS)
        for p in c["params"]:
            assert p["default"] == cls.PARAMS[p["name"]].default
            assert p["doc"] == cls.PARAMS[p["name"]].doc
            assert p["type"]


def test_codecs_text_names_params_and_aggregation(capsys):
    rc, out, _ = run(capsys, "codecs")
    assert rc == 0
    for cid in gcodec.list_codecs():
        cls = gcodec.codec_class(cid)
        assert f"{cid} (v{cls.version}, aggregation: {cls.aggregation.value})" in out
        for name in cls.PARAMS:
            assert f"    {name}: " in out
    assert "bits: int = 8, one of [8, 4, 2]" in out


# --------------------------------------------------------------------------------------------
# encode -> validate -> decode


@pytest.mark.parametrize("cid", gcodec.list_codecs())
def test_round_trip_through_files_equals_library_decode(capsys, tmp_path, cid):
    x = grad()
    np.save(tmp_path / "x.npy", x)
    rc, out, err = run(capsys, "encode", tmp_path / "x.npy", tmp_path / "x.gcd", "--codec", cid)
    assert rc == 0, err
    assert f"wrote {tmp_path / 'x.gcd'}: {cid} [37, 65] float32" in out
    data = (tmp_path / "x.gcd").read_bytes()
    info = gcodec.validate(data)
    assert (info.codec, info.shape, info.dtype) == (cid, x.shape, x.dtype)

    rc, out, err = run(capsys, "validate", tmp_path / "x.gcd")
    assert rc == 0, err
    assert out == f"OK {tmp_path / 'x.gcd'}: {cid} [37, 65] float32 {info.ratio:.3f}x\n"

    rc, out, err = run(capsys, "decode", tmp_path / "x.gcd", tmp_path / "y.npy")
    assert rc == 0, err
    y = np.load(tmp_path / "y.npy")
    ref = gcodec.decode(data)
    assert isinstance(ref, np.ndarray)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    np.testing.assert_array_equal(y, ref)


def test_encode_writes_the_same_bytes_as_the_library(capsys, tmp_path):
    x = grad(seed=3)
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run(
        capsys,
        "encode",
        tmp_path / "x.npy",
        tmp_path / "x.gcd",
        "--codec",
        "uniform",
        "--param",
        "bits=4",
        "--param",
        "group_size=32",
        "--param",
        "rounding=nearest",
    )
    assert rc == 0, err
    want = gcodec.get_codec("uniform", bits=4, group_size=32).encode(x)
    assert (tmp_path / "x.gcd").read_bytes() == bytes(want)


def test_encode_no_checksum(capsys, tmp_path):
    np.save(tmp_path / "x.npy", grad())
    rc, _, _ = run(capsys, "encode", tmp_path / "x.npy", tmp_path / "x.gcd", "--codec", "fp16", "--no-checksum")
    assert rc == 0
    data = (tmp_path / "x.gcd").read_bytes()
    assert data == bytes(gcodec.get_codec("fp16").encode(grad(), checksum=False))
    assert not gcodec.validate(data).checksum
    rc, out, _ = run(capsys, "inspect", tmp_path / "x.gcd", "--json")
    assert rc == 0
    assert json.loads(out)["preamble"]["payload_crc"] is False


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--codec", "nosuch"], "UnknownCodecError"),
        (["--codec", "uniform", "--param", "bits=3"], "ConfigError"),
        (["--codec", "uniform", "--param", "nosuch=1"], "ConfigError"),
        (["--codec", "uniform", "--param", "bits"], "KEY=VALUE"),
        (["--codec", "uniform", "--param", 'bits="8"'], "ConfigError"),  # JSON string, not int
    ],
)
def test_encode_bad_codec_or_params_is_a_usage_error(capsys, tmp_path, args, needle):
    np.save(tmp_path / "x.npy", grad())
    rc, _, err = run(capsys, "encode", tmp_path / "x.npy", tmp_path / "x.gcd", *args)
    assert rc == 2
    assert needle in err
    assert not (tmp_path / "x.gcd").exists()


def test_encode_missing_or_unreadable_input_is_a_usage_error(capsys, tmp_path):
    rc, _, err = run(capsys, "encode", tmp_path / "nope.npy", tmp_path / "x.gcd", "--codec", "fp16")
    assert rc == 2 and "no such file" in err
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    rc, _, err = run(capsys, "encode", tmp_path / "junk.npy", tmp_path / "x.gcd", "--codec", "fp16")
    assert rc == 2 and "cannot read" in err


def test_encode_rejected_values_exit_1(capsys, tmp_path):
    x = grad()
    x[5, 5] = np.nan
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run(capsys, "encode", tmp_path / "x.npy", tmp_path / "x.gcd", "--codec", "uniform")
    assert rc == 1
    assert "PayloadValueError" in err
    np.save(tmp_path / "i.npy", np.arange(5))
    rc, _, err = run(capsys, "encode", tmp_path / "i.npy", tmp_path / "x.gcd", "--codec", "fp16")
    assert rc == 1
    assert "ConfigError" in err and "int64" in err


def test_npz_makes_a_bundle_and_decodes_to_npz(capsys, tmp_path):
    arrays = {"layer1.weight": grad((8, 9)), "layer1.bias": grad((9,), seed=1), "scalar": np.float32(2.5)}
    np.savez(tmp_path / "g.npz", **arrays)
    rc, out, err = run(capsys, "encode", tmp_path / "g.npz", tmp_path / "g.gcd", "--codec", "bf16")
    assert rc == 0, err
    data = (tmp_path / "g.gcd").read_bytes()
    info = gcodec.validate(data)
    assert info.is_bundle
    assert [t.name for t in info.tensors] == list(arrays)
    assert data == bytes(gcodec.encode_bundle(arrays, "bf16"))

    rc, out, _ = run(capsys, "validate", tmp_path / "g.gcd")
    assert rc == 0
    assert out.startswith(f"OK {tmp_path / 'g.gcd'}: bundle[3]:bf16 ")

    rc, _, err = run(capsys, "decode", tmp_path / "g.gcd", tmp_path / "out.npz")
    assert rc == 0, err
    ref = gcodec.decode_bundle(data)
    with np.load(tmp_path / "out.npz") as got:
        assert sorted(got.files) == sorted(ref)
        for k in ref:
            np.testing.assert_array_equal(got[k], ref[k])
            assert got[k].shape == np.shape(arrays[k])

    rc, _, err = run(capsys, "decode", tmp_path / "g.gcd", tmp_path / "out.npy")
    assert rc == 2
    assert ".npz" in err


def test_bfloat16_round_trip_through_npy(capsys, tmp_path):
    x = grad((100,), dtype=np.float32).astype(BFLOAT16)
    np.save(tmp_path / "x.npy", x)  # stored as |V2
    rc, _, err = run(capsys, "encode", tmp_path / "x.npy", tmp_path / "x.gcd", "--codec", "uniform")
    assert rc == 0, err
    data = (tmp_path / "x.gcd").read_bytes()
    assert gcodec.validate(data).dtype == BFLOAT16
    rc, _, err = run(capsys, "decode", tmp_path / "x.gcd", tmp_path / "y.npy")
    assert rc == 0
    assert "bfloat16" in err
    y = np.load(tmp_path / "y.npy").view(BFLOAT16)
    np.testing.assert_array_equal(y, gcodec.decode(data))


def test_bfloat16_in_the_golden_vectors_convention(capsys, tmp_path):
    """specs/vectors stores bfloat16 inputs and outputs as <u2 bit patterns; the CLI reads and writes both."""
    vec = ROOT / "specs" / "vectors" / "valid"
    rc, _, err = run(
        capsys, "encode", vec / "uniform_b4_g16_bf16_input.input.npy", tmp_path / "v.gcd", "--codec", "uniform"
    )
    assert rc == 2 and "--dtype bfloat16" in err  # uint16 is not silently taken as bfloat16
    rc, _, err = run(
        capsys,
        "encode",
        vec / "uniform_b4_g16_bf16_input.input.npy",
        tmp_path / "v.gcd",
        "--codec",
        "uniform",
        "--param",
        "bits=4",
        "--param",
        "group_size=16",
        "--dtype",
        "bfloat16",
    )
    assert rc == 0, err
    assert (tmp_path / "v.gcd").read_bytes() == (vec / "uniform_b4_g16_bf16_input.gcd").read_bytes()
    rc, _, err = run(capsys, "decode", tmp_path / "v.gcd", tmp_path / "v.npy", "--bf16-bits")
    assert rc == 0 and "<u2" in err
    got = np.load(tmp_path / "v.npy")
    assert got.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(got, np.load(vec / "uniform_b4_g16_bf16_input.npy"))


def test_decode_invalid_payload_exits_1(capsys, tmp_path, payload_file):
    buf = bytearray(payload_file.read_bytes())
    buf[-10] ^= 0xFF
    bad = write(tmp_path / "bad.gcd", buf)
    rc, _, err = run(capsys, "decode", bad, tmp_path / "y.npy")
    assert rc == 1
    assert f"FAIL {bad}: ChecksumError: " in err
    assert not (tmp_path / "y.npy").exists()


def test_decode_missing_file_exits_2(capsys, tmp_path):
    rc, _, err = run(capsys, "decode", tmp_path / "nope.gcd", tmp_path / "y.npy")
    assert rc == 2
    assert "no such file" in err


# --------------------------------------------------------------------------------------------
# validate


def corruptions(buf: bytes) -> dict[str, tuple[bytes, str]]:
    """name -> (corrupted payload, the error class gcodec must name)."""
    ds = data_start(buf)
    flip_data = bytearray(buf)
    flip_data[ds + 3] ^= 0x01
    flip_header = bytearray(buf)
    flip_header[20] ^= 0x40
    magic = bytearray(buf)
    magic[0:4] = b"NOPE"
    major = bytearray(buf)
    major[4] = 9
    return {
        "data byte": (bytes(flip_data), "ChecksumError"),
        "header byte": (bytes(flip_header), "ChecksumError"),
        "truncated": (buf[:-7], "LayoutError"),
        "appended": (buf + b"\0", "LayoutError"),
        "magic": (bytes(magic), "FormatError"),
        "major version": (bytes(major), "UnsupportedVersionError"),
        "too short": (buf[:9], "FormatError"),
    }


@pytest.mark.parametrize("case", list(corruptions(b"\0" * 64)))
def test_validate_corrupted_file_names_the_error_class(capsys, tmp_path, payload_file, case):
    bad_bytes, cls_name = corruptions(payload_file.read_bytes())[case]
    with pytest.raises(gcodec.GcodecError) as ei:
        gcodec.validate(bad_bytes)
    assert type(ei.value).__name__ == cls_name  # the CLI must report what the library raises
    bad = write(tmp_path / "bad.gcd", bad_bytes)
    rc, out, err = run(capsys, "validate", bad)
    assert rc == 1
    assert out == ""
    assert err.startswith(f"FAIL {bad}: {cls_name}: ")
    assert str(ei.value) in err


def test_validate_many_files(capsys, tmp_path, payload_file):
    other = write(tmp_path / "h.gcd", gcodec.get_codec("fp16").encode(grad((3,))))
    rc, out, err = run(capsys, "validate", payload_file, other)
    assert rc == 0 and err == ""
    assert out.splitlines()[0].startswith(f"OK {payload_file}: uniform [37, 65] float32 ")
    assert out.splitlines()[1].startswith(f"OK {other}: fp16 [3] float32 0.")  # tiny: the header dominates

    bad = write(tmp_path / "bad.gcd", payload_file.read_bytes()[:-1])
    rc, out, err = run(capsys, "validate", payload_file, bad, other)
    assert rc == 1
    assert len(out.splitlines()) == 2  # the good ones still report OK
    assert f"FAIL {bad}: LayoutError" in err

    rc, out, err = run(capsys, "validate", payload_file, tmp_path / "missing.gcd", bad)
    assert rc == 2  # a missing file outranks an invalid one
    assert f"FAIL {tmp_path / 'missing.gcd'}: " in err and "no such file" in err
    assert f"FAIL {bad}: LayoutError" in err


def test_validate_reads_standard_input(tmp_path, payload_file):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for data, rc, stream, start in (
        (payload_file.read_bytes(), 0, "stdout", "OK -: uniform [37, 65] float32 "),
        (payload_file.read_bytes()[:-1], 1, "stderr", "FAIL -: LayoutError"),
    ):
        p = run_watched([sys.executable, "-m", "gcodec", "validate", "-"], 120, input=data, text=False, env=env)
        assert p.returncode == rc, p.stderr
        assert getattr(p, stream).decode().startswith(start)


def test_validate_needs_a_file(capsys):
    rc, _, _ = run(capsys, "validate")
    assert rc == 2


# --------------------------------------------------------------------------------------------
# inspect


def test_inspect_json_matches_validate(capsys, payload_file):
    rc, out, _ = run(capsys, "inspect", payload_file, "--json")
    assert rc == 0
    r = json.loads(out)
    data = payload_file.read_bytes()
    info = gcodec.validate(data)
    assert r["valid"] is True and r["error"] is None
    assert r["container_ok"] is True
    assert r["file"] == str(payload_file)
    assert r["file_nbytes"] == len(data)
    want = json.loads(json.dumps(info.to_dict()))
    got = {k: v for k, v in r["payload"].items()}
    for t in got["tensors"]:
        assert t.pop("numel") == 37 * 65
        assert t.pop("original_nbytes") == 37 * 65 * 4
        assert t.pop("section_nbytes") == sum(s["nbytes"] for s in t["sections"])
        assert t.pop("bits_per_element") > 0
    assert got == want
    assert r["preamble"] == {
        "magic": "GCDC",
        "version": "1.0",
        "flags": 1,
        "payload_crc": True,
        "header_length": info.header_nbytes,
        "header_crc32c": f"0x{int.from_bytes(data[12:16], 'little'):08x}",
    }


def test_inspect_text(capsys, payload_file):
    rc, out, _ = run(capsys, "inspect", payload_file)
    assert rc == 0
    info = gcodec.validate(payload_file.read_bytes())
    assert "codec uniform v1, float32 [37, 65]" in out
    assert "params: bits=8, group_size=64, rounding='nearest'" in out
    for name, dt, off, nb in info.tensors[0].sections:
        assert f"    {name:<12} {dt:<5} {off:>12,} {nb:>12,}" in out
    assert f"ratio {info.ratio:.3f}x, {info.bits_per_element:.3f} bits/element" in out
    assert out.rstrip().endswith("validation: OK")


def test_inspect_bundle_lists_every_tensor(capsys, tmp_path):
    tensors = {"a": grad((4,)), "b": grad((2, 3), seed=1)}
    f = write(tmp_path / "b.gcd", gcodec.encode_bundle(tensors, {"a": "fp16", "b": "uniform"}))
    rc, out, _ = run(capsys, "inspect", f, "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["payload"]["bundle"] is True
    assert [(t["name"], t["codec"], t["shape"]) for t in r["payload"]["tensors"]] == [
        ("a", "fp16", [4]),
        ("b", "uniform", [2, 3]),
    ]
    rc, out, _ = run(capsys, "inspect", f)
    assert "bundle of 2 tensors" in out and "tensor [1] b: codec uniform" in out


def test_inspect_shows_the_container_when_a_codec_rule_fails(capsys, tmp_path):
    # uniform 8-bit code -128 is forbidden (U2); without the payload CRC only the codec check sees it
    buf = bytearray(gcodec.get_codec("uniform").encode(grad(), checksum=False))
    info = gcodec.validate(buf)
    ((_, _, off, _),) = [s for s in info.tensors[0].sections if s[0] == "codes"]
    buf[data_start(buf) + off] = 0x80
    f = write(tmp_path / "u2.gcd", buf)
    with pytest.raises(gcodec.PayloadValueError):
        gcodec.validate(bytes(buf))

    rc, out, _ = run(capsys, "inspect", f, "--json")
    assert rc == 1
    r = json.loads(out)
    assert r["container_ok"] is True
    assert r["payload"]["tensors"][0]["codec"] == "uniform"
    assert r["valid"] is False
    assert r["error"]["class"] == "PayloadValueError" and "U2" in r["error"]["message"]

    rc, out, _ = run(capsys, "inspect", f)
    assert rc == 1
    assert "codec uniform" in out
    assert "validation: FAIL PayloadValueError: U2" in out


def test_inspect_unknown_codec(capsys, tmp_path):
    def fill(views):
        views["data"][:] = 7

    pend = PendingTensor("nosuch", 1, "float32", (4,), {"k": 1}, [SectionSpec("data", "u1", 8)], fill)
    f = write(tmp_path / "u.gcd", write_payload([pend]))
    rc, out, _ = run(capsys, "inspect", f, "--json")
    assert rc == 1
    r = json.loads(out)
    assert r["container_ok"] is True
    t = r["payload"]["tensors"][0]
    assert (t["codec"], t["params"], t["sections"][0]["nbytes"]) == ("nosuch", {"k": 1}, 8)
    assert r["error"]["class"] == "UnknownCodecError"
    rc, _, err = run(capsys, "validate", f)
    assert rc == 1 and "UnknownCodecError" in err


def test_inspect_describes_a_payload_whose_data_checksum_fails(capsys, tmp_path, payload_file):
    bad_bytes, _ = corruptions(payload_file.read_bytes())["data byte"]
    f = write(tmp_path / "bad.gcd", bad_bytes)
    rc, out, _ = run(capsys, "inspect", f, "--json")
    assert rc == 1
    r = json.loads(out)
    assert r["container_ok"] is False
    assert r["container_error"].startswith("ChecksumError: F14")
    assert r["payload"]["tensors"][0]["shape"] == [37, 65]  # the header is intact, so it is shown
    assert r["error"]["class"] == "ChecksumError"


@pytest.mark.parametrize("junk", [b"", b"GCDC", b"hello world, this is not a payload"])
def test_inspect_garbage(capsys, tmp_path, junk):
    f = write(tmp_path / "junk.gcd", junk)
    rc, out, _ = run(capsys, "inspect", f, "--json")
    assert rc == 1
    r = json.loads(out)
    assert r["payload"] is None and r["valid"] is False
    assert r["error"]["class"] == "FormatError"
    rc, out, _ = run(capsys, "inspect", f)
    assert rc == 1 and "validation: FAIL FormatError" in out


def test_inspect_missing_file(capsys, tmp_path):
    rc, _, err = run(capsys, "inspect", tmp_path / "nope.gcd")
    assert rc == 2 and "no such file" in err


def test_inspect_and_validate_committed_vectors(capsys):
    vecs = sorted((ROOT / "specs" / "vectors").rglob("*.gcd"))
    assert len(vecs) > 100, "the golden vectors are committed: a missing or emptied folder is a failure"
    for v in vecs:
        rc, out, _ = run(capsys, "inspect", v, "--json")
        r = json.loads(out)
        assert rc == (0 if r["valid"] else 1)
        try:
            gcodec.validate(v.read_bytes())
            assert r["valid"]
        except gcodec.GcodecError as e:
            assert r["error"]["class"] == type(e).__name__


# --------------------------------------------------------------------------------------------
# as a process


def test_python_m_gcodec_and_exit_codes(tmp_path, payload_file):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bad = write(tmp_path / "bad.gcd", payload_file.read_bytes()[:-3])
    p = run_watched([sys.executable, "-m", "gcodec", "validate", str(payload_file), str(bad)], 120, env=env)
    assert p.returncode == 1, p.stderr
    assert p.stdout.startswith(f"OK {payload_file}: uniform ")
    assert f"FAIL {bad}: LayoutError" in p.stderr
    p = run_watched([sys.executable, "-m", "gcodec", "--version"], 120, env=env)
    assert p.returncode == 0
    assert p.stdout.strip().startswith(f"gcodec {gcodec.__version__}")


def test_warmup_compiles_the_named_codecs(capsys):
    rc, out, _ = run(capsys, "warmup", "--codec", "fp16", "--codec", "bf16")
    assert rc == 0
    lines = out.splitlines()
    assert any("get_codec('fp16')" in ln for ln in lines) and any("get_codec('bf16')" in ln for ln in lines)
    assert lines[-1].startswith("warmed up 2 codec settings")
    rc, _, err = run(capsys, "warmup", "--codec", "nope")
    assert rc == 2 and "nope" in err


def test_warmup_compiles_in_parallel_processes(capsys):
    # each setting is compiled in a spawned process of the pool: the labels and seconds come back
    # from those processes, one line per setting, whatever order they finish in
    rc, out, _ = run(capsys, "warmup", "--jobs", "2", "--codec", "fp16", "--codec", '{"id": "uniform", "bits": 4}')
    assert rc == 0
    lines = out.splitlines()
    assert sum("get_codec('fp16')" in ln for ln in lines) == 1
    assert sum("bits=4" in ln for ln in lines) == 1
    assert lines[-1].startswith("warmed up 2 codec settings") and "(2 process(es))" in lines[-1]
    for bad in ("0", "-1", "two"):
        rc, _, err = run(capsys, "warmup", "--jobs", bad, "--codec", "fp16")
        assert rc == 2 and "--jobs" in err
    with pytest.raises(ValueError, match="jobs"):
        gcodec.warmup.warmup(["fp16"], jobs=0)


def test_warmup_takes_json_configs(capsys):
    rc, out, _ = run(capsys, "warmup", "--codec", '{"id": "uniform", "bits": 4, "group_size": 32}')
    assert rc == 0
    assert "bits=4, group_size=32" in out and out.splitlines()[-1].startswith("warmed up 1 codec settings")
    rc, _, err = run(capsys, "warmup", "--codec", '{"id": "uniform", "bits": 5}')
    assert rc == 2 and "bits" in err
    rc, _, err = run(capsys, "warmup", "--codec", "{nope")
    assert rc == 2 and "JSON" in err
