"""The bundled trace recorded on a real GPU (`exporter/data/replay-h200-idle-recorded.jsonl`).

Recorded by ``inference-bottleneck-exporter record --gpu.poll-interval 1s`` for 40 s on an idle
NVIDIA H200 (driver 580.159.04, bench/gpu/run.sh). Unlike the synthetic traces, every value here
is what the driver answered, so these tests pin what the stand-ins assume: the sample period,
the depth of the driver's sample buffer, the facts the peaks come from, GPM, the idle clock
event and the units of the readings.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.clock import FakeClock
from support.process import ExporterProcess

import exporter
from exporter.backends.gpu_reader import GpuReader, read_identity
from exporter.backends.replay import ReplayApi, load_trace
from exporter.hardware.gpus import peaks_of
from exporter.metrics import CLOCK_EVENT_BITS

RECORDED = Path(exporter.__file__).parent / "data" / "replay-h200-idle-recorded.jsonl"
WALL0 = 1_800_000_000_000_000  # µs


@pytest.fixture
def reader() -> tuple[GpuReader, FakeClock]:
    clock = FakeClock()
    api = ReplayApi(load_trace(RECORDED), clock=clock, wall_us=lambda: WALL0)
    api.init()
    handle = api.handle(0)
    return GpuReader(api, read_identity(api, 0, handle), handle, clock=clock), clock


def test_header_says_recorded_on_an_h200() -> None:
    trace = load_trace(RECORDED)
    assert trace.header["synthetic"] is False
    assert trace.header["driver_version"] == "580.159.04"
    assert trace.header["duration_s"] == pytest.approx(40, abs=1)
    (gpu,) = trace.header["gpus"]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["gpm"] is True
    assert gpu["mig_mode"] == 0


def test_peaks_from_the_real_facts_match_the_datasheet(
    reader: tuple[GpuReader, FakeClock],
) -> None:
    """NVML's own bus width and memory clock give the datasheet's 4.8 TB/s within 0.5 %, so
    the formula the sidecar uses for GPUs outside the product table holds on this one; the
    tensor peak is the datasheet's 989 TFLOPS dense bf16 (132 SMs at the 1830 MHz tensor
    clock, not NVML's 1980 MHz maximum)."""
    gpu, _ = reader
    facts = gpu.identity.facts
    assert facts.memory_bus_width_bits == 6016  # not the 6144 of six full HBM3e stacks
    assert facts.max_memory_clock_mhz == 3201
    assert facts.max_sm_clock_mhz == 1980
    assert facts.cuda_cores == 132 * 128
    assert facts.compute_capability == (9, 0)
    from_facts = facts.memory_bus_width_bits / 8 * facts.max_memory_clock_mhz * 1e6 * 2
    assert from_facts == pytest.approx(4.8e12, rel=0.005)
    peaks = peaks_of(gpu.identity.name, facts)
    assert peaks.memory_bandwidth == 4.8e12
    assert peaks.sms == 132
    assert peaks.flops["bf16"] == pytest.approx(989.4e12, rel=0.001)


def test_driver_samples_every_200ms_and_buffers_14s(reader: tuple[GpuReader, FakeClock]) -> None:
    """The first read drains the driver's buffer (71 samples, 14 s of history); each later
    read returns only newer samples, 200 ms apart, each once."""
    gpu, clock = reader
    first = gpu.read()
    assert len(first.samples) == 71
    span_s = (first.samples[-1][0] - first.samples[0][0]) / 1e6
    assert span_s == pytest.approx(14.0, abs=0.2)
    seen = [t for t, _ in first.samples]
    counts = []
    for _ in range(10):
        clock.advance(3.0)
        reading = gpu.read()
        counts.append(len(reading.samples))
        seen += [t for t, _ in reading.samples]
    assert seen == sorted(set(seen))
    gaps_ms = [(b - a) / 1e3 for a, b in itertools.pairwise(seen)]
    assert statistics.median(gaps_ms) == pytest.approx(200, abs=1)
    assert max(gaps_ms) < 205
    assert statistics.median(counts) == 15  # 3 s of 200 ms samples


def test_idle_readings(reader: tuple[GpuReader, FakeClock]) -> None:
    """An idle H200 as NVML reports it: every sample 0, the clock-event reason `gpu_idle`,
    ~645 MB of 140.4 GiB used by the driver itself, about 80 W; GPM answers from the second
    sample on and then supplies PCIe (the legacy 20 ms PCIe calls are made on the first poll
    only)."""
    gpu, clock = reader
    first = gpu.read()
    assert first.pcie_tx_kibps is not None and not first.gpm
    clock.advance(3.0)
    reading = gpu.read()
    assert {value for _, value in first.samples + reading.samples} == {0.0}
    assert reading.clock_events == CLOCK_EVENT_BITS["gpu_idle"]
    assert reading.memory_total_bytes == 150_754_820_096
    assert reading.memory_used_bytes is not None
    assert reading.memory_used_bytes / reading.memory_total_bytes < 0.005
    assert reading.power_mw is not None and 60_000 < reading.power_mw < 100_000
    assert reading.gpm["sm_util"] == 0.0
    assert 0 < reading.gpm["dram_bw_util"] < 0.01
    assert reading.pcie_tx_kibps is None  # GPM supplies PCIe from here on
    # Recorded before the links and the power state were read: they answer NOT_SUPPORTED, as
    # on a driver without them, and cost no call after the first read.
    assert gpu.unsupported == {"power_limit", "fabric", "power_profiles"}


def test_sidecar_serves_the_recorded_gpu(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    """The whole sidecar over the recorded trace: the H200's peaks and an idle GPU."""
    proc = exporter_process("--gpu.replay-file", str(RECORDED), "--no-collector.engine")
    proc.wait_ready()
    values: dict[str, float] = {}

    def scraped() -> bool:
        status, _, body = proc.get("/metrics")
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.labels.get("gpu") == "0":
                    values.setdefault(sample.name, sample.value)
        return status == 200 and "inference_gpu_peak_memory_bandwidth_bytes_per_second" in values

    proc.wait_for(scraped)
    assert values["inference_gpu_peak_memory_bandwidth_bytes_per_second"] == 4.8e12
    assert values["inference_gpu_utilization_ratio"] == 0.0
    assert values["inference_gpu_memory_total_bytes"] == 150_754_820_096
