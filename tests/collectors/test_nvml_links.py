"""The links and the power state: NVLink, C2C, the fabric, the enforced power limit, power
smoothing and workload power profiles; the energy spent idle.

Two sources: the shipped synthetic traces of links replayed through the collector (a stepped
clock), and the stand-in pynvml (nvidia-ml-py's own bindings over a fake C library) for what a
driver answers or lacks: field values by id and scope, structure versions, missing symbols.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry
from support.clock import FakeClock
from support.doc_tables import presence_table
from support.metrics import registry_of
from support.paths import ROOT
from support.pynvml_fake import (
    GB200_LINK_MBPS,
    H100_LINK_MBPS,
    H100_PCIE,
    L4_LINKLESS,
    Error,
    FakeFabric,
    FakeGpu,
    FakeLink,
    fake_pynvml,
    gb200,
    hgx_h100,
    tp_pod,
)
from support.synthetic_links import SHIPPED

from exporter.backends.nvml_library import PynvmlApi
from exporter.backends.replay import ReplayApi, Trace, load_trace, parse_trace
from exporter.collectors.nvml import NvmlCollector
from exporter.metrics import CATALOGUE
from exporter.recorder import record_with

TRACES = ROOT / "tests" / "fixtures" / "traces"
LINKBOUND = TRACES / "replay-tp2-linkbound-synthetic.jsonl"
OVERLAPPED = TRACES / "replay-tp2-overlapped-synthetic.jsonl"
GB200 = TRACES / "replay-gb200-synthetic.jsonl"
PCIE = TRACES / "replay-pcie-nolink-synthetic.jsonl"
WALL0 = 1_700_000_000_000_000
MIB = 1024 * 1024
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
# The series this change added: absent wherever NVML lacks what they need.
NEW = tuple(
    s.family_name
    for s in CATALOGUE
    if s.name.startswith(("inference_gpu_nvlink_", "inference_gpu_c2c_", "inference_gpu_fabric_"))
    or s.name
    in {
        "inference_gpu_power_limit_watts",
        "inference_gpu_power_default_limit_watts",
        "inference_gpu_power_smoothing_enabled",
        "inference_gpu_power_smoothing_floor_watts",
        "inference_gpu_power_profile_info",
        "inference_gpu_idle_energy_joules_total",
    }
)


@dataclasses.dataclass
class Polled:
    """A collector polled at given times; ``registry`` is its last scrape."""

    collector: NvmlCollector
    clock: FakeClock
    registry: CollectorRegistry

    def value(self, metric: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(metric, labels)

    def poll(self, at: float) -> None:
        self.clock.now = 1000.0 + at
        self.collector.poll_now()
        collection = self.collector.collect()
        assert collection.success, collection.error
        self.registry = registry_of(collection)


# The tests step the clock by about this much between polls.
STEP_S = 3.0


def polled(api_factory: Any, clock: FakeClock, times: tuple[float, ...], **kw: Any) -> Polled:
    # No poll of the collector's own: the test polls at the times it sets.
    collector = NvmlCollector(api_factory, poll_interval=3600, deadline=2.0, clock=clock, **kw)
    collector.start()
    assert collector.wait_ready(5)
    for state in collector._states.values():
        state.poll_interval_s = STEP_S  # what a gap between polls is measured against
    out = Polled(collector, clock, registry_of(collector.collect()))
    for t in times:
        out.poll(t)
    return out


@pytest.fixture
def replayed() -> Iterator[Any]:
    """Replay a trace, the collector polled at the given trace times (3 s apart by default)."""
    started: list[tuple[ReplayApi, NvmlCollector]] = []

    def replay(trace: Trace, times: tuple[float, ...] = (3.0, 6.0, 9.0), **kw: Any) -> Polled:
        clock = FakeClock()
        api = ReplayApi(trace, clock=clock, wall_us=lambda: WALL0)
        out = polled(lambda: api, clock, times, **kw)
        started.append((api, out.collector))
        return out

    yield replay
    for api, collector in started:
        api.shutdown()  # ends the Xid thread's one-second wait at once
        collector.stop(2)


@pytest.fixture
def driven() -> Iterator[Any]:
    """The collector over the stand-in pynvml for ``gpus`` (kwargs: fake_pynvml's)."""
    started: list[NvmlCollector] = []

    def drive(gpus: list[FakeGpu], times: tuple[float, ...] = (3.0,), **kw: Any) -> Polled:
        per_link = kw.pop("per_link", False)
        module = fake_pynvml(gpus, **kw)
        clock = FakeClock()
        out = polled(lambda: PynvmlApi(library=module), clock, times, per_link=per_link)
        out.module = module  # type: ignore[attr-defined]
        started.append(out.collector)
        return out

    yield drive
    for collector in started:
        collector.stop(2)


def labels(trace: Trace, gpu: int, **extra: str) -> dict[str, str]:
    return {"gpu": str(gpu), "uuid": trace.gpus[gpu].uuid, **extra}


def link_share(p: Polled, gpu: dict[str, str], seconds: float, before: float) -> float:
    """The share of the NVLink peak the GPU sent at over ``seconds`` since ``before`` bytes."""
    sent = p.value("inference_gpu_nvlink_transmit_bytes_total", **gpu)
    peak = p.value("inference_gpu_nvlink_peak_bytes_per_second", **gpu)
    assert sent is not None and peak is not None
    return (sent - before) / seconds / peak


# --- the shipped traces ---------------------------------------------------------------------


def test_shipped_link_traces_are_fresh_and_say_they_are_synthetic() -> None:
    for name, make in SHIPPED.items():
        text = (TRACES / name).read_text(encoding="utf-8")
        assert text == "\n".join(make()) + "\n", f"{name}: regenerate (support.synthetic_links)"
        header = json.loads(text.splitlines()[0])
        assert header["synthetic"] is True
        assert header["description"].startswith("SYNTHETIC trace, not a recording")


def test_link_bound_pod_runs_its_links_near_peak_with_idle_sms(replayed: Any) -> None:
    trace = load_trace(LINKBOUND)
    p = replayed(trace, times=(3.0,))
    before = [
        p.value("inference_gpu_nvlink_transmit_bytes_total", **labels(trace, g)) or 0.0
        for g in (0, 1)
    ]
    p.poll(9.0)
    for gpu in (0, 1):
        lab = labels(trace, gpu)
        assert link_share(p, lab, 6.0, before[gpu]) == pytest.approx(0.9, abs=0.02)
        assert p.value("inference_gpu_sm_active_ratio", **lab) < 0.15
        # NCCL's kernels keep the device "busy": utilisation alone would call this healthy
        assert p.value("inference_gpu_utilization_ratio", **lab) > 0.85
        assert (
            p.value("inference_gpu_nvlink_peak_bytes_per_second", **lab)
            == 18 * H100_LINK_MBPS * 1e6
        )
        assert p.value("inference_gpu_nvlink_links", **lab, state="active") == 18
        assert p.value("inference_gpu_nvlink_links", **lab, state="inactive") == 0
        # both directions: an all-reduce sends what it receives
        received = p.value("inference_gpu_nvlink_receive_bytes_total", **lab)
        sent = p.value("inference_gpu_nvlink_transmit_bytes_total", **lab)
        assert received == pytest.approx(sent, rel=0.02)
        assert p.value("inference_gpu_fabric_state", **lab, state="completed") == 1
        assert p.value("inference_gpu_fabric_state", **lab, state="failed") == 0
        assert p.value("inference_gpu_power_limit_watts", **lab) == 700


def test_overlapped_pod_is_busy_on_both(replayed: Any) -> None:
    trace = load_trace(OVERLAPPED)
    p = replayed(trace, times=(3.0,))
    before = p.value("inference_gpu_nvlink_transmit_bytes_total", **labels(trace, 0)) or 0.0
    p.poll(9.0)
    lab = labels(trace, 0)
    assert link_share(p, lab, 6.0, before) == pytest.approx(0.6, abs=0.02)
    assert p.value("inference_gpu_sm_active_ratio", **lab) > 0.75


def test_per_link_series_only_when_asked(replayed: Any) -> None:
    trace = load_trace(LINKBOUND)
    lab = labels(trace, 0, link="17")
    plain = replayed(trace)
    assert plain.value("inference_gpu_nvlink_link_transmit_bytes_total", **lab) is None
    assert plain.value("inference_gpu_nvlink_link_peak_bytes_per_second", **lab) is None
    each = replayed(trace, per_link=True)
    total = each.value("inference_gpu_nvlink_transmit_bytes_total", **labels(trace, 0))
    links = [
        each.value(
            "inference_gpu_nvlink_link_transmit_bytes_total", **labels(trace, 0, link=str(n))
        )
        for n in range(18)
    ]
    assert None not in links
    assert sum(links) == pytest.approx(total, rel=1e-6)  # type: ignore[arg-type]
    assert (
        each.value("inference_gpu_nvlink_link_peak_bytes_per_second", **lab) == H100_LINK_MBPS * 1e6
    )
    assert (
        each.value("inference_gpu_nvlink_link_transmit_bytes_total", **labels(trace, 0, link="18"))
        is None
    )


def test_gpu_without_nvlink_says_so_and_keeps_everything_else(replayed: Any) -> None:
    trace = load_trace(PCIE)
    p = replayed(trace)
    lab = labels(trace, 0)
    for state in ("active", "inactive", "sleep", "active_traffic_disabled"):
        assert p.value("inference_gpu_nvlink_links", **lab, state=state) == 0
    for absent in ("nvlink_transmit_bytes_total", "nvlink_peak_bytes_per_second"):
        assert p.value(f"inference_gpu_{absent}", **lab) is None
    assert p.value("inference_gpu_fabric_state", **lab, state="completed") is None
    # and what holds its clocks: a cap below its default limit, drawn against
    assert p.value("inference_gpu_power_limit_watts", **lab) == 300
    assert p.value("inference_gpu_power_default_limit_watts", **lab) == 350
    assert p.value("inference_gpu_clock_event_active", **lab, reason="power_cap") == 1
    assert p.value("inference_gpu_power_watts", **lab) > 0.95 * 300
    assert p.value("inference_gpu_sm_active_ratio", **lab) > 0.6


def test_gb200_c2c_smoothing_profile_and_idle_energy(replayed: Any) -> None:
    trace = load_trace(GB200)
    lab = labels(trace, 0)
    p = replayed(trace, times=(3.0,))
    c2c0 = p.value("inference_gpu_c2c_receive_bytes_total", **lab) or 0.0
    p.poll(6.0)
    # 60000 MiB/s from the Grace CPU while serving, over the 3 s since the last poll
    received = p.value("inference_gpu_c2c_receive_bytes_total", **lab)
    assert received - c2c0 == pytest.approx(60000 * MIB * 3.0)  # type: ignore[operator]
    assert p.value("inference_gpu_c2c_links", **lab, state="active") == 10
    assert p.value("inference_gpu_c2c_peak_bytes_per_second", **lab) == 10 * 40000 * 1e6
    assert (
        p.value("inference_gpu_nvlink_peak_bytes_per_second", **lab) == 18 * GB200_LINK_MBPS * 1e6
    )
    assert p.value("inference_gpu_power_smoothing_enabled", **lab) == 1
    assert p.value("inference_gpu_power_smoothing_floor_watts", **lab) == 600
    assert p.value("inference_gpu_power_profile_info", **lab, profile="llm_inference") == 1
    assert p.value("inference_gpu_fabric_health", **lab, status="healthy") == 1
    assert (
        p.value(
            "inference_gpu_fabric_info",
            **lab,
            cluster_uuid=trace.gpus[0].constants["fabric"]["cluster_uuid"],
            clique_id="4",
        )
        == 1
    )
    # serving: no interval idle throughout
    assert p.value("inference_gpu_idle_energy_joules_total", **lab) == 0
    # the second half is idle at the 600 W floor: 12 -> 15 -> 18 s all idle
    for t in (12.0, 15.0, 18.0):
        p.poll(t)
    idle = p.value("inference_gpu_idle_energy_joules_total", **lab)
    assert idle == pytest.approx(600 * 6.0, rel=0.01)
    total = p.value("inference_gpu_energy_joules_total", **lab)
    assert total is not None and total > idle  # type: ignore[operator]


def test_boards_table_as_promised(replayed: Any) -> None:
    """docs/nvml.md's boards table, column by column, against the shipped traces."""
    table = presence_table("boards")
    family = {s.name: s.family_name for s in CATALOGUE}
    for column, path in (
        ("HGX H100 (driver 550)", LINKBOUND),
        ("GB200 (driver 590)", GB200),
        ("H100 PCIe, no NVLink", PCIE),
    ):
        names = {
            f.name
            for f in replayed(load_trace(path), per_link=True).collector.collect().metrics
            if f.samples
        }
        for metric, columns in table.items():
            assert (family[metric] in names) == columns[column], (column, metric)


# --- the stand-in pynvml: what a driver answers, or lacks ------------------------------------


def test_tp_pod_through_the_real_bindings(driven: Any) -> None:
    for bound, share in ((True, 0.9), (False, 0.6)):
        gpus = tp_pod(link_bound=bound)
        p = driven(gpus, times=(3.0, 6.0))
        lab = {"gpu": "0", "uuid": gpus[0].uuid}
        sent = p.value("inference_gpu_nvlink_transmit_bytes_total", **lab)
        # GPM values from the second poll on: two intervals of 3 s at the share of the peak
        assert sent == pytest.approx(share * 18 * H100_LINK_MBPS * 1e6 * 6.0, rel=1e-6)
        assert p.value("inference_gpu_sm_active_ratio", **lab) == (0.08 if bound else 0.85)
        assert (
            p.value("inference_gpu_fabric_condition_active", **lab, condition="degraded_bandwidth")
            == 0
        )
        assert p.value("inference_gpu_fabric_health", **lab, status="healthy") is None  # v2 only


def test_counters_where_gpm_has_no_nvlink(driven: Any) -> None:
    """An A100 (no GPM), and an H100 whose GPM answers its other metrics but no NVLink ones:
    the throughput counters (KiB) instead, by difference, per link with
    --gpu.nvlink-per-link."""
    a100 = hgx_h100(0, name="NVIDIA A100-SXM4-80GB", gpm_supported=False, links=12)
    h100 = hgx_h100(1, gpm={pynvml.NVML_GPM_METRIC_SM_UTIL: 40.0})
    # the H100 learns at its second poll (3 s) that GPM has no NVLink, reads the counters from
    # the third (6 s): both count from there
    p = driven([a100, h100], times=(3.0, 6.0), per_link=True)
    for gpu in (a100, h100):
        for link in gpu.nvlinks or []:
            link.tx_kib += 3 * 1024 * 1024  # 3 GiB sent on each link in the next 3 s
    p.poll(9.0)
    for index, gpu in enumerate((a100, h100)):
        lab = {"gpu": str(index), "uuid": gpu.uuid}
        links = len(gpu.nvlinks or [])
        assert p.value("inference_gpu_nvlink_transmit_bytes_total", **lab) == links * 3 * 1024**3
        assert p.value("inference_gpu_nvlink_receive_bytes_total", **lab) == 0
        sent = p.value("inference_gpu_nvlink_link_transmit_bytes_total", **lab, link="0")
        assert sent == 3 * 1024**3
    # a counter that steps back (driver reload) loses that interval, not the series
    for link in a100.nvlinks or []:
        link.tx_kib = 0
    p.poll(12.0)
    sent = p.value("inference_gpu_nvlink_transmit_bytes_total", gpu="0", uuid=a100.uuid)
    assert sent == 12 * 3 * 1024**3


def test_driver_without_any_of_it_leaves_every_other_series_intact(driven: Any) -> None:
    """The same GPUs on a driver (and nvidia-ml-py) without field values, fabric, the enforced
    limit or power profiles: every series the exporter had before is there with the same
    value, the new ones are absent, and the collector succeeds."""
    full = [hgx_h100(0, gpm={1: 50.0, 2: 40.0, **tp_pod(link_bound=True)[0].gpm}), gb200()]
    bare = [dataclasses.replace(g) for g in full]
    with_all = driven(full, times=(3.0, 6.0), driver="590.48.01")
    without = driven(
        bare,
        times=(3.0, 6.0),
        driver="590.48.01",
        missing=(
            "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetGpuFabricInfoV",
            "nvmlDeviceGetGpuFabricInfo",
            "nvmlDeviceGetEnforcedPowerLimit",
        ),
        drop=("nvmlDeviceWorkloadPowerProfileGetCurrentProfiles",),
    )

    def samples(p: Polled) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in p.collector.collect().metrics
            for s in f.samples
            if not s.name.startswith("inference_nvml_calls")
        }

    had, kept = samples(with_all), samples(without)
    new = {k for k in had if k[0].removesuffix("_total") in NEW}
    assert new  # the full driver gives them
    assert not {k for k in kept if k[0].removesuffix("_total") in NEW}
    assert {k: v for k, v in had.items() if k not in new} == kept
    # Three polls of the HGX H100. With everything: field values each poll, fabric and power
    # profiles on the first (every tenth after; profiles not an H100's); without: each of the
    # four asked once, then never.
    calls = without.value("inference_nvml_calls_total", gpu="0")
    baseline = with_all.value("inference_nvml_calls_total", gpu="0")
    assert baseline - calls == (3 + 1 + 1) - 4  # type: ignore[operator]


def test_each_unsupported_field_goes_alone(driven: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A driver before 520: no per-link state or speed. The link count, the common speed and
    the power limit still answer; each field is said once and not asked again."""
    old = hgx_h100(0, nvlink_fields=False)
    caplog.set_level(logging.INFO, logger="exporter.backends.gpu_reader")
    p = driven([old], times=(3.0, 6.0))
    lab = {"gpu": "0", "uuid": old.uuid}
    assert p.value("inference_gpu_nvlink_links", **lab, state="unknown") == 18
    assert p.value("inference_gpu_nvlink_links", **lab, state="active") == 0
    # the common speed of active links stands in for each link's
    assert p.value("inference_gpu_nvlink_peak_bytes_per_second", **lab) == 18 * H100_LINK_MBPS * 1e6
    assert p.value("inference_gpu_power_limit_watts", **lab) == 700
    said = [r.getMessage() for r in caplog.records if "unsupported" in r.getMessage()]
    # both fields in one line, said once over three polls
    assert len(said) == 1, said
    assert "nvlink_state (" in said[0] and "nvlink_speed_mbps (" in said[0], said
    asked = [
        call
        for call in p.module.calls
        if call[0] == "nvmlDeviceGetFieldValues"  # type: ignore[attr-defined]
    ]
    assert len(asked) == 1 + 3  # identity, then one per poll (the start and two more)


def test_one_link_that_does_not_answer_leaves_the_others(driven: Any) -> None:
    gpu = hgx_h100(0)
    assert gpu.nvlinks is not None
    gpu.nvlinks[5] = FakeLink(state=Error(pynvml.NVML_ERROR_INVALID_ARGUMENT))
    p = driven([gpu], times=(3.0, 6.0))
    lab = {"gpu": "0", "uuid": gpu.uuid}
    assert p.value("inference_gpu_nvlink_links", **lab, state="active") == 17
    assert p.value("inference_gpu_nvlink_links", **lab, state="unknown") == 1
    # its speed still answers: its state unknown, it counts as usable
    assert p.value("inference_gpu_nvlink_peak_bytes_per_second", **lab) == 18 * H100_LINK_MBPS * 1e6


def test_power_limit_from_its_own_call_on_an_older_driver(driven: Any) -> None:
    old = dataclasses.replace(L4_LINKLESS, power_limit_field=False)
    p = driven([old], driver="535.104.05")
    assert p.value("inference_gpu_power_limit_watts", gpu="0", uuid=old.uuid) == 72
    made = [c[0] for c in p.module.calls]  # type: ignore[attr-defined]
    assert made.count("nvmlDeviceGetEnforcedPowerLimit") == 2  # each poll, the field missing


def test_power_smoothing_ids_follow_the_driver(
    driven: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """nvml.h renumbered the smoothing fields at driver 590: both generations read right, and
    a driver that answers the other numbering is caught, not misread."""
    for driver in ("575.51.03", "590.48.01"):
        gpu = gb200()
        p = driven([gpu], driver=driver)
        assert p.value("inference_gpu_power_smoothing_enabled", gpu="0", uuid=gpu.uuid) == 1
        assert p.value("inference_gpu_power_smoothing_floor_watts", gpu="0", uuid=gpu.uuid) == 600
    gpu = gb200()
    mismatched = fake_pynvml([gpu], driver="590.48.01")
    mismatched.library.branch = 575  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING, logger="exporter.backends.gpu_reader")
    clock = FakeClock()
    p = polled(lambda: PynvmlApi(library=mismatched), clock, (3.0,))
    try:
        assert p.value("inference_gpu_power_smoothing_enabled", gpu="0", uuid=gpu.uuid) is None
        assert any("not 0 or 1" in r.getMessage() for r in caplog.records)
        assert p.value("inference_gpu_power_limit_watts", gpu="0", uuid=gpu.uuid) == 1200
    finally:
        p.collector.stop(2)


@pytest.mark.parametrize("version", [3, 2, 1])
def test_fabric_structure_versions(driven: Any, version: int) -> None:
    gpu = hgx_h100(
        0,
        fabric=FakeFabric(
            clique_id=7, status=0, health_mask=2 | 1 << 8, health_summary=3, max_version=version
        ),
    )
    p = driven([gpu])
    lab = {"gpu": "0", "uuid": gpu.uuid}
    assert p.value("inference_gpu_fabric_state", **lab, state="completed") == 1
    health = p.value("inference_gpu_fabric_health", **lab, status="limited_capacity")
    assert health == (1 if version == 3 else None)
    degraded = p.value(
        "inference_gpu_fabric_condition_active", **lab, condition="degraded_bandwidth"
    )
    assert degraded == (0 if version >= 2 else None)
    # the conditions the mask does not report (0) are absent, not "false"
    assert (
        p.value("inference_gpu_fabric_condition_active", **lab, condition="route_recovery") is None
    )


def test_fabric_and_profiles_are_read_every_tenth_poll(driven: Any) -> None:
    """They change when someone acts: the last answer stands for nine polls (27 s at the
    default interval), the field values (power limit, link states) are read every poll."""
    gpu = gb200()
    p = driven([gpu], times=tuple(3.0 * k for k in range(1, 6)), driver="590.48.01")
    lab = {"gpu": "0", "uuid": gpu.uuid}
    assert isinstance(gpu.fabric, FakeFabric)
    gpu.fabric.health_summary = 2  # unhealthy from now on
    gpu.power_limit_mw = 900_000
    for k in range(6, 10):  # polls 6 to 9: the cached fabric, the new limit
        p.poll(3.0 * k)
        assert p.value("inference_gpu_fabric_health", **lab, status="healthy") == 1
        assert p.value("inference_gpu_power_limit_watts", **lab) == 900
    p.poll(30.0)  # the eleventh poll (the tenth after the first) reads it again
    assert p.value("inference_gpu_fabric_health", **lab, status="unhealthy") == 1
    made = [name for name, _ in p.module.calls]  # type: ignore[attr-defined]
    assert made.count("nvmlDeviceGetGpuFabricInfoV") == 2
    assert made.count("nvmlDeviceWorkloadPowerProfileGetCurrentProfiles") == 2
    assert made.count("nvmlDeviceGetFieldValues") == 1 + 11  # identity, then every poll


def test_failed_fabric_registration(driven: Any) -> None:
    gpu = hgx_h100(0, fabric=FakeFabric(status=pynvml.NVML_ERROR_UNKNOWN))
    p = driven([gpu])
    lab = {"gpu": "0", "uuid": gpu.uuid}
    assert p.value("inference_gpu_fabric_state", **lab, state="failed") == 1
    assert p.value("inference_gpu_fabric_state", **lab, state="completed") == 0


def test_a_down_link_leaves_the_peak(driven: Any) -> None:
    gpu = hgx_h100(0)
    assert gpu.nvlinks is not None
    gpu.nvlinks[3] = FakeLink(state=0)
    gpu.nvlinks[4] = FakeLink(state=2)  # asleep: still usable
    p = driven([gpu])
    lab = {"gpu": "0", "uuid": gpu.uuid}
    assert p.value("inference_gpu_nvlink_links", **lab, state="inactive") == 1
    assert p.value("inference_gpu_nvlink_links", **lab, state="sleep") == 1
    assert p.value("inference_gpu_nvlink_peak_bytes_per_second", **lab) == 17 * H100_LINK_MBPS * 1e6


def test_gpus_without_links_answer_what_they_have(driven: Any) -> None:
    p = driven([H100_PCIE, L4_LINKLESS])
    pcie, l4 = {"gpu": "0", "uuid": H100_PCIE.uuid}, {"gpu": "1", "uuid": L4_LINKLESS.uuid}
    assert p.value("inference_gpu_nvlink_links", **pcie, state="active") == 0  # counted: none
    assert p.value("inference_gpu_nvlink_links", **l4, state="active") is None  # not said
    assert p.value("inference_gpu_power_limit_watts", **l4) == 72


# --- idle energy from a hand-written trace ----------------------------------------------------


# The driver's samples over each 3 s interval up to a record (hand-written): busy, busy, idle,
# idle, one busy sample among idle ones, idle.
BUSY, IDLE, MIXED = [50] * 6, [0] * 6, [0, 0, 30, 0, 0, 0]
INTERVALS = (BUSY, BUSY, IDLE, IDLE, MIXED, IDLE)


def idle_trace(gap_error_at: float | None = None) -> Trace:
    """Hand-written: one GPU at 100 W, a record every 3 s with the samples of :data:`INTERVALS`."""
    header = {
        "kind": "header",
        "format": "inference-bottleneck-exporter/nvml-trace",
        "version": 1,
        "synthetic": True,
        "duration_s": 100.0,
        "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "mig_mode": 0}],
    }
    records = []
    for k, values in enumerate(INTERVALS):
        t = 3.0 * k
        rec: dict[str, Any] = {
            "t": t,
            "gpu": 0,
            "samples": [[round((t - 3.0 + 0.5 * (i + 1)) * 1e6), v] for i, v in enumerate(values)],
            "energy_mj": 1_000_000 + round(100_000 * t),
        }
        if gap_error_at == t:
            rec["error"] = "UNKNOWN"
        records.append(rec)
    return parse_trace([json.dumps(header)] + [json.dumps(r) for r in records])


def test_idle_energy_counts_only_intervals_idle_throughout(replayed: Any) -> None:
    p = replayed(idle_trace(), times=(3.0, 6.0, 9.0, 12.0, 15.0))
    # intervals ending at 6 and 9 s are idle throughout (300 J each); 12 s has a busy sample
    # (30 %), 15 s is idle again
    assert p.value(
        "inference_gpu_idle_energy_joules_total", gpu="0", uuid="GPU-0"
    ) == pytest.approx(900.0)
    assert p.value("inference_gpu_energy_joules_total", gpu="0", uuid="GPU-0") == pytest.approx(
        2500.0
    )


def test_idle_energy_skips_a_gap_of_failed_polls(replayed: Any) -> None:
    p = replayed(idle_trace(gap_error_at=6.0), times=(3.0, 6.0, 9.0, 15.0))
    # 6 s failed; 9 s then covers 6 s since the last good poll: within 2.5 intervals, idle
    # throughout (its samples since 6 s are 0 %: counted); 15 s covers 6 s with a busy sample
    idle = p.value("inference_gpu_idle_energy_joules_total", gpu="0", uuid="GPU-0")
    assert idle == pytest.approx(600.0)


# --- the recorder from a driver ----------------------------------------------------------------


def test_recorder_writes_links_from_a_driver(tmp_path: Path, replayed: Any) -> None:
    """``record`` through the real bindings (the stand-in): the trace carries the link counts,
    each read's fields, fabric and per-link GPM rates, and replays to the same link series."""
    gpus = [*tp_pod(link_bound=True), gb200(pci_bus_id="00000009:01:00.0")]
    api = PynvmlApi(library=fake_pynvml(gpus, driver="590.48.01"))
    out = tmp_path / "recorded.jsonl"
    summary = record_with(api, out, duration=0.45, interval=0.2)
    assert summary["reads"] >= 6
    trace = load_trace(out)
    assert trace.gpus[0].fields == {"nvlink_link_count": 18}
    assert trace.gpus[2].fields == {"nvlink_link_count": 18, "c2c_link_count": 10}
    last = trace.records[0][-1].values
    assert last["fields"]["nvlink_state"] == [1] * 18
    assert last["fields"]["power_limit_mw"] == 700_000
    assert last["fabric"]["state"] == 3 and last["fabric"]["health_mask"] > 0
    assert len([k for k in last["gpm"] if k.startswith("nvlink_l")]) == 36
    blackwell = trace.records[2][-1].values
    assert blackwell["power_profiles"] == [6]
    assert blackwell["fields"]["power_smoothing_floor_w"] == 600
    assert blackwell["gpm"]["c2c_rx_per_sec"] == 60000
    p = replayed(trace, times=(0.2, 0.4), per_link=True)
    lab = labels(trace, 0)
    assert p.value("inference_gpu_nvlink_peak_bytes_per_second", **lab) == 18 * H100_LINK_MBPS * 1e6
    assert p.value("inference_gpu_nvlink_link_transmit_bytes_total", **lab, link="5") is not None
    assert (
        p.value("inference_gpu_power_profile_info", **labels(trace, 2), profile="llm_inference")
        == 1
    )


def test_fake_rejects_an_unknown_field_scope() -> None:
    """The stand-in answers a link out of range as the driver does: that field alone fails."""
    api = PynvmlApi(library=fake_pynvml([hgx_h100(0, links=2)]))
    api.init()
    values = api.field_values(api.handle(0), [("nvlink_state", 1), ("nvlink_state", 2)])
    assert values[("nvlink_state", 1)] == 1
    error = values[("nvlink_state", 2)]
    assert not isinstance(error, float) and error.code == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert isinstance(FakeGpu(name="x", uuid="y").power_limit_mw, Error)
    assert NOT_SUPPORTED == 3
