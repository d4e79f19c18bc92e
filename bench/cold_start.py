"""Cold start: the first encode of a codec in a fresh process, with an empty and with a filled Numba cache.

    python bench/cold_start.py                       # every registered codec at its defaults
    python bench/cold_start.py --codec fp16 --codec uniform --json out.json
    python bench/cold_start.py --codec '{"id": "uniform", "bits": 4}' --repeat 3
    python bench/cold_start.py --repeat 3 --baseline ../gcodec-old   # another checkout, interleaved

Each measurement is a new Python process with its own ``NUMBA_CACHE_DIR``: ``empty`` starts from an
empty directory (everything this codec needs is compiled), ``filled`` runs again on the directory the
first process filled. ``import`` is ``import gcodec`` (Numba, NumPy); ``first encode`` and ``first
decode`` are the calls themselves on a 256 x 1024 float32 tensor. With ``--repeat N`` every figure is
the median of N such pairs (each with a new empty directory). The quantizers compile one kernel per
setting (width, rule, rounding, scale type), so another setting of the same codec is a new cold
start. ``gcodec warmup`` fills the cache ahead of time (at install or image-build time).

``--baseline DIR`` probes the gcodec checkout in DIR as well, alternating with this one pair by pair,
so that the load of a shared machine hits both alike; its rows are marked ``(baseline)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import gcodec
t1 = time.perf_counter()
x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
a = sys.argv[1]
c = gcodec.get_codec(json.loads(a) if a.startswith("{") else a)
b = c.encode(x)
t2 = time.perf_counter()
gcodec.decode(b)
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def probe(cid: str, cache: str, root: str = HERE) -> tuple[float, float, float]:
    """(import, first encode, first decode) seconds in a new process importing gcodec from ``root``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, cid], capture_output=True, text=True, env=env, cwd=root, timeout=900, check=True
    )
    a, b, c = (float(v) for v in out.stdout.split())
    return a, b, c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--codec", action="append", help="codec id or JSON config (repeatable); default: every registered id"
    )
    ap.add_argument("--repeat", type=int, default=1, help="pairs of probes per codec; figures are medians")
    ap.add_argument("--baseline", metavar="DIR", help="also probe the gcodec checkout in DIR, interleaved")
    ap.add_argument("--json", help="also write the results as JSON")
    args = ap.parse_args()
    import gcodec

    codecs = args.codec or gcodec.list_codecs()
    rows = []
    load0 = os.getloadavg()
    print(f"# load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; median of {args.repeat}")
    print("| codec | import s | encode, empty cache s | decode, empty s | encode, filled cache s | decode, filled s |")
    print("|---|---:|---:|---:|---:|---:|")
    trees = [("", HERE)] + ([(" (baseline)", os.path.abspath(args.baseline))] if args.baseline else [])
    for cid in codecs:
        runs: dict[str, list[tuple[float, ...]]] = {tag: [] for tag, _ in trees}
        for _ in range(args.repeat):
            for tag, root in trees:
                with tempfile.TemporaryDirectory() as cache:
                    _, enc0, dec0 = probe(cid, cache, root)
                    imp1, enc1, dec1 = probe(cid, cache, root)
                runs[tag].append((imp1, enc0, dec0, enc1, dec1))
        for tag, root in trees:
            imp1, enc0, dec0, enc1, dec1 = (statistics.median(v) for v in zip(*runs[tag]))
            rows.append(
                dict(
                    codec=cid,
                    tree=root,
                    import_s=imp1,
                    encode_empty_s=enc0,
                    decode_empty_s=dec0,
                    encode_filled_s=enc1,
                    decode_filled_s=dec1,
                    runs=runs[tag],
                )
            )
            print(f"| {cid}{tag} | {imp1:.2f} | {enc0:.1f} | {dec0:.1f} | {enc1:.2f} | {dec1:.2f} |", flush=True)
    load1 = os.getloadavg()
    print(f"# load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": os.uname().machine, "load_average": [load0, load1], "repeat": args.repeat, "rows": rows},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
