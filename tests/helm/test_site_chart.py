"""A site's chart: ``build-tools/chart.py --config site.yaml --out DIR`` (``make chart SITE=``).

Its PrometheusRule, AlertmanagerConfig and dashboard ConfigMaps must be what the generators
make of the same site config (``python -m exporter.signatures --config``, ``python -m
dashboards --config``), rendered by the Helm SDK and valid against the operator's CRDs; the
shipped defaults must give the repository's chart itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.chart import CHART, ROOT, chart_tool, of_kind, render

SIDECAR = 'job="inference/ibe-sidecar"'
SITE: dict[str, Any] = {
    "join_labels": ["cluster", "namespace", "pod", "instance", "job"],
    "selectors": {"sidecar": SIDECAR, "exporter": 'job=~"inference/ibe-.*"'},
    "signatures": {"InferenceQueueWaitDominatesLatency": {"queue_share_above": 0.45}},
}
MONITORING = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1alpha1")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def chart_py(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, ROOT / "build-tools" / "chart.py", *args)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The site's config, its chart, and what the two generators make of it on their own."""
    tmp = tmp_path_factory.mktemp("site")
    config = tmp / "site.yaml"
    config.write_text(yaml.safe_dump(SITE))
    made = chart_py("--config", config, "--out", tmp / "chart")
    assert made.returncode == 0, made.stderr
    (tmp / "dashboards").mkdir()
    made = run(sys.executable, "-m", "dashboards", "--config", config, "--out", tmp / "dashboards")
    assert made.returncode == 0, made.stderr
    for profile in ("sidecar", "dcgm", "fast"):
        signatures = [sys.executable, "-m", "exporter.signatures", "--config", config]
        made = run(*signatures, "--profile", profile, "--out", tmp / "rules" / profile)
        assert made.returncode == 0, made.stderr
    return {"config": config, "chart": tmp / "chart", "root": tmp}


def groups(directory: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for name in ("alerts.yaml", "recording_rules.yaml"):
        found += yaml.safe_load((directory / name).read_text())["groups"]
    return found


@pytest.mark.parametrize("profile", ["sidecar", "dcgm", "fast"])
def test_prometheus_rule_is_the_sites_rules(site: dict[str, Path], profile: str) -> None:
    (rule,) = of_kind(
        render({"prometheusRule": {"profile": profile}}, chart=site["chart"]), "PrometheusRule"
    )
    assert rule["spec"]["groups"] == groups(site["root"] / "rules" / profile)
    exprs = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert any("by (cluster, namespace, pod, instance, job)" in expr for expr in exprs)
    (shipped,) = of_kind(render({"prometheusRule": {"profile": profile}}), "PrometheusRule")
    assert rule["spec"]["groups"] != shipped["spec"]["groups"]


def test_dashboard_configmaps_are_the_sites_dashboards(site: dict[str, Path]) -> None:
    # the chart's default mode, node: the site's node-profile dashboards
    generated = {
        p.name: p.read_text() for p in sorted((site["root"] / "dashboards" / "node").glob("*.json"))
    }
    maps = [
        m
        for m in of_kind(render(chart=site["chart"]), "ConfigMap")
        if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    rendered = {name: text for cm in maps for name, text in cm["data"].items()}
    assert rendered == generated
    for name, text in rendered.items():
        board = json.loads(text)
        variables = [v["name"] for v in board["templating"]["list"]]
        assert variables[:4] == ["datasource", "cluster", "namespace", "pod"], name
        assert SIDECAR in text.replace('\\"', '"'), name
    shipped = (CHART / "files" / "dashboards" / "node" / "inference-bottlenecks.json").read_text()
    assert rendered["inference-bottlenecks.json"] != shipped


def test_rules_and_dashboards_of_the_chart_share_the_site_config(site: dict[str, Path]) -> None:
    """The queue-share alert and the dashboard's line on it both moved to 0.45."""
    objects = render(chart=site["chart"])
    (rule,) = of_kind(objects, "PrometheusRule")
    (alert,) = [
        r
        for group in rule["spec"]["groups"]
        for r in group["rules"]
        if r.get("alert") == "InferenceQueueWaitDominatesLatency"
    ]
    assert "> 0.45" in alert["expr"]
    (bottlenecks,) = [
        json.loads(text)
        for cm in of_kind(objects, "ConfigMap")
        for name, text in cm["data"].items()
        if name == "inference-bottlenecks.json"
    ]
    (panel,) = [
        p for p in bottlenecks["panels"] if p["title"] == "Share of latency spent in the queue"
    ]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.45]


def test_the_sites_chart_validates(
    site: dict[str, Path], crd_validators: dict[tuple[str, str], Any]
) -> None:
    values = {
        "alertmanagerConfig": {"enabled": True, "pagerduty": {"routingKeySecret": {"name": "pd"}}}
    }
    objects = render(values, chart=site["chart"])
    kinds = {obj["kind"] for obj in objects}
    assert {"PrometheusRule", "AlertmanagerConfig", "ConfigMap", "PodMonitor"} <= kinds
    for obj in objects:
        if obj["apiVersion"] in MONITORING:
            key = (obj["apiVersion"], obj["kind"])
            errors = sorted(crd_validators[key].iter_errors(obj), key=str)
            assert not errors, f"{key}: {errors[0].message}"
    lint = chart_py("--config", site["config"], "--out", site["chart"], "--check")
    assert lint.returncode == 0, lint.stderr


def test_the_shipped_defaults_give_the_repositorys_chart(tmp_path: Path) -> None:
    empty = tmp_path / "site.yaml"
    empty.write_text("")
    repository = {
        path.relative_to(CHART).as_posix(): path.read_bytes()
        for path in sorted(CHART.rglob("*"))
        if path.is_file()
    }
    assert chart_tool().site_chart(empty) == repository


def test_check_names_what_differs_and_a_rerun_refreshes(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text(yaml.safe_dump(SITE))
    out = tmp_path / "chart"
    assert chart_py("--config", config, "--out", out).returncode == 0
    board = out / "files" / "dashboards" / "gpu-detail.json"
    board.write_text(board.read_text().replace("GPU detail", "GPU details", 1))
    (out / "files" / "dashboards" / "old.json").write_text("{}\n")
    check = chart_py("--config", config, "--out", out, "--check")
    assert check.returncode == 1
    assert f"{out}/files/dashboards/gpu-detail.json: differs from the site config's" in check.stderr
    assert f"{out}/files/dashboards/old.json: not part of the chart" in check.stderr
    assert "GPU details" in board.read_text()  # --check writes nothing
    # another threshold: the same chart directory, refreshed
    config.write_text(yaml.safe_dump({**SITE, "signatures": {}}))
    assert chart_py("--config", config, "--out", out).returncode == 0
    assert chart_py("--config", config, "--out", out, "--check").returncode == 0
    assert not (out / "files" / "dashboards" / "old.json").exists()
    alerts = (out / "files" / "alert_rules" / "alerts.yaml").read_text()
    assert "> 0.45" not in alerts and "> 0.3" in alerts


@pytest.mark.parametrize(
    ("config", "out", "message"),
    [
        (
            "join_labels: [pod, gpu]\n",
            "new",
            "chart.py: error: {config}: join_labels[1]: 'gpu' is a label the rules use themselves",
        ),
        (
            # valid for the rules, not for the dashboards
            "join_labels: [datasource, namespace, pod]\n",
            "new",
            "chart.py: error: {config}: join_labels[0]: 'datasource' is the name of the "
            "dashboards' data source variable",
        ),
        (
            # the dcgm profile joins on namespace and pod, which these targets lack
            "join_labels: [instance]\n",
            "new",
            "chart.py: error: {config}: dcgm.join: the dcgm profile joins on 'namespace'",
        ),
        ("", "unrelated", "chart.py: error: --out {out}: not empty and holds no"),
        ("", "repository", "chart.py: error: --out {out}: the repository's chart follows"),
    ],
)
def test_a_bad_config_or_directory_exits_2_with_one_line(
    config: str, out: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(config)
    target = {"new": tmp_path / "chart", "unrelated": tmp_path, "repository": CHART}[out]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = chart_py("--config", path, "--out", target)
    assert result.returncode == 2
    assert result.stderr.startswith(message.format(config=path, out=target)), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert chart_tool().stale() == []


def test_config_and_out_go_together(tmp_path: Path) -> None:
    result = chart_py("--config", tmp_path / "site.yaml")
    assert (result.returncode, result.stderr) == (
        2,
        "chart.py: error: --config and --out go together\n",
    )
