"""Cold start: the first encode of a codec in a fresh process, with an empty and with a filled Numba cache.

    python bench/cold_start.py                       # every registered codec at its defaults
    python bench/cold_start.py --codec fp16 --codec uniform --json out.json

Each measurement is a new Python process with its own ``NUMBA_CACHE_DIR``: ``empty`` starts from an
empty directory (everything this codec needs is compiled), ``filled`` runs again on the directory the
first process filled. ``import`` is ``import gcodec`` (Numba, NumPy); ``first encode`` and ``first
decode`` are the calls themselves on a 256 x 1024 float32 tensor. ``gcodec warmup`` fills the cache
for every codec at once (at install or image-build time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROBE = """
import sys, time
t0 = time.perf_counter()
import numpy as np
import gcodec
t1 = time.perf_counter()
x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
c = gcodec.get_codec(sys.argv[1])
b = c.encode(x)
t2 = time.perf_counter()
gcodec.decode(b)
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def probe(cid: str, cache: str) -> tuple[float, float, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, cid], capture_output=True, text=True, env=env, timeout=900, check=True
    )
    a, b, c = (float(v) for v in out.stdout.split())
    return a, b, c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codec", action="append", help="codec id (repeatable); default: all registered")
    ap.add_argument("--json", help="also write the results as JSON")
    args = ap.parse_args()
    import gcodec

    codecs = args.codec or gcodec.list_codecs()
    rows = []
    print("| codec | import s | encode, empty cache s | decode, empty s | encode, filled cache s | decode, filled s |")
    print("|---|---:|---:|---:|---:|---:|")
    for cid in codecs:
        with tempfile.TemporaryDirectory() as cache:
            _, enc0, dec0 = probe(cid, cache)
            imp1, enc1, dec1 = probe(cid, cache)
        rows.append(
            dict(
                codec=cid,
                import_s=imp1,
                encode_empty_s=enc0,
                decode_empty_s=dec0,
                encode_filled_s=enc1,
                decode_filled_s=dec1,
            )
        )
        print(f"| {cid} | {imp1:.2f} | {enc0:.1f} | {dec0:.1f} | {enc1:.2f} | {dec1:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": os.uname().machine, "load_average": os.getloadavg(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
