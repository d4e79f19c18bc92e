"""The cost model of gcodec advise against the alpha-beta formulas of DESIGN.md section 6, break-even
bandwidths, the measured speed model, the CLI and its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import gcodec
import gcodec.transports
from gcodec.advise import (
    CLOSE_FRACTION,
    EVICT_MAX_BYTES,
    GATHER_COLLECTIVES,
    CacheEvictor,
    CodecSpeed,
    Link,
    MirrorComm,
    TransportSpeed,
    advise,
    break_even_bps,
    cache_bytes,
    comm_seconds,
    compute_seconds,
    fit_link,
    measure_speed,
    measure_transport,
    parse_bandwidth,
    predict,
    probe_link,
    transport_sizes,
    verdict,
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
    # summable: an all-to-all and an all-gather of the values, or at p = 2 one all-gather
    assert comm_seconds("summable", 4, 1e6, link) == pytest.approx(2 * 3 * 1e-3)
    assert comm_seconds("summable", 2, 1e6, link) == pytest.approx(1e-3)
    assert comm_seconds("lowrank", 4, 1e6, link) == pytest.approx(4 * 3 * 1e-3)
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


def test_cache_bytes_reads_the_largest_cache_of_sysfs(tmp_path: Path) -> None:
    for i, size in enumerate(["48K", "64K", "2048K", "491520K"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert cache_bytes(str(tmp_path)) == 491520 << 10
    (tmp_path / "index4").mkdir()
    (tmp_path / "index4" / "size").write_text("1M")  # other units, and a smaller one, are read too
    assert cache_bytes(str(tmp_path)) == 491520 << 10
    (tmp_path / "index5").mkdir()
    (tmp_path / "index5" / "size").write_text("1G")
    assert cache_bytes(str(tmp_path)) == 1 << 30
    empty = tmp_path / "none"
    empty.mkdir()
    assert cache_bytes(str(empty)) == gcodec.advise.CACHE_BYTES_DEFAULT
    (empty / "index0").mkdir()
    (empty / "index0" / "size").write_text("a lot")  # unreadable: the default
    assert cache_bytes(str(empty)) == gcodec.advise.CACHE_BYTES_DEFAULT


def test_cache_evictor_sizes_and_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GCODEC_EVICT_BYTES", raising=False)
    monkeypatch.setattr(gcodec.advise, "cache_bytes", lambda: 3 << 20)
    assert CacheEvictor().nbytes == 6 << 20  # twice the largest cache
    monkeypatch.setattr(gcodec.advise, "cache_bytes", lambda: 4 << 30)
    assert CacheEvictor().nbytes == EVICT_MAX_BYTES  # and never more than 1 GiB
    monkeypatch.setenv("GCODEC_EVICT_BYTES", "65536")
    ev = CacheEvictor()
    assert ev.nbytes == 65536 and ev._buf is None  # nothing allocated before the first call
    ev()
    assert ev._buf is not None and ev._buf.nbytes == 65536
    assert CacheEvictor(1 << 20).nbytes == 1 << 20  # an explicit size wins over the variable
    for bad in ("64k", "-5", "4"):
        monkeypatch.setenv("GCODEC_EVICT_BYTES", bad)
        with pytest.raises(ConfigError):
            CacheEvictor()


def test_eviction_runs_before_each_timed_step_and_outside_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that advances 1 ms per reading and 10 s per eviction: every timed step still reads
    1 ms (two readings), so the eviction ran outside the timed window, once before each timed
    encode, decode and protocol step."""
    import types

    now, evictions = [0.0], [0]

    def clock() -> float:
        now[0] += 1e-3
        return now[0]

    def evict() -> None:
        evictions[0] += 1
        now[0] += 10.0

    monkeypatch.setattr(gcodec.advise, "time", types.SimpleNamespace(perf_counter=clock))
    sp = measure_speed({"id": "uniform", "bits": 8}, sizes=(1 << 10, 1 << 12), repeats=3, evict=evict)
    assert evictions[0] == 2 * 2 * 3  # two sizes, encode and decode, three repeats
    assert sp.encode_seconds(1 << 10) == pytest.approx(1e-3) and sp.decode_seconds(1 << 12) == pytest.approx(1e-3)
    evictions[0] = 0
    tr = measure_transport({"id": "uniform", "bits": 8}, 2, sizes=(1 << 10, 1 << 12), repeats=2, evict=evict)
    assert evictions[0] == 2 * 2 and tr.seconds(1 << 12) == pytest.approx(1e-3)


def test_advise_says_whether_its_caches_were_cold() -> None:
    cold = advise(numel=1 << 14, candidates=[None, "fp16"], workers=2, repeats=1)
    warm = advise(numel=1 << 14, candidates=[None, "fp16"], workers=2, repeats=1, cold=False)
    assert [r["caches"] for r in cold] == ["cold", "cold"] and [r["caches"] for r in warm] == ["warm", "warm"]


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


def test_a_saving_within_the_models_error_is_a_close_call_not_a_recommendation() -> None:
    # the uncompressed exchange takes 10 ms: a codec must save more than CLOSE_FRACTION of it
    base = 0.010
    assert verdict(CLOSE_FRACTION * base * 1.01, base) == "pays"
    assert verdict(CLOSE_FRACTION * base * 0.99, base) == "close"
    assert verdict(0.0, base) == "costs" and verdict(-0.001, base) == "costs"
    # the rows carry it, from their own saving and baseline; the dense row has none
    rows = advise(numel=1 << 20, bandwidth="1Gbit", workers=2, repeats=1)
    assert rows[0]["verdict"] == "-"
    for r in rows[1:]:
        assert r["verdict"] == verdict(r["saving_seconds"], r["baseline_seconds"])


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
    # the link was not measured, and the output says so
    assert "link: assumed, not measured: 1 Gbit/s (--bandwidth), alpha 50 us (the default), 4 workers" in text
    rows = json.loads(out.read_text())
    assert all(r["link"] == {"source": "assumed", "bandwidth_bps": 1e9, "latency_s": 50e-6} for r in rows)
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


def ring_seconds(nbytes: int, p: int, link: Link) -> float:
    """The model's dense ring allreduce: what a link that follows it exactly takes."""
    return 2 * (p - 1) * link.latency_s + 2 * (p - 1) / p * nbytes / link.bytes_per_s


@pytest.mark.parametrize("p", [2, 4, 7])
def test_fit_link_recovers_alpha_and_beta_of_a_link_that_follows_the_model(p: int) -> None:
    truth = Link(3.5e9, 120e-6)
    samples = [(b, ring_seconds(b, p, truth)) for b in (4096, 65536, 1 << 20, 1 << 24)]
    fit = fit_link(samples, p)
    assert fit.link.bandwidth_bps == pytest.approx(truth.bandwidth_bps, rel=1e-9)
    assert fit.link.latency_s == pytest.approx(truth.latency_s, rel=1e-9)
    assert fit.worst_residual < 1e-9 and fit.workers == p


def test_fit_link_prices_the_large_sizes_at_their_own_rate_through_a_token_buckets_burst() -> None:
    """Samples measured by bench/link.py's probe at 1 Gbit/s (a token bucket with a 256 KB burst on
    a loopback both ranks share): 4 KiB in 0.39 ms, 64 KiB in 0.56 ms (inside the burst), 1 MiB
    in 17.1 ms; and 16 MiB at the rate the model's dense exchange measured there (17.4 MB in
    290.9 ms, so 0.2805 s). The line through the smallest and
    largest sizes gives beta = 8 * (16 MiB - 4 KiB) / (0.2803 - 0.00039) s = 0.479 Gbit/s, the rate
    the job's buckets moved at (17.4 MB * 8 / 0.2909 s = 0.479); a least-squares line weighted by
    1/t, the previous fit, read 1.15 Gbit/s from the first three and priced that exchange at 121
    ms. alpha: 0.39 ms less 4 KiB at that rate (0.068 ms), over 2 messages."""
    mib = 1 << 20
    dense_s, dense_bytes = 0.2909, 17.4e6
    samples = [(4096, 0.39e-3), (65536, 0.56e-3), (mib, 17.1e-3), (16 * mib, dense_s * 16 * mib / dense_bytes)]
    fit = fit_link(samples, 2)
    assert fit.link.bandwidth_bps == pytest.approx(8 * dense_bytes / dense_s, rel=0.01)
    assert fit.link.latency_s == pytest.approx((0.39e-3 - 4096 * 8 / fit.link.bandwidth_bps) / 2, rel=1e-9)
    # the 64 KiB sample inside the burst lies furthest from the line: 0.56 ms against 1.42 ms
    line_64k = 2 * fit.link.latency_s + 65536 * 8 / fit.link.bandwidth_bps
    assert fit.worst_residual == pytest.approx((line_64k - 0.56e-3) / 0.56e-3, rel=1e-9)
    assert 1.4e-3 < line_64k < 1.45e-3


def test_fit_link_is_not_moved_by_a_noisy_middle_size() -> None:
    """A link that follows the model exactly, but for one middle sample 5x slow (a busy machine):
    the ends fix the line, so alpha and beta are exact; the worst residual reports the outlier."""
    truth = Link(8e9, 100e-6)
    samples = [(b, ring_seconds(b, 2, truth)) for b in (4096, 16384, 1 << 20, 1 << 22)]
    samples[1] = (samples[1][0], 5 * samples[1][1])
    fit = fit_link(samples, 2)
    assert fit.link.latency_s == pytest.approx(truth.latency_s, rel=1e-9)
    assert fit.link.bandwidth_bps == pytest.approx(truth.bandwidth_bps, rel=1e-9)
    assert fit.worst_residual == pytest.approx(0.8, rel=1e-9)  # |t - 5t| / 5t


def test_fit_link_does_not_read_a_small_size_slower_than_a_larger_one_as_latency() -> None:
    """The probe of bench/link.py's 10 Gbit/s link (2026-12-06, medians of 5): 4 KiB in 3.677 ms,
    64 KiB in 0.347, 1 MiB in 1.926, 16 MiB in 28.903. The smallest size counts at the least time of
    any size from it up (0.347 ms), so alpha is 0.17 ms a message, not the 1.8 that the 4 KiB time
    alone gives; beta is the line from there to 16 MiB."""
    mib = 1 << 20
    samples = [(4096, 3.677e-3), (65536, 0.347e-3), (mib, 1.926e-3), (16 * mib, 28.903e-3)]
    fit = fit_link(samples, 2)
    b = (28.903e-3 - 0.347e-3) / (16 * mib - 4096)  # seconds per byte (2(p-1)/p = 1 at p = 2)
    assert fit.link.bandwidth_bps == pytest.approx(8 / b, rel=1e-9)
    assert fit.link.latency_s == pytest.approx((0.347e-3 - b * 4096) / 2, rel=1e-9)
    assert 0.17e-3 < fit.link.latency_s < 0.175e-3
    # a link whose times grow with the size is fitted as before: through its smallest size
    mono = [(4096, 0.347e-3), (65536, 0.5e-3), (mib, 1.926e-3), (16 * mib, 28.903e-3)]
    assert fit_link(mono, 2).link.latency_s == pytest.approx(fit.link.latency_s, rel=1e-9)


@pytest.mark.parametrize(
    "samples, p, what",
    [
        ([(4096, 1e-4), (65536, 2e-4)], 1, "at least 2 ranks"),
        ([(4096, 1e-4), (4096, 2e-4)], 2, "2 or more sizes"),
        ([(4096, 1e-4), (65536, 0.0)], 2, "positive times"),
        ([(4096, 2e-4), (65536, 1e-4)], 2, "do not grow with the size"),
    ],
)
def test_fit_link_refuses_what_it_cannot_measure(samples, p, what) -> None:
    with pytest.raises(ConfigError, match=what):
        fit_link(samples, p)


def test_probe_link_times_every_size_after_a_barrier_and_fits_the_slowest_rank() -> None:
    """A fake collective on a fake clock: each allreduce advances the clock by the model's time on
    a known link; ``slowest`` doubles the latency part (the slower rank), which the fit must see."""
    truth = Link(2e9, 40e-6)
    p, now, calls = 3, [0.0], {"barrier": 0, "slowest": 0, "allreduce": 0}

    def allreduce(a: np.ndarray) -> None:
        calls["allreduce"] += 1
        assert a.dtype == np.float32
        now[0] += ring_seconds(a.nbytes, p, truth)

    def barrier() -> None:
        calls["barrier"] += 1

    def slowest(t: float) -> float:
        calls["slowest"] += 1
        return t + 2 * (p - 1) * truth.latency_s  # the slowest rank: twice the latency

    sizes = (1 << 8, 1 << 12, 1 << 16)
    fit = probe_link(allreduce, p, barrier=barrier, slowest=slowest, sizes=sizes, repeats=3, clock=lambda: now[0])
    assert calls == {"barrier": 9, "slowest": 3, "allreduce": 12}  # one untimed run per size
    assert [b for b, _ in fit.samples] == [4 * n for n in sizes]
    assert fit.link.latency_s == pytest.approx(2 * truth.latency_s, rel=1e-6)
    assert fit.link.bandwidth_bps == pytest.approx(truth.bandwidth_bps, rel=1e-6)
    # an evictor runs before each timed run's barrier but the smallest size's (the latency's),
    # outside the time (it moves the clock by 1 s)
    order: list[str] = []

    def evict() -> None:
        order.append("e")
        now[0] += 1.0

    def barrier2() -> None:
        order.append("b")

    again = probe_link(
        allreduce, p, barrier=barrier2, slowest=slowest, sizes=sizes, repeats=3, clock=lambda: now[0], evict=evict
    )
    assert order == ["b"] * 3 + ["e", "b"] * 6
    assert again.link.bandwidth_bps == pytest.approx(truth.bandwidth_bps, rel=1e-6)


PROBE_ARGS = ["advise", "--numel", "262144", "--codec", "fp16", "--codec", "uniform"]
PROBE_ARGS += ["--repeats", "1"]  # the probe's default sizes: up to 16 MiB, well above a busy machine's noise


def check_probed(text: str, out: Path, transport: str) -> None:
    """What a probed run must say and write: the link measured over ``transport`` by the fit of
    the four probe sizes, and rows priced on exactly that link."""
    assert f"link: measured by --probe over {transport}" in text, text
    assert "codec speeds: measured on this machine now" in text
    assert "caches cold (read over before each timed step" in text
    rows = json.loads(out.read_text())
    link = rows[0]["link"]
    assert link["source"] == "probe" and link["workers"] == 2
    for lk, coll in ((link, "allreduce"), (link["gather"], "gather")):
        assert lk["collective"] == coll and [s["bytes"] for s in lk["samples"]] == [4096, 65536, 1 << 20, 1 << 24]
        assert all(s["seconds"] > 0 for s in lk["samples"])
        assert lk["bandwidth_bps"] > 0 and lk["latency_s"] >= 0
    assert "its all-gather of payload bytes (summable, gather, two-phase) fits" in text
    for r in rows:  # each row priced on the link of its collective (fp16: summable, an all-gather of values)
        lk = link["gather"] if r["collective"] in GATHER_COLLECTIVES else link
        assert r["bandwidth_bps"] == lk["bandwidth_bps"] and r["latency_s"] == lk["latency_s"]
        assert r["workers"] == 2
    # and every candidate's real exchange timed on that link, its verdict beside the model's
    assert "measured ms  here" in text
    base = rows[0]["measured_step_seconds"]
    assert base > 0 and rows[0]["measured_saving_seconds"] == 0
    for r in rows[1:]:
        assert r["measured_step_seconds"] > 0
        assert r["measured_saving_seconds"] == pytest.approx(base - r["measured_step_seconds"])
        line = next(ln for ln in text.splitlines() if ln.startswith(r["name"] + " "))
        # the measured verdict by the same close-call rule as the model's (advise.CLOSE_FRACTION)
        assert line.endswith(verdict(r["measured_saving_seconds"], base)), line


@pytest.mark.mpi
def test_probe_over_real_mpi_ranks_prices_the_measured_link(tmp_path: Path) -> None:
    from tests.procs import run_mpi

    out = tmp_path / "a.json"
    proc = run_mpi("gcodec", [*PROBE_ARGS, "--probe", "mpi", "--json", str(out)], 2, 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("link: measured") == 1  # rank 0 prints, the other rank only measures
    check_probed(proc.stdout, out, "MPI (MPICH")


@pytest.mark.torch
def test_probe_over_real_gloo_ranks_prices_the_measured_link(tmp_path: Path) -> None:
    """Two processes with the environment torchrun gives its workers."""
    pytest.importorskip("torch")
    import os
    import sys

    from gcodec.demo.launch import torchrun_env
    from tests.procs import ROOT, free_port, run_all

    out, port = tmp_path / "a.json", free_port()
    cmd = [sys.executable, "-m", "gcodec", *PROBE_ARGS, "--probe", "torch", "--json", str(out)]
    envs = []
    for r in range(2):
        env = torchrun_env(r, 2, port)
        env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"})
        envs.append(env)
    done = run_all([cmd, cmd], 240, cwd=os.getcwd(), envs=envs, merge_stderr=True)
    texts = [p.stdout for p in done]
    assert [p.returncode for p in done] == [0, 0], texts
    assert texts[1].strip() == ""  # only rank 0 prints
    check_probed(texts[0], out, "torch.distributed (gloo)")


def test_probe_without_a_launcher_or_with_bandwidth_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main([*PROBE_ARGS, "--probe", "torch", "--bandwidth", "1Gbit"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*PROBE_ARGS, "--no-measure"]) == 2
    assert "goes with --probe" in capsys.readouterr().err
    import os

    if "RANK" not in os.environ:  # not itself under torchrun
        assert main([*PROBE_ARGS, "--probe", "torch"]) == 2
        assert "runs under torchrun" in capsys.readouterr().err


@pytest.mark.parametrize(
    "codec, p, mode, bound",
    [
        # every rank sends x, so the mean is x, decoded: the summable mode encodes x / p (exact
        # scaling by 2) in fp16, 2**-11 relative, or 2**-25 absolute where x / 2 is subnormal, and
        # sums p = 2 of them: 2**-11 |x| + 2**-24
        ("fp16", 2, "summable", lambda x: np.abs(x) * 2.0**-11 + 2.0**-24),
        # 8-bit groups of 64: at most half a step, max|group| / 127 / 2, per encode
        ({"id": "uniform", "bits": 8}, 2, "gather", lambda x: np.full(x.shape, np.abs(x).max() / 254)),
        # two-phase re-encodes the owner's chunk of the sum: two such errors
        ({"id": "uniform", "bits": 8}, 4, "two_phase", lambda x: np.full(x.shape, 2 * np.abs(x).max() / 254)),
    ],
)
def test_the_mirror_runs_the_real_protocol_to_the_mean(codec, p, mode, bound) -> None:
    """What measure_transport times is the transports' real protocol, run to its end: on a mirror
    of p ranks that all send x, the result is x within the codec's rounding."""
    from gcodec.transports import TransportState, allreduce_protocol, run_blocking

    x = np.random.default_rng(5).standard_normal(4 * 12288).astype(np.float32)  # even two-phase chunks
    out = np.empty_like(x)
    st = TransportState(codec, error_feedback=False, mode=mode)
    run_blocking(allreduce_protocol(MirrorComm(p), st, x, out, "w", "mean", mode))
    if mode == "two_phase":  # the mirror hands rank 0's owner chunk back as every owner's
        c = x.size // p
        assert all(np.array_equal(out[j * c : (j + 1) * c], out[:c]) for j in range(1, p))
        x, out = x[:c], out[:c]
    assert np.all(np.abs(out - x) <= bound(x))
    assert not np.array_equal(out, x)  # it went through the codec


def test_a_measured_transport_line_replaces_the_formula_and_says_so() -> None:
    sp = CodecSpeed(1e-4, 1e-9, 1e-4, 1e-9, 0.0, 2.0)
    tr = TransportSpeed(5e-4, 4e-9)
    shapes = [(1000, 1000), (4096,)]
    row = predict("fp16", sp, shapes, 4, GBIT, transport=tr)
    assert row["compute_source"] == "transport"
    assert row["compute_seconds"] == pytest.approx(tr.seconds(1_000_000) + tr.seconds(4096))
    assert row["codec_compute_seconds"] == pytest.approx(predict("fp16", sp, shapes, 4, GBIT)["compute_seconds"])
    assert row["step_seconds"] == pytest.approx(row["comm_seconds"] + row["compute_seconds"])
    # PowerSGD's cost depends on the matrices: a line in the element count leaves its formula in
    # place; the times of its matrices (per_shape) replace it, each matrix priced by its own
    psgd = {"id": "powersgd", "rank": 2}
    low = predict(psgd, sp, shapes[:1], 4, GBIT, transport=tr)
    assert low["compute_source"] == "codec"
    timed = TransportSpeed(0.0, 1.0, (3, 0), per_shape=(((1000, 1000), 0.02), ((64, 2048), 0.003)))
    low = predict(psgd, sp, [(1000, 1000), (64, 2048)], 4, GBIT, transport=timed)
    assert low["compute_source"] == "transport" and low["compute_seconds"] == pytest.approx(0.023)
    assert low["rounds"] == [6, 0]  # 3 allreduces a matrix
    assert timed.seconds_of((10, 10)) == pytest.approx(100.0)  # not timed: the line
    # timed as one exchange of all the matrices (the DDP hook's bucket): its rounds are the step's
    joined = TransportSpeed(0.0, 1.0, (3, 0), per_shape=timed.per_shape, joined=True)
    slow = Link(1e9, 1e-4)  # each allreduce's latency: 2 (p - 1) alpha = 0.6 ms
    one = predict(psgd, sp, [(1000, 1000), (64, 2048)], 4, slow, transport=joined)
    two = predict(psgd, sp, [(1000, 1000), (64, 2048)], 4, slow, transport=timed)
    assert one["rounds"] == [3, 0] and one["compute_seconds"] == pytest.approx(0.023)
    assert two["comm_seconds"] - one["comm_seconds"] == pytest.approx(3 * 6e-4)
    assert predict(None, sp, shapes, 4, GBIT, transport=tr)["compute_source"] == "none"


def test_advise_prices_the_transports_timed_protocol_by_default() -> None:
    rows = advise(numel=1 << 16, candidates=[None, "fp16", {"id": "uniform", "bits": 4}], workers=2, repeats=1)
    assert [r["compute_source"] for r in rows] == ["none", "transport", "transport"]
    assert all(r["compute_seconds"] > 0 for r in rows[1:])
    # and the latency of the collectives the protocol was counted running
    assert rows[1]["rounds"] == list(measure_transport("fp16", 2, repeats=1).rounds)
    assert rows[0]["rounds"] is None
    rows = advise(numel=1 << 16, candidates=[None, "fp16"], workers=2, repeats=1, transport=False)
    assert rows[1]["compute_source"] == "codec"
    with pytest.raises(ConfigError, match="matrices"):
        measure_transport({"id": "powersgd", "rank": 2}, 2)
    with pytest.raises(ConfigError, match="matrices"):
        measure_transport({"id": "powersgd", "rank": 2}, 2, shapes=[(4096,)])


def test_powersgds_protocol_is_timed_on_each_of_the_jobs_matrices() -> None:
    """PowerSGD through the transports' protocol on a mirror communicator, one time per distinct
    matrix: the product and orthogonalisation work grows with the sides (m k r for the products),
    so the 512 x 512 matrix costs more than the 64 x 64 one; its collectives per step are counted
    (the control words and P and Q allreduces: at least 2); and advise prices a model with them."""
    psgd = {"id": "powersgd", "rank": 2}
    tr = measure_transport(psgd, 2, repeats=2, shapes=[(512, 512), (64, 64), (512, 512)])
    got = dict(tr.per_shape or ())
    assert sorted(got) == [(64, 64), (512, 512)]
    assert 0 < got[(64, 64)] < got[(512, 512)]
    assert tr.rounds is not None and tr.rounds[0] >= 2
    rows = advise(model={"a": [512, 512], "b": [64, 64]}, candidates=[psgd], workers=2, repeats=1)
    assert rows[0]["compute_source"] == "transport" and rows[0]["compute_seconds"] > 0


def test_powersgds_matrices_are_timed_as_one_exchange_when_joined() -> None:
    """``joined``: one protocol step over every matrix (duplicates included), as the DDP hook sends
    a bucket's: one agreement and one P and one Q allreduce for all of them, where each matrix
    timed alone counts its own; each matrix's share of the step follows its element count, so the
    shares add up to the step, the 512 x 512 matrices' four times the 256 x 256 one's."""
    psgd = {"id": "powersgd", "rank": 2}
    shapes = [(512, 512), (256, 256), (512, 512)]
    alone = measure_transport(psgd, 2, repeats=2, shapes=shapes)
    tr = measure_transport(psgd, 2, repeats=2, shapes=shapes, joined=True)
    assert tr.joined and not alone.joined
    assert tr.rounds == alone.rounds  # one exchange's collectives, for the three matrices
    got = dict(tr.per_shape or ())
    assert sorted(got) == [(256, 256), (512, 512)]
    assert got[(512, 512)] == pytest.approx(4 * got[(256, 256)])
    step = sum(tr.seconds_of(s) for s in shapes)
    assert step == pytest.approx(tr.per_element * sum(int(np.prod(s)) for s in shapes))
    assert step > 0


@pytest.mark.parametrize("p", [2, 5])
def test_fit_link_recovers_an_all_gather_link(p: int) -> None:
    truth = Link(2e9, 300e-6)
    samples = [(b, (p - 1) * (truth.latency_s + b / truth.bytes_per_s)) for b in (4096, 65536, 1 << 20)]
    fit = fit_link(samples, p, collective="gather")
    assert fit.link.bandwidth_bps == pytest.approx(truth.bandwidth_bps, rel=1e-9)
    assert fit.link.latency_s == pytest.approx(truth.latency_s, rel=1e-9)
    with pytest.raises(ConfigError, match="collective"):
        fit_link(samples, p, collective="broadcast")


def test_a_gather_link_prices_gather_and_two_phase_and_moves_the_break_even() -> None:
    """Same bytes, a gather link 4 times slower: the gather collective's communication takes 4
    times as long, the allreduce-based ones do not change, and the break-even bandwidth (in the
    allreduce link's bits/s) rises to where the slower gather's bytes cost as much."""
    fast, slow = Link(8e9, 0.0), Link(2e9, 0.0)
    both = Link(8e9, 0.0, slow)
    n = 1 << 20
    assert comm_seconds("gather", 2, n, both) == pytest.approx(4 * comm_seconds("gather", 2, n, fast))
    assert comm_seconds("two_phase", 4, n, both) == pytest.approx(4 * comm_seconds("two_phase", 4, n, fast))
    # summable's values travel by all-to-all and all-gather too (gcodec sums them, not the engine)
    assert comm_seconds("summable", 4, n, both) == pytest.approx(4 * comm_seconds("summable", 4, n, fast))
    for coll in ("allreduce", "lowrank"):
        assert comm_seconds(coll, 4, n, both) == comm_seconds(coll, 4, n, fast)
    dense = 4 * n
    be = break_even_bps("gather", 2, n / 4, 1e-3, dense, both)
    # where the saving vanishes: dense's 2 (p-1)/p n / beta equals the gather's (p-1) S / (beta/4) + compute
    beta = be / 8
    assert dense / beta == pytest.approx(4 * (n / 4) / beta + 1e-3)


class _Counting:
    """A thread rank's communicator that counts its collectives by kind (as MirrorComm does)."""

    def __init__(self, comm) -> None:  # type: ignore[no-untyped-def]
        self.comm, self.rank, self.size, self.calls = comm, comm.rank, comm.size, {}

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        f = getattr(self.comm, name)

        def counted(*a, **k):  # type: ignore[no-untyped-def]
            self.calls[name] = self.calls.get(name, 0) + 1
            return f(*a, **k)

        return counted


@pytest.mark.parametrize(
    "codec, p",
    [("fp16", 2), ("fp16", 3), ({"id": "randomk", "ratio": 0.013}, 3), ({"id": "uniform", "bits": 4}, 2),
     ({"id": "uniform", "bits": 4}, 3), ({"id": "topk", "ratio": 0.01}, 2)],
)  # fmt: skip
def test_the_mirror_counts_the_collectives_a_real_steady_step_runs(codec, p) -> None:
    """measure_transport's ``rounds`` are the collectives of one steady step of real ranks (thread
    ranks here, a second step after the handshake), split into allreduces and the rest."""
    from gcodec.transports import TransportState, allreduce_protocol, run_blocking
    from tests.localcomm import run_threads

    n = 3 * 4096

    def rank(comm):  # type: ignore[no-untyped-def]
        cc = _Counting(comm)
        st = TransportState(codec, error_feedback=False)
        x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
        run_blocking(allreduce_protocol(cc, st, x.copy(), np.empty_like(x), "w", "mean", "auto"))
        cc.calls.clear()
        run_blocking(allreduce_protocol(cc, st, x.copy(), np.empty_like(x), "w", "mean", "auto"))
        return cc.calls

    calls = run_threads(p, rank)[0]
    assert isinstance(calls, dict), calls
    want = (calls.get("allreduce", 0), sum(v for k, v in calls.items() if k != "allreduce"))
    assert measure_transport(codec, p, repeats=1, sizes=(n, 2 * n)).rounds == want
    assert want[1] >= 2  # at least the control words and the data


def test_counted_rounds_price_the_latency_of_each_collective() -> None:
    link = Link(1e30, 1e-3, Link(1e30, 4e-3))  # latency only; the all-gather's is 4 ms
    # 1 allreduce (2 (p-1) alpha) and 3 all-gathers ((p-1) alpha_gather each), p = 3
    assert comm_seconds("gather", 3, 1e6, link, (1, 3)) == pytest.approx(1 * 4 * 1e-3 + 3 * 2 * 4e-3)
    tr = TransportSpeed(0.0, 1e-9, rounds=(0, 3))
    sp = CodecSpeed(1e-4, 1e-9, 1e-4, 1e-9, 0.0, 2.0)
    row = predict({"id": "uniform", "bits": 4}, sp, [(1000,), (2000,)], 3, link, transport=tr, mode="gather")
    assert row["rounds"] == [0, 6]  # one exchange per tensor
    assert row["comm_seconds"] == pytest.approx(6 * 2 * 4e-3)
    # without counted rounds, the table's one all-gather per exchange
    plain = predict({"id": "uniform", "bits": 4}, sp, [(1000,), (2000,)], 3, link, mode="gather")
    assert plain["rounds"] is None and plain["comm_seconds"] == pytest.approx(2 * 4e-3)


def test_the_transport_is_timed_up_to_the_jobs_largest_tensor() -> None:
    assert transport_sizes([100, 4 << 20, 5000]) == (1 << 14, 4 << 20)
    assert transport_sizes([100]) == (1 << 14, 1 << 16)  # two sizes far enough apart for a line
    assert transport_sizes([1 << 30]) == (1 << 14, 1 << 24)  # bounded: the probe must stay quick
    assert transport_sizes([]) == (1 << 14, 1 << 20)


def test_measure_steps_times_what_predict_prices() -> None:
    """Each candidate's step: every compressed tensor exchanged under its own key, the dense ones in
    one allreduce; the baseline: every byte in one allreduce; PowerSGD only for matrices."""
    from gcodec.advise import measure_steps

    calls: list[tuple] = []

    def exchange(a, cfg, key, state) -> None:  # type: ignore[no-untyped-def]
        assert isinstance(state, gcodec.transports.TransportState) and state.codec.get_config() == cfg
        calls.append(("x", cfg["id"], key, a.shape))

    def dense_allreduce(a) -> None:  # type: ignore[no-untyped-def]
        calls.append(("d", a.shape))

    slow: list[float] = []
    got = measure_steps(
        [None, "fp16", {"id": "powersgd", "rank": 2}],
        [(64, 32), (100,)],
        [(7,), (5,)],
        exchange=exchange,
        dense_allreduce=dense_allreduce,
        make=lambda shape: np.zeros(shape, np.float32),
        barrier=lambda: None,
        slowest=lambda t: slow.append(t) or 2 * t,
        repeats=2,
    )
    assert set(got) == {"null", json.dumps(gcodec.get_codec("fp16").get_config(), sort_keys=True)}  # no PowerSGD
    assert all(v >= 0 for v in got.values()) and list(got.values()) == [2 * t for t in slow]  # the slowest rank's
    steps = 3  # one untimed, two timed
    assert calls[:steps] == [("d", (64 * 32 + 100 + 12,))] * steps  # the baseline: one allreduce of everything
    one = [("x", "fp16", "t0", (64, 32)), ("x", "fp16", "t1", (100,)), ("d", (12,))]
    assert calls[steps:] == one * steps
    # with an evictor: the caches read over before every step's barrier, untimed steps included
    order: list[str] = []
    measure_steps(
        [None, "fp16"],
        [(64, 32)],
        [],
        exchange=lambda *a: order.append("x"),
        dense_allreduce=lambda a: order.append("d"),
        make=lambda shape: np.zeros(shape, np.float32),
        barrier=lambda: order.append("b"),
        slowest=lambda t: t,
        repeats=2,
        evict=lambda: order.append("e"),
    )
    assert order == ["e", "b", "d"] * steps + ["e", "b", "x"] * steps
