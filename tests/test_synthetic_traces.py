"""The synthetic trace generator and the trace shipped with the package."""

from __future__ import annotations

import itertools
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT
from support.synthetic import (
    MEMORY_TOTAL_BYTES,
    synthetic_trace_lines,
    write_synthetic_trace,
)
from support.synthetic_cli import main
from support.synthetic_shared import mig_trace_lines, timesliced_trace_lines

import exporter
from exporter.backends.nvml_api import GPM_BASE_NAMES
from exporter.backends.replay import Trace, TraceRecord, load_trace, parse_trace

SHIPPED = Path(exporter.__file__).parent / "data" / "replay-2gpu-synthetic.jsonl"
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
PCI = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:00\.0$")


@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(SHIPPED)


def _samples(recs: list[TraceRecord], *, from_zero: bool = False) -> list[float]:
    return [v for r in recs for ts, v in r.samples if not from_zero or ts >= 0]


def test_shipped_file_is_a_fresh_generation() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == "\n".join(synthetic_trace_lines()) + "\n"


def test_shipped_file_is_small() -> None:
    assert SHIPPED.stat().st_size < 300_000


def test_output_is_deterministic_and_seeded() -> None:
    assert synthetic_trace_lines(gpus=3, duration_s=10) == synthetic_trace_lines(
        gpus=3, duration_s=10
    )
    assert synthetic_trace_lines(duration_s=10, seed=8) != synthetic_trace_lines(duration_s=10)


def test_gpu_streams_do_not_depend_on_the_gpu_count() -> None:
    two = parse_trace(synthetic_trace_lines(gpus=2, duration_s=20))
    eight = parse_trace(synthetic_trace_lines(gpus=8, duration_s=20))
    assert two.gpus == eight.gpus[:2]
    assert two.records[0] == eight.records[0]
    assert two.records[1] == eight.records[1]


def test_lines_are_canonical_json() -> None:
    for line in synthetic_trace_lines(duration_s=5):
        assert line == json.dumps(json.loads(line), sort_keys=True, separators=(",", ":"))


def test_header_says_it_is_synthetic(trace: Trace) -> None:
    header = trace.header
    assert header["synthetic"] is True
    description = header["description"]
    for phrase in ("synthetic", "support.synthetic", "H100", "LLM", "record"):
        assert phrase.lower() in description.lower()
    assert re.fullmatch(r"\d{3}\.\d+\.\d+", trace.driver_version)
    assert trace.duration_s == 120.0


def test_gpu_identities(trace: Trace) -> None:
    assert len(trace.gpus) == 2
    for gpu in trace.gpus:
        assert gpu.name == "NVIDIA H100 80GB HBM3"
        assert UUID.match(gpu.uuid)
        assert PCI.match(gpu.pci_bus_id)
        assert gpu.mig_mode == 0
        assert gpu.gpm is True
    assert trace.gpus[0].pci_bus_id == "00000000:18:00.0"
    assert trace.gpus[1].pci_bus_id == "00000000:2A:00.0"
    many = parse_trace(synthetic_trace_lines(gpus=20, duration_s=2)).gpus
    assert len({g.pci_bus_id for g in many}) == 20
    assert len({g.uuid for g in many}) == 20


def test_records_every_second_without_faults(trace: Trace) -> None:
    for recs in trace.records.values():
        assert [r.t for r in recs] == [float(k) for k in range(120)]
        assert all(r.error is None and r.xids == [] and r.hang_s == 0 for r in recs)


def test_sample_timestamps_strictly_increase(trace: Trace) -> None:
    for recs in trace.records.values():
        stamps = [ts for r in recs for ts, _ in r.samples]
        assert all(a < b for a, b in itertools.pairwise(stamps))
        gaps = {b - a for a, b in itertools.pairwise(stamps)}
        assert gaps <= {166_666, 166_667}  # the driver's 1/6 s sampling


def test_samples_belong_to_their_record(trace: Trace) -> None:
    for recs in trace.records.values():
        first = recs[0].samples
        assert all(-2_000_000 <= ts <= 0 for ts, _ in first)
        assert len(first) >= 10  # ~2 s of pre-start buffer
        for prev, rec in itertools.pairwise(recs):
            assert rec.samples
            assert all(prev.t * 1e6 < ts <= rec.t * 1e6 for ts, _ in rec.samples)


def test_energy_strictly_increases_with_power(trace: Trace) -> None:
    for recs in trace.records.values():
        for prev, rec in itertools.pairwise(recs):
            step = rec.values["energy_mj"] - prev.values["energy_mj"]
            power = (prev.values["power_mw"] + rec.values["power_mw"]) / 2
            assert step > 0
            assert step == pytest.approx(power * (rec.t - prev.t), rel=0.01)


def test_gpu0_pulses(trace: Trace) -> None:
    samples = _samples(trace.records[0], from_zero=True)
    assert 55 <= statistics.mean(samples) <= 75
    low = sum(v <= 5 for v in samples) / len(samples)
    high = sum(v >= 90 for v in samples) / len(samples)
    assert low >= 0.15
    assert high >= 0.40


def test_gpu1_is_steadier(trace: Trace) -> None:
    gpu0 = _samples(trace.records[0], from_zero=True)
    gpu1 = _samples(trace.records[1], from_zero=True)
    assert 75 <= statistics.mean(gpu1) <= 85
    assert statistics.pstdev(gpu1) < statistics.pstdev(gpu0) / 3
    assert min(gpu1) > 40


def test_further_gpus_lie_between_the_patterns() -> None:
    trace = parse_trace(synthetic_trace_lines(gpus=8, duration_s=60))
    spread = [statistics.pstdev(_samples(trace.records[i], from_zero=True)) for i in range(8)]
    for index in range(2, 8):
        samples = _samples(trace.records[index], from_zero=True)
        assert 60 <= statistics.mean(samples) <= 85
        assert spread[1] < spread[index] < spread[0]
    assert len({round(s) for s in spread}) == 8


def test_record_values_are_in_nvml_units(trace: Trace) -> None:
    for recs in trace.records.values():
        for rec in recs:
            v = rec.values
            gpu_pct, mem_pct = v["util"]
            assert 0 <= gpu_pct <= 100 and 0 <= mem_pct <= 100
            used, total = v["memory"]
            assert total == MEMORY_TOTAL_BYTES == 80 * 1024**3
            assert 0.89 < used / total < 0.92
            assert 250_000 <= v["power_mw"] <= 690_000
            assert 45 <= v["temp_c"] <= 75
            sm, mem = v["clocks_mhz"]
            assert 1800 <= sm <= 1980 and mem == 2619
            assert v["clock_events"] in (0, 0x1)
            gpm = v["gpm"]
            # every base metric, and the NVLink totals of an HGX board (no per-link rates)
            assert set(gpm) == {*GPM_BASE_NAMES.values(), "nvlink_tx_per_sec", "nvlink_rx_per_sec"}
            peak_mib_s = 18 * 26562e6 / 1024**2
            assert 0 <= gpm["nvlink_rx_per_sec"] <= gpm["nvlink_tx_per_sec"] <= 0.15 * peak_mib_s
            assert 30 <= gpm["dram_bw_util"] <= 85
            for name in ("sm_util", "sm_occupancy", "any_tensor_util"):
                assert 0 <= gpm[name] <= 100
            tx, rx = v["pcie_kibps"]
            assert tx == round(gpm["pcie_tx_per_sec"] * 1024)
            assert rx == round(gpm["pcie_rx_per_sec"] * 1024)


def test_power_and_bandwidth_follow_utilisation(trace: Trace) -> None:
    recs = trace.records[0]
    util = [r.values["util"][0] for r in recs]
    power = [r.values["power_mw"] for r in recs]
    dram = [r.values["gpm"]["dram_bw_util"] for r in recs]
    assert statistics.correlation(util, power) > 0.8
    assert statistics.correlation(util, dram) > 0.8


def test_write_synthetic_trace(tmp_path: Path) -> None:
    out = write_synthetic_trace(tmp_path / "t.jsonl", gpus=1, duration_s=5, seed=3)
    expected = "\n".join(synthetic_trace_lines(gpus=1, duration_s=5, seed=3)) + "\n"
    assert out.read_bytes() == expected.encode()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"gpus": 0}, "gpus"),
        ({"duration_s": 0}, "duration_s"),
        ({"record_interval_s": -1}, "record_interval_s"),
        ({"sample_period_s": float("nan")}, "sample_period_s"),
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        synthetic_trace_lines(**kwargs)  # type: ignore[arg-type]


def test_partial_last_interval() -> None:
    trace = parse_trace(synthetic_trace_lines(gpus=1, duration_s=4.5))
    assert [r.t for r in trace.records[0]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert trace.duration_s == 4.5


@pytest.mark.parametrize("text", ["0s", "90", "-5s", "2x"])
def test_cli_refuses_a_bad_duration_in_one_line(text: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "support.synthetic_cli", "--duration", text],
        cwd=ROOT / "tests",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--duration" in result.stderr


def test_cli_writes_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "eight.jsonl"
    assert main(["--gpus", "8", "--duration", "60s", "--out", str(out)]) == 0
    trace = load_trace(out)
    assert len(trace.gpus) == 8
    assert len({g.pci_bus_id for g in trace.gpus}) == 8
    assert trace.duration_s == 60.0
    assert all(len(recs) == 60 for recs in trace.records.values())


def test_cli_writes_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpus", "1", "--duration", "3s"]) == 0
    assert capsys.readouterr().out == "\n".join(synthetic_trace_lines(1, 3.0)) + "\n"


def test_cli_writes_the_shared_gpu_traces(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kind", "mig", "--product", "a100", "--duration", "3s"]) == 0
    assert capsys.readouterr().out == "\n".join(mig_trace_lines("a100", 3.0)) + "\n"
    assert main(["--kind", "timesliced", "--tenants", "1", "--duration", "3s"]) == 0
    assert capsys.readouterr().out == "\n".join(timesliced_trace_lines(1, 3.0)) + "\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--kind", "mig", "--product", "b200"],
        ["--kind", "timesliced", "--tenants", "3"],
        ["--duration", "2x"],
        ["--duration", "0s"],
        ["--gpus", "0"],
        ["--gpus", "many"],
        ["--seed", "x"],
        ["--nonsense"],
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "error" in captured.err


def test_cli_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path / "missing" / "t.jsonl")]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
