"""Runs every transport protocol on Numba-simulator device arrays, in a process of its own.

``tests/test_device_protocols.py`` starts this script with ``NUMBA_ENABLE_CUDASIM=1`` (Numba reads
it once, at its first import). Case ids arrive as JSON on standard input; each case runs
``tests/device_protocols.py``'s rank program on :class:`~tests.localcomm.LockstepComm` ranks with
device arrays, and the script prints, per case, every rank's outputs (hex of the host copies made
after the protocol returned), its statistics, and the bytes the simulator itself saw cross between
host and device while the protocols ran.

The simulator is made as strict as a GPU (:func:`gpu_sim_worker.strict_simulator`), and stricter
in one way: a NumPy array handed to a kernel, which a GPU would copy to the device and back
without a word, is refused here.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
warnings.filterwarnings("ignore", category=RuntimeWarning)

from tests.device_protocols import CASES, rank_program  # noqa: E402
from tests.gpu_sim_worker import quick_gil_handoff, race_free_shared_arrays, strict_simulator  # noqa: E402
from tests.localcomm import run_lockstep  # noqa: E402

#: Bytes the simulator saw cross between host and device (both ways), by gcodec or anyone.
CROSSED = [0]
#: Bytes of device payloads read to the host whole (``kernels.cuda.memory.to_host``: the api's
#: reader checks a device payload on the host, docs/gpu.md "What still touches the host").
PAYLOAD_READS = [0]


def watch_transfers() -> None:
    """Count every host <-> device copy at the simulator's own entry points, and refuse NumPy
    arrays as kernel arguments (a silent round trip on a GPU)."""
    from numba import cuda
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator.cudadrv import devicearray as da

    FakeCUDAArray = da.FakeCUDAArray
    to_host, to_dev = FakeCUDAArray.copy_to_host, FakeCUDAArray.copy_to_device

    def copy_to_host(self, *a, **k):  # type: ignore[no-untyped-def]
        CROSSED[0] += int(self.size) * self.dtype.itemsize
        return to_host(self, *a, **k)

    def copy_to_device(self, ary, *a, **k):  # type: ignore[no-untyped-def]
        if not isinstance(ary, FakeCUDAArray) and type(ary).__name__ != "FakeWithinKernelCUDAArray":
            CROSSED[0] += int(np.asarray(ary).nbytes)
        return to_dev(self, ary, *a, **k)

    FakeCUDAArray.copy_to_host = copy_to_host
    FakeCUDAArray.copy_to_device = copy_to_device
    orig_to_device = da.to_device

    def to_device(ary, *a, **k):  # type: ignore[no-untyped-def]
        if isinstance(ary, np.ndarray):
            CROSSED[0] += int(ary.nbytes)
        return orig_to_device(ary, *a, **k)

    da.to_device = to_device
    cuda.to_device = to_device
    call = simkernel.FakeCUDAKernel.__call__

    def launch(self, *args):  # type: ignore[no-untyped-def]
        if not self._device and not simkernel._kernel_context:
            for a in args:
                if isinstance(a, np.ndarray) and a.ndim > 0:
                    raise AssertionError(
                        f"kernel {self.fn.__name__} got a NumPy array: a GPU would copy it to the device and back"
                    )
        return call(self, *args)

    simkernel.FakeCUDAKernel.__call__ = launch
    from gcodec.kernels.cuda import memory

    whole = memory.to_host

    def read_whole(buf):  # type: ignore[no-untyped-def]
        got = whole(buf)
        PAYLOAD_READS[0] += int(got.nbytes)
        return got

    memory.to_host = read_whole


def run_case(case: dict) -> dict:
    from numba import cuda

    uploaded = [0]

    def put(h: np.ndarray):  # type: ignore[no-untyped-def]
        h = np.ascontiguousarray(h)
        uploaded[0] += h.nbytes  # the test's own inputs, not the protocol's
        return cuda.to_device(h)

    res: dict = {"id": case["id"]}
    try:
        before, reads = CROSSED[0], PAYLOAD_READS[0]
        got = run_lockstep(case["p"], lambda comm: rank_program(comm, case, put))
        res["crossed"] = CROSSED[0] - before - uploaded[0]
        res["payload_reads"] = PAYLOAD_READS[0] - reads
        ranks = []
        for g in got:
            if isinstance(g, BaseException):
                trace = "".join(traceback.format_exception(g))[-3000:]
                ranks.append({"error": f"{type(g).__name__}: {g}", "trace": trace})
                continue
            outs, stats = g
            ranks.append(
                {
                    "types": sorted({type(o).__name__ for o in outs}),
                    "outputs": [o.copy_to_host().tobytes().hex() for o in outs],
                    "stats": stats,
                }
            )
        res["ranks"] = ranks
    except Exception as e:  # reported, and judged by the parent
        res["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
    return res


def main() -> None:
    quick_gil_handoff()  # see there
    want = set(json.load(sys.stdin)["cases"])
    from gcodec.kernels.cuda import launch  # before the watch: it recognises the simulator by its functions

    strict_simulator()
    race_free_shared_arrays()
    watch_transfers()

    cases = [c for c in CASES if c["id"] in want]
    out = {"simulator": launch.SIM, "cases": [run_case(c) for c in cases]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
