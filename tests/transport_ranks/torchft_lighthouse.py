"""torchft's lighthouse in a process of its own (what its ``torchft_lighthouse`` console script
runs, through ``torchft.coordination.LighthouseServer``, so that a test needs no script on its
PATH), until it is killed::

    python -m tests.transport_ranks.torchft_lighthouse PORT MIN_REPLICAS JOIN_TIMEOUT_MS HEARTBEAT_TIMEOUT_MS
"""

from __future__ import annotations

import sys
import time

if __name__ == "__main__":
    from torchft.coordination import LighthouseServer

    port, min_replicas, join_ms, heartbeat_ms = (int(a) for a in sys.argv[1:5])
    server = LighthouseServer(
        bind=f"[::]:{port}", min_replicas=min_replicas, join_timeout_ms=join_ms, heartbeat_timeout_ms=heartbeat_ms
    )
    print("lighthouse at", server.address(), flush=True)
    while True:
        time.sleep(3600)
