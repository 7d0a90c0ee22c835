"""Shared GPUs in replay: a GPU in MIG mode and its MIG devices, a time-sliced GPU with two
tenants, and their single-tenant counterparts.

The shipped synthetic traces (and ones generated from the same generator) are replayed through
the real collector with a stepped clock. Each mode's metrics are checked against the table
``docs/nvml.md`` promises (present where it says so, absent elsewhere), and their values
against the trace records they come from. Last, the series the collector reports from the
time-sliced traces run through the rule pack in promtool: the starved tenant of the shared GPU
gets InferenceGPUStarvedQueueGrowing and InferenceGPUContended, the busy tenant of the same GPU
and a single tenant neither.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from support.clock import FakeClock
from support.doc_tables import presence_table
from support.metrics import registry_of
from support.paths import ROOT
from support.synthetic_shared import (
    BUSY_PIDS,
    STARVED_PIDS,
    mig_trace_lines,
    timesliced_trace_lines,
)

from exporter.backends.pidns import FixedPids
from exporter.backends.replay import ReplayApi, Trace, TraceRecord, load_trace, parse_trace
from exporter.collectors.nvml import NvmlCollector
from exporter.metrics import CATALOGUE

DATA = ROOT / "tests" / "fixtures" / "traces"
MIG = DATA / "replay-mig-7slice-synthetic.jsonl"
TIMESLICED = DATA / "replay-timesliced-2tenant-synthetic.jsonl"
WALL0 = 1_700_000_000_000_000
GIB = 1024**3
MIB = 1024**2
# Polls at these trace times (the first one when the collector starts).
POLLS = (0.0, 1.0, 2.5, 4.0, 7.0)


@dataclass
class Replayed:
    trace: Trace
    registry: CollectorRegistry
    families: dict[str, set[str]]  # family name -> the gpu labels it has samples for

    def value(self, metric: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(metric, labels)


def replay(trace: Trace, *, engine: frozenset[int] | None = None) -> Replayed:
    clock = FakeClock()
    api = ReplayApi(trace, clock=clock, wall_us=lambda: WALL0)
    pids = trace.engine_pids if engine is None else engine
    collector = NvmlCollector(
        lambda: api,
        poll_interval=3600,
        deadline=2.0,
        clock=clock,
        engine=None if pids is None else FixedPids(pids),
    )
    collector.start()
    try:
        assert collector.wait_ready(5)
        for t in POLLS[1:]:
            clock.now = 1000.0 + t
            collector.poll_now()
        collection = collector.collect()
    finally:
        collector.stop(2)
    assert collection.success, collection.error
    families: dict[str, set[str]] = {}
    for family in collection.metrics:
        for sample in family.samples:
            if "gpu" in sample.labels:
                families.setdefault(family.name, set()).add(sample.labels["gpu"])
    return Replayed(trace, registry_of(collection), families)


def at(records: list[TraceRecord], t: float) -> TraceRecord:
    """The record current at trace time ``t``."""
    return [r for r in records if r.t <= t][-1]


def promised() -> dict[str, dict[str, bool]]:
    """docs/nvml.md's table: metric -> mode -> present."""
    return presence_table("modes")


FAMILY = {spec.name: spec.family_name for spec in CATALOGUE}


def check_mode(replayed: Replayed, mode: str, gpu: str) -> None:
    table = promised()
    present = {name for name, gpus in replayed.families.items() if gpu in gpus}
    for metric, modes in table.items():
        family = FAMILY[metric]
        if modes[mode]:
            assert family in present, f"{mode}: {metric} promised, absent for gpu={gpu}"
        else:
            assert family not in present, f"{mode}: {metric} not promised, present for gpu={gpu}"


@pytest.fixture(scope="module")
def mig() -> Replayed:
    return replay(load_trace(MIG))


@pytest.fixture(scope="module")
def a100() -> Replayed:
    return replay(parse_trace(mig_trace_lines(product="a100")))


@pytest.fixture(scope="module")
def starved() -> Replayed:
    return replay(load_trace(TIMESLICED))


@pytest.fixture(scope="module")
def busy() -> Replayed:
    trace = load_trace(TIMESLICED)
    return replay(trace, engine=frozenset(trace.header["generator"]["tenants"]["busy"]))


@pytest.fixture(scope="module")
def single() -> Replayed:
    return replay(parse_trace(timesliced_trace_lines(tenants=1)))


# --- the docs' table ----------------------------------------------------------------------------


def test_the_table_covers_every_gpu_series() -> None:
    gpu_series = {
        s.name
        for s in CATALOGUE
        if s.name.startswith("inference_gpu_")
        and s.name != "inference_gpu_xid_errors_total"
        # a reading of one GPU: not the node agent's attribution of GPUs to pods, nor the
        # sidecar's one-line account of how it chose its GPUs
        and s.collector == "nvml"
        and "gpu" in s.labels
        # nor the node agent's per-pod shares, mapped on a live node only (a replayed trace's
        # PIDs are another machine's; tests/collectors/test_nvml.py covers them)
        and not s.name.startswith("inference_gpu_pod_")
    }
    # What the board has, not how the GPU is shared (links, fabric, Blackwell's power
    # features), has a table of its own (tests/collectors/test_nvml_links.py checks it).
    boards = set(presence_table("boards"))
    assert boards <= gpu_series
    assert set(promised()) == gpu_series - boards


def test_mig_mode_gpu_as_promised(mig: Replayed) -> None:
    check_mode(mig, "GPU in MIG mode", "0")


@pytest.mark.parametrize("slot", range(7))
def test_every_mig_device_as_promised(mig: Replayed, slot: int) -> None:
    check_mode(mig, "MIG device (Hopper+)", f"0:{slot}")


def test_a100_mig_device_as_promised(a100: Replayed) -> None:
    check_mode(a100, "MIG device (A100)", "0:0")


def test_time_sliced_gpu_as_promised(starved: Replayed, busy: Replayed) -> None:
    check_mode(starved, "time-sliced GPU", "0")
    check_mode(busy, "time-sliced GPU", "0")


def test_single_tenant_gpu_as_promised(single: Replayed) -> None:
    check_mode(single, "GPU", "0")


# --- values: MIG --------------------------------------------------------------------------------


def test_mig_device_values_come_from_its_gpu_instance(mig: Replayed) -> None:
    trace = mig.trace
    (gpu,) = trace.gpus
    for dev in gpu.mig_devices:
        labels = {"gpu": f"0:{dev.slot}", "uuid": dev.uuid}
        recs = trace.mig_records[(0, dev.slot)]
        last = at(recs, POLLS[-1])
        # busy seconds: GPM graphics activity over each poll interval
        busy = sum(
            (b - a) * at(recs, b).values["gpm"]["graphics_util"] / 100
            for a, b in itertools.pairwise(POLLS)
        )
        dram = sum(
            (b - a) * at(recs, b).values["gpm"]["dram_bw_util"] / 100
            for a, b in itertools.pairwise(POLLS)
        )
        g = last.values["gpm"]
        v = mig.value
        assert v("inference_gpu_busy_seconds_total", **labels) == pytest.approx(busy)
        assert v("inference_gpu_dram_active_seconds_total", **labels) == pytest.approx(dram)
        assert v("inference_gpu_utilization_ratio", **labels) == pytest.approx(
            g["graphics_util"] / 100
        )
        assert v("inference_gpu_utilization_samples_count", **labels) == len(POLLS) - 1
        assert v("inference_gpu_sm_active_ratio", **labels) == pytest.approx(g["sm_util"] / 100)
        assert v("inference_gpu_sm_occupancy_ratio", **labels) == pytest.approx(
            g["sm_occupancy"] / 100
        )
        assert v("inference_gpu_tensor_active_ratio", **labels) == pytest.approx(
            g["any_tensor_util"] / 100
        )
        assert v("inference_gpu_memory_bandwidth_utilization_ratio", **labels) == pytest.approx(
            g["dram_bw_util"] / 100
        )
        used, total = last.values["memory"]
        assert v("inference_gpu_memory_used_bytes", **labels) == used
        assert v("inference_gpu_memory_total_bytes", **labels) == total == 9984 * MIB
        ((pid, proc_used),) = last.values["processes"]
        engine = pid in (trace.engine_pids or ())
        assert v("inference_gpu_processes", **labels, owner="engine") == int(engine)
        assert v("inference_gpu_processes", **labels, owner="other") == int(not engine)
        assert v("inference_gpu_engine_memory_used_bytes", **labels) == (proc_used if engine else 0)
        # the only tenant of its MIG device: the engine's share is the device's utilisation
        assert v("inference_gpu_engine_utilization_ratio", **labels) == pytest.approx(
            g["graphics_util"] / 100 if engine else 0.0
        )
        assert v("inference_gpu_mig_info", **labels, parent_uuid=gpu.uuid, profile="1g.10gb") == 1
        instance = {"gpu_instance_id": str(dev.gpu_instance_id), "compute_instance_id": "0"}
        assert v("inference_gpu_mig_instance_info", **labels, **instance) == 1


def test_mig_device_peaks_are_its_share(mig: Replayed) -> None:
    (gpu,) = mig.trace.gpus
    whole = {"gpu": "0", "uuid": gpu.uuid}
    one = {"gpu": "0:3", "uuid": gpu.mig_devices[3].uuid}
    bandwidth = mig.value("inference_gpu_peak_memory_bandwidth_bytes_per_second", **whole)
    assert bandwidth == pytest.approx(5120 / 8 * 2619e6 * 2)
    assert mig.value(
        "inference_gpu_peak_memory_bandwidth_bytes_per_second", **one
    ) == pytest.approx(bandwidth / 8)  # 9984 MiB of 80 GiB: one eighth
    flops = mig.value("inference_gpu_peak_flops", **whole, precision="bf16")
    assert flops == pytest.approx(989.4e12, rel=1e-3)
    assert mig.value("inference_gpu_peak_flops", **one, precision="bf16") == pytest.approx(
        flops * 16 / 132
    )


def test_mig_mode_gpu_keeps_its_physical_series(mig: Replayed) -> None:
    (gpu,) = mig.trace.gpus
    labels = {"gpu": "0", "uuid": gpu.uuid}
    last = at(mig.trace.records[0], POLLS[-1])
    assert mig.value("inference_gpu_power_watts", **labels) == last.values["power_mw"] / 1000
    assert mig.value("inference_gpu_temperature_celsius", **labels) == last.values["temp_c"]
    tx, _ = last.values["pcie_kibps"]
    assert mig.value("inference_gpu_pcie_tx_bytes_per_second", **labels) == tx * 1024
    info = {"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"}
    assert mig.value("inference_gpu_info", **labels, **info) == 1
    assert mig.value("inference_gpu_mig_mode_info", **labels, mig_mode="enabled") == 1


def test_mig_call_budget(mig: Replayed) -> None:
    """Steady state: 9 calls per poll for the GPU, 3 per MIG device (docs/nvml.md)."""
    # first poll: + utilisation buffer and rates tried once (and memory, NO_PERMISSION here as
    # it is absent from the trace), + per-process utilisation once on each MIG device
    polls = len(POLLS)
    # 9 per poll: the 8 of the physical GPU and the field values (its power limit); the first
    # poll 3 more (utilisation buffer, rates, memory) and fabric and power profiles, which this
    # GPU does not answer
    assert mig.value("inference_nvml_calls_total", gpu="0") == 9 * polls + 3 + 2
    for slot in range(7):
        calls = mig.value("inference_nvml_calls_total", gpu=f"0:{slot}")
        assert calls == 3 * polls + 3  # + samples, rates, process utilisation on the first


def test_a100_mig_devices_have_memory_and_processes_only(a100: Replayed) -> None:
    (gpu,) = a100.trace.gpus
    labels = {"gpu": "0:0", "uuid": gpu.mig_devices[0].uuid}
    assert a100.value("inference_gpu_memory_total_bytes", **labels) == 9728 * MIB
    assert a100.value("inference_gpu_utilization_ratio", **labels) is None
    assert a100.value("inference_gpu_engine_utilization_ratio", **labels) is None
    assert a100.value("inference_gpu_processes", **labels, owner="engine") == 1
    # the A100's 1g.10gb: 14 of 108 SMs
    flops = a100.value("inference_gpu_peak_flops", gpu="0", uuid=gpu.uuid, precision="bf16")
    assert flops is not None
    assert a100.value("inference_gpu_peak_flops", **labels, precision="bf16") == pytest.approx(
        flops * 14 / 108
    )


# --- values: time-slicing -----------------------------------------------------------------------


def newest_sm(trace: Trace, pids: tuple[int, ...], t: float) -> float:
    """What the last poll saw: each process's newest sample since the poll before."""
    recs = trace.records[0]
    before = max(p for p in POLLS if p < t)
    window = [
        s
        for r in recs
        for s in r.process_samples
        if before * 1e6 < s[0] <= t * 1e6 and s[1] in pids
    ]
    newest: dict[int, int] = {}
    for _, pid, sm, _ in sorted(window):
        newest[pid] = sm
    return sum(newest.values()) / 100


def test_each_tenant_sees_its_own_share(starved: Replayed, busy: Replayed) -> None:
    trace = starved.trace
    labels = {"gpu": "0", "uuid": trace.gpus[0].uuid}
    t = POLLS[-1]
    mine = starved.value("inference_gpu_engine_utilization_ratio", **labels)
    theirs = busy.value("inference_gpu_engine_utilization_ratio", **labels)
    assert mine == pytest.approx(newest_sm(trace, STARVED_PIDS, t))
    assert theirs == pytest.approx(newest_sm(trace, BUSY_PIDS, t))
    assert mine is not None and theirs is not None
    assert mine < 0.1
    assert theirs > 0.6
    # the device's utilisation is the same for both: the sum of the tenants
    device = starved.value("inference_gpu_utilization_ratio", **labels)
    assert device == busy.value("inference_gpu_utilization_ratio", **labels)
    assert device is not None and device > 0.6
    assert starved.value("inference_gpu_processes", **labels, owner="engine") == 1
    assert starved.value("inference_gpu_processes", **labels, owner="other") == 2
    assert busy.value("inference_gpu_processes", **labels, owner="engine") == 2
    assert busy.value("inference_gpu_processes", **labels, owner="other") == 1
    assert starved.value("inference_gpu_engine_memory_used_bytes", **labels) == 22 * GIB
    assert busy.value("inference_gpu_engine_memory_used_bytes", **labels) == (48 * GIB + 1200 * MIB)


def test_single_tenant_owns_everything(single: Replayed) -> None:
    labels = {"gpu": "0", "uuid": single.trace.gpus[0].uuid}
    assert single.value("inference_gpu_processes", **labels, owner="other") == 0
    assert single.value("inference_gpu_processes", **labels, owner="engine") == 2
    share = single.value("inference_gpu_engine_utilization_ratio", **labels)
    assert share == pytest.approx(newest_sm(single.trace, BUSY_PIDS, POLLS[-1]))


def test_per_process_reads_cost_two_calls(starved: Replayed, single: Replayed) -> None:
    # 9 fields + GPM sample + the field values (its power limit) per poll, PCIe twice on the
    # first (no GPM values yet), and fabric and power profiles once (unsupported there); and
    # the two per-process calls: 13 per poll
    assert starved.value("inference_nvml_calls_total", gpu="0") == 13 * len(POLLS) + 2 + 2


# --- the shipped traces -------------------------------------------------------------------------


def lines_of(path: Any) -> list[str]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_shipped_traces_are_fresh_generations() -> None:
    assert MIG.read_text(encoding="utf-8") == "\n".join(mig_trace_lines()) + "\n"
    assert TIMESLICED.read_text(encoding="utf-8") == "\n".join(timesliced_trace_lines()) + "\n"


@pytest.mark.parametrize("path", [MIG, TIMESLICED], ids=lambda p: p.name)
def test_shipped_traces_say_they_are_synthetic(path: Any) -> None:
    header = lines_of(path)[0]
    assert header["synthetic"] is True
    assert header["description"].startswith("SYNTHETIC trace, not a recording")
    assert path.stat().st_size < 300_000


def test_mig_trace_is_seven_1g_devices() -> None:
    trace = load_trace(MIG)
    (gpu,) = trace.gpus
    assert gpu.mig_mode == 1 and gpu.max_mig_devices == 7
    assert [m.slot for m in gpu.mig_devices] == list(range(7))
    assert {m.name for m in gpu.mig_devices} == {"NVIDIA H100 80GB HBM3 MIG 1g.10gb"}
    assert all(re.fullmatch(r"MIG-[0-9a-f-]{36}", m.uuid) for m in gpu.mig_devices)
    assert len({m.gpu_instance_id for m in gpu.mig_devices}) == 7
    # what an unprivileged sidecar in MIG mode is answered for the GPU
    for rec in trace.records[0]:
        assert not {"util", "memory", "gpm"} & set(rec.values)
        assert rec.buffers == frozenset()


def test_a100_mig_trace_has_no_gpm() -> None:
    trace = parse_trace(mig_trace_lines(product="a100"))
    assert not trace.gpus[0].gpm
    assert all("gpm" not in r.values for recs in trace.mig_records.values() for r in recs)


def test_timesliced_device_utilisation_is_the_tenants_sum() -> None:
    trace = load_trace(TIMESLICED)
    for rec in trace.records[0]:
        shares = {pid: sm for _, pid, sm, _ in rec.process_samples}
        assert set(shares) == {*BUSY_PIDS, *STARVED_PIDS}
        assert abs(sum(shares.values()) + 1 - rec.values["gpm"]["graphics_util"]) <= 2
    single = parse_trace(timesliced_trace_lines(tenants=1))
    assert single.engine_pids == frozenset(BUSY_PIDS)
    assert all(p[0] != 52000 for r in single.records[0] for p in r.values["processes"])


def test_bad_generator_arguments() -> None:
    with pytest.raises(ValueError, match="tenants"):
        timesliced_trace_lines(tenants=3)
    with pytest.raises(ValueError, match="product"):
        mig_trace_lines(product="b200")
    with pytest.raises(ValueError, match="duration_s"):
        mig_trace_lines(duration_s=0)


# --- the signatures on what the exporter reports from the traces ------------------------------
# The exporter replays each trace with a clock stepped one minute per poll; its series, scraped
# once a minute, go into a promtool unit test of the repository's rule pack (profile sidecar),
# with the engine's queue growing on every target. promtool evaluates the real rules.
SIGNAL_SAMPLES = (
    "inference_gpu_busy_seconds_total",
    "inference_gpu_engine_utilization_ratio",
    "inference_gpu_processes",
)
MINUTES = 45


def minute_series(trace: Trace, engine: frozenset[int], instance: str) -> dict[str, list[str]]:
    """The exporter's per-GPU signal series, one value per minute, as promtool input."""
    clock = FakeClock()
    api = ReplayApi(trace, clock=clock, wall_us=lambda: WALL0)
    collector = NvmlCollector(
        lambda: api, poll_interval=3600, deadline=2.0, clock=clock, engine=FixedPids(engine)
    )
    out: dict[str, list[str]] = {}
    collector.start()
    try:
        assert collector.wait_ready(5)
        for minute in range(MINUTES + 1):
            if minute:
                clock.now = 1000.0 + 60 * minute
                collector.poll_now()
            for family in collector.collect().metrics:
                for s in family.samples:
                    if s.name not in SIGNAL_SAMPLES:
                        continue
                    labels = {**s.labels, "instance": f"{instance}:10960", "job": "replay"}
                    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    out.setdefault(f"{s.name}{{{text}}}", ["_"] * minute).append(repr(s.value))
            for values in out.values():
                values.extend("_" * (minute + 1 - len(values)))
    finally:
        collector.stop(2)
    return out


def engine_series(instance: str) -> dict[str, list[str]]:
    """The engine's queue growing, and the sidecar's build info (the target's history, which
    the signatures' cold-start guard reads)."""
    target = f'engine="vllm",model="m",instance="{instance}:10960",job="replay"'
    build = f'version="0.1.0",instance="{instance}:10960",job="replay"'
    return {
        f"inference_queue_depth{{{target}}}": [repr(3 + 1.2 * m) for m in range(MINUTES + 1)],
        f"inference_requests_running{{{target}}}": ["16"] * (MINUTES + 1),
        f"inference_exporter_build_info{{{build}}}": ["1"] * (MINUTES + 1),
    }


def alerts(name: str, *labels: dict[str, str]) -> dict[str, Any]:
    """A promql_expr_test that exactly these alerts fire."""
    samples = []
    for extra in labels:
        text = ",".join(
            f'{k}="{v}"' for k, v in {"alertname": name, "alertstate": "firing", **extra}.items()
        )
        samples.append({"labels": f"ALERTS{{{text}}}", "value": 1})
    return {
        "expr": f'ALERTS{{alertname="{name}",alertstate="firing"}}',
        "eval_time": f"{MINUTES - 5}m",
        "exp_samples": samples,
    }


def test_signatures_on_the_replayed_shared_gpu(tmp_path: Path) -> None:
    shared = load_trace(TIMESLICED)
    single = parse_trace(timesliced_trace_lines(tenants=1))
    targets = {
        "starved": (shared, frozenset(STARVED_PIDS)),
        "busy": (shared, frozenset(BUSY_PIDS)),
        "single": (single, frozenset(BUSY_PIDS)),
    }
    series: dict[str, list[str]] = {}
    for instance, (trace, engine) in targets.items():
        series |= minute_series(trace, engine, instance)
        series |= engine_series(instance)
    assert any("owner" in name for name in series)  # the per-process series are in

    def target(instance: str, **extra: str) -> dict[str, str]:
        return {"instance": f"{instance}:10960", "job": "replay", **extra}

    gpu = {"gpu": "0", "uuid": shared.gpus[0].uuid}
    bool_of = {"starved": 1, "busy": 0, "single": 0}
    test = {
        "rule_files": [
            str(ROOT / "alert_rules" / "recording_rules.yaml"),
            str(ROOT / "alert_rules" / "alerts.yaml"),
        ],
        "evaluation_interval": "1m",
        "group_eval_order": ["inference.records", "inference.signatures", "inference.meta"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": name, "values": " ".join(values)}
                    for name, values in sorted(series.items())
                ],
                "promql_expr_test": [
                    # every GPU is busy (> 60 %): on device utilisation alone nothing starves
                    {
                        "expr": "inference:gpu_utilization:mean5m > bool 0.6",
                        "eval_time": f"{MINUTES - 5}m",
                        "exp_samples": [
                            {
                                "labels": "{"
                                + ",".join(f'{k}="{v}"' for k, v in target(i).items())
                                + "}",
                                "value": 1,
                            }
                            for i in targets
                        ],
                    },
                    # the engine's own share tells the tenants apart
                    {
                        "expr": "inference:gpu_own_utilization:mean5m < bool 0.6",
                        "eval_time": f"{MINUTES - 5}m",
                        "exp_samples": [
                            {
                                "labels": "{"
                                + ",".join(f'{k}="{v}"' for k, v in target(i).items())
                                + "}",
                                "value": bool_of[i],
                            }
                            for i in targets
                        ],
                    },
                    alerts(
                        "InferenceGPUStarvedQueueGrowing",
                        target("starved", severity="critical", signature="cpu"),
                    ),
                    alerts(
                        "InferenceGPUContended",
                        target("starved", **gpu, severity="warning", signature="gpu"),
                    ),
                ],
            }
        ],
    }
    path = tmp_path / "replayed.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (apt-get install prometheus)"
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
