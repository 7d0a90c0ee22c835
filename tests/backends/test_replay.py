"""Trace parsing and :class:`ReplayApi`, stepped with an injected clock."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.clock import FakeClock

import exporter
from exporter.backends.gpu_reader import GpuReader, read_identity, read_mig_slices
from exporter.backends.nvml_api import (
    GPM_DRAM_BW_UTIL,
    GPM_GRAPHICS_UTIL,
    GPM_SM_UTIL,
    NvmlError,
    ProcessMemory,
    ProcessSample,
    XidEvent,
)
from exporter.backends.replay import (
    MAX_BUFFERED_SAMPLES,
    TRACE_FORMAT,
    ReplayApi,
    Trace,
    TraceError,
    load_trace,
    parse_trace,
)
from exporter.hardware.gpus import GpuFacts, peaks_of

SHIPPED = Path(exporter.__file__).parent / "data" / "replay-2gpu-synthetic.jsonl"
WALL0 = 1_700_000_000_000_000  # epoch µs at init
GPU_IS_LOST_CODE = 15
NOT_SUPPORTED_CODE = 3
UNINITIALIZED_CODE = 1


def header(gpus: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "header",
        "format": TRACE_FORMAT,
        "version": 1,
        "synthetic": True,
        "description": "hand-written test trace",
        "driver_version": "550.54.15",
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000",
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                "mig_mode": 0,
                "gpm": True,
            }
            for i in range(gpus)
        ],
        **extra,
    }


def record(t: float, gpu: int = 0, **fields: Any) -> dict[str, Any]:
    """A full record whose values encode its time (power_mw = 100000 + 1000 * t)."""
    base: dict[str, Any] = {
        "t": t,
        "gpu": gpu,
        "samples": [],
        "util": [int(t) % 100, 40],
        "memory": [1000 + int(t), 2000],
        "power_mw": 100_000 + int(1000 * t),
        "energy_mj": 5_000_000 + int(100_000 * t),
        "temp_c": 50,
        "clocks_mhz": [1980, 2619],
        "clock_events": 0,
        "pcie_kibps": [10, 20],
        "gpm": {"dram_bw_util": 50.0 + t, "sm_util": 60.0},
    }
    base.update(fields)
    return base


def lines(*objs: dict[str, Any]) -> list[str]:
    return [json.dumps(o) for o in objs]


def with_samples(n: int, period_s: float = 1.0) -> list[dict[str, Any]]:
    """``n`` records, one per second, each with 2 samples since the previous one."""
    recs = []
    for k in range(n):
        if k == 0:
            samples = [[-1_000_000, 5], [-500_000, 6], [0, 7]]
        else:
            samples = [[k * 1_000_000 - 500_000, k % 100], [k * 1_000_000, 100 - k % 100]]
        recs.append(record(k * period_s, samples=samples))
    return recs


def start(trace: Trace, clock: FakeClock | None = None) -> tuple[ReplayApi, FakeClock]:
    clock = clock or FakeClock()
    api = ReplayApi(trace, clock=clock, wall_us=lambda: WALL0)
    api.init()
    return api, clock


# --- values follow the trace in time ---------------------------------------------------------


def test_values_follow_records_in_time() -> None:
    trace = parse_trace(lines(header(), *(record(float(k)) for k in range(20))))
    api, clock = start(trace)
    h = api.handle(0)
    assert api.power_usage_mw(h) == 100_000
    assert api.utilization_rates(h) == (0, 40)
    assert api.memory_info(h) == (1000, 2000)
    clock.advance(10.5)
    assert api.power_usage_mw(h) == 110_000
    assert api.utilization_rates(h) == (10, 40)
    assert api.memory_info(h) == (1010, 2000)
    assert api.total_energy_mj(h) == 6_000_000
    assert api.temperature_c(h) == 50
    assert api.clock_mhz(h, "sm") == 1980
    assert api.clock_mhz(h, "mem") == 2619
    assert api.clock_event_reasons(h) == 0
    assert api.pcie_throughput_kibps(h, "tx") == 10
    assert api.pcie_throughput_kibps(h, "rx") == 20
    older = api.gpm_sample(h)
    newer = api.gpm_sample(h)
    values = api.gpm_metrics(older, newer, [GPM_DRAM_BW_UTIL, GPM_SM_UTIL, 5])
    assert values == {GPM_DRAM_BW_UTIL: 60.0, GPM_SM_UTIL: 60.0, 5: None}


def test_identity_and_driver() -> None:
    trace = parse_trace(lines(header(gpus=2), record(0.0), record(0.0, gpu=1)))
    api, _ = start(trace)
    assert api.driver_version() == "550.54.15"
    assert api.device_count() == 2
    h = api.handle(1)
    assert api.uuid(h) == "GPU-00000001-0000-0000-0000-000000000000"
    assert api.name(h) == "NVIDIA H100 80GB HBM3"
    assert api.pci_bus_id(h) == "00000000:19:00.0"
    assert api.mig_mode(h) == 0
    assert api.gpm_supported(h) is True
    with pytest.raises(NvmlError):
        api.handle(2)


def test_calls_before_init_fail() -> None:
    trace = parse_trace(lines(header(), record(0.0)))
    api = ReplayApi(trace, clock=FakeClock(), wall_us=lambda: WALL0)
    with pytest.raises(NvmlError) as exc:
        api.device_count()
    assert exc.value.code == UNINITIALIZED_CODE


# --- utilisation samples ---------------------------------------------------------------------


def test_samples_up_to_now_and_never_twice() -> None:
    trace = parse_trace(lines(header(duration_s=10.0), *with_samples(10)))
    api, clock = start(trace)
    h = api.handle(0)
    first = api.utilization_samples(h, 0)
    assert first == [(WALL0 - 1_000_000, 5.0), (WALL0 - 500_000, 6.0), (WALL0, 7.0)]
    seen = list(first)
    last = first[-1][0]
    assert api.utilization_samples(h, last) == []
    clock.advance(0.7)  # one sample (0.5 s) is due, the one at 1.0 s not yet
    got = api.utilization_samples(h, last)
    assert got == [(WALL0 + 500_000, 1.0)]
    seen += got
    last = got[-1][0]
    for _ in range(12):
        clock.advance(0.45)
        got = api.utilization_samples(h, last)
        now_us = WALL0 + round((clock.now - 1000.0) * 1e6)
        assert all(last < ts <= now_us for ts, _ in got)
        seen += got
        if got:
            last = got[-1][0]
    stamps = [ts for ts, _ in seen]
    assert stamps == sorted(set(stamps))  # strictly increasing: nothing twice
    expected = [
        (WALL0 + rel, float(v)) for r in trace.records[0] for rel, v in r.samples
    ]  # everything up to 6.1 s
    assert seen == [s for s in expected if s[0] <= WALL0 + 6_100_000]


def test_samples_across_loops_keep_increasing() -> None:
    trace = parse_trace(lines(header(duration_s=5.0), *with_samples(5)))
    api, clock = start(trace)
    h = api.handle(0)
    last, stamps, energy = 0, [], []
    for _ in range(40):  # 4 loops
        got = api.utilization_samples(h, last)
        if got:
            last = got[-1][0]
            stamps += [ts for ts, _ in got]
        energy.append(api.total_energy_mj(h))
        clock.advance(0.5)
    assert stamps == sorted(set(stamps))
    assert stamps[-1] > WALL0 + 3 * 5_000_000  # reached the 4th loop
    # The pre-start buffer appears once, on the first call only.
    assert sum(ts < WALL0 for ts in stamps) == 2
    assert all(a <= b for a, b in itertools.pairwise(energy))
    assert energy[-1] > energy[0]
    # At each loop start energy continues from the previous loop's last record.
    trace_energy = [r.values["energy_mj"] for r in trace.records[0]]
    assert energy[10] == trace_energy[0] + (trace_energy[-1] - trace_energy[0]) + 100_000


def test_reader_behind_keeps_only_the_driver_buffer() -> None:
    recs = [record(0.0)] + [
        record(float(k), samples=[[k * 1_000_000 - 1000 * j, 50] for j in range(299, -1, -1)])
        for k in range(1, 10)
    ]
    trace = parse_trace(lines(header(), *recs))
    api, clock = start(trace)
    clock.advance(9.9)
    got = api.utilization_samples(api.handle(0), 0)
    assert len(got) == MAX_BUFFERED_SAMPLES  # 2700 were due: the oldest are gone
    assert got[-1][0] == WALL0 + 9_000_000


def test_shipped_trace_loops_with_increasing_counters() -> None:
    trace = load_trace(SHIPPED)
    api, clock = start(trace)
    for index in range(2):
        h = api.handle(index)
        clock.now = 1000.0
        last, prev_energy, count = 0, -1, 0
        for _ in range(int(2.5 * trace.duration_s / 3)):  # 2.5 loops, polled every 3 s
            got = api.utilization_samples(h, last)
            assert all(ts > last for ts, _ in got)
            assert got == sorted(got)
            if got:
                last = got[-1][0]
            count += len(got)
            energy = api.total_energy_mj(h)
            assert energy > prev_energy
            prev_energy = energy
            clock.advance(3.0)
        assert count > 2 * 700


# --- faults ----------------------------------------------------------------------------------


def test_error_record_fails_only_its_gpu() -> None:
    recs = []
    for k in range(4):
        recs.append(record(float(k), gpu=0))
        recs.append(record(float(k), gpu=1, **({"error": "GPU_IS_LOST"} if k == 2 else {})))
    trace = parse_trace(lines(header(gpus=2), *recs))
    api, clock = start(trace)
    h0, h1 = api.handle(0), api.handle(1)
    assert api.power_usage_mw(h1) == 100_000
    clock.advance(2.2)
    for call in (
        lambda: api.power_usage_mw(h1),
        lambda: api.utilization_samples(h1, 0),
        lambda: api.memory_info(h1),
        lambda: api.gpm_sample(h1),
    ):
        with pytest.raises(NvmlError) as exc:
            call()
        assert exc.value.code == GPU_IS_LOST_CODE
        assert exc.value.name == "GPU_IS_LOST"
    assert api.power_usage_mw(h0) == 102_000
    assert api.uuid(h1).startswith("GPU-")  # identity does not touch the record
    clock.advance(1.0)
    assert api.power_usage_mw(h1) == 103_000


def test_missing_field_is_not_supported() -> None:
    rec = record(0.0)
    del rec["power_mw"], rec["pcie_kibps"]
    rec["temp_c"] = None
    trace = parse_trace(lines(header(), rec))
    api, _ = start(trace)
    h = api.handle(0)
    for call in (
        lambda: api.power_usage_mw(h),
        lambda: api.pcie_throughput_kibps(h, "tx"),
        lambda: api.temperature_c(h),
    ):
        with pytest.raises(NvmlError) as exc:
            call()
        assert exc.value.code == NOT_SUPPORTED_CODE
    assert api.memory_info(h) == (1000, 2000)


def test_mig_and_gpm_unsupported() -> None:
    head = header()
    head["gpus"][0].update(mig_mode=None, gpm=False)
    api, _ = start(parse_trace(lines(head, record(0.0))))
    h = api.handle(0)
    with pytest.raises(NvmlError) as exc:
        api.mig_mode(h)
    assert exc.value.code == NOT_SUPPORTED_CODE
    assert api.gpm_supported(h) is False
    with pytest.raises(NvmlError) as exc:
        api.gpm_sample(h)
    assert exc.value.code == NOT_SUPPORTED_CODE


def test_hang_blocks_the_first_call_only() -> None:
    trace = parse_trace(lines(header(), record(0.0), record(1.0, hang_s=0.2), record(2.0)))
    api, clock = start(trace)
    h = api.handle(0)
    clock.advance(1.5)
    began = time.monotonic()
    assert api.power_usage_mw(h) == 101_000
    assert time.monotonic() - began >= 0.15
    began = time.monotonic()
    assert api.temperature_c(h) == 50
    assert time.monotonic() - began < 0.15


def test_shutdown_interrupts_a_hang() -> None:
    trace = parse_trace(lines(header(), record(0.0, hang_s=60.0)))
    api, _ = start(trace)
    h = api.handle(0)
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(api.power_usage_mw(h))
        except NvmlError as err:
            outcome.append(err)

    thread = threading.Thread(target=call, daemon=True)
    began = time.monotonic()
    thread.start()
    time.sleep(0.1)
    assert thread.is_alive()
    api.shutdown()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - began < 5
    assert len(outcome) == 1
    assert isinstance(outcome[0], NvmlError)
    assert outcome[0].code == UNINITIALIZED_CODE


def test_xids_are_delivered_once_per_loop() -> None:
    recs = [record(0.0), record(1.0, xids=[79]), record(2.0, xids=[48, 63]), record(3.0)]
    trace = parse_trace(lines(header(duration_s=4.0), *recs))
    api, clock = start(trace)
    api.register_xid_events([api.handle(0)])
    assert api.wait_xid_events(0) == []
    clock.advance(1.5)
    assert api.wait_xid_events(0) == [XidEvent(0, 79)]
    assert api.wait_xid_events(0) == []
    clock.advance(1.0)
    assert api.wait_xid_events(0) == [XidEvent(0, 48), XidEvent(0, 63)]
    clock.advance(4.0)  # next loop: the same Xids again
    assert sorted(api.wait_xid_events(0), key=lambda e: e.xid) == [
        XidEvent(0, 48),
        XidEvent(0, 63),
        XidEvent(0, 79),
    ]


def test_shutdown_interrupts_xid_wait() -> None:
    trace = parse_trace(lines(header(), record(0.0)))
    api = ReplayApi(trace)  # real clock: the wait really waits
    api.init()
    api.register_xid_events([api.handle(0)])
    result: list[list[XidEvent]] = []
    thread = threading.Thread(target=lambda: result.append(api.wait_xid_events(30_000)))
    began = time.monotonic()
    thread.start()
    time.sleep(0.1)
    api.shutdown()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - began < 5
    assert result == [[]]


def test_gpu_reader_over_replay() -> None:
    """The shared read logic, fed by the shipped trace, sees every sample once."""
    trace = load_trace(SHIPPED)
    api, clock = start(trace)
    h = api.handle(0)
    reader = GpuReader(api, read_identity(api, 0, h), h, clock=clock)
    assert reader.identity.gpm_supported
    assert reader.identity.mig_mode == "disabled"
    seen: list[int] = []
    for _ in range(10):
        reading = reader.read()
        seen += [ts for ts, _ in reading.samples]
        assert reading.power_mw is not None and reading.energy_mj is not None
        clock.advance(3.0)
    assert seen == sorted(set(seen))
    assert reading.gpm  # from the second read on
    assert reading.pcie_tx_kibps is None  # GPM supplies PCIe
    # The shipped trace is an HGX H100: links, fabric and power limit answer; it has no
    # workload power profiles (Blackwell) and no power smoothing, said once each.
    assert reader.unsupported == {"power_profiles"}
    assert reader.unsupported_fields == {"power_smoothing_enabled", "power_smoothing_floor_w"}
    assert reading.fields[("nvlink_state", 17)] == 1 and reading.fabric is not None
    assert reading.power_limit_mw == 700_000


# --- malformed traces ------------------------------------------------------------------------


def _raises_at(text_lines: list[str], line: int, match: str) -> None:
    with pytest.raises(TraceError, match=match) as exc:
        parse_trace(text_lines, "t.jsonl")
    assert f"t.jsonl:{line}:" in str(exc.value)


def test_bad_json() -> None:
    _raises_at([*lines(header(), record(0.0)), "{not json"], 3, "not JSON")


def test_missing_header() -> None:
    _raises_at(lines(record(0.0), record(1.0)), 1, "header")


def test_wrong_version() -> None:
    _raises_at(lines({**header(), "version": 2}, record(0.0)), 1, "version")


def test_non_increasing_t() -> None:
    _raises_at(lines(header(), record(0.0), record(1.0), record(1.0)), 4, "increase")


def test_unknown_error_name() -> None:
    _raises_at(lines(header(), record(0.0, error="ON_FIRE")), 2, "ON_FIRE")


def test_unknown_gpm_metric() -> None:
    _raises_at(lines(header(), record(0.0, gpm={"warp_drive": 1.0})), 2, "warp_drive")


def test_gpu_not_in_header() -> None:
    _raises_at(lines(header(), record(0.0, gpu=3)), 2, "gpu 3")


def test_line_numbers_count_blank_lines() -> None:
    _raises_at([*lines(header(), record(0.0)), "", "[1, 2"], 4, "not JSON")


def test_duration_must_cover_records() -> None:
    _raises_at(lines(header(duration_s=1.0), record(0.0), record(1.0)), 1, "duration_s")


def test_empty_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="empty"):
        parse_trace(["", "  "])
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.jsonl")


def test_duration_defaults_to_one_more_interval() -> None:
    trace = parse_trace(lines(header(), record(0.0), record(2.0), record(4.0)))
    assert trace.duration_s == 6.0


# --- hardware facts (the inputs of the peak figures) ------------------------------------------

H100_FACTS = {
    "memory_bus_width_bits": 5120,
    "max_clocks_mhz": [1980, 2619],
    "cuda_cores": 16896,
    "compute_capability": [9, 0],
}


def test_facts_are_answered_from_the_header() -> None:
    head = header(gpus=2)
    head["gpus"][0]["facts"] = H100_FACTS
    head["gpus"][1]["facts"] = {"max_clocks_mhz": [None, 2619]}
    api, _ = start(parse_trace(lines(head, record(0.0), record(0.0, gpu=1))))
    h0, h1 = api.handle(0), api.handle(1)
    assert api.memory_bus_width_bits(h0) == 5120
    assert api.max_clock_mhz(h0, "sm") == 1980
    assert api.max_clock_mhz(h0, "mem") == 2619
    assert api.cuda_cores(h0) == 16896
    assert api.compute_capability(h0) == (9, 0)
    identity = read_identity(api, 0, h0)
    assert identity.facts.cuda_cores == 16896
    # what the trace does not hold answers NOT_SUPPORTED, as NVML does
    assert api.max_clock_mhz(h1, "mem") == 2619
    for call in (
        lambda: api.max_clock_mhz(h1, "sm"),
        lambda: api.memory_bus_width_bits(h1),
        lambda: api.cuda_cores(h1),
        lambda: api.compute_capability(h1),
    ):
        with pytest.raises(NvmlError) as exc:
            call()
        assert exc.value.code == NOT_SUPPORTED_CODE


def test_old_trace_without_facts_still_loads_and_peaks_come_from_the_name() -> None:
    api, _ = start(parse_trace(lines(header(), record(0.0))))
    identity = read_identity(api, 0, api.handle(0))
    assert identity.facts == GpuFacts()
    peaks = peaks_of(identity.name, identity.facts)
    assert peaks.memory_bandwidth == pytest.approx(3.352e12, rel=1e-3)
    assert peaks.flops["bf16"] == pytest.approx(989.4e12, rel=1e-3)


def test_shipped_trace_carries_h100_sxm_facts() -> None:
    trace = load_trace(SHIPPED)
    for gpu in trace.gpus:
        assert gpu.facts.memory_bus_width_bits == 5120
        assert gpu.facts.cuda_cores == 132 * 128
        assert (gpu.facts.max_sm_clock_mhz, gpu.facts.max_memory_clock_mhz) == (1980, 2619)
        assert gpu.facts.compute_capability == (9, 0)


@pytest.mark.parametrize(
    ("facts", "problem"),
    [
        ("fast", "'facts' must be an object"),
        ({"bus": 1}, "unknown facts"),
        ({"cuda_cores": -1}, "cuda_cores must be a positive integer"),
        ({"cuda_cores": True}, "cuda_cores must be a positive integer"),
        ({"max_clocks_mhz": [1980]}, "'max_clocks_mhz' must be [sm, memory]"),
        ({"compute_capability": [9]}, "'compute_capability' must be [major, minor]"),
        ({"compute_capability": ["9", 0]}, "'compute_capability' must be [major, minor]"),
    ],
)
def test_bad_facts(facts: Any, problem: str) -> None:
    head = header()
    head["gpus"][0]["facts"] = facts
    with pytest.raises(TraceError, match="trace:1: bad gpu entry") as exc:
        parse_trace(lines(head, record(0.0)))
    assert problem in str(exc.value)


# --- MIG devices and per-process samples -------------------------------------------------------


def mig_header(**extra: Any) -> dict[str, Any]:
    h = header(duration_s=10.0, **extra)
    gpu = h["gpus"][0]
    gpu["mig_mode"] = 1
    gpu["max_mig_devices"] = 7
    gpu["mig_devices"] = [
        {
            "slot": 0,
            "uuid": "MIG-a",
            "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            "gpu_instance_id": 2,
            "attributes": [60, 3, 3, 40192],
        },
        {
            "slot": 3,
            "uuid": "MIG-b",
            "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            "gpu_instance_id": 9,
            "compute_instance_id": 0,
        },
    ]
    return h


def parent_record(t: float) -> dict[str, Any]:
    # a GPU in MIG mode answers its own fields, not utilisation
    return {"t": t, "gpu": 0, "power_mw": 300_000, "temp_c": 40, "clocks_mhz": [1980, 2619]}


def mig_record(t: float, slot: int, **fields: Any) -> dict[str, Any]:
    return {"t": t, "gpu": 0, "mig": slot, "memory": [slot * 1000 + int(t), 9000], **fields}


def mig_trace() -> Trace:
    recs = []
    for k in range(10):
        recs.append(parent_record(float(k)))
        recs.append(mig_record(float(k), 0, gpm={"graphics_util": 50.0 + k, "dram_bw_util": 20.0}))
        recs.append(mig_record(float(k), 3, gpm={"graphics_util": 5.0}, processes=[[77, 1024]]))
    return parse_trace(lines(mig_header(), *recs))


def test_mig_devices_by_slot() -> None:
    trace = mig_trace()
    assert sorted(trace.mig_records) == [(0, 0), (0, 3)]
    api, clock = start(trace)
    h = api.handle(0)
    assert api.mig_mode(h) == 1
    assert api.mig_device_count(h) == 7
    a = api.mig_device_handle(h, 0)
    with pytest.raises(NvmlError) as exc:
        api.mig_device_handle(h, 1)  # an empty slot
    assert exc.value.code == 6  # NOT_FOUND
    with pytest.raises(NvmlError) as exc:
        api.mig_device_handle(h, 7)
    assert exc.value.code == 2  # INVALID_ARGUMENT
    b = api.mig_device_handle(h, 3)
    assert (api.uuid(a), api.name(b)) == ("MIG-a", "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert api.pci_bus_id(b) == api.pci_bus_id(h)
    assert (api.gpu_instance_id(a), api.compute_instance_id(a)) == (2, 0)
    assert api.mig_attributes(a).memory_size_mib == 40192
    with pytest.raises(NvmlError) as exc:
        api.mig_attributes(b)  # not in the trace
    assert exc.value.code == NOT_SUPPORTED_CODE
    clock.advance(4.5)
    assert api.memory_info(a) == (4, 9000)
    assert api.memory_info(b) == (3004, 9000)
    assert api.power_usage_mw(h) == 300_000
    for call in (
        lambda: api.power_usage_mw(a),
        lambda: api.utilization_samples(a, 0),
        lambda: api.utilization_samples(h, 0),  # no samples in MIG mode
        lambda: api.process_utilization(b, 0),
        lambda: api.mig_mode(a),
    ):
        with pytest.raises(NvmlError) as exc:
            call()
        assert exc.value.code == NOT_SUPPORTED_CODE
    assert api.compute_processes(b) == [ProcessMemory(77, 1024)]


def test_gpm_of_a_gpu_instance() -> None:
    api, clock = start(mig_trace())
    h = api.handle(0)
    older = api.gpm_mig_sample(h, 2)
    clock.advance(2.0)
    newer = api.gpm_mig_sample(h, 2)
    values = api.gpm_metrics(older, newer, [GPM_GRAPHICS_UTIL, GPM_DRAM_BW_UTIL, GPM_SM_UTIL])
    assert values == {GPM_GRAPHICS_UTIL: 52.0, GPM_DRAM_BW_UTIL: 20.0, GPM_SM_UTIL: None}
    with pytest.raises(NvmlError) as exc:
        api.gpm_mig_sample(h, 5)  # no such GPU instance
    assert exc.value.code == 6


def test_mig_reader_over_replay() -> None:
    api, clock = start(mig_trace())
    h = api.handle(0)
    parent = read_identity(api, 0, h)
    assert parent.mig_mode == "enabled"
    slices = read_mig_slices(api, parent, h)
    assert [i.label for i, _ in slices] == ["0:0", "0:3"]
    identity, handle = slices[0]
    reader = GpuReader(api, identity, handle, clock=clock, parent=h)
    reader.read()
    clock.advance(3.0)
    reading = reader.read()
    assert reading.gpm["graphics_util"] == 53.0
    assert reading.memory_used_bytes == 3


def test_process_samples_are_buffered_like_utilisation_samples() -> None:
    recs = [
        record(
            float(k),
            processes=[[100, 5 << 30], [200, None]],
            process_samples=[[k * 1_000_000 - 500_000, 100, 30, 10], [k * 1_000_000, 200, 60, 20]],
        )
        for k in range(10)
    ]
    api, clock = start(parse_trace(lines(header(duration_s=10.0, engine_pids=[100]), *recs)))
    h = api.handle(0)
    assert api.compute_processes(h) == [ProcessMemory(100, 5 << 30), ProcessMemory(200, None)]
    first = api.process_utilization(h, 0)
    assert first == [
        ProcessSample(100, WALL0 - 500_000, 30, 10),  # the driver's buffer reaches back
        ProcessSample(200, WALL0, 60, 20),
    ]
    assert api.process_utilization(h, WALL0) == []
    clock.advance(2.5)
    got = api.process_utilization(h, WALL0)
    assert [s.timestamp_us - WALL0 for s in got] == [
        500_000,
        1_000_000,
        1_500_000,
        2_000_000,
        2_500_000,
    ]
    clock.advance(10.0)  # the next loop: timestamps keep increasing
    later = api.process_utilization(h, got[-1].timestamp_us)
    assert later and all(s.timestamp_us > got[-1].timestamp_us for s in later)


def test_engine_pids_in_the_header() -> None:
    trace = parse_trace(lines(header(engine_pids=[4242, 4243]), record(0.0)))
    assert trace.engine_pids == frozenset({4242, 4243})
    assert parse_trace(lines(header(), record(0.0))).engine_pids is None


@pytest.mark.parametrize(
    ("head", "rec", "problem"),
    [
        (mig_header(), mig_record(0.0, 1), "no MIG device in slot 1"),
        (header(), mig_record(0.0, 0), "no MIG device in slot 0"),
        (mig_header(), {**mig_record(0.0, 0), "xids": [79]}, "Xids belong to the GPU"),
        (header(engine_pids="4242"), record(0.0), "'engine_pids' must be a list"),
        (header(), record(0.0, processes=[[1]]), "'processes' must be"),
        (header(), record(0.0, process_samples=[[1, 2]]), "'process_samples' must be"),
    ],
)
def test_bad_mig_and_process_fields(
    head: dict[str, Any], rec: dict[str, Any], problem: str
) -> None:
    with pytest.raises(TraceError, match=problem):
        parse_trace(lines(head, rec))


def test_bad_mig_devices_in_the_header() -> None:
    h = mig_header()
    h["gpus"][0]["mig_mode"] = 0
    with pytest.raises(TraceError, match="mig_devices need 'mig_mode': 1"):
        parse_trace(lines(h, record(0.0)))
    h = mig_header()
    h["gpus"][0]["mig_devices"][1]["slot"] = 0
    with pytest.raises(TraceError, match="slots must be unique"):
        parse_trace(lines(h, record(0.0)))
    h = mig_header()
    h["gpus"][0]["max_mig_devices"] = 2
    with pytest.raises(TraceError, match="not below max_mig_devices"):
        parse_trace(lines(h, record(0.0)))


def test_every_mig_device_needs_records() -> None:
    with pytest.raises(TraceError, match="MIG device 0:3 has no records"):
        parse_trace(lines(mig_header(), parent_record(0.0), mig_record(0.0, 0)))
