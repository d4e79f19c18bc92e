"""The cost model of gcodec advise against the alpha-beta formulas of DESIGN.md section 6, break-even
bandwidths, the measured speed model, the CLI and its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gcodec.advise import (
    CodecSpeed,
    Link,
    advise,
    break_even_bps,
    comm_seconds,
    compute_seconds,
    measure_speed,
    parse_bandwidth,
    predict,
)
from gcodec.cli import main
from gcodec.errors import ConfigError

GBIT = Link(1e9, 0.0)


@pytest.mark.parametrize(
    ("text", "bps"),
    [("1Gbit", 1e9), ("100Mbit/s", 1e8), ("10gbps", 1e10), ("125MB/s", 1e9), ("2.5e9", 2.5e9), (1e6, 1e6)],
)
def test_bandwidth_units(text, bps) -> None:
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("bad", ["fast", "-1Gbit", "0", "1 Gbyte"])
def test_bad_bandwidth_is_a_config_error(bad) -> None:
    with pytest.raises(ConfigError):
        parse_bandwidth(bad)


def test_design_guide_volume_arithmetic_for_25m_parameters_at_1gbit() -> None:
    n = 25_000_000 * 4
    # fp32 ring allreduce at p=8: 2*7/8 * 100 MB / 125 MB/s = 1.40 s (the guide's 1.41 s with latency)
    assert comm_seconds("allreduce", 8, n, GBIT) == pytest.approx(1.4, rel=1e-9)
    # an 8-bit gathered payload (about n/4 + scales): 0.21 s at p=2, 1.50 s at p=8 (guide)
    s = 25_000_000 * 1.07
    assert comm_seconds("gather", 2, s, GBIT) == pytest.approx(0.214, rel=1e-2)
    assert comm_seconds("gather", 8, s, GBIT) == pytest.approx(1.50, rel=1e-2)


def test_latency_terms() -> None:
    link = Link(1e30, 1e-3)  # infinite bandwidth: latency only
    assert comm_seconds("allreduce", 4, 1e6, link) == pytest.approx(2 * 3 * 1e-3)
    assert comm_seconds("gather", 4, 1e6, link) == pytest.approx(3 * 1e-3)
    assert comm_seconds("powersgd", 4, 1e6, link) == pytest.approx(4 * 3 * 1e-3)
    assert comm_seconds("allreduce", 1, 1e6, link) == 0.0


def test_compute_per_collective() -> None:
    assert compute_seconds("summable", 4, 1.0, 2.0) == 3.0
    assert compute_seconds("gather", 4, 1.0, 2.0) == 9.0
    assert compute_seconds("two_phase", 4, 1.0, 2.0) == pytest.approx(1.25 + 4.0)
    assert compute_seconds("allreduce", 4, 1.0, 2.0) == 0.0


def test_break_even_is_where_the_saving_vanishes() -> None:
    n, s, comp = 4e8, 1e8, 0.05
    b = break_even_bps("summable", 4, s, comp, n, Link(1.0, 0.0))
    link = Link(b, 0.0)
    saving = comm_seconds("allreduce", 4, n, link) - (comm_seconds("summable", 4, s, link) + comp)
    assert abs(saving) < 1e-9
    assert break_even_bps("summable", 4, s, 0.0, n, GBIT) is None  # no cost: always pays
    assert break_even_bps("gather", 8, 0.3 * n, comp, n, GBIT) is None  # more bytes than dense: never


def test_predict_sums_the_parts_and_reports_the_json_fields() -> None:
    sp = CodecSpeed(1e-4, 1e-9, 2e-4, 5e-10, 64.0, 1.0)
    r = predict({"id": "uniform", "bits": 8}, sp, [(1_000_000,)], 2, GBIT)
    assert r["encode_seconds"] == pytest.approx(1e-4 + 1e-3)
    assert r["decode_seconds"] == pytest.approx(2e-4 + 5e-4)
    assert r["comm_seconds"] == pytest.approx((64 + 1e6) / 125e6)
    assert r["step_seconds"] == pytest.approx(r["comm_seconds"] + r["encode_seconds"] + 2 * r["decode_seconds"])
    assert r["saving_seconds"] == pytest.approx(r["baseline_seconds"] - r["step_seconds"])
    assert r["wire_bytes"] == round(1e6 + 64)
    be = r["break_even_bps"]
    assert be is not None and be > 0


def test_measured_speed_is_a_sensible_line() -> None:
    sp = measure_speed({"id": "uniform", "bits": 8}, sizes=(1 << 12, 1 << 20), repeats=2)
    assert sp.encode_per_element > 0 and sp.decode_per_element > 0
    assert sp.payload_per_element == pytest.approx(1 + 4 / 64, rel=0.05)  # 8 bits + one fp32 scale per 64


def test_advise_numel_lists_every_candidate_and_none_first() -> None:
    rows = advise(numel=1 << 16, bandwidth="1Gbit", workers=4, repeats=1)
    assert rows[0]["codec"] is None and rows[0]["saving_seconds"] == pytest.approx(0.0)
    ids = [r["codec"]["id"] for r in rows[1:]]
    assert "powersgd" not in ids and {"fp16", "uniform", "topk"} <= set(ids)
    assert {r["collective"] for r in rows[1:]} >= {"summable", "two_phase"}


def test_slow_links_favour_strong_codecs_and_fast_links_none() -> None:
    slow = advise(numel=1 << 20, bandwidth="10Mbit", workers=2, repeats=1)
    fast = advise(numel=1 << 20, bandwidth="1000Gbit", workers=2, repeats=1)
    best = lambda rows: min(rows, key=lambda r: r["step_seconds"])  # noqa: E731
    assert best(slow)["codec"] is not None and best(slow)["ratio"] < 0.3
    assert best(fast)["codec"] is None or best(fast)["codec"]["id"] in ("fp16", "bf16")


def test_advise_model_keeps_small_and_1d_tensors_dense_and_prices_powersgd(tmp_path: Path) -> None:
    params = {"fc1.weight": [512, 784], "fc1.bias": [512], "fc2.weight": [10, 512], "tiny": [4, 4]}
    rows = advise(model=params, bandwidth="1Gbit", workers=2, repeats=1)
    ps = next(r for r in rows if r["codec"] and r["codec"]["id"] == "powersgd")
    assert ps["numel"] == 512 * 784 + 10 * 512
    assert ps["payload_bytes"] == 4 * ((512 + 784) * 4 + (10 + 512) * 4)


@pytest.mark.parametrize("kw", [{}, {"numel": 5, "model": {"a": [2, 2]}}, {"numel": 0}, {"numel": 5, "workers": 0}])
def test_bad_advise_calls_are_config_errors(kw) -> None:
    with pytest.raises(ConfigError):
        advise(**kw)


def test_cli_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "advise.json"
    rc = main(
        ["advise", "--numel", "65536", "--bandwidth", "1Gbit", "--workers", "4", "--json", str(out), "--repeats", "1"]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "break-even" in text and "uniform bits=8" in text
    rows = json.loads(out.read_text())
    for r in rows:
        assert {"codec", "wire_bytes", "encode_seconds", "decode_seconds", "comm_seconds", "break_even_bps"} <= set(r)
        assert r["break_even_bps"] is None or (isinstance(r["break_even_bps"], float) and r["break_even_bps"] > 0)
        assert all(not (isinstance(v, float) and math.isnan(v)) for v in r.values())


def test_cli_model_file_and_codec_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "params.json"
    f.write_text(json.dumps({"w": [256, 256], "b": [256]}))
    rc = main(
        [
            "advise",
            "--model",
            str(f),
            "--bandwidth",
            "100Mbit",
            "--workers",
            "2",
            "--repeats",
            "1",
            "--codec",
            "fp16",
            "--codec",
            '{"id": "powersgd", "rank": 2}',
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "powersgd rank=2" in text and "fp16" in text


def test_cli_bad_input_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--numel", "100", "--bandwidth", "fast"]) != 0
    assert "bandwidth" in capsys.readouterr().err
