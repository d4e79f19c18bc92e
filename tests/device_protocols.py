"""Every transport protocol as one rank's program, run on host arrays or on device arrays.

``tests/test_device_protocols.py`` runs each case twice: on NumPy arrays with :class:`ThreadComm`
ranks (threads, in the test process, the CPU kernels), and on Numba device arrays with
:class:`LockstepComm` ranks inside a CUDA-simulator child (``tests/gpu_sim_protocols.py``). The
program is the same; only ``put`` (host array -> array on the memory under test) and ``get`` (back
to the host, after the protocol returned) differ. Neither imports ``numba.cuda`` on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

#: Small codec configurations, one or two per codec of ``gcodec.list_codecs()``.
CODECS: dict[str, dict[str, Any]] = {
    "fp16": {"id": "fp16"},
    "bf16": {"id": "bf16"},
    "randomk": {"id": "randomk", "ratio": 0.25, "seed": 3},
    "randomk-fp16": {"id": "randomk", "ratio": 0.25, "seed": 4, "values": {"id": "fp16"}},
    "uniform4": {"id": "uniform", "bits": 4, "group_size": 32},
    "uniform8-sto": {"id": "uniform", "bits": 8, "rounding": "stochastic", "seed": 5},
    "qsgd": {"id": "qsgd", "levels": 7, "seed": 1},
    "terngrad": {"id": "terngrad", "seed": 2},
    "sign": {"id": "sign"},
    "topk": {"id": "topk", "ratio": 0.1},
    "topk-fp16": {"id": "topk", "ratio": 0.1, "values": {"id": "fp16"}},
    "threshold": {"id": "threshold", "threshold": 1.5},
    "powersgd": {"id": "powersgd", "rank": 2},
    "mxfp4": {"id": "mx", "element": "e2m1"},
    "nvfp4": {"id": "nvfp4"},
    "fp8": {"id": "fp8", "group_size": 32},
}
GATHERED = ["uniform4", "uniform8-sto", "qsgd", "terngrad", "sign", "topk", "topk-fp16", "threshold", "fp16", "randomk"]
SUMMABLE = ["fp16", "bf16", "randomk", "randomk-fp16"]


def _case(cid: str, protocol: str, codec: str | None, p: int, n: int, **kw: Any) -> dict[str, Any]:
    return {"id": cid, "protocol": protocol, "codec": codec, "p": p, "n": n, "steps": 1, "ef": True, "op": "mean", **kw}


CASES: list[dict[str, Any]] = [
    *[_case(f"summable-{c}-p2", "allreduce", c, 2, 300, mode="summable", steps=2) for c in SUMMABLE],
    *[_case(f"summable-{c}-p3", "allreduce", c, 3, 300, mode="summable") for c in SUMMABLE],
    _case("summable-fp16-sum-p3", "allreduce", "fp16", 3, 300, mode="summable", op="sum", ef=False),
    _case("summable-riders-p2", "summable_riders", "bf16", 2, 200),
    _case("summable-riders-p3", "summable_riders", "randomk-fp16", 3, 200),
    *[_case(f"gather-{c}-p2", "allreduce", c, 2, 256, mode="gather") for c in [*GATHERED, "mxfp4", "nvfp4", "fp8"]],
    _case("gather-topk-2steps", "allreduce", "topk", 2, 256, mode="gather", steps=2),
    *[_case(f"two_phase-{c}-p3", "allreduce", c, 3, 800, mode="two_phase") for c in GATHERED],
    _case("powersgd-p2", "lowrank", "powersgd", 2, 0, steps=2),
    _case("powersgd-p3-sum", "lowrank", "powersgd", 3, 0, op="sum", ef=False),
    _case("rs-values-p2", "reduce_scatter", None, 2, 200, groups=["fp16", "bf16", None], ef=False),
    _case("rs-values-p3", "reduce_scatter", None, 3, 120, groups=["fp16", None], ef=False),
    _case("rs-values-ef-p2", "reduce_scatter", None, 2, 200, groups=["fp16", "bf16", None], steps=2),
    _case("rs-payload-p2", "reduce_scatter", None, 2, 200, groups=["uniform4", "topk", None], steps=2),
    _case("rs-payload-p3", "reduce_scatter", None, 3, 150, groups=["sign", "fp16", "qsgd"]),
    *[_case(f"allgather-{c}-p2", "allgather", c, 2, 200) for c in ["fp16", "uniform4", "topk", "sign", "randomk"]],
]
#: PowerSGD's encoder products are free (specs/codecs/powersgd.md §5): the device's sum in another
#: order than the CPU's, so its cases compare within float32 rounding, not bit for bit.
APPROXIMATE = {"powersgd-p2", "powersgd-p3-sum"}
#: PowerSGD's batch: a compressed matrix and a vector it sums dense (round 1 carries both).
LOWRANK_SHAPES = [(16, 12), (12,)]


def rank_input(case: dict[str, Any], rank: int, step: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Rank ``rank``'s tensor at ``step`` (the same on both runs)."""
    shape = shape or (case["n"],)
    seed = _seed(case["id"], rank, step, shape)
    x = (np.random.default_rng(seed).standard_normal(int(np.prod(shape))) * 2).astype(np.float32)
    return x.reshape(shape)


def _seed(cid: str, rank: int, step: int, shape: tuple[int, ...]) -> int:
    h = 1469598103934665603
    for ch in f"{cid}/{rank}/{step}/{shape}".encode():
        h = ((h ^ ch) * 1099511628211) % (1 << 64)
    return h % (1 << 32)


def rank_program(comm: Any, case: dict[str, Any], put: Callable[[np.ndarray], Any]) -> Iterator[Any]:
    """One rank's steps of ``case``: a protocol (a generator of works). Returns ``(outputs,
    stats)``: the output arrays of every step (on the memory under test) and, per step, the
    statistics the protocol recorded (host_bytes, payload_bytes, wire_bytes)."""
    import gcodec
    from gcodec.transports.allreduce import allreduce_protocol, exchange_for
    from gcodec.transports.control import Exchange
    from gcodec.transports.gather import allgather_protocol
    from gcodec.transports.lowrank import LowRankItem, lowrank_protocol
    from gcodec.transports.protocol_helpers import timed
    from gcodec.transports.reduce_scatter import RSGroup, reduce_scatter_protocol
    from gcodec.transports.state import TransportState
    from gcodec.transports.stats import StepStats
    from gcodec.transports.summable import summable_protocol

    kind, p, me = case["protocol"], comm.size, comm.rank
    outputs: list[Any] = []
    stats: list[dict[str, float]] = []
    agreed: dict[str, str] = {}
    state = TransportState(CODECS[case["codec"]], error_feedback=case["ef"]) if case["codec"] else None
    groups_states = [
        None if g is None else TransportState(CODECS[g], error_feedback=case["ef"]) for g in case.get("groups", [])
    ]

    def fields(st: StepStats) -> dict[str, float]:
        return {k: st.values[k] for k in ("host_bytes", "payload_bytes", "wire_bytes")}

    for step in range(case["steps"]):
        if kind == "allreduce":
            assert state is not None
            x = put(rank_input(case, me, step))
            out = put(np.zeros(case["n"], np.float32))
            yield from allreduce_protocol(comm, state, x, out, "w", case["op"], case["mode"])
            rec = state.stats()["w"]
            outputs.append(out)
            stats.append({k: rec[k] for k in ("host_bytes", "payload_bytes", "wire_bytes")})
        elif kind == "summable_riders":  # uncompressed values riding in the summable collectives
            assert state is not None
            x = put(rank_input(case, me, step))
            out = put(np.zeros(case["n"], np.float32))
            riders = put(rank_input(case, me, step, (40,)))
            ex = exchange_for(comm, state, "w", "summable with riders", shape=[case["n"]], riders=40)
            st = StepStats("w", step, "summable", 0)
            yield from timed(st, summable_protocol(ex, state, x, out, "w", case["op"], step, st, dense=riders))
            outputs.extend([out, riders])
            stats.append(fields(st))
        elif kind == "lowrank":
            assert state is not None
            xs = [put(rank_input(case, me, step, s)) for s in LOWRANK_SHAPES]
            outs = [put(np.zeros(s, np.float32)) for s in LOWRANK_SHAPES]
            items = [LowRankItem(f"t{i}", x, o) for i, (x, o) in enumerate(zip(xs, outs))]
            ex = exchange_for(comm, state, "batch", "powersgd batch", shapes=[list(s) for s in LOWRANK_SHAPES])
            st = StepStats("batch", step, "powersgd", 0)
            yield from timed(st, lowrank_protocol(ex, state, items, case["op"], step, st))
            outputs.extend(outs)
            stats.append(fields(st))
        elif kind == "reduce_scatter":
            S = case["n"]
            x = put(rank_input(case, me, step, (p, S)))
            out = put(np.zeros(S, np.float32))
            ng = len(groups_states)
            bounds = [S * g // ng for g in range(ng + 1)]
            groups = [RSGroup(f"g{g}", [(bounds[g], bounds[g + 1])], ts, step) for g, ts in enumerate(groups_states)]
            ex = Exchange(comm, {"key": "rs", "case": case["id"]}, agreed, "rs", "reduce-scatter")
            yield from reduce_scatter_protocol(ex, x, out, groups, 1.0 / p, "reduce-scatter")
            outputs.append(out)
            tot = {k: sum(g.stats.values[k] for g in groups) for k in ("host_bytes", "payload_bytes", "wire_bytes")}
            stats.append(tot)
        elif kind == "allgather":
            codec = gcodec.get_codec(CODECS[case["codec"]])
            x = put(rank_input(case, me, step))
            out = put(np.zeros((p, case["n"]), np.float32))
            ex = Exchange(comm, {"key": "ag", "case": case["id"]}, agreed, "ag", "all-gather")
            st = StepStats("ag", step, "all_gather", 0)
            yield from allgather_protocol(ex, codec, x, out, "ag", step, st)
            outputs.append(out)
            stats.append(fields(st))
        else:
            raise AssertionError(kind)
    return outputs, stats


def header_bound(case: dict[str, Any]) -> int:
    """The most host bytes a device step of ``case`` may move when no tensor-sized buffer crosses:
    payload headers (their preamble and msgpack header, at most 512 bytes each, written from the
    host) and the small words (sizes, error codes, non-finite counts, a threshold's k, top-k's index
    byte count, PowerSGD's factor bounds: 8-16 bytes each, a few per kernel), per payload a rank
    encodes, times the ranks and chunks a step touches. It does not grow with the tensor."""
    p = case["p"]
    payloads = p + 1 if case["protocol"] == "allreduce" else p * max(1, len(case.get("groups", [])))
    return 2048 * payloads + 1024 * p
