"""Child process of tests/test_out_of_memory.py: the first decode of every codec in a fresh process
whose address space is capped right after ``import gcodec``.

    python tests/oom_cold_worker.py PAYLOAD_DIR HEADROOM_BYTES

Nothing is warmed up: each codec's first decode loads its kernels from Numba's cache (which the
parent filled) and starts gcodec's kernel threads under the cap (``RLIMIT_AS``, soft limit, at what
the process maps after its imports plus ``HEADROOM_BYTES``). Prints one JSON line
``[[payload, outcome, message], ...]``: outcome ``"ok"``, a GcodecError class name, or
``"ESCAPED <class>"`` for anything else.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import gcodec


def main() -> None:
    folder, headroom = Path(sys.argv[1]), int(sys.argv[2])
    payloads = sorted(folder.glob("*.gcd"))
    blobs = [(p.stem, p.read_bytes()) for p in payloads]
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, resource.RLIM_INFINITY))
    rows = []
    for name, blob in blobs:
        try:
            gcodec.decode(blob)
            rows.append([name, "ok", ""])
        except gcodec.GcodecError as e:
            rows.append([name, type(e).__name__, str(e)[:300]])
        except BaseException as e:  # what the test refuses
            rows.append([name, f"ESCAPED {type(e).__name__}", str(e)[:300]])
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
