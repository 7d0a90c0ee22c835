"""The lab's layouts are the chart's: the node agent runs the DaemonSet's flags, the node
layout's sidecar the chart's sidecar flags, Prometheus keeps labels as the two PodMonitors do;
each layout loads its own profile at ``fast``'s speed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.chart import exporter_container, of_kind, render

from exporter.lab.layouts import (
    AGENT_JOB,
    KSM_JOB,
    SIDECAR_JOB,
    MetricsServer,
    Pod,
    Target,
    agent_flags,
    kube_pod_info,
    rule_profile,
    scrape_configs,
    sidecar_flags,
)
from exporter.lab.processes import find_binary, http_get


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
        )
    }
    assert jobs[AGENT_JOB]["honor_labels"] is True and jobs[KSM_JOB]["honor_labels"] is True
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
    with pytest.raises(ValueError, match="unknown layout 'nodes'"):
        rule_profile("nodes")


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
    promtool = find_binary("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run `make tools`")
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
