"""What the multi-process tests share: a free TCP port on 127.0.0.1 for a process group's rendezvous."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port that is free now (the OS picks it); the tests start their ranks right after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
