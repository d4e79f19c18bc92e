"""A fork server for the rank programs of tests/procs.py (``python -m tests.zygote``).

Each gloo rank of the suite used to be a fresh interpreter that imported torch, gcodec and its
rank program again: seconds of CPU per rank, for ranks whose scenario often takes less. This
server imports them once (:data:`PRELOAD`), then forks one child per rank, which runs its rank
program as ``python -m`` would (``runpy``, ``__main__``, the same ``sys.argv``, environment,
working folder and output file) and ends as that program's interpreter would: normal exit with
its finalization, ``os._exit``, a signal.

The server imports only: no thread, no torch operation, no process group and no gcodec call runs
before a fork, so that every child starts from the state a fresh interpreter has after the same
imports.

Protocol, one JSON object a line: on stdin the requests ``{"op": "start", "module", "argv", "env",
"cwd", "log", "append"}`` (answered ``{"pid": N}``; the output replaces ``log``, or is appended with
``append``) and ``{"op": "reap"}`` (answered by one ``{"exited": pid,
"code": returncode}`` per child that ended since, then ``{"ok": true}``); the server first writes
``{"ready": true}``, and ends when its stdin closes.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import sys

#: what the rank programs import (their own modules bring the rest), and the comma-separated modules
#: of ``GCODEC_TEST_PRELOAD`` (tests/procs.py start_program's ``preload``); a module that fails to
#: import here is imported by the rank that needs it, as before
PRELOAD = [
    "numpy",
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "gcodec",
    "gcodec.torch",
    "gcodec.torch.fsdp",  # imported on first use by gcodec.torch (FSDP2's modules): once here
    "tests.procs",
    "tests.transport_ranks.torch_program",
    "tests.transport_ranks.faults_torch",
    "tests.transport_ranks.diverge_torch",
    "tests.transport_ranks.fsdp_program",
    "tests.transport_ranks.diloco_torch",
    "tests.transport_ranks.adaptive_torch",
    "tests.transport_ranks.policy_torch",
    "tests.transport_ranks.engine_order",
    "tests.transport_ranks.resume_torch",
    "tests.transport_ranks.integ_common",
    "tests.transport_ranks.nanogpt_program",
]


def _send(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _child(req: dict) -> None:
    """In the forked child: become the rank program; returns only by raising SystemExit."""
    os.setpgid(0, 0)  # its own process group: the launcher can end it and whatever it starts
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | (os.O_APPEND if req.get("append") else os.O_TRUNC), 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    nul = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nul, 0)
    os.close(nul)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = [req["module"], *req["argv"]]
    from tests.procs import start_pulse

    start_pulse()
    runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def serve() -> None:
    from tests.procs import PRELOAD_ENV  # one of the preloads anyway

    extra = [m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m]
    for name in [*PRELOAD, *extra]:
        try:
            importlib.import_module(name)
        except Exception as e:  # the rank that needs it imports it (and reports what fails)
            print(f"zygote: preloading {name} failed: {e!r}", file=sys.stderr)
    gc.collect()
    gc.freeze()  # the preloaded objects stay out of the children's collections (no copy-on-write)
    threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []
    if len(threads) != 1:  # a thread would be missing in every child: start fresh interpreters
        _send({"ready": False, "why": f"{len(threads)} threads after the imports"})
        return
    _send({"ready": True})
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(0, 65536)
            if not chunk:
                return  # the test process closed our stdin (or ended)
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        req = json.loads(line)
        if req["op"] == "start":
            pid = os.fork()
            if pid == 0:
                _child(req)  # never returns: the child leaves through SystemExit or os._exit
            _send({"pid": pid})
        elif req["op"] == "reap":
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                _send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
            _send({"ok": True})


if __name__ == "__main__":
    serve()
