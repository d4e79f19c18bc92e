"""What the multi-process tests share: a free TCP port for a process group's rendezvous, starting
the ranks of a rank program under a watchdog, and reading the checks they wrote.

Deadlines catch hangs; they do not time the machine. Every process started here runs under a
:class:`Watch`:

* a job that stops making progress for :data:`STALL_S` seconds (times :func:`timeout_scale`) is
  stopped. Progress is CPU time spent by the job's processes while their main thread moves: each
  rank program runs a *pulse* thread (:func:`start_pulse`) that samples its main thread's stack
  twice a second and counts the CPU time of the samples whose stack changed, so that a rank spinning
  in one MPI call (MPICH polls) or blocked in one gloo collective makes none, and a rank that keeps
  computing, on however loaded a machine, keeps its job alive; processes without a pulse count
  their CPU time;
* a job that runs past its caller's ``timeout`` counted in idle-machine seconds (wall time divided
  by the load per core, at least 1), twice over, is stopped too: a livelock ends in bounded time.

A stopped job's report names every rank and where its main thread was, with every thread's
Python stack (``faulthandler``, on SIGUSR1, before the kill), and the tail of each rank's output.
``GCODEC_TEST_TIMEOUT_SCALE`` (a number, default 1) scales both limits, and the process group
timeouts of :func:`start_gloo`.

Rank programs of :func:`run_ranks` start as children of a fork server (tests/zygote.py) that has
imported torch, gcodec and the rank programs' modules once, instead of a fresh interpreter that
imports them again (seconds of CPU per rank); ``GCODEC_TEST_FORKSERVER=0`` starts each rank with
``python -m`` instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: a number >= 1 that multiplies every limit here (a slow or shared machine)
TIMEOUT_SCALE_ENV = "GCODEC_TEST_TIMEOUT_SCALE"
#: the folder where a rank program's pulse thread writes (set by the launchers here)
PULSE_ENV = "GCODEC_TEST_PULSE_DIR"
#: the rank number run_ranks gives each rank's environment (for the watchdog's report)
RANK_ENV = "GCODEC_TEST_RANK"
#: ``0``: start every rank program as a fresh interpreter instead of from the fork server
FORKSERVER_ENV = "GCODEC_TEST_FORKSERVER"
#: modules a fork server imports besides its own list (tests/zygote.py), comma-separated
PRELOAD_ENV = "GCODEC_TEST_PRELOAD"
#: seconds a job may go without progress before it is stopped (times the scale)
STALL_S = 60.0
#: CPU seconds of progress that reset the stall clock
PROGRESS_CPU_S = 0.25
#: seconds between two samples of a rank's main thread
PULSE_S = 0.5
#: the floor of start_gloo's process-group timeout (times the scale): a hang is the watchdog's
#: to catch (with every rank's stack); the group's timeout only has to outlast a slow peer
GLOO_TIMEOUT_FLOOR_S = 120.0


def timeout_scale() -> float:
    """``GCODEC_TEST_TIMEOUT_SCALE`` (at least 1; 1 when unset or not a number)."""
    try:
        return max(1.0, float(os.environ.get(TIMEOUT_SCALE_ENV, "1")))
    except ValueError:
        return 1.0


def machine_slowdown() -> float:
    """How much slower than idle the machine runs a process now: the 1-minute load average per
    core, at least 1."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return 1.0


def scaled(seconds: float) -> float:
    """An idle-machine limit for the machine as it is now: ``seconds`` times :func:`timeout_scale` and
    :func:`machine_slowdown` (for the few limits that no watchdog can replace)."""
    return seconds * timeout_scale() * machine_slowdown()


def free_port() -> int:
    """A port that is free now (the OS picks it); the tests start their ranks right after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- in a rank program: the pulse ---------------------------------------------------------------
_PULSE_STARTED = False
_PULSE_RECORD = 4096  # bytes: one fixed-size record rewritten in place (one open file, always)


def start_pulse(directory: str | os.PathLike[str] | None = None) -> None:
    """In a rank program: start the pulse thread that the launcher's :class:`Watch` reads, and have
    SIGUSR1 write every thread's Python stack to ``<dir>/<pid>.stack``. Does nothing without a
    folder (``GCODEC_TEST_PULSE_DIR``) or when already started. The thread keeps its two files
    open for the life of the process (no file descriptor comes and goes while a program counts
    its own), and samples the main thread every :data:`PULSE_S` seconds."""
    global _PULSE_STARTED
    d = directory if directory is not None else os.environ.get(PULSE_ENV)
    if _PULSE_STARTED or not d:
        return
    import faulthandler

    _PULSE_STARTED = True
    pid = os.getpid()
    stack = open(Path(d) / f"{pid}.stack", "w")
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True, chain=False)
    fd = os.open(Path(d) / f"{pid}.pulse", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t = threading.Thread(target=_pulse_loop, args=(fd, pid, stack), name="gcodec-test-pulse", daemon=True)
    t.start()


def _pulse_loop(fd: int, pid: int, stack: Any) -> None:
    """Every :data:`PULSE_S` seconds: the stacks of the process's threads (this one left out), down to
    the bytecode instruction of each frame; the CPU time of an interval counts as progress
    (``busy``) when some stack differs from the last sample's. A rank blocked in a collective, or
    spinning in one (MPICH polls), makes none; one that runs Python code makes some with nearly
    every sample, and one in a single long call (a compile, a large kernel) again when it returns."""
    me = threading.get_ident()
    main = threading.main_thread().ident
    label = " ".join(sys.argv[1:])[-300:]
    rank = os.environ.get(RANK_ENV, os.environ.get("PMI_RANK"))  # PMI_RANK: under mpiexec (hydra)
    prev: tuple = ()
    cpu0 = time.process_time()
    busy = 0.0
    samples = 0
    while True:
        sig = []
        where: list[str] = []
        for ident, frame in sorted(sys._current_frames().items()):
            if ident == me:
                continue
            f: Any = frame
            while f is not None:
                sig.append((ident, f.f_code.co_filename, f.f_code.co_name, f.f_lasti))
                if ident == main and len(where) < 8:
                    where.append(f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}")
                f = f.f_back
        del frame, f
        cpu = time.process_time()
        if tuple(sig) != prev:
            busy += cpu - cpu0
        cpu0, prev = cpu, tuple(sig)
        samples += 1
        rec = {"pid": pid, "rank": rank, "argv": label, "busy": busy, "samples": samples, "where": where}
        data = json.dumps(rec).encode()[: _PULSE_RECORD - 1].ljust(_PULSE_RECORD - 1) + b"\n"
        os.pwrite(fd, data, 0)
        time.sleep(PULSE_S)


# ---- in the test process: watching a job --------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds) of every process we can see (Linux /proc; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[int, float]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            out[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


def _tree(roots: Iterable[int], table: dict[int, tuple[int, float]]) -> list[int]:
    """``roots`` (those still alive) and all their descendants."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _job_table(roots: Iterable[int]) -> dict[int, tuple[int, float]]:
    """:func:`_proc_table` of ``roots`` and their descendants only, found through
    ``/proc/<pid>/task/<tid>/children`` (a whole scan of /proc where the kernel has no such file)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[int, float]] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tids = os.listdir(f"/proc/{pid}/task")
        except (OSError, IndexError):
            continue
        out[pid] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except FileNotFoundError:  # no such file on this kernel, or the thread just ended
                if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                    continue
                table = _proc_table()
                return {p: table[p] for p in _tree(roots, table)}
            except OSError:
                continue
    return out


class Stalled(AssertionError):
    """A job stopped by its :class:`Watch`; the message is the report."""


class Watch:
    """Decides when a job of processes has stopped making progress or run out of time.

    ``roots()`` gives the job's top processes (their descendants are the job too); ``pulses`` is
    the folder its rank programs' pulse threads write to. :meth:`poll` returns ``None`` while the
    job may go on, else why it must stop. Progress between two polls: for a process with a pulse
    that sampled meanwhile, the CPU time it counted as progress; for one whose pulse could not run
    (its main thread held the GIL all along) or that has none, its CPU time."""

    def __init__(
        self, what: str, timeout: float, pulses: Path, roots: Callable[[], list[int]], stall: float = STALL_S
    ) -> None:
        scale = timeout_scale()
        self.what, self.pulses, self.roots = what, pulses, roots
        self.stall_s = stall * scale
        self.budget = 2.0 * timeout * scale  # idle-machine seconds
        self.used = 0.0
        self.start = self.last = self.mark_t = time.monotonic()
        self.mark = 0.0
        self.progress = 0.0  # CPU seconds of progress of the job's processes so far
        self.cpu: dict[int, float] = {}  # pid -> its CPU seconds at the last poll
        self.pulse: dict[int, tuple[int, float]] = {}  # pid -> its pulse's (samples, busy) then

    def pulse_records(self) -> dict[int, dict]:
        out = {}
        for p in self.pulses.glob("*.pulse"):
            try:
                rec = json.loads(p.read_bytes().decode().strip() or "null")
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict):
                out[int(rec["pid"])] = rec
        return out

    def poll(self) -> str | None:
        now = time.monotonic()
        self.used += (now - self.last) / machine_slowdown()
        self.last = now
        pulses = self.pulse_records()
        table = _job_table(self.roots())
        for pid in set(table) | set(pulses):
            cpu = table[pid][1] if pid in table else self.cpu.get(pid, 0.0)
            d_cpu = max(0.0, cpu - self.cpu.get(pid, 0.0))
            self.cpu[pid] = cpu
            rec = pulses.get(pid)
            if rec is None:
                self.progress += d_cpu  # no pulse (yet): its CPU time
                continue
            samples, busy = self.pulse.get(pid, (0, 0.0))
            if rec["samples"] > samples:  # the pulse ran: what it counted as progress
                self.progress += max(0.0, float(rec["busy"]) - busy)
            else:  # it could not run (a long call holding the GIL, a starved process): CPU time
                self.progress += d_cpu
            self.pulse[pid] = (int(rec["samples"]), float(rec["busy"]))
        if self.progress - self.mark >= PROGRESS_CPU_S:
            self.mark, self.mark_t = self.progress, now
        if now - self.mark_t > self.stall_s:
            return f"no progress for {now - self.mark_t:.0f} s (limit {self.stall_s:.0f} s)"
        if self.used > self.budget:
            return (
                f"ran {now - self.start:.0f} s, {self.used:.0f} s in idle-machine time (load-scaled), "
                f"over its limit of {self.budget:.0f} s"
            )
        return None

    def dump(self) -> dict[int, str]:
        """Ask every live rank with a pulse for its threads' stacks (SIGUSR1: pid -> the stacks), and
        abort the other Python processes of the job (SIGABRT: with faulthandler on, as
        :func:`child_env` has it, each prints its stacks to its own stderr)."""
        table = _job_table(self.roots())
        alive = set(table)
        asked = []
        for pid in self.pulse_records():
            if pid in alive:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)
                    asked.append(pid)
        pulsed = set(self.pulse_records())
        for pid in alive - pulsed:  # no pulse: a Python process with faulthandler on (child_env)
            with contextlib.suppress(OSError):  # prints its stacks to its stderr on SIGABRT
                if "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
                    os.kill(pid, signal.SIGABRT)
        out: dict[int, str] = {}
        deadline = time.monotonic() + 3.0 * timeout_scale()
        while asked and time.monotonic() < deadline:
            time.sleep(0.2)
            for pid in asked:
                with contextlib.suppress(OSError):
                    out[pid] = (self.pulses / f"{pid}.stack").read_text()
            if all(out.get(pid) for pid in asked):
                break
        return out

    def report(self, why: str, stacks: dict[int, str], logs: dict[str, str]) -> str:
        lines = [f"{self.what}: stopped by the test watchdog: {why}; load average {_load()}."]
        recs = self.pulse_records()
        for pid, rec in sorted(recs.items()):
            who = f"rank {rec['rank']}: " if rec.get("rank") is not None else ""
            lines.append(f"- pid {pid} ({who}{rec['argv']}): main thread at " + " <- ".join(rec["where"]))
        for pid, text in sorted(stacks.items()):
            lines.append(f"--- Python stacks of pid {pid} (faulthandler):\n{text[-6000:]}")
        for name, text in logs.items():
            lines.append(f"--- {name} (tail):\n{text[-3000:]}")
        return "\n".join(lines)


def _load() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def _kill_tree(roots: Iterable[int]) -> None:
    pids = list(_job_table(roots)) or list(roots)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a test's child processes: the test process's, the repository first on
    the module path, one kernel thread, faulthandler on (a fatal signal prints every thread's
    stack), and ``extra``."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
        **extra,
    }


def own_env(**extra: str) -> dict[str, str]:
    """The test process's environment as it is, faulthandler on, and ``extra`` (for a child that
    must see what a user's command would: no module path of the repository's)."""
    return {**os.environ, "PYTHONFAULTHANDLER": "1", **extra}


def run_ranks(
    module: str, args: Sequence[str], world: int, timeout: float, logs: Path, *, stall: float = STALL_S
) -> list[int]:
    """Run ``python -m module *args RANK WORLD PORT`` for every rank on 127.0.0.1 and return their exit
    codes. The job runs under a :class:`Watch` (``timeout``: what it may take on an idle machine,
    which the watch doubles and scales by the load); a stopped job raises :class:`Stalled` with every
    rank's stacks. Each rank's output goes to ``logs``/``<name>_rank<r>.log``, and its tail is
    printed when any rank failed."""
    port = free_port()
    name = "_".join([module.rsplit(".", 1)[-1], *(a for a in args if "/" not in a)])
    paths = [logs / f"{name}{world}_rank{r}.log" for r in range(world)]
    with tempfile.TemporaryDirectory(prefix="pulse-") as pulses:
        env = child_env(**{PULSE_ENV: pulses})
        argvs = [[*args, str(r), str(world), str(port)] for r in range(world)]
        ranks: list[_Rank] = []
        try:
            for r, (argv, path) in enumerate(zip(argvs, paths)):
                renv = {**env, RANK_ENV: str(r)}
                server = _forkserver(env, r)
                ranks.append(server.start(module, argv, renv, path) if server else _Popen(module, argv, renv, path))
            watch = Watch(
                f"{module} {' '.join(args)} on {world} ranks", timeout, Path(pulses), lambda: ranks_pids(ranks), stall
            )
            _wait_watched(
                watch,
                ranks,
                lambda: ranks_pids(ranks),
                lambda: {p.name: p.read_text(errors="replace") for p in paths if p.exists()},
            )
        finally:
            live = [r.pid for r in ranks if r.poll() is None]
            if live:
                _kill_tree(live)
                for r in ranks:
                    r.wait()
    codes = [int(r.poll()) for r in ranks]  # type: ignore[arg-type]
    if any(codes):
        for r, p in enumerate(paths):
            print(f"--- rank {r}:", p.read_text(errors="replace")[-3000:])
    return codes


def _wait_watched(
    watch: Watch, procs: Sequence[Any], pids: Callable[[], list[int]], texts: Callable[[], dict[str, str]]
) -> None:
    """Wait for ``procs`` (ranks or Popen objects) to end under ``watch``; when it calls a stall,
    take every process's stacks, kill the job's process tree (``pids``), and raise
    :class:`Stalled` with the watch's report and ``texts()`` (the job's output)."""
    why = None
    while any(p.poll() is None for p in procs):
        why = watch.poll()
        if why:
            break
        time.sleep(0.5)
    if why:
        stacks = watch.dump()
        _kill_tree(pids())
        for p in procs:
            p.wait()
        raise Stalled(watch.report(why, stacks, texts()))


def start_program(
    module: str, args: Sequence[str], log: Path, *, preload: Sequence[str] = (), slot: int = 0
) -> subprocess.Popen | Forked:
    """Start ``python -m module *args`` on its own (a test that kills, stops or restarts it), its
    output appended to ``log``, one kernel thread; the caller waits for it and kills it at its
    deadline. The path holds this checkout, then whatever the test's own ``PYTHONPATH`` held (where
    an optional extra such as torchft may have been installed). Faulthandler is on: SIGABRT makes it
    print every thread's stack to ``log`` (what :func:`abort_for_stacks` asks of a hung one).

    With ``preload`` (modules the program imports, e.g. torchft's), the program is forked from a
    fork server (tests/zygote.py) that imported them and its usual modules once, instead of a fresh
    interpreter paying seconds of imports at every start; ``slot`` picks the server, as a rank
    number does for :func:`run_ranks` (programs that talk to each other come from different
    servers: their string hash seeds differ, as separate interpreters' do). The result then has the
    :class:`subprocess.Popen` methods a test uses (``pid``, ``poll``, ``wait``, ``returncode``,
    ``send_signal``, ``kill``)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    if preload:
        env[PRELOAD_ENV] = ",".join(preload)
        server = _forkserver(env, slot)
        if server is not None:
            return server.start(module, args, env, log, append=True)
    with open(log, "a") as f:
        cmd = [sys.executable, "-m", module, *args]
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def ranks_pids(ranks: Sequence[_Rank]) -> list[int]:
    return [r.pid for r in ranks if r.poll() is None]


class _Rank:
    pid: int

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.05)
        return code


class _Popen(_Rank):
    """A rank started as ``python -m tests.rank_boot -m MODULE ARGS`` (a fresh interpreter)."""

    def __init__(self, module: str, argv: Sequence[str], env: dict[str, str], log: Path) -> None:
        with open(log, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.rank_boot", "-m", module, *argv],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()


def abort_for_stacks(procs: Iterable[subprocess.Popen | Forked | None], wait_s: float = 3.0) -> None:
    """Send SIGABRT to those of ``procs`` still running (started with faulthandler on, as by
    :func:`start_program`: each prints every thread's stack to its output and dies), and give them
    ``wait_s`` seconds to do so: for a test's report of a job that did not finish in time."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        with contextlib.suppress(OSError):
            p.send_signal(signal.SIGABRT)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(p.poll() is None for p in live):
        time.sleep(0.1)


#: the processes run_all started that have not ended: killed when this process exits (a background
#: job still running when the session ends)
_LIVE: set[subprocess.Popen] = set()


@atexit.register
def _kill_live() -> None:
    for p in list(_LIVE):
        if p.poll() is None:
            _kill_tree([p.pid])


def run(
    cmd: Sequence[str],
    timeout: float,
    *,
    cwd: str | os.PathLike[str] = ROOT,
    env: dict[str, str] | None = None,
    input: str | bytes | None = None,
    text: bool = True,
    check: bool = False,
    what: str | None = None,
    stall: float = STALL_S,
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=text, input=input, check=check)`` under a
    :class:`Watch` (``timeout`` as for :func:`run_ranks`); a stopped job raises :class:`Stalled`
    with its processes' stacks and output. ``env`` defaults to :func:`child_env`; Python children
    started through ``tests.rank_boot`` (as :func:`run_mpi` does) report their pulse, the others
    their CPU time."""
    (done,) = run_all(
        [cmd], timeout, cwd=cwd, envs=None if env is None else [env], inputs=[input], text=text, what=what, stall=stall
    )
    if check:
        done.check_returncode()
    return done


def run_all(
    cmds: Sequence[Sequence[str]],
    timeout: float,
    *,
    cwd: str | os.PathLike[str] = ROOT,
    envs: Sequence[dict[str, str]] | None = None,
    inputs: Sequence[str | bytes | None] | None = None,
    text: bool = True,
    merge_stderr: bool = False,
    what: str | None = None,
    stall: float = STALL_S,
) -> list[subprocess.CompletedProcess]:
    """:func:`run` of several commands at once, as one job (the processes of a job that talk to
    each other: a hang of one holds the others). ``merge_stderr``: each one's stderr goes to its
    stdout, as ``stderr=subprocess.STDOUT`` would have it."""
    with tempfile.TemporaryDirectory(prefix="pulse-") as pulses:
        folder = Path(pulses)
        procs: list[subprocess.Popen] = []
        outs = [folder / f"stdout{i}" for i in range(len(cmds))]
        errs = [folder / f"stderr{i}" for i in range(len(cmds))]
        try:
            for i, cmd in enumerate(cmds):
                env = {**(envs[i] if envs is not None else child_env()), PULSE_ENV: pulses}
                data = inputs[i] if inputs is not None else None
                with open(outs[i], "wb") as out, open(errs[i], "wb") as err:
                    proc = subprocess.Popen(
                        list(cmd),
                        cwd=cwd,
                        env=env,
                        stdout=out,
                        stderr=out if merge_stderr else err,
                        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                    )
                procs.append(proc)
                _LIVE.add(proc)
                if data is not None:
                    assert proc.stdin is not None
                    with contextlib.suppress(BrokenPipeError):
                        proc.stdin.write(data.encode() if isinstance(data, str) else data)
                        proc.stdin.close()
            label = what or " ".join(map(str, cmds[0]))[:200]
            watch = Watch(label, timeout, folder, lambda: [p.pid for p in procs if p.poll() is None], stall)

            def texts() -> dict[str, str]:
                out = {}
                for i in range(len(cmds)):
                    out[f"stdout of command {i}"] = outs[i].read_text(errors="replace")
                    out[f"stderr of command {i}"] = errs[i].read_text(errors="replace")
                return out

            _wait_watched(watch, procs, lambda: [p.pid for p in procs], texts)
        finally:
            live = [p.pid for p in procs if p.poll() is None]
            if live:
                _kill_tree(live)
            for p in procs:
                p.wait()
                _LIVE.discard(p)
        done = []
        for i, (cmd, p) in enumerate(zip(cmds, procs)):
            stdout: str | bytes = outs[i].read_bytes()
            stderr: str | bytes = errs[i].read_bytes()
            if text:
                stdout, stderr = stdout.decode(errors="replace"), stderr.decode(errors="replace")  # type: ignore[union-attr]
            done.append(subprocess.CompletedProcess(list(cmd), p.returncode, stdout, stderr))
    return done


class _Background:
    """:func:`run` of one command, queued on a background thread of this process (one thread: the
    queued jobs run one after another); :meth:`result` waits for it and returns what :func:`run`
    returned (or raises what it raised)."""

    queue: list[_Background] = []
    lock = threading.Condition()
    thread: threading.Thread | None = None

    def __init__(self, cmd: Sequence[str], timeout: float, kw: dict[str, Any]) -> None:
        self.args = (cmd, timeout, kw)
        self.done: subprocess.CompletedProcess | None = None
        self.error: BaseException | None = None
        self.finished = threading.Event()
        with _Background.lock:
            _Background.queue.append(self)
            if _Background.thread is None:
                _Background.thread = threading.Thread(target=_Background._serve, daemon=True)
                _Background.thread.start()
            _Background.lock.notify()

    @staticmethod
    def _serve() -> None:
        while True:
            with _Background.lock:
                while not _Background.queue:
                    _Background.lock.wait()
                job = _Background.queue.pop(0)
            cmd, timeout, kw = job.args
            try:
                job.done = run(cmd, timeout, **kw)
            except BaseException as e:  # handed to whoever waits for the result
                job.error = e
            job.finished.set()

    def result(self) -> subprocess.CompletedProcess:
        with _Background.lock:  # not started yet: this one first (its module is waiting for it)
            if self in _Background.queue:
                _Background.queue.remove(self)
                _Background.queue.insert(0, self)
        self.finished.wait()
        if self.error is not None:
            raise self.error
        assert self.done is not None
        return self.done


_BACKGROUND: dict[str, _Background] = {}


def simulator_job(script: str, request: Any) -> tuple[list[str], dict[str, Any]]:
    """The command and :func:`run` arguments of a CUDA-simulator worker script of tests/ that
    reads ``request`` as JSON on its stdin (Numba's simulator on, faulthandler on, this checkout
    first on the path)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(Path(__file__).with_name(script))]
    return cmd, {"input": json.dumps(request), "env": env, "cwd": ROOT}


def run_early(key: str, cmd: Sequence[str], timeout: float, **kw: Any) -> None:
    """Queue :func:`run` of ``cmd`` in the background now (the queued jobs run one at a time, in
    order), unless ``key`` was queued already; a module's fixture later takes its result with
    :func:`run_once` and the same arguments. For the long single-process jobs (the CUDA simulator's
    workers), so that they run on the core the serial tests leave idle instead of holding the
    session up when their module comes."""
    if key not in _BACKGROUND:
        _BACKGROUND[key] = _Background(cmd, timeout, kw)


def run_once(key: str, cmd: Sequence[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    """The result of :func:`run_early` of ``key`` (queued now, first in line, if it was not),
    under the same watchdog as :func:`run`."""
    run_early(key, cmd, timeout, **kw)
    return _BACKGROUND[key].result()


def run_mpi(
    module: str,
    args: Sequence[str],
    ranks: int,
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    stall: float = STALL_S,
) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n ranks python -m module *args`` with the venv's mpiexec (the mpich wheel), one
    kernel thread per rank unless ``env`` says otherwise (default: :func:`child_env` with
    ``GCODEC_NUM_THREADS=1``), output captured, under a :class:`Watch` (see :func:`run`)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        raise AssertionError(f"mpiexec not found next to {sys.executable}: install the 'mpi' extra (mpich)")
    if env is None:
        env = child_env(GCODEC_NUM_THREADS="1")
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "tests.rank_boot", "-m", module, *args]
    return run(cmd, timeout, env=env, what=f"mpiexec -n {ranks} {module} {' '.join(args)}", stall=stall)


def checks_of(outdir: Path, ranks: Iterable[int]) -> list[dict]:
    """The checks every rank wrote to ``outdir/rank<r>.json``; fails on a missing file or a failed check."""
    out = []
    for r in ranks:
        f = outdir / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no results"
        out += [{**c, "rank": r} for c in json.loads(f.read_text())]
    failed = [c for c in out if not c["ok"]]
    assert not failed, "\n".join(f"rank {c['rank']}: {c['name']}: {c['detail']}" for c in failed)
    return out


# ---- the fork server -----------------------------------------------------------------------------
class _Server:
    """The test process's end of tests/zygote.py: one per environment it was started with."""

    def __init__(self, env: dict[str, str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="gcodec-zygote-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote"],
            cwd=ROOT,
            env={k: v for k, v in env.items() if k != PULSE_ENV},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.lock = threading.Lock()
        self.codes: dict[int, int] = {}
        self.buf = b""
        ready = self._read()  # the preloads are imported: the server is ready
        if ready.get("ready") is not True:
            raise RuntimeError(f"the fork server did not start: {ready}")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server ended: " + Path(self.log.name).read_text()[-3000:])
        return json.loads(line)

    def _ask(self, req: dict) -> dict:
        assert self.proc.stdin is not None
        with self.lock:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            while True:
                msg = self._read()
                if "exited" in msg:
                    self.codes[msg["exited"]] = msg["code"]
                    continue
                return msg

    def start(self, module: str, argv: Sequence[str], env: dict[str, str], log: Path, append: bool = False) -> Forked:
        msg = self._ask(
            {
                "op": "start",
                "module": module,
                "argv": list(argv),
                "env": env,
                "cwd": str(ROOT),
                "log": str(log),
                "append": append,
            }
        )
        return Forked(self, int(msg["pid"]))

    def code(self, pid: int) -> int | None:
        if pid not in self.codes:
            self._ask({"op": "reap"})
        return self.codes.get(pid)

    def alive(self) -> bool:
        return self.proc.poll() is None


class Forked(_Rank):
    """A child of a fork server, with the :class:`subprocess.Popen` methods the tests use."""

    def __init__(self, server: _Server, pid: int) -> None:
        self.server, self.pid = server, pid

    def poll(self) -> int | None:
        return self.server.code(self.pid)

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid that ended (and may have been given to another)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_SERVERS: dict[tuple[tuple, int], _Server] = {}
_VOLATILE = ("PYTEST_CURRENT_TEST", PULSE_ENV, RANK_ENV)


def _env_key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in _VOLATILE))


def _forkserver(env: dict[str, str], rank: int) -> _Server | None:
    """The fork server of rank ``rank`` for ``env`` (started on first use), or None: turned off, not
    on Linux, or it failed to start (then the rank starts as a fresh interpreter).

    One server per rank number: the children of one server share its interpreter's state from
    before the fork, among it the string hash seed (``PYTHONHASHSEED`` unset: random per
    interpreter) and so the iteration order of every set of strings. Ranks started by torchrun or
    mpiexec are separate interpreters whose orders differ; so do the ranks of one job here, as
    each rank comes from its own server (a rank that decides what to exchange by iterating a set
    disagrees with its peers here as it would in a user's job)."""
    if os.environ.get(FORKSERVER_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return None
    key = (_env_key(env), rank)
    server = _SERVERS.get(key)
    if server is not None and server.alive():
        return server
    try:
        server = _Server(env)
    except (OSError, RuntimeError, ValueError) as e:
        print(f"fork server unavailable ({e}): starting fresh interpreters", file=sys.stderr)
        return None
    if not _SERVERS:
        atexit.register(stop_forkservers)
    _SERVERS[key] = server
    return server


def stop_forkservers() -> None:
    """End the fork servers (the test session's end; they also end when this process does)."""
    for s in _SERVERS.values():
        with contextlib.suppress(OSError, ValueError):
            assert s.proc.stdin is not None
            s.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(10)
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.log.close()
        with contextlib.suppress(OSError):
            os.unlink(s.log.name)
    _SERVERS.clear()


# ---- in a rank program --------------------------------------------------------------------------
def start_gloo(rank: int, world: int, port: int, timeout: float, *, exact: bool = False) -> None:
    """In a rank program: one kernel thread (the ranks share the machine's cores) and the gloo
    process group of the ranks on 127.0.0.1, with ``timeout`` seconds for every collective; raised
    to :data:`GLOO_TIMEOUT_FLOOR_S` and scaled by :func:`timeout_scale` unless ``exact`` (a test of
    the timeout itself): a peer slowed down by a loaded machine is not a dead one, and a hang is
    reported by the launcher's watchdog with every rank's stack."""
    import datetime
    import faulthandler

    import torch
    import torch.distributed as dist

    if not exact:
        timeout = max(timeout, GLOO_TIMEOUT_FLOOR_S) * timeout_scale()
    faulthandler.enable(all_threads=True)  # an abort in torch's C++ (SIGABRT) prints where each thread was
    start_pulse()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )


def run_checked(body: Callable[[], None], checks: list[dict], outdir: Path, rank: int) -> None:
    """In a rank program: run ``body``, record an unexpected exception as a failed check, and write
    the checks to ``outdir/rank<r>.json`` (what :func:`checks_of` reads)."""
    import traceback

    try:
        body()
    except Exception:
        checks.append({"name": "no unexpected exception", "ok": False, "detail": traceback.format_exc()})
    (outdir / f"rank{rank}.json").write_text(json.dumps(checks))
    if "gcodec.torch" in sys.modules:  # a failed step leaves later buckets' exchanges running
        import gcodec.torch

        gcodec.torch.synchronize()


def finish_gloo(destroy: bool = True) -> None:
    """In a rank program, after :func:`run_checked` wrote its checks: free what the steps left in
    reference cycles (DDP modules whose hook failed) while the process group still stands, then
    tear the group down and return, so that the program ends as a user's does (interpreter exit,
    gcodec's queue threads joined at exit: an abort there fails the test, as it should).

    ``destroy=False`` (a scenario whose peer was killed): the group cannot be torn down cleanly and
    the queue may be stuck on the dead peer's collective, so the rank leaves at once."""
    import gc

    import torch.distributed as dist

    gc.collect()
    if not destroy:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()
