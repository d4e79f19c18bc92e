"""The CUDA backend against the CPU backend, byte for byte, under Numba's CUDA simulator.

Every case encodes a small array from device memory and must give the CPU payload's exact bytes;
the CPU payload decoded into a device ``out=`` must equal the CPU decode, and accumulating the
device payload onto it must double it. The kernels run in one child process
(``tests/gpu_sim_worker.py``) with ``NUMBA_ENABLE_CUDASIM=1`` set for that process only: Numba reads
the variable when it is first imported, so this keeps the simulator out of every other test. Sizes
are a few hundred elements: the simulator runs each CUDA thread as a Python thread.

CuPy and torch CUDA round trips (:func:`test_cupy_round_trip`, :func:`test_torch_cuda_round_trip`)
run in this process on a real GPU, comparing bytes with the CPU's; without one they are skipped
with the reason, never counted as passed (``bench/gpu_check.py`` runs them on a GPU machine too).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from typing import Any

import numpy as np
import pytest

import gcodec
from gcodec.checksum import crc32c
from gcodec.kernels.cpu import philox as cpu_philox

from .gpu_sim_worker import ef_inputs, make_array
from .procs import run_early, run_once, simulator_job, timeout_scale
from .test_nan_sums import NANS16, NANS32, NANS64, OTHERS16, OTHERS32, OTHERS64, QNAN16, _accumulate_cases, nan_pairs

pytestmark = pytest.mark.gpu

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None

# (id, codec config, n, data seed, step, kind)
CASES: list[tuple[str, dict[str, Any], int, int, int | None, str]] = [
    ("fp16", {"id": "fp16"}, 300, 0, None, "specials"),
    ("bf16", {"id": "bf16"}, 300, 1, None, "specials"),
    ("fp16-empty", {"id": "fp16"}, 0, 0, None, "normal"),
    ("u8-g64", {"id": "uniform", "bits": 8}, 257, 2, None, "normal"),
    ("u8-ties", {"id": "uniform", "bits": 8, "group_size": 8}, 96, 3, None, "ties"),
    ("u4-g16", {"id": "uniform", "bits": 4, "group_size": 16}, 203, 4, None, "normal"),
    ("u2-g1000", {"id": "uniform", "bits": 2, "group_size": 1000}, 101, 5, None, "normal"),
    ("u8-sto-s1", {"id": "uniform", "bits": 8, "rounding": "stochastic", "seed": 1}, 200, 6, 0, "normal"),
    ("u4-sto-s9", {"id": "uniform", "bits": 4, "rounding": "stochastic", "seed": 9}, 131, 7, 5, "normal"),
    (
        "u8-sto-f16",
        {"id": "uniform", "bits": 8, "rounding": "stochastic", "scale_dtype": "float16", "group_size": 50, "seed": 2},
        150,
        8,
        3,
        "normal",
    ),
    ("qsgd-15", {"id": "qsgd", "levels": 15, "seed": 3}, 210, 9, 1, "normal"),
    ("qsgd-5-b32", {"id": "qsgd", "levels": 5, "bucket_size": 32, "seed": 4}, 100, 10, 2, "normal"),
    ("terngrad", {"id": "terngrad", "seed": 5}, 160, 11, 4, "normal"),
    ("terngrad-clip", {"id": "terngrad", "clip": 2.5, "seed": 6}, 160, 12, 0, "normal"),
    ("sign", {"id": "sign"}, 200, 13, None, "normal"),
    ("sign-g48", {"id": "sign", "group_size": 48}, 150, 14, None, "normal"),
    ("u8-nan", {"id": "uniform", "bits": 8}, 64, 17, None, "nan"),
    # random-k: Floyd's sampling on the device (k near n: many collisions), k = 0, k = n, empty
    ("rk-r10-s1", {"id": "randomk", "ratio": 0.1, "seed": 1}, 100, 19, 0, "normal"),
    ("rk-k90-s7", {"id": "randomk", "k": 90, "seed": 7}, 100, 21, 3, "normal"),
    ("rk-k60-s99", {"id": "randomk", "k": 60, "seed": 2**64 - 1}, 67, 22, 2**40, "normal"),
    ("rk-k0", {"id": "randomk", "k": 0, "seed": 3}, 50, 23, 1, "normal"),
    ("rk-kn", {"id": "randomk", "k": 40, "seed": 3}, 40, 24, 1, "normal"),
    ("rk-empty", {"id": "randomk", "ratio": 0.5, "seed": 3}, 0, 25, 1, "normal"),
    ("rk-nan", {"id": "randomk", "ratio": 0.1, "seed": 1}, 64, 26, 0, "nan"),
    # top-k: radix select, ties to the lowest index, delta and raw indices, k = 0, k = n, empty
    ("topk-r10", {"id": "topk", "ratio": 0.1}, 300, 18, None, "normal"),
    ("topk-ties", {"id": "topk", "k": 37}, 300, 27, None, "ties"),
    ("topk-zeros", {"id": "topk", "k": 5}, 70, 28, None, "zeros"),
    ("topk-sparse-gaps", {"id": "topk", "k": 3}, 400, 29, None, "normal"),
    ("topk-raw", {"id": "topk", "k": 100, "index_coding": "raw"}, 200, 30, None, "ties"),
    ("topk-k0", {"id": "topk", "k": 0}, 50, 31, None, "normal"),
    ("topk-kn", {"id": "topk", "ratio": 1.0}, 130, 32, None, "normal"),
    ("topk-empty", {"id": "topk", "ratio": 0.1}, 0, 33, None, "normal"),
    ("topk-nan", {"id": "topk", "ratio": 0.1}, 64, 34, None, "nan"),
    ("th-delta", {"id": "threshold", "threshold": 1.5}, 200, 35, None, "normal"),
    ("th-raw-ties", {"id": "threshold", "threshold": 0.5, "index_coding": "raw"}, 150, 36, None, "ties"),
    ("th-zero", {"id": "threshold", "threshold": 0.0}, 90, 37, None, "zeros"),
    # hybrids: nested value codecs run on the device values
    ("topk-fp16", {"id": "topk", "ratio": 0.1, "values": {"id": "fp16"}}, 200, 38, None, "normal"),
    (
        "topk-u4",
        {"id": "topk", "k": 30, "values": {"id": "uniform", "bits": 4, "group_size": 16}},
        200,
        39,
        None,
        "ties",
    ),
    ("rk-fp16", {"id": "randomk", "k": 30, "seed": 4, "values": {"id": "fp16"}}, 200, 40, 2, "normal"),
    (
        "rk-u8-sto",
        {
            "id": "randomk",
            "k": 30,
            "seed": 4,
            "values": {"id": "uniform", "bits": 8, "rounding": "stochastic", "seed": 5},
        },
        200,
        41,
        2,
        "normal",
    ),
    ("th-bf16", {"id": "threshold", "threshold": 1.0, "values": {"id": "bf16"}}, 200, 42, None, "normal"),
    # values beyond the nested fp16's range: refused on the device as on the CPU (hybrid.md §3.1)
    ("topk-fp16-huge", {"id": "topk", "ratio": 0.1, "values": {"id": "fp16"}}, 200, 38, None, "huge"),
    ("rk-fp16-huge", {"id": "randomk", "k": 30, "seed": 4, "values": {"id": "fp16"}}, 200, 40, 2, "huge"),
    ("th-fp16-huge", {"id": "threshold", "threshold": 1.0, "values": {"id": "fp16"}}, 200, 42, None, "huge"),
    ("psgd-fp16-huge", {"id": "powersgd", "rank": 2, "factors": {"id": "fp16"}}, 192, 48, 1, "huge"),
    # low-precision floats (fp8.md, mx.md, nvfp4.md): every element format, both roundings, packing
    ("fp8-e4m3-g16", {"id": "fp8", "group_size": 16}, 203, 60, None, "normal"),
    ("fp8-e5m2-ties", {"id": "fp8", "element": "e5m2", "group_size": 7}, 96, 61, None, "ties"),
    (
        "fp8-e8m0-sto",
        {"id": "fp8", "scale_dtype": "e8m0", "group_size": 20, "rounding": "stochastic", "seed": 3},
        150,
        62,
        2,
        "normal",
    ),
    ("mx-e2m1", {"id": "mx"}, 203, 63, None, "normal"),
    ("mx-e3m2", {"id": "mx", "element": "e3m2"}, 101, 64, None, "normal"),
    ("mx-e2m3-sto", {"id": "mx", "element": "e2m3", "rounding": "stochastic", "seed": 7}, 77, 65, 1, "normal"),
    ("mx-e4m3-ties", {"id": "mx", "element": "e4m3"}, 96, 66, None, "ties"),
    ("mx-e5m2", {"id": "mx", "element": "e5m2"}, 70, 67, None, "normal"),
    ("mx-int8", {"id": "mx", "element": "int8"}, 90, 68, None, "normal"),
    ("mx-empty", {"id": "mx"}, 0, 69, None, "normal"),
    ("nvfp4", {"id": "nvfp4"}, 203, 70, None, "normal"),
    ("nvfp4-sto", {"id": "nvfp4", "rounding": "stochastic", "seed": 8}, 99, 71, 4, "normal"),
    ("topk-mx", {"id": "topk", "k": 30, "values": {"id": "mx", "element": "e4m3"}}, 200, 72, None, "normal"),
    ("mx-nan", {"id": "mx"}, 64, 73, None, "nan"),
    ("nvfp4-nan", {"id": "nvfp4"}, 64, 74, None, "nan"),
    # powersgd pass-through (no matrix view / too small to compress): byte-identical too
    ("psgd-vector", {"id": "powersgd", "rank": 2}, 64, 43, None, "normal"),
    ("psgd-fp16-pass", {"id": "powersgd", "rank": 2, "passthrough": "fp16"}, 16, 44, None, "normal"),
    # chunked top-k: radix select per chunk, ties to the lowest index, a short last chunk, both codings
    ("ck-gap", {"id": "chunktopk", "chunk": 64, "k": 5}, 300, 80, None, "normal"),
    ("ck-ties", {"id": "chunktopk", "chunk": 50, "k": 9}, 300, 81, None, "ties"),
    ("ck-zeros", {"id": "chunktopk", "chunk": 32, "k": 3}, 70, 82, None, "zeros"),
    ("ck-packed", {"id": "chunktopk", "chunk": 100, "k": 7, "index_coding": "packed"}, 250, 83, None, "ties"),
    ("ck-keep-all", {"id": "chunktopk", "chunk": 8, "k": 8}, 43, 84, None, "normal"),
    ("ck-c1", {"id": "chunktopk", "chunk": 1, "k": 1, "index_coding": "packed"}, 20, 85, None, "normal"),
    ("ck-empty", {"id": "chunktopk", "chunk": 16, "k": 2}, 0, 86, None, "normal"),
    ("ck-nan", {"id": "chunktopk", "chunk": 16, "k": 2}, 64, 87, None, "nan"),
    ("dct-c8", {"id": "dct", "chunk": 8, "k": 2}, 101, 90, None, "normal"),
    ("dct-c64-packed", {"id": "dct", "chunk": 64, "k": 5, "index_coding": "packed"}, 200, 91, None, "ties"),
    ("dct-sign", {"id": "dct", "chunk": 16, "k": 3, "values": {"id": "sign", "group_size": 3}}, 90, 92, None, "normal"),
    ("dct-nan", {"id": "dct", "chunk": 8, "k": 2}, 40, 93, None, "nan"),
    ("dct-tiles-4", {"id": "dct", "chunk": 16, "k": 3, "dims": 2}, 130, 94, None, "normal"),
    ("dct-tiles-8", {"id": "dct", "chunk": 64, "k": 5, "dims": 2, "index_coding": "packed"}, 180, 95, None, "ties"),
    (
        "ck-u2",
        {"id": "chunktopk", "chunk": 64, "k": 8, "values": {"id": "uniform", "bits": 2, "group_size": 8}},
        200,
        88,
        None,
        "normal",
    ),
]
#: PowerSGD matrices: the encoder's products are free (specs/codecs/powersgd.md §5), so the device
#: payload need not equal the CPU's; its decode must be close, and decoding (§6) is bit-identical.
LOWRANK: list[tuple[str, dict[str, Any], int, int, int | None, str]] = [
    ("psgd-r1-it2", {"id": "powersgd", "rank": 1, "iterations": 2}, 320, 45, 1, "normal"),
    ("psgd-r2", {"id": "powersgd", "rank": 2}, 192, 46, 0, "normal"),
    ("psgd-r4-qr", {"id": "powersgd", "rank": 4, "seed": 3}, 320, 47, 2, "normal"),
    ("psgd-r2-fp16", {"id": "powersgd", "rank": 2, "factors": {"id": "fp16"}}, 192, 48, 1, "normal"),
    ("psgd-r3-u8", {"id": "powersgd", "rank": 3, "factors": {"id": "uniform", "bits": 8}}, 192, 49, 1, "normal"),
]
#: ErrorFeedback with device arrays: (id, codec, n, data seed, steps); payloads and residual as the CPU's.
EF_CASES: list[tuple[str, dict[str, Any], int, int, int]] = [
    ("ef-topk", {"id": "topk", "ratio": 0.1}, 120, 50, 3),
    ("ef-ck-decay", {"id": "chunktopk", "chunk": 40, "k": 4}, 120, 55, 3),
    ("ef-u8", {"id": "uniform", "bits": 8, "group_size": 32}, 100, 51, 2),
    ("ef-u8-decay", {"id": "uniform", "bits": 2, "group_size": 32}, 100, 56, 3),
    ("ef-rk-fp16", {"id": "randomk", "ratio": 0.2, "seed": 9, "values": {"id": "fp16"}}, 90, 52, 2),
    ("ef-psgd", {"id": "powersgd", "rank": 2}, 192, 53, 3),  # warm-start Q kept on the device
    ("ef-nvfp4", {"id": "nvfp4"}, 100, 54, 2),
    # sign runs the fused device kernel (kernels/cuda/sign.encode_feedback): groups that end inside a
    # byte, one group for the whole tensor (the CPU cannot fuse that one: bits equal all the same),
    # a decay, and a refused step whose residual must survive
    ("ef-sign", {"id": "sign", "group_size": 12}, 100, 57, 3),
    ("ef-sign-g0", {"id": "sign", "group_size": 0}, 100, 58, 2),
    ("ef-sign-decay", {"id": "sign"}, 300, 59, 3),
    ("ef-sign-nan", {"id": "sign", "group_size": 32}, 100, 60, 3),
    # the 16-bit casts run their fused device kernels (kernels/cuda/cast.encode_f16_feedback and
    # encode_bf16_feedback): plain, a decay, and a refused step whose residual must survive
    ("ef-fp16", {"id": "fp16"}, 100, 61, 3),
    ("ef-bf16", {"id": "bf16"}, 100, 62, 3),
    ("ef-fp16-decay", {"id": "fp16"}, 100, 63, 3),
    ("ef-fp16-nan", {"id": "fp16"}, 100, 64, 3),
]
#: The step of an ErrorFeedback case whose input holds a NaN.
EF_NAN_AT = {"ef-sign-nan": 1, "ef-fp16-nan": 1}
EF_SHAPES = {"ef-psgd": (16, 12)}
#: Decay of the ErrorFeedback cases (default 1.0): x + fl(decay * e) on the device, as on the host.
EF_DECAY = {"ef-ck-decay": 0.95, "ef-u8-decay": 0.5, "ef-sign-decay": 0.9, "ef-fp16-decay": 0.9}
#: Cases run a second time with gcodec's work on a Numba stream (launch.use_stream).
STREAMED = ["u4-sto-s9", "topk-ties", "rk-k90-s7", "psgd-r2"]
#: Cases encoded as a matrix (default: the flat array).
SHAPES: dict[str, tuple[int, ...]] = {
    "psgd-fp16-pass": (4, 4),
    "psgd-r1-it2": (8, 40),
    "psgd-r2": (16, 12),
    "psgd-r4-qr": (20, 16),
    "psgd-r2-fp16": (16, 12),
    "psgd-r3-u8": (12, 16),
    "psgd-fp16-huge": (16, 12),
    "dct-tiles-4": (10, 13),
    "dct-tiles-8": (12, 15),
}
#: NaN input, and values beyond a nested fp16's range: the device encoder refuses them as the CPU one does
OVERFLOWS = ["topk-fp16-huge", "rk-fp16-huge", "th-fp16-huge", "psgd-fp16-huge"]
REFUSED = {"u8-nan", "rk-nan", "topk-nan", "ck-nan", "dct-nan", "mx-nan", "nvfp4-nan", *OVERFLOWS}
PHILOX = [(0, 0, 37, 0), (1, 0, 8, 0), (2**64 - 1, 2**63 + 5, 50, 2**34), (12345, 678, 101, 4)]
#: (n, k, seed, stream) for the device's parallel Floyd sampling: k close to n forces chains of collisions.
RANDOMK_INDICES = [
    (n, k, seed, 3) for n in (1, 2, 33, 64, 65) for k in sorted({1, n // 2, n - 1, n}) for seed in (0, 12345) if k >= 1
]
CRC_BLOBS = [b"", b"123456789", bytes(range(256)) * 3, bytes(1000)]


def _sum2_pairs() -> list[tuple[str, np.ndarray, np.ndarray]]:
    """For binary16 and bfloat16: every sign and exponent with the mantissa's low four bits 0 and
    15, and the smallest subnormals (signed zeros, infinities, NaNs, the largest finite values and
    sums that overflow included), against a shuffled copy. Not all 65536 patterns: each simulated
    thread is Python, and the conversion bodies are the CPU kernels' own (gcodec/kernels/scalar.py),
    which tests/test_cast_kernels.py checks on the CPU."""
    a = np.unique(np.r_[np.arange(0, 1 << 16, 16), np.arange(15, 1 << 16, 16), 1, 0x8001]).astype(np.uint16)
    b = np.random.default_rng(7).permutation(a)
    return [("f16", a, b), ("bf16", a, b)]


SUM2_PAIRS = _sum2_pairs()


def _nan_rule_inputs() -> dict[str, Any]:
    """NaN pairs of tests/test_nan_sums.py (both orders, both signs, quiet and signalling, payloads,
    +inf + -inf) for the device's sums, and the CPU payloads of codecs whose accumulating decode
    meets a negative NaN in ``out``."""
    f32 = nan_pairs(NANS32, OTHERS32, np.float32)
    f64 = nan_pairs(NANS64, OTHERS64, np.float64)
    h16 = {k: nan_pairs(NANS16[k], OTHERS16[k], np.uint16) for k in ("f16", "bf16")}
    acc16 = {k: _accumulate_cases(k) for k in ("f16", "bf16")}
    x = make_array(96, 99, "normal")
    start = np.resize(np.array([n for n in NANS32 if n >> 31], np.uint32), x.size).view(np.float32)
    codecs = [(cfg, bytes(gcodec.encode(x, cfg)).hex(), start.tobytes().hex()) for cfg in NAN_ACC_CODECS]
    return {
        "f32": [a.tobytes().hex() for a in f32],
        "f64": [a.tobytes().hex() for a in f64],
        "h16": {k: [a.tobytes().hex() for a in v] for k, v in h16.items()},
        "acc16": {k: [a.tobytes().hex() for a in v] for k, v in acc16.items()},
        "codecs": codecs,
    }


#: Codecs whose decoded values are finite: an accumulating decode into negative NaNs (dense ones:
#: every element is a NaN sum) must leave positive NaNs on the device as on the CPU.
NAN_ACC_CODECS: list[dict[str, Any]] = [
    {"id": "uniform", "bits": 8, "group_size": 32},
    {"id": "uniform", "bits": 4, "group_size": 16},
    {"id": "sign", "group_size": 24},
    {"id": "qsgd", "levels": 15, "seed": 2},
    {"id": "mx", "element": "e2m1"},
    {"id": "dct", "chunk": 16, "k": 3},
]


def _cpu_payload(cfg: dict[str, Any], n: int, seed: int, step: int | None, kind: str, cid: str = "") -> bytes:
    codec = gcodec.get_codec(cfg)
    return bytes(gcodec.encode(make_array(n, seed, kind).reshape(SHAPES.get(cid, (n,))), codec, step=step))


def worker_request() -> dict[str, Any]:
    """What the worker is asked to run, with the CPU payloads it is compared against."""
    cases = []
    for cid, cfg, n, seed, step, kind in CASES + LOWRANK:
        try:
            cpu = _cpu_payload(cfg, n, seed, step, kind, cid).hex()
        except gcodec.GcodecError:
            cpu = ""
        cases.append(
            {
                "id": cid,
                "codec": cfg,
                "n": n,
                "shape": list(SHAPES.get(cid, (n,))),
                "data_seed": seed,
                "step": step,
                "kind": kind,
                "cpu_payload": cpu,
            }
        )
    ef = [
        {
            "id": c,
            "codec": cfg,
            "n": n,
            "data_seed": s,
            "steps": st,
            "shape": EF_SHAPES.get(c),
            "decay": EF_DECAY.get(c, 1.0),
            "nan_at": EF_NAN_AT.get(c),
        }
        for c, cfg, n, s, st in EF_CASES
    ]
    return {
        "cases": cases,
        "ef": ef,
        "streamed": STREAMED,
        "philox": PHILOX,
        "randomk_indices": RANDOMK_INDICES,
        "crc": [b.hex() for b in CRC_BLOBS],
        "sum2": [(kind, a.tobytes().hex(), b.tobytes().hex()) for kind, a, b in SUM2_PAIRS],
        "nan_rule": _nan_rule_inputs(),
    }


#: Seconds one case may take in the simulator before the worker dumps every thread's stack and
#: exits: a kernel whose threads disagree on how many barriers they meet (a race on shared memory)
#: deadlocks there, and the dump names the case and the line instead of the suite's timeout.
CASE_WATCHDOG_S = 300


def _worker_job() -> tuple[list[str], dict[str, Any]]:
    req = worker_request()
    req["watchdog_s"] = CASE_WATCHDOG_S * timeout_scale()
    return simulator_job("gpu_sim_worker.py", req)


def start_in_background() -> None:
    """tests/conftest.py starts the worker when a large session begins (see run_early)."""
    if HAVE_NUMBA_CUDA:
        cmd, kw = _worker_job()
        run_early("gpu_sim_worker", cmd, 900, **kw)


@pytest.fixture(scope="module")
def sim() -> dict[str, Any]:
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed (pip install 'gcodec[test]'): the simulator tests cannot run")
    # 1-4 minutes on 2 idle cores, many more on a loaded machine: the watchdog of tests/procs.py
    # stops it only when it stops making progress (a deadlock: no thread runs) or at 2 x 900 s
    # scaled by the load; its report has the worker's stacks and last lines (the worker prints each
    # case's name as it starts it), and the load. A deadlock is also caught per case by the
    # worker's own watchdog above.
    cmd, kw = _worker_job()
    proc = run_once("gpu_sim_worker", cmd, 900, **kw)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout)
    out["by_id"] = {c["id"]: c for c in out["cases"] + out["ef"]}
    return out


def test_simulator_is_what_ran(sim: dict[str, Any]) -> None:
    assert sim["simulator"] is True
    assert sim["cuda_imported_by_gcodec"] is False  # import gcodec alone never imports numba.cuda


ENCODED = [c for c in CASES if c[0] not in REFUSED]


@pytest.mark.parametrize("case", ENCODED, ids=[c[0] for c in ENCODED])
def test_device_payload_equals_cpu_bytes(sim: dict[str, Any], case: tuple) -> None:
    cid, cfg, n, seed, step, kind = case
    got = sim["by_id"][cid]
    assert "error" not in got, got.get("error")
    assert got["payload_type"] == "DevicePayload"
    assert bytes.fromhex(got["payload"]) == _cpu_payload(cfg, n, seed, step, kind, cid)


@pytest.mark.parametrize("case", ENCODED, ids=[c[0] for c in ENCODED])
def test_decode_into_device_out(sim: dict[str, Any], case: tuple) -> None:
    cid, cfg, n, seed, step, kind = case
    got = sim["by_id"][cid]
    assert "error" not in got, got.get("error")
    ref = gcodec.decode(_cpu_payload(cfg, n, seed, step, kind, cid)).astype(np.float32).reshape(-1)
    dec = np.frombuffer(bytes.fromhex(got["decoded"]), np.float32)
    acc = np.frombuffer(bytes.fromhex(got["accumulated"]), np.float32)
    # bit for bit: signed zeros (top-k's kept -0, the +0 of dropped elements) and NaN payloads count
    np.testing.assert_array_equal(dec.view(np.uint32), ref.view(np.uint32))
    np.testing.assert_array_equal(acc.view(np.uint32), (ref + ref).view(np.uint32))


@pytest.mark.parametrize(
    ("cid", "codec"),
    [
        ("u8-nan", "uniform"),
        ("rk-nan", "randomk"),
        ("topk-nan", "topk"),
        ("ck-nan", "chunktopk"),
        ("dct-nan", "dct"),
        ("mx-nan", "mx"),
        ("nvfp4-nan", "nvfp4"),
    ],
)
def test_device_encoder_refuses_nan_like_cpu(sim: dict[str, Any], cid: str, codec: str) -> None:
    assert sim["by_id"][cid]["error"].startswith(f"PayloadValueError: {codec}: input has NaN")


@pytest.mark.parametrize("cid", OVERFLOWS)
def test_device_encoder_refuses_nested_overflow_like_cpu(sim: dict[str, Any], cid: str) -> None:
    _, cfg, n, seed, step, kind = next(c for c in CASES if c[0] == cid)
    with pytest.raises(gcodec.PayloadValueError) as cpu:
        _cpu_payload(cfg, n, seed, step, kind, cid)
    assert "beyond the range of the nested 'fp16'" in str(cpu.value)
    assert sim["by_id"][cid]["error"] == f"PayloadValueError: {cpu.value}"


@pytest.mark.parametrize("case", LOWRANK, ids=[c[0] for c in LOWRANK])
def test_powersgd_on_device(sim: dict[str, Any], case: tuple) -> None:
    """Device factors decode close to the CPU's; the CPU payload decodes on the device bit for bit."""
    cid, cfg, n, seed, step, kind = case
    got = sim["by_id"][cid]
    assert "error" not in got, got.get("error")
    assert got["payload_type"] == "DevicePayload"
    cpu = _cpu_payload(cfg, n, seed, step, kind, cid)
    dev = bytes.fromhex(got["payload"])
    assert len(dev) == len(cpu)
    gcodec.validate(dev)
    ref = gcodec.decode(cpu).astype(np.float32).reshape(-1)
    mine = gcodec.decode(dev).astype(np.float32).reshape(-1)
    tol = 1e-5 if "factors" not in cfg else 2e-2  # nested factors: a last-bit difference can flip a code
    np.testing.assert_allclose(mine, ref, rtol=0, atol=tol * float(np.abs(ref).max()))
    dec = np.frombuffer(bytes.fromhex(got["decoded"]), np.float32)
    acc = np.frombuffer(bytes.fromhex(got["accumulated_cpu"]), np.float32)
    np.testing.assert_array_equal(dec.view(np.uint32), ref.view(np.uint32))
    np.testing.assert_array_equal(acc.view(np.uint32), (ref + ref).view(np.uint32))


@pytest.mark.parametrize("case", EF_CASES, ids=[c[0] for c in EF_CASES])
def test_error_feedback_on_device(sim: dict[str, Any], case: tuple) -> None:
    """Every step's device payload and the device residual equal the CPU run's, bit for bit."""
    cid, cfg, n, seed, steps = case
    got = sim["by_id"][cid]
    assert "error" not in got, got.get("error")
    ef = gcodec.ErrorFeedback(cfg, decay=EF_DECAY.get(cid, 1.0))
    shape = EF_SHAPES.get(cid, (n,))
    want = []
    for s, x in enumerate(ef_inputs(n, seed, steps, EF_NAN_AT.get(cid))):
        try:
            want.append(bytes(ef.encode(x.reshape(shape), "w", step=s)))
        except gcodec.PayloadValueError as e:
            want.append(f"refused: {type(e).__name__}".encode())
    # the device's fused kernel ran for every sign, fp16 and bf16 step (refused ones included), for
    # no other codec
    assert got["fused_calls"] == (steps if cfg["id"] in ("sign", "fp16", "bf16") else 0)
    assert got["residual_type"] != "ndarray"  # the residual stayed in device memory
    assert got["checkpoint_types"] == ["ndarray"]  # state_dict() holds host copies only
    e = ef.residual("w")
    assert e is not None
    mine = [h.encode() if h.startswith("refused") else bytes.fromhex(h) for h in got["payloads"]]
    assert (EF_NAN_AT.get(cid) is None) == all(not m.startswith(b"refused") for m in mine)
    if cfg["id"] != "powersgd":
        assert mine == want
        assert bytes.fromhex(got["residual"]) == e.tobytes()
        return
    # PowerSGD's encoder products are free (powersgd.md §5): every step decodes close to the CPU's
    for a, b in zip(mine, want, strict=True):
        ref = gcodec.decode(b).reshape(-1)
        np.testing.assert_allclose(gcodec.decode(a).reshape(-1), ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()))
    res = np.frombuffer(bytes.fromhex(got["residual"]), np.float32)
    np.testing.assert_allclose(res, e.reshape(-1), rtol=0, atol=1e-4 * float(np.abs(e).max()))


def test_streamed_cases_equal_unstreamed(sim: dict[str, Any]) -> None:
    got = {c["id"]: c for c in sim["streamed"]}
    assert sorted(got) == sorted(STREAMED)
    for cid in STREAMED:
        assert "error" not in got[cid], got[cid].get("error")
        for field in ("payload", "decoded"):
            assert got[cid][field] == sim["by_id"][cid][field], (cid, field)


def test_simulator_is_strict(sim: dict[str, Any]) -> None:
    """The worker's device arrays refuse what real ones lack (else host-only code passes here)."""
    assert sim["strict"].startswith("AttributeError: a real device array has no 'astype'"), sim["strict"]


def test_philox_words_equal_cpu(sim: dict[str, Any]) -> None:
    for (seed, stream, n, start), h in zip(PHILOX, sim["philox"]):
        want = cpu_philox.random_u32(seed, stream, n, start)
        assert np.frombuffer(bytes.fromhex(h), np.uint32).tolist() == want.tolist(), (seed, stream, n, start)


def test_randomk_indices_equal_cpu(sim: dict[str, Any]) -> None:
    from gcodec.codecs.randomk import randomk_indices

    assert len(sim["randomk_indices"]) == len(RANDOMK_INDICES)
    for (n, k, seed, stream), got in zip(RANDOMK_INDICES, sim["randomk_indices"], strict=True):
        assert got == randomk_indices(n, k, seed, stream).tolist(), (n, k, seed, stream)


def test_device_crc32c_equals_host(sim: dict[str, Any]) -> None:
    assert sim["crc"] == [crc32c(b) for b in CRC_BLOBS]
    assert sim["crc"][1] == 0xE3069283  # the CRC-32C check value of "123456789"


def test_device_pair_sums_equal_cpu(sim: dict[str, Any]) -> None:
    from gcodec.kernels.cpu import cast

    assert len(sim["sum2"]) == len(SUM2_PAIRS)
    for (kind, a, b), (got, widened, bad) in zip(SUM2_PAIRS, sim["sum2"], strict=True):
        want = np.empty_like(a)
        want_bad = getattr(cast, f"sum2_{kind}")(a, b, want)
        dev = np.frombuffer(bytes.fromhex(got), np.uint16)
        # every sum bit for bit, NaN sums included (the positive quiet NaN: format.md §10)
        nan = (want & 0x7FFF) > (0x7C00 if kind == "f16" else 0x7F80)
        assert nan.any() and (want[nan] == QNAN16[kind]).all(), kind
        assert dev.tolist() == want.tolist(), kind
        # the one-pass sum and decode: the float32 of the CPU's sums, and the same count
        wide = np.empty(a.size, np.float32)
        getattr(cast, f"decode_{kind}")(want, wide, False)
        dw = np.frombuffer(bytes.fromhex(widened), np.float32)
        assert dw.view(np.uint32).tolist() == wide.view(np.uint32).tolist()
        assert bad == want_bad, kind


def _positive_nans(h: str, dtype: Any) -> bool:
    v = np.frombuffer(bytes.fromhex(h), dtype)
    bits = v.view(np.uint64 if v.dtype.itemsize == 8 else np.uint32)
    return bool(np.isnan(v).all() and not (bits >> (63 if v.dtype.itemsize == 8 else 31)).any())


def test_device_nan_sums_are_positive(sim: dict[str, Any]) -> None:
    """specs/format.md §10's NaN rule on the device: error feedback's corrected input (the fused
    16-bit kernels: exactly 0x7E00 / 0x7FC0; ``feedback.add``, ``add_decayed``; the generic device
    path's values through ``encode_values``), ``memory.copy`` accumulating, for NaN pairs in both
    orders. The simulator adds as NumPy on this CPU does (the first operand's NaN), so without the
    rule half of these would be negative NaNs."""
    got = sim["nan_rule"]
    assert got is not None and "error" not in got, got and got.get("error")
    n = nan_pairs(NANS32, OTHERS32, np.float32)[0].size
    for tag in ("xe", "ex"):
        for key, dt in (("f32", np.float32), ("f64", np.float64)):
            for what in ("add", "add_decayed", "copy_acc"):
                assert _positive_nans(got[f"{what}_{key}_{tag}"], dt), (what, key, tag)
        for kind in ("f16", "bf16"):
            bits, bad = got[f"fb_{kind}_{tag}"]
            assert np.frombuffer(bytes.fromhex(bits), np.uint16).tolist() == [QNAN16[kind]] * n, (kind, tag)
            assert bad == n
        for codec, decay in (("fp16", 1.0), ("bf16", 1.0), ("fp16", 0.9)):
            bits, outcome = got[f"ef_{codec}_{decay}_{tag}"]
            assert outcome == "refused"  # and the values written before the refusal are the rule's
            assert (
                np.frombuffer(bytes.fromhex(bits), np.uint16).tolist()
                == [QNAN16[{"fp16": "f16", "bf16": "bf16"}[codec]]] * n
            )


def test_device_16_bit_nan_sums_equal_the_cpu(sim: dict[str, Any]) -> None:
    """The pair sums of NaN pairs (both orders) and the accumulating decodes with a NaN in ``out``
    or in the payload: the CPU kernels' bits exactly (16-bit: 0x7E00 / 0x7FC0, float32 0x7FC00000 for
    the widened sums; accumulated float32: positive NaNs)."""
    from gcodec.kernels.cpu import cast

    got = sim["nan_rule"]
    assert got is not None and "error" not in got, got and got.get("error")
    for kind in ("f16", "bf16"):
        a, b = nan_pairs(NANS16[kind], OTHERS16[kind], np.uint16)
        for tag, (p, q) in (("ab", (a, b)), ("ba", (b, a))):
            bits, wide, n1, n2 = got[f"sum2_{kind}_{tag}"]
            want = np.empty_like(p)
            assert cast.__dict__[f"sum2_{kind}"](p, q, want) == n1 == n2 == p.size
            assert np.frombuffer(bytes.fromhex(bits), np.uint16).tolist() == want.tolist() == [QNAN16[kind]] * p.size
            assert np.frombuffer(bytes.fromhex(wide), np.uint32).tolist() == [0x7FC00000] * p.size
        assert _positive_nans(got[f"dec_acc_{kind}"], np.float32), kind


@pytest.mark.parametrize(
    "i", range(len(NAN_ACC_CODECS)), ids=[str(c["id"]) + str(i) for i, c in enumerate(NAN_ACC_CODECS)]
)
def test_device_accumulate_into_negative_nans_gives_positive_nans(sim: dict[str, Any], i: int) -> None:
    """A codec whose decoded values are finite, accumulated into an ``out`` of negative NaNs: on the
    device as on the CPU, every element (a NaN sum) is a positive NaN."""
    got = sim["nan_rule"]
    assert got is not None and "error" not in got, got and got.get("error")
    dev = got["codec_acc"][i]
    assert not dev.startswith("error"), dev
    assert _positive_nans(dev, np.float32)
    _cfg, payload, start = _nan_rule_inputs()["codecs"][i]  # and the CPU, from the same payload
    out = np.frombuffer(bytes.fromhex(start), np.float32).copy()
    gcodec.decode(bytes.fromhex(payload), out=out, accumulate=True)
    assert _positive_nans(out.tobytes().hex(), np.float32)


#: Codecs of the real-GPU round trips below (in this process, not the simulator's child).
ROUND_TRIPS = [
    c for c in CASES if c[0] in ("fp16", "bf16", "u8-g64", "u4-sto-s9", "qsgd-15", "sign", "topk-r10", "rk-fp16")
]


def _gpu_or_skip(lib: str) -> None:
    """Skip (with the reason, never as a pass) unless a real CUDA GPU is usable here."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip(f"{lib} round trips need a real GPU, not Numba's simulator")
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed (pip install 'gcodec[cuda]')")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip(f"no usable CUDA GPU here: {lib} device arrays cannot be made (run bench/gpu_check.py on one)")


def _round_trip(x_dev: Any, out_dev: Any, to_host: Any, case: tuple) -> None:
    cid, cfg, n, seed, step, kind = case
    p = gcodec.encode(x_dev, cfg, step=step)
    assert type(p).__name__ == "DevicePayload"
    cpu = _cpu_payload(cfg, n, seed, step, kind, cid)
    assert bytes(p) == cpu, cid
    gcodec.decode(cpu, out=out_dev)
    ref = gcodec.decode(cpu).astype(np.float32).reshape(-1)
    np.testing.assert_array_equal(to_host(out_dev).view(np.uint32), ref.view(np.uint32))
    gcodec.decode(p, out=out_dev, accumulate=True)
    np.testing.assert_array_equal(to_host(out_dev).view(np.uint32), (ref + ref).view(np.uint32))


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=[c[0] for c in ROUND_TRIPS])
def test_cupy_round_trip(case: tuple) -> None:  # pragma: no cover - needs a GPU
    """A CuPy array encodes to the CPU's bytes; CPU bytes decode into a CuPy ``out=``."""
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed (pip install 'gcodec[cuda]')")
    _gpu_or_skip("CuPy")
    import cupy

    _, _, n, seed, _, kind = case
    x = cupy.asarray(make_array(n, seed, kind))
    _round_trip(x, cupy.full(n, 7.0, cupy.float32), cupy.asnumpy, case)


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=[c[0] for c in ROUND_TRIPS])
def test_torch_cuda_round_trip(case: tuple) -> None:  # pragma: no cover - needs a GPU
    """A torch CUDA tensor encodes to the CPU's bytes (from its device memory); CPU bytes decode into
    a CUDA tensor ``out=``; gcodec.torch.convert.as_array views it as a device array, no copy."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch CUDA tensors cannot be made here; run bench/gpu_check.py on a GPU machine")
    _gpu_or_skip("torch CUDA")
    from gcodec.torch.convert import as_array

    _, _, n, seed, _, kind = case
    x = torch.from_numpy(make_array(n, seed, kind)).cuda()
    out = torch.full((n,), 7.0, dtype=torch.float32, device="cuda")
    view = as_array(out)
    assert view.__cuda_array_interface__["data"][0] == out.data_ptr()  # the tensor's own memory
    _round_trip(x, out, lambda t: t.cpu().numpy(), case)


def test_the_simulators_shared_arrays_are_one_per_block_and_call_site(monkeypatch) -> None:
    """Two threads of a block that reach one ``cuda.shared.array`` call at once get one array under
    :func:`tests.gpu_sim_worker.race_free_shared_arrays`, as on a GPU. NumPy's ``empty`` is slowed to
    20 ms so that both threads look the array up before either has stored it: the simulator's own
    allocation then hands them two arrays (checked when this test was written, numba-cuda 0.30.4),
    and a block's writes to one of them are lost, which is how top-k's radix histogram lost counts."""
    import time

    kernelapi = pytest.importorskip("numba.cuda.simulator.kernelapi")
    from .gpu_sim_worker import race_free_shared_arrays

    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", kernelapi.FakeCUDAShared.array)  # restored after
    real = np.empty

    def slow(*a: Any, **kw: Any) -> Any:
        time.sleep(0.02)
        return real(*a, **kw)

    def two_threads(shared: Any) -> list[Any]:
        got: list[Any] = []
        start = threading.Barrier(2)

        def thread() -> None:
            start.wait()
            got.append(shared.array(8, np.int32))  # one call site for both threads

        threads = [threading.Thread(target=thread) for _ in range(2)]
        with monkeypatch.context() as m:
            m.setattr(np, "empty", slow)
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return got

    race_free_shared_arrays()
    a, b = two_threads(kernelapi.FakeCUDAShared(0))
    assert a is b and a.shape == (8,) and a.dtype == np.int32
    c, d = two_threads(kernelapi.FakeCUDAShared(0))  # a new block: arrays of its own
    assert c is d and c is not a
