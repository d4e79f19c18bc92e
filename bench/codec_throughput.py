#!/usr/bin/env python
"""Encode / decode throughput of the cast and quantization codecs against memcpy and naive NumPy.

    NUMBA_NUM_THREADS=1 python bench/codec_throughput.py             # 16 Mi float32, one thread
    NUMBA_NUM_THREADS=2 python bench/codec_throughput.py --json out.json
    python bench/codec_throughput.py --n 1048576 --repeat 3 --only qsgd

For every codec and setting, in one process and interleaved round by round so that machine noise
hits all contenders alike (each figure is the best of ``--repeat`` rounds after a warm-up):

* ``gcodec`` encode: ``codec.encode(x)``, the whole payload with header and CRC32C (the default);
  also ``checksum=False`` (codec kernels plus header);
* ``gcodec`` decode into ``out=`` (``gcodec.decode(buf, out=y)``: header checks, CRC, value rules,
  kernel) and with ``accumulate=True`` (which also checks every code before touching ``out``);
* a straightforward NumPy implementation of the same codec (the same information on the wire:
  same scales, same bit packing) and, for the quantizers, its decode;
* numpy memcpy (``np.copyto``) of the input, and torch's ``x.half()`` and
  ``torch.quantize_per_tensor`` (uint8) when torch is installed.

Throughput is GB/s of float32 input (4 bytes per element) for encode and decode alike. The wire
size column is bits per element of the whole payload, checked against ``(bits * n + scale bits) / 8``
(within 1 % + 256 bytes). Ratios printed: encode / memcpy, encode / naive, decode / encode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

# Numba reads NUMBA_NUM_THREADS at import; default to one thread like the targets (set it to 2 for
# the two-thread figures). torch and BLAS follow the same count.
_THREADS = int(os.environ.setdefault("NUMBA_NUM_THREADS", "1"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, str(_THREADS))

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from timing import best_of  # noqa: E402  (bench/timing.py)

import gcodec  # noqa: E402
from gcodec.codecs.qsgd import code_width  # noqa: E402

try:
    import torch

    torch.set_num_threads(_THREADS)
except ImportError:  # pragma: no cover - torch is optional
    torch = None


# --------------------------------------------------------------------------------------------
# naive NumPy versions: what a user would write, producing the same information on the wire


def _grouped(x: np.ndarray, g: int) -> np.ndarray:
    g = g if g > 0 else x.size
    pad = (-x.size) % g
    return (np.concatenate([x, np.zeros(pad, x.dtype)]) if pad else x).reshape(-1, g)


def _pack_bits(q: np.ndarray, w: int) -> np.ndarray:
    """w-bit two's complement codes into a little-endian bit stream, the obvious way."""
    if w == 8:
        return q.astype(np.int8).view(np.uint8)
    u = (q.astype(np.int16) & ((1 << w) - 1)).astype(np.uint8)
    if w in (4, 2):
        per = 8 // w
        u = u.reshape(-1, per)
        out = np.zeros(u.shape[0], np.uint8)
        for k in range(per):
            out |= u[:, k] << np.uint8(k * w)
        return out
    bits = ((u[:, None] >> np.arange(w, dtype=np.uint8)) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little")


def _unpack_bits(b: np.ndarray, n: int, w: int) -> np.ndarray:
    if w == 8:
        return b.view(np.int8)[:n].astype(np.int32)
    if w in (4, 2):
        per = 8 // w
        u = ((b[:, None] >> (np.arange(per, dtype=np.uint8) * w)) & ((1 << w) - 1)).reshape(-1)[:n]
    else:
        bits = np.unpackbits(b, bitorder="little")[: n * w].reshape(n, w)
        u = (bits.astype(np.int32) << np.arange(w, dtype=np.int32)).sum(axis=1)
    u = u.astype(np.int32)
    return np.where(u >= 1 << (w - 1), u - (1 << w), u)


def naive_uniform(x, bits, g, stochastic, rng):
    qmax = 2 ** (bits - 1) - 1
    xg = _grouped(x, g)
    s = np.abs(xg).max(axis=1, keepdims=True) / np.float32(qmax)
    t = xg / np.where(s == 0, np.float32(1), s)
    q = np.floor(t + rng.random(t.shape, dtype=np.float32)) if stochastic else np.rint(t)
    q = np.clip(q, -qmax, qmax)
    return s.astype(np.float32), _pack_bits(q.reshape(-1)[: x.size], bits)


def naive_scaled_decode(s, codes, n, g, w):
    q = _unpack_bits(codes, n, w).astype(np.float32)
    return (_grouped(q, g) * s).reshape(-1)[:n]


def naive_qsgd(x, levels, bucket, rng):
    xg = _grouped(x, bucket)
    norm = np.linalg.norm(xg, axis=1, keepdims=True)
    t = np.abs(xg) / np.where(norm == 0, np.float32(1), norm) * np.float32(levels)
    lvl = np.floor(t)
    lvl += rng.random(t.shape, dtype=np.float32) < (t - lvl)
    q = np.sign(xg) * lvl
    return (norm / np.float32(levels)).astype(np.float32), _pack_bits(q.reshape(-1)[: x.size], code_width(levels))


def naive_terngrad(x, g, clip, rng):
    xg = _grouped(x, g)
    s = np.abs(xg).max(axis=1, keepdims=True)
    if clip:
        s = np.minimum(s, np.float32(clip) * xg.std(axis=1, keepdims=True))
    p = np.abs(xg) / np.where(s == 0, np.float32(1), s)
    q = np.sign(xg) * (rng.random(p.shape, dtype=np.float32) < p)
    return s.astype(np.float32), _pack_bits(q.reshape(-1)[: x.size], 2)


def naive_sign(x, g):
    s = np.abs(_grouped(x, g)).mean(axis=1, dtype=np.float64).astype(np.float32)
    return s, np.packbits(x < 0, bitorder="little")


def naive_sign_decode(s, bits, n, g):
    sign = 1 - 2 * np.unpackbits(bits, bitorder="little")[:n].astype(np.float32)
    return (_grouped(sign, g) * s[:, None]).reshape(-1)[:n]


# --------------------------------------------------------------------------------------------
# the settings


def settings(n: int) -> list[dict[str, Any]]:
    """(name, codec id, params, wire bits per element formula, naive encode, naive decode)."""
    rng = np.random.default_rng(1)
    out = []

    def add(name, cid, params, bits, scale_bits, group, naive=None, naive_dec=None, feedback=False):
        ngroups = 1 if group == 0 else -(-n // group)
        out.append(
            dict(
                name=name,
                codec=cid,
                params=params,
                ideal_bytes=(bits * n + scale_bits * ngroups) / 8,
                naive=naive,
                naive_decode=naive_dec,
                feedback=feedback,
            )
        )

    add("fp16", "fp16", {}, 16, 0, 0, lambda x: x.astype(np.float16))
    add("bf16", "bf16", {}, 16, 0, 0)
    for bits in (8, 4, 2):
        add(
            f"uniform b{bits} g64 nearest",
            "uniform",
            {"bits": bits},
            bits,
            32,
            64,
            lambda x, b=bits: naive_uniform(x, b, 64, False, rng),
            lambda enc, x, b=bits: naive_scaled_decode(enc[0], enc[1], x.size, 64, b),
        )
    for bits in (8, 4):
        add(
            f"uniform b{bits} g64 stochastic",
            "uniform",
            {"bits": bits, "rounding": "stochastic"},
            bits,
            32,
            64,
            lambda x, b=bits: naive_uniform(x, b, 64, True, rng),
            lambda enc, x, b=bits: naive_scaled_decode(enc[0], enc[1], x.size, 64, b),
        )
    add("uniform b8 g64 fp16-scales", "uniform", {"bits": 8, "scale_dtype": "float16"}, 8, 16, 64)
    # low-precision floats (specs/codecs/fp8.md, mx.md, nvfp4.md): compare with uniform b8 / b4 above
    add("fp8 e4m3 g128", "fp8", {}, 8, 32, 128)
    add("fp8 e4m3 g32 e8m0 (MXFP8)", "fp8", {"group_size": 32, "scale_dtype": "e8m0"}, 8, 8, 32)
    add("fp8 e5m2 g128 stochastic", "fp8", {"element": "e5m2", "rounding": "stochastic"}, 8, 32, 128)
    for el, bits in (("e4m3", 8), ("e3m2", 6), ("e2m1", 4), ("int8", 8)):
        add(f"mx {el}", "mx", {"element": el}, bits, 8, 32)
    add("mx e2m1 stochastic", "mx", {"rounding": "stochastic"}, 4, 8, 32)
    add("nvfp4", "nvfp4", {}, 4, 8, 16)
    add("nvfp4 stochastic", "nvfp4", {"rounding": "stochastic"}, 4, 8, 16)
    for levels, bucket in ((15, 512), (1, 512), (7, 512), (127, 512), (15, 0)):
        add(
            f"qsgd s{levels} b{bucket}",
            "qsgd",
            {"levels": levels, "bucket_size": bucket},
            code_width(levels),
            32,
            bucket,
            lambda x, s=levels, b=bucket: naive_qsgd(x, s, b, rng),
            lambda enc, x, s=levels, b=bucket: naive_scaled_decode(enc[0], enc[1], x.size, b, code_width(s)),
        )
    for group, clip in ((0, 0.0), (512, 0.0), (0, 2.5)):
        add(
            f"terngrad g{group}" + (f" clip{clip}" if clip else ""),
            "terngrad",
            {"group_size": group, "clip": clip},
            2,
            32,
            group,
            lambda x, g=group, c=clip: naive_terngrad(x, g, c, rng),
            lambda enc, x, g=group: naive_scaled_decode(enc[0], enc[1], x.size, g, 2),
        )
    for group in (256, 0):
        add(
            f"sign g{group}",
            "sign",
            {"group_size": group},
            1,
            32,
            group,
            lambda x, g=group: naive_sign(x, g),
            lambda enc, x, g=group: naive_sign_decode(enc[0], enc[1], x.size, g),
        )
    state = {"e": np.zeros(n, np.float32)}

    def naive_sign_ef(x, st=state):
        c = x + st["e"]
        s, bits = naive_sign(c, 256)
        st["e"] = c - naive_sign_decode(s, bits, c.size, 256)
        return s, bits

    add("sign g256 + error feedback", "sign", {"group_size": 256}, 1, 32, 256, naive_sign_ef, feedback=True)
    for cid, dt in (("fp16", np.float16), ("bf16", None)):
        ef_state = {"e": np.zeros(n, np.float32)}

        def naive_cast_ef(x, st=ef_state, dt=dt):
            c = x + st["e"]
            h = c.astype(dt)
            st["e"] = c - h.astype(np.float32)
            return h

        add(f"{cid} + error feedback", cid, {}, 16, 0, 0, naive_cast_ef if dt is not None else None, feedback=True)
        # the same through ErrorFeedback's generic path (sum, encode, decode, subtract as passes of
        # their own), to set the fused kernel against it in the same run
        add(f"{cid} + error feedback, generic path", cid, {}, 16, 0, 0, feedback="generic")
    return out


# --------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }
    try:
        import numba

        info["numba"] = numba.__version__
        info["numba_threads"] = gcodec.get_num_threads()
    except ImportError:  # pragma: no cover
        pass
    if torch is not None:
        info["torch"] = torch.__version__
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = f"{names[0]} x {len(names)}" if names else platform.processor()
    except OSError:  # pragma: no cover
        info["cpu"] = platform.processor()
    info["load_average"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1 << 24, help="float32 elements (default 16 Mi)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds; each figure is the best round")
    ap.add_argument("--only", default="", help="run only settings whose name contains this (several: comma-separated)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    n = args.n
    x = (np.random.default_rng(0).standard_t(3, n) * 1e-3).astype(np.float32)
    y = np.empty_like(x)
    nbytes = 4.0 * n
    gbps = lambda t: nbytes / t / 1e9  # noqa: E731

    base_fns: dict[str, Callable[[], Any]] = {"memcpy": lambda: np.copyto(y, x)}
    if torch is not None:
        xt = torch.from_numpy(x)
        scale = float(np.abs(x).max()) / 127
        base_fns["torch x.half()"] = lambda: xt.half()
        base_fns["torch quantize_per_tensor qint8"] = lambda: torch.quantize_per_tensor(xt, scale, 0, torch.qint8)
    base = {k: gbps(t) for k, t in best_of(base_fns, args.repeat).items()}
    memcpy = base["memcpy"]
    print(
        f"# codec throughput: n = {n} float32 ({nbytes / 1e6:.0f} MB), Numba threads {_THREADS}, best of {args.repeat}"
    )
    print(f"# machine: {machine()}")
    for k, v in base.items():
        print(f"# baseline {k}: {v:.2f} GB/s ({v / memcpy:.2f} x memcpy)")
    print()
    head = (
        "| setting | bits/elem | wire vs ideal | encode GB/s | enc/memcpy | enc/naive | no-CRC enc GB/s | "
        "decode GB/s | dec/enc | accumulate GB/s | naive enc GB/s | naive dec GB/s |"
    )
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    rows = []
    for st in settings(n):
        if args.only and not any(w in st["name"] for w in args.only.split(",")):
            continue
        codec = gcodec.get_codec(st["codec"], **st["params"])
        if st["feedback"] == "generic":
            codec.plan_feedback = None  # ErrorFeedback's generic path: no fused kernel
        if st["feedback"]:
            ef = gcodec.ErrorFeedback(codec)
            enc = lambda ef=ef: ef.encode(x, "bench")  # noqa: E731
            enc_nocrc = lambda ef=ef: ef.encode(x, "bench", checksum=False)  # noqa: E731
        else:
            enc = lambda c=codec: c.encode(x)  # noqa: E731
            enc_nocrc = lambda c=codec: c.encode(x, checksum=False)  # noqa: E731
        buf = enc()
        fns = {"memcpy": lambda: np.copyto(y, x), "encode": enc, "encode_nocrc": enc_nocrc}
        if not st["feedback"]:
            fns["decode"] = lambda b=buf: gcodec.decode(b, out=y)
            fns["accumulate"] = lambda b=buf: gcodec.decode(b, out=y, accumulate=True)
        t = best_of(fns, args.repeat)
        # The naive NumPy baselines are timed apart: their gradient-sized temporaries, freed between
        # calls, made every interleaved encode page-fault its fresh payload (uniform 8-bit read
        # 0.8 ns per element instead of 0.33 in the rows that had a baseline, and no other row).
        naive: dict[str, Callable[[], Any]] = {}
        if st["naive"] is not None:
            naive["naive"] = lambda f=st["naive"]: f(x)
            if st["naive_decode"] is not None:
                nenc = st["naive"](x)
                naive["naive_decode"] = lambda f=st["naive_decode"], e=nenc: f(e, x)
            t.update(best_of(naive, args.repeat))
        r = {k: gbps(v) for k, v in t.items()}
        size = len(buf)
        row = {
            "setting": st["name"],
            "codec": st["codec"],
            "params": st["params"],
            "feedback": st["feedback"],
            "payload_bytes": size,
            "bits_per_element": 8 * size / n,
            "ideal_bytes": st["ideal_bytes"],
            "within_1pct_256": bool(st["ideal_bytes"] <= size <= st["ideal_bytes"] * 1.01 + 256),
            "gbps": r,
            "memcpy_gbps_this_round": r["memcpy"],
            "encode_vs_memcpy": r["encode"] / r["memcpy"],  # memcpy interleaved with this setting
            "encode_vs_memcpy_first_baseline": r["encode"] / memcpy,
            "encode_vs_naive": r["encode"] / r["naive"] if "naive" in r else None,
            "decode_vs_encode": r["decode"] / r["encode"] if "decode" in r else None,
        }
        rows.append(row)

        def fmt(v, spec=".2f"):
            return "—" if v is None else format(v, spec)

        print(
            f"| {st['name']} | {8 * size / n:.3f} | {size / st['ideal_bytes']:.4f}"
            f"{'' if row['within_1pct_256'] else ' (!)'} | {r['encode']:.2f} | {row['encode_vs_memcpy']:.2f} | "
            f"{fmt(row['encode_vs_naive'])} | {r['encode_nocrc']:.2f} | {fmt(r.get('decode'))} | "
            f"{fmt(row['decode_vs_encode'])} | {fmt(r.get('accumulate'))} | {fmt(r.get('naive'))} | "
            f"{fmt(r.get('naive_decode'))} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "n": n,
                    "threads": _THREADS,
                    "repeat": args.repeat,
                    "machine": machine(),
                    "baselines_gbps": base,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
