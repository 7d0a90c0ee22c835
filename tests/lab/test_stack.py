"""The stack's generated configurations pass the real tools' checks; its rules are the
layout's profile at ``fast``'s speed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT

from exporter.config import parse_duration
from exporter.lab.layouts import Target, rule_profile, scrape_configs
from exporter.lab.processes import http_get, wait_until
from exporter.lab.stack import (
    PREFILL_TARGET_LABELS,
    TARGET_LABELS,
    AmTiming,
    Stack,
    StackConfig,
    StackError,
    alertmanager_config,
    find_binary,
    prometheus_config,
    write_rules,
)


def tool(*names: str) -> str:
    found = find_binary(*names)
    if not found:
        pytest.fail(f"{' or '.join(names)} not found: run `make tools`")
    return found


def test_rules_are_the_shipped_fast_profile(tmp_path: Path) -> None:
    for path in write_rules(tmp_path, "fast"):
        assert path.read_text() == (ROOT / "alert_rules" / "fast" / path.name).read_text()


def _fors(path: Path) -> dict[str, list[float]]:
    """Each alert's ``for`` durations, in seconds, in the file's order."""
    out: dict[str, list[float]] = {}
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                out.setdefault(rule["alert"], []).append(parse_duration(rule.get("for", "0s")))
    return out


def test_default_rules_are_the_shipped_node_profile_at_fast_speed(tmp_path: Path) -> None:
    records, alerts = write_rules(tmp_path)
    shipped = _fors(ROOT / "alert_rules" / "node" / "alerts.yaml")
    fast = _fors(alerts)
    assert list(fast) == list(shipped)
    for alert, durations in shipped.items():
        assert fast[alert] == pytest.approx([d / 10 for d in durations]), alert
    text = records.read_text()
    # the node agent files each GPU's series under the pod holding it; the node profile gives
    # them the sidecar target's instance and job (the sidecar profile has no such join)
    assert "group_left (instance, job)" in text
    assert "inference:gpu_utilization:mean30s" in text and ":mean5m" not in text


def test_rules_take_a_site_config(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text(
        "windows:\n  baseline: 20m\nsignatures:\n  InferenceHBMBandwidthSaturated:\n    for: 5m\n"
    )
    alerts = write_rules(tmp_path, "fast", config=config)[1].read_text()
    hbm = alerts[alerts.index("alert: InferenceHBMBandwidthSaturated") :]
    hbm = hbm[: hbm.index("annotations:")]
    assert "offset 2m)" in hbm and "for: 30s" in hbm  # fast profile: 1/10 of the site's values
    shipped = (ROOT / "alert_rules" / "fast" / "alerts.yaml").read_text()
    assert "offset 6m)" in shipped and "offset 2m)" not in shipped


def test_alertmanager_config_points_pagerduty_at_the_capture(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("k\n")
    text = alertmanager_config("http://127.0.0.1:1234", key, AmTiming())
    path = tmp_path / "am.yml"
    path.write_text(text)
    out = subprocess.run(
        [tool("amtool"), "check-config", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load(text)
    receivers = {r["name"]: r for r in config["receivers"]}
    pd = receivers["pagerduty"]["pagerduty_configs"][0]
    assert pd["url"] == "http://127.0.0.1:1234/pagerduty"
    assert pd["routing_key_file"] == str(key)
    assert config["route"]["group_wait"] == "1s"
    # Only URLs, keys and timings change: the routes and templates are the pack's.
    shipped = yaml.safe_load((ROOT / "alert_rules" / "alertmanager.yaml").read_text())
    assert config["inhibit_rules"] == shipped["inhibit_rules"]
    assert pd["description"] == shipped["receivers"][1]["pagerduty_configs"][0]["description"]


def _promtool_config(path: Path) -> None:
    out = subprocess.run(
        [tool("promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("layout", ["node", "sidecar", "dcgm"])
def test_prometheus_config_passes_promtool(tmp_path: Path, layout: str) -> None:
    rules = write_rules(tmp_path, rule_profile(layout))
    sidecar = Target("127.0.0.1:10960", dict(TARGET_LABELS))
    reader = [Target("127.0.0.1:10961", {"namespace": "monitoring", "pod": "reader-0"})]
    scrape = {
        "node": scrape_configs(
            [sidecar], reader, Target("127.0.0.1:10962", {"namespace": "kube-system"})
        ),
        "sidecar": scrape_configs([sidecar]),
        "dcgm": scrape_configs([sidecar], dcgm_exporters=reader),
    }[layout]
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus_config(scrape, "127.0.0.1:9093", rules, 2.0))
    _promtool_config(path)
    jobs = yaml.safe_load(path.read_text())["scrape_configs"]
    assert len(jobs) == {"node": 3, "sidecar": 1, "dcgm": 2}[layout]


def test_a_disaggregated_pair_is_scraped_as_two_pods(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    path = tmp_path / "prometheus.yml"
    sidecars = [
        Target("127.0.0.1:10960", dict(TARGET_LABELS)),
        Target("127.0.0.1:10961", dict(PREFILL_TARGET_LABELS)),
    ]
    path.write_text(prometheus_config(scrape_configs(sidecars), None, rules, 2.0))
    _promtool_config(path)
    (job,) = yaml.safe_load(path.read_text())["scrape_configs"]
    pods = {c["targets"][0]: c["labels"]["pod"] for c in job["static_configs"]}
    assert pods == {"127.0.0.1:10960": "reference-0", "127.0.0.1:10961": "reference-prefill-0"}


def test_prometheus_later_starts_when_told_with_the_rules_recorded_before(tmp_path: Path) -> None:
    """A drill that calibrates its engine before Prometheus starts (the gateway drill): the
    objectives' site config recorded before the start is what Prometheus loads."""
    site = tmp_path / "site.yaml"
    site.write_text("signatures:\n  InferenceHBMBandwidthSaturated:\n    for: 5m\n")
    stack = Stack(
        StackConfig(tmp_path, layout="sidecar", alertmanager=False, prometheus_later=True)
    )
    stack.sidecar_url = "http://127.0.0.1:9/metrics"  # nothing listens: a target down
    try:
        stack.reload_rules(site)  # before the start: recorded, nothing to reload
        assert not stack.prometheus_url and not (tmp_path / "alerts.yaml").exists()
        stack.start_prometheus()
        status, body = http_get(stack.prometheus_url + "/api/v1/rules?type=alert")
        assert status == 200
        durations = {
            rule["name"]: rule["duration"]
            for group in json.loads(body)["data"]["groups"]
            for rule in group["rules"]
        }
        assert durations["InferenceHBMBandwidthSaturated"] == 30  # the site's 5m at 1/10
        # what a drill waits for before it reads the pack: every target scraped (a failed
        # scrape counts), then every rule group evaluated since
        wait_until(stack.scraped_every_target, 15, "a scrape of the target")
        scraped = time.time()
        assert not stack.evaluated_since(scraped + 3600)
        wait_until(lambda: stack.evaluated_since(scraped), 15, "an evaluation after it")
        with pytest.raises(StackError, match="prometheus_later"):
            stack.start_prometheus()  # once only
    finally:
        stack.stop()


def test_prometheus_starts_with_the_stack_unless_held_back(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="prometheus_later"):
        Stack(StackConfig(tmp_path, alertmanager=False)).start_prometheus()
