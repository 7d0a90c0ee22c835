"""The nvml collector over the replay and fault-injecting backends, with a stepped clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.metrics import registry_of
from support.nvml import FaultyApi

from exporter.backends import nvml_api
from exporter.backends.replay import ReplayApi, parse_trace
from exporter.collectors.base import Collection
from exporter.collectors.nvml import NvmlCollector, integrate_samples

GIB = 1024**3
U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
