"""Compatibility (specs/format.md: the version rule).

* Payloads written by every released format version stay decodable: their golden vectors stay
  committed under specs/vectors/ and decode to their committed arrays.
* A newer minor version is accepted, unknown optional fields included, unless it requires an
  unknown feature (``UnsupportedFeatureError``).
* Another major version is refused with ``UnsupportedVersionError``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import gcodec
from gcodec import HeaderError, UnsupportedFeatureError, UnsupportedVersionError
from gcodec.arrays import dtype_name
from gcodec.format import container
from tests.codec_kit import parse_payload, rebuild, sample_input, serial_kernels


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


VECTORS = Path(__file__).resolve().parents[1] / "specs" / "vectors"

#: Every format version this library has released. Append, never remove: each one's vectors stay
#: committed and decodable for good.
RELEASED = ["1.0"]


def _manifest() -> dict:
    path = VECTORS / "manifest.json"
    if not path.is_file():
        pytest.fail("specs/vectors/manifest.json is missing: the golden vectors of every released version must stay")
    return json.loads(path.read_text("utf-8"))


def _valid(version: str) -> list[dict]:
    return [e for e in _manifest()["vectors"] if e["kind"] == "valid" and e.get("version") == version]


def test_current_version_is_released():
    assert f"{container.MAJOR}.{container.MINOR}" in RELEASED


@pytest.mark.parametrize("version", RELEASED)
def test_released_version_has_committed_vectors(version):
    entries = _valid(version)
    assert entries, f"no valid golden vectors of format {version} in specs/vectors/manifest.json"
    codecs = {c for e in entries for c in e["codecs"]}
    assert {"fp16", "bf16", "uniform"} <= codecs, f"format {version} vectors cover only {sorted(codecs)}"
    assert any(e["bundle"] for e in entries), f"format {version} has no bundle vector"
    assert any(not e["checksum"] for e in entries), f"format {version} has no checksum-off vector"


@pytest.mark.parametrize("version", RELEASED)
def test_released_version_vectors_decode(version):
    for e in _valid(version):
        raw = (VECTORS / e["file"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == e["sha256"], f"{e['file']} changed since it was released"
        info = gcodec.validate(raw)
        assert f"{info.version[0]}.{info.version[1]}" == version
        got = gcodec.decode(raw)
        want = np.load(VECTORS / e["decoded"]["file"], allow_pickle=False) if "file" in e["decoded"] else None
        if want is None or isinstance(got, dict):
            continue  # bundles: tests/test_vectors.py compares them member by member
        # bfloat16 arrays are committed as their uint16 bits (.npy has no bfloat16)
        assert dtype_name(got.dtype) == e["decoded"]["dtype"] and got.shape == want.shape, e["name"]
        assert got.tobytes() == want.tobytes(), f"{e['name']}: decoded bits differ from the committed array"


# ---------------------------------------------------------------------------------------------
# newer minor versions

X = sample_input((40,))


def _payload(codec: str = "uniform", **kw) -> bytes:
    return bytes(gcodec.get_codec(codec).encode(X, **kw))


def test_future_minor_with_unknown_optional_fields_decodes():
    b = _payload()
    h, data = parse_payload(b)
    h["x_future_top"] = {"anything": [1, 2, 3]}
    h["tensors"][0]["x_future_tensor"] = "hello"
    h["tensors"][0]["params"]["x_future_param"] = 7
    h["meta"] = {"writer": "gcodec 9.9"}
    for minor in (1, 2, 255):
        fut = rebuild(h, data, minor=minor)
        info = gcodec.validate(fut)
        assert info.version == (1, minor)
        np.testing.assert_array_equal(gcodec.decode(fut), gcodec.decode(b))


def test_future_minor_may_write_non_canonical_headers():
    """F11 (canonical form) binds 1.0 writers only: a 1.1 writer may order keys differently."""
    b = _payload("fp16")
    h, data = parse_payload(b)
    reordered = {"tensors": h["tensors"], "data_length": h["data_length"]}
    with pytest.raises(HeaderError, match="F11"):
        gcodec.decode(rebuild(reordered, data, canonical=False))
    np.testing.assert_array_equal(gcodec.decode(rebuild(reordered, data, minor=1, canonical=False)), gcodec.decode(b))


def test_unknown_fields_are_refused_at_the_current_minor():
    b = _payload()
    h, data = parse_payload(b)
    h["x_future_top"] = 1
    with pytest.raises(HeaderError, match="F9"):
        gcodec.decode(rebuild(h, data))


@pytest.mark.parametrize("minor", [0, 1])
def test_unknown_required_feature_is_refused(minor):
    b = _payload()
    h, data = parse_payload(b)
    h["features"] = ["x-future-compression"]
    for fn in (gcodec.decode, gcodec.validate):
        with pytest.raises(UnsupportedFeatureError, match="x-future-compression"):
            fn(rebuild(h, data, minor=minor))


@pytest.mark.parametrize("minor", [0, 1])
def test_unknown_flag_bit_is_refused(minor):
    b = _payload()
    h, data = parse_payload(b)
    with pytest.raises(UnsupportedFeatureError, match="F4"):
        gcodec.decode(rebuild(h, data, minor=minor, flags=0x0003))


# ---------------------------------------------------------------------------------------------
# other major versions


@pytest.mark.parametrize("major", [0, 2, 3, 255])
def test_other_major_version_is_refused(major):
    b = _payload()
    h, data = parse_payload(b)
    fut = rebuild(h, data, major=major)
    for fn in (gcodec.decode, gcodec.validate, gcodec.api.inspect_header):
        with pytest.raises(UnsupportedVersionError, match=rf"F3.*{major}\.0"):
            fn(fut)


def test_major_2_is_refused_whatever_follows_the_preamble():
    """A 2.x payload may change everything after the preamble: the reader must not try to parse it."""
    fut = b"GCDC\x02\x00\x00\x00" + b"\xff" * 64
    with pytest.raises(UnsupportedVersionError):
        gcodec.decode(fut)


def test_newer_codec_version_is_refused():
    b = _payload()
    h, data = parse_payload(b)
    h["tensors"][0]["version"] = gcodec.codec_class("uniform").version + 1
    with pytest.raises(UnsupportedVersionError, match="C0"):
        gcodec.decode(rebuild(h, data))
