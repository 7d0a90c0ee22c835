"""``record``: a trace written from a replay holds what the source held, and replays the same."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from support.clock import FakeClock
from support.paths import ROOT, TRACE

from exporter.backends.pidns import FixedPids
from exporter.backends.replay import ReplayApi, Trace, TraceRecord, load_trace, parse_trace
from exporter.collectors.nvml import NvmlCollector
from exporter.recorder import record_with

INTERVAL = 0.5
# Reads at t = 0, 0.5, 1.0, 1.5, 2.0: 0.2 s of margin on either side of the loop's end.
DURATION = 2.2
READS_PER_GPU = 5
# A read takes well under a millisecond on the replay; this bounds how far the replay's clock
# (started at init) can be ahead of the ``t`` the recorder writes before the read.
LAG_S = 0.05
# First read: 9 fields + the GPM sample + both PCIe calls (no GPM values yet to replace them)
# + the two per-process calls (NOT_SUPPORTED: the trace has no processes, so not asked again)
# + the field values, fabric and power profiles (not an H100's: not asked again); later reads:
# GPM supplies PCIe, so 9 fields + the GPM sample + the field values (fabric: every tenth read).
FIRST_READ_CALLS = 17
LATER_READ_CALLS = 11
UNSUPPORTED = ["power_profiles", "process_utilization", "processes"]  # not in this trace


@pytest.fixture(scope="module")
def source() -> Trace:
    return load_trace(TRACE)


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory, source: Trace
) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("record") / "recorded.jsonl"
    summary = record_with(ReplayApi(source), out, duration=DURATION, interval=INTERVAL)
    return out, summary


def candidates(source: Trace, gpu: int, t: float) -> list[TraceRecord]:
    """The source records a read starting at recorder time ``t`` may have seen."""
    recs = source.records[gpu]
    times = [r.t for r in recs]
    out = []
    for at in (t, t + LAG_S):
        i = max(i for i, rt in enumerate(times) if rt <= at)
        if recs[i] not in out:
            out.append(recs[i])
    return out


def is_contiguous_run(part: list[float], whole: list[float]) -> bool:
    n = len(part)
    return any(whole[i : i + n] == part for i in range(len(whole) - n + 1))


def test_header_names_the_source_gpus_and_is_not_synthetic(
    recorded: tuple[Path, dict[str, Any]], source: Trace
) -> None:
    out, _ = recorded
    header = json.loads(out.read_text().splitlines()[0])
    assert header["kind"] == "header"
    assert header["format"] == "inference-bottleneck-exporter/nvml-trace"
    assert header["version"] == 1
    assert header["synthetic"] is False
    assert header["driver_version"] == "550.54.15"
    # identity round-trips exactly: same uuid, name, bus id, MIG mode and GPM support, and the
    # hardware facts behind the peak figures; of the source's constant answers (fields,
    # fabric) the header keeps the link count, the records carry the rest as read
    session = [
        {k: v for k, v in g.items() if k not in ("fields", "fabric")} for g in header["gpus"]
    ]
    assert session == [
        {k: v for k, v in g.items() if k not in ("fields", "fabric")} for g in source.header["gpus"]
    ]
    assert [g["fields"] for g in header["gpus"]] == [{"nvlink_link_count": 18}] * 2
    assert header["gpus"][0]["facts"] == {
        "memory_bus_width_bits": 5120,
        "max_clocks_mhz": [1980, 2619],
        "cuda_cores": 16896,
        "compute_capability": [9, 0],
    }
    assert header["description"] == (
        "Recorded by inference-bottleneck-exporter record on NVIDIA H100 80GB HBM3"
    )
    assert DURATION <= header["duration_s"] < DURATION + 1.0


def test_records_hold_the_source_values(
    recorded: tuple[Path, dict[str, Any]], source: Trace
) -> None:
    out, _ = recorded
    trace = parse_trace(out.read_text().splitlines(), str(out))
    assert [g.index for g in trace.gpus] == [0, 1]
    for gpu in (0, 1):
        recs = trace.records[gpu]
        assert len(recs) == READS_PER_GPU
        times = [r.t for r in recs]
        assert times == sorted(times) and len(set(times)) == len(times)
        for k, t in enumerate(times):
            assert k * INTERVAL <= t < k * INTERVAL + 0.1
        for k, rec in enumerate(recs):
            options = candidates(source, gpu, rec.t)
            assert rec.error is None
            for key in ("power_mw", "temp_c", "util", "memory", "clocks_mhz", "clock_events"):
                assert rec.values[key] in [o.values[key] for o in options], (gpu, rec.t, key)
            # energy is a counter read in the first loop: the source's value, not an offset one
            assert rec.values["energy_mj"] in [o.values["energy_mj"] for o in options]
            # the links and power state as every read answered them (the source's constants)
            gpu_entry = source.header["gpus"][gpu]
            fields = {k: v for k, v in gpu_entry["fields"].items() if k != "nvlink_link_count"}
            assert rec.values["fields"] == fields
            assert rec.values["fabric"] == gpu_entry["fabric"]
            # GPM needs two samples: nothing on the first read, every metric from then on
            if k == 0:
                assert "gpm" not in rec.values
                assert rec.values["pcie_kibps"] == options[0].values["pcie_kibps"]
            else:
                assert rec.values["gpm"] in [o.values["gpm"] for o in options], (gpu, rec.t)
                assert "pcie_kibps" not in rec.values  # GPM gave PCIe: no extra calls


def test_samples_are_a_contiguous_run_of_the_source(
    recorded: tuple[Path, dict[str, Any]], source: Trace
) -> None:
    out, _ = recorded
    trace = parse_trace(out.read_text().splitlines(), str(out))
    for gpu in (0, 1):
        src = [s for r in source.records[gpu] for s in r.samples]
        got = [s for r in trace.records[gpu] for s in r.samples]
        src_values = [v for _, v in src]
        got_values = [v for _, v in got]
        # 2 s at one sample per 1/6 s, plus the 12 samples buffered before the start
        assert len(got) >= 12 + 10
        assert is_contiguous_run(got_values, src_values)
        # the first read drains the buffer from its oldest sample
        assert got_values[: len(source.records[gpu][0].samples)] == [
            v for _, v in source.records[gpu][0].samples
        ]
        # timestamps keep their spacing: one constant shift (replay start vs record start)
        shifts = {g[0] - s[0] for g, s in zip(got, src, strict=False)}
        assert len(shifts) == 1
        assert abs(shifts.pop()) < 100_000
        # no sample appears twice across reads
        assert len({ts for ts, _ in got}) == len(got)


def test_summary_counts_calls_within_budget(recorded: tuple[Path, dict[str, Any]]) -> None:
    _, summary = recorded
    assert summary["gpus"] == 2
    assert summary["reads"] == 2 * READS_PER_GPU
    assert summary["calls"] == 2 * (FIRST_READ_CALLS + (READS_PER_GPU - 1) * LATER_READ_CALLS)
    assert summary["unsupported"] == {"0": UNSUPPORTED, "1": UNSUPPORTED}
    calls_per_read = summary["calls"] / summary["reads"]
    assert calls_per_read <= 12.2
    # at the default 3 s poll interval that is at most 5 calls per GPU per second
    assert calls_per_read / 3.0 <= 5
    # the reported rate is calls / elapsed / GPUs, elapsed being the recording's length
    elapsed = summary["calls"] / 2 / summary["calls_per_gpu_per_second"]
    assert DURATION <= elapsed < DURATION + 1.0
    assert 0 < summary["median_call_seconds"] <= summary["p99_call_seconds"] < 0.1


class Registered:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics


def test_replaying_the_recording_reproduces_the_source(
    recorded: tuple[Path, dict[str, Any]], source: Trace
) -> None:
    out, _ = recorded
    trace = parse_trace(out.read_text().splitlines(), str(out))
    clock = FakeClock()
    start = clock.now
    api = ReplayApi(trace, clock=clock, wall_us=lambda: 1_700_000_000_000_000)
    collector = NvmlCollector(lambda: api, poll_interval=3600, deadline=2.0, clock=clock)
    collector.start()
    try:
        assert collector.wait_ready(5)
        # Step to each recorded read in time order (both GPUs' reads interleave).
        reads = sorted((r.t, r.gpu, r) for recs in trace.records.values() for r in recs)
        seen: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
        for t, gpu, rec in reads:
            clock.now = start + t + 1e-6
            collector.poll_now()
            registry = CollectorRegistry(auto_describe=False)
            registry.register(Registered(collector.collect().metrics))
            labels = {"gpu": str(gpu), "uuid": trace.gpus[gpu].uuid}
            power = registry.get_sample_value("inference_gpu_power_watts", labels)
            temp = registry.get_sample_value("inference_gpu_temperature_celsius", labels)
            assert power is not None and temp is not None
            assert math.isclose(power, rec.values["power_mw"] / 1000)
            assert temp == rec.values["temp_c"]
            options = candidates(source, gpu, t)
            assert rec.values["power_mw"] in [o.values["power_mw"] for o in options]
            assert rec.values["temp_c"] in [o.values["temp_c"] for o in options]
            seen[gpu].append((power, temp))
        # the very first read is the source's first record, exactly
        assert seen[0][0] == (545.02, 65.0)
        assert seen[1][0] == (624.669, 69.0)
    finally:
        collector.stop(2)


def test_cli_record_from_replay_prints_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "cli.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "record",
            "--duration",
            "2s",
            "--gpu.poll-interval",
            "500ms",
            "--gpu.replay-file",
            str(TRACE),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["gpus"] == 2
    assert summary["reads"] == 8  # reads at 0, 0.5, 1.0 and 1.5 s for each GPU
    assert summary["calls"] == 2 * (FIRST_READ_CALLS + 3 * LATER_READ_CALLS)
    assert summary["unsupported"] == {"0": UNSUPPORTED, "1": UNSUPPORTED}
    trace = load_trace(out)
    assert trace.header["synthetic"] is False
    assert [len(trace.records[g]) for g in (0, 1)] == [4, 4]


@pytest.mark.skipif(
    Path("/dev/nvidiactl").exists(),
    reason="this machine has an NVIDIA driver; the test needs one without (as in CI)",
)
def test_cli_record_without_nvml_fails_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "none.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "record", "--duration", "1s", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "level=error" in lines[0]
    assert "NVML" in lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()


# --- shared GPUs: MIG devices and per-process reads -------------------------------------------
SHARED = ROOT / "tests" / "fixtures" / "traces"


def record_shared(tmp_path: Path, name: str) -> tuple[Trace, Trace, dict[str, Any]]:
    source = load_trace(SHARED / name)
    out = tmp_path / name
    assert source.engine_pids is not None
    summary = record_with(
        ReplayApi(source),
        out,
        duration=DURATION,
        interval=INTERVAL,
        engine=FixedPids(source.engine_pids),
    )
    return source, parse_trace(out.read_text().splitlines(), str(out)), summary


def test_record_writes_mig_devices(tmp_path: Path) -> None:
    source, trace, summary = record_shared(tmp_path, "replay-mig-7slice-synthetic.jsonl")
    assert trace.gpus[0].mig_devices == source.gpus[0].mig_devices
    assert trace.gpus[0].max_mig_devices == 7
    assert sorted(trace.mig_records) == [(0, slot) for slot in range(7)]
    for (gpu, slot), recs in trace.mig_records.items():
        assert len(recs) == READS_PER_GPU
        src = source.mig_records[(gpu, slot)]
        for k, rec in enumerate(recs):
            options = candidates_of(src, rec.t)
            assert rec.values["memory"] in [o.values["memory"] for o in options]
            assert rec.values["processes"] in [o.values["processes"] for o in options]
            assert "power_mw" not in rec.values  # the GPU's, never asked of a MIG device
            assert rec.buffers == frozenset()  # no sample buffers on MIG: none written
            if k:
                assert rec.values["gpm"] in [o.values["gpm"] for o in options]
    for rec in trace.records[0]:
        assert "samples" not in rec.buffers and "processes" not in rec.values
    assert trace.engine_pids == source.engine_pids
    unsupported = set(summary["unsupported"]["0:3"])
    # what MIG does not support, found on the first read; what is the GPU's, never asked
    assert {"process_utilization", "samples", "utilization_rates"} <= unsupported
    assert {"power", "temperature", "pcie_tx"} <= unsupported
    assert "gpm" not in unsupported and "processes" not in unsupported


def test_record_writes_per_process_samples(tmp_path: Path) -> None:
    source, trace, summary = record_shared(tmp_path, "replay-timesliced-2tenant-synthetic.jsonl")
    recs = trace.records[0]
    assert all(r.values["processes"] == source.records[0][0].values["processes"] for r in recs)
    got = [s for r in recs for s in r.process_samples]
    want = [s for r in source.records[0] for s in r.process_samples]
    # every sample once, in order; timestamps shifted by one constant (replay vs record start)
    assert got and is_contiguous_run([s[1:] for s in got], [s[1:] for s in want])
    shifts = {g[0] - w[0] for g, w in zip(got, want, strict=False)}
    assert len(shifts) == 1 and abs(shifts.pop()) < 100_000
    assert trace.engine_pids == frozenset({52000})
    assert summary["engine_pids"] == [52000]
    # replaying the recording answers the same processes
    again, first = ReplayApi(trace), ReplayApi(source)
    again.init()
    first.init()
    assert again.compute_processes(0) == first.compute_processes(0)


def candidates_of(recs: list[TraceRecord], t: float) -> list[TraceRecord]:
    times = [r.t for r in recs]
    out = []
    for at in (t, t + LAG_S):
        i = max(i for i, rt in enumerate(times) if rt <= at)
        if recs[i] not in out:
            out.append(recs[i])
    return out


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--process.match", "vllm("], "--process.match"),
        (["--gpu.host-procfs", "/nonexistent"], "--gpu.host-procfs"),
    ],
)
def test_cli_record_bad_engine_flags_exit_2(tmp_path: Path, flags: list[str], problem: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "record", "--out", str(tmp_path / "x"), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and problem in result.stderr


def test_cli_record_takes_the_gpu_flags_as_serve_declares_them(tmp_path: Path) -> None:
    """One declaration of --gpu.poll-interval: record has the server's bounds and default."""
    command = [sys.executable, "-m", "exporter.cli", "record", "--out", str(tmp_path / "x")]
    result = subprocess.run(
        [*command, "--gpu.poll-interval", "100ms"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "inference-bottleneck-exporter: error: --gpu.poll-interval: 100ms is below the "
        "minimum 500ms\n"
    )
    helped = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "record", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "COLUMNS": "1000"},
    )
    assert helped.returncode == 0
    assert (
        "How often each GPU is read (about 11 NVML calls per read). (default: 3s)\n"
        in helped.stdout
    )
