"""The chart's named template and the Python builder make the same sidecar container.

The chart renders its example Deployment (which includes the named template with the engine's
URL in ``sidecar.config``) for several values; the builder gets the same values. Any change to
one that the other does not make fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from support.chart import CHART, exporter_container, of_kind, render

from exporter.inject.sidecar import DEFAULTS, Values, build_container

URL = "http://127.0.0.1:8000/metrics"

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "dcgm": {"mode": "dcgm"},
    "native": {"sidecar": {"native": True}},
    "dcgm-native": {"mode": "dcgm", "sidecar": {"native": True}},
    "everything": {
        "image": {
            "repository": "registry.example/ibe",
            "tag": "9.9.9",
            "digest": "sha256:" + "a" * 64,
        },
        "sidecar": {
            "containerName": "ibe",
            "port": 9400,
            "portName": "ibe-metrics",
            "config": {
                "gpu.poll-interval": "5s",
                "collector.process": False,
                "engine.max-series": 2000,
            },
            "extraArgs": ["--log.level=debug"],
            "extraEnv": [{"name": "TZ", "value": "UTC"}],
            "extraVolumeMounts": [{"name": "mapping", "mountPath": "/etc/mapping"}],
            "resources": {"requests": {"cpu": "20m"}},
            "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": "ibe-metrics"}},
            "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "ibe-metrics"}},
        },
        "gpu": {"visibleDevices": "0,1", "resourceClaims": ["gpus"]},
    },
    "no-visible-devices": {"gpu": {"visibleDevices": ""}},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_named_template_and_builder_agree(case: str) -> None:
    values = CASES[case]
    objects = render(_merge(values, {"example": {"enabled": True}}), kube_version="1.31.0")
    (deployment,) = of_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    name = values.get("sidecar", {}).get("containerName", DEFAULTS["sidecar"]["containerName"])
    rendered = [
        c for c in pod.get("containers", []) + pod.get("initContainers", []) if c["name"] == name
    ]
    assert len(rendered) == 1
    built = build_container(Values.of(values).with_config(**{"engine.url": URL}))
    assert built == rendered[0]
    # Key order too: a diff between an injected and a chart-made pod reads the same.
    assert list(built) == list(rendered[0])
    native = values.get("sidecar", {}).get("native", False)
    assert (rendered[0] in pod.get("initContainers", [])) == native


def test_builder_defaults_are_the_charts() -> None:
    """The image, sidecar and gpu defaults; the mode is each command's (inject --gpu, the
    chart's webhook.gpu), since an injected sidecar reads no GPU unless asked."""
    chart = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, defaults in DEFAULTS.items():
        if key == "mode":
            continue
        if isinstance(defaults, dict):
            assert {k: chart[key][k] for k in defaults} == defaults, key
        else:
            assert chart[key] == defaults, key


def test_the_chart_pod_labels_are_what_the_podmonitor_selects() -> None:
    # The sidecars' PodMonitor (node mode adds the node agents' own, "<release>-node").
    (monitor,) = [
        m for m in of_kind(render(), "PodMonitor") if not m["metadata"]["name"].endswith("-node")
    ]
    assert monitor["spec"]["selector"]["matchLabels"] == Values.of().pod_labels
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == Values.of().port_name


def test_exporter_container_helper_finds_the_builders_container() -> None:
    pod = {"containers": [build_container(Values.of())]}
    assert exporter_container(pod)["name"] == DEFAULTS["sidecar"]["containerName"]
