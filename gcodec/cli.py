"""The ``gcodec`` command line: inspect, validate, encode, decode, list codecs, run the demo.

Exit status: 0 success; 1 a payload is invalid or an operation on valid arguments failed; 2 a
usage error (bad arguments, unknown codec or parameter, a missing or unreadable file).

bfloat16 arrays have two ``.npy`` conventions, and the CLI takes both: NumPy with ml_dtypes stores
them as raw 2-byte records (``|V2``), the golden vectors of ``specs/vectors`` as their bit patterns
(``<u2``). ``encode`` reads ``|V2`` arrays as bfloat16, and ``uint16`` arrays as bfloat16 bits with
``--dtype bfloat16``; ``decode`` writes ``|V2`` (view with ``ml_dtypes.bfloat16``), or ``<u2`` bit
patterns with ``--bf16-bits``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from . import __version__
from .api import PayloadInfo, decode, decode_bundle, encode_bundle, inspect_header, validate
from .arrays import BFLOAT16
from .codecs.registry import codec_class, get_codec, list_codecs
from .elements import element_format, scale_format
from .errors import ConfigError, GcodecError, UnknownCodecError
from .format.container import FLAG_PAYLOAD_CRC, MAJOR, MINOR, PREAMBLE_SIZE
from .limits import get_limits

__all__ = ["main"]

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
LATENCY_DEFAULT = 50e-6  # gcodec advise's assumed alpha, seconds per message


class UsageError(Exception):
    """Bad arguments or files: exit status 2."""


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _print_json(obj: Any, out: TextIO) -> None:
    from .jsonsafe import json_safe  # NaN and infinities (e.g. bits/element of an empty tensor) become null

    json.dump(json_safe(obj), out, indent=2, default=str, allow_nan=False)
    out.write("\n")


# --------------------------------------------------------------------------------------------
# files


def _read_stdin() -> np.ndarray:
    """Standard input's bytes (``-`` as a path), read up to one byte past max_payload_bytes."""
    lim = get_limits()
    parts, total = [], 0
    while True:  # in pieces: a read sized by the limit would allocate the limit
        piece = sys.stdin.buffer.read(1 << 20)
        if not piece:
            break
        total += len(piece)
        if total > lim.max_payload_bytes:
            raise UsageError(f"standard input exceeds max_payload_bytes={lim.max_payload_bytes}")
        parts.append(piece)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def _read_payload_file(path: str) -> np.ndarray:
    """The file's bytes as a uint8 array (``-``: standard input); UsageError when it is missing or
    unreadable."""
    if path == "-":
        return _read_stdin()
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    size = os.path.getsize(path)
    lim = get_limits()
    if size > lim.max_payload_bytes:
        raise UsageError(f"{path}: {size} bytes exceeds max_payload_bytes={lim.max_payload_bytes}")
    try:
        return np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from None


def _as_wire_dtype(a: np.ndarray, bf16_bits: bool = False) -> np.ndarray:
    """C-contiguous, 0-d arrays kept 0-d (np.ascontiguousarray would make them 1-d); |V2 read as
    bfloat16, and uint16 as bfloat16 bit patterns when ``bf16_bits``."""
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    if a.dtype == np.dtype("V2"):  # how np.save stores bfloat16
        return a.view(BFLOAT16)
    if a.dtype == np.dtype("<u2") and bf16_bits:  # the golden vectors' convention
        return a.view(BFLOAT16)
    if a.dtype == np.dtype("<u2"):
        raise UsageError("uint16 input: for bfloat16 bit patterns (as in specs/vectors) pass --dtype bfloat16")
    return a


def _load_arrays(path: str, bf16_bits: bool = False) -> tuple[dict[str, np.ndarray], bool]:
    """({name: array}, is_npz) from a ``.npy`` or ``.npz`` file; a ``.npy`` array's name is ``""``."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                arrays = {k: _as_wire_dtype(loaded[k], bf16_bits) for k in loaded.files}
            if not arrays:
                raise UsageError(f"{path}: the .npz file holds no arrays")
            return arrays, True
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"{path}: cannot read as .npy/.npz: {e}") from None
    if not isinstance(loaded, np.ndarray):
        raise UsageError(f"{path}: not a .npy array")
    return {"": _as_wire_dtype(loaded, bf16_bits)}, False


def _parse_param(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--param {text!r}: expected KEY=VALUE")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


# --------------------------------------------------------------------------------------------
# inspect


def _preamble(data: np.ndarray) -> dict[str, Any] | None:
    if data.shape[0] < PREAMBLE_SIZE:
        return None
    magic, major, minor, flags, hlen, hcrc = struct.unpack("<4sBBHII", data[:PREAMBLE_SIZE].tobytes())
    return {
        "magic": magic.decode("latin-1"),
        "version": f"{major}.{minor}",
        "flags": flags,
        "payload_crc": bool(flags & FLAG_PAYLOAD_CRC),
        "header_length": hlen,
        "header_crc32c": f"0x{hcrc:08x}",
    }


def _tensor_extras(info: PayloadInfo) -> list[dict[str, Any]]:
    out = []
    for t in info.tensors:
        sect = sum(s[3] for s in t.sections)
        extra: dict[str, Any] = {
            "numel": t.numel,
            "original_nbytes": t.original_nbytes,
            "section_nbytes": sect,
            "bits_per_element": 8.0 * sect / t.numel if t.numel else None,
        }
        el = element_format(t.codec, t.params)
        if el is not None:  # the element codes are a low-precision dtype other tools know by name
            elements: dict[str, Any] = {
                "format": el.name,
                "safetensors": el.safetensors or None,
                "dlpack_code": el.dlpack_code if el.dlpack_code >= 0 else None,
                "bits": el.bits,
            }
            sf = scale_format(t.codec, t.params)
            if sf is not None:
                elements["scales"] = {"format": sf[0], "safetensors": sf[1], "dlpack_code": sf[2]}
            extra["elements"] = elements
        out.append(extra)
    return out


def inspect_payload(data: np.ndarray) -> dict[str, Any]:
    """Everything ``gcodec inspect`` reports, as a JSON-safe dict.

    The container is described whenever its header can be read, even when the payload checksum
    or a codec rule fails; ``valid`` and ``error`` then say what full validation found.
    """
    res: dict[str, Any] = {"file_nbytes": int(data.shape[0]), "preamble": _preamble(data)}
    info: PayloadInfo | None = None
    container_error: str | None = None
    try:
        info = inspect_header(data)
    except GcodecError as e:
        container_error = _err(e)
        try:  # a payload checksum mismatch still leaves a readable header: describe it
            info = inspect_header(data, verify_checksum=False)
        except GcodecError:
            info = None
    res["container_ok"] = container_error is None
    res["container_error"] = container_error
    if info is not None:
        d = info.to_dict()
        for t, extra in zip(d["tensors"], _tensor_extras(info)):
            t.update(extra)
        res["payload"] = d
    else:
        res["payload"] = None
    try:
        validate(data)
        res["valid"], res["error"] = True, None
    except GcodecError as e:
        res["valid"] = False
        res["error"] = {"class": type(e).__name__, "message": str(e)}
    return res


def _fmt_params(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in p.items()) or "-"


def _print_inspect(path: str, r: dict[str, Any], out: TextIO) -> None:
    w = out.write
    w(f"file: {path} ({r['file_nbytes']:,} bytes)\n")
    pre = r["preamble"]
    if pre is not None:
        w(
            f"preamble: magic {pre['magic']!r}, format {pre['version']}, flags 0x{pre['flags']:04x} "
            f"(payload CRC32C: {'yes' if pre['payload_crc'] else 'no'}), header {pre['header_length']} bytes, "
            f"header CRC32C {pre['header_crc32c']}\n"
        )
    if r["container_error"]:
        w(f"container: FAIL {r['container_error']}\n")
    p = r["payload"]
    if p is not None:
        kind = f"bundle of {len(p['tensors'])} tensors" if p["bundle"] else "single tensor"
        w(f"format {p['version']}, {kind}, header {p['header_nbytes']} bytes, meta {p['meta'] or '{}'}\n")
        for i, t in enumerate(p["tensors"]):
            name = t["name"] if t["name"] is not None else "(unnamed)"
            bpe = t["bits_per_element"]
            w(
                f"tensor [{i}] {name}: codec {t['codec']} v{t['codec_version']}, {t['dtype']} "
                f"{t['shape']} ({t['numel']:,} elements), params: {_fmt_params(t['params'])}\n"
                f"    original {t['original_nbytes']:,} bytes, sections {t['section_nbytes']:,} bytes"
                + (f" ({bpe:.3f} bits/element)" if bpe is not None else "")
                + "\n"
            )
            el = t.get("elements")
            if el is not None:
                w(
                    f"    elements: {el['format']} ({el['bits']} bits), safetensors dtype "
                    f"{el['safetensors'] or 'none'}, DLPack type code {el['dlpack_code']}\n"
                )
                sc = el.get("scales")
                if sc is not None:
                    w(
                        f"    scales: {sc['format']}, safetensors dtype {sc['safetensors']}, "
                        f"DLPack type code {sc['dlpack_code']}\n"
                    )
            w(f"    {'section':<12} {'type':<5} {'offset':>12} {'nbytes':>12}\n")
            for s in t["sections"]:
                w(f"    {s['name']:<12} {s['dtype']:<5} {s['offset']:>12,} {s['nbytes']:>12,}\n")
        ratio, bpe_all = p["ratio"], p["bits_per_element"]
        w(
            f"payload {p['nbytes']:,} bytes, original {p['original_nbytes']:,} bytes, ratio "
            + (f"{ratio:.3f}x" if ratio is not None else "n/a")
            + (f", {bpe_all:.3f} bits/element\n" if bpe_all is not None and np.isfinite(bpe_all) else "\n")
        )
    if r["valid"]:
        w("validation: OK\n")
    else:
        w(f"validation: FAIL {r['error']['class']}: {r['error']['message']}\n")


def cmd_inspect(args: argparse.Namespace) -> int:
    data = _read_payload_file(args.file)
    r = inspect_payload(data)
    if args.json:
        _print_json({"file": args.file, **r}, sys.stdout)
    else:
        _print_inspect(args.file, r, sys.stdout)
    return EXIT_OK if r["valid"] else EXIT_INVALID


# --------------------------------------------------------------------------------------------
# validate


def _describe(info: PayloadInfo) -> str:
    if info.is_bundle:
        codecs = ",".join(sorted({t.codec for t in info.tensors}))
        dtypes = ",".join(sorted({str(t.dtype) for t in info.tensors}))
        n = sum(t.numel for t in info.tensors)
        what = f"bundle[{len(info.tensors)}]:{codecs} {n} elements {dtypes}"
    else:
        what = f"{info.codec} {list(info.shape)} {info.dtype}"
    return f"{what} {info.ratio:.3f}x"


def cmd_validate(args: argparse.Namespace) -> int:
    status = EXIT_OK
    for path in args.files:
        try:
            data = _read_payload_file(path)
        except UsageError as e:
            print(f"FAIL {path}: {e}", file=sys.stderr)
            status = max(status, EXIT_USAGE)
            continue
        try:
            info = validate(data)
        except GcodecError as e:
            print(f"FAIL {path}: {_err(e)}", file=sys.stderr)
            status = max(status, EXIT_INVALID)
            continue
        print(f"OK {path}: {_describe(info)}")
    return status


# --------------------------------------------------------------------------------------------
# encode / decode


def cmd_encode(args: argparse.Namespace) -> int:
    params = dict(_parse_param(p) for p in args.param or [])
    try:
        codec = get_codec(args.codec, **params)
    except (UnknownCodecError, ConfigError) as e:
        raise UsageError(_err(e)) from None
    arrays, is_npz = _load_arrays(args.input, bf16_bits=args.dtype == "bfloat16")
    try:
        if is_npz:
            buf = encode_bundle(arrays, codec, checksum=not args.no_checksum)
        else:
            buf = codec.encode(arrays[""], checksum=not args.no_checksum)
    except GcodecError as e:
        print(f"error: {args.input}: {_err(e)}", file=sys.stderr)
        return EXIT_INVALID
    _write_bytes(args.output, buf)
    info = validate(buf)
    print(f"wrote {args.output}: {_describe(info)}, {info.nbytes:,} bytes")
    return EXIT_OK


def _write_bytes(path: str, buf: Any) -> None:
    try:
        with open(path, "wb") as f:
            f.write(buf)
    except OSError as e:
        raise UsageError(f"{path}: cannot write: {e.strerror or e}") from None


def _bf16_out(a: np.ndarray, bits: bool) -> np.ndarray:
    return a.view("<u2") if bits and a.dtype == BFLOAT16 else a


def cmd_decode(args: argparse.Namespace) -> int:
    data = _read_payload_file(args.input)
    try:
        info = validate(data)
        arrays = decode_bundle(data) if info.is_bundle else {"": decode(data)}
    except GcodecError as e:
        print(f"FAIL {args.input}: {_err(e)}", file=sys.stderr)
        return EXIT_INVALID
    try:
        if info.is_bundle:
            if args.output.endswith(".npy"):
                raise UsageError(f"{args.input} is a bundle of {len(arrays)} tensors: give an .npz output")
            with open(args.output, "wb") as f:
                out_arrays: dict[str, Any] = {k: _bf16_out(v, args.bf16_bits) for k, v in arrays.items()}  # type: ignore[arg-type]
                np.savez(f, **out_arrays)
        else:
            with open(args.output, "wb") as f:
                arr = arrays[""]
                assert isinstance(arr, np.ndarray)
                np.save(f, _bf16_out(arr, args.bf16_bits), allow_pickle=False)
    except OSError as e:
        raise UsageError(f"{args.output}: cannot write: {e.strerror or e}") from None
    if any(t.dtype == BFLOAT16 for t in info.tensors):
        how = "<u2 bit patterns" if args.bf16_bits else "raw 2-byte records (|V2); view with ml_dtypes.bfloat16"
        print(f"note: bfloat16 is stored as {how}", file=sys.stderr)
    print(f"wrote {args.output}: {_describe(info)}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# codecs, demo


def _param_type(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return "|".join(k.__name__ for k in kinds)


def codecs_table() -> list[dict[str, Any]]:
    """Every registered codec with its aggregation kind and parameter schema (JSON-safe)."""
    out: list[dict[str, Any]] = []
    for cid in list_codecs():
        try:
            cls = codec_class(cid)
        except GcodecError as e:
            out.append({"id": cid, "error": _err(e)})
            continue
        params = []
        for name, p in cls.PARAMS.items():
            d: dict[str, Any] = {"name": name, "type": _param_type(p.kind), "default": p.default, "doc": p.doc}
            if p.choices is not None:
                d["choices"] = list(p.choices)
            if p.min is not None:
                d["min"] = p.min
            if p.max is not None:
                d["max"] = p.max
            params.append(d)
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        summary = doc.split(". ")[0].rstrip(".") + "." if doc else ""
        out.append(
            {
                "id": cid,
                "version": cls.version,
                "aggregation": cls.aggregation.value,
                "summary": summary,
                "params": params,
            }
        )
    return out


def cmd_warmup(args: argparse.Namespace) -> int:
    from .warmup import warmup

    codecs: list[Any] | None = None
    if args.codec:
        try:
            # an id, or a JSON config: the job's own settings, each of which compiles its own kernels
            codecs = [get_codec(json.loads(c) if c.lstrip().startswith("{") else c) for c in args.codec]
        except (UnknownCodecError, ConfigError) as e:
            raise UsageError(_err(e)) from None
        except json.JSONDecodeError as e:
            raise UsageError(f"--codec: not valid JSON: {e}") from None
    t0 = time.perf_counter()
    times = warmup(codecs, progress=lambda label, s: print(f"{s:7.2f} s  {label}", flush=True), jobs=args.jobs)
    print(f"warmed up {len(times)} codec settings in {time.perf_counter() - t0:.1f} s ({args.jobs} process(es))")
    return EXIT_OK


def cmd_codecs(args: argparse.Namespace) -> int:
    table = codecs_table()
    if args.json:
        _print_json(table, sys.stdout)
        return EXIT_OK
    for c in table:
        if "error" in c:
            print(f"{c['id']}: cannot load ({c['error']})")
            continue
        print(f"{c['id']} (v{c['version']}, aggregation: {c['aggregation']}): {c['summary']}")
        for p in c["params"]:
            extra = ""
            if "choices" in p:
                extra = f", one of {p['choices']}"
            elif "min" in p or "max" in p:
                extra = f", in [{p.get('min', '-inf')}, {p.get('max', 'inf')}]"
            print(f"    {p['name']}: {p['type']} = {p['default']!r}{extra}  {p['doc']}")
        if not c["params"]:
            print("    (no parameters)")
    return EXIT_OK


def cmd_tour(args: argparse.Namespace) -> int:
    from .demo import run_tour

    if args.json:
        result = run_tour(quick=args.quick)
        _print_json(result, sys.stdout)
    else:

        def emit(text: str) -> None:
            print(text, flush=True)

        result = run_tour(quick=args.quick, emit=emit)
    failed = [c for c in result["codecs"] if not c["ok"]]
    return EXIT_INVALID if failed and len(failed) == len(result["codecs"]) else EXIT_OK


def _probe(kind: str, sizes: Sequence[int], evict: Any = None) -> tuple[Any, int, int, Any, dict[str, Any]]:
    """Measure the link under a launcher: (the fit, this rank, the world size, what to call when
    done: it tears down a process group made here, the engine's callables that
    :func:`gcodec.advise.measure_steps` times the job's exchange with). ``torch`` reads
    torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and uses NCCL when this
    process has a GPU, else gloo; ``mpi`` uses MPI.COMM_WORLD (mpiexec). ``evict`` runs before
    each timed collective (:func:`gcodec.advise.probe_link`)."""
    from .advise import probe_links

    if kind == "mpi":
        try:
            from mpi4py import MPI
        except ImportError:
            raise UsageError("--probe mpi needs mpi4py: pip install 'gcodec[mpi]'") from None
        comm = MPI.COMM_WORLD
        if comm.size < 2:
            raise UsageError("--probe mpi runs under mpiexec with 2 or more ranks (mpiexec -n 2 gcodec advise ...)")
        from .mpi import MPICommunicator

        mc = MPICommunicator(comm)
        fits = probe_links(
            lambda a: comm.Allreduce(MPI.IN_PLACE, a),
            lambda b: mc.allgatherv(b, [b.shape[0]] * comm.size).wait(),  # the transports' own all-gather
            comm.size,
            barrier=comm.Barrier,
            slowest=lambda t: comm.allreduce(t, op=MPI.MAX),
            sizes=sizes,
            transport=f"MPI ({' '.join(MPI.Get_library_version().split()[:3])})",
            evict=evict,
        )
        import gcodec.mpi

        gen = np.random.default_rng(comm.rank)
        engine = {
            "exchange": lambda a, cfg, key, state: gcodec.mpi.allreduce(comm, a, cfg, key=key, state=state, out=a),
            "dense_allreduce": lambda a: comm.Allreduce(MPI.IN_PLACE, a),
            "make": lambda shape: gen.standard_normal(shape, dtype=np.float32),
            "barrier": comm.Barrier,
            "slowest": lambda t: comm.allreduce(t, op=MPI.MAX),
        }
        return fits, comm.rank, comm.size, lambda: None, engine
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise UsageError("--probe torch needs torch: pip install 'gcodec[torch]'") from None
    made = not dist.is_initialized()
    if made:
        if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise UsageError(
                "--probe torch runs under torchrun with 2 or more ranks "
                "(torchrun --nproc-per-node 2 -m gcodec advise ...)"
            )
        gpu = torch.cuda.is_available()
        if gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if gpu else "gloo")
    try:
        fits, engine = _probe_torch(sizes, evict)
    except BaseException:
        if made:  # the group made here goes with the error
            dist.destroy_process_group()
        raise

    def close() -> None:
        if made:  # gcodec's queue idle and no c10d work left to a later collection, then the group
            import gc

            from .torch import synchronize

            synchronize()
            gc.collect()
            dist.destroy_process_group()

    return fits, dist.get_rank(), dist.get_world_size(), close, engine


def _probe_torch(sizes: Sequence[int], evict: Any = None) -> tuple[Any, dict[str, Any]]:
    """The allreduce and all-gather fits on torch.distributed's default group, and the engine's
    callables for :func:`gcodec.advise.measure_steps`."""
    import torch
    import torch.distributed as dist

    from .advise import probe_links
    from .torch.comm import comm_for

    backend = str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def slowest(t: float) -> float:
        v = torch.tensor([t], dtype=torch.float64, device=device)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v[0])

    def allreduce(a: Any) -> None:
        dist.all_reduce(a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    world = dist.get_world_size()
    tc = comm_for(None)

    def allgather(b: Any) -> None:
        tc.allgatherv(b, [b.shape[0]] * world).wait()  # the transports' own all-gather
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        from .torch.convert import as_array

        def on_device(nbytes: int) -> Any:
            return as_array(torch.ones(nbytes, dtype=torch.uint8, device=device))

    fits = probe_links(
        allreduce,
        allgather,
        world,
        array=lambda n: torch.ones(n, dtype=torch.float32, device=device),
        byte_array=on_device if device.type == "cuda" else None,
        barrier=dist.barrier,
        slowest=slowest,
        sizes=sizes,
        transport=f"torch.distributed ({backend})",
        evict=evict,
    )
    import gcodec.torch

    gen = torch.Generator(device=device).manual_seed(dist.get_rank())

    def exchange(a: Any, cfg: Any, key: str, state: Any) -> None:
        gcodec.torch.all_reduce(a, cfg, key=key, state=state)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    engine = {
        "exchange": exchange,
        "dense_allreduce": allreduce,
        "make": lambda shape: torch.randn(shape, generator=gen, device=device),
        "barrier": dist.barrier,
        "slowest": slowest,
    }
    return fits, engine


def cmd_advise(args: argparse.Namespace) -> int:
    from .advise import (
        DEFAULT_CANDIDATES,
        PROBE_SIZES,
        CacheEvictor,
        advise,
        format_table,
        job_tensors,
        measure_steps,
        parse_bandwidth,
    )

    rank, close = 0, lambda: None
    engine: dict[str, Any] = {}
    fit: Any = None
    gfit: Any = None
    gather: Any = None
    try:
        if args.probe and args.bandwidth is not None:
            raise UsageError("give --probe (measure the link) or --bandwidth (assume one), not both")
        if args.no_measure and not args.probe:
            raise UsageError("--no-measure goes with --probe (only a probed run measures the job's exchange)")
        model = None
        if args.model is not None:
            try:
                with open(args.model) as f:
                    model = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise UsageError(f"cannot read --model {args.model}: {e}") from None
        cands: list[Any] = list(DEFAULT_CANDIDATES)
        if args.codec:
            cands = [None] + [json.loads(c) if c.lstrip().startswith("{") else c for c in args.codec]
        bandwidth, workers = args.bandwidth or "1Gbit", args.workers
        latency = LATENCY_DEFAULT if args.latency is None else args.latency
        evict = None if args.warm_caches else CacheEvictor()  # one buffer for the probe and the timings
        if args.probe:
            # at least the two smallest sizes: a line needs two points
            sizes = [n for i, n in enumerate(PROBE_SIZES) if i < 2 or 4 * n <= args.probe_max_bytes]
            (fit, gfit), rank, workers, close, engine = _probe(args.probe, sizes, evict)
            bandwidth, latency, gather = fit.link.bandwidth_bps, fit.link.latency_s, gfit.link
        rows = advise(
            numel=args.numel,
            model=model,
            bandwidth=bandwidth,
            workers=workers,
            latency_s=latency,
            candidates=cands,
            mode=args.mode,
            threads=args.threads,
            repeats=args.repeats,
            error_feedback=args.error_feedback,
            transport=not args.codec_only,
            gather_link=gather,
            cold=evict is not None,
            evictor=evict,
        )
        if args.probe and not args.no_measure:  # and the job's exchange itself, on this link
            tensors, dense = job_tensors(numel=args.numel, model=model)
            got = measure_steps(
                [r["codec"] for r in rows],
                tensors,
                dense,
                **engine,
                repeats=args.repeats,
                mode=args.mode,
                error_feedback=args.error_feedback,
                threads=args.threads,
                evict=evict,
            )
            base = got.get("null")
            for r in rows:
                t = got.get(json.dumps(r["codec"], sort_keys=True))
                r["measured_step_seconds"] = t
                r["measured_saving_seconds"] = None if t is None or base is None else base - t
    except (GcodecError, UsageError, json.JSONDecodeError) as e:
        print(f"gcodec advise: error: {_err(e)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        close()
    if fit is not None and gfit is not None:
        lo, hi = fit.samples[0][0], fit.samples[-1][0]
        link_note = (
            f"link: measured by --probe over {fit.transport}, {fit.workers} ranks: dense allreduces of "
            f"{_size(lo)} to {_size(hi)} per rank fit {fit.link.bandwidth_bps / 1e9:.3g} Gbit/s, "
            f"alpha {fit.link.latency_s * 1e6:.3g} us (worst sample {100 * fit.worst_residual:.0f} % off the line); "
            "its all-gather of payload bytes (summable, gather, two-phase) fits "
            f"{gfit.link.bandwidth_bps / 1e9:.3g} Gbit/s, "
            f"alpha {gfit.link.latency_s * 1e6:.3g} us (worst {100 * gfit.worst_residual:.0f} %)"
        )
        link_info: dict[str, Any] = {**fit.to_dict(), "gather": gfit.to_dict()}
    else:
        link_note = (
            f"link: assumed, not measured: {parse_bandwidth(bandwidth) / 1e9:.3g} Gbit/s "
            f"({'--bandwidth' if args.bandwidth else 'the default; give --bandwidth or --probe'}), "
            f"alpha {latency * 1e6:.3g} us ({'the default' if args.latency is None else '--latency'}), "
            f"{workers} workers"
        )
        link_info = {"source": "assumed", "bandwidth_bps": parse_bandwidth(bandwidth), "latency_s": latency}
    threads = args.threads if args.threads is not None else "the default"
    speed_note = (
        f"codec speeds: measured on this machine now ({threads} kernel threads, best of {args.repeats}); "
        + (
            "compute: the codec's encode and decode times in the model's formula (--codec-only)"
            if args.codec_only
            else f"compute: the transports' own protocol timed here for {workers} ranks (no network)"
        )
        + (
            "; caches warm (--warm-caches: the same buffers step after step)"
            if args.warm_caches
            else "; caches cold (read over before each timed step, as a training step's forward and backward do)"
        )
    )
    for r in rows:
        r["link"] = link_info
    if rank != 0:  # every rank measured (as every rank trains); one prints
        return EXIT_OK
    print(format_table(rows, parse_bandwidth(bandwidth), workers, notes=[link_note, speed_note]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
            f.write("\n")
    return EXIT_OK


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.3g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.3g} KiB"


def cmd_demo(args: argparse.Namespace) -> int:
    if args.tour:
        if not args.json:
            return cmd_tour(args)
        from .demo import run_tour

        with open(args.json, "w", encoding="utf-8") as f:
            _print_json(run_tour(quick=args.quick), f)
        return EXIT_OK
    from .demo import demo_table, run_demo, write_plot
    from .demo.launch import LaunchError

    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    lm = args.workload == "lm" or args.diloco
    if lm and args.mpi:
        raise UsageError("the language-model workload runs over gloo (gcodec.torch); --mpi is the digits demo's")
    import importlib.util

    missing = [m for m in ("torch", *(() if args.no_progress else ("tqdm",))) if importlib.util.find_spec(m) is None]
    if args.mpi and importlib.util.find_spec("mpi4py") is None:
        missing.append("mpi4py")
    if missing:
        raise UsageError(f"the demo needs {', '.join(missing)}: pip install 'gcodec[demo]'")
    if lm:
        return _lm_demo(args)
    try:
        result = run_demo(workers=args.workers, mpi=args.mpi, quick=args.quick, progress=not args.no_progress)
    except LaunchError as e:
        print(f"gcodec demo: {e}", file=sys.stderr)
        return EXIT_INVALID
    for line in demo_table(result):
        print(line, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            _print_json(result["runs"], f)
        print(f"results: {args.json}")
    if args.plot:
        why = write_plot(result, args.plot)
        print(why if why else f"accuracy curves: {args.plot}")
    return EXIT_OK if all(r.get("ok") for r in result["runs"]) else EXIT_INVALID


def _lm_demo(args: argparse.Namespace) -> int:
    from .demo.launch import LaunchError
    from .demo.lm import lm_table, run_lm_demo, write_lm_plot

    try:
        result = run_lm_demo(
            workers=args.workers, quick=args.quick, diloco_only=args.diloco, progress=not args.no_progress
        )
    except LaunchError as e:
        print(f"gcodec demo: {e}", file=sys.stderr)
        return EXIT_INVALID
    for line in lm_table(result):
        print(line, flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            _print_json(result, f)
        print(f"results: {args.json}")
    if args.plot:
        why = write_lm_plot(result, args.plot)
        print(why if why else f"validation-loss curves: {args.plot}")
    return EXIT_OK if all(r.get("ok") for r in result["runs"]) else EXIT_INVALID


# --------------------------------------------------------------------------------------------
# the parser


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gcodec",
        description="Gradient-compression codecs with a versioned, validated wire format.",
        epilog="Exit status: 0 ok, 1 invalid payload or failed operation, 2 usage error or missing file.",
    )
    ap.add_argument("--version", action="version", version=f"gcodec {__version__} (wire format {MAJOR}.{MINOR})")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("inspect", help="describe a payload: header, tensors, sections, sizes, validity")
    p.add_argument("file", help="a payload file, or - for standard input")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("validate", help="run every check of the spec on payload files (- reads standard input)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("encode", help="compress a .npy array (or a .npz of arrays, as one bundle)")
    p.add_argument("input", metavar="IN.npy|IN.npz")
    p.add_argument("output", metavar="OUT.gcd")
    p.add_argument("--codec", required=True, help="codec id (see `gcodec codecs`)")
    p.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="codec parameter; VALUE is read as JSON when it parses, else as a string (repeatable)",
    )
    p.add_argument("--no-checksum", action="store_true", help="leave out the payload CRC32C (the header keeps its)")
    p.add_argument(
        "--dtype",
        choices=["bfloat16"],
        help="read uint16 input arrays as bfloat16 bit patterns (the convention of specs/vectors)",
    )
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("decode", help="decompress a payload to .npy (a bundle to .npz)")
    p.add_argument("input", metavar="IN.gcd")
    p.add_argument("output", metavar="OUT.npy|OUT.npz")
    p.add_argument(
        "--bf16-bits", action="store_true", help="write bfloat16 tensors as <u2 bit patterns (as specs/vectors does)"
    )
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser(
        "warmup", help="compile every kernel into Numba's cache (run once at install or image build time)"
    )
    p.add_argument(
        "--codec",
        action="append",
        help='only this codec: an id or a JSON config such as \'{"id": "uniform", "bits": 4}\' (repeatable); '
        "default: every codec at its defaults plus common settings",
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help="compile in this many processes at once (Numba compiles on one core; default 1)",
    )
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("codecs", help="list the registered codecs and their parameters")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_codecs)

    p = sub.add_parser(
        "demo",
        help="compressed data-parallel training with real worker processes, one run per codec",
        description="Train an MLP on the bundled handwritten digits with real worker processes (torch DDP over "
        "gloo, or MPI), once per codec, and compare bits, bytes, encode/decode time and test accuracy.",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--mpi", action="store_true", help="run the workers under mpiexec with gcodec.mpi instead of gloo")
    p.add_argument("--quick", action="store_true", help="fewer epochs (used by the tests)")
    p.add_argument("--json", metavar="PATH", help="write the results: a list with one object per codec")
    p.add_argument("--plot", metavar="PATH", help="write the test-accuracy curves as a PNG (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--tour", action="store_true", help="run the codec tour instead (as `gcodec tour`)")
    p.add_argument(
        "--workload",
        choices=["digits", "lm"],
        default="digits",
        help="digits: the MLP on handwritten digits (default); lm: a byte-level transformer on Python's "
        "standard library, by DDP and by DiLoCo (docs/lowcomm.md)",
    )
    p.add_argument("--diloco", action="store_true", help="the lm workload's DiLoCo runs and their DDP reference")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("tour", help="tour every codec on real gradients: sizes, errors, speeds, a bundle, training")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds; used by the tests)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.set_defaults(func=cmd_tour)

    p = sub.add_parser("advise", help="predict per codec whether compression pays on a link (docs/advise.md)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--numel", type=int, help="elements of one flat float32 gradient (a DDP bucket, a model)")
    what.add_argument("--model", metavar="PARAMS.json", help='parameter shapes: {"name": [dims], ...}')
    p.add_argument(
        "--bandwidth", default=None, help="assumed link bandwidth, e.g. 1Gbit, 100Mbit/s, 125MB/s (default 1Gbit)"
    )
    p.add_argument(
        "--probe",
        choices=["torch", "mpi"],
        help="measure the link instead: run under torchrun or mpiexec (every rank); dense allreduces give alpha, beta",
    )
    p.add_argument(
        "--probe-max-bytes", type=int, default=4 << 22, help="largest probe allreduce per rank (default 16 MiB)"
    )
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="with --probe: do not also time each candidate's real exchange of the job's tensors on the link",
    )
    p.add_argument("--workers", type=int, default=2, help="ranks in the allreduce (--probe: the launcher's)")
    p.add_argument(
        "--latency", type=float, default=None, help=f"assumed seconds per message, alpha (default {LATENCY_DEFAULT:g})"
    )
    p.add_argument("--codec", action="append", help="a codec id or JSON config to compare (repeatable)")
    p.add_argument("--mode", default="auto", help="transport mode (auto, summable, gather, two_phase, lowrank)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads per rank for the measurement")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (best is kept)")
    p.add_argument("--error-feedback", action="store_true", help="price error feedback (a decode per encode)")
    p.add_argument(
        "--codec-only",
        action="store_true",
        help="price compute from the codec's encode/decode times alone, not the transports' timed protocol",
    )
    p.add_argument(
        "--warm-caches",
        action="store_true",
        help="time steps (and --probe's allreduces) back to back, caches warm, not after reading them over",
    )
    p.add_argument("--json", metavar="PATH", help="also write one JSON object per codec to PATH")
    p.set_defaults(func=cmd_advise)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    try:
        return int(args.func(args))
    except UsageError as e:
        print(f"gcodec {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. `gcodec inspect x | head`
        sys.stderr.close()
        return EXIT_OK
