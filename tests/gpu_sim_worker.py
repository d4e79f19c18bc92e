"""Runs gcodec's CUDA backend under Numba's CUDA simulator, in a process of its own.

``tests/test_gpu_sim.py`` starts this script with ``NUMBA_ENABLE_CUDASIM=1`` in the child's
environment only: Numba reads that variable once, when it is first imported, so setting it inside
the test process would either come too late or change every later test. Cases arrive as JSON on
standard input; for each, the script encodes the case's array from device memory and decodes the
CPU payload into a device ``out=`` (then accumulates the device payload onto it), and prints one
JSON object of results. Errors are reported per case as ``"error": "<class>: <message>"``.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

warnings.filterwarnings("ignore", category=RuntimeWarning)  # the simulator's uint32 wraparound

#: What a real ``numba.cuda`` DeviceNDArray offers. The simulator's FakeCUDAArray forwards every other
#: attribute to the NumPy array it wraps, so ``d.astype(...)``, ``np.max(d)`` or ``d + 1`` work there
#: and fail (or copy to the host without a word) on a GPU; :func:`strict_simulator` refuses them.
DEVICE_ARRAY_API = frozenset(
    "shape strides ndim dtype size alloc_size gpu_data stream nbytes T transpose bind copy_to_device "
    "copy_to_host split as_cuda_arg get_ipc_handle squeeze view flags is_c_contiguous is_f_contiguous "
    "reshape ravel getitem setitem device_ctypes_pointer".split()
)


def strict_simulator() -> None:
    """Make the simulator's device arrays refuse what real device arrays lack, ``__array__``
    included (on a GPU it is a silent device-to-host copy): gcodec must say ``copy_to_host``."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    forward = FakeCUDAArray.__getattr__

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        if name not in DEVICE_ARRAY_API and not name.startswith("_numba") and not name.startswith("__cuda"):
            raise AttributeError(f"a real device array has no {name!r} (the simulator's would forward it to NumPy)")
        return forward(self, name)

    FakeCUDAArray.__getattr__ = __getattr__


def race_free_shared_arrays() -> None:
    """Make the simulator's ``cuda.shared.array`` one array per block and call site, as on a GPU.

    The simulator creates a block's shared array when its first thread reaches the call: it looks
    the array up by the caller's file and line and, when it is missing, makes and stores one, with
    no lock. Two threads that both miss make two arrays, and whatever one of them writes is lost
    to the rest of the block. Seen here as top-k's radix histogram losing counts (the k-th key
    came out too low and the selection kept earlier indices in place of later ones) in 4 of 42
    runs of the top-k cases under CPU contention, the likelier at the 0.1 ms switch interval of
    :func:`quick_gil_handoff`. A GPU allocates shared memory at the launch, so the lookup and the
    creation are made one step under a lock; the key is the simulator's own."""
    import threading

    from numba.core import types
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support

    lock = threading.Lock()
    original = FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):  # type: ignore[no-untyped-def]
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's refusal
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    FakeCUDAShared.array = array


def make_array(n: int, data_seed: int, kind: str) -> np.ndarray:
    """The test array of a case; the same function gives the parent process its CPU input."""
    rng = np.random.default_rng(data_seed)
    x = (rng.standard_normal(n) * 2).astype(np.float32)
    if kind == "specials":
        x[: min(n, 6)] = np.array([np.nan, np.inf, -0.0, 65520.0, 1e-8, -3e-39], np.float32)[: min(n, 6)]
    elif kind == "ties":
        x = np.round(x * 4) / 4
    elif kind == "nan" and n:
        x[n // 2] = np.nan
    elif kind == "huge" and n:  # beyond binary16's range: refused by a host with fp16 values
        x[n // 2] = np.float32(1e6)
    elif kind == "zeros":  # signed zeros and a few equal magnitudes: top-k's tie rule
        x = np.where(np.arange(n) % 2 == 0, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        x[n // 3 :: 7] = np.float32(-1.5)
        x[n // 2 :: 11] = np.float32(1.5)
    return x


def run_case(case: dict) -> dict:
    from numba import cuda

    import gcodec

    x = make_array(case["n"], case["data_seed"], case.get("kind", "normal"))
    res: dict = {"id": case["id"]}
    try:
        d = cuda.to_device(x.reshape(case.get("shape") or (x.size,)))
        p = gcodec.encode(d, case["codec"], step=case.get("step"))
        res["payload_type"] = type(p).__name__
        res["payload"] = bytes(p).hex()
        cpu = bytes.fromhex(case["cpu_payload"])
        out = cuda.to_device(np.full(x.size, 7.0, np.float32))  # decode must overwrite every element
        gcodec.decode(cpu, out=out)
        res["decoded"] = out.copy_to_host().tobytes().hex()
        if case["codec"]["id"] == "powersgd":  # its device payload differs: accumulate the CPU's
            gcodec.decode(cpu, out=out, accumulate=True)
            res["accumulated_cpu"] = out.copy_to_host().tobytes().hex()
            gcodec.decode(cpu, out=out)
        gcodec.decode(p, out=out, accumulate=True)
        res["accumulated"] = out.copy_to_host().tobytes().hex()
    except Exception as e:  # reported, and judged by the parent
        res["error"] = f"{type(e).__name__}: {e}"
    return res


def ef_inputs(n: int, data_seed: int, steps: int, nan_at: int | None = None) -> list:
    """The gradients of an error-feedback run (the parent makes the same ones for the CPU); step
    ``nan_at`` holds a NaN (the encoder refuses it and must keep the residual)."""
    xs = [make_array(n, data_seed + s, "normal") for s in range(steps)]
    if nan_at is not None:
        xs[nan_at][n // 3] = np.nan
    return xs


def run_ef(case: dict) -> dict:
    """``steps`` encodes through ErrorFeedback with device arrays: the payloads and the device
    residual after the last step, as hex."""
    from numba import cuda

    import gcodec
    from gcodec.kernels.cuda import cast, sign

    res: dict = {"id": case["id"], "payloads": []}
    shape = case.get("shape") or (case["n"],)
    # how often a fused encode + feedback kernel ran (sign's, and the 16-bit casts')
    fused = [(sign, "encode_feedback"), (cast, "encode_f16_feedback"), (cast, "encode_bf16_feedback")]
    originals = [getattr(m, name) for m, name in fused]
    calls = [0]

    def counting(f: Any) -> Any:
        def counted(*args: Any) -> int:
            calls[0] += 1
            return f(*args)

        return counted

    for (m, name), f in zip(fused, originals, strict=True):
        setattr(m, name, counting(f))
    try:
        ef = gcodec.ErrorFeedback(case["codec"], decay=case.get("decay", 1.0))
        for s, x in enumerate(ef_inputs(case["n"], case["data_seed"], case["steps"], case.get("nan_at"))):
            try:
                p = ef.encode(cuda.to_device(x.reshape(shape)), "w", step=s)
            except gcodec.PayloadValueError as e:
                res["payloads"].append(f"refused: {type(e).__name__}")
                continue
            res["payloads"].append(bytes(p).hex())
        e = ef.residual("w")
        res["residual_type"] = type(e).__name__
        res["residual"] = e.copy_to_host().tobytes().hex()
        st = ef.state_dict()  # a checkpoint: host copies of the device residual and warm-start Q
        kept = [v for d in st["codec_state"]["arrays"].values() for v in d.values()]
        res["checkpoint_types"] = sorted({type(v).__name__ for v in [*st["residuals"].values(), *kept]})
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        for (m, name), f in zip(fused, originals, strict=True):
            setattr(m, name, f)
    res["fused_calls"] = calls[0]
    return res


def run_streamed(cases: list, ids: set) -> list:
    """The cases in ``ids`` again, with every launch and copy on a stream of their own (the
    plumbing only: the simulator runs streams in order, so no concurrency is exercised)."""
    from numba import cuda

    from gcodec.kernels.cuda import launch

    with launch.use_stream(cuda.stream()):
        out = [run_case(c) for c in cases if c["id"] in ids]
    assert launch.stream() == 0
    return out


def run_randomk_indices(cases: list) -> list:
    """Device Floyd sampling (gcodec.kernels.cuda.sparse.randomk_indices) for each (n, k, seed, stream)."""
    from gcodec.codecs.randomk import randomk_indices

    return [randomk_indices(n, k, s, t, backend="cuda").copy_to_host().tolist() for n, k, s, t in cases]


def run_philox(cases: list) -> list:
    from gcodec.kernels.cuda import philox

    return [philox.random_u32(s, t, n, start).copy_to_host().tobytes().hex() for s, t, n, start in cases]


def run_crc(blobs: list) -> list:
    from numba import cuda

    from gcodec.kernels.cuda import memory

    out = []
    for h in blobs:
        b = np.frombuffer(bytes.fromhex(h), np.uint8)
        d = cuda.to_device(b) if b.size else cuda.device_array(0, np.uint8)
        out.append(memory.crc32c(d, 0, b.size))
    return out


def run_sum2(pairs: list) -> list:
    """The device's fused pair sums of the summable transport: (the bits, their float32 widening, the
    widening kernel's count of non-finite sums), bits as hex."""
    from numba import cuda

    from gcodec.kernels.cuda import cast

    out = []
    for kind, ha, hb in pairs:
        a, b = (np.frombuffer(bytes.fromhex(h), np.uint16) for h in (ha, hb))
        d = cuda.device_array(a.size, np.uint16)
        getattr(cast, f"sum2_{kind}")(cuda.to_device(a), b, d)  # one operand in host memory
        w = cuda.device_array(a.size, np.float32)
        bad = getattr(cast, f"sum2_widen_{kind}")(cuda.to_device(a), cuda.to_device(b), w)
        out.append([d.copy_to_host().tobytes().hex(), w.copy_to_host().tobytes().hex(), int(bad)])
    return out


def run_nan_rule(req: dict) -> dict:
    """:func:`nan_rule_results`, or the error it raised (judged by the parent)."""
    try:
        return nan_rule_results(req)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def nan_rule_results(req: dict) -> dict:
    """The device's sums where IEEE 754 leaves the NaN open (specs/format.md §10, "NaN sums"), on
    NaN pairs in both orders: the fused 16-bit feedback kernels, error feedback's corrected input
    (``feedback.add``, ``add_decayed``, the generic device path through ``encode_values``),
    ``memory.copy(..., accumulate=True)`` (what ``xp.add`` runs), the accumulating 16-bit decodes,
    the pair sums, and codecs' accumulating decodes into an ``out`` of negative NaNs. Bits as hex."""
    from numba import cuda

    import gcodec
    from gcodec.kernels.cuda import cast, feedback, memory

    def arr(h: str, dtype: Any) -> np.ndarray:
        return np.frombuffer(bytes.fromhex(h), dtype).copy()

    def hexof(d: Any) -> str:
        return d.copy_to_host().tobytes().hex()

    res: dict = {}
    for key, dt in (("f32", np.float32), ("f64", np.float64)):
        x, e = (arr(h, dt) for h in req[key])
        for tag, (a, b) in (("xe", (x, e)), ("ex", (e, x))):
            c = cuda.device_array(a.size, dt)
            feedback.add(c, cuda.to_device(a), cuda.to_device(b))
            res[f"add_{key}_{tag}"] = hexof(c)
            d = cuda.to_device(a)
            feedback.add_decayed(d, cuda.to_device(b), 0.5)
            res[f"add_decayed_{key}_{tag}"] = hexof(d)
            d = cuda.to_device(a)
            memory.copy(d, cuda.to_device(b), True)
            res[f"copy_acc_{key}_{tag}"] = hexof(d)
            if key != "f32":
                continue
            for kind in ("f16", "bf16"):
                bits, enew = cuda.device_array(a.size, np.uint16), cuda.device_array(a.size, np.float32)
                bad = getattr(cast, f"encode_{kind}_feedback")(cuda.to_device(a), cuda.to_device(b), bits, enew)
                res[f"fb_{kind}_{tag}"] = [hexof(bits), int(bad)]
            for codec, decay in (("fp16", 1.0), ("bf16", 1.0), ("fp16", 0.9)):
                ef = gcodec.ErrorFeedback(codec, decay=decay)
                ef.set_residual("k", cuda.to_device(b))
                out = cuda.to_device(np.zeros(a.size, np.uint16))
                try:
                    ef.encode_values(cuda.to_device(a), "k", out)
                    outcome = "accepted"
                except gcodec.PayloadValueError:
                    outcome = "refused"
                res[f"ef_{codec}_{decay}_{tag}"] = [hexof(out), outcome]
    for kind, (ha, hb) in req["h16"].items():
        a, b = arr(ha, np.uint16), arr(hb, np.uint16)
        for tag, (p, q) in (("ab", (a, b)), ("ba", (b, a))):
            d = cuda.device_array(a.size, np.uint16)
            n1 = getattr(cast, f"sum2_{kind}")(cuda.to_device(p), cuda.to_device(q), d)
            w = cuda.device_array(a.size, np.float32)
            n2 = getattr(cast, f"sum2_widen_{kind}")(cuda.to_device(p), cuda.to_device(q), w)
            res[f"sum2_{kind}_{tag}"] = [hexof(d), hexof(w), int(n1), int(n2)]
    for kind, (ho, hh) in req["acc16"].items():
        o, h = arr(ho, np.float32), arr(hh, np.uint16)
        d = cuda.to_device(o)
        getattr(cast, f"decode_{kind}")(cuda.to_device(h), d, True)
        res[f"dec_acc_{kind}"] = hexof(d)
    res["codec_acc"] = []
    for _cfg, payload, start in req["codecs"]:
        d = cuda.to_device(arr(start, np.float32))
        try:
            gcodec.decode(bytes.fromhex(payload), out=d, accumulate=True)
            res["codec_acc"].append(hexof(d))
        except Exception as e:
            res["codec_acc"].append(f"error: {type(e).__name__}: {e}")
    return res


def run_reader(items: list) -> list:
    """``gcodec.validate`` and ``gcodec.decode`` (into a device ``out=``) of payloads uploaded to the
    device whole: the outcome (error class and message, or the decoded bits), the bytes gcodec moved
    between host and device for each call, and how many times the reader copied sections to the host
    (``memory.to_host``, the path of codecs without ``device_checks``)."""
    from numba import cuda

    import gcodec
    from gcodec.kernels.cuda import launch, memory

    whole = memory.to_host
    copies = [0]

    def counted(buf):  # type: ignore[no-untyped-def]
        copies[0] += 1
        return whole(buf)

    memory.to_host = counted
    # the one-time uploads of a process (the CRC table, the element formats' value tables: 1 KiB
    # each at most) before anything is measured
    memory.crc32c(cuda.to_device(np.zeros(8, np.uint8)), 0, 8)
    from gcodec.kernels.cuda import minifloat

    for el in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"):
        minifloat._values(el)
    out = []
    try:
        for it in items:
            res: dict = {"id": it["id"]}
            d = cuda.to_device(np.frombuffer(bytes.fromhex(it["payload"]), np.uint8))
            copies[0] = 0
            t = launch.transferred()
            try:
                gcodec.validate(d)
                res["validate"] = "ok"
            except gcodec.GcodecError as e:
                res["validate"] = f"{type(e).__name__}: {e}"
            res["validate_bytes"] = launch.transferred() - t
            o = cuda.to_device(np.full(it["n"], 7.0, np.float32))
            t = launch.transferred()
            try:
                gcodec.decode(d, out=o)
                res["decode"] = "ok"
            except gcodec.GcodecError as e:
                res["decode"] = f"{type(e).__name__}: {e}"
            res["decode_bytes"] = launch.transferred() - t
            res["section_copies"] = copies[0]
            res["decoded"] = o.copy_to_host().tobytes().hex() if res["decode"] == "ok" else ""
            out.append(res)
    finally:
        memory.to_host = whole
    return out


#: Seconds each piece of work took, by label (printed for a slow run), and the watchdog's limit.
SECONDS: dict[str, float] = {}
WATCHDOG_S = 0.0


def watched(label: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` under a watchdog: past ``WATCHDOG_S`` every thread's stack goes to stderr and the
    process exits, so a simulated kernel that deadlocks (threads meeting different numbers of
    barriers) names itself instead of running into the parent's timeout."""
    print(f"gpu_sim_worker: {label}", file=sys.stderr, flush=True)
    if WATCHDOG_S:
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    t = time.perf_counter()
    try:
        return fn(*args)
    finally:
        faulthandler.cancel_dump_traceback_later()
        SECONDS[label] = round(time.perf_counter() - t, 3)


def quick_gil_handoff() -> None:
    """Numba's simulator runs every CUDA thread as a Python thread that takes two locks per
    device-function call, while the launching thread polls them without sleeping. At Python's
    default 5 ms switch interval that convoy sometimes stretches a launch of 8 k elements from a
    third of a second to minutes (seen here: 0.3 s and over 100 s for the same launch, which tripped
    the 300 s case watchdog once). At 0.1 ms the GIL changes hands fast enough: 0.7 to 8 s each time."""
    sys.setswitchinterval(1e-4)


def main() -> None:
    global WATCHDOG_S
    quick_gil_handoff()
    import gcodec

    req = json.load(sys.stdin)
    WATCHDOG_S = float(req.get("watchdog_s", 0))
    before = "numba.cuda" in sys.modules
    strict_simulator()
    race_free_shared_arrays()
    from numba import cuda

    try:
        cuda.to_device(np.zeros(2, np.float32)).astype(np.float64)
        strict = "no error"
    except Exception as e:
        strict = f"{type(e).__name__}: {e}"
    result = {
        "strict": strict,
        "cuda_imported_by_gcodec": before,
        "cases": [watched(c["id"], run_case, c) for c in req.get("cases", [])],
        "ef": [watched(c["id"], run_ef, c) for c in req.get("ef", [])],
        "streamed": watched("streamed", run_streamed, req.get("cases", []), set(req.get("streamed", []))),
        "philox": watched("philox", run_philox, req.get("philox", [])),
        "randomk_indices": watched("randomk_indices", run_randomk_indices, req.get("randomk_indices", [])),
        "crc": watched("crc", run_crc, req.get("crc", [])),
        "sum2": watched("sum2", run_sum2, req.get("sum2", [])),
        "nan_rule": watched("nan_rule", run_nan_rule, req["nan_rule"]) if "nan_rule" in req else None,
        "reader": watched("reader", run_reader, req.get("reader", [])),
    }
    result["seconds"] = SECONDS
    from gcodec.kernels.cuda import launch

    result["simulator"] = launch.SIM
    result["gcodec"] = gcodec.__file__
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
