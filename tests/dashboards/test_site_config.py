"""Dashboards for a site config: its join labels, selectors and thresholds, as in its rules.

``python -m dashboards --config site.yaml`` and ``python -m exporter.signatures --config
site.yaml`` read the same file. A site that adds a ``cluster`` join label, scrapes the sidecar
under its own job and moves thresholds must get dashboards that group, filter and draw their
lines exactly as its rules do; the comparison is made between the generated files, for the
shipped defaults and for such a site. ``promtool`` must be installed (``make tools``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.dashboards import (
    DASHBOARDS,
    PanelQuery,
    VariableQuery,
    all_panels,
    collect_queries,
    collect_variables,
    load_boards,
)
from support.paths import ROOT

from dashboards import generate
from exporter.signatures.definitions import RECORD_NAME
from exporter.signatures.promql_text import split_matchers
from exporter.signatures.render import pack_recording_rules
from exporter.signatures.signals import pool_labels, recording_rules
from exporter.signatures.site import SiteConfig, parse_config

SIDECAR = 'job="inference/ibe-sidecar"'
EXPORTER = 'job=~"inference/ibe-.*"'
JOIN = ("cluster", "namespace", "pod", "instance", "job")
SITE: dict[str, Any] = {
    "join_labels": list(JOIN),
    "selectors": {"sidecar": SIDECAR, "exporter": EXPORTER},
    "signatures": {
        "InferenceQueueWaitDominatesLatency": {"queue_share_above": 0.45},
        "InferenceGPUStarvedQueueGrowing": {"utilization_below": 0.5},
        "InferenceGPUUtilizationPulsing": {"idle_sample_at_most": 0.1, "idle_share_above": 0.25},
        "InferenceGPUMemoryHeadroomLow": {"kv_cache_above": 0.85},
    },
    # a price: the cost records and their panel exist
    "cost": {"gpu_hour_price": 2.5, "currency": "EUR"},
}

# Labels a dashboard groups by beside the target's: GPU identity, label of the panel's metric.
PANEL_LABELS = {
    "gpu", "uuid", "xid", "reason", "le", "source", "collector", "engine", "metric", "process",
    "name", "driver_version", "pci_bus_id", "mig_mode", "model", "role", "stage",
    "decision", "advice", "cause",
}  # fmt: skip
# Labels the rules group by beside the target's join labels.
RULE_LABELS = {
    "gpu",
    "uuid",
    "xid",
    "reason",
    "le",
    "err_code",
    "collector",
    "engine",
    "model",
    "role",
    "pool",
    "layer",
    "cause",  # the throttle cause record's, told apart `on (cause)`
    # the SLO records' objective, the scaling advice's action and cause
    "slo",
    "advice",
}
EXPORTER_SERIES = re.compile(r"^(up|scrape_\w+|process_\w+)$")

# Panels whose dashed lines mirror an alert's thresholds, and the alerts.
THRESHOLD_ALERTS = {
    "GPU utilisation (the engine's own share) vs queue depth": ("InferenceGPUStarvedQueueGrowing",),
    "Softirq share: node and hottest core": ("InferenceSoftirqCPUHigh",),
    "Engine hottest-thread CPU": ("InferenceFrontendCPUSaturated",),
    "HBM bandwidth utilisation vs generation tokens/s": ("InferenceHBMBandwidthSaturated",),
    "KV-cache and framebuffer headroom": ("InferenceGPUMemoryHeadroomLow",),
    "Share of latency spent in the queue": ("InferenceQueueWaitDominatesLatency",),
    "Idle and saturated samples": ("InferenceGPUUtilizationPulsing",),
    "HBM bandwidth utilisation": ("InferenceHBMBandwidthSaturated",),
    "Decode roofline efficiency": ("InferenceDecodeOverheadBound",),
    "GPU-Util (device utilisation) vs SM activity": ("InferenceGPUBusySMsIdle",),
    "Pool queues: prefill and decode": ("InferencePrefillPoolShort", "InferenceDecodePoolShort"),
    "Time to first token: queue, prefill, KV transfer": ("InferenceKVTransferBound",),
    "KV-cache transfer failures": ("InferenceKVTransferFailing",),
    "NVLink use vs SM activity": ("InferenceInterconnectBound",),
    "Error budget burn rate": ("InferenceTTFTBudgetBurn", "InferenceAvailabilityBudgetBurn"),
}
# Dashed lines that are no alert's: slowdown temperature, scrape deadline, NVML call budget,
# the workload-shape advice (long prompts and outputs).
OTHER_LINES = {
    "Temperature",
    "Collector duration",
    "NVML calls per GPU per second",
    "Workload shape: tokens per request",
}


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


@dataclass(frozen=True)
class Generated:
    """Dashboards and sidecar-profile rules generated from one config."""

    boards: dict[str, dict[str, Any]]
    queries: list[PanelQuery]
    variables: list[VariableQuery]
    rule_exprs: list[str]
    alerts: dict[str, list[str]]

    @classmethod
    def read(cls, dashboards: Path, rules: Path) -> Generated:
        boards = load_boards(dashboards)
        exprs: list[str] = []
        alerts: dict[str, list[str]] = {}
        for name in ("recording_rules.yaml", "alerts.yaml"):
            for group in yaml.safe_load((rules / name).read_text())["groups"]:
                for rule in group["rules"]:
                    exprs.append(rule["expr"])
                    if "alert" in rule:
                        alerts.setdefault(rule["alert"], []).append(rule["expr"])
        return cls(boards, collect_queries(boards), collect_variables(boards), exprs, alerts)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """The site's dashboards and rules, each from its own command line."""
    tmp = tmp_path_factory.mktemp("site")
    config = tmp / "site.yaml"
    config.write_text(yaml.safe_dump(SITE))
    dashboards, rules = tmp / "dashboards", tmp / "rules"
    dashboards.mkdir()
    made = run(sys.executable, "-m", "dashboards", "--config", config, "--out", dashboards)
    assert made.returncode == 0, made.stderr
    signatures = [sys.executable, "-m", "exporter.signatures", "--config", config]
    made = run(*signatures, "--profile", "sidecar", "--out", rules)
    assert made.returncode == 0, made.stderr
    return Generated.read(dashboards, rules)


@pytest.fixture(scope="module")
def shipped() -> Generated:
    """The committed dashboards and rules (tests elsewhere keep them fresh)."""
    return Generated.read(DASHBOARDS, ROOT / "alert_rules")


@pytest.fixture(params=["shipped", "site"])
def pair(request: pytest.FixtureRequest) -> Generated:
    generated: Generated = request.getfixturevalue(request.param)
    return generated


# --- reading PromQL ---------------------------------------------------------------------------

_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")


def selectors(expr: str) -> list[tuple[str, list[str]]]:
    """(metric, matchers) of every ``metric{...}`` in an expression."""
    return [(m[1], split_matchers(m[2])) for m in _SELECTOR.finditer(expr)]


def groupings(expr: str) -> list[tuple[str, ...]]:
    """The labels of every ``by (...)`` and ``on (...)`` clause."""
    return [
        tuple(x.strip() for x in m[1].split(",") if x.strip()) for m in _GROUPING.finditer(expr)
    ]


def label(matcher: str) -> str:
    return re.split(r"=~|!~|!=|=", matcher, maxsplit=1)[0]


def fixed(matchers: list[str]) -> set[str]:
    """The matchers that are not on a template variable."""
    return {m for m in matchers if "$" not in m}


def is_sidecar_series(metric: str) -> bool:
    return metric.startswith("inference_") and ":" not in metric


def is_alerts_table(query: PanelQuery) -> bool:
    return query.expr.startswith("max by (alertname")


def threshold_lines(panel: dict[str, Any]) -> set[float]:
    """The values of a time series panel's dashed threshold lines (its own and its queries')."""
    config = panel.get("fieldConfig", {})
    lines: set[float] = set()
    defaults = config.get("defaults", {})
    if defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode") == "dashed":
        lines |= {s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None}
    for override in config.get("overrides", []):
        for prop in override["properties"]:
            if prop["id"] == "thresholds":
                lines |= {s["value"] for s in prop["value"]["steps"] if s["value"] is not None}
    return lines


def panels_by_title(boards: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["title"]: p for board in boards.values() for p in all_panels(board)}


def exporter_identity(join: tuple[str, ...]) -> tuple[str, ...]:
    """One exporter's series of a GPU meet its series of no GPU (the driver's) on these: the
    node agent files the first under the GPU's pod, the second under none."""
    return tuple(label for label in join if label not in ("namespace", "pod"))


def numbers(expr: str) -> set[float]:
    """Number literals of a PromQL expression (not digits inside names or durations)."""
    return {float(n) for n in re.findall(r"(?<![\w.:\"])\d+(?:\.\d+)?(?![\w.\"])", expr)}


# --- the site's dashboards --------------------------------------------------------------------


def test_site_queries_group_by_the_sites_join_labels(site: Generated) -> None:
    target_groupings = pool_groupings = 0
    for query in site.queries:
        if is_alerts_table(query):
            continue
        for labels in groupings(query.expr):
            if not set(labels) & set(JOIN):
                assert set(labels) <= PANEL_LABELS, f"{query}: by {labels}"
                continue
            target_groupings += 1
            if labels == exporter_identity(JOIN):
                continue
            # a target's join labels, or a pool's (those that do not name a pod), first
            head = JOIN if labels[: len(JOIN)] == JOIN else pool_labels(JOIN)
            assert labels[: len(head)] == head, f"{query}: by {labels}"
            assert set(labels[len(head) :]) <= PANEL_LABELS, f"{query}: by {labels}"
            pool_groupings += head != JOIN
    assert target_groupings > 50
    assert pool_groupings >= 5


def test_site_queries_carry_exactly_the_sites_matchers(site: Generated) -> None:
    variables = [f'{name}=~"${name}"' for name in ("cluster", "namespace", "pod")]
    checked = {"sidecar": 0, "exporter": 0, "alerts": 0, "records": 0}
    pack = pack_recording_rules(parse_config(SITE))
    records = {rule.record for rule in pack if ":" in rule.record}
    exprs = [(str(q), q.expr) for q in site.queries]
    exprs += [(f"{v.uid} / variable {v.name}", v.selector) for v in site.variables]
    for where, expr in exprs:
        for metric, matchers in selectors(expr):
            targets = [m for m in matchers if label(m) in JOIN and "$" in m]
            if metric == "inference_exporter_build_info":  # a variable, narrowed by those before
                assert targets == variables[: len(targets)], where
            elif metric.startswith("inference_pool:"):  # a pool's signal: no pod
                assert targets == variables[:2], f"{where}: {metric}{matchers}"
            else:
                assert targets == variables, f"{where}: {metric}{matchers}"
            on_targets = {m for m in fixed(matchers) if label(m) in JOIN}
            if is_sidecar_series(metric):
                assert on_targets == {SIDECAR}, f"{where}: {metric}{matchers}"
                checked["sidecar"] += 1
            elif EXPORTER_SERIES.match(metric):
                assert on_targets == {EXPORTER}, f"{where}: {metric}{matchers}"
                checked["exporter"] += 1
            elif ":" in metric:
                # a record of the site's own pack, which applied the sidecar selector already
                assert metric in records, f"{where}: {metric} is no record of the site's pack"
                assert on_targets == set(), f"{where}: {metric}{matchers}"
                checked["records"] += 1
            else:
                assert metric == "ALERTS", where
                assert on_targets == set(), f"{where}: {metric}{matchers}"
                checked["alerts"] += 1
    assert min(checked.values()) > 0, checked


def test_site_variables_are_its_target_labels(site: Generated) -> None:
    for board in site.boards.values():
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:4] == ["datasource", "cluster", "namespace", "pod"], board["uid"]
        assert set(names[4:]) <= {"model", "gpu"}, board["uid"]
        queries = {v["name"]: v["query"] for v in board["templating"]["list"]}
        build_info = "label_values(inference_exporter_build_info{"
        assert queries["cluster"] == f"{build_info}{SIDECAR}}}, cluster)"
        assert queries["namespace"] == f'{build_info}cluster=~"$cluster", {SIDECAR}}}, namespace)'
        assert queries["pod"] == (
            f'{build_info}cluster=~"$cluster", namespace=~"$namespace", {SIDECAR}}}, pod)'
        )


def test_site_legends_and_tables_name_the_cluster(site: Generated) -> None:
    legends = [
        target.get("legendFormat", "")
        for board in site.boards.values()
        for panel in all_panels(board)
        for target in panel.get("targets", [])
    ]
    named = [legend for legend in legends if "{{pod}}" in legend]
    assert len(named) > 30
    assert all("{{cluster}} {{pod}}" in legend for legend in named), named
    # a pool's legend names its cluster and model (its join labels that do not name a pod)
    pooled = [legend for legend in legends if "{{model}}" in legend and "{{pod}}" not in legend]
    assert len(pooled) >= 5, legends
    assert all("{{cluster}} {{model}}" in legend for legend in pooled), pooled
    panels = panels_by_title(site.boards)
    for title, first in (("Signature alerts now (pending and firing)", 4), ("GPUs", 0)):
        (organize,) = panels[title]["transformations"]
        order = organize["options"]["indexByName"]
        columns = sorted(order, key=order.__getitem__)
        assert columns[first : first + 4] == ["cluster", "namespace", "pod", "instance"], title


def test_site_threshold_lines_moved(site: Generated, shipped: Generated) -> None:
    moved = {
        "Share of latency spent in the queue": ({0.3}, {0.45}),
        "GPU utilisation (the engine's own share) vs queue depth": ({0.6}, {0.5}),
        "Idle and saturated samples": ({0.3, 0.2}, {0.25, 0.2}),
        "KV-cache and framebuffer headroom": ({0.9, 0.97}, {0.85, 0.97}),
    }
    before, after = panels_by_title(shipped.boards), panels_by_title(site.boards)
    for title, (old, new) in moved.items():
        assert threshold_lines(before[title]) == old, title
        assert threshold_lines(after[title]) == new, title
    assert "above 45 %" in after["Share of latency spent in the queue"]["description"]
    # the idle share is the site's signal, whose bucket moved with idle_sample_at_most
    idle = after["Idle and saturated samples"]["targets"][0]["expr"]
    assert idle.startswith("inference:gpu_utilization_idle_samples:ratio10m{"), idle
    (rule,) = [r for r in recording_rules(parse_config(SITE)) if idle.startswith(r.record + "{")]
    assert 'le="0.1"' in rule.expr and 'le="0.05"' not in rule.expr


def test_site_queries_parse_with_promtool(site: Generated, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run `make tools`"
    every = {name: ".*" for name in ("cluster", "namespace", "pod", "model", "gpu")}
    exprs = [q.render(every) for q in site.queries]
    exprs += [PanelQuery("", "", "", v.selector, False).render(every) for v in site.variables]
    rules = [{"record": f"dashboard:site_{i}:expr", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "site-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "site", "rules": rules}]}))
    result = run(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_a_site_joining_on_instance_alone() -> None:
    files = generate(parse_config({"join_labels": ["instance"]}))
    boards = {name: yaml.safe_load(text) for name, text in files.items()}
    for board in boards.values():
        names = [v["name"] for v in board["templating"]["list"]]
        assert names[:2] == ["datasource", "instance"], board["uid"]
        assert not {"namespace", "pod"} & set(names), board["uid"]
    for query in collect_queries(boards):
        assert "namespace" not in query.expr and "pod" not in query.expr, query
        for metric, matchers in selectors(query.expr):
            if not metric.startswith("inference_pool:"):  # no pool labels: every target's
                assert 'instance=~"$instance"' in matchers, f"{query}: {metric}"
    legends = {
        target.get("legendFormat", "")
        for board in boards.values()
        for panel in all_panels(board)
        for target in panel.get("targets", [])
    }
    assert "{{instance}} GPU {{gpu}}" in legends
    assert not any("{{pod}}" in legend for legend in legends)


def test_the_shipped_defaults_give_the_committed_json() -> None:
    committed = {path.name: path.read_text(encoding="utf-8") for path in DASHBOARDS.glob("*.json")}
    assert generate(SiteConfig()) == committed
    # a site's generation in the same process leaves the defaults as they were
    assert generate(parse_config(SITE)) != committed
    assert generate() == committed


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "join_labels: [datasource, job]\n",
            "join_labels[0]: 'datasource' is the name of the dashboards' data source variable",
        ),
        ("join_labels: [pod, gpu]\n", "join_labels[1]: 'gpu' is a label the rules use themselves"),
        ("selectors: {sidecar: cluster=prod}\n", "selectors.sidecar: cannot read a matcher"),
        ("signatures: {InferenceGPUUnderutilized: {utilization_below: 2}}\n", "must be a ratio"),
        ("join_labels: [pod\n", "not valid YAML"),
    ],
)
def test_a_bad_config_exits_2_with_one_line(config: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(config)
    result = run(sys.executable, "-m", "dashboards", "--config", path, "--out", tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"python -m dashboards: error: {path}: "), result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not list(tmp_path.glob("*.json"))


# --- the same config, rules and dashboards ----------------------------------------------------


def rules_join_labels(generated: Generated) -> tuple[str, ...]:
    """The target labels the rules group and match by, read from the rules alone."""
    found = {
        tuple(x for x in labels if x not in RULE_LABELS)
        for expr in generated.rule_exprs
        for labels in groupings(expr)
    }
    found.discard(())
    # The pool records group by the join labels that do not name a pod (sources.pool_labels),
    # a gateway's pool by those that name neither a pod nor a job (site.GatewayJoin).
    labels = max(found, key=len)
    pool = pool_labels(labels)
    gateway = tuple(label for label in pool if label != "job")
    assert found - {pool, gateway} == {labels}, found
    return labels


def test_dashboards_group_by_the_rules_join_labels(pair: Generated) -> None:
    join = rules_join_labels(pair)
    for query in pair.queries:
        for labels in groupings(query.expr):
            if is_alerts_table(query):
                # the alerts carry the rules' join labels; the table shows all but job
                assert set(join) - {"job"} <= set(labels), query
            elif labels == exporter_identity(join):
                continue
            elif set(labels) & set(join):
                # a target's join labels first, or a pool's as the pool records group them
                head = join if labels[: len(join)] == join else pool_labels(join)
                assert labels[: len(head)] == head, f"{query}: by {labels}"
    targets = [v for v in pair.variables if v.metric == "inference_exporter_build_info"]
    assert targets
    for variable in targets:
        assert variable.label in join, f"{variable.uid}: ${variable.name}"


def test_dashboards_select_the_rules_series(pair: Generated) -> None:
    """Every selector of the rules on the sidecar's series carries the site's sidecar matchers;
    each dashboard selector on those series carries the same, and no other on a target label.
    ``up`` and the other series Prometheus makes per target: the InferenceExporterDown ones."""
    join = rules_join_labels(pair)
    sidecar: set[str] | None = None
    for expr in pair.rule_exprs:
        for metric, matchers in selectors(expr):
            if is_sidecar_series(metric):
                sidecar = set(matchers) if sidecar is None else sidecar & set(matchers)
    assert sidecar is not None
    ups = {
        frozenset(matchers)
        for expr in pair.alerts["InferenceExporterDown"]
        for metric, matchers in selectors(expr)
        if metric == "up"
    }
    (exporter,) = ups
    for query in pair.queries:
        for metric, matchers in selectors(query.expr):
            own = fixed(matchers)
            if is_sidecar_series(metric):
                assert sidecar <= own, f"{query}: {metric}{matchers}"
                assert not {label(m) for m in own - sidecar} & set(join), f"{query}: {metric}"
            elif EXPORTER_SERIES.match(metric):
                assert own == exporter, f"{query}: {metric}{matchers}"


def test_threshold_lines_are_the_alerts_thresholds(pair: Generated) -> None:
    panels = panels_by_title(pair.boards)
    with_lines = {
        title
        for title, panel in panels.items()
        if panel["type"] == "timeseries" and threshold_lines(panel)
    }
    assert with_lines == THRESHOLD_ALERTS.keys() | OTHER_LINES
    for title, alerts in THRESHOLD_ALERTS.items():
        in_alerts = {n for alert in alerts for expr in pair.alerts[alert] for n in numbers(expr)}
        assert threshold_lines(panels[title]) <= in_alerts, title
    # The pulsing alert's bucket bounds are counted in its signals, never again in a panel.
    samples = "inference_gpu_utilization_samples_bucket"
    bounds = {
        m
        for expr in pair.rule_exprs
        for metric, matchers in selectors(expr)
        if metric == samples
        for m in matchers
        if m.startswith("le=")
    }
    assert bounds
    for query in pair.queries:
        assert not any(bound in query.expr for bound in bounds), query


def _records(expr: str) -> set[str]:
    return set(RECORD_NAME.findall(expr))


def test_a_threshold_line_is_drawn_on_what_its_alert_reads(pair: Generated) -> None:
    """Every line of an alert's threshold sits on a query of a signal that alert reads: on the
    query that carries it, or (a line for the whole panel) on one of the panel's queries."""
    panels = panels_by_title(pair.boards)
    for title, alerts in THRESHOLD_ALERTS.items():
        read = {name for alert in alerts for expr in pair.alerts[alert] for name in _records(expr)}
        panel = panels[title]
        by_ref = {t["refId"]: t["expr"] for t in panel["targets"]}
        carriers = [
            override["matcher"]["options"]
            for override in panel.get("fieldConfig", {}).get("overrides", [])
            if any(prop["id"] == "thresholds" for prop in override["properties"])
        ]
        if not carriers:  # the panel's own lines: one of its queries reads what the alert reads
            carriers = [ref for ref, expr in by_ref.items() if _records(expr) & read][:1]
        assert carriers, f"{title}: no query reads what {alerts} read"
        for ref in carriers:
            assert _records(by_ref[ref]) & read, f"{title} / {ref}: {by_ref[ref]}"


def test_the_cost_panel_is_the_priced_sites_own(site: Generated, shipped: Generated) -> None:
    """A site that prices a GPU-hour gets the cost per million tokens in its currency, on the
    cost records of its pack; the shipped dashboards (no price, no cost records) have none."""
    title = "Cost per million tokens (EUR)"
    panel = panels_by_title(site.boards)[title]
    assert panel["fieldConfig"]["defaults"]["unit"] == "currencyEUR"
    read = {name for t in panel["targets"] for name in _records(t["expr"])}
    assert read == {
        "inference:cost_per_million_generated_tokens:ratio5m",
        "inference:cost_per_million_prompt_tokens:ratio5m",
        "inference:gpu_cost_per_hour:mean5m",
    }
    # the pack's other rules read them (the pools' cost reads the pods', theirs the GPUs')
    assert read <= {name for expr in site.rule_exprs for name in _records(expr)}
    assert not any(t.startswith("Cost per million tokens") for t in panels_by_title(shipped.boards))
    assert "Energy per token" in panels_by_title(shipped.boards)
