"""Drill traces replay, and look as documented: steady, never pulsing, with the host's peaks."""

from __future__ import annotations

import json

import pytest

from exporter.backends.replay import parse_trace
from exporter.hardware.gpus import peaks_of, product_of
from exporter.lab.refengine.gputrace import (
    DEVICE_NAME,
    FLOPS_PER_CLOCK,
    LOOKS,
    SCENARIO_LOOK,
    HostPeaks,
    mean_utilization,
    measure_host,
    trace_lines,
)


@pytest.mark.parametrize("look", sorted(LOOKS))
def test_trace_replays_with_the_documented_mean(look: str) -> None:
    lines = trace_lines(look)
    trace = parse_trace(lines, look)
    assert len(trace.gpus) == 1
    assert mean_utilization(lines) == pytest.approx(LOOKS[look], abs=2.0)
    samples = [v for line in lines[1:] for _, v in json.loads(line)["samples"]]
    # Not pulsing: the pulsing signature counts samples at or below 5 % and above 90 %.
    assert not [v for v in samples if v <= 5 or v > 90]
    assert trace_lines(look) == lines  # deterministic


def test_every_cpu_scenario_has_a_look() -> None:
    assert set(SCENARIO_LOOK.values()) <= set(LOOKS)
    assert SCENARIO_LOOK["queue-flood"] == "busy"


HOST = HostPeaks(memory_bandwidth=26.3e9, matmul_flops=94.7e9, threads=1, how="test")


def test_host_peaks_come_back_from_the_replayed_nvml_facts() -> None:
    lines = trace_lines("starved", host=HOST)
    gpu = parse_trace(lines, "starved").gpus[0]
    assert gpu.name == DEVICE_NAME and product_of(gpu.name) is None  # no datasheet applies
    peaks = peaks_of(gpu.name, gpu.facts)
    assert peaks.memory_bandwidth == pytest.approx(HOST.memory_bandwidth, rel=1e-3)
    assert peaks.flops["bf16"] == pytest.approx(HOST.matmul_flops, rel=1e-2)
    assert peaks.flops["fp16"] == peaks.flops["bf16"]
    record = json.loads(lines[1])
    assert record["clocks_mhz"] == [gpu.facts.max_sm_clock_mhz, gpu.facts.max_memory_clock_mhz]
    assert trace_lines("starved", host=HOST) == lines  # deterministic for given peaks
    assert "facts" not in json.loads(trace_lines("starved")[0])["gpus"][0]


def test_a_slowed_worker_replays_a_gpu_as_much_slower() -> None:
    """--worker-slowdown 8 stands in for an accelerator 8x slower: its replayed peaks are the
    host's divided by 8, so the decode floor stays as far from the (slowed) step."""
    slow = HOST.slowed(8.0)
    assert HOST.slowed(1.0) == HOST
    gpu = parse_trace(trace_lines("starved", host=slow), "starved").gpus[0]
    peaks = peaks_of(gpu.name, gpu.facts)
    assert peaks.memory_bandwidth == pytest.approx(HOST.memory_bandwidth / 8, rel=1e-2)
    # NVML clocks are whole MHz: within half a clock's worth of FLOPs.
    half_mhz = FLOPS_PER_CLOCK * 1e6 / 2
    assert peaks.flops["bf16"] == pytest.approx(HOST.matmul_flops / 8, abs=half_mhz)
    assert "slowdown 8" in slow.how


def test_the_replayed_gpu_gets_the_share_of_the_host_a_thread_gets_now() -> None:
    quiet = HostPeaks(memory_bandwidth=10e9, matmul_flops=100e9, sustained_bandwidth=11e9)
    assert quiet.available() == quiet  # no slower than its fastest pass: the hardware
    busy = HostPeaks(memory_bandwidth=10e9, matmul_flops=100e9, sustained_bandwidth=4e9)
    shared = busy.available()
    assert (shared.memory_bandwidth, shared.matmul_flops) == (4e9, pytest.approx(40e9))
    assert "40% of the fastest pass" in shared.how
    assert HostPeaks(memory_bandwidth=10e9, matmul_flops=1e9).available().memory_bandwidth == 10e9


def test_measure_host_measures_this_machine() -> None:
    host = measure_host(threads=1)
    assert host.threads == 1
    # Plausible for any machine that runs the drills: 1 GB/s .. 10 TB/s, 1 .. 100,000 GFLOP/s.
    assert 1e9 < host.memory_bandwidth < 1e13
    assert 1e9 < host.matmul_flops < 1e14
    assert "fastest of 10 passes" in host.how
    # By the wall clock, back to back: never above the fastest pass by more than noise.
    assert 0 < host.sustained_bandwidth < 1.3 * host.memory_bandwidth
