"""The reader on device payloads (docs/gpu.md, "Decoding a device payload"), under Numba's CUDA
simulator: a payload in device memory is checked where it lies.

Each payload below, valid or broken by hand (the payload CRC recomputed where the break is not the
CRC itself, so that the rule under test is the one that fires), is uploaded whole and given to
``gcodec.validate`` and ``gcodec.decode(..., out=device array)`` in the simulator child
(``tests/gpu_sim_worker.py``). The outcome must be the host reader's, to the error class and
message (byte offsets and group numbers included), and the decoded bits must be the host decode's.
For codecs whose checks run on the device (``Codec.device_checks``), only the preamble, the header
and small words may cross: at most :func:`small_bound` bytes, and no copy of a section. A codec
without device checks (top-k's index rules) gets one host copy of its sections, and says so.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.checksum import crc32c
from gcodec.codecs.registry import codec_class
from gcodec.format.container import PREAMBLE_SIZE, align_up
from tests.procs import run_early, run_once, simulator_job

pytestmark = pytest.mark.gpu

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None


def _layout(buf: bytes) -> tuple[int, int, list[tuple[str, int, int]]]:
    """(header length, data start, [(section name, absolute offset, nbytes)]) of a single-tensor payload."""
    info = gcodec.inspect_header(buf, verify_checksum=False)
    hlen = info.header_nbytes
    start = align_up(PREAMBLE_SIZE + hlen)
    return hlen, start, [(s[0], start + s[2], s[3]) for s in info.tensors[0].sections]


def _reseal(b: bytearray) -> bytes:
    """Recompute the payload CRC32C (rule F14) over what follows the header."""
    (hlen,) = struct.unpack_from("<I", b, 8)
    b[-4:] = struct.pack("<I", crc32c(bytes(b[PREAMBLE_SIZE + hlen : -4])))
    return bytes(b)


def _section(buf: bytes, name: str) -> tuple[int, int]:
    _, _, secs = _layout(buf)
    return next((o, n) for s, o, n in secs if s == name)


def _put(buf: bytes, name: str, index: int, value: np.generic) -> bytes:
    """``buf`` with element ``index`` of section ``name`` set to ``value`` (its own dtype), resealed."""
    o, _ = _section(buf, name)
    b = bytearray(buf)
    raw = np.asarray(value).tobytes()
    b[o + index * len(raw) : o + (index + 1) * len(raw)] = raw
    return _reseal(b)


def _last_byte(buf: bytes, name: str, value: int) -> bytes:
    o, n = _section(buf, name)
    b = bytearray(buf)
    b[o + n - 1] = value
    return _reseal(b)


def _pad(buf: bytes) -> bytes:
    """A non-zero byte in the first padding gap (rule F15), resealed."""
    hlen, start, secs = _layout(buf)
    gaps = [(PREAMBLE_SIZE + hlen, start)] + [(o + n, align_up(o + n)) for _, o, n in secs]
    lo = next(lo for lo, hi in gaps if hi > lo)
    b = bytearray(buf)
    b[lo] = 0x5A
    return _reseal(b)


def _flip(buf: bytes) -> bytes:
    """A flipped data byte without a new CRC (rule F14)."""
    _, _, secs = _layout(buf)
    b = bytearray(buf)
    b[secs[-1][1]] ^= 0x10
    return bytes(b)


def _x(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.5).astype(np.float32)


def _enc(cfg: dict[str, Any], n: int, seed: int) -> bytes:
    return bytes(gcodec.encode(_x(n, seed), cfg))


U8 = {"id": "uniform", "bits": 8, "group_size": 32}
U4 = {"id": "uniform", "bits": 4, "group_size": 16}
U8F16 = {"id": "uniform", "bits": 8, "group_size": 32, "scale_dtype": "float16"}
SIGN = {"id": "sign", "group_size": 32}
MX4 = {"id": "mx", "element": "e2m1"}
MX8 = {"id": "mx", "element": "e4m3"}
NV = {"id": "nvfp4"}
FP8 = {"id": "fp8", "group_size": 32}
TOPK = {"id": "topk", "ratio": 0.1}


def _bases() -> dict[str, bytes]:
    """The intact payloads the cases start from."""
    return {
        "u8": _enc(U8, 3000, 1),
        "u4": _enc(U4, 3001, 2),
        "u8f16": _enc(U8F16, 3000, 3),
        "sign": _enc(SIGN, 8001, 4),
        "mx4": _enc(MX4, 4001, 5),
        "mx8": _enc(MX8, 3000, 6),
        "nv": _enc(NV, 4001, 7),
        "fp8": _enc(FP8, 3000, 8),
        "fp16": _enc({"id": "fp16"}, 2000, 9),
        "topk": _enc(TOPK, 3000, 10),
        "nv0": _enc(NV, 0, 11),
    }


#: (id, codec config, element count, the payload made from :func:`_bases`). The tests are collected
#: from the ids; the payloads (encoding compiles kernels) are made when a test first needs them, not
#: at collection, which every pytest-xdist worker repeats for every module.
CASES: list[tuple[str, dict[str, Any], int, Callable[[dict[str, bytes]], bytes]]] = [
    ("fp16", {"id": "fp16"}, 2000, lambda b: b["fp16"]),
    ("fp16-crc", {"id": "fp16"}, 2000, lambda b: _flip(b["fp16"])),
    ("u8", U8, 3000, lambda b: b["u8"]),
    ("u8-crc", U8, 3000, lambda b: _flip(b["u8"])),
    ("u8-padding", U8, 3000, lambda b: _pad(b["u8"])),
    ("u8-nan-scale", U8, 3000, lambda b: _put(b["u8"], "scales", 3, np.float32(np.nan))),
    ("u8-negative-zero-scale", U8, 3000, lambda b: _put(b["u8"], "scales", 5, np.float32(-0.0))),
    ("u8-overflowing-scale", U8, 3000, lambda b: _put(b["u8"], "scales", 2, np.float32(3e37))),
    ("u8-code-128", U8, 3000, lambda b: _put(b["u8"], "codes", 150, np.int8(-128))),
    ("u4", U4, 3001, lambda b: b["u4"]),
    ("u4-unused-bits", U4, 3001, lambda b: _last_byte(b["u4"], "codes", 0xF0)),
    ("u8-f16-scales", U8F16, 3000, lambda b: b["u8f16"]),
    ("u8-f16-inf-scale", U8F16, 3000, lambda b: _put(b["u8f16"], "scales", 1, np.uint16(0x7C00))),
    ("u8-f16-negative-scale", U8F16, 3000, lambda b: _put(b["u8f16"], "scales", 2, np.uint16(0x8001))),
    ("sign", SIGN, 8001, lambda b: b["sign"]),
    ("sign-inf-scale", SIGN, 8001, lambda b: _put(b["sign"], "scales", 1, np.float32(np.inf))),
    ("sign-unused-bits", SIGN, 8001, lambda b: _last_byte(b["sign"], "bits", 0xFF)),
    ("mxfp4", MX4, 4001, lambda b: b["mx4"]),
    ("mxfp4-nan-scale", MX4, 4001, lambda b: _put(b["mx4"], "scales", 2, np.uint8(0xFF))),
    ("mxfp4-unused-bits", MX4, 4001, lambda b: _last_byte(b["mx4"], "elements", 0xF1)),
    ("mxfp8", MX8, 3000, lambda b: b["mx8"]),
    ("mxfp8-nan-element", MX8, 3000, lambda b: _put(b["mx8"], "elements", 40, np.uint8(0x7F))),
    ("nvfp4", NV, 4001, lambda b: b["nv"]),
    ("nvfp4-signed-block-scale", NV, 4001, lambda b: _put(b["nv"], "scales", 3, np.uint8(0x81))),
    ("nvfp4-inf-tensor-scale", NV, 4001, lambda b: _put(b["nv"], "tensor_scale", 0, np.float32(np.inf))),
    ("nvfp4-overflowing-block", NV, 4001, lambda b: _put(b["nv"], "tensor_scale", 0, np.float32(3e35))),
    ("nvfp4-empty", NV, 0, lambda b: b["nv0"]),
    ("nvfp4-empty-positive-tensor-scale", NV, 0, lambda b: _put(b["nv0"], "tensor_scale", 0, np.float32(1.0))),  # NV4
    ("fp8", FP8, 3000, lambda b: b["fp8"]),
    ("fp8-overflowing-scale", FP8, 3000, lambda b: _put(b["fp8"], "scales", 1, np.float32(1e37))),
    ("topk", TOPK, 3000, lambda b: b["topk"]),
    ("topk-crc", TOPK, 3000, lambda b: _flip(b["topk"])),
]
IDS = tuple(c[0] for c in CASES)
VALID = {"fp16", "u8", "u4", "u8-f16-scales", "sign", "mxfp4", "mxfp8", "nvfp4", "nvfp4-empty", "fp8", "topk"}


@functools.cache
def payloads() -> dict[str, tuple[dict[str, Any], int, bytes]]:
    """id -> (codec config, element count, payload bytes), in the order of :data:`CASES`."""
    b = _bases()
    return {cid: (cfg, n, make(b)) for cid, cfg, n, make in CASES}


def small_bound(buf: bytes) -> int:
    """What one read of a device payload may move when no section crosses: the preamble and the
    header, the stored CRC, and small words (a first-bad index or a count per value rule, 8 bytes
    each, plus the 8-byte word each starts from, and a list of at most 6 padding ranges, 16 bytes
    each). The worker uploads the one-time tables (CRC, element values) before it measures."""
    (hlen,) = struct.unpack_from("<I", buf, 8)
    return PREAMBLE_SIZE + hlen + 4 + 16 * 6 + 24 * 12


def _worker_job() -> tuple[list[str], dict[str, Any]]:
    req = {"reader": [{"id": i, "n": n, "payload": b.hex()} for i, (_, n, b) in payloads().items()], "watchdog_s": 300}
    return simulator_job("gpu_sim_worker.py", req)


def start_in_background() -> None:
    """tests/conftest.py starts the worker when a large session begins (see run_early)."""
    if HAVE_NUMBA_CUDA:
        cmd, kw = _worker_job()
        run_early("device_reader_worker", cmd, 900, **kw)


@pytest.fixture(scope="module")
def sim() -> dict[str, Any]:
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed (pip install 'gcodec[test]'): the simulator tests cannot run")
    cmd, kw = _worker_job()
    proc = run_once("device_reader_worker", cmd, 900, **kw)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout)
    assert out["simulator"] is True
    return {r["id"]: r for r in out["reader"]}


def _host(buf: bytes, n: int) -> tuple[str, str, bytes]:
    try:
        gcodec.validate(buf)
        v = "ok"
    except gcodec.GcodecError as e:
        v = f"{type(e).__name__}: {e}"
    out = np.full(n, 7.0, np.float32)
    try:
        gcodec.decode(buf, out=out)
        d = "ok"
    except gcodec.GcodecError as e:
        d = f"{type(e).__name__}: {e}"
    return v, d, out.tobytes() if d == "ok" else b""


def test_the_cases_break_what_they_say() -> None:
    """Every broken payload is refused by the host reader and every intact one passes, so the
    comparison below compares refusals, not two passes."""
    for cid, (_, n, buf) in payloads().items():
        v, _, _ = _host(buf, n)
        assert (v == "ok") == (cid in VALID), (cid, v)


@pytest.mark.parametrize("cid", IDS)
def test_device_reader_agrees_with_the_host_reader(sim: dict[str, Any], cid: str) -> None:
    _, n, buf = payloads()[cid]
    got = sim[cid]
    v, d, out = _host(buf, n)
    assert got["validate"] == v
    assert got["decode"] == d
    if d == "ok":
        assert bytes.fromhex(got["decoded"]) == out  # bit for bit


@pytest.mark.parametrize("cid", IDS)
def test_device_checks_move_only_header_and_small_words(sim: dict[str, Any], cid: str) -> None:
    cfg, _, buf = payloads()[cid]
    got = sim[cid]
    if codec_class(cfg["id"]).device_checks:
        assert got["section_copies"] == 0
        assert got["validate_bytes"] <= small_bound(buf), got["validate_bytes"]
        assert got["decode_bytes"] <= small_bound(buf), got["decode_bytes"]
    elif got["validate"] == "ok":  # the sections come to the host once, for the host's index checks
        assert got["section_copies"] >= 1
        assert got["validate_bytes"] >= len(buf) - small_bound(buf)
