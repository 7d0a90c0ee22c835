"""The committed dashboards: generated from the code, valid for the SDK, sane PromQL, known metrics.

``promtool`` must be installed (``make tools``); these tests never skip without it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from exporter.metrics import BY_NAME
from exporter.signatures.definitions import FAMILIES

ROOT = Path(__file__).resolve().parent.parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "alert_rules"

EXPECTED = {
    "inference-bottlenecks.json": ("ibe-inference-bottlenecks", "Inference bottlenecks"),
    "gpu-detail.json": ("ibe-gpu-detail", "GPU detail"),
    "exporter-health.json": ("ibe-exporter-health", "Exporter health"),
}

# The panels each dashboard must show, by title: the contract of what on-call finds there.
REQUIRED_PANELS = {
    "ibe-inference-bottlenecks": {
        "GPU utilisation (the engine's own share) vs queue depth",
        "Tokenizer latency vs inter-token latency",
        "Softirq share: node and hottest core",
        "Engine hottest-thread CPU",
        "HBM bandwidth utilisation vs generation tokens/s",
        "KV-cache and framebuffer headroom",
        "Request latency: queue, prefill, decode vs end-to-end",
        "Driver utilisation samples over time",
        "Decode roofline efficiency",
        "Decode step: HBM floor vs observed",
        "Latency budget: queue, prefill, KV transfer, decode, host",
        "Prefill compute efficiency",
        "Pool sizes: engines per role",
        "Pool queue by stage",
        "KV-cache transfer time",
        "KV-cache transfer bandwidth",
        "KV-cache transfer failures",
        "Pool queues: prefill and decode",
        "Time to first token: queue, prefill, KV transfer",
        "GPU-Util (device utilisation) vs SM activity",
    },
    "ibe-gpu-detail": {
        "GPU utilisation per GPU: the device and the engine's own share",
        "SM active and occupancy",
        "Tensor core activity",
        "HBM bandwidth utilisation",
        "Memory controller busy (not bandwidth)",
        "PCIe throughput",
        "Board power",
        "Energy in the time range",
        "SM and memory clocks",
        "Clock events (throttle reasons)",
        "Temperature",
        "Xid errors",
    },
    "ibe-exporter-health": {
        "Collector success",
        "Collector duration",
        "Engine metrics readable",
        "Age of the engine's metrics",
        "Poll and probe failures",
        "Scrape duration and series",
        "Sidecar memory (RSS)",
        "Sidecar CPU",
    },
}

# Series that are not in the exporter's catalogue but that every Prometheus has for a target
# (up and the scrape_* series it records itself), the process_* series prometheus_client adds
# to the exporter, and ALERTS, written by Prometheus for the rule pack's alerts.
PROMETHEUS_SERIES = {"ALERTS", "up", "scrape_duration_seconds", "scrape_samples_scraped"}

_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}  # fmt: skip


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


# --- generation -------------------------------------------------------------------------------


def _json_files(directory: Path) -> dict[str, str]:
    """Relative path -> text of every dashboard: the sidecar profile's at the top, each other
    profile's in its directory."""
    return {
        path.relative_to(directory).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted([*directory.glob("*.json"), *directory.glob("*/*.json")])
    }


def test_committed_json_equals_a_fresh_generation(tmp_path: Path) -> None:
    result = run(sys.executable, "-m", "dashboards", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    fresh = _json_files(tmp_path)
    committed = _json_files(DASHBOARDS)
    assert sorted(fresh) == sorted(
        f"{profile}{name}" for profile in ("", "dcgm/", "fast/", "node/") for name in EXPECTED
    )
    assert sorted(committed) == sorted(fresh), "stale or missing JSON under dashboards/"
    for name, text in fresh.items():
        assert committed[name] == text, f"{name} differs: run `python -m dashboards`"
    check = run(sys.executable, "-m", "dashboards", "--check")
    assert check.returncode == 0, check.stderr


def test_check_exits_1_when_a_file_differs(tmp_path: Path) -> None:
    for path in DASHBOARDS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    drifted = tmp_path / "gpu-detail.json"
    drifted.write_text(drifted.read_text().replace("GPU detail", "GPU details", 1))
    result = run(sys.executable, "-m", "dashboards", "--check", "--out", tmp_path)
    assert result.returncode == 1
    assert "gpu-detail.json" in result.stderr
    assert "python -m dashboards" in result.stderr
    # --check writes nothing
    assert "GPU details" in drifted.read_text()


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        out.mkdir()
        assert run(sys.executable, "-m", "dashboards", "--out", out).returncode == 0
    assert _json_files(first) == _json_files(second)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_round_trips_through_the_sdk_models(name: str) -> None:
    register_default_plugins()
    text = (DASHBOARDS / name).read_text(encoding="utf-8")
    data = json.loads(text)
    model = Dashboard.from_json(data)
    again = json.dumps(model, cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False)
    # Nothing lost or added by the typed models, byte for byte in the committed format.
    assert again + "\n" == text


# --- structure --------------------------------------------------------------------------------


def test_uids_titles_and_tags(boards: dict[str, dict[str, Any]]) -> None:
    assert sorted(boards) == sorted(EXPECTED)
    for name, (uid, title) in EXPECTED.items():
        board = boards[name]
        assert (board["uid"], board["title"]) == (uid, title)
        assert "inference-bottleneck-exporter" in board["tags"]
        assert board["description"]
        assert board["schemaVersion"] >= 39  # Grafana 11


def test_issue_panels_are_present(boards: dict[str, dict[str, Any]]) -> None:
    for board in boards.values():
        titles = {panel["title"] for panel in board["panels"]}
        missing = REQUIRED_PANELS[board["uid"]] - titles
        assert not missing, f"{board['uid']} lacks {sorted(missing)}"


def test_one_stat_per_signature_family(boards: dict[str, dict[str, Any]]) -> None:
    board = boards["inference-bottlenecks.json"]
    panels = board["panels"]
    assert (panels[0]["type"], panels[0]["title"]) == ("row", "Active signatures")
    stats = [panel for panel in panels if panel["type"] == "stat"]
    families = [re.search(r'signature="(\w+)"', p["targets"][0]["expr"]) for p in stats]
    assert [m.group(1) if m else None for m in families] == list(FAMILIES)
    # ... and every family the shipped alerts carry has its stat
    alerts = yaml.safe_load((RULES / "alerts.yaml").read_text())
    labelled = {
        rule["labels"]["signature"]
        for group in alerts["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert labelled <= set(FAMILIES)
    for stat in stats:
        assert "ALERTS{" in stat["targets"][0]["expr"]
        assert "or vector(0)" in stat["targets"][0]["expr"]


def test_panels_have_ids_descriptions_datasource_and_fit_the_grid(
    boards: dict[str, dict[str, Any]],
) -> None:
    for board in boards.values():
        ids = [panel["id"] for panel in board["panels"]]
        assert ids == list(range(1, len(ids) + 1)), f"{board['uid']}: ids not 1..n"
        cells: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            where = f"{board['uid']} / {panel['title']}"
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, where
            area = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not area & cells, f"{where} overlaps another panel"
            cells |= area
            if panel["type"] == "row":
                assert panel["collapsed"] is False, where
                continue
            # what it shows, and what bad looks like
            assert len(panel["description"]) > 80, where
            assert "Bad" in panel["description"], where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel["targets"], where
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"], where
                assert target["refId"], where


def test_variables(boards: dict[str, dict[str, Any]], panel_queries: list[Any]) -> None:
    for board in boards.values():
        exprs = [query.expr for query in panel_queries if query.uid == board["uid"]]
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert {"namespace", "pod"} <= set(variables)
        for name, variable in variables.items():
            if name == "datasource":
                continue
            # All must also match targets without the label (static scrape configs)
            assert variable["includeAll"] is True and variable["allValue"] == ".*", name
            assert variable["multi"] is True, name
            assert variable["datasource"]["uid"] == "${datasource}", name
            used = any(f"${name}" in expr for expr in exprs)
            assert used, f"{board['uid']}: variable {name} is not used by any query"
    first = [v["name"] for v in boards["inference-bottlenecks.json"]["templating"]["list"]]
    assert first == ["datasource", "namespace", "pod", "model", "gpu"]


def test_every_selector_filters_by_namespace_and_pod_with_regex_matchers(
    panel_queries: list[Any],
) -> None:
    for query in panel_queries:
        selectors = re.findall(r"[a-zA-Z_:][\w:]*\{[^}]*\}", query.expr)
        assert selectors, query
        for selector in selectors:
            assert 'namespace=~"$namespace"' in selector, f"{query}: {selector}"
            if not selector.startswith("inference_pool:"):  # a pool's signal names no pod
                assert 'pod=~"$pod"' in selector, f"{query}: {selector}"
        for name in ("namespace", "pod", "model", "gpu"):
            assert f'{name}="${name}"' not in query.expr, f"{query}: use =~ for ${name}"


def test_ranges_use_grafana_interval_macros(panel_queries: list[Any]) -> None:
    for query in panel_queries:
        for window in re.findall(r"\[([^\]]*)\]", query.expr):
            assert window in ("$__rate_interval", "$__range"), f"{query}: [{window}]"
        rendered = query.render({"namespace": ".*", "pod": ".*", "model": ".*", "gpu": ".*"})
        assert "$" not in rendered, f"{query}: unknown macro or variable"


# --- PromQL -----------------------------------------------------------------------------------


def test_every_query_parses_with_promtool(
    panel_queries: list[Any],
    variable_queries: list[Any],
    variants: dict[str, dict[str, str]],
    tmp_path: Path,
) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run `make tools`"
    groups = []
    names: dict[str, str] = {}
    for variant, values in variants.items():
        rules = []
        for index, query in enumerate(panel_queries):
            record = f"dashboard:{variant.replace('-', '_')}_{index}:expr"
            names[record] = str(query)
            rules.append({"record": record, "expr": query.render(values)})
        for index, variable in enumerate(variable_queries):
            record = f"dashboard:{variant.replace('-', '_')}_variable_{index}:expr"
            names[record] = f"{variable.uid} / variable {variable.name}"
            rendered = variable.selector.replace("$namespace", values["namespace"]).replace(
                "$pod", values["pod"]
            )
            rules.append({"record": record, "expr": rendered})
        groups.append({"name": f"dashboards-{variant}", "rules": rules})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = run(promtool, "check", "rules", path)
    detail = "\n".join(f"{r}: {n}" for r, n in names.items() if r in result.stdout + result.stderr)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{detail}"
    count = len(variants) * (len(panel_queries) + len(variable_queries))
    assert f"SUCCESS: {count} rules found" in result.stdout


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (names of series selectors, not functions/labels)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range windows
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"\d+\w*", name):
            continue
        names.add(name)
    return names


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (namespace, le) (rate(inference_gpu_utilization_samples_bucket{le="0.05", pod=~"a|b"}[1m]))\n'
        "/ ignoring (le) group_left\n"
        "clamp_min(inference:gpu_utilization:mean5m offset 5m, 0) or vector(0) > bool 1e3"
        ' and time() - up{job="x{y}"}'
    )
    assert metric_names(expr) == {
        "inference_gpu_utilization_samples_bucket",
        "inference:gpu_utilization:mean5m",
        "up",
    }


def _known(name: str, records: set[str]) -> bool:
    if name in BY_NAME or name in records or name in PROMETHEUS_SERIES:
        return True
    if name.startswith("process_"):
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and base in BY_NAME and BY_NAME[base].type == "histogram":
            return True
    return False


def test_every_metric_exists(panel_queries: list[Any], variable_queries: list[Any]) -> None:
    rules = yaml.safe_load((RULES / "recording_rules.yaml").read_text())
    records = {
        rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule
    }
    used: dict[str, str] = {}
    for query in panel_queries:
        for name in metric_names(query.expr):
            used.setdefault(name, str(query))
    for variable in variable_queries:
        used.setdefault(variable.metric, f"{variable.uid} / variable {variable.name}")
    unknown = {name: where for name, where in used.items() if not _known(name, records)}
    assert not unknown, f"metrics neither in exporter.metrics nor recording rules: {unknown}"
    # and the catalogue's core metrics are all on some dashboard, as they are or through the
    # signals that read them
    exprs = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    read = set(used) | {m for name in used if name in exprs for m in metric_names(exprs[name])}
    assert {
        "inference_gpu_busy_seconds_total",
        "inference_queue_depth",
        "inference_gpu_utilization_samples_bucket",
        "inference_cpu_softirq_hottest_core_ratio",
        "inference_engine_hottest_thread_cpu_ratio",
        "inference_gpu_dram_active_seconds_total",
        "inference_scrape_collector_success",
    } <= read
