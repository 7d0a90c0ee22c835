"""The drills' layouts (issue 33 item 4): the chart's default ``node`` layout for the matrix,
one drill in each other layout, and every deadline read from the rule files the drill's
Prometheus loads, its layout's profile (no process is started here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from drills.harness import layout
from drills.scenarios import (
    CPU_DRILLED,
    CPU_SCENARIOS,
    DISAGG_SCENARIOS,
    DISAGG_SITE_CONFIG,
    EXTERNAL_SCENARIOS,
    GPU_SCENARIOS,
    OTHER_LAYOUTS,
    POOL_ALERTS,
    Scenario,
    deadline,
)
from drills.timing import LAG_S, rule_timing

from exporter.lab.layouts import DEFAULT_LAYOUT, LAYOUTS, rule_profile
from exporter.lab.stack import write_rules

SECONDS = {"s": 1, "m": 60, "h": 3600}


def _loaded(tmp_path: Path, layout_name: str, site_config: str) -> dict[str, tuple[float, float]]:
    """Each alert's (longest guard window, `for`) in the alert file the Stack writes for
    Prometheus in ``layout_name`` with ``site_config``."""
    config = tmp_path / "site-config.yaml"
    config.write_text(site_config or "{}\n", encoding="utf-8")
    files = write_rules(tmp_path, rule_profile(layout_name), config)
    out: dict[str, tuple[float, float]] = {}
    for group in yaml.safe_load(files[1].read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            length = sum(
                int(n) * SECONDS[u] for n, u in re.findall(r"(\d+)([smh])", rule.get("for", "0s"))
            )
            guard = re.findall(r"history(\d+)([smh])\b", rule["expr"])
            window = max((int(n) * SECONDS[u] for n, u in guard), default=0)
            old = out.get(rule["alert"], (0.0, 0.0))
            out[rule["alert"]] = max(old, (float(window), float(length)), key=sum)
    return out


def test_the_matrix_runs_the_default_layout_and_the_sidecar_one() -> None:
    """The default layout for the matrix, softirq (the reference engine's and the third-party
    engines') in the sidecar layout; the dcgm layout has no drill yet (scenarios.py says why)."""
    assert DEFAULT_LAYOUT == "node"
    by_layout: dict[str, list[str]] = {}
    for s in CPU_SCENARIOS:
        by_layout.setdefault(s.layout, []).append(s.name)
    assert set(by_layout) == set(LAYOUTS) - {"dcgm"}
    others = {n: kind for kind, names in by_layout.items() if kind != DEFAULT_LAYOUT for n in names}
    assert others == OTHER_LAYOUTS == {"softirq": "sidecar"}
    assert len(by_layout[DEFAULT_LAYOUT]) == len(CPU_SCENARIOS) - len(OTHER_LAYOUTS)
    for s in EXTERNAL_SCENARIOS:
        assert s.layout == OTHER_LAYOUTS.get(s.name, DEFAULT_LAYOUT), (s.engine, s.name)
    for s in (*GPU_SCENARIOS, *DISAGG_SCENARIOS):
        assert s.layout == DEFAULT_LAYOUT, s.name


@pytest.mark.parametrize("scenario", CPU_SCENARIOS, ids=lambda s: s.name)
def test_a_drills_deadline_is_its_layouts_loaded_rules(scenario: Scenario, tmp_path: Path) -> None:
    """The windows and `for` the deadline adds up are those of the rule file that the drill's
    Prometheus loads (its layout's fast profile, its site config); the report says both."""
    loaded = _loaded(tmp_path, scenario.layout, scenario.site_config())
    wait = deadline(scenario)
    if scenario.expected is not None:
        assert wait.seconds == sum(loaded[scenario.expected]) + scenario.onset_s + LAG_S
    else:
        assert wait.seconds == max(sum(loaded[a]) for a in CPU_DRILLED) + LAG_S
    text = layout(scenario)
    assert text.startswith(f"{scenario.layout} layout ({rule_profile(scenario.layout)} rules): ")


def test_disaggregated_deadlines_are_the_node_layouts_loaded_rules(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, DEFAULT_LAYOUT, DISAGG_SITE_CONFIG)
    for s in DISAGG_SCENARIOS:
        expected = (
            sum(loaded[s.signature]) + s.onset_s + LAG_S
            if s.signature is not None
            else max(sum(loaded[a]) for a in POOL_ALERTS) + LAG_S
        )
        assert deadline(s).seconds == expected, s.name
        assert "a node agent each" in layout(s)


def test_the_timing_follows_the_profile_it_is_given() -> None:
    """The profile is read, not assumed: the production node profile's timings are ten times
    the fast-node one's."""
    alert = "InferenceFrontendCPUSaturated"
    fast = rule_timing(alert, "", rule_profile("node"))
    slow = rule_timing(alert, "", "node")
    assert (slow.windows_s, slow.for_s) == (10 * fast.windows_s, 10 * fast.for_s)
