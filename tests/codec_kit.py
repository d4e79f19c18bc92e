"""The hardening kit shared by the corruption, property, limit tests and ``tools/fuzz.py``.

It holds three things:

* :data:`CASES`, representative parameters per codec id. Every codec that
  ``gcodec.list_codecs()`` reports must have an entry; ``test_every_registered_codec_has_cases``
  (tests/test_corruption.py) fails when one is missing, so a codec cannot land without being
  fuzzed, corrupted and truncated. Until an entry is added the other tests fall back to the codec's
  default params, and skip it (saying why) when those do not build.
* payload surgery: :func:`reseal` recomputes both CRCs of a mutated payload and :func:`rebuild`
  assembles one from a header dict, so mutations reach the structural and semantic rules instead
  of stopping at the checksum;
* the fuzz oracles, :func:`check_payload`: only ``GcodecError`` escapes; ``validate`` success
  implies ``decode`` success with the declared shape and dtype; a failing decode leaves an
  ``accumulate=True`` target untouched; peak memory stays within :func:`memory_bound`;
* the encoder's oracle, :func:`check_encoder`, over :data:`NESTED_CASES` (every host with every codec
  that nests) on :func:`wide_input`: an encoder raises a ``GcodecError`` or writes a payload that
  validates and decodes (specs/codecs/hybrid.md §3.1).

A case is ``(params, shape)``; small shapes keep the exhaustive byte-flip tests fast. Stochastic
and stateful codecs are encoded with ``key="t"`` and ``step=0`` so every run draws the same bytes.
"""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

import gcodec
from gcodec.arrays import DTYPES
from gcodec.checksum import crc32c
from gcodec.format.header import pack_canonical

__all__ = [
    "CASES",
    "NESTED_CASES",
    "NESTED_CODECS",
    "NOT_FROM_HEADER",
    "Case",
    "all_cases",
    "cases_for",
    "check_encoder",
    "check_payload",
    "codec_from_header",
    "declaring",
    "encode_case",
    "encoder_input",
    "encoder_seeds",
    "is_projection",
    "memory_bound",
    "missing_cases",
    "missing_nested",
    "parse_payload",
    "rebuild",
    "reseal",
    "sample_input",
    "seed_payloads",
    "wide_input",
]


@dataclasses.dataclass(frozen=True)
class Case:
    codec: str
    params: dict[str, Any]
    shape: tuple[int, ...] = (37,)

    @property
    def id(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.codec}({p}){'x'.join(map(str, self.shape))}"


def _c(codec: str, shape: tuple[int, ...] = (37,), **params: Any) -> Case:
    return Case(codec, params, shape)


#: codec id -> representative cases. Params a codec does not accept make its cases fail loudly
#: (ConfigError), which is what we want when a codec's schema changes.
CASES: dict[str, list[Case]] = {
    "fp16": [_c("fp16"), _c("fp16", (3, 5))],
    "bf16": [_c("bf16"), _c("bf16", (3, 5))],
    "uniform": [
        _c("uniform", bits=8, group_size=64),
        _c("uniform", bits=4, group_size=7),
        _c("uniform", (5, 7), bits=2, group_size=3),
        _c("uniform", bits=4, group_size=16, rounding="stochastic", seed=3, scale_dtype="float16"),
    ],
    "qsgd": [
        _c("qsgd", levels=15, bucket_size=16),
        _c("qsgd", (5, 7), levels=1, bucket_size=0),
        _c("qsgd", levels=127),
    ],
    "terngrad": [_c("terngrad"), _c("terngrad", (5, 7), group_size=8, clip=2.5, seed=5)],
    "sign": [_c("sign", group_size=16), _c("sign", (5, 7), group_size=0)],
    "fp8": [
        _c("fp8", group_size=8),
        _c("fp8", (5, 7), element="e5m2", group_size=5, scale_dtype="e8m0"),
        _c("fp8", group_size=16, rounding="stochastic", seed=2),
    ],
    "mx": [
        _c("mx"),
        _c("mx", (5, 7), element="e3m2"),
        _c("mx", (70,), element="e4m3", rounding="stochastic", seed=4),
        _c("mx", element="int8"),
    ],
    "nvfp4": [_c("nvfp4"), _c("nvfp4", (5, 7), rounding="stochastic", seed=6)],
    "topk": [
        _c("topk", ratio=0.1),
        _c("topk", (5, 7), k=5, index_coding="raw"),
        _c("topk", k=4, values={"id": "uniform", "bits": 8}),
    ],
    "chunktopk": [
        _c("chunktopk", chunk=8, k=3),
        _c("chunktopk", (5, 7), chunk=6, k=6, index_coding="packed"),
        _c("chunktopk", (70,), chunk=16, k=2, values={"id": "uniform", "bits": 2, "group_size": 2}),
    ],
    "dct": [
        _c("dct", chunk=8, k=2),
        _c("dct", (5, 7), chunk=16, k=16, index_coding="packed"),
        _c("dct", (70,), chunk=32, k=3, values={"id": "sign", "group_size": 3}),
        _c("dct", (9, 7), chunk=16, k=2, dims=2),
    ],
    "randomk": [_c("randomk", ratio=0.2, seed=9), _c("randomk", (5, 7), k=5, values="fp16")],
    "threshold": [
        _c("threshold", threshold=0.5),
        _c("threshold", (5, 7), threshold=1.0, index_coding="raw", values={"id": "bf16"}),
    ],
    "powersgd": [
        _c("powersgd", (6, 8), rank=2, min_compression_rate=0.0),
        _c("powersgd", (5, 4, 3), rank=1, min_compression_rate=0.0, factors={"id": "uniform", "bits": 8}),
        _c("powersgd", (37,)),  # a vector: sent through as fp32
        _c("powersgd", (3, 5), passthrough="fp16"),  # too small to compress: fp16
    ],
}


#: Every codec that nests (``values=`` of the sparse hosts, ``factors=`` of ``powersgd``), in the
#: configurations that change what it can represent: bit widths, rounding, scale types, buckets.
#: ``missing_nested`` reports a registered codec that nests but is not listed.
NESTED_CODECS: list[dict[str, Any]] = [
    {"id": "fp16"},
    {"id": "bf16"},
    {"id": "uniform", "bits": 8},
    {"id": "uniform", "bits": 4, "group_size": 7},
    {"id": "uniform", "bits": 2, "group_size": 3},
    {"id": "uniform", "bits": 4, "rounding": "stochastic", "seed": 3},
    {"id": "uniform", "bits": 8, "scale_dtype": "float16"},
    {"id": "uniform", "bits": 2, "rounding": "stochastic", "scale_dtype": "float16", "seed": 1},
    {"id": "qsgd"},
    {"id": "qsgd", "levels": 1, "bucket_size": 0},
    {"id": "qsgd", "levels": 127, "bucket_size": 4},
    {"id": "terngrad"},
    {"id": "terngrad", "group_size": 4, "clip": 2.5},
    {"id": "sign"},
    {"id": "sign", "group_size": 0},
    {"id": "fp8"},
    {"id": "fp8", "element": "e5m2", "scale_dtype": "e8m0", "group_size": 4},
    {"id": "fp8", "rounding": "stochastic", "seed": 2},
    {"id": "mx"},
    {"id": "mx", "element": "e4m3"},
    {"id": "mx", "element": "e5m2", "rounding": "stochastic", "seed": 1},
    {"id": "mx", "element": "e2m3"},
    {"id": "mx", "element": "int8"},
    {"id": "nvfp4"},
    {"id": "nvfp4", "rounding": "stochastic", "seed": 3},
]

#: The hosts, each with the parameters it is run with, and the shape of its input.
NESTED_HOSTS: list[tuple[str, str, dict[str, Any], tuple[int, ...]]] = [
    ("topk", "values", {"k": 40}, (300,)),
    ("topk", "values", {"k": 40, "index_coding": "raw"}, (5, 60)),
    ("chunktopk", "values", {"chunk": 64, "k": 8}, (300,)),
    ("chunktopk", "values", {"chunk": 50, "k": 7, "index_coding": "packed"}, (5, 60)),
    ("dct", "values", {"chunk": 32, "k": 5}, (300,)),
    ("threshold", "values", {"threshold": 1.0}, (300,)),
    ("randomk", "values", {"ratio": 0.2, "seed": 9}, (300,)),
    ("powersgd", "factors", {"rank": 2, "min_compression_rate": 0.0}, (12, 10)),
    ("powersgd", "factors", {"rank": 1, "min_compression_rate": 0.0, "warm_start": False}, (3, 4, 5)),
]

NESTED_CASES: list[Case] = [
    Case(host, {**params, role: dict(cfg)}, shape)
    for host, role, params, shape in NESTED_HOSTS
    for cfg in NESTED_CODECS
]


def missing_nested() -> list[str]:
    """Registered codecs that can be nested but have no entry in :data:`NESTED_CODECS`."""
    listed = {c["id"] for c in NESTED_CODECS}
    out = []
    for cid in gcodec.list_codecs():
        if cid in listed or getattr(gcodec.codec_class(cid), "NESTED_ROLES", ()):
            continue
        try:
            gcodec.get_codec("topk", values={"id": cid})
        except gcodec.ConfigError:
            continue  # it does not nest (no bound on what it decodes)
        out.append(cid)
    return out


def is_projection(case: Case) -> bool:
    """Whether decoding is a projection for this case: re-encoding decoded float32/float64 values with
    the same params gives the same bytes again. True for the casts and deterministic ``uniform`` with
    float32 scales. (Stochastic, norm-scaled and sparse codecs are not projections; for every codec
    the property suite checks that re-encoding the *input* with the recorded params is exact.)"""
    if case.codec in ("fp16", "bf16"):
        return True
    p = case.params
    return (
        case.codec == "uniform"
        and p.get("rounding", "nearest") == "nearest"
        and p.get("scale_dtype", "float32") == "float32"
    )


#: Codecs whose payloads cannot be made again from their header alone, and why. The re-encoding
#: oracle skips them (they are still decoded, validated, mutated and corrupted like the others).
NOT_FROM_HEADER: dict[str, str] = {
    "powersgd": "the header does not record the seed of the initial Q, the power iterations or the warm-start state",
}


def missing_cases() -> list[str]:
    """Registered codec ids that have no entry in :data:`CASES`."""
    return [cid for cid in gcodec.list_codecs() if cid not in CASES]


def cases_for(cid: str) -> list[Case]:
    """The cases of ``cid``; its default params when it has no entry (the coverage test fails then)."""
    return CASES.get(cid, [Case(cid, {})])


def usable_cases() -> list[Case]:
    """Every case of every registered codec that builds (codecs without an entry: defaults, if they build)."""
    out = []
    for cid in gcodec.list_codecs():
        for case in cases_for(cid):
            if cid not in CASES:
                try:
                    encode_case(case)
                except gcodec.GcodecError:
                    continue
            out.append(case)
    return out


def all_cases() -> list[Any]:
    """``pytest.param`` objects for every registered codec's cases (skipped when they cannot build)."""
    import pytest

    out = []
    for cid in gcodec.list_codecs():
        for case in cases_for(cid):
            marks = []
            if cid not in CASES:
                try:
                    encode_case(case)
                except gcodec.GcodecError as e:
                    reason = f"no params for codec {cid!r} in tests/codec_kit.py CASES, and its defaults fail: {e}"
                    marks.append(pytest.mark.skip(reason=reason))
            out.append(pytest.param(case, id=case.id, marks=marks))
    return out


def sample_input(shape: tuple[int, ...], dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    """A small, deterministic, sign-mixed tensor with one outlier."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if x.size:
        x.reshape(-1)[0] = 3.5
    return x.astype(dtype)


FLT_MAX = float(np.finfo(np.float32).max)
_BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))
_BF16_TIE = float(np.array(0x7F7F8000, np.uint32).view(np.float32))  # rounds up to infinity in bfloat16
_F32_OVERFLOW = 2.0**128 - 2.0**103  # binary64 values from here on round to infinity in binary32


def _below(v: float) -> float:
    return float(np.nextafter(np.float32(v), np.float32(0)))


def _rounds_up_from(t32: float) -> float:
    """The smallest binary64 value that rounds to the binary32 ``t32`` or above (ties to even)."""
    mid = (t32 + _below(t32)) / 2  # exact in binary64
    even = int(np.array(t32, np.float32).view(np.uint32)) % 2 == 0
    return mid if even else float(np.nextafter(mid, np.inf))


#: Magnitudes at the edges of the formats that a nested codec rounds to: binary16's largest value and
#: its overflow at 65520, bfloat16's largest value and its overflow, binary32's largest value.
RANGE_EDGES: tuple[float, ...] = (
    65504.0, _below(65520.0), 65520.0, 65536.0, 1e6,
    _BF16_MAX, _below(_BF16_TIE), _BF16_TIE, FLT_MAX, 2.0**63, 1.0,
)  # fmt: skip
#: The same edges for binary64 input, which the codecs round to binary32 first: the last values
#: below each overflow, the first ones at it, and values beyond binary32.
RANGE_EDGES_F64: tuple[float, ...] = (
    _rounds_up_from(65520.0), float(np.nextafter(_rounds_up_from(65520.0), 0)),
    _rounds_up_from(_BF16_TIE), float(np.nextafter(_rounds_up_from(_BF16_TIE), 0)),
    float(np.nextafter(_F32_OVERFLOW, 0)), _F32_OVERFLOW, 1e39, 1e300,
)  # fmt: skip

#: The largest finite value of each wire dtype.
_LARGEST = {"float32": FLT_MAX, "float64": float(np.finfo(np.float64).max), "float16": 65504.0, "bfloat16": _BF16_MAX}


def wide_input(shape: tuple[int, ...], dtype: str = "float32", seed: int = 0, pattern: str = "wide") -> np.ndarray:
    """Finite values of both signs, fixed by ``seed``, for the encoder's oracle:

    * ``"wide"``: magnitudes log-uniform from 1e-30 to 3e38 (to 1e300 for float64), a fifth of them
      replaced by the :data:`RANGE_EDGES`;
    * ``"edges"``: only range edges (and their binary64 forms for float64), times +-1;
    * ``"scaled"``: a normal sample times one power of ten from 1e0 to 1e38, so that every element
      of a tensor has a similar size (the whole tensor crosses an edge, not one outlier).

    Values beyond the dtype's range are clipped to its largest finite value.
    """
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    edges = np.array(RANGE_EDGES + (RANGE_EDGES_F64 if dtype == "float64" else ()))
    if pattern == "wide":
        x = 10.0 ** rng.uniform(-30, 300 if dtype == "float64" else np.log10(3e38), n)
        pick = rng.random(n) < 0.2
        x[pick] = rng.choice(edges, int(pick.sum()))
    elif pattern == "edges":
        x = rng.choice(edges, n)
    elif pattern == "scaled":
        x = rng.standard_normal(n) * 10.0 ** rng.integers(0, 39)
    else:
        raise ValueError(pattern)
    x = x * rng.choice([-1.0, 1.0], n)
    big = _LARGEST[dtype]
    with np.errstate(over="ignore"):
        return np.clip(x, -big, big).astype(DTYPES[dtype]).reshape(shape)


def check_encoder(case: Case, x: np.ndarray) -> str:
    """The encoder's oracle: encoding ``x`` raises a ``GcodecError`` (``"refused"``), or writes a payload
    that passes every oracle of :func:`check_payload` as ``"valid"`` (it validates and decodes with
    its shape and dtype). Raises :class:`OracleFailure` otherwise: an encoder must never write a
    payload that its own decoder refuses."""
    codec = gcodec.get_codec(case.codec, **case.params)
    try:
        b = bytes(codec.encode(x, key="t", step=0))
    except gcodec.GcodecError:
        return "refused"
    except Exception as e:
        raise OracleFailure(f"{case.id}: encode raised {type(e).__name__}: {e}") from e
    _, err = _call(gcodec.validate, b)
    if err is not None:
        raise OracleFailure(f"{case.id}: the encoder wrote a payload that validate refuses: {err!r}")
    bound = codec.max_payload_bytes(tuple(x.shape), x.dtype)
    if len(b) > bound:  # what a peer's receiver accepts: an honest payload must fit it
        raise OracleFailure(f"{case.id}: the encoder wrote {len(b)} bytes, over max_payload_bytes {bound}")
    outcome = check_payload(b)
    if outcome != "valid":
        raise OracleFailure(f"{case.id}: the encoder wrote a payload that is {outcome}, not valid")
    return outcome


def encoder_input(data: bytes) -> tuple[Case, np.ndarray]:
    """The input of the encoder's fuzz target (``tools/fuzz.py --target encode``) from raw bytes: byte 0
    picks a case of :data:`NESTED_CASES`, byte 1 the dtype, and the other bytes are the tensor's
    elements bit for bit (NaN, infinities and subnormals included), repeated to fill the case's shape."""
    case = NESTED_CASES[data[0] % len(NESTED_CASES)] if data else NESTED_CASES[0]
    names = list(DTYPES)
    dt = DTYPES[names[data[1] % len(names)]] if len(data) > 1 else DTYPES["float32"]
    nbytes = int(np.prod(case.shape)) * dt.itemsize
    body = bytes(data[2:]) or b"\0"
    raw = (body * (nbytes // len(body) + 1))[:nbytes]
    return case, np.frombuffer(raw, dt).reshape(case.shape).copy()


def encoder_seeds() -> list[bytes]:
    """Inputs of the encoder's fuzz target: a wide-range tensor for every case and dtype."""
    names = list(DTYPES)
    return [
        bytes([ci, di]) + wide_input(case.shape, dtype, ci, "wide").tobytes()
        for ci, case in enumerate(NESTED_CASES)
        for di, dtype in enumerate(names)
    ]


def encode_case(case: Case, *, checksum: bool = True, dtype: Any = np.float32, seed: int = 0) -> bytes:
    codec = gcodec.get_codec(case.codec, **case.params)
    return bytes(codec.encode(sample_input(case.shape, dtype, seed), key="t", step=0, checksum=checksum))


def seed_payloads() -> list[bytes]:
    """Valid payloads of every usable case, with and without the payload CRC, plus two bundles."""
    out = []
    for case in usable_cases():
        out.append(encode_case(case))
        out.append(encode_case(case, checksum=False, dtype=np.float64, seed=1))
    x = sample_input((37,))
    cids = [c.codec for c in usable_cases()]
    bundle = {f"t{i}": x[: 5 + i] for i in range(len(cids))}
    codecs = {f"t{i}": gcodec.get_codec(c.codec, **c.params) for i, c in enumerate(usable_cases())}
    out.append(bytes(gcodec.encode_bundle(bundle, codecs, step=0)))
    out.append(bytes(gcodec.encode_bundle({"a": np.float32(1.5), "b": x}, "fp16", checksum=False)))
    return out


# ---------------------------------------------------------------------------------------------
# payload surgery

PRE = 16


def reseal(b: bytes | bytearray) -> bytes:
    """Recompute the header CRC (and the payload CRC when its flag is set) of a possibly mutated payload.

    The result has valid checksums wherever the declared header length fits, so a reader must catch
    the mutation with its structural and semantic rules.
    """
    b = bytearray(b)
    if len(b) < PRE:
        return bytes(b)
    hlen = int.from_bytes(b[8:12], "little")
    if PRE + hlen > len(b):
        return bytes(b)
    b[12:16] = crc32c(bytes(b[PRE : PRE + hlen]), crc32c(bytes(b[:12]))).to_bytes(4, "little")
    if b[6] & 1 and len(b) >= PRE + hlen + 4:
        b[len(b) - 4 :] = crc32c(bytes(b[PRE + hlen : len(b) - 4])).to_bytes(4, "little")
    return bytes(b)


def rebuild(
    header: Any,
    data: bytes,
    *,
    checksum: bool = True,
    major: int = 1,
    minor: int = 0,
    flags: int | None = None,
    canonical: bool = True,
) -> bytes:
    """Assemble a payload from a header object and the data area (padding and CRCs done here)."""
    hbytes = pack_canonical(header) if canonical else msgpack.packb(header, use_bin_type=True)
    if flags is None:
        flags = 1 if checksum else 0
    pre12 = struct.pack("<4sBBHI", b"GCDC", major, minor, flags, len(hbytes))
    body = b"\0" * ((-(PRE + len(hbytes))) % 8) + data
    out = pre12 + crc32c(hbytes, crc32c(pre12)).to_bytes(4, "little") + hbytes + body
    if flags & 1:
        out += crc32c(body).to_bytes(4, "little")
    return out


def declaring(
    codec: str, shape: list[int], dtype: str = "float32", params: dict[str, Any] | None = None, **kw: Any
) -> bytes:
    """A valid payload of ``codec`` whose header declares ``shape`` and ``dtype``, every section zero.

    The wire params are those ``codec`` (configured with ``kw``) writes for a small tensor, updated
    with ``params`` (``k`` of a sparse codec, a nested codec's record); the sections are the ones the
    codec's rules C2 and C3 require for that header. Zero sections are valid for every codec (zero
    scales, codes, gaps and values), so such a payload can declare 2**27 elements in a few MiB (a
    sparse or low-rank one) and be decoded: what the large tests and the memory measurements use.
    """
    cls = gcodec.codec_class(codec)
    small = (8, 8) if codec == "powersgd" else (64,)
    header, _ = parse_payload(bytes(gcodec.get_codec(codec, **kw).encode(sample_input(small), key="t", step=0)))
    t = header["tensors"][0]
    t["shape"], t["dtype"] = list(shape), dtype
    t["params"].update(params or {})
    entry = gcodec.format.TensorEntry(codec, t["version"], dtype, tuple(shape), t["params"], ())
    secs, pos = [], 0
    for name, dt, nb in cls._entry_sections(t["params"], entry):
        pos = (pos + 7) // 8 * 8
        secs.append([name, dt, pos, nb])
        pos += nb
    t["sections"] = secs
    header["data_length"] = (pos + 7) // 8 * 8
    return rebuild(header, bytes(header["data_length"]))


def parse_payload(b: bytes) -> tuple[dict[str, Any], bytes]:
    """(header dict, data area) of a well-formed payload."""
    hlen = int.from_bytes(b[8:12], "little")
    header = msgpack.unpackb(b[PRE : PRE + hlen], raw=False)
    start = (PRE + hlen + 7) // 8 * 8
    end = len(b) - 4 if b[6] & 1 else len(b)
    return header, b[start:end]


# ---------------------------------------------------------------------------------------------
# oracles


class OracleFailure(AssertionError):
    """An oracle was broken; the message says which and how."""


def memory_bound(b: bytes) -> int:
    """The peak traced allocation allowed while one call checks or decodes ``b``: the one bound of
    docs/limits.md ("Memory while decoding"), ``gcodec.resources.memory_bound``, under the limits in
    force."""
    return gcodec.resources.memory_bound(b)


def _call(fn: Any, *args: Any, **kw: Any) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args, **kw), None
    except gcodec.GcodecError as e:
        return None, e
    except Exception as e:
        raise OracleFailure(f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}") from e


def check_payload(b: bytes, *, memory: bool = False) -> str:
    """Run every oracle on ``b``; return ``"valid"``, ``"decodes"`` or ``"rejected"``.

    Raises :class:`OracleFailure` when an oracle is broken. With ``memory=True`` the peak traced
    allocation of each call (``inspect_header``, ``validate``, ``decode``, and ``decode`` into a
    zeroed ``out=`` made beforehand) is measured on its own and held to :func:`memory_bound`; a call
    over it is repeated once, so that one-time costs (a lazy import, a JIT compilation for a new
    signature) are not blamed on the payload.
    """
    outcome = _check(b)
    if memory:
        bound = memory_bound(b)
        for label, fn in _calls(b):
            for _attempt in (1, 2):
                peak = _peak(fn)
                if peak <= bound:
                    break
            else:
                raise OracleFailure(
                    f"{label}: peak allocation {peak} bytes exceeds the bound {bound} for a {len(b)}-byte payload"
                )
    return outcome


def _calls(b: bytes) -> list[tuple[str, Any]]:
    """The calls whose memory the oracle measures; ``out=`` arrays are made before measuring."""
    calls: list[tuple[str, Any]] = [
        ("inspect_header", lambda: gcodec.api.inspect_header(b)),
        ("validate", lambda: gcodec.validate(b)),
        ("decode", lambda: gcodec.decode(b)),
    ]
    info, err = _call(gcodec.api.inspect_header, b)
    if err is None and info is not None:
        arrays = {t.name: np.zeros(t.shape, t.dtype) for t in info.tensors}
        out = arrays if info.is_bundle else arrays[None]
        calls.append(("decode(out=)", lambda: gcodec.decode(b, out=out)))
    return calls


def _peak(fn: Any) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        _call(fn)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def _check(b: bytes) -> str:
    hdr, hdr_err = _call(gcodec.api.inspect_header, b)
    info, _ = _call(gcodec.validate, b)
    out, dec_err = _call(gcodec.decode, b)
    if info is not None and hdr is None:
        raise OracleFailure(f"validate accepted a payload whose container inspect_header rejects: {hdr_err!r}")
    if info is not None:
        if dec_err is not None:
            raise OracleFailure(f"validate accepted the payload but decode raised {dec_err!r}")
        if info.is_bundle:
            if not isinstance(out, dict) or list(out) != [t.name for t in info.tensors]:
                raise OracleFailure("decode of a bundle did not return its tensors by name, in order")
            arrays = list(out.values())
        else:
            arrays = [out]
        for t, a in zip(info.tensors, arrays):
            if not isinstance(a, np.ndarray) or a.shape != t.shape or a.dtype != t.dtype:
                got = (getattr(a, "shape", None), getattr(a, "dtype", None))
                raise OracleFailure(f"decode gave {got}; validate declared {(t.shape, t.dtype)}")
        # decode into zeros with accumulate=True must give the same values
        if not info.is_bundle and info.dtype in (np.float32, np.float64):
            acc = np.zeros(info.shape, info.dtype)
            _, err = _call(gcodec.decode, b, out=acc, accumulate=True)
            if err is not None:
                raise OracleFailure(f"decode(accumulate=True) raised {err!r} where decode succeeded")
            with np.errstate(all="ignore"):
                differs = not np.array_equal(acc + 0.0, out + 0.0, equal_nan=True)
            if differs:
                raise OracleFailure("decode(out=zeros, accumulate=True) differs from decode()")
        return "valid"
    if dec_err is not None and hdr is not None and not hdr.is_bundle and hdr.dtype in (np.float32, np.float64):
        # gcodec.decode: with accumulate=True every check runs before ``out`` is touched, so a payload
        # that does not decode never half-updates a sum (without accumulate, ``out`` may be partly
        # written when a kernel-checked value rule fails: that is documented)
        sentinel = np.full(hdr.shape, 7.0, hdr.dtype)
        _, err = _call(gcodec.decode, b, out=sentinel, accumulate=True)
        if err is None:
            raise OracleFailure(f"decode(accumulate=True) succeeded where decode raised {dec_err!r}")
        if not (sentinel == 7.0).all():
            raise OracleFailure(f"a failing decode(accumulate=True) modified out= ({dec_err!r})")
    return "decodes" if dec_err is None else "rejected"


def codec_from_header(t: Any) -> tuple[gcodec.Codec, int | None]:
    """The codec (and the ``step``) that re-makes the payload of one tensor, from its header record.

    Header params that are also constructor params are passed as they are; a nested codec record
    ``{"codec": c, "params": p, "version": v}`` becomes the config ``{"id": c, **p}``; the recorded
    ``stream`` is the ``step``; a recorded ``k`` replaces ``ratio``. Derived fields (``index_bytes``,
    ``mode``, ...) are dropped: the encoder computes them again.
    """
    cls = gcodec.codec_class(t.codec)
    params = dict(t.params)
    step = params.pop("stream", None)
    kw: dict[str, Any] = {}
    for k, v in params.items():
        if k not in cls.PARAMS:
            continue
        if isinstance(v, dict) and "codec" in v and "params" in v:
            v = {"id": v["codec"], **v["params"]}
        kw[k] = v
    if "k" in kw and "ratio" in cls.PARAMS:
        kw["ratio"] = None
    return gcodec.get_codec(t.codec, **kw), step


def reencode_matches(b: bytes, x: np.ndarray, *, key: str = "t", step: int = 0) -> bool:
    """Re-encode ``x`` with the codec, params and stream recorded in ``b``'s header; True when the bytes are equal."""
    info = gcodec.validate(b)
    codec, recorded = codec_from_header(info.tensors[0])
    out = codec.encode(
        x, key=key, step=step if recorded is None else recorded, checksum=info.checksum, meta=info.meta or None
    )
    return bytes(out) == b


def mutate_header(header: Mapping[str, Any], path: list[Any], value: Any) -> Any:
    """A deep copy of ``header`` with the item at ``path`` replaced by ``value`` (or deleted when value is ...)."""
    import copy

    h = copy.deepcopy(header)
    if not path:
        return value
    node: Any = h
    for k in path[:-1]:
        node = node[k]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return h


def header_paths(obj: Any, prefix: list[Any] | None = None) -> list[list[Any]]:
    """Every path into a header object (maps and lists), leaves and inner nodes alike."""
    prefix = prefix or []
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += header_paths(v, [*prefix, k])
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += header_paths(v, [*prefix, i])
    return out


def serial_kernels() -> Any:
    """Generator for a module-scoped fixture: run Numba's parallel kernels on one thread meanwhile.

    These tests make tens of thousands of calls on tiny payloads; on a loaded 2-core machine every
    parallel launch can wait milliseconds for a worker thread. One thread gives the same bits.
    """
    old = gcodec.get_num_threads()
    gcodec.set_num_threads(1)
    try:
        yield
    finally:
        gcodec.set_num_threads(old)
