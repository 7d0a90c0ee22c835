"""The chart renders, lints, and everything it renders is valid and Pod Security "restricted"."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from support.chart import (
    CHART,
    KUBE_LATEST,
    KUBE_MIN,
    NAMESPACE,
    SCENARIOS,
    SIDECAR,
    exporter_container,
    of_kind,
    pod_specs,
    render,
    render_manifests,
)
from support.podsecurity import restricted_violations

from exporter.cli import load_settings
from exporter.collectors import COLLECTORS, serve_options
from exporter.collectors.nvml_devices import visible_device_uuids

MONITORING = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1alpha1", "cert-manager.io/v1")
CLUSTER_SCOPED = ("MutatingWebhookConfiguration",)


def kinds(objects: list[dict[str, Any]]) -> Counter[str]:
    return Counter(o["kind"] for o in objects)


def test_default_values_render_the_node_agent_and_the_monitoring_objects() -> None:
    """The default fits a device-plugin cluster with pods of part of a node: the node agent
    attributes each GPU to its pod, the sidecars' PodMonitor and the agents' (honorLabels)
    feed the node rules."""
    objects = render()
    assert kinds(objects) == Counter(
        {"DaemonSet": 1, "PodMonitor": 2, "PrometheusRule": 1}
    ) + Counter({"ConfigMap": len(list((CHART / "files" / "dashboards").glob("*.json")))})
    sidecars, agents = sorted(of_kind(objects, "PodMonitor"), key=lambda m: m["metadata"]["name"])
    assert sidecars["spec"]["selector"] == {
        "matchLabels": {"inference-bottleneck-exporter/sidecar": "true"}
    }
    assert sidecars["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert "honorLabels" not in sidecars["spec"]["podMetricsEndpoints"][0]
    assert agents["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    (daemonset,) = of_kind(objects, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert agents["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    agent = exporter_container(daemonset["spec"]["template"]["spec"])
    assert enabled_collectors(agent) == {"nvml", "cpu", "podresources"}
    socket = effective_settings(agent).values["podresources.socket"]
    assert Path(socket).parent == Path(agent["volumeMounts"][0]["mountPath"])
    (rule,) = of_kind(objects, "PrometheusRule")
    # the node profile: the agents' series read by pod, given the sidecar targets' labels
    assert rule["metadata"]["labels"]["inference-bottleneck-exporter/rule-profile"] == "node"
    assert "inference:exporter_build_info:group" in yaml.safe_dump(rule["spec"])


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("sidecar", {"Deployment": 1}),
        ("sidecar-native", {"Deployment": 1}),
        ("dcgm", {"Deployment": 1}),
        ("node", {"DaemonSet": 1}),
        (
            "all-objects",
            {"Deployment": 1, "Service": 1, "ServiceMonitor": 1, "AlertmanagerConfig": 1},
        ),
        (
            "node-all-objects",
            {"DaemonSet": 1, "Service": 1, "ServiceMonitor": 1, "AlertmanagerConfig": 1},
        ),
    ],
)
def test_each_mode_renders_its_objects(scenario: str, expected: dict[str, int]) -> None:
    found = kinds(render(SCENARIOS[scenario]))
    for kind, count in expected.items():
        assert found[kind] == count, found
    assert found["DaemonSet"] == (1 if "node" in scenario or scenario == "default" else 0)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("kube", [KUBE_MIN, KUBE_LATEST])
def test_lint_strict_is_clean(scenario: str, kube: str) -> None:
    report = helm.lint(CHART, SCENARIOS[scenario], strict=True, kube_version=f"v{kube}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("kube", [KUBE_MIN, KUBE_LATEST])
def test_every_object_validates_for_kubernetes(
    scenario: str, kube: str, crd_validators: dict[tuple[str, str], Any]
) -> None:
    objects = render(SCENARIOS[scenario], kube_version=kube)
    assert objects
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if obj["apiVersion"] in MONITORING:
            errors = sorted(crd_validators[key].iter_errors(obj), key=str)
            assert not errors, f"{key} {obj['metadata']['name']}: {errors[0].message}"
        else:
            # Raises on an invalid object, and on a kind it has no schema for.
            kubernetes_validate.validate(obj, kube, strict=True)
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_kubernetes_validation_catches_a_misspelt_field() -> None:
    (daemonset,) = of_kind(render(SCENARIOS["node"]), "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFilesytem"):
        kubernetes_validate.validate(daemonset, KUBE_MIN, strict=True)


def test_crd_validation_catches_a_misspelt_field(
    crd_validators: dict[tuple[str, str], Any],
) -> None:
    monitor, _ = of_kind(render(), "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    assert not crd_validators[("monitoring.coreos.com/v1", "PodMonitor")].is_valid(monitor)


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """What Pod Security "baseline" refuses (host namespaces, hostPath, privileged containers,
    added capabilities beyond its list, host ports)."""
    out = [field for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]
    out += [f"volume {v['name']}: hostPath" for v in pod.get("volumes", []) if "hostPath" in v]
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES:
            out.append(f"{c['name']}: adds capabilities")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
    return out


BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def pod_security_level(pod: dict[str, Any]) -> str:
    if not restricted_violations(pod):
        return "restricted"
    return "baseline" if not baseline_violations(pod) else "privileged"


# The Pod Security level of each workload the chart renders, as values.yaml and
# docs/deployment.md state it: the node agent needs "privileged" for its one hostPath (the
# kubelet's PodResources socket), every inference pod's sidecar fits "restricted".
POD_SECURITY = {"DaemonSet": "privileged", "Deployment": "restricted"}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_pod_has_its_stated_pod_security_level(scenario: str) -> None:
    for name, pod in pod_specs(render(SCENARIOS[scenario])):
        assert pod_security_level(pod) == POD_SECURITY[name.split("/")[0]], name


def test_the_node_agent_is_privileged_only_by_the_kubelet_socket() -> None:
    (daemonset,) = of_kind(render(), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert baseline_violations(pod) == ["volume pod-resources: hostPath"]
    assert pod["volumes"] == [
        {
            "name": "pod-resources",
            "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
        }
    ]
    agent = exporter_container(pod)
    assert agent["volumeMounts"][0]["readOnly"] is True
    # Root for the root-owned socket, and nothing else: no capability, no escalation.
    assert sorted(restricted_violations(pod)) == [
        f"{SIDECAR}: runAsNonRoot not true",
        f"{SIDECAR}: runAsUser 0",
        "volume pod-resources: hostPath",
    ]


def test_host_pid_is_opt_in_and_keeps_the_agent_privileged_only() -> None:
    (daemonset,) = of_kind(render(SCENARIOS["node-hostpid"]), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert baseline_violations(pod) == ["hostPID", "volume pod-resources: hostPath"]
    assert pod_security_level(pod) == "privileged"
    # no capability comes with it: reading /proc/<pid>/cgroup needs none
    assert exporter_container(pod)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (default,) = of_kind(render(), "DaemonSet")
    assert "hostPID" not in default["spec"]["template"]["spec"]


def test_restricted_check_sees_a_violation() -> None:
    _, pod = next(pod_specs(render(SCENARIOS["sidecar"])))
    exporter_container(pod)["securityContext"]["allowPrivilegeEscalation"] = True
    pod["volumes"] = [{"name": "proc", "hostPath": {"path": "/proc"}}]
    assert len(restricted_violations(pod)) == 2


@pytest.mark.parametrize("scenario", ["sidecar", "sidecar-native", "dcgm", "node-example"])
def test_exporter_container_contract(scenario: str) -> None:
    ((_, pod),) = (p for p in pod_specs(render(SCENARIOS[scenario])) if p[0].startswith("Dep"))
    c = exporter_container(pod)
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert {k: v for k, v in c["resources"].items() if k != "claims"} == {
        "requests": {"cpu": "10m", "memory": "80Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    assert c["ports"] == [{"name": "metrics", "containerPort": 10960, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}
    # A hung exporter is restarted (liveness) before its readiness could flip the pod.
    live, ready = c["livenessProbe"], c["readinessProbe"]
    assert (
        ready["periodSeconds"] * ready["failureThreshold"]
        > live["periodSeconds"] * live["failureThreshold"]
    )
    assert c["image"].endswith(
        ":" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    )


def effective_settings(container: dict[str, Any]) -> Any:
    """What the exporter makes of the container's arguments and environment: the real CLI."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    settings, _ = load_settings(container["args"], env)
    return settings


def enabled_collectors(container: dict[str, Any]) -> set[str]:
    collectors = effective_settings(container).collectors
    return {n for n, e in COLLECTORS.items() if collectors.get(n, e.enabled_by_default)}


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("sidecar", {"Deployment": set(COLLECTORS) - {"podresources"}}),
        ("dcgm", {"Deployment": set(COLLECTORS) - {"nvml", "podresources"}}),
        (
            "node-example",
            {
                "DaemonSet": {"nvml", "cpu", "podresources"},
                "Deployment": set(COLLECTORS) - {"nvml", "podresources"},
            },
        ),
    ],
)
def test_each_mode_runs_its_collectors(scenario: str, expected: dict[str, set[str]]) -> None:
    found = {
        name.split("/")[0]: enabled_collectors(exporter_container(pod))
        for name, pod in pod_specs(render(SCENARIOS[scenario]))
    }
    assert found == expected


def test_mode_collector_flags_win_over_config() -> None:
    values = {"mode": "node", "node": {"config": {"collector.engine": True}}}
    (_, pod), *_ = pod_specs(render(values))
    assert enabled_collectors(exporter_container(pod)) == {"nvml", "cpu", "podresources"}
    values = {"mode": "node", "sidecar": {"config": {"collector.nvml": True}}}
    values["example"] = {"enabled": True}
    (deployment,) = of_kind(render(values), "Deployment")
    sidecar = exporter_container(deployment["spec"]["template"]["spec"])
    assert "nvml" not in enabled_collectors(sidecar)


def test_config_becomes_flags_the_exporter_accepts() -> None:
    values = {
        "mode": "sidecar",
        "example": {"enabled": True, "engine": {"port": 8080}},
        "sidecar": {"config": {"gpu.poll-interval": "5s", "log.format": "json"}},
    }
    (_, pod), *_ = pod_specs(render(values))
    settings = effective_settings(exporter_container(pod))
    assert settings.values["gpu.poll-interval"] == 5.0
    assert settings.values["engine.url"] == ("http://127.0.0.1:8080/metrics",)
    assert settings.sources["gpu.poll-interval"] == "flag"


def gpu_env(container: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e["value"] for e in container.get("env", []) if e["name"].startswith("NVIDIA_")
    }


def test_gpu_visibility_per_mode() -> None:
    visible = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    for scenario, expected in (
        ("sidecar", {"Deployment": visible}),
        ("node-example", {"DaemonSet": visible, "Deployment": {}}),
        ("dcgm", {"Deployment": {}}),
    ):
        found = {
            name.split("/")[0]: gpu_env(exporter_container(pod))
            for name, pod in pod_specs(render(SCENARIOS[scenario]))
        }
        assert found == expected, scenario
    # The engine's devices passed through, and DRA claims shared with the engine.
    values = {
        "mode": "sidecar",
        "example": {"enabled": True},
        "gpu": {"visibleDevices": "GPU-0f2e", "resourceClaims": ["gpus"]},
    }
    (_, pod), *_ = pod_specs(render(values))
    c = exporter_container(pod)
    assert gpu_env(c)["NVIDIA_VISIBLE_DEVICES"] == "GPU-0f2e"
    assert c["resources"]["claims"] == [{"name": "gpus"}]
    values = {"mode": "sidecar", "example": {"enabled": True}, "gpu": {"visibleDevices": ""}}
    (_, pod), *_ = pod_specs(render(values))
    assert gpu_env(exporter_container(pod)) == {}


def test_example_deployment_shares_the_process_namespace_with_a_plain_sidecar() -> None:
    (deployment,) = of_kind(render(SCENARIOS["sidecar"]), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    assert [c["name"] for c in pod["containers"]] == ["vllm", SIDECAR]
    assert "initContainers" not in pod
    assert "restartPolicy" not in pod["containers"][1]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["inference-bottleneck-exporter/sidecar"] == "true"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_engine_on_a_mig_device() -> None:
    """The engine requests a MIG profile (device plugin, mixed strategy); the sidecar requests
    nothing and is pointed at the engine's MIG device through NVIDIA_VISIBLE_DEVICES."""
    mig = "MIG-4f2a6c1e-9b7d-5e3f-8a1c-2d4e6f8a0b1c"
    values = {
        "mode": "sidecar",
        "example": {"enabled": True, "engine": {"gpuResource": "nvidia.com/mig-1g.10gb"}},
        "gpu": {"visibleDevices": mig},
    }
    objects = render(values, kube_version=KUBE_LATEST)
    (deployment,) = of_kind(objects, "Deployment")
    kubernetes_validate.validate(deployment, KUBE_LATEST, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    engine, sidecar = pod["containers"]
    assert engine["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": 1}
    assert not any(k.startswith("nvidia.com/") for k in sidecar["resources"]["limits"])
    assert gpu_env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == mig
    assert restricted_violations(pod) == []
    # the exporter watches that MIG device (and its GPU) from the same variable
    assert visible_device_uuids(gpu_env(sidecar)["NVIDIA_VISIBLE_DEVICES"]) == {mig}
    assert effective_settings(sidecar).values["gpu.devices"] == ""


def test_host_procfs_mounts_the_hosts_proc_read_only() -> None:
    values = {"mode": "sidecar", "example": {"enabled": True}, "gpu": {"hostProcfs": True}}
    objects = render(values, kube_version=KUBE_LATEST)
    (deployment,) = of_kind(objects, "Deployment")
    kubernetes_validate.validate(deployment, KUBE_LATEST, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    sidecar = exporter_container(pod)
    assert "--gpu.host-procfs=/host/proc" in sidecar["args"]
    assert {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    assert {"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}} in pod[
        "volumes"
    ]
    # the engine container does not get it; and the chart says what it costs
    assert "volumeMounts" not in pod["containers"][0] or all(
        m["name"] != "host-proc" for m in pod["containers"][0]["volumeMounts"]
    )
    assert restricted_violations(pod) == ["volume host-proc: hostPath"]
    assert "gpu.host-procfs" in {o.name for o in serve_options()}


@pytest.mark.parametrize("mode", ["dcgm", "node"])
def test_host_procfs_is_sidecar_mode_only(mode: str) -> None:
    values: dict[str, Any] = {"mode": mode, "gpu": {"hostProcfs": True}}
    values["example"] = {"enabled": True}
    (deployment,) = of_kind(render(values), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert "--gpu.host-procfs=/host/proc" not in exporter_container(pod)["args"]
    assert restricted_violations(pod) == []


def test_native_sidecar_is_a_restartable_init_container() -> None:
    (deployment,) = of_kind(render(SCENARIOS["sidecar-native"]), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["vllm"]
    (init,) = pod["initContainers"]
    assert init["name"] == SIDECAR and init["restartPolicy"] == "Always"
    assert pod["runtimeClassName"] == "nvidia"


def test_native_sidecar_needs_kubernetes_1_29() -> None:
    with pytest.raises(helm.HelmError, match=r"needs Kubernetes >= 1\.29"):
        render(SCENARIOS["sidecar-native"], kube_version="1.28.9")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "gpu"}, "mode"),
        ({"sidecar": {"port": 0}}, "port"),
        ({"prometheusRule": {"profile": "slow"}}, "profile"),
        ({"sidecar": {"config": {"engine": {"url": "x"}}}}, "engine"),
        ({"alertmanagerConfig": {"enabled": True}}, "routingKeySecret"),
        ({"podMonitr": {}}, "podMonitr"),
        ({"node": {"podResourcesPath": "var/lib/kubelet"}}, "podResourcesPath"),
        ({"mode": "node", "node": {"config": {"x": [1]}}}, "node.config.x"),
        ({"example": {"engine": {"gpuResource": "mig-1g.10gb"}}}, "gpuResource"),
        ({"gpu": {"hostProcfs": "yes"}}, "hostProcfs"),
    ],
)
def test_bad_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def test_pagerduty_routing_keys_come_from_a_secret() -> None:
    (config,) = of_kind(render(SCENARIOS["all-objects"]), "AlertmanagerConfig")
    spec = config["spec"]
    keys = {
        r["name"]: [p["routingKey"] for p in r.get("pagerdutyConfigs", [])]
        for r in spec["receivers"]
    }
    assert keys == {
        "null": [],
        "pagerduty": [{"name": "pagerduty", "key": "routing-key"}],
        "pagerduty-low-urgency": [{"name": "pagerduty", "key": "low-urgency-routing-key"}],
    }
    route = spec["route"]
    assert {"name": "alertname", "matchType": "=~", "value": "Inference.+"} in route["matchers"]
    by_severity = {r["matchers"][0]["value"]: r["receiver"] for r in route["routes"]}
    assert by_severity == {
        "critical": "pagerduty",
        "warning": "pagerduty-low-urgency",
        "info": "null",
    }


def test_child_routes_validate_as_routes(crd_validators: dict[tuple[str, str], Any]) -> None:
    """The CRD leaves child routes unchecked (preserve-unknown-fields); check them as routes."""
    (config,) = of_kind(render(SCENARIOS["all-objects"]), "AlertmanagerConfig")
    validator = crd_validators[("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig")]
    route_schema = validator.schema["properties"]["spec"]["properties"]["route"]
    check = type(validator)(route_schema)
    pending = list(config["spec"]["route"].get("routes", []))
    assert pending
    while pending:
        route = pending.pop()
        errors = list(check.iter_errors(route))
        assert not errors, errors[0].message
        pending += route.get("routes", [])


def test_service_monitor_scrapes_the_same_pods_through_a_headless_service() -> None:
    objects = render(SCENARIOS["all-objects"])
    (service,) = of_kind(objects, "Service")
    (monitor,) = of_kind(objects, "ServiceMonitor")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"inference-bottleneck-exporter/sidecar": "true"}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_node_mode_monitors_select_the_daemonset_pods() -> None:
    objects = render({"mode": "node", "serviceMonitor": {"enabled": True}})
    (daemonset,) = of_kind(objects, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    monitors = {m["metadata"]["name"]: m for m in of_kind(objects, "PodMonitor")}
    agents = monitors["ibe-inference-bottleneck-exporter-node"]
    assert agents["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert agents["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    (service,) = of_kind(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (monitor,) = of_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


def test_named_template_serves_a_parent_chart(tmp_path: Path) -> None:
    """The documented use: this chart as a dependency, its sidecar in the parent's pod."""
    parent = tmp_path / "inference"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / CHART.name)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: inference\nversion: 1.0.0\ndependencies:\n"
        f"  - name: {CHART.name}\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        f"{CHART.name}:\n  sidecar:\n    native: true\n"
        "    config:\n      engine.url: http://127.0.0.1:30000/metrics\n"
    )
    (parent / "templates" / "deployment.yaml").write_text(
        """\
{{- $ibe := index .Subcharts "inference-bottleneck-exporter" }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: sglang
spec:
  selector:
    matchLabels:
      app: sglang
  template:
    metadata:
      labels:
        app: sglang
        {{- include "inference-bottleneck-exporter.sidecarPodLabels" $ibe | nindent 8 }}
    spec:
      shareProcessNamespace: true
      initContainers:
        {{- include "inference-bottleneck-exporter.sidecar" $ibe | nindent 8 }}
      containers:
        - name: sglang
          image: lmsysorg/sglang:latest
"""
    )
    objects = render(chart=parent)
    (deployment,) = of_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["restartPolicy"] == "Always"
    assert init["image"].startswith("inference-bottleneck-exporter/")
    assert effective_settings(init).values["engine.url"] == ("http://127.0.0.1:30000/metrics",)
    assert (
        deployment["spec"]["template"]["metadata"]["labels"][
            "inference-bottleneck-exporter/sidecar"
        ]
        == "true"
    )
    # The subchart's own monitoring objects come along.
    assert {"PodMonitor", "PrometheusRule"} <= set(kinds(objects))


def test_notes_tell_how_to_include_the_sidecar() -> None:
    notes = render_manifests()[f"{CHART.name}/templates/NOTES.txt"]
    assert 'include "inference-bottleneck-exporter.sidecar"' in notes
    both = render_manifests({"serviceMonitor": {"enabled": True}})[
        f"{CHART.name}/templates/NOTES.txt"
    ]
    assert "scraped twice" in both
