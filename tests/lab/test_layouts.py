"""The lab's layouts are the chart's: the node agent runs the DaemonSet's flags, the sidecars
of the node and dcgm layouts the chart's sidecar flags, Prometheus keeps labels as the
PodMonitors do; the stand-in dcgm-exporter serves what dcgm-exporter serves; each layout loads
its own profile at ``fast``'s speed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.chart import exporter_container, of_kind, render
from support.paths import ROOT

from exporter.backends.replay import ReplayApi, load_trace
from exporter.lab.layouts import (
    AGENT_JOB,
    DCGM_JOB,
    GPU_RESOURCE,
    KSM_JOB,
    SIDECAR_JOB,
    Container,
    DcgmExporter,
    Kubelet,
    MetricsServer,
    Pod,
    Target,
    agent_flags,
    dcgm_site_config,
    kube_pod_info,
    replayed_gpu_peaks,
    rule_profile,
    scrape_configs,
    sidecar_flags,
)
from exporter.lab.processes import find_binary, http_get
from exporter.lab.refengine.gputrace import DEVICE_NAME, HostPeaks, write_trace
from exporter.lab.stack import write_rules


def _name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _args(objects: list[dict[str, Any]], kind: str) -> list[str]:
    (workload,) = of_kind(objects, kind)
    args: list[str] = exporter_container(workload["spec"]["template"]["spec"])["args"]
    return args


def test_the_agent_runs_the_charts_daemonset_flags() -> None:
    chart = _args(render(), "DaemonSet")
    lab = agent_flags(Path("/run/ibe/kubelet.sock"), trace=Path("trace.jsonl"))
    # Every flag the chart gives the agent, with the chart's value but where it names a place
    # of the cluster (the listen address, the kubelet's socket).
    assert {_name(a) for a in chart} <= {_name(a) for a in lab}
    places = {"--web.listen-address", "--podresources.socket"}
    assert {a for a in chart if _name(a) not in places} <= set(lab)
    assert "--podresources.socket=/run/ibe/kubelet.sock" in lab
    assert lab[lab.index("--gpu.replay-file") + 1] == "trace.jsonl"


def test_the_node_layouts_sidecar_runs_the_charts_sidecar_flags() -> None:
    chart = _args(render({"example": {"enabled": True}}), "Deployment")
    lab = sidecar_flags("node", "http://127.0.0.1:10961")
    assert "--no-collector.nvml" in chart and "--no-collector.nvml" in lab
    assert any(a.startswith("--gpu.read-by=the node agent on ") for a in chart), chart
    assert lab[lab.index("--gpu.read-by") + 1] == "the node agent at http://127.0.0.1:10961"
    # The dcgm layout: no NVML either, dcgm-exporter reads the GPUs.
    chart = _args(render({"mode": "dcgm", "example": {"enabled": True}}), "Deployment")
    lab = sidecar_flags("dcgm", "http://127.0.0.1:9400")
    assert "--no-collector.nvml" in chart and "--no-collector.nvml" in lab
    assert any(a.startswith("--gpu.read-by=dcgm-exporter") for a in chart), chart
    assert lab[lab.index("--gpu.read-by") + 1] == "dcgm-exporter at http://127.0.0.1:9400"
    # The sidecar layout: NVML in the sidecar, in the chart and in the lab.
    chart = _args(render({"mode": "sidecar", "example": {"enabled": True}}), "Deployment")
    assert not [a for a in chart if _name(a) in ("--no-collector.nvml", "--gpu.read-by")]
    assert sidecar_flags("sidecar") == []


def test_scrape_jobs_keep_labels_as_the_charts_pod_monitors_do() -> None:
    monitors = of_kind(render(), "PodMonitor")
    honor = {
        m["metadata"]["name"].endswith("-node"): m["spec"]["podMetricsEndpoints"][0].get(
            "honorLabels", False
        )
        for m in monitors
    }
    assert honor == {True: True, False: False}  # the agents' keep their labels, sidecars' not
    jobs = {
        j["job_name"]: j
        for j in scrape_configs(
            [Target("127.0.0.1:10960", {"namespace": "demo", "pod": "reference-0"})],
            [Target("127.0.0.1:10961", {"namespace": "monitoring", "pod": "ibe-node-0"})],
            Target("127.0.0.1:8080", {"namespace": "kube-system"}),
            [Target("127.0.0.1:9400", {"namespace": "gpu-operator", "pod": "dcgm"})],
        )
    }
    assert jobs[AGENT_JOB]["honor_labels"] is True and jobs[KSM_JOB]["honor_labels"] is True
    assert jobs[DCGM_JOB]["honor_labels"] is True
    assert "honor_labels" not in jobs[SIDECAR_JOB]
    (sidecar,) = jobs[SIDECAR_JOB]["static_configs"]
    assert sidecar == {
        "targets": ["127.0.0.1:10960"],
        "labels": {"namespace": "demo", "pod": "reference-0"},
    }
    # The sidecar layout: one job.
    only = scrape_configs([Target("127.0.0.1:10960", {"namespace": "demo", "pod": "p"})])
    assert [j["job_name"] for j in only] == [SIDECAR_JOB]


def test_each_layout_loads_its_profile_at_fast_speed() -> None:
    assert rule_profile("node") == "fast-node"
    assert rule_profile("sidecar") == "fast"
    assert rule_profile("dcgm") == "fast-dcgm"
    with pytest.raises(ValueError, match="unknown layout 'nodes'"):
        rule_profile("nodes")


# What promtool's lint says of dcgm-exporter's own names: its label names (UUID, modelName,
# Hostname) and its energy counter without ``_total``.
DCGM_STYLE = (
    "label names should be written in 'snake_case' not 'camelCase'",
    'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter metrics should have "_total" suffix',
)


def _promtool_metrics(text: str, allowed: tuple[str, ...] = ()) -> None:
    """promtool parses the exposition; its lint finds nothing but ``allowed``."""
    promtool = find_binary("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run `make tools`")
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    problems = [line for line in out.stderr.splitlines() if not any(a in line for a in allowed)]
    assert out.returncode in ((0, 3) if allowed else (0,)) and not problems, out.stderr


def test_kube_state_metrics_stand_in_passes_promtool(tmp_path: Path) -> None:
    pods = [Pod("demo", "reference-0", []), Pod("dev", "notebook-a", [], uid="4a1b-uid")]
    server = MetricsServer(lambda: kube_pod_info(pods))
    try:
        status, body = http_get(server.url + "/metrics")
        missing, _ = http_get(server.url + "/other")
    finally:
        server.close()
    assert (status, missing) == (200, 404)
    text = body.decode()
    assert 'kube_pod_info{namespace="dev",pod="notebook-a",uid="4a1b-uid",' in text
    # A pod without a UID given gets one of its own, the same every run.
    assert f'pod="reference-0",uid="{Pod("demo", "reference-0", []).uid}"' in text
    _promtool_metrics(text)


def _dcgm_samples(text: str) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    """(field, gpu) -> (labels, value) of a dcgm-exporter exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels["gpu"])] = (dict(sample.labels), float(sample.value))
    return out


def test_dcgm_exporter_stand_in_serves_the_replayed_gpus_with_their_pod() -> None:
    trace = load_trace(ROOT / "exporter" / "data" / "replay-2gpu-synthetic.jsonl")
    now = [12.0]
    api = ReplayApi(trace, clock=lambda: now[0])
    kubelet = Kubelet([Pod("demo", "reference-0", [Container("engine")])])
    dcgm = DcgmExporter(api, kubelet)
    try:
        # GPU 1 to the pod, GPU 0 to no one (dcgm-exporter leaves its pod labels empty).
        kubelet.give("demo", "reference-0", "engine", GPU_RESOURCE, [dcgm.uuids[1]])
        first = _dcgm_samples(http_get(dcgm.url + "/metrics")[1].decode())
        now[0] = 13.0
        text = http_get(dcgm.url + "/metrics")[1].decode()
    finally:
        dcgm.close()
    second = _dcgm_samples(text)
    _promtool_metrics(text, allowed=DCGM_STYLE)
    labels, util = second[("DCGM_FI_DEV_GPU_UTIL", "1")]
    assert (labels["namespace"], labels["pod"], labels["container"]) == (
        "demo",
        "reference-0",
        "engine",
    )
    assert labels["UUID"] == trace.gpus[1].uuid and labels["modelName"] == trace.gpus[1].name
    assert second[("DCGM_FI_DEV_GPU_UTIL", "0")][0]["pod"] == ""
    # DCGM's units from NVML's: percent, MiB, W.
    at = [12.0]  # the stand-in started at 12 s and was read at 13 s
    reader = ReplayApi(trace, clock=lambda: at[0])
    reader.init()
    at[0] = 13.0
    assert util == reader.utilization_rates(1)[0]
    used, total = reader.memory_info(1)
    assert second[("DCGM_FI_DEV_FB_USED", "1")][1] == used // 2**20
    assert second[("DCGM_FI_DEV_FB_FREE", "1")][1] == (total - used) // 2**20
    assert second[("DCGM_FI_DEV_POWER_USAGE", "1")][1] == reader.power_usage_mw(1) / 1000
    # The profiling fields need two GPM samples (the second scrape's), ratios of 0 to 1.
    assert ("DCGM_FI_PROF_DRAM_ACTIVE", "1") not in first
    assert 0 < second[("DCGM_FI_PROF_DRAM_ACTIVE", "1")][1] < 1


# The lab's engine pod as the dcgm layout's drills run it, its sidecar target's labels.
SIDECAR_TARGET = 'namespace="demo",pod="reference-0",instance="127.0.0.1:10960",job="ibe"'
MODEL = 'engine="vllm",model="reference",role="both"'
# The reference engine's figures, constant (hand-written): 200 MB of weights, no live KV, a
# decode step of 100 ms (0.5 s of inter-token latency in 5 s).
ENGINE_SERIES = (
    ("inference_exporter_build_info", 'version="0.1.0"', "1"),
    ("inference_model_weight_bytes", MODEL, "200000000"),
    ("inference_model_kv_cache_bytes_per_token", MODEL, "4096"),
    ("inference_kv_cache_capacity_tokens", MODEL, "2048"),
    ("inference_kv_cache_usage_ratio", MODEL, "0"),
    ("inference_inter_token_latency_seconds_sum", MODEL, "0+0.5"),
    ("inference_inter_token_latency_seconds_count", MODEL, "0+5"),
)


def _roofline_in_dcgm_layout(
    tmp_path: Path, config: Path | None, expected: list[dict[str, Any]]
) -> None:
    """promtool over the stand-in dcgm-exporter's own exposition of a drill's replayed GPU
    (the pod holding it) and the engine's figures, with the fast-dcgm rules of ``config``: the
    decode roofline efficiency (in thousandths) at 60 s is ``expected``."""

    trace = write_trace("starved", tmp_path / "trace.jsonl", HostPeaks(2e10, 1.024e11))
    kubelet = Kubelet([Pod("demo", "reference-0", [Container("engine")])])
    dcgm = DcgmExporter(ReplayApi(load_trace(trace)), kubelet)
    try:
        kubelet.give("demo", "reference-0", "engine", GPU_RESOURCE, dcgm.uuids)
        text = http_get(dcgm.url + "/metrics")[1].decode()
    finally:
        dcgm.close()
    series = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # honor_labels keeps its pod; the scrape adds dcgm-exporter's instance and job
            labels = {**sample.labels, "instance": "127.0.0.1:9400", "job": DCGM_JOB}
            inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
            series.append((f"{sample.name}{{{inner}}}", f"{sample.value!r}x20"))
    for name, labels, value in ENGINE_SERIES:
        series.append((f"{name}{{{labels},{SIDECAR_TARGET}}}", f"{value}x20"))
    rules = write_rules(tmp_path, rule_profile("dcgm"), config)
    test = {
        "rule_files": [str(p) for p in rules],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {
                        "expr": "round(1000 * inference:decode_roofline_efficiency:ratio30s)",
                        "eval_time": "60s",
                        "exp_samples": expected,
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test), encoding="utf-8")
    promtool = find_binary("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run `make tools`")
    out = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "test.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dcgm_layout_gives_its_rules_the_replayed_gpus_peaks(tmp_path: Path) -> None:
    """dcgm-exporter reports no peak and the replayed GPU is no product of the table: without
    the layout's site config (:func:`dcgm_site_config`) the dcgm drills' roofline records are
    empty (the post-mortem's roofline plot had no point); with it, the host's peaks."""

    trace = write_trace("starved", tmp_path / "t.jsonl", HostPeaks(2e10, 1.024e11))
    # 64-bit bus at bandwidth / 16 MHz (1250), one 8.6 SM at matmul rate / 1024 MHz (100): the
    # figures the sidecar and the node agent export for the replayed GPU (gputrace)
    assert replayed_gpu_peaks([trace]) == {
        DEVICE_NAME: {"memory_bandwidth_bytes_per_second": 2e10, "bf16_flops": 1.024e11}
    }
    drill = tmp_path / "drill.yaml"
    drill.write_text(
        "signatures:\n  InferenceDecodeOverheadBound:\n    efficiency_below: 0.17\n"
        'gpu_peaks:\n  "NVIDIA H100 80GB HBM3":\n    bf16_flops: 9.0e14\n',
        encoding="utf-8",
    )
    site = dcgm_site_config(drill, [trace], tmp_path / "site-dcgm.yaml")
    assert site == tmp_path / "site-dcgm.yaml"
    data = yaml.safe_load(site.read_text(encoding="utf-8"))
    assert data["signatures"] == {"InferenceDecodeOverheadBound": {"efficiency_below": 0.17}}
    assert set(data["gpu_peaks"]) == {DEVICE_NAME, "NVIDIA H100 80GB HBM3"}
    # real GPUs (no trace): the drill's own config, as it is
    assert dcgm_site_config(drill, [], tmp_path / "unused.yaml") == drill

    (tmp_path / "without").mkdir()
    (tmp_path / "with").mkdir()
    # the drill's config alone: no peak, no roofline (the defect)
    _roofline_in_dcgm_layout(tmp_path / "without", drill, [])
    # the layout's: (200 MB / 2e10 B/s = 10 ms floor) / 100 ms step = 0.1
    labels = f'{{{SIDECAR_TARGET},model="reference"}}'
    _roofline_in_dcgm_layout(tmp_path / "with", site, [{"labels": labels, "value": 100}])
