"""The chart's generated parts equal their sources: rules, dashboards, values table, version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from support.chart import CHART, ROOT, of_kind, render
from support.chart import chart_tool as load_chart_tool

import exporter
from exporter.signatures.signals.signal_groups import RECORD_GROUPS
from exporter.signatures.slo.slo_signals import BUDGET_GROUP as BUDGET

chart_tool = load_chart_tool()
SCENARIOS_PAGERDUTY = {
    "alertmanagerConfig": {"enabled": True, "pagerduty": {"routingKeySecret": {"name": "pd"}}}
}
PROFILES = {"sidecar": ROOT / "alert_rules"} | {
    p.name: p
    for p in sorted((ROOT / "alert_rules").iterdir())
    if p.is_dir() and p.name not in chart_tool.NOT_PROFILES
}


def test_chart_copies_equal_their_sources() -> None:
    """`make chart` copies alert_rules/ and dashboards/ into files/; CI fails when stale."""
    assert chart_tool.stale() == []


def test_staleness_is_detected(tmp_path: Path) -> None:
    # A tree with a rules file that the chart lacks.
    bare = tmp_path / "bare"
    (bare / "helm" / CHART.name).mkdir(parents=True)
    for name in ("README.md", "values.yaml"):
        (bare / "helm" / CHART.name / name).write_text((CHART / name).read_text())
    (bare / "alert_rules").mkdir()
    (bare / "alert_rules" / "extra.yaml").write_text("groups: []\n")
    assert chart_tool.stale(bare) == ["files/alert_rules/extra.yaml: missing (source exists)"]


def source_groups(profile_dir: Path) -> list[dict[str, Any]]:
    """The rule groups of a profile's rule files (alertmanager.yaml is no rule file)."""
    groups: list[dict[str, Any]] = []
    for path in sorted(profile_dir.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "groups" in data:
            groups += data["groups"]
    return groups


def test_profiles_hold_recording_and_alerting_rules() -> None:
    assert {"sidecar", "dcgm"} <= PROFILES.keys()
    for directory in PROFILES.values():
        assert {"recording_rules.yaml", "alerts.yaml"} <= {p.name for p in directory.glob("*.yaml")}


def timed(groups: list[dict[str, Any]], records: str, alerts: str = "") -> list[dict[str, Any]]:
    """``groups`` with the record groups at ``records`` (the chart's recordInterval) and the
    alert groups at ``alerts`` (its alertInterval); an empty one leaves them untimed, and a
    group generated with an interval of its own (the SLO budget's) keeps it."""
    out = []
    for g in groups:
        interval = records if g["name"].startswith("inference.records") else alerts
        out.append({**g, "interval": interval} if interval and "interval" not in g else g)
    return out


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_prometheus_rule_equals_alert_rules(profile: str) -> None:
    # by default every group at Prometheus' global interval: the rules as generated
    (rule,) = of_kind(render({"prometheusRule": {"profile": profile}}), "PrometheusRule")
    assert rule["spec"]["groups"] == source_groups(PROFILES[profile])
    assert rule["metadata"]["labels"]["inference-bottleneck-exporter/rule-profile"] == profile
    # with recordInterval, the record groups at it (not the fast profile's: seconds)
    values = {"prometheusRule": {"profile": profile, "recordInterval": "1m"}}
    (rule,) = of_kind(render(values), "PrometheusRule")
    interval = "" if profile == "fast" else "1m"
    assert rule["spec"]["groups"] == timed(source_groups(PROFILES[profile]), interval)
    # with alertInterval too, the alert groups at theirs
    values = {"prometheusRule": {"profile": profile, "recordInterval": "1m", "alertInterval": "2m"}}
    (rule,) = of_kind(render(values), "PrometheusRule")
    alerts = "" if profile == "fast" else "2m"
    assert rule["spec"]["groups"] == timed(source_groups(PROFILES[profile]), interval, alerts)


def rendered_intervals(values: dict[str, Any]) -> dict[str, str | None]:
    """Each group of the PrometheusRule the chart renders with ``values``, by name, with its
    interval (None: Prometheus' global one)."""
    (rule,) = of_kind(render(values), "PrometheusRule")
    return {g["name"]: g.get("interval") for g in rule["spec"]["groups"]}


def test_record_groups_take_their_own_interval_and_alerts_the_global_one() -> None:
    intervals = rendered_intervals({"prometheusRule": {"recordInterval": "2m"}})
    # the template knows them by their prefix: every record group (the signals' and the SLO
    # and verdict groups), no other; the SLO budget's group keeps its own
    source = yaml.safe_load((PROFILES["sidecar"] / "recording_rules.yaml").read_text())
    records = {group["name"] for group in source["groups"]}
    assert set(RECORD_GROUPS) < records
    assert {name for name, value in intervals.items() if value == "2m"} == records - {BUDGET}
    assert intervals[BUDGET] == "2m30s"
    assert intervals["inference.signatures"] is None
    assert intervals["inference.meta"] is None


def test_alert_groups_take_the_alert_interval_and_records_keep_theirs() -> None:
    source = yaml.safe_load((PROFILES["sidecar"] / "alerts.yaml").read_text())
    alerts = {group["name"] for group in source["groups"]}
    assert {"inference.signatures", "inference.meta", "inference.slo"} <= alerts
    # alone: the alert groups at it, the record groups at the global interval
    intervals = rendered_intervals({"prometheusRule": {"alertInterval": "1m"}})
    assert {name for name, value in intervals.items() if value == "1m"} == alerts
    assert all(v is None for name, v in intervals.items() if name not in alerts | {BUDGET})
    # with recordInterval, each kind of group at its own
    intervals = rendered_intervals(
        {"prometheusRule": {"alertInterval": "1m", "recordInterval": "2m"}}
    )
    assert {name for name, value in intervals.items() if value == "1m"} == alerts
    assert {name for name, value in intervals.items() if value == "2m"} == set(
        intervals
    ) - alerts - {BUDGET}
    assert intervals[BUDGET] == "2m30s"


def test_a_malformed_alert_interval_is_refused() -> None:
    with pytest.raises(helm.HelmError, match="alertInterval"):
        render({"prometheusRule": {"alertInterval": "every minute"}})


@pytest.mark.parametrize(
    ("mode", "profile"), [("sidecar", "sidecar"), ("dcgm", "dcgm"), ("node", "node")]
)
def test_mode_picks_the_rule_profile(mode: str, profile: str) -> None:
    (rule,) = of_kind(render({"mode": mode}), "PrometheusRule")
    assert rule["spec"]["groups"] == source_groups(PROFILES[profile])


def test_prometheus_rule_labels_are_configurable() -> None:
    values = {"prometheusRule": {"labels": {"release": "kube-prometheus-stack"}}}
    (rule,) = of_kind(render(values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert of_kind(render({"prometheusRule": {"enabled": False}}), "PrometheusRule") == []


def test_alertmanager_config_is_the_packs_alertmanager_yaml() -> None:
    """Route, inhibitions and receivers of alert_rules/alertmanager.yaml, in CRD spelling."""
    source = yaml.safe_load((ROOT / "alert_rules" / "alertmanager.yaml").read_text())
    (config,) = of_kind(render(SCENARIOS_PAGERDUTY), "AlertmanagerConfig")
    spec = config["spec"]
    pack = next(r for r in source["route"]["routes"] if r.get("matchers"))
    assert [m["value"] for m in spec["route"]["matchers"]] == ["Inference.+"]
    assert spec["route"]["receiver"] == source["route"]["receiver"]
    assert spec["route"]["groupBy"] == source["route"]["group_by"]
    assert [r["receiver"] for r in spec["route"]["routes"]] == [
        r["receiver"] for r in pack["routes"]
    ]
    assert [r.get("groupWait") for r in spec["route"]["routes"]] == [
        r.get("group_wait") for r in pack["routes"]
    ]
    assert len(spec["inhibitRules"]) == len(source["inhibit_rules"])
    for rule, original in zip(spec["inhibitRules"], source["inhibit_rules"], strict=True):
        assert rule["equal"] == original["equal"]
        assert len(rule["targetMatch"]) == len(original["target_matchers"])
    receivers = {r["name"]: r for r in spec["receivers"]}
    for original in source["receivers"]:
        for got, want in zip(
            receivers[original["name"]].get("pagerdutyConfigs", []),
            original.get("pagerduty_configs", []),
            strict=True,
        ):
            assert got["routingKey"]["key"] == Path(want["routing_key_file"]).name
            assert got["severity"] == want["severity"]
            assert got["description"] == want["description"]
            assert {d["key"]: d["value"] for d in got["details"]} == want["details"]
            assert [link["href"] for link in got["pagerDutyLinkConfigs"]] == [
                link["href"] for link in want["links"]
            ]


def test_alertmanager_translation_refuses_what_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="matcher"):
        chart_tool._matchers(["severity critical"])
    config = {
        "route": {
            "receiver": "x",
            "routes": [{"matchers": ['a="b"'], "mute_time_intervals": ["night"]}],
        }
    }
    with pytest.raises(ValueError, match="mute_time_intervals"):
        chart_tool.alertmanager_config_spec(config)


@pytest.mark.parametrize(
    ("values", "directory"),
    [
        ({}, "node"),  # the default mode's
        ({"mode": "sidecar"}, ""),
        ({"mode": "dcgm"}, "dcgm"),
        ({"mode": "sidecar", "prometheusRule": {"profile": "fast"}}, "fast"),
    ],
)
def test_dashboard_configmaps_equal_dashboards(values: dict[str, Any], directory: str) -> None:
    """One ConfigMap per dashboard of the rule profile the chart installs (the panels read its
    signals), byte for byte."""
    boards = ROOT / "dashboards" / directory
    sources = {p.name: p.read_text() for p in sorted(boards.glob("*.json"))}
    assert len(sources) == 3
    values = {**values, "dashboards": {"annotations": {"grafana_folder": "Inference"}}}
    maps = [
        m
        for m in of_kind(render(values), "ConfigMap")
        if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    rendered: dict[str, str] = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Inference"}
        (name, text), *rest = cm["data"].items()
        assert not rest
        json.loads(text)
        rendered[name] = text
    assert rendered == sources
    assert len({cm["metadata"]["name"] for cm in maps}) == len(maps)


def test_dashboard_configmaps_follow_the_files(tmp_path: Path) -> None:
    """The template itself, on a dashboard that is not in the repository."""
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart)
    (chart / "files" / "dashboards" / "node").mkdir(parents=True, exist_ok=True)
    text = json.dumps({"uid": "ibe-x", "title": "X", "panels": []}, indent=2, sort_keys=True) + "\n"
    (chart / "files" / "dashboards" / "node" / "GPU_Overview.json").write_text(text)
    maps = [
        m
        for m in of_kind(render(chart=chart), "ConfigMap")
        if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    found = {cm["metadata"]["name"]: cm["data"] for cm in maps}
    assert found["ibe-inference-bottleneck-exporter-dashboard-gpu-overview"] == {
        "GPU_Overview.json": text
    }


def test_values_table_is_current_and_complete() -> None:
    values_yaml = (CHART / "values.yaml").read_text()
    documented = {d.key for d in chart_tool.value_docs(values_yaml)}
    assert {
        "mode",
        "sidecar.native",
        "gpu.visibleDevices",
        "alertmanagerConfig.enabled",
    } <= documented
    readme = (CHART / "README.md").read_text()
    assert chart_tool.readme_with_table(readme, values_yaml) == readme
    with pytest.raises(ValueError, match="undocumented"):
        chart_tool.value_docs(values_yaml + "undocumented: 1\n")


def test_app_version_is_the_exporters() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == exporter.__version__


@pytest.mark.parametrize("interval", ["5m", "300s", "10m", "1h", "4m60s", "every minute"])
def test_a_record_interval_of_five_minutes_or_more_is_refused(interval: str) -> None:
    # Prometheus looks back 5m for a series' latest sample: at 5m or more, the alerts and
    # records that read a record find none between its evaluations
    with pytest.raises(helm.HelmError, match="recordInterval"):
        render({"prometheusRule": {"recordInterval": interval}})


@pytest.mark.parametrize("interval", ["90s", "2m30s", "4m59s", "299s"])
def test_a_record_interval_under_five_minutes_is_taken(interval: str) -> None:
    intervals = rendered_intervals({"prometheusRule": {"recordInterval": interval}})
    assert intervals["inference.records.gpu"] == interval
