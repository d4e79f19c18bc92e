"""FSDP2 with gcodec's compressed reduce-scatter: real gloo processes on 127.0.0.1, a CPU device mesh.

The rank program is tests/transport_ranks/fsdp_program.py. One 2-rank and one 4-rank job train a
small MLP uncompressed, with fp16, top-k 1 % + EF and uniform 4-bit, check the reduce-scatter's
arithmetic against a one-process computation and the error paths; the 4-rank job's top-k
checkpoint then resumes on 2 ranks with its residuals re-partitioned.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 240


from tests.procs import checks_of as _checks_of  # noqa: E402  (one helper for the multi-process tests)
from tests.procs import run  # noqa: E402
from tests.procs import run_ranks as _run_ranks  # noqa: E402


def run_ranks(scenario: str, outdir: Path, world: int) -> list[int]:
    return _run_ranks("tests.transport_ranks.fsdp_program", [scenario, str(outdir)], world, TIMEOUT, outdir)


def checks_of(outdir: Path, world: int) -> list[dict]:
    return _checks_of(outdir, range(world))


@pytest.fixture(scope="module", params=[2, 4])
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict]:
    world = request.param
    out = tmp_path_factory.mktemp(f"fsdp{world}")
    assert run_ranks("train", out, world) == [0] * world
    checks_of(out, world)
    return world, out, json.loads((out / "runs.json").read_text())


def test_every_rank_passes_its_checks(job: tuple[int, Path, dict]) -> None:
    world, out, _ = job
    names = {c["name"] for c in checks_of(out, world)}
    assert sum(n.startswith("reference arithmetic") for n in names) == 6
    assert {
        "corrupt payload raises",
        "failed fp16 encode raises on every rank",
        "clean call after the error",
        "mismatched codec raises from backward",
        "dcp keeps every rank's residuals",
        "all-gather off by default",
        "forward uses the decoded shards of every rank",
        "sharded parameters stay exact",
        "gradients reach the shards",
    } <= names
    assert sum(n.startswith("all-gather reference") for n in names) == 3


def test_fp16_keeps_parameters_close_to_uncompressed(job: tuple[int, Path, dict]) -> None:
    _, _, runs = job
    ours, base = np.array(runs["fp16"]["params"]), np.array(runs["none"]["params"])
    assert np.linalg.norm(ours - base) / np.linalg.norm(base) < 1e-3


@pytest.mark.parametrize("run", ["topk", "uniform4", "fp16", "ag8"])
def test_loss_falls_like_uncompressed(job: tuple[int, Path, dict], run: str) -> None:
    _, _, runs = job
    base, ours = runs["none"]["losses"], runs[run]["losses"]
    assert ours[-1] < 0.5 * ours[0], ours[::5]
    # the compressed run makes at least 80 % of the uncompressed run's progress
    assert ours[0] - ours[-1] > 0.8 * (base[0] - base[-1]), (ours[::5], base[::5])
    if run != "topk":  # fine quantization with error feedback: the same curve within 5 %
        assert abs(ours[-1] - base[-1]) < 0.05 * base[-1]


def test_stats_count_compressed_bytes(job: tuple[int, Path, dict]) -> None:
    world, _, runs = job
    stats = runs["topk"]["stats"]
    comp = {k: v for k, v in stats.items() if v["mode"] == "reduce_scatter"}
    assert comp and all(
        set(v)
        >= {"raw_bytes", "payload_bytes", "wire_bytes", "encode_s", "comm_s", "decode_s", "steps", "total", "codec"}
        for v in stats.values()
    )
    for v in comp.values():
        assert v["steps"] == 30  # 40 steps, 10 of warm-up
    biggest = max(comp.values(), key=lambda v: v["raw_bytes"])  # 128 x 128: headers matter less
    assert biggest["payload_bytes"] < 0.1 * biggest["raw_bytes"]
    assert biggest["wire_bytes"] <= biggest["payload_bytes"] * (world - 1) / world * 1.1


def test_quantized_all_gather_counts_its_bytes_and_is_off_by_default(job: tuple[int, Path, dict]) -> None:
    world, _, runs = job
    for name in ("none", "fp16", "topk", "uniform4"):
        assert not any("all_gather" in k for k in runs[name].get("stats", {})), name
    ag = {k: v for k, v in runs["ag8"]["stats"].items() if v["mode"] == "all_gather"}
    assert ag and all(v["codec"]["bits"] == 8 for v in ag.values())
    for v in ag.values():
        assert v["steps"] == 2 * 40  # forward and backward gather: FSDP reshards after forward
        assert v["payload_bytes"] < v["raw_bytes"]
        assert v["wire_bytes"] == v["payload_bytes"] * (world - 1)  # equal shards, equal payloads
    biggest = max(ag.values(), key=lambda v: v["raw_bytes"])  # 128 x 128: the header matters less
    assert biggest["payload_bytes"] < 0.3 * biggest["raw_bytes"]  # 8.25 bits a float32 value, plus a header
    # the loss curve: the uniform 4 run's within 5 %
    assert abs(runs["ag8"]["losses"][-1] - runs["uniform4"]["losses"][-1]) < 0.05 * runs["uniform4"]["losses"][-1]


def test_checkpoint_on_4_ranks_resumes_on_2_with_the_residuals(job: tuple[int, Path, dict]) -> None:
    world, out, _ = job
    if world != 4:
        pytest.skip("the 4-rank job's checkpoint resumes on 2 ranks")
    assert run_ranks("resume", out, 2) == [0, 0]
    names = {c["name"] for c in checks_of(out, 2)}
    assert "resumed residuals reach the gradients exactly" in names
    assert "dcp checkpoint reshards like reshard_state_dicts" in names


def test_docs_example_runs_under_torchrun(tmp_path: Path) -> None:
    import re

    page = (ROOT / "docs" / "fsdp.md").read_text()
    m = re.search(r"```python\n(.*?)```", page.split("## An FSDP2 job", 1)[1], re.S)
    assert m is not None
    (tmp_path / "fsdp_example.py").write_text(m.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = run([torchrun, "--standalone", "--nproc_per_node=2", "fsdp_example.py"], TIMEOUT, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "final loss" in proc.stdout and "(reduce_scatter)" in proc.stdout


def test_fp16_takes_the_values_path_with_the_same_bytes_on_the_wire(job: tuple[int, Path, dict]) -> None:
    # fp16's payload sizes are known everywhere: values only, no size exchange, no header or CRC
    world, _, runs = job
    comp = {k: v for k, v in runs["fp16"]["stats"].items() if v["codec"] is not None}
    assert comp and all(v["mode"] == "summable" for v in comp.values())
    for v in comp.values():
        assert v["payload_bytes"] == v["raw_bytes"] // 2  # float32 input, 2 bytes a value
        assert v["wire_bytes"] == v["payload_bytes"] * (world - 1) // world


def test_gcodec_torch_imports_fsdp2s_modules_only_when_asked() -> None:
    """``import gcodec.torch`` leaves FSDP2's modules (torch.distributed.fsdp, torch.fx, sympy: about
    1.5 CPU-seconds of every rank's start) to the first use of an FSDP name; then they resolve to
    gcodec.torch.fsdp's objects, ``from gcodec.torch import *`` included."""
    code = (
        "import sys, gcodec.torch as gt\n"
        "print('torch.distributed.fsdp' in sys.modules, 'sympy' in sys.modules)\n"
        "import gcodec.torch.fsdp as f\n"
        "print(all(getattr(gt, n) is getattr(f, n) for n in gt._FSDP_NAMES), gt._FSDP_NAMES <= set(gt.__all__))\n"
        "ns = {}\n"
        "exec('from gcodec.torch import *', ns)\n"
        "print(ns['FSDPState'] is f.FSDPState)\n"
    )
    out = run([sys.executable, "-c", code], 120, cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "False", "True", "True", "True"], out.stdout
