"""The device path is the same path: every transport protocol on device arrays, against the CPU.

Each case of ``tests/device_protocols.py`` (summable at p = 2 and 3, gather, two-phase, PowerSGD's
two rounds with a dense rider, the reduce-scatter's values and payload paths, the compressed
all-gather; every codec of ``gcodec.list_codecs()``) runs twice with the same rank program:

* on NumPy arrays, :class:`tests.localcomm.ThreadComm` ranks as threads of this process (the CPU
  kernels);
* on Numba device arrays, :class:`tests.localcomm.LockstepComm` ranks in a child process under the
  CUDA simulator (``tests/gpu_sim_protocols.py``), made as strict as a GPU: device arrays refuse
  NumPy's methods, and a NumPy array handed to a kernel (a silent round trip on a GPU) is refused.

Every rank's outputs must be bit-identical to the CPU run's (PowerSGD's within float32 rounding:
its encoder's products are free, specs/codecs/powersgd.md §5), the statistics must agree, the
outputs must still be device arrays, and the bytes that crossed between host and device must be
what the transports' ``host_bytes`` statistic says, and small: see :func:`test_host_bytes_are_small`.
Sizes are a few hundred elements: the simulator runs each CUDA thread as a Python thread.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gcodec.codecs.registry import codec_class
from gcodec.transports import run_blocking
from tests.procs import run, run_early, run_once, simulator_job

from .device_protocols import APPROXIMATE, CASES, CODECS, header_bound, rank_program
from .localcomm import run_threads

pytestmark = pytest.mark.gpu

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
#: The api reader's bytes per byte of device payload it reads: the read itself, the sections copied
#: back (at most as many), and the int64 indices a sparse decode derives from 1-2 byte delta codes
#: (threshold: up to 2.6 x its payload); measured at most 3.7 on the cases here.
READER_ROUND_TRIP = 4
IDS = [c["id"] for c in CASES]
BY_ID = {c["id"]: c for c in CASES}


def _worker_job() -> tuple[list[str], dict[str, Any]]:
    return simulator_job("gpu_sim_protocols.py", {"cases": IDS})


def start_in_background() -> None:
    """tests/conftest.py starts the worker when a large session begins (see run_early)."""
    if HAVE_NUMBA_CUDA:
        cmd, kw = _worker_job()
        run_early("gpu_sim_protocols", cmd, 1500, **kw)


@pytest.fixture(scope="module")
def device() -> dict[str, Any]:
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed (pip install 'gcodec[test]'): the simulator tests cannot run")
    cmd, kw = _worker_job()
    proc = run_once("gpu_sim_protocols", cmd, 1500, **kw)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert out["simulator"] is True
    return {c["id"]: c for c in out["cases"]}


def _cpu(case: dict[str, Any]) -> list[Any]:
    return run_threads(case["p"], lambda comm: run_blocking(rank_program(comm, case, lambda h: h)))


def _ranks(device: dict[str, Any], cid: str) -> list[dict[str, Any]]:
    got = device[cid]
    assert "error" not in got, got.get("error")
    for r in got["ranks"]:
        assert "error" not in r, r.get("trace", r.get("error"))
    return got["ranks"]


@pytest.mark.parametrize("cid", IDS)
def test_device_run_equals_cpu_run(device: dict[str, Any], cid: str) -> None:
    case = BY_ID[cid]
    cpu = _cpu(case)
    ranks = _ranks(device, cid)
    for r, (want, got) in enumerate(zip(cpu, ranks, strict=True)):
        assert not isinstance(want, BaseException), want
        outs, stats = want
        assert got["types"] == ["FakeCUDAArray"]  # every output stayed a device array
        assert len(got["outputs"]) == len(outs)
        for o, h in zip(outs, got["outputs"]):
            mine = np.frombuffer(bytes.fromhex(h), np.float32)
            ref = np.ascontiguousarray(o, np.float32).reshape(-1)
            if cid in APPROXIMATE:
                np.testing.assert_allclose(mine, ref, rtol=0, atol=1e-4 * max(float(np.abs(ref).max()), 1.0))
            else:  # bit for bit: signed zeros and NaN payloads count
                np.testing.assert_array_equal(mine.view(np.uint32), ref.view(np.uint32), err_msg=f"rank {r}")
        for s_cpu, s_dev in zip(stats, got["stats"], strict=True):
            assert s_cpu["host_bytes"] == 0  # host arrays never cross
            if cid not in APPROXIMATE:
                assert s_dev["payload_bytes"] == s_cpu["payload_bytes"]
                assert s_dev["wire_bytes"] == s_cpu["wire_bytes"]


@pytest.mark.parametrize("cid", IDS)
def test_host_bytes_are_what_crossed(device: dict[str, Any], cid: str) -> None:
    """The statistic counts every byte the simulator saw cross while the protocols ran."""
    ranks = _ranks(device, cid)
    counted = sum(s["host_bytes"] for r in ranks for s in r["stats"])
    assert counted == device[cid]["crossed"]
    assert counted > 0  # a device exchange reads at least its error codes or a header


@pytest.mark.parametrize("cid", IDS)
def test_host_bytes_are_small(device: dict[str, Any], cid: str) -> None:
    """No tensor-sized buffer crosses. What may cross: headers and small words (sizes, codes,
    counts: :func:`header_bound` per rank and step), and, where a protocol decodes device payloads,
    the api reader's round trip of each payload (``gcodec.decode`` of device bytes checks them on
    the host and copies what the kernels need back: the sections, a sparse codec's indices widened
    to int64; docs/gpu.md "What still touches the host"), counted here at the reader itself and
    bounded by :data:`READER_ROUND_TRIP` times the bytes it read."""
    case = BY_ID[cid]
    ranks = _ranks(device, cid)
    reads = device[cid]["payload_reads"]
    counted = sum(s["host_bytes"] for r in ranks for s in r["stats"])
    bound = header_bound(case) * case["p"] * case["steps"]
    assert counted - READER_ROUND_TRIP * reads <= bound, (counted, reads, bound)
    if case["protocol"] == "lowrank" or cid.startswith("rs-values") or _device_checked(case):
        # no payload is decoded, or each is checked and decoded where it lies (Codec.device_checks)
        assert reads == 0
        for r in ranks:
            for s in r["stats"]:
                assert s["host_bytes"] <= header_bound(case)


def _device_checked(case: dict[str, Any]) -> bool:
    """Whether every codec of ``case`` has its payloads checked and decoded on the device."""
    names = [case["codec"]] if case["codec"] else [g for g in case.get("groups", []) if g]
    return bool(names) and all(codec_class(CODECS[c]["id"]).device_checks for c in names)


def test_gpu_check_fails_loudly_without_a_gpu() -> None:
    """bench/gpu_check.py on a machine without a usable GPU: exit status 2 and a FAIL line, never a
    silent pass (it checks the device path on a GPU machine in one call)."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    env["PYTHONFAULTHANDLER"] = "1"
    probe = run(
        [sys.executable, "-c", "from numba import cuda; print(cuda.is_available())"], 300, env=env, cwd=os.getcwd()
    )
    if probe.stdout.strip() == "True":
        pytest.skip("a GPU is usable here: bench/gpu_check.py runs its checks instead")
    proc = run([sys.executable, str(root / "bench" / "gpu_check.py"), "--no-doc"], 300, env=env, cwd=root)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "FAIL" in proc.stderr
