"""The container rules of specs/format.md, one test per rule (F1-F15)."""

from __future__ import annotations

import re
import struct

import msgpack
import numpy as np
import pytest

import gcodec
from gcodec.checksum import crc32c
from gcodec.format import header as hdr
from gcodec.format.container import PREAMBLE_SIZE, align_up, read_payload


def payload(x=None, **kw) -> bytearray:
    if x is None:
        x = np.arange(10, dtype=np.float32)
    return bytearray(gcodec.get_codec("uniform", **kw).encode(x))


def split(buf: bytes) -> tuple[dict, int]:
    """(parsed header, header length)."""
    hlen = struct.unpack_from("<I", buf, 8)[0]
    return msgpack.unpackb(bytes(buf[16 : 16 + hlen])), hlen


def rebuild(buf: bytes, new_header: dict | bytes, *, minor: int | None = None, fix_payload_crc=True) -> bytearray:
    """Replace the header (re-encoding canonically unless bytes are given) and fix both CRCs."""
    _, hlen = split(buf)
    flags = struct.unpack_from("<H", buf, 6)[0]
    data_start = align_up(16 + hlen)
    data = bytes(buf[data_start : len(buf) - (4 if flags & 1 else 0)])
    hb = new_header if isinstance(new_header, bytes) else hdr.pack_canonical(new_header)
    pre = bytearray(buf[:16])
    if minor is not None:
        pre[5] = minor
    struct.pack_into("<I", pre, 8, len(hb))
    struct.pack_into("<I", pre, 12, crc32c(hb, crc32c(bytes(pre[:12]))))
    pad = bytes(align_up(16 + len(hb)) - 16 - len(hb))
    out = bytearray(pre + hb + pad + data)
    if flags & 1:
        out += struct.pack("<I", crc32c(bytes(out[16 + len(hb) :])) if fix_payload_crc else 0)
    return out


def fix_header_crc(buf: bytearray) -> bytearray:
    hlen = struct.unpack_from("<I", buf, 8)[0]
    struct.pack_into("<I", buf, 12, crc32c(bytes(buf[16 : 16 + hlen]), crc32c(bytes(buf[:12]))))
    return buf


def fix_payload_crc(buf: bytearray) -> bytearray:
    hlen = struct.unpack_from("<I", buf, 8)[0]
    struct.pack_into("<I", buf, len(buf) - 4, crc32c(bytes(buf[16 + hlen : len(buf) - 4])))
    return buf


def test_preamble_layout():
    b = payload()
    magic, major, minor, flags, hlen, hcrc = struct.unpack_from("<4sBBHII", b)
    assert (magic, major, minor, flags) == (b"GCDC", 1, 0, 1)
    assert hcrc == crc32c(bytes(b[16 : 16 + hlen]), crc32c(bytes(b[:12])))
    (pcrc,) = struct.unpack_from("<I", b, len(b) - 4)
    assert pcrc == crc32c(bytes(b[16 + hlen : -4]))


def test_sections_aligned_and_zero_copy():
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    b = gcodec.get_codec("uniform").encode(x)
    p = read_payload(b)
    assert p.data_start % 8 == 0
    for s in p.header.tensors[0].sections:
        assert (p.data_start + s.offset) % 8 == 0
        v = p.view(s)
        assert v.base is not None  # a view into the payload, not a copy
        assert np.shares_memory(v, p.buffer)


def test_F1_too_short():
    for n in range(16):
        with pytest.raises(gcodec.FormatError, match="F1"):
            gcodec.validate(payload()[:n])


def test_F2_bad_magic():
    b = payload()
    b[0] ^= 1
    with pytest.raises(gcodec.FormatError, match="F2"):
        gcodec.decode(b)


@pytest.mark.parametrize("major", [0, 2, 255])
def test_F3_major_version(major):
    b = payload()
    b[4] = major
    with pytest.raises(gcodec.UnsupportedVersionError, match="F3"):
        gcodec.validate(b)


def test_F4_unknown_flag():
    b = payload()
    b[6] |= 0x02
    with pytest.raises(gcodec.UnsupportedFeatureError, match="F4"):
        gcodec.validate(b)


def test_F5_header_length_zero_and_limit():
    b = payload()
    struct.pack_into("<I", b, 8, 0)
    with pytest.raises(gcodec.HeaderError, match="F5"):
        gcodec.validate(b)
    b = payload()
    with gcodec.scoped_limits(max_header_bytes=10), pytest.raises(gcodec.LimitExceededError):
        gcodec.validate(b)


def test_F6_header_past_end():
    b = payload()
    struct.pack_into("<I", b, 8, len(b))
    with pytest.raises(gcodec.LayoutError, match="F6"):
        gcodec.validate(b)


def test_F7_header_crc():
    b = payload()
    b[20] ^= 0x40
    with pytest.raises(gcodec.ChecksumError, match="F7"):
        gcodec.validate(b)


def test_F8_not_msgpack_and_duplicates():
    b = payload()
    h, hlen = split(b)
    with pytest.raises(gcodec.HeaderError, match="not valid msgpack"):
        gcodec.validate(rebuild(b, b"\xc1" + bytes(hlen - 1)))
    # a map that claims 3 entries but holds 2: truncated msgpack
    raw = hdr.pack_canonical(h)
    with pytest.raises(gcodec.HeaderError):
        gcodec.validate(rebuild(b, b"\x83" + raw[1:]))
    # a map with a duplicated key, written by hand
    items = list(h.items())
    body = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in [*items, items[0]])
    with pytest.raises(gcodec.HeaderError, match="duplicate"):
        gcodec.validate(rebuild(b, bytes([0x80 | (len(items) + 1)]) + body))


def test_F8_trailing_bytes_in_header():
    b = payload()
    h, _ = split(b)
    with pytest.raises(gcodec.HeaderError, match="after its msgpack"):
        gcodec.validate(rebuild(b, hdr.pack_canonical(h) + b"\x00"))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda h: h.pop("tensors"), "lacks 'tensors'"),
        (lambda h: h.__setitem__("tensors", []), "non-empty"),
        (lambda h: h["tensors"][0].__setitem__("dtype", "int8"), "dtype"),
        (lambda h: h["tensors"][0].__setitem__("shape", [-1]), "shape"),
        (lambda h: h["tensors"][0].__setitem__("shape", "10"), "shape"),
        (lambda h: h["tensors"][0]["sections"][0].__setitem__(1, "f3"), "element type"),
        (lambda h: h["tensors"][0]["sections"][0].pop(), r"\[name, dtype, offset, nbytes\]"),
        (lambda h: h.__setitem__("extra", 1), "unknown header key"),
        (lambda h: h["tensors"][0].__setitem__("extra", 1), "unknown key"),
        (lambda h: h.__setitem__("features", []), "empty 'features'"),
        (lambda h: h.__setitem__("meta", {"a": 1}), "meta"),
        (lambda h: h["tensors"][0].__setitem__("codec", 7), "codec"),
    ],
)
def test_F9_schema(mutate, match):
    b = payload()
    h, _ = split(b)
    mutate(h)
    with pytest.raises(gcodec.HeaderError, match=match):
        gcodec.validate(rebuild(b, h))


def test_F9_bundle_names_unique():
    b = bytearray(gcodec.encode_bundle({"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}))
    h, _ = split(b)
    h["tensors"][1]["name"] = "a"
    with pytest.raises(gcodec.HeaderError, match="unique"):
        gcodec.validate(rebuild(b, h))
    h["tensors"][1].pop("name")
    with pytest.raises(gcodec.HeaderError, match="name"):
        gcodec.validate(rebuild(b, h))


def test_F10_unknown_required_feature():
    b = payload()
    h, _ = split(b)
    h["features"] = ["sparse-magic"]
    with pytest.raises(gcodec.UnsupportedFeatureError, match="F10"):
        gcodec.validate(rebuild(b, h, minor=1))


def test_F11_non_canonical_header():
    b = payload()
    h, _ = split(b)
    # keys in reverse order
    items = sorted(h.items(), reverse=True)
    body = bytes([0x80 | len(items)]) + b"".join(msgpack.packb(k) + hdr.pack_canonical(v) for k, v in items)
    with pytest.raises(gcodec.HeaderError, match="F11"):
        gcodec.validate(rebuild(b, body))
    # an integer in a wider encoding than needed (data_length as uint32)
    items = sorted(h.items())
    parts = []
    for k, v in items:
        parts.append(msgpack.packb(k))
        parts.append(b"\xce" + struct.pack(">I", v) if k == "data_length" else hdr.pack_canonical(v))
    with pytest.raises(gcodec.HeaderError, match="F11"):
        gcodec.validate(rebuild(b, bytes([0x80 | len(items)]) + b"".join(parts)))


def test_newer_minor_accepts_unknown_optional_keys():
    x = np.arange(10, dtype=np.float32)
    b = payload(x)
    h, _ = split(b)
    h["future_optional"] = {"x": 1}
    h["tensors"][0]["hint"] = "ok"
    nb = rebuild(b, h, minor=7)
    np.testing.assert_array_equal(gcodec.decode(nb), gcodec.decode(b))
    with pytest.raises(gcodec.HeaderError):  # the same keys are an error at our own minor
        gcodec.validate(rebuild(b, h, minor=0))


def test_F12_overlap_gap_and_data_length():
    b = bytearray(gcodec.get_codec("uniform").encode(np.ones(100, np.float32)))
    h, _ = split(b)
    secs = h["tensors"][0]["sections"]
    h1 = msgpack.unpackb(msgpack.packb(h))
    h1["tensors"][0]["sections"][1][2] = secs[0][3] - 8  # starts inside the previous section
    with pytest.raises(gcodec.LayoutError, match="overlaps"):
        gcodec.validate(rebuild(b, h1))
    h2 = msgpack.unpackb(msgpack.packb(h))
    h2["tensors"][0]["sections"][1][2] = secs[1][2] + 8
    with pytest.raises(gcodec.LayoutError, match="gap"):
        gcodec.validate(rebuild(b, h2))
    h3 = msgpack.unpackb(msgpack.packb(h))
    h3["data_length"] += 8
    with pytest.raises(gcodec.LayoutError, match="data_length"):
        gcodec.validate(rebuild(b, h3))


def test_F13_truncated_and_trailing():
    b = payload()
    with pytest.raises(gcodec.LayoutError, match="F13"):
        gcodec.validate(b[:-1])
    with pytest.raises(gcodec.LayoutError, match="F13"):
        gcodec.validate(b + b"\x00")


def test_F14_payload_crc():
    b = payload()
    b[-6] ^= 1
    with pytest.raises(gcodec.ChecksumError, match="F14"):
        gcodec.decode(b)


def test_F14_names_the_bytes_the_crc_covers():
    """A user with a flipped data byte learns where to look: the covered range holds the byte."""
    b = payload()
    p = read_payload(b)
    flip = p.data_start + 1
    b[flip] ^= 1
    with pytest.raises(gcodec.ChecksumError) as e:
        gcodec.validate(b)
    lo, hi = (int(v) for v in re.search(r"in (\d+)\.\.(\d+)", str(e.value)).groups())  # type: ignore[union-attr]
    assert lo == 16 + p.header_length and hi == len(b) - 5 and lo <= flip <= hi
    assert f"@ byte {len(b) - 4}" in str(e.value)  # and where the stored CRC itself is


def test_F15_nonzero_padding():
    x = np.arange(5, dtype=np.float32)  # codes 5 bytes, then 3 padding bytes
    b = payload(x)
    p = read_payload(b)
    codes = p.header.tensors[0].section("codes")
    pad_at = p.data_start + codes.offset + codes.nbytes
    assert pad_at < len(b) - 4
    b[pad_at] = 1
    with pytest.raises(gcodec.LayoutError, match="F15"):
        gcodec.validate(fix_payload_crc(b))


def test_checksum_off_is_declared_and_still_validates_layout():
    x = np.arange(10, dtype=np.float32)
    b = bytearray(gcodec.get_codec("fp16").encode(x, checksum=False))
    assert b[6] & 1 == 0
    assert len(b) == len(gcodec.get_codec("fp16").encode(x)) - 4
    info = gcodec.validate(b)
    assert info.checksum is False
    np.testing.assert_array_equal(gcodec.decode(b), x)
    with pytest.raises(gcodec.LayoutError):
        gcodec.validate(b + b"\x00\x00\x00\x00")


def test_canonical_header_is_deterministic():
    x = np.random.default_rng(1).standard_normal(300).astype(np.float32)
    a = bytes(gcodec.get_codec("uniform", group_size=32).encode(x, meta={"b": "2", "a": "1"}))
    b = bytes(gcodec.get_codec("uniform", group_size=32).encode(x, meta={"a": "1", "b": "2"}))
    assert a == b
    h, hlen = split(a)
    assert hdr.pack_canonical(h) == a[16 : 16 + hlen]


def test_header_nesting_limit():
    b = payload()
    h, _ = split(b)
    deep: object = "x"
    for _ in range(20):
        deep = [deep]
    h["tensors"][0]["params"]["nested"] = deep
    with pytest.raises(gcodec.LimitExceededError, match="nesting"):
        gcodec.validate(rebuild(b, h))


def test_huge_declared_shape_refused_before_allocation():
    b = payload()
    h, _ = split(b)
    h["tensors"][0]["shape"] = [1 << 20, 1 << 20, 1 << 20]
    with pytest.raises(gcodec.LimitExceededError):
        gcodec.decode(rebuild(b, h))


def test_payload_accepts_any_buffer_type():
    b = payload()
    ref = gcodec.decode(b)
    for buf in (bytes(b), memoryview(b), np.frombuffer(bytes(b), np.uint8), bytearray(b)):
        np.testing.assert_array_equal(gcodec.decode(buf), ref)
    with pytest.raises(gcodec.FormatError):
        gcodec.decode("not bytes")  # type: ignore[arg-type]
    assert PREAMBLE_SIZE == 16


# ---------------------------------------------------------------------------------------------
# the error classes of specs/format.md's rules (each a subclass of gcodec.GcodecError)


def test_F9_name_nil_refused_in_a_newer_minor():
    """§7.2 item 7: a name, if present, is a string; a newer minor (lenient on unknown keys) too."""
    buf = payload()
    h, _ = split(buf)
    h["tensors"][0]["name"] = None
    with pytest.raises(gcodec.HeaderError, match=r"F9: tensors\[0\]\.name"):
        read_payload(bytes(rebuild(buf, h, minor=1)))


@pytest.mark.parametrize("depth", [1025, 5000])
def test_F8_nesting_beyond_msgpack_is_a_limit(depth):
    buf = payload()
    deep = b"\x91" * depth + b"\x01"
    # {"deep": [[[...]]], ...}: nesting far beyond any max_nesting
    hb = b"\x81\xa4deep" + deep
    with pytest.raises(gcodec.LimitExceededError, match=r"nesting.*max_nesting"):
        read_payload(bytes(rebuild(buf, hb)))


def test_max_nesting_is_capped_at_what_msgpack_can_parse():
    with pytest.raises(gcodec.ConfigError, match="max_nesting"):
        gcodec.Limits(max_nesting=2000)
    gcodec.Limits(max_nesting=1000)


def test_object_dtype_payload_is_a_format_error():
    b = np.array([object()] * 4, dtype=object)
    for fn in (gcodec.decode, gcodec.validate, gcodec.api.inspect_header):
        with pytest.raises(gcodec.FormatError, match="object"):
            fn(b)


def test_quoted_header_lists_are_truncated():
    buf = payload()
    h, _ = split(buf)
    # 5000 empty sections ahead of the real ones: a valid layout, refused by C2 which quotes the list
    h["tensors"][0]["sections"] = [[f"s{i}", "u1", 0, 0] for i in range(5000)] + h["tensors"][0]["sections"]
    with pytest.raises(gcodec.GcodecError) as info:
        gcodec.validate(bytes(rebuild(buf, h)))
    assert len(str(info.value)) < 1000 and "…" in str(info.value)
    h, _ = split(buf)
    h["tensors"][0]["dtype"] = "x" * 100_000
    with pytest.raises(gcodec.HeaderError) as info:
        gcodec.validate(bytes(rebuild(buf, h)))
    assert len(str(info.value)) < 1000 and "…" in str(info.value)


def _nil_at(path):
    """A header edit that writes nil at ``path`` (keys and list indices from the top-level map)."""

    def f(h):
        node = h
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = None

    return f


NIL_FORBIDDEN = [
    ("data_length",),
    ("tensors",),
    ("features",),
    ("meta",),
    ("meta", "rank"),
    ("tensors", 0, "codec"),
    ("tensors", 0, "version"),
    ("tensors", 0, "dtype"),
    ("tensors", 0, "shape"),
    ("tensors", 0, "shape", 0),
    ("tensors", 0, "params"),
    ("tensors", 0, "params", "bits"),
    ("tensors", 0, "sections"),
    ("tensors", 0, "sections", 0),
    ("tensors", 0, "sections", 0, 0),
    ("tensors", 0, "sections", 0, 1),
    ("tensors", 0, "sections", 0, 2),
    ("tensors", 0, "name"),
    ("tensors", 0, "params", "values", "params"),
    ("tensors", 0, "params", "values", "params", "group_size"),
    ("tensors", 0, "params", "values", "version"),
]


@pytest.mark.parametrize("minor", [0, 1])
@pytest.mark.parametrize("path", NIL_FORBIDDEN, ids=lambda p: ".".join(map(str, p)))
def test_nil_only_where_a_codec_lists_nil_or_map(path, minor):
    """specs/format.md §5 item 7: nil is refused (HeaderError) everywhere but the listed params."""
    from vector_cases import edit

    x = np.arange(1, 41, dtype=np.float32)
    if "values" in path:
        buf = gcodec.encode(x, gcodec.get_codec("topk", k=8, values={"id": "uniform", "bits": 8}))
    elif "bits" in path:
        buf = gcodec.encode(x, gcodec.get_codec("uniform"))
    else:
        buf = gcodec.encode_bundle({"w": x}, gcodec.get_codec("fp16"), meta={"rank": "0"})
    if path[0] == "features":
        buf = edit(bytes(buf), header=lambda h: h.__setitem__("features", ["x"]), minor=1)
    with pytest.raises(gcodec.HeaderError):
        gcodec.validate(edit(bytes(buf), header=_nil_at(path), minor=minor))


@pytest.mark.parametrize(
    "codec, role",
    [("topk", "values"), ("threshold", "values"), ("randomk", "values"), ("powersgd", "p"), ("powersgd", "q")],
)
def test_nil_is_the_raw_layout_where_listed(codec, role):
    x = np.arange(1, 401, dtype=np.float32).reshape(20, 20)
    params = {"rank": 2} if codec == "powersgd" else {"threshold": 300.0} if codec == "threshold" else {"k": 5}
    buf = gcodec.encode(x, gcodec.get_codec(codec, **params))
    info = gcodec.validate(buf)
    assert info.tensors[0].params[role] is None


def _depth(obj, d=0):
    """specs/format.md F8: every object, scalars included, has a depth; the top-level map is 0."""
    if isinstance(obj, dict):
        return max([d] + [_depth(x, d + 1) for kv in obj.items() for x in kv])
    if isinstance(obj, list):
        return max([d] + [_depth(x, d + 1) for x in obj])
    return d


def test_f8_depths_of_the_version_1_0_vectors():
    """The remark of F8: version 1.0 headers reach depth 5, and 6 with a nested codec."""
    import json
    from pathlib import Path

    from vector_cases import header_of

    root = Path(__file__).resolve().parents[1] / "specs" / "vectors"
    depths: dict[bool, set[int]] = {False: set(), True: set()}
    for e in json.loads((root / "manifest.json").read_text())["vectors"]:
        if e["kind"] != "valid" or e["version"] != "1.0":
            continue
        h = header_of((root / e["file"]).read_bytes())
        nested = any(isinstance(v, dict) for t in h["tensors"] for v in t["params"].values())
        depths[nested].add(_depth(h))
    assert max(depths[False]) == 5 and max(depths[True]) == 6


def test_f8_scalars_count_toward_the_depth():
    buf = bytes(gcodec.encode(np.ones(100, np.float32), gcodec.get_codec("topk", k=10, values={"id": "uniform"})))
    gcodec.validate(buf, limits=gcodec.Limits(max_nesting=6))
    with pytest.raises(gcodec.LimitExceededError, match="F8"):
        gcodec.validate(buf, limits=gcodec.Limits(max_nesting=5))
    plain = bytes(gcodec.encode(np.ones(4, np.float32), gcodec.get_codec("fp16")))
    gcodec.validate(plain, limits=gcodec.Limits(max_nesting=5))
    with pytest.raises(gcodec.LimitExceededError, match="F8"):
        gcodec.validate(plain, limits=gcodec.Limits(max_nesting=4))
