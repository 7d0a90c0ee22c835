"""The pack on a second engine: vmalert evaluating it against VictoriaMetrics (MetricsQL).

The input series of the promtool unit tests of the ``sidecar`` profile (every signature's
firing case and near misses, the meta alerts, the cold starts) are loaded into a real
VictoriaMetrics, one test group after another with two hours between them (longer than any
window or offset of the pack), and vmalert's replay mode evaluates the pack over that past time
range, writing the records and ``ALERTS`` back. Then every expectation promtool checks against
Prometheus is checked against what vmalert produced: the alerts firing at each ``eval_time``
(labels exactly; annotations are Prometheus templates vmalert does not keep in replay) and the
``ALERTS`` expressions of the cold-start tests (not even pending while a window fills).

vmalert replays group by group and rule by rule; a rule that reads another rule's output
needs it stored first. The pack is replayed in dependency levels (records over raw series,
records over records, the alerts), each level one replay, VictoriaMetrics flushed in between:
the same order Prometheus evaluates a group in, without vmalert's fixed pause after every rule.
The alerts are replayed test group by test group, each from a fresh state as in promtool.

Where MetricsQL differs from PromQL on this data, the difference is asserted here and written
in docs/deployment.md ("Two engines"); the alerts do not differ.

The ``node`` profile is replayed the same way over its own promtool tests
(``tests/promtool/node/``: two pods on one node, only one starved; a time-sliced GPU's contended
pod) and the sidecar profile's signature and baseline groups in the node layout
(:mod:`support.node_layout`, the groups ``test_node_profile.py`` runs with promtool).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.node_layout import node_layout_groups
from support.paths import ROOT
from support.victoria import (
    VictoriaMetrics,
    binary,
    expand,
    replay,
    series_lines,
    start_victoria_metrics,
)

from exporter.config import parse_duration
from exporter.signatures.definitions import RECORD_NAME

RULES = ROOT / "alert_rules"
# The sidecar profile's groups replayed against the node profile in the node layout.
NODE_LAYOUT = ("signatures.yaml", "baseline.yaml")
TESTS = [
    ROOT / "tests" / "promtool" / "sidecar" / name
    for name in (
        "signatures.yaml",
        "meta.yaml",
        "baseline.yaml",
        "shared.yaml",
        "pools.yaml",
        "split.yaml",
        "stalls.yaml",
        "gateway.yaml",
        "slo.yaml",
        "advice.yaml",
    )
]
COLD_START = ROOT / "tests" / "promtool" / "sidecar" / "coldstart.yaml"
# The replay imports samples a minute apart and evaluates every minute: a failed scrape's
# staleness markers, 30 s apart (missed_scrape.yaml), are promtool's alone.
MISSED_SCRAPE = "missed_scrape.yaml"
NODE_TESTS = sorted(
    path
    for path in (ROOT / "tests" / "promtool" / "node").glob("*.yaml")
    if path.name != MISSED_SCRAPE
)
# Between two test groups: longer than any window, offset (the 1h baseline) and lookback.
GAP_S = 2 * 3600
HOUR = 3600


@dataclass
class Slot:
    """One promtool test group placed at ``start`` (Unix seconds) in VictoriaMetrics."""

    source: str
    index: int
    group: dict[str, Any]
    start: int
    length: int

    @property
    def name(self) -> str:
        return f"{self.source}#{self.index}"


def _seconds(text: str) -> int:
    return round(parse_duration(str(text)))


def _test_groups(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """A promtool test file's groups, named by the file."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert data.get("evaluation_interval", "1m") == "1m", path
    return path.name, data["tests"]


def _slots(sources: list[tuple[str, list[dict[str, Any]]]], base: int) -> list[Slot]:
    out: list[Slot] = []
    start = base
    for source, groups in sources:
        for index, group in enumerate(groups):
            interval = _seconds(group.get("interval", "1m"))
            assert interval == 60, f"{source}#{index}: the replay evaluates every minute"
            samples = max(len(expand(s["values"])) for s in group["input_series"])
            length = samples * interval
            out.append(Slot(source, index, group, start, length))
            start += length + GAP_S
    return out


def _levels(pack: Path) -> list[list[dict[str, Any]]]:
    """The pack's groups split by dependency level: records over raw series, records over
    those, ..., then the alerts."""
    records = yaml.safe_load((pack / "recording_rules.yaml").read_text())["groups"]
    alerts = yaml.safe_load((pack / "alerts.yaml").read_text())["groups"]
    level: dict[str, int] = {}
    by_level: dict[int, list[dict[str, Any]]] = {}
    for group in records:
        for rule in group["rules"]:
            used = [name for name in RECORD_NAME.findall(rule["expr"]) if name in level]
            own = 1 + max((level[name] for name in used), default=0)
            by_level.setdefault(own, []).append(rule)
            # A record several rules write (one per signature) is read once all of them ran.
            level[rule["record"]] = max(level.get(rule["record"], 0), own)
    out = [
        [{"name": f"inference.records.{n}", "rules": rules}]
        for n, rules in sorted(by_level.items())
    ]
    # Replay mode keeps no annotations and refuses their `query` calls: the expressions, `for`
    # and labels are replayed (test_vmalert_loads_the_pack checks the templates).
    for group in alerts:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    out.append(alerts)
    return out


def _replay(
    workdir: Path, pack: Path, sources: list[tuple[str, list[dict[str, Any]]]]
) -> Iterator[tuple[VictoriaMetrics, list[Slot]]]:
    """VictoriaMetrics with ``sources``' series and ``pack`` replayed over them."""
    # On the hour (evaluation steps on whole minutes), the last group ending an hour or more
    # ago: VictoriaMetrics refuses samples more than two days ahead, and the groups with their
    # gaps span days.
    laid = _slots(sources, 0)
    span = laid[-1].start + laid[-1].length
    base = (int(time.time()) - span - HOUR) // HOUR * HOUR
    slots = _slots(sources, base)
    vm = start_victoria_metrics(workdir)
    try:
        lines: list[str] = []
        for slot in slots:
            for item in slot.group["input_series"]:
                lines += series_lines(item["series"], item["values"], slot.start * 1000, 60)
        vm.import_text(lines)
        vm.flush()
        end = slots[-1].start + slots[-1].length
        *records, alerts = _levels(pack)
        for n, groups in enumerate(records):
            rules = workdir / f"records-{n}.yaml"
            rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
            replay(vm, [rules], base, end, workdir)
            vm.flush()
        # Alerts carry state (`for`): each test group is replayed on its own, from a fresh
        # state, as promtool evaluates it (one replay across the groups would carry an alert
        # over the gaps, and vmalert does not carry it across its query chunks).
        rules = workdir / "alerts.yaml"
        rules.write_text(yaml.safe_dump({"groups": alerts}, sort_keys=False))
        for slot in slots:
            replay(vm, [rules], slot.start, slot.start + slot.length, workdir)
        vm.flush()
        yield vm, slots
    finally:
        vm.stop()


@pytest.fixture(scope="module")
def replayed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[VictoriaMetrics, list[Slot]]]:
    sources = [_test_groups(path) for path in [*TESTS, COLD_START]]
    yield from _replay(tmp_path_factory.mktemp("vmalert"), RULES, sources)


@pytest.fixture(scope="module")
def node_replayed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[VictoriaMetrics, list[Slot]]]:
    sources = [_test_groups(path) for path in NODE_TESTS]
    sources += [(f"node-layout:{name}", node_layout_groups(name)) for name in NODE_LAYOUT]
    yield from _replay(tmp_path_factory.mktemp("vmalert-node"), RULES / "node", sources)


def _firing(vm: VictoriaMetrics, alertname: str, at: int) -> set[frozenset[tuple[str, str]]]:
    found = vm.get(
        "/api/v1/query",
        query=f'ALERTS{{alertname="{alertname}",alertstate="firing"}}',
        time=str(at),
        step="60s",
    )["data"]["result"]
    return {
        frozenset(
            (k, v)
            for k, v in item["metric"].items()
            if k not in ("__name__", "alertstate", "alertgroup")
        )
        for item in found
    }


def _cases(slots: list[Slot], kind: str) -> Iterator[tuple[Slot, dict[str, Any]]]:
    for slot in slots:
        for case in slot.group.get(kind, []):
            yield slot, case


def _compare_alerts(
    vm: VictoriaMetrics, slots: list[Slot]
) -> tuple[int, set[str], set[str], list[str]]:
    """Each ``alert_rule_test`` case of ``slots`` against vmalert's ``ALERTS``: how many were
    checked, the alerts expected to fire and to stay quiet, the mismatches."""
    checked, firing, quiet = 0, set(), set()
    mismatches = []
    for slot, case in _cases(slots, "alert_rule_test"):
        at = slot.start + _seconds(case["eval_time"])
        expected = {
            frozenset({"alertname": case["alertname"], **item["exp_labels"]}.items())
            for item in case.get("exp_alerts") or []
        }
        got = _firing(vm, case["alertname"], at)
        if got != expected:
            mismatches.append(
                f"{slot.name} {case['alertname']} at {case['eval_time']}: "
                f"expected {sorted(map(sorted, expected))}, vmalert {sorted(map(sorted, got))}"
            )
        (firing if expected else quiet).add(case["alertname"])
        checked += 1
    return checked, firing, quiet, mismatches


def test_the_same_alerts_fire_as_in_prometheus(
    replayed: tuple[VictoriaMetrics, list[Slot]],
) -> None:
    vm, slots = replayed
    checked, firing, quiet, mismatches = _compare_alerts(vm, slots)
    assert not mismatches, "\n".join(mismatches)
    # Every signature's firing case and near miss went through vmalert.
    from exporter.signatures import all_signatures, parse_config  # noqa: PLC0415
    from exporter.signatures.slo.burn_alerts import slo_alerts  # noqa: PLC0415

    every = {sig.alert for sig in all_signatures(parse_config({}))}
    # The shipped objectives' burn-rate pages too (slo.yaml: the cause in the page).
    every |= {burn.alert for burn in slo_alerts(parse_config({}))}
    assert firing == every and quiet == every, (every - firing, every - quiet)
    assert checked >= 2 * len(every)


def test_cold_starts_are_quiet_in_vmalert_too(
    replayed: tuple[VictoriaMetrics, list[Slot]],
) -> None:
    vm, slots = replayed
    checked = 0
    for slot, case in _cases([s for s in slots if s.source == COLD_START.name], "promql_expr_test"):
        if "ALERTS" not in case["expr"]:
            continue
        at = slot.start + _seconds(case["eval_time"])
        result = vm.get("/api/v1/query", query=case["expr"], time=str(at), step="60s")
        got = sorted(
            (
                tuple(sorted((k, v) for k, v in r["metric"].items() if k != "alertgroup")),
                float(r["value"][1]),
            )
            for r in result["data"]["result"]
        )
        expected = sorted(
            (
                tuple(sorted(dict(re.findall(r'(\w+)="([^"]*)"', s["labels"])).items())),
                float(s["value"]),
            )
            for s in case.get("exp_samples") or []
        )
        assert got == expected, f"{slot.name} {case['expr']} at {case['eval_time']}"
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize(
    "profile", ["", "dcgm", "node", "fast"], ids=["sidecar", "dcgm", "node", "fast"]
)
def test_vmalert_loads_the_pack(profile: str) -> None:
    """vmalert parses every profile's rules and annotation templates (``-dryRun``)."""
    pack = RULES / profile
    result = subprocess.run(
        [
            binary("vmalert"),
            f"-rule={pack / 'recording_rules.yaml'}",
            f"-rule={pack / 'alerts.yaml'}",
            "-dryRun",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Record values MetricsQL computes differently on this data, each for a reason written in
# docs/deployment.md ("Two engines"): a rate over a half-empty window reads low in Prometheus
# (the extrapolated increase divided by the whole window), not in VictoriaMetrics (the increase
# over the samples there, per second of their span). The cold-start guard keeps both silent.
DIFFERENT = {
    (
        "coldstart.yaml#0",
        "22m",
        'round(100 * inference:gpu_utilization:mean5m{instance="restart-1:10960"})',
    ): [((("instance", "restart-1:10960"), ("job", "inference-bottleneck-exporter")), 50.0)],
    (
        "coldstart.yaml#0",
        "22m",
        "count(inference:gpu_utilization:mean5m < 0.3 and inference:requests_running:mean5m > 0)",
    ): [],
    (
        "coldstart.yaml#0",
        "22m",
        "count(inference:gpu_utilization:mean5m < 0.6 and inference:queue_depth:deriv10m > 0 and inference:queue_depth:sum >= 1)",
    ): [],
    (
        "coldstart.yaml#0",
        "22m",
        "count(inference:engine_hottest_thread_cpu:mean5m > 0.9 and inference:gpu_utilization:mean5m < 0.6)",
    ): [],
}


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs = dict(re.findall(r'(\w+)="([^"]*)"', text))
    name = text.split("{", 1)[0]
    if name:
        pairs["__name__"] = name
    return tuple(sorted(pairs.items()))


def test_records_agree_but_where_documented(
    replayed: tuple[VictoriaMetrics, list[Slot]],
) -> None:
    """The promtool record checks of the replayed tests, against VictoriaMetrics: equal, or
    different exactly as :data:`DIFFERENT` says."""
    vm, slots = replayed
    assert _compare_records(vm, slots) == set(DIFFERENT)


def _compare_records(vm: VictoriaMetrics, slots: list[Slot]) -> set[tuple[str, str, str]]:
    """Each ``promql_expr_test`` record check of ``slots`` against VictoriaMetrics; returns the
    :data:`DIFFERENT` cases met."""
    seen = set()
    for slot, case in _cases(slots, "promql_expr_test"):
        if "ALERTS" in case["expr"]:
            continue
        at = slot.start + _seconds(case["eval_time"])
        result = vm.get("/api/v1/query", query=case["expr"], time=str(at), step="60s")
        expected = sorted(
            (_labels(s["labels"]), float(s["value"])) for s in case.get("exp_samples") or []
        )
        # MetricsQL keeps the metric name through some functions (round) that drop it in
        # PromQL; only where Prometheus keeps it is it compared (rules name their output).
        named = all(dict(labels).get("__name__") for labels, _ in expected)
        got = sorted(
            (
                tuple(sorted((k, v) for k, v in r["metric"].items() if named or k != "__name__")),
                float(r["value"][1]),
            )
            for r in result["data"]["result"]
        )
        key = (slot.name, str(case["eval_time"]), case["expr"])
        if key in DIFFERENT:
            assert got == DIFFERENT[key] != expected, key
            seen.add(key)
        else:
            assert got == expected, key
    return seen


def test_the_node_profile_fires_as_in_prometheus(
    node_replayed: tuple[VictoriaMetrics, list[Slot]],
) -> None:
    """The node profile in vmalert: the alerts promtool expects of its own tests and of the
    sidecar groups in the node layout, and its record checks."""
    vm, slots = node_replayed
    checked, firing, quiet, mismatches = _compare_alerts(vm, slots)
    assert not mismatches, "\n".join(mismatches)
    assert "InferenceGPUStarvedQueueGrowing" in firing & quiet
    assert "InferenceGPUContended" in firing & quiet
    # the GPU signatures the node layout keeps for pods, each firing and near-missing
    for alert in ("InferenceGPUUtilizationPulsing", "InferenceHBMBandwidthSaturated"):
        assert alert in firing & quiet, alert
    assert checked >= 40
    assert _compare_records(vm, slots) == set()
