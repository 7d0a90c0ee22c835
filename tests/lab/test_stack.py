"""The stack's generated configurations pass the real tools' checks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT

from exporter.lab.stack import (
    PREFILL_TARGET_LABELS,
    AmTiming,
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
    for path in write_rules(tmp_path):
        assert path.read_text() == (ROOT / "alert_rules" / "fast" / path.name).read_text()


def test_rules_take_a_site_config(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text(
        "windows:\n  baseline: 20m\nsignatures:\n  InferenceHBMBandwidthSaturated:\n    for: 5m\n"
    )
    alerts = write_rules(tmp_path, config=config)[1].read_text()
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


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus_config("127.0.0.1:10960", "127.0.0.1:9093", rules, 2.0))
    out = subprocess.run(
        [tool("promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_disaggregated_pair_is_scraped_as_two_pods(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    path = tmp_path / "prometheus.yml"
    prefill = ("127.0.0.1:10961", dict(PREFILL_TARGET_LABELS))
    path.write_text(prometheus_config("127.0.0.1:10960", None, rules, 2.0, more=[prefill]))
    out = subprocess.run(
        [tool("promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (job,) = yaml.safe_load(path.read_text())["scrape_configs"]
    pods = {c["targets"][0]: c["labels"]["pod"] for c in job["static_configs"]}
    assert pods == {"127.0.0.1:10960": "reference-0", "127.0.0.1:10961": "reference-prefill-0"}
