"""The node profile passes the sidecar profile's own promtool tests, with its GPU series moved
to a node agent.

Each test group of ``tests/promtool/sidecar/{signatures,baseline}.yaml`` is rewritten as the
node layout would expose it (:mod:`support.node_layout`); then promtool runs the rewritten groups
against ``alert_rules/node/``: every alert expected of a pod must fire with the same labels and
annotations, every near miss stay silent.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.node_layout import GPU_SOURCED, SIDECAR_TESTS, node_layout_groups
from support.paths import ROOT

RULES = ROOT / "alert_rules" / "node"


@pytest.mark.parametrize("name", ["signatures.yaml", "baseline.yaml"])
def test_sidecar_cases_hold_in_the_node_layout(name: str, tmp_path: Path) -> None:
    groups = node_layout_groups(name)
    assert groups
    source = yaml.safe_load((SIDECAR_TESTS / name).read_text(encoding="utf-8"))
    document = {
        "rule_files": [str(RULES / "recording_rules.yaml"), str(RULES / "alerts.yaml")],
        "evaluation_interval": source["evaluation_interval"],
        "group_eval_order": source["group_eval_order"],
        "tests": groups,
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run `make tools`"
    done = subprocess.run(
        [promtool, "test", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_rewrite_keeps_firing_cases_of_every_gpu_signature() -> None:
    """The rewritten signature tests still expect these GPU-sourced alerts to fire for a pod
    (the starvation alert's sidecar case is a static target's: tests/promtool/node/ has the
    node layout's own, two pods on one node and the cold start)."""
    fired = {
        case["alertname"]
        for group in node_layout_groups("signatures.yaml")
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    for alert in (
        "InferenceGPUUtilizationPulsing",
        "InferenceHBMBandwidthSaturated",
        "InferenceGPUMemoryHeadroomLow",
        "InferenceGPUBusySMsIdle",
        "InferenceFrontendCPUSaturated",
    ):
        assert alert in GPU_SOURCED and alert in fired, alert
