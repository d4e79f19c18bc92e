"""Child process of tests/test_out_of_memory.py: decode and validate with little memory left.

    python tests/oom_worker.py ROOT HEADROOM_BYTES

For each case it builds the payload and the ``out=`` array first, warms the same codec and dtype up
on a small payload (Numba compiles kernels on first use, and compiling needs memory of its own),
then caps the process's address space (``RLIMIT_AS``, soft limit only, raised again after the call)
at what it maps now plus ``HEADROOM_BYTES``, and calls ``gcodec.validate``, ``gcodec.decode`` and
``gcodec.decode(out=...)``. The cap is measured here, in the child, because Numba and LLVM map
hundreds of MiB of address space that the parent cannot predict. Prints one JSON line:
``[[case, call, outcome, message], ...]`` with outcome ``"ok"``, a GcodecError class name, or
``"ESCAPED <class>"`` for anything else.
"""

from __future__ import annotations

import json
import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

N = 1 << 26  # declared elements of the large cases: 256 MiB of float32
SIGN = {"codec": "sign", "params": {"group_size": 256}, "version": 1}  # 1-bit nested values or factors
ANY_RATE = {"min_compression_rate": 0.0}  # powersgd: low rank whatever the shape

# name -> (codec, shape, dtype, wire params, constructor keywords, headroom override in bytes or None).
# The comments say what decoding allocates beyond the output (docs/limits.md's scratch) and so
# what the cap refuses.
CASES: dict[str, tuple[str, list[int], str, dict[str, Any], dict[str, Any], int | None]] = {
    "fp16": ("fp16", [N], "float32", {}, {}, None),  # no scratch
    "bf16 tensor": ("bf16", [N // 2], "bfloat16", {}, {}, None),  # a float32 staging buffer of 4 numel
    "uniform 2-bit": ("uniform", [N], "float32", {}, {"bits": 2}, None),
    "uniform group_size 1": ("uniform", [N // 4], "float32", {}, {"group_size": 1}, None),  # 64 MiB of scales
    "qsgd": ("qsgd", [N], "float32", {}, {}, None),
    "terngrad": ("terngrad", [N], "float32", {}, {}, None),
    "sign group_size 1": ("sign", [N // 4], "float32", {}, {"group_size": 1}, None),  # 64 MiB of scales
    # 8k of int64 indices and 4k of decoded values (nested 1-bit values: a 10 MiB payload)
    "topk k=numel sign values": ("topk", [N], "float32", {"k": N, "index_bytes": 0, "values": SIGN}, {}, None),
    "topk raw k=numel/16": ("topk", [N], "float32", {"k": N // 16, "index_bytes": 0}, {}, None),
    "topk bf16 raw k=numel/2": ("topk", [N // 2], "bfloat16", {"k": N // 4, "index_bytes": 0}, {}, None),
    "randomk bf16 raw k=numel/2": ("randomk", [N // 2], "bfloat16", {"k": N // 4}, {}, None),  # float32 values
    "threshold k=numel sign values": (
        "threshold",
        [N],
        "float32",
        {"k": N, "threshold": 0.0, "index_bytes": 0, "values": SIGN},
        {},
        None,
    ),
    # 8k of random words (2k uint32), 8k of indices
    "randomk raw k=numel/8": ("randomk", [N], "float32", {"k": N // 8}, {}, None),
    "randomk k=numel-1 sign values": ("randomk", [N], "float32", {"k": N - 1, "values": SIGN}, {}, None),
    # k = 1: the n-bit bitmap (8 MiB) is the only temporary; a headroom below it
    "randomk bitmap": ("randomk", [N], "float32", {"k": 1}, {}, 4 << 20),
    # float64 output: P widened to float64 (128 MiB), Q transposed; m*n*rank = 2**32 multiply-adds
    "powersgd f64 rank 64": ("powersgd", [1 << 18, 1 << 8], "float64", {"rank": 64}, ANY_RATE, None),
    "powersgd rank 4": ("powersgd", [1 << 13, 1 << 13], "float32", {"rank": 4}, ANY_RATE, None),
    "powersgd sign factors": (
        "powersgd",
        [1 << 20, 1 << 6],
        "float32",
        {"rank": 64, "p": SIGN, "q": SIGN},
        ANY_RATE,
        None,
    ),
}

CALLS = ("validate", "decode", "decode out=")


def _vm_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) << 10  # type: ignore[union-attr]


def _out_for(gcodec: Any, b: bytes) -> Any:
    info = gcodec.api.inspect_header(b)
    arrays = {t.name: np.zeros(t.shape, t.dtype) for t in info.tensors}
    return arrays if info.is_bundle else arrays[None]


def _call(gcodec: Any, call: str, b: bytes, out: Any) -> Any:
    if call == "validate":
        return gcodec.validate(b)
    if call == "decode":
        return gcodec.decode(b)
    return gcodec.decode(b, out=out)


def _capped(headroom: int, fn: Callable[..., Any], *args: Any) -> tuple[str, str]:
    """``fn(*args)`` with the address space capped ``headroom`` bytes above what is mapped now."""
    import gcodec

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + headroom
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        fn(*args)
        return "ok", ""
    except gcodec.GcodecError as e:
        return type(e).__name__, str(e)[:300]
    except BaseException as e:  # what the test looks for
        return f"ESCAPED {type(e).__name__}", str(e)[:300]
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def main(root: str, headroom: int) -> None:
    sys.path.insert(0, root)
    import gcodec
    from tests.codec_kit import declaring

    gcodec.set_num_threads(1)  # no thread pool to start (and map stacks for) under the cap
    results = []
    for path in sorted((Path(root) / "specs" / "vectors" / "valid").glob("*.gcd")):
        b = path.read_bytes()
        out = _out_for(gcodec, b)
        for call in CALLS:
            _call(gcodec, call, b, out)  # warm-up: compile, fill caches
            outcome, msg = _capped(headroom, _call, gcodec, call, b, out)
            results.append([f"vector {path.stem}", call, outcome, msg])
    for name, (codec, shape, dtype, params, kw, own) in CASES.items():
        small_shape = [8, 8] if codec == "powersgd" else [64]
        small_params = {k: min(v, 8) if k == "k" else v for k, v in params.items()}
        if codec == "powersgd":
            small_params["rank"] = 2
        small = declaring(codec, small_shape, dtype, small_params, **kw)
        b = declaring(codec, shape, dtype, params, **kw)
        for call in CALLS:
            out = _out_for(gcodec, b) if call == "decode out=" else None
            _call(gcodec, call, small, _out_for(gcodec, small))
            outcome, msg = _capped(own or headroom, _call, gcodec, call, b, out)
            results.append([name, call, outcome, msg])
            out = None  # free it before the next call measures what is mapped
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
