"""Rendering the chart with the Helm v4 SDK (helm-python-sdk, no helm binary) and validating
what it renders: kubernetes-validate for built-in kinds, the prometheus-operator CRDs'
openAPIV3Schema (from ``tests/fixtures/crds/``) for the custom resources (prometheus-operator's,
cert-manager's)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml
from helm_python import _native

from support.paths import ROOT, build_tool

CHART = ROOT / "helm" / "inference-bottleneck-exporter"
CRDS = ROOT / "tests" / "fixtures" / "crds"
RELEASE = "ibe"
NAMESPACE = "inference"
# The oldest Kubernetes the chart's features target (native sidecars) and the newest that
# kubernetes-validate knows.
KUBE_MIN = "1.29.0"
KUBE_LATEST = kubernetes_validate.latest_version()
SIDECAR = "inference-bottleneck-exporter"
PAGERDUTY = {"enabled": True, "pagerduty": {"routingKeySecret": {"name": "pagerduty"}}}

# Values per scenario: the default (node mode), each mode, and everything switched on in each
# mode.
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "sidecar": {"mode": "sidecar", "example": {"enabled": True}},
    "sidecar-native": {
        "mode": "sidecar",
        "sidecar": {"native": True},
        "example": {"enabled": True},
        "gpu": {"runtimeClassName": "nvidia", "resourceClaims": ["gpus"]},
    },
    "dcgm": {"mode": "dcgm", "example": {"enabled": True}},
    "node": {"mode": "node", "gpu": {"runtimeClassName": "nvidia"}},
    # The node agent in the host's PID namespace: per-pod shares of time-sliced and MPS GPUs.
    "node-hostpid": {"mode": "node", "node": {"hostPID": True}},
    # The default mode with the example: the node agent and a sidecar without NVML.
    "node-example": {"example": {"enabled": True}},
    "all-objects": {
        "mode": "sidecar",
        "serviceMonitor": {"enabled": True},
        "alertmanagerConfig": PAGERDUTY,
        "example": {"enabled": True},
        "sidecar": {"config": {"gpu.poll-interval": "5s", "collector.process": False}},
    },
    "node-all-objects": {
        "mode": "node",
        "podMonitor": {"enabled": False},
        "serviceMonitor": {"enabled": True},
        "alertmanagerConfig": PAGERDUTY,
        "prometheusRule": {"profile": "fast"},
    },
    "webhook": {"webhook": {"enabled": True}},
    "webhook-cert-manager": {
        "mode": "dcgm",
        "webhook": {"enabled": True, "certManager": {"enabled": True}},
        "sidecar": {"native": True},
    },
}


def chart_tool() -> ModuleType:
    """``build-tools/chart.py`` (a script, not a package) as a module."""
    return build_tool("chart")


class _Loader(yaml.SafeLoader):
    """PyYAML reads an unquoted ``=`` (a matcher type; Go's YAML writes it so) as the YAML 1.1
    value tag; it is the plain string, as for Kubernetes."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: node.value)


def render_manifests(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str | None = None,
    chart: Path = CHART,
) -> dict[str, str]:
    """Template path -> rendered text, offline, as `helm template` renders it."""
    with helm.Chart.load(chart) as loaded:
        if kube_version is None:
            return loaded.render(values, name=RELEASE, namespace=NAMESPACE)
        # Chart.render has no kube_version keyword; the library's render options take one
        # (`helm template --kube-version`).
        options = {"name": RELEASE, "namespace": NAMESPACE, "kube_version": f"v{kube_version}"}
        rendered = _native.call_string(
            "helm_render", loaded._raw(), json.dumps(values or {}), json.dumps(options)
        )
        manifests: dict[str, str] = json.loads(rendered)
        return manifests


def render(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str | None = None,
    chart: Path = CHART,
) -> list[dict[str, Any]]:
    """The objects the chart renders (NOTES.txt left out)."""
    objects: list[dict[str, Any]] = []
    manifests = render_manifests(values, kube_version=kube_version, chart=chart)
    for name, text in sorted(manifests.items()):
        if name.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.load_all(text, Loader=_Loader) if doc)
    return objects


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def exporter_container(pod: dict[str, Any]) -> dict[str, Any]:
    found = [
        c for c in pod.get("containers", []) + pod.get("initContainers", []) if c["name"] == SIDECAR
    ]
    assert len(found) == 1, [c["name"] for c in pod.get("containers", [])]
    return found[0]


def _python_pattern(pattern: str) -> str:
    """A Go (RE2) pattern as Python's re reads it.

    RE2 lets ``(?i)`` open mid-pattern, for the rest of the enclosing group; Python wants a
    scoped ``(?i:...)`` there, or the flag first. The CRDs use it in enums of names.
    """
    if pattern.startswith("^(?i)"):
        pattern = "(?i)^" + pattern[5:]
    while (start := pattern.find("((?i)")) >= 0:
        depth, end = 0, start
        while True:
            char = pattern[end]
            if char == "\\":
                end += 2
                continue
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
            end += 1
        pattern = pattern[:start] + "((?i:" + pattern[start + 5 : end] + ")" + pattern[end:]
    re.compile(pattern)
    return pattern


def _closed(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists properties.

    The API server prunes fields a structural schema does not know, silently; a typo in the
    chart would vanish there, so here it fails.
    """
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        if isinstance(out.get("pattern"), str):
            out["pattern"] = _python_pattern(out["pattern"])
        if out.get("nullable"):
            out.pop("nullable")
            if isinstance(out.get("type"), str):
                out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def crd_validators_from(crds: Path = CRDS) -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    """(apiVersion, kind) -> validator of the CRD version's openAPIV3Schema."""
    assert crds.is_dir(), f"prometheus-operator CRDs expected at {crds}"
    validators: dict[tuple[str, str], jsonschema.Draft4Validator] = {}
    for path in sorted(crds.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=_Loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
            jsonschema.Draft4Validator.check_schema(schema)
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft4Validator(schema)
    assert len(validators) >= 4, sorted(validators)
    return validators
