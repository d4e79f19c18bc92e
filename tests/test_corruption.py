"""Corruption and truncation: every damaged payload is refused with a GcodecError, never a crash.

Small payloads of every registered codec (tests/codec_kit.py, ``CASES``), a bundle, and checksum-off
payloads are damaged exhaustively: every byte flipped with several masks, every truncation point,
bytes appended. Each damaged payload must give a ``GcodecError`` subclass from both ``decode`` and
``validate``, and a checksummed payload must never decode. A second group of tests names the error
class a reader must raise for damage in each region of the payload (specs/format.md F1-F15).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import gcodec
from gcodec import (
    ChecksumError,
    FormatError,
    GcodecError,
    HeaderError,
    LayoutError,
    LimitExceededError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
)
from tests.codec_kit import CASES, Case, all_cases, encode_case, missing_cases, sample_input, serial_kernels


@pytest.fixture(autouse=True, scope="module")
def _one_kernel_thread():
    yield from serial_kernels()


MASKS = (0x01, 0x80, 0xFF)
PRE = 16


def _regions(b: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges of a payload's regions: preamble fields, header, padding, sections, CRC."""
    hlen = struct.unpack_from("<I", b, 8)[0]
    info = gcodec.validate(b)
    data_start = (PRE + hlen + 7) // 8 * 8
    r = {
        "magic": (0, 4),
        "major": (4, 5),
        "minor": (5, 6),
        "flags": (6, 8),
        "header_length": (8, 12),
        "header_crc": (12, 16),
        "header": (PRE, PRE + hlen),
        "header_padding": (PRE + hlen, data_start),
    }
    secs = [s for t in info.tensors for s in t.sections]
    r["sections"] = (data_start + secs[0][2], data_start + secs[-1][2] + secs[-1][3]) if secs else (data_start,) * 2
    if info.checksum:
        r["payload_crc"] = (len(b) - 4, len(b))
    return r


def _bundle(checksum: bool = True) -> bytes:
    x = sample_input((37,))
    return bytes(
        gcodec.encode_bundle(
            {"w": x, "b": x[:5], "s": np.float32(2.5)},
            {"w": "uniform", "b": "fp16", "s": "bf16"},
            checksum=checksum,
        )
    )


def _raises(fn, b: bytes, where: str) -> GcodecError:
    try:
        fn(b)
    except GcodecError as e:
        return e
    except Exception as e:  # the bug this file hunts for
        raise AssertionError(f"{fn.__name__} raised {type(e).__name__} (not a GcodecError) for {where}: {e}") from e
    raise AssertionError(f"{fn.__name__} accepted a corrupted checksummed payload ({where})")


def _no_foreign(fn, b: bytes, where: str) -> None:
    try:
        fn(b)
    except GcodecError:
        pass
    except Exception as e:
        raise AssertionError(f"{fn.__name__} raised {type(e).__name__} (not a GcodecError) for {where}: {e}") from e


# ---------------------------------------------------------------------------------------------
# coverage of the codec table


def test_every_registered_codec_has_cases():
    missing = missing_cases()
    assert not missing, (
        f"codec(s) {missing} are registered but have no representative params in tests/codec_kit.py CASES; "
        "add an entry so they are corrupted, fuzzed and limit-checked like the others"
    )


def test_cases_build_and_round_trip():
    for cid, cases in CASES.items():
        if cid not in gcodec.list_codecs():
            continue
        for case in cases:
            b = encode_case(case)
            info = gcodec.validate(b)
            assert info.codec == cid and info.shape == case.shape
            assert gcodec.decode(b).shape == case.shape


# ---------------------------------------------------------------------------------------------
# exhaustive damage


def _payloads(case: Case) -> list[tuple[str, bytes]]:
    return [("crc", encode_case(case)), ("nocrc", encode_case(case, checksum=False))]


@pytest.mark.parametrize("case", all_cases())
def test_every_byte_flip_is_rejected(case: Case):
    b = encode_case(case)
    for i in range(len(b)):
        for m in MASKS:
            bad = bytearray(b)
            bad[i] ^= m
            bad = bytes(bad)
            where = f"{case.id}: byte {i} ^ 0x{m:02x}"
            _raises(gcodec.validate, bad, where)
            _raises(gcodec.decode, bad, where)


@pytest.mark.parametrize("case", all_cases())
def test_byte_flips_without_payload_crc_give_only_gcodec_errors(case: Case):
    """No payload CRC: section bytes may decode to other values, but nothing else may escape, and the
    preamble and header are still covered by the header CRC."""
    b = encode_case(case, checksum=False)
    regions = _regions(b)
    covered = regions["header"][1]  # preamble + header: always checked
    for i in range(len(b)):
        for m in MASKS:
            bad = bytearray(b)
            bad[i] ^= m
            bad = bytes(bad)
            where = f"{case.id} (no payload CRC): byte {i} ^ 0x{m:02x}"
            if i < covered or regions["header_padding"][0] <= i < regions["header_padding"][1]:
                _raises(gcodec.validate, bad, where)
                _raises(gcodec.decode, bad, where)
            else:
                _no_foreign(gcodec.validate, bad, where)
                _no_foreign(gcodec.decode, bad, where)


@pytest.mark.parametrize("case", all_cases())
def test_every_truncation_is_rejected(case: Case):
    for kind, b in _payloads(case):
        for n in range(len(b)):
            where = f"{case.id} ({kind}) truncated to {n} of {len(b)} bytes"
            _raises(gcodec.validate, b[:n], where)
            _raises(gcodec.decode, b[:n], where)


@pytest.mark.parametrize("case", all_cases())
def test_appended_bytes_are_rejected(case: Case):
    for kind, b in _payloads(case):
        for extra in (b"\0", b"\xff", b"\0" * 7, b"\0" * 8, b"\x01" * 64, b):
            where = f"{case.id} ({kind}) + {len(extra)} byte(s)"
            e = _raises(gcodec.validate, b + extra, where)
            assert isinstance(e, LayoutError), where
            _raises(gcodec.decode, b + extra, where)


@pytest.mark.parametrize("checksum", [True, False], ids=["crc", "nocrc"])
def test_bundle_damage_is_rejected(checksum: bool):
    b = _bundle(checksum)
    sections = _regions(b)["sections"]
    for i in range(len(b)):
        for m in MASKS:
            bad = bytearray(b)
            bad[i] ^= m
            bad = bytes(bad)
            where = f"bundle: byte {i} ^ 0x{m:02x}"
            if checksum or not sections[0] <= i < sections[1]:
                _raises(gcodec.validate, bad, where)
                _raises(gcodec.decode, bad, where)
            else:
                _no_foreign(gcodec.validate, bad, where)
                _no_foreign(gcodec.decode, bad, where)
    for n in range(len(b)):
        _raises(gcodec.decode, b[:n], f"bundle truncated to {n}")
    _raises(gcodec.decode, b + b"\0" * 8, "bundle + 8 bytes")


@pytest.mark.parametrize("case", all_cases())
def test_crc32c_catches_every_burst_up_to_32_bits_in_the_sections(case: Case):
    """CRC32C detects every error burst of at most 32 bits: damage 2..4 adjacent bytes at each offset."""
    b = encode_case(case)
    lo, hi = _regions(b)["sections"]
    rng = np.random.default_rng(0)
    for i in range(lo, hi):
        for width in (2, 3, 4):
            if i + width > len(b):
                continue
            bad = bytearray(b)
            for k, v in enumerate(rng.integers(1, 256, width)):
                bad[i + k] ^= int(v)
            e = _raises(gcodec.validate, bytes(bad), f"{case.id}: {width}-byte burst at {i}")
            assert isinstance(e, ChecksumError), f"{case.id}: burst at {i}: {e!r}"


# ---------------------------------------------------------------------------------------------
# which error class, by region (one test per rule of specs/format.md)


def _flip(b: bytes, i: int, m: int) -> bytes:
    bad = bytearray(b)
    bad[i] ^= m
    return bytes(bad)


REGION_RULES = [
    # (region, mask or None for "every mask", the class the reader must raise (exact type), rule)
    ("magic", None, FormatError, "F2"),
    ("major", None, UnsupportedVersionError, "F3"),
    ("minor", None, ChecksumError, "F7: the header CRC covers the preamble"),
    ("header_crc", None, ChecksumError, "F7"),
    ("header", None, ChecksumError, "F7"),
    ("header_padding", None, ChecksumError, "F14: padding is under the payload CRC"),
    ("sections", None, ChecksumError, "F14"),
    ("payload_crc", None, ChecksumError, "F14"),
]


def _first_cases() -> list[Case]:
    out = []
    for cid in gcodec.list_codecs():
        case = CASES[cid][0] if cid in CASES else Case(cid, {})
        try:
            encode_case(case)
        except GcodecError:
            continue
        out.append(case)
    return out


@pytest.mark.parametrize("region,mask,cls,rule", REGION_RULES, ids=[r[0] for r in REGION_RULES])
def test_error_class_by_region(region, mask, cls, rule):
    payloads = [(c.id, encode_case(c)) for c in _first_cases()] + [("bundle", _bundle())]
    for name, b in payloads:
        lo, hi = _regions(b)[region]
        for i in range(lo, hi):
            for m in (mask,) if mask else MASKS:
                for fn in (gcodec.validate, gcodec.decode):
                    e = _raises(fn, _flip(b, i, m), f"{name} {region} byte {i} ^ 0x{m:02x}")
                    assert type(e) is cls, f"{name}: {region} byte {i} ^ 0x{m:02x} ({rule}): got {e!r}"


def test_error_class_flags():
    b = encode_case(_first_cases()[0])
    # bit 0 is the payload-CRC flag: flipping it is caught by the header CRC (F7)
    assert type(_raises(gcodec.decode, _flip(b, 6, 0x01), "flags bit 0")) is ChecksumError
    # any other bit is unknown to a 1.0 reader (F4)
    for i, m in ((6, 0x02), (6, 0x80), (7, 0x01), (7, 0x80), (6, 0xFE)):
        e = _raises(gcodec.decode, _flip(b, i, m), f"flags byte {i} ^ 0x{m:02x}")
        assert type(e) is UnsupportedFeatureError, e


def test_error_class_header_length():
    b = encode_case(_first_cases()[0])
    hlen = struct.unpack_from("<I", b, 8)[0]

    def with_hlen(v: int) -> bytes:
        return b[:8] + struct.pack("<I", v) + b[12:]

    assert type(_raises(gcodec.decode, with_hlen(0), "hlen 0")) is HeaderError  # F5
    assert type(_raises(gcodec.decode, with_hlen(1 << 31), "hlen 2**31")) is LimitExceededError  # F5
    assert type(_raises(gcodec.decode, with_hlen(len(b)), "hlen past end")) is LayoutError  # F6
    assert type(_raises(gcodec.decode, with_hlen(hlen + 1), "hlen + 1")) is ChecksumError  # F7
    assert type(_raises(gcodec.decode, with_hlen(hlen - 1), "hlen - 1")) is ChecksumError  # F7


def test_error_class_truncation_and_extension():
    b = encode_case(_first_cases()[0])
    hlen = struct.unpack_from("<I", b, 8)[0]
    for n in range(PRE):  # F1
        assert type(_raises(gcodec.decode, b[:n], f"cut {n}")) is FormatError
    for n in range(PRE, PRE + hlen):  # F6
        assert type(_raises(gcodec.decode, b[:n], f"cut {n}")) is LayoutError
    for n in range(PRE + hlen, len(b)):  # F13
        assert type(_raises(gcodec.decode, b[:n], f"cut {n}")) is LayoutError
    assert type(_raises(gcodec.decode, b + b"\0", "append")) is LayoutError  # F13


def test_error_class_padding_without_payload_crc():
    """Without the payload CRC, non-zero padding is still caught, by F15."""
    case = CASES["uniform"][1]  # 37 elements: the last section ends off the 8-byte grid
    b = encode_case(case, checksum=False)
    r = _regions(b)
    padding = [i for i in range(r["sections"][0], len(b)) if b[i] == 0]
    info = gcodec.validate(b)
    data_start = r["header_padding"][1]
    owned = set()
    for t in info.tensors:
        for _, _, off, nb in t.sections:
            owned.update(range(data_start + off, data_start + off + nb))
    pads = [i for i in padding if i not in owned] + list(range(*r["header_padding"]))
    assert pads, "the chosen case must have padding"
    for i in pads:
        e = _raises(gcodec.validate, _flip(b, i, 0x01), f"padding byte {i}")
        assert type(e) is LayoutError and "F15" in str(e), e


# ---------------------------------------------------------------------------------------------
# the checksum switch


@pytest.mark.parametrize("case", all_cases())
def test_checksum_off_is_declared_in_the_header(case: Case):
    on, off = encode_case(case), encode_case(case, checksum=False)
    assert gcodec.validate(on).checksum is True and on[6] & 1
    assert gcodec.validate(off).checksum is False and not off[6] & 1
    assert len(on) == len(off) + 4
    np.testing.assert_array_equal(gcodec.decode(on), gcodec.decode(off))
