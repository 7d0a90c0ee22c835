"""The sidecar profile's promtool test groups as the node layout exposes them (hand-written).

Every ``inference_gpu_*`` series of a PodMonitor target leaves the sidecar and is a node
agent's (the agent's own ``endpoint``, ``instance`` and ``job``; one agent per sidecar, so no
two pods' GPUs collide). The agent files each device's series under the pod holding the device
(its ``namespace`` and ``pod``, container ``engine``, as honorLabels keeps them;
:mod:`exporter.collectors.holder_labels`) and says so in ``inference_gpu_pod_info``; its series
of no device are its own. What the node layout cannot do is
left out: static targets (no pod to join a GPU to), and the alerts that read the sidecar's raw
GPU series or its per-process shares. ``tests/signatures/test_node_profile.py`` runs the result
with promtool, ``tests/signatures/test_vmalert.py`` with vmalert.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from exporter.signatures import all_signatures as catalogue
from exporter.signatures.signals import cpu_signals, recording_rules
from exporter.signatures.site import parse_config
from support.paths import ROOT

SIDECAR_TESTS = ROOT / "tests" / "promtool" / "sidecar"
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
TARGET = ("namespace", "pod", "container", "endpoint", "instance", "job")
# Read the sidecar's own GPU series (up, the per-process shares, the attribution method): a
# node agent's belong to the node, not to a pod's sidecar.
SIDECAR_ONLY = {
    "InferenceGPULost",
    "InferenceNVMLUnavailable",
    "InferenceGPUContended",
    "InferenceGPUAttributionUncertain",
}
# Fires by design for every static target with traffic in the node layout (no pod to give a
# GPU to: the pack is blind for it, and says so).
STATIC_BLIND = {"InferenceGPUMetricsMissing"}
# The sidecar's per-process series: in the node layout nothing exports them per pod.
PER_PROCESS = {
    "inference_gpu_processes",
    "inference_gpu_engine_utilization_ratio",
    "inference_gpu_engine_memory_used_bytes",
    "inference_gpu_attribution_info",
}


def gpu_sourced_alerts() -> set[str]:
    """Alerts whose expression or evidence reads a record the node profile fills differently:
    those can no longer fire for a static target (no pod to give a GPU to)."""
    cfg = parse_config({}, "node")
    side = {r.record: r.expr for r in recording_rules(parse_config({}, "sidecar"))}
    node = {r.record: r.expr for r in recording_rules(cfg)}
    # The node's CPU shares differ only by leaving out the node agents' own targets: a static
    # target keeps them.
    own_cpu = {s.record(cfg) for s in (cpu_signals.SOFTIRQ_SHARE, cpu_signals.SOFTIRQ_HOTTEST_CORE)}
    differ = {name for name in side if side[name] != node.get(name)} - own_cpu
    out = set()
    for sig in catalogue(parse_config({}, "node")):
        for rule in sig.rules:
            texts = [rule.expr, *(e.expr or "" for e in rule.evidence)]
            if any(name in text for text in texts for name in differ):
                out.add(sig.alert)
    return out


GPU_SOURCED = gpu_sourced_alerts()


def _labels(text: str) -> dict[str, str]:
    return dict(_LABEL.findall(text))


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def _length(values: str) -> int:
    """How many samples a promtool values string holds (``a+bxN`` is N+1)."""
    total = 0
    for part in str(values).split():
        match = re.match(r"^.*x(\d+)$", part)
        total += int(match[1]) + 1 if match else 1
    return total


def to_node_layout(group: dict[str, Any]) -> dict[str, Any] | None:
    """The group as the node layout exposes it; None when nothing of it can be checked."""
    series: list[dict[str, Any]] = []
    holders: dict[tuple[str, str, str], tuple[dict[str, str], int]] = {}
    agents: dict[str, dict[str, str]] = {}
    for item in group["input_series"]:
        match = _SERIES.match(item["series"])
        assert match, item["series"]
        name, labels = match[1], _labels(match[2])
        gpu_series = name.startswith(("inference_gpu_", "inference_nvml_"))
        if not gpu_series:
            series.append(item)
            continue
        if name in PER_PROCESS or "pod" not in labels:
            continue  # the sidecar's own, or a static target's: no pod to give it to
        agent = agents.setdefault(
            labels["instance"],
            {
                "namespace": "monitoring",
                "pod": f"ibe-node-{len(agents)}",
                "container": "inference-bottleneck-exporter",
                "endpoint": "metrics",
                "instance": f"10.0.200.{len(agents)}:10960",
                "job": "monitoring/ibe-node",
            },
        )
        own = {k: v for k, v in labels.items() if k not in TARGET}
        if "gpu" in labels:
            # a device's series is filed under the pod holding it (honorLabels keeps these)
            held = {"namespace": labels["namespace"], "pod": labels["pod"], "container": "engine"}
            series.append(
                {"series": _series(name, {**own, **agent, **held}), "values": item["values"]}
            )
        else:
            series.append({"series": _series(name, {**own, **agent}), "values": item["values"]})
        if "gpu" in labels and "uuid" in labels:
            key = (agent["instance"], labels["gpu"], labels["uuid"])
            length = max(_length(item["values"]), holders.get(key, ({}, 0))[1])
            holder = {
                "gpu": labels["gpu"],
                "uuid": labels["uuid"],
                "namespace": labels["namespace"],
                "pod": labels["pod"],
                "container": "engine",
                "endpoint": "metrics",
                "instance": agent["instance"],
                "job": agent["job"],
            }
            holders[key] = (holder, length)
    for holder, length in holders.values():
        series.append(
            {"series": _series("inference_gpu_pod_info", holder), "values": f"1x{length}"}
        )
    cases = []
    for case in group.get("alert_rule_test", []):
        if case["alertname"] in SIDECAR_ONLY or case["alertname"] in STATIC_BLIND:
            continue
        expected = case.get("exp_alerts") or []
        if case["alertname"] in GPU_SOURCED:
            expected = [a for a in expected if "pod" in a["exp_labels"]]
            if len(expected) != len(case.get("exp_alerts") or []) and not expected:
                continue  # it fired only for a static target: nothing left to check
        cases.append({**case, "exp_alerts": expected})
    if not cases:
        return None
    out = {k: v for k, v in group.items() if k not in ("promql_expr_test", "alert_rule_test")}
    return {**out, "input_series": series, "alert_rule_test": cases}


def node_layout_groups(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((SIDECAR_TESTS / name).read_text(encoding="utf-8"))
    return [g for g in (to_node_layout(g) for g in document["tests"]) if g is not None]
