"""The nvml collector over the replay and fault-injecting backends, with a stepped clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.clock import FakeClock
from support.metrics import registry_of
from support.nvml import FaultyApi

from exporter.backends import nvml_api
from exporter.backends.pidns import FixedPids
from exporter.backends.pod_cgroups import PodProcesses
from exporter.backends.replay import ReplayApi, parse_trace
from exporter.collectors import default_settings
from exporter.collectors.base import Collection
from exporter.collectors.nvml import NvmlCollector, check, pod_processes
from exporter.collectors.nvml_devices import visible_device_uuids
from exporter.collectors.nvml_state import integrate_samples
from exporter.config import ConfigError

GIB = 1024**3
U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"


def trace_lines(records: list[dict[str, Any]], *, gpm1: bool = False) -> list[str]:
    header = {
        "kind": "header",
        "format": "inference-bottleneck-exporter/nvml-trace",
        "version": 1,
        "synthetic": True,
        "driver_version": "550.54.15",
        "duration_s": 100.0,
        "gpus": [
            {
                "index": 0,
                "uuid": U0,
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": "00000000:18:00.0",
                "mig_mode": 0,
                "gpm": True,
            },
            {
                "index": 1,
                "uuid": U1,
                "name": "NVIDIA A10G",
                "pci_bus_id": "00000000:2A:00.0",
                "mig_mode": None,
                "gpm": gpm1,
            },
        ],
    }
    return [json.dumps(header)] + [json.dumps(r) for r in records]


FULL = {
    "util": [80, 35],
    "memory": [72 * GIB, 80 * GIB],
    "power_mw": 512000,
    "energy_mj": 1_000_000,
    "temp_c": 63,
    "clocks_mhz": [1980, 2619],
    "clock_events": 0x4 | 0x40,
    "gpm": {
        "dram_bw_util": 50.0,
        "sm_util": 90.0,
        "sm_occupancy": 40.0,
        "any_tensor_util": 30.0,
        "pcie_tx_per_sec": 100.0,
        "pcie_rx_per_sec": 200.0,
    },
}
PLAIN = {
    "util": [10, 5],
    "memory": [1 * GIB, 24 * GIB],
    "power_mw": 60000,
    "temp_c": 40,
    "clocks_mhz": [210, 405],
    "clock_events": 0x1,
    "pcie_kibps": [1000, 2000],
}


def records() -> list[dict[str, Any]]:
    # GPU 0: samples every 0.5 s; pre-start buffer, then 100 % for 1 s, then 0 % for 1 s.
    return [
        {"t": 0.0, "gpu": 0, "samples": [[-1_000_000, 20], [-500_000, 40], [0, 60]], **FULL},
        {"t": 0.0, "gpu": 1, "samples": [[0, 10]], **PLAIN},
        {
            "t": 1.0,
            "gpu": 0,
            "samples": [[500_000, 100], [1_000_000, 100]],
            **FULL,
            "energy_mj": 1_500_000,
        },
        {"t": 1.0, "gpu": 1, "samples": [], **PLAIN},
        {
            "t": 2.0,
            "gpu": 0,
            "samples": [[1_500_000, 0], [2_000_000, 0]],
            **FULL,
            "energy_mj": 2_000_000,
        },
        {"t": 2.0, "gpu": 1, "samples": [], **PLAIN},
    ]


def scrape(collector: NvmlCollector) -> tuple[CollectorRegistry, Collection]:
    collection = collector.collect()
    return registry_of(collection), collection


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def started(api: nvml_api.NvmlApi, clock: FakeClock) -> Iterator[NvmlCollector]:
    collector = NvmlCollector(lambda: api, poll_interval=3600, deadline=2.0, clock=clock)
    collector.start()
    assert collector.wait_ready(5)
    try:
        yield collector
    finally:
        collector.stop(2)


@pytest.fixture
def replay(clock: FakeClock) -> ReplayApi:
    wall = {"us": 1_700_000_000_000_000}
    return ReplayApi(
        parse_trace(trace_lines(records())),
        clock=clock,
        wall_us=lambda: wall["us"],
    )


@pytest.fixture
def collector(replay: ReplayApi, clock: FakeClock) -> Iterator[NvmlCollector]:
    yield from started(replay, clock)


def lab(gpu: int, **extra: str) -> dict[str, str]:
    return {"gpu": str(gpu), "uuid": U0 if gpu == 0 else U1, **extra}


def test_integrate_samples_weights_each_value_by_its_period() -> None:
    busy, last = integrate_samples(None, [(0, 50.0), (1_000_000, 100.0), (1_500_000, 20.0)])
    assert busy == pytest.approx(1.0 * 1.0 + 0.5 * 0.2)
    assert last == (1_500_000, 20.0)
    busy, _ = integrate_samples(last, [(2_000_000, 100.0)])
    assert busy == pytest.approx(0.5)


def test_integrate_samples_caps_gaps_and_clamps_values() -> None:
    busy, _ = integrate_samples((0, 0.0), [(60_000_000, 100.0), (61_000_000, 250.0)])
    assert busy == pytest.approx(2.0 + 1.0)


def test_first_read_exposes_every_field_in_base_units(collector: NvmlCollector) -> None:
    reg, collection = scrape(collector)
    assert collection.success
    g = reg.get_sample_value
    assert g("inference_nvml_up") == 1
    assert g("inference_gpu_up", lab(0)) == 1
    assert g("inference_gpu_up", lab(1)) == 1
    assert g("inference_nvml_driver_info", {"driver_version": "550.54.15"}) == 1
    info = lab(0, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")
    assert g("inference_gpu_info", info) == 1
    assert g("inference_gpu_mig_mode_info", lab(0, mig_mode="disabled")) == 1
    assert g("inference_gpu_info", lab(1, name="NVIDIA A10G", pci_bus_id="00000000:2A:00.0")) == 1
    assert g("inference_gpu_mig_mode_info", lab(1, mig_mode="unsupported")) == 1
    assert g("inference_gpu_utilization_ratio", lab(0)) == pytest.approx(0.6)
    # pre-start buffer: 40 % and 60 % over 0.5 s each; the first sample has no period
    assert g("inference_gpu_busy_seconds_total", lab(0)) == pytest.approx(0.5 * 0.4 + 0.5 * 0.6)
    assert g("inference_gpu_memory_busy_ratio", lab(0)) == pytest.approx(0.35)
    assert g("inference_gpu_memory_used_bytes", lab(0)) == 72 * GIB
    assert g("inference_gpu_memory_total_bytes", lab(0)) == 80 * GIB
    assert g("inference_gpu_power_watts", lab(0)) == pytest.approx(512.0)
    assert g("inference_gpu_energy_joules_total", lab(0)) == pytest.approx(1000.0)
    assert g("inference_gpu_temperature_celsius", lab(0)) == 63
    assert g("inference_gpu_sm_clock_hertz", lab(0)) == 1980e6
    assert g("inference_gpu_memory_clock_hertz", lab(0)) == 2619e6
    assert g("inference_gpu_clock_event_active", lab(0, reason="power_cap")) == 1
    assert g("inference_gpu_clock_event_active", lab(0, reason="hw_thermal")) == 1
    assert g("inference_gpu_clock_event_active", lab(0, reason="gpu_idle")) == 0
    assert g("inference_gpu_clock_event_active", lab(1, reason="gpu_idle")) == 1
    # The throttling reasons' bits only: hw_thermal (0x40) counts, power_cap and idle do not.
    assert g("inference_gpu_clock_throttle_reasons", lab(0)) == 0x40
    assert g("inference_gpu_clock_throttle_reasons", lab(1)) == 0
    # GPM needs two samples: nothing yet
    assert g("inference_gpu_memory_bandwidth_utilization_ratio", lab(0)) is None
    # GPU 1 has no GPM: PCIe from nvmlDeviceGetPcieThroughput, KiB/s -> bytes/s
    assert g("inference_gpu_pcie_tx_bytes_per_second", lab(1)) == 1000 * 1024
    assert g("inference_gpu_pcie_rx_bytes_per_second", lab(1)) == 2000 * 1024
    # energy unsupported on GPU 1 (field missing from the trace): absent, not zero
    assert g("inference_gpu_energy_joules_total", lab(1)) is None


def test_histogram_counts_every_sample_once(collector: NvmlCollector, clock: FakeClock) -> None:
    counts = [
        scrape(collector)[0].get_sample_value("inference_gpu_utilization_samples_count", lab(0))
    ]
    clock.now += 1.0
    collector.poll_now()
    counts.append(
        scrape(collector)[0].get_sample_value("inference_gpu_utilization_samples_count", lab(0))
    )
    clock.now += 1.0
    collector.poll_now()
    collector.poll_now()  # nothing new: no sample may be counted twice
    reg, _ = scrape(collector)
    g = reg.get_sample_value
    # each scrape shows the samples of the polls before it, never an earlier rendering
    assert counts[0] is not None and counts[1] is not None
    assert counts[0] < counts[1] < 7
    assert reg.get_sample_value("inference_gpu_utilization_samples_count", lab(1)) is not None
    assert g("inference_gpu_utilization_samples_count", lab(0)) == 7
    assert g("inference_gpu_utilization_samples_sum", lab(0)) == pytest.approx(
        0.2 + 0.4 + 0.6 + 1 + 1
    )
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="0.05")) == 2
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="0.25")) == 3
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="0.5")) == 4
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="0.6")) == 5
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="0.95")) == 5
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="1.0")) == 7
    assert g("inference_gpu_utilization_samples_bucket", lab(0, le="+Inf")) == 7
    # 0.5 (pre-start) + 1.0 s at 100 % + 1.0 s at 0 %
    assert g("inference_gpu_busy_seconds_total", lab(0)) == pytest.approx(1.5)
    assert g("inference_gpu_utilization_ratio", lab(0)) == 0


def test_gpm_between_two_samples_and_dram_integral(
    collector: NvmlCollector, clock: FakeClock
) -> None:
    clock.now += 1.0
    collector.poll_now()
    reg, _ = scrape(collector)
    g = reg.get_sample_value
    assert g("inference_gpu_memory_bandwidth_utilization_ratio", lab(0)) == pytest.approx(0.5)
    assert g("inference_gpu_dram_active_seconds_total", lab(0)) == pytest.approx(0.5)
    assert g("inference_gpu_sm_active_ratio", lab(0)) == pytest.approx(0.9)
    assert g("inference_gpu_sm_occupancy_ratio", lab(0)) == pytest.approx(0.4)
    assert g("inference_gpu_tensor_active_ratio", lab(0)) == pytest.approx(0.3)
    assert g("inference_gpu_pcie_tx_bytes_per_second", lab(0)) == 100 * 1024 * 1024
    assert g("inference_gpu_pcie_rx_bytes_per_second", lab(0)) == 200 * 1024 * 1024
    assert g("inference_gpu_memory_bandwidth_utilization_ratio", lab(1)) is None
    clock.now += 1.0
    collector.poll_now()
    reg, _ = scrape(collector)
    assert reg.get_sample_value("inference_gpu_dram_active_seconds_total", lab(0)) == pytest.approx(
        1.0
    )
    assert reg.get_sample_value("inference_gpu_energy_joules_total", lab(0)) == pytest.approx(
        2000.0
    )


def test_call_budget_per_read(collector: NvmlCollector, clock: FakeClock) -> None:
    reg, _ = scrape(collector)
    first0 = reg.get_sample_value("inference_nvml_calls_total", {"gpu": "0"})
    first1 = reg.get_sample_value("inference_nvml_calls_total", {"gpu": "1"})
    clock.now += 1.0
    collector.poll_now()
    reg, _ = scrape(collector)
    per_read0 = reg.get_sample_value("inference_nvml_calls_total", {"gpu": "0"}) - first0
    per_read1 = reg.get_sample_value("inference_nvml_calls_total", {"gpu": "1"}) - first1
    assert per_read0 == 10  # 9 fields + 1 GPM sample
    # GPU 1: no GPM and no energy (unsupported, skipped after the first NOT_SUPPORTED),
    # two PCIe calls instead
    assert per_read1 == 10


def test_gpu_lost_marks_only_that_gpu_and_recovers(replay: ReplayApi, clock: FakeClock) -> None:
    faulty = FaultyApi(replay)
    for collector in started(faulty, clock):
        before = scrape(collector)[0].get_sample_value("inference_gpu_busy_seconds_total", lab(0))
        faulty.lose(0, nvml_api.GPU_IS_LOST)
        clock.now += 1.0
        collector.poll_now()
        reg, collection = scrape(collector)
        assert reg.get_sample_value("inference_gpu_up", lab(0)) == 0
        assert reg.get_sample_value("inference_gpu_utilization_ratio", lab(0)) is None
        assert reg.get_sample_value("inference_gpu_up", lab(1)) == 1
        assert reg.get_sample_value("inference_gpu_power_watts", lab(1)) == 60
        assert collection.success  # the collector works; the GPU is what is down
        faulty.recover(0)
        clock.now += 1.0
        collector.poll_now()
        reg, _ = scrape(collector)
        assert reg.get_sample_value("inference_gpu_up", lab(0)) == 1
        # the counter continues from where it was, not from zero
        assert reg.get_sample_value("inference_gpu_busy_seconds_total", lab(0)) >= before


def test_hanging_call_drops_the_gpu_not_the_scrape(replay: ReplayApi) -> None:
    faulty = FaultyApi(replay)
    collector = NvmlCollector(lambda: faulty, poll_interval=0.05, deadline=0.2)
    collector.start()
    try:
        assert collector.wait_ready(5)
        faulty.hang(1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            reg, collection = scrape(collector)
            if not collection.success:
                break
            time.sleep(0.05)
        assert not collection.success
        assert "GPU 1" in collection.error
        assert reg.get_sample_value("inference_gpu_up", lab(1)) == 0
        assert reg.get_sample_value("inference_gpu_up", lab(0)) == 1
        assert reg.get_sample_value("inference_gpu_power_watts", lab(0)) == 512
        calls = faulty.calls["utilization_samples"]
        # the hung GPU's poller waits in its one call; only GPU 0 keeps calling
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and faulty.calls["utilization_samples"] <= calls:
            time.sleep(0.02)
        hung_threads = [t for t in threading.enumerate() if t.name == "nvml-gpu1"]
        assert len(hung_threads) == 1
        assert faulty.calls["utilization_samples"] > calls
        faulty.unhang(1)
    finally:
        faulty.unhang(1)
        collector.stop(2)


def test_nvml_missing_reports_down_and_retries(clock: FakeClock) -> None:
    attempts = []

    class Missing:
        def init(self) -> None:
            attempts.append(1)
            raise nvml_api.NvmlError(nvml_api.LIBRARY_NOT_FOUND)

    collector = NvmlCollector(Missing, poll_interval=3600, deadline=1.0, max_backoff=0.05)  # type: ignore[arg-type,return-value]
    collector.start()
    try:
        assert collector.wait_ready(5)
        reg, collection = scrape(collector)
        assert reg.get_sample_value("inference_nvml_up") == 0
        assert not collection.success
        assert "LIBRARY_NOT_FOUND" in collection.error
        assert reg.get_sample_value("inference_gpu_up", lab(0)) is None
        deadline = time.monotonic() + 5
        while len(attempts) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(attempts) >= 3  # backoff retries continue
    finally:
        collector.stop(2)


def test_driver_reload_reinitialises_and_keeps_counters(replay: ReplayApi) -> None:
    faulty = FaultyApi(replay)
    collector = NvmlCollector(lambda: faulty, poll_interval=0.05, deadline=1.0, max_backoff=0.05)
    collector.start()
    try:
        assert collector.wait_ready(5)
        inits = faulty.calls["init"]
        faulty.session_error = nvml_api.UNINITIALIZED
        deadline = time.monotonic() + 5
        while (
            time.monotonic() < deadline
            and scrape(collector)[0].get_sample_value("inference_nvml_up") != 0
        ):
            time.sleep(0.02)
        assert scrape(collector)[0].get_sample_value("inference_nvml_up") == 0
        faulty.session_error = None
        while time.monotonic() < deadline and faulty.calls["init"] <= inits:
            time.sleep(0.02)
        while (
            time.monotonic() < deadline
            and scrape(collector)[0].get_sample_value("inference_gpu_up", lab(0)) != 1
        ):
            time.sleep(0.02)
        reg, collection = scrape(collector)
        assert reg.get_sample_value("inference_nvml_up") == 1
        assert reg.get_sample_value("inference_gpu_up", lab(0)) == 1
        assert collection.success
    finally:
        collector.stop(2)


def test_xid_events_are_counted(clock: FakeClock) -> None:
    recs = records()
    recs[2] = {**recs[2], "xids": [79, 79]}
    recs[4] = {**recs[4], "xids": [48]}
    api = ReplayApi(parse_trace(trace_lines(recs)), clock=clock)
    for collector in started(api, clock):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            clock.now += 0.05  # step the trace while the Xid watcher waits
            reg, _ = scrape(collector)
            if reg.get_sample_value("inference_gpu_xid_errors_total", lab(0, xid="48")):
                break
            time.sleep(0.05)
        assert reg.get_sample_value("inference_gpu_xid_errors_total", lab(0, xid="79")) == 2
        assert reg.get_sample_value("inference_gpu_xid_errors_total", lab(0, xid="48")) == 1


def test_devices_restrict_the_gpus_watched(replay: ReplayApi, clock: FakeClock) -> None:
    for devices in (frozenset({"1"}), frozenset({U1})):
        collector = NvmlCollector(
            lambda: replay, poll_interval=3600, deadline=2.0, clock=clock, devices=devices
        )
        collector.start()
        try:
            assert collector.wait_ready(5)
            reg, _ = scrape(collector)
            assert reg.get_sample_value("inference_gpu_up", lab(1)) == 1
            assert reg.get_sample_value("inference_gpu_up", lab(0)) is None
            assert reg.get_sample_value("inference_gpu_power_watts", lab(0)) is None
        finally:
            collector.stop(2)


def test_peaks_from_the_gpu_name_when_the_trace_has_no_facts(collector: NvmlCollector) -> None:
    reg, _ = scrape(collector)
    g = reg.get_sample_value
    # GPU 0 is an H100 SXM by name: the product table gives its datasheet peaks
    assert g("inference_gpu_peak_memory_bandwidth_bytes_per_second", lab(0)) == pytest.approx(
        5120 / 8 * 2619e6 * 2
    )
    assert g("inference_gpu_peak_flops", lab(0, precision="bf16")) == pytest.approx(
        132 * 1830e6 * 4096
    )
    assert g("inference_gpu_peak_flops", lab(0, precision="fp8")) == pytest.approx(
        132 * 1830e6 * 8192
    )
    # GPU 1, an A10G, is in no table and the trace holds no facts: no peaks rather than guesses
    assert g("inference_gpu_peak_memory_bandwidth_bytes_per_second", lab(1)) is None
    assert g("inference_gpu_peak_flops", lab(1, precision="bf16")) is None


def test_peaks_from_trace_facts(clock: FakeClock) -> None:
    lines = trace_lines(records())
    head = json.loads(lines[0])
    # an A10G as NVML describes it: 80 SMs x 128 cores, GA10x, 384-bit GDDR6 at 6251 MHz
    head["gpus"][1]["facts"] = {
        "memory_bus_width_bits": 384,
        "max_clocks_mhz": [1710, 6251],
        "cuda_cores": 80 * 128,
        "compute_capability": [8, 6],
    }
    api = ReplayApi(parse_trace([json.dumps(head), *lines[1:]]), clock=clock)
    for collector in started(api, clock):
        g = scrape(collector)[0].get_sample_value
        assert g("inference_gpu_peak_memory_bandwidth_bytes_per_second", lab(1)) == (
            pytest.approx(600.1e9, rel=1e-3)
        )
        assert g("inference_gpu_peak_flops", lab(1, precision="bf16")) == pytest.approx(
            80 * 1710e6 * 1024
        )
        assert g("inference_gpu_peak_flops", lab(1, precision="fp8")) is None  # Ampere


def test_facts_are_read_once_per_session_and_outlive_a_lost_gpu(
    replay: ReplayApi, clock: FakeClock
) -> None:
    faulty = FaultyApi(replay)
    fact_calls = ("memory_bus_width_bits", "cuda_cores", "compute_capability")
    for collector in started(faulty, clock):
        for _ in range(3):
            clock.now += 1.0
            collector.poll_now()
        assert [faulty.calls[c] for c in fact_calls] == [2, 2, 2]  # one per GPU
        assert faulty.calls["max_clock_mhz"] == 4  # SM and memory, per GPU
        faulty.lose(0, nvml_api.GPU_IS_LOST)
        clock.now += 1.0
        collector.poll_now()
        reg, _ = scrape(collector)
        assert reg.get_sample_value("inference_gpu_up", lab(0)) == 0
        # a fact of the hardware, still there while the GPU does not answer
        assert reg.get_sample_value("inference_gpu_peak_flops", lab(0, precision="bf16")) > 0
        assert [faulty.calls[c] for c in fact_calls] == [2, 2, 2]


# --- MIG devices --------------------------------------------------------------------------------
GPU_MIG = "GPU-22222222-2222-2222-2222-222222222222"
MIB = 1024 * 1024


def mig_trace_lines(
    records: list[dict[str, Any]], *, engine_pids: list[int] | None = None
) -> list[str]:
    header: dict[str, Any] = {
        "kind": "header",
        "format": "inference-bottleneck-exporter/nvml-trace",
        "version": 1,
        "synthetic": True,
        "driver_version": "550.54.15",
        "duration_s": 100.0,
        "gpus": [
            {
                "index": 0,
                "uuid": GPU_MIG,
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": "00000000:18:00.0",
                "mig_mode": 1,
                "gpm": True,
                "facts": {"memory_bus_width_bits": 5120, "max_clocks_mhz": [1980, 2619]},
                "max_mig_devices": 7,
                "mig_devices": [
                    {
                        "slot": 0,
                        "uuid": "MIG-aaaaaaaa-0000-0000-0000-000000000000",
                        "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                        "gpu_instance_id": 2,
                        "attributes": [60, 3, 3, 40448],
                    },
                    {
                        "slot": 4,
                        "uuid": "MIG-bbbbbbbb-0000-0000-0000-000000000000",
                        "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                        "gpu_instance_id": 9,
                        "attributes": [16, 1, 1, 9984],
                    },
                ],
            }
        ],
    }
    if engine_pids is not None:
        header["engine_pids"] = engine_pids
    return [json.dumps(header)] + [json.dumps(r) for r in records]


def mig_records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in (0.0, 1.0, 2.0):
        out.append(
            {
                "t": t,
                "gpu": 0,
                "memory": [20 * GIB, 80 * GIB],
                "power_mw": 400_000,
                "energy_mj": 1_000_000 + int(t * 400_000),
                "temp_c": 50,
                "clocks_mhz": [1980, 2619],
                "clock_events": 0,
                "pcie_kibps": [100, 200],
            }
        )
        out.append(
            {
                "t": t,
                "gpu": 0,
                "mig": 0,
                "memory": [30 * GIB, 40448 * MIB],
                "gpm": {"graphics_util": 80.0, "sm_util": 70.0, "dram_bw_util": 40.0},
                "processes": [[4242, 30 * GIB]],
            }
        )
        out.append(
            {
                "t": t,
                "gpu": 0,
                "mig": 4,
                "memory": [1 * GIB, 9984 * MIB],
                "gpm": {"graphics_util": 10.0 if t < 2 else 20.0, "dram_bw_util": 5.0},
                "processes": [[4242, 1 * GIB], [5151, None]],
            }
        )
    return out


def mig_collector(
    clock: FakeClock, *, devices: tuple[str, ...] = (), engine_pids: list[int] | None = None
) -> tuple[NvmlCollector, ReplayApi]:
    trace = parse_trace(mig_trace_lines(mig_records(), engine_pids=engine_pids))
    api = ReplayApi(trace, clock=clock, wall_us=lambda: 1_700_000_000_000_000)
    engine = None if trace.engine_pids is None else FixedPids(trace.engine_pids)
    collector = NvmlCollector(
        lambda: api, poll_interval=3600, deadline=2.0, clock=clock, devices=devices, engine=engine
    )
    return collector, api


def run(collector: NvmlCollector) -> Iterator[NvmlCollector]:
    collector.start()
    assert collector.wait_ready(5)
    try:
        yield collector
    finally:
        collector.stop(2)


A = {"gpu": "0:0", "uuid": "MIG-aaaaaaaa-0000-0000-0000-000000000000"}
B = {"gpu": "0:4", "uuid": "MIG-bbbbbbbb-0000-0000-0000-000000000000"}
PARENT = {"gpu": "0", "uuid": GPU_MIG}


def test_mig_devices_are_devices_of_their_own(clock: FakeClock) -> None:
    collector, _ = mig_collector(clock, engine_pids=[4242])
    for c in run(collector):
        clock.now += 1.0
        c.poll_now()
        clock.now += 1.5
        c.poll_now()
        reg, collection = scrape(c)
        assert collection.success
        g = reg.get_sample_value
        info = {**A, "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "pci_bus_id": "00000000:18:00.0"}
        assert g("inference_gpu_info", info) == 1
        assert g("inference_gpu_mig_mode_info", {**A, "mig_mode": "slice"}) == 1
        info = {**PARENT, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"}
        assert g("inference_gpu_info", info) == 1
        assert g("inference_gpu_mig_mode_info", {**PARENT, "mig_mode": "enabled"}) == 1
        for labels, profile, instance in ((B, "1g.10gb", "9"), (A, "3g.40gb", "2")):
            info = {**labels, "parent_uuid": GPU_MIG, "profile": profile}
            assert g("inference_gpu_mig_info", info) == 1
            ids = {**labels, "gpu_instance_id": instance, "compute_instance_id": "0"}
            assert g("inference_gpu_mig_instance_info", ids) == 1
        for labels in (A, B, PARENT):
            assert g("inference_gpu_up", labels) == 1
        # utilisation from GPM graphics activity: 2 GPM intervals (1.0 s and 1.5 s)
        assert g("inference_gpu_utilization_ratio", A) == pytest.approx(0.8)
        assert g("inference_gpu_busy_seconds_total", A) == pytest.approx(2.5 * 0.8)
        assert g("inference_gpu_utilization_samples_count", A) == 2
        assert g("inference_gpu_utilization_samples_bucket", {**A, "le": "0.75"}) == 0
        assert g("inference_gpu_busy_seconds_total", B) == pytest.approx(1.0 * 0.1 + 1.5 * 0.2)
        assert g("inference_gpu_sm_active_ratio", A) == pytest.approx(0.7)
        assert g("inference_gpu_memory_bandwidth_utilization_ratio", A) == pytest.approx(0.4)
        assert g("inference_gpu_dram_active_seconds_total", B) == pytest.approx(2.5 * 0.05)
        assert g("inference_gpu_memory_used_bytes", A) == 30 * GIB
        assert g("inference_gpu_memory_total_bytes", B) == 9984 * MIB
        # what belongs to the physical GPU stays on the GPU's series
        assert g("inference_gpu_power_watts", PARENT) == 400
        assert g("inference_gpu_power_watts", A) is None
        assert g("inference_gpu_utilization_ratio", PARENT) is None
        assert g("inference_gpu_temperature_celsius", B) is None
        # peaks: the GPU's, and each MIG device's share (memory eighths, SMs)
        whole = 5120 / 8 * 2619e6 * 2
        assert g("inference_gpu_peak_memory_bandwidth_bytes_per_second", PARENT) == whole
        assert g("inference_gpu_peak_memory_bandwidth_bytes_per_second", A) == whole / 2
        assert g("inference_gpu_peak_memory_bandwidth_bytes_per_second", B) == whole / 8
        bf16 = g("inference_gpu_peak_flops", {**PARENT, "precision": "bf16"})
        assert bf16 is not None
        assert g("inference_gpu_peak_flops", {**B, "precision": "bf16"}) == pytest.approx(
            bf16 * 16 / 132
        )
        # per-process: A holds only the engine; B has another tenant (memory not available)
        assert g("inference_gpu_processes", {**A, "owner": "engine"}) == 1
        assert g("inference_gpu_processes", {**A, "owner": "other"}) == 0
        assert g("inference_gpu_processes", {**B, "owner": "other"}) == 1
        assert g("inference_gpu_engine_memory_used_bytes", A) == 30 * GIB
        assert g("inference_gpu_engine_memory_used_bytes", B) == 1 * GIB
        assert g("inference_gpu_engine_utilization_ratio", A) == pytest.approx(0.8)
        assert g("inference_gpu_engine_utilization_ratio", B) is None  # shared, no per-PID util
        assert g("inference_gpu_processes", {**PARENT, "owner": "engine"}) is None
        assert g("inference_nvml_calls_total", {"gpu": "0:4"}) is not None


def test_mig_device_steady_state_costs_three_calls(clock: FakeClock) -> None:
    collector, _ = mig_collector(clock, engine_pids=[4242])
    for c in run(collector):
        clock.now += 1.0
        c.poll_now()
        before = scrape(c)[0].get_sample_value("inference_nvml_calls_total", {"gpu": "0:4"})
        clock.now += 1.0
        c.poll_now()
        after = scrape(c)[0].get_sample_value("inference_nvml_calls_total", {"gpu": "0:4"})
        assert before is not None and after is not None
        assert after - before == 3  # memory, GPM sample, compute processes


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ((), {"0", "0:0", "0:4"}),
        (("0",), {"0", "0:0", "0:4"}),
        ((GPU_MIG,), {"0", "0:0", "0:4"}),
        (("MIG-bbbbbbbb-0000-0000-0000-000000000000",), {"0", "0:4"}),
        (("MIG-bbbbbbbb-0000-0000-0000-000000000000::3",), {"0", "0:4"}),  # replica suffix
        (("0:0",), {"0", "0:0"}),
        ((f"MIG-{GPU_MIG}/9/0",), {"0", "0:4"}),  # pre-R470 MIG UUID
        (("1",), set()),
        (("MIG-cccccccc-0000-0000-0000-000000000000",), set()),
    ],
)
def test_device_filter_with_mig_devices(
    clock: FakeClock, devices: tuple[str, ...], expected: set[str]
) -> None:
    collector, _ = mig_collector(clock, devices=devices)
    for c in run(collector):
        reg, _ = scrape(c)
        got = {
            s.labels["gpu"]
            for fam in c.collect().metrics
            if fam.name == "inference_gpu_up"
            for s in fam.samples
        }
        assert got == expected
        assert reg.get_sample_value("inference_nvml_up") == 1


def test_visible_device_uuids() -> None:
    assert visible_device_uuids("all") == frozenset()
    assert visible_device_uuids("0,1") == frozenset()  # host indices, not NVML's in here
    assert visible_device_uuids("GPU-1, MIG-2::4,void") == frozenset({"GPU-1", "MIG-2"})


def test_a_vanished_mig_device_is_enumerated_again(clock: FakeClock) -> None:
    records = mig_records()
    for r in records:
        if r.get("mig") == 4 and r["t"] == 1.0:
            r["error"] = "NOT_FOUND"
    trace = parse_trace(mig_trace_lines(records))
    opened = []

    def factory() -> nvml_api.NvmlApi:
        api = FaultyApi(ReplayApi(trace, clock=clock, wall_us=lambda: 1_700_000_000_000_000))
        opened.append(api)
        return api

    collector = NvmlCollector(factory, poll_interval=3600, deadline=2.0, clock=clock)
    for c in run(collector):
        clock.now += 1.0
        c.poll_now()
        deadline = time.monotonic() + 5
        while len(opened) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(opened) == 2  # a second NVML session: the MIG devices enumerated again


# --- per-process shares on a whole GPU --------------------------------------------------------


def shared_records() -> list[dict[str, Any]]:
    """GPU 0 shared by the engine (PIDs 100, 101) and another tenant (PID 200)."""
    recs = []
    for k, t in enumerate((0.0, 1.0, 2.0)):
        base = k * 1_000_000
        recs.append(
            {
                "t": t,
                "gpu": 0,
                "samples": [[base - 500_000, 90], [base, 90]],
                **{key: v for key, v in FULL.items() if key != "gpm"},
                "processes": [[100, 20 * GIB], [101, 2 * GIB], [200, 40 * GIB]],
                "process_samples": [
                    [base - 400_000, 100, 10, 5],
                    [base - 300_000, 200, 70, 30],
                    [base - 100_000, 100, 15 + k, 5],
                    [base - 50_000, 101, 5, 1],
                    [base, 200, 75, 30],
                ],
            }
        )
        recs.append({"t": t, "gpu": 1, "samples": [[base, 10]], **PLAIN})
    return recs


def shared_collector(clock: FakeClock, engine: FixedPids | None) -> NvmlCollector:
    api = ReplayApi(
        parse_trace(trace_lines(shared_records())),
        clock=clock,
        wall_us=lambda: 1_700_000_000_000_000,
    )
    return NvmlCollector(lambda: api, poll_interval=3600, deadline=2.0, clock=clock, engine=engine)


def test_engine_share_of_a_shared_gpu(clock: FakeClock) -> None:
    for c in run(shared_collector(clock, FixedPids([100, 101]))):
        g = scrape(c)[0].get_sample_value
        assert g("inference_gpu_processes", lab(0, owner="engine")) == 2
        assert g("inference_gpu_processes", lab(0, owner="other")) == 1
        # newest sample of each engine process: 15 % (PID 100) + 5 % (PID 101)
        assert g("inference_gpu_engine_utilization_ratio", lab(0)) == pytest.approx(0.20)
        assert g("inference_gpu_engine_memory_used_bytes", lab(0)) == 22 * GIB
        assert g("inference_gpu_utilization_ratio", lab(0)) == pytest.approx(0.9)
        # GPU 1's trace has no processes: not supported there, so no shares
        assert g("inference_gpu_processes", lab(1, owner="engine")) is None
        # the share integrated: nothing yet, no poll before the first
        assert g("inference_gpu_engine_busy_seconds_total", lab(0)) == 0
        clock.now += 1.0
        c.poll_now()
        g = scrape(c)[0].get_sample_value
        assert g("inference_gpu_engine_utilization_ratio", lab(0)) == pytest.approx(0.21)
        # 21 % for the second since the previous poll
        assert g("inference_gpu_engine_busy_seconds_total", lab(0)) == pytest.approx(0.21)
        clock.now += 0.01
        c.poll_now()  # nothing new in the buffer: no process ran a kernel since
        g = scrape(c)[0].get_sample_value
        assert g("inference_gpu_engine_utilization_ratio", lab(0)) == 0
        assert g("inference_gpu_engine_busy_seconds_total", lab(0)) == pytest.approx(0.21)


def test_no_attribution_no_per_process_calls(clock: FakeClock) -> None:
    for c in run(shared_collector(clock, None)):
        g = scrape(c)[0].get_sample_value
        assert g("inference_gpu_processes", lab(0, owner="engine")) is None
        assert g("inference_gpu_engine_utilization_ratio", lab(0)) is None
        # as without the feature, and the links and power state (absent from this trace) asked
        # once: field values, the enforced power limit, fabric, power profiles
        assert g("inference_nvml_calls_total", {"gpu": "0"}) == 12 + 4


class Unknown:
    """An attribution that cannot tell yet (the process collector has not looked)."""

    available = True

    def engine(self, host_pids: object) -> None:
        return None


def test_engine_pids_not_known_yet(clock: FakeClock) -> None:
    for c in run(shared_collector(clock, Unknown())):  # type: ignore[arg-type]
        g = scrape(c)[0].get_sample_value
        assert g("inference_gpu_processes", lab(0, owner="engine")) is None
        assert g("inference_nvml_calls_total", {"gpu": "0"}) == 14 + 4  # read, not attributed


# --- flags ------------------------------------------------------------------------------------


def test_host_procfs_must_be_the_hosts(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "2").mkdir(parents=True)
    # kthreadd: flags 0x208040 carry PF_KTHREAD
    (host / "2" / "stat").write_text(
        "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 25\n"
    )
    check(default_settings(gpu_host_procfs=host))
    pod = tmp_path / "pod"
    (pod / "2").mkdir(parents=True)
    (pod / "2" / "stat").write_text("2 (sh) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 99\n")
    for path in (pod, tmp_path / "missing"):
        with pytest.raises(ConfigError, match=r"--gpu.host-procfs.*not the host's /proc"):
            check(default_settings(gpu_host_procfs=path))


# --- per-pod shares (the node agent) -----------------------------------------------------------

POD_A = "4a1b2c3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
POD_B = "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"
CID_A = "a" * 64
CID_B = "b" * 64


def write_cgroup(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(text)


def test_each_pods_share_of_a_shared_gpu(clock: FakeClock, tmp_path: Path) -> None:
    """PIDs 100 and 101 are pod A's (systemd driver), 200 pod B's (cgroupfs); then 200 ends and
    101 turns out a host daemon's PID: counted, never given to a pod."""
    proc = tmp_path / "proc"
    slice_a = f"kubepods-burstable-pod{POD_A.replace('-', '_')}.slice"
    write_cgroup(
        proc,
        100,
        f"0::/kubepods.slice/kubepods-burstable.slice/{slice_a}/cri-containerd-{CID_A}.scope\n",
    )
    write_cgroup(
        proc,
        101,
        f"0::/kubepods.slice/kubepods-burstable.slice/{slice_a}/cri-containerd-{CID_A}.scope\n",
    )
    write_cgroup(proc, 200, f"0::/kubepods/besteffort/pod{POD_B}/{CID_B}\n")
    api = ReplayApi(
        parse_trace(trace_lines(shared_records())),
        clock=clock,
        wall_us=lambda: 1_700_000_000_000_000,
    )
    collector = NvmlCollector(
        lambda: api, poll_interval=3600, deadline=2.0, clock=clock, pods=PodProcesses(proc)
    )
    a = lab(0, pod_uid=POD_A, container_id=CID_A)
    b = lab(0, pod_uid=POD_B, container_id=CID_B)
    for c in run(collector):
        out, collection = scrape(c)
        g = out.get_sample_value
        assert collection.success
        assert g("inference_gpu_pod_utilization_ratio", a) == pytest.approx(0.20)
        assert g("inference_gpu_pod_utilization_ratio", b) == pytest.approx(0.75)
        assert g("inference_gpu_pod_busy_seconds_total", a) == 0  # no earlier poll to credit
        assert g("inference_gpu_pod_memory_used_bytes", a) == 22 * GIB
        assert g("inference_gpu_pod_memory_used_bytes", b) == 40 * GIB
        for reason in ("host", "gone", "unreadable"):
            assert g("inference_gpu_pod_unattributed_processes", lab(0, reason=reason)) == 0
        # no engine attribution here: the sidecar's series stay absent
        assert g("inference_gpu_engine_utilization_ratio", lab(0)) is None
        # GPU 1's trace has no processes: nothing mapped, nothing counted
        assert g("inference_gpu_pod_unattributed_processes", lab(1, reason="host")) is None

        (proc / "200" / "cgroup").unlink()
        (proc / "200").rmdir()
        write_cgroup(proc, 101, "0::/system.slice/nvidia-persistenced.service\n")
        clock.now += 1.0
        c.poll_now()
        out, collection = scrape(c)
        g = out.get_sample_value
        # the GPU was read; the mapping's misses are counted, not failures
        assert collection.success
        assert g("inference_gpu_pod_utilization_ratio", b) is None
        assert g("inference_gpu_pod_memory_used_bytes", b) is None
        assert g("inference_gpu_pod_utilization_ratio", a) == pytest.approx(0.16)  # 100 alone
        # its share for the second since the first poll; pod B left the GPU: its counter goes
        assert g("inference_gpu_pod_busy_seconds_total", a) == pytest.approx(0.16)
        assert g("inference_gpu_pod_busy_seconds_total", b) is None
        assert g("inference_gpu_pod_memory_used_bytes", a) == 20 * GIB
        assert g("inference_gpu_pod_unattributed_processes", lab(0, reason="gone")) == 1
        assert g("inference_gpu_pod_unattributed_processes", lab(0, reason="host")) == 1


def test_pod_mapping_is_the_node_agents(tmp_path: Path) -> None:
    """On with the podresources collector where the host's /proc is given; off elsewhere."""
    host = tmp_path / "host-proc"
    settings = default_settings(collector_podresources=True)
    mapped = pod_processes(settings, host)
    assert mapped is not None and mapped.root == host
    assert pod_processes(default_settings(), host) is None  # a sidecar: the engine's share only


def test_no_readable_cgroup_is_a_failing_collector(clock: FakeClock, tmp_path: Path) -> None:
    """Every GPU process's cgroup unreadable (here each is a directory: EISDIR): counted, no
    pod given anything, and the collector says it cannot do what it was asked."""
    proc = tmp_path / "proc"
    for pid in (100, 101, 200):
        (proc / str(pid) / "cgroup").mkdir(parents=True)
    api = ReplayApi(
        parse_trace(trace_lines(shared_records())),
        clock=clock,
        wall_us=lambda: 1_700_000_000_000_000,
    )
    collector = NvmlCollector(
        lambda: api, poll_interval=3600, deadline=2.0, clock=clock, pods=PodProcesses(proc)
    )
    for c in run(collector):
        out, collection = scrape(c)
        g = out.get_sample_value
        assert g("inference_gpu_pod_unattributed_processes", lab(0, reason="unreadable")) == 3
        assert not [s for s in out.collect() if s.name == "inference_gpu_pod_utilization_ratio"]
        assert not collection.success
        assert "cgroup" in collection.error and "GPU 0" in collection.error
        assert g("inference_gpu_utilization_ratio", lab(0)) == pytest.approx(0.9)  # still read
        # one readable cgroup again: the collector is honest the other way too
        (proc / "200" / "cgroup").rmdir()
        write_cgroup(proc, 200, f"0::/kubepods/besteffort/pod{POD_B}/{CID_B}\n")
        clock.now += 1.0
        c.poll_now()
        _, collection = scrape(c)
        assert collection.success
