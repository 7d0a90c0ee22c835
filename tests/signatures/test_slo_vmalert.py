"""The burn-rate alerts' window pairs on the second engine: vmalert over VictoriaMetrics.

The input series of ``tests/fixtures/slo/windows-*.yaml`` (every window pair's firing case,
near miss and cold start, in the sidecar and fast profiles) are loaded into a real
VictoriaMetrics, each test group in a slot of its own, and vmalert's replay mode evaluates the
same SLO rule groups promtool runs (:mod:`support.slo_pack`) over them: records level by
level (a record read by another is stored first, as in ``test_vmalert.py``), then the alerts
group by group from a fresh state. Every expectation promtool checks is checked against what
vmalert wrote: the alerts firing at each ``eval_time`` (labels exactly; replay keeps no
annotations) and each ``promql_expr_test`` (the SLIs, burn rates and the cold starts' silence).
The scenarios with the whole pack (``tests/promtool/sidecar/slo.yaml``, ``advice.yaml``) are
replayed by ``test_vmalert.py`` with the rest of the sidecar suites.

The SLIs are ratios of rates over the same window, so the engines' different ``rate()`` (no
extrapolation in MetricsQL) cancels out: the burn rates agree to the hundredth.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import FIXTURES, ROOT
from support.slo_pack import write_slo_pack
from support.victoria import (
    VictoriaMetrics,
    expand,
    replay,
    series_lines,
    start_victoria_metrics,
    start_vmalert,
)

from exporter.config import parse_duration
from exporter.signatures.definitions import RECORD_NAME

RULES = ROOT / "alert_rules"
FILES = {
    "windows-short.yaml": RULES,
    "windows-long.yaml": RULES,
    "windows-fast.yaml": RULES / "fast",
}
DAY = 86400


@dataclass
class Slot:
    """One test group at ``start`` (Unix seconds)."""

    index: int
    group: dict[str, Any]
    start: int
    length: int


def _slots(groups: list[dict[str, Any]], base: int) -> list[Slot]:
    out, start = [], base
    for index, group in enumerate(groups):
        interval = parse_duration(group["interval"])
        samples = max(len(expand(item["values"])) for item in group["input_series"])
        length = int(samples * interval)
        out.append(Slot(index, group, start, length))
        # Past the longest window and its offset (3d + 6h): no group reads another's series.
        start += length + 4 * DAY
    return out


def _levels(records: Path) -> list[list[dict[str, Any]]]:
    """The records by dependency level: over raw series, over those, ..."""
    level: dict[str, int] = {}
    by_level: dict[int, list[dict[str, Any]]] = {}
    for group in yaml.safe_load(records.read_text())["groups"]:
        for rule in group["rules"]:
            used = [name for name in RECORD_NAME.findall(rule["expr"]) if name in level]
            level[rule["record"]] = max(
                level.get(rule["record"], 0), 1 + max((level[n] for n in used), default=0)
            )
            by_level.setdefault(level[rule["record"]], []).append(rule)
    return [by_level[n] for n in sorted(by_level)]


@dataclass
class Replayed:
    vm: VictoriaMetrics
    slots: list[Slot]


@pytest.fixture(scope="module", params=sorted(FILES))
def replayed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replayed]:
    name: str = request.param
    workdir = tmp_path_factory.mktemp(name.removesuffix(".yaml"))
    records, alerts = write_slo_pack(FILES[name], workdir)
    test = yaml.safe_load((FIXTURES / "slo" / name).read_text(encoding="utf-8"))
    interval = test["evaluation_interval"]
    groups = test["tests"]
    span = sum(len(expand(max((i["values"] for i in g["input_series"]), key=len))) for g in groups)
    base = (int(time.time()) - 10 * DAY - span * 300) // 3600 * 3600
    slots = _slots(groups, base)
    vm = start_victoria_metrics(workdir)
    try:
        lines: list[str] = []
        for slot in slots:
            step = parse_duration(slot.group["interval"])
            for item in slot.group["input_series"]:
                lines += series_lines(item["series"], item["values"], slot.start * 1000, step)
        vm.import_text(lines)
        vm.flush()
        for n, rules in enumerate(_levels(records)):
            path = workdir / f"records-{n}.yaml"
            path.write_text(yaml.safe_dump({"groups": [{"name": f"slo.{n}", "rules": rules}]}))
            for slot in slots:
                replay(vm, [path], slot.start, slot.start + slot.length, workdir, interval=interval)
            vm.flush()
        data = yaml.safe_load(alerts.read_text())
        for group in data["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)  # replay keeps none, and refuses their queries
        path = workdir / "alerts-replay.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        for slot in slots:
            replay(vm, [path], slot.start, slot.start + slot.length, workdir, interval=interval)
        vm.flush()
        yield Replayed(vm, slots)
    finally:
        vm.stop()


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs = dict(re.findall(r'(\w+)="([^"]*)"', text))
    name = text.split("{", 1)[0]
    if name:
        pairs["__name__"] = name
    return tuple(sorted(pairs.items()))


def test_the_same_burn_alerts_fire(replayed: Replayed) -> None:
    checked = 0
    for slot in replayed.slots:
        for case in slot.group.get("alert_rule_test", []):
            at = slot.start + int(parse_duration(case["eval_time"]))
            expected = {
                frozenset({"alertname": case["alertname"], **item["exp_labels"]}.items())
                for item in case.get("exp_alerts") or []
            }
            found = replayed.vm.query(
                f'ALERTS{{alertname="{case["alertname"]}",alertstate="firing"}}', at
            )
            got = {
                frozenset(
                    (k, v)
                    for k, v in item["metric"].items()
                    if k not in ("__name__", "alertstate", "alertgroup")
                )
                for item in found
            }
            assert got == expected, (slot.index, case["eval_time"])
            checked += 1
    assert checked >= 4


def test_the_same_slis_and_cold_starts(replayed: Replayed) -> None:
    checked = 0
    for slot in replayed.slots:
        for case in slot.group.get("promql_expr_test", []):
            at = slot.start + int(parse_duration(case["eval_time"]))
            expected = sorted(
                (_labels(s["labels"]), float(s["value"])) for s in case.get("exp_samples") or []
            )
            named = all(dict(labels).get("__name__") for labels, _ in expected)
            got = sorted(
                (
                    tuple(
                        sorted(
                            (k, v)
                            for k, v in r["metric"].items()
                            if (named or k != "__name__") and k != "alertgroup"
                        )
                    ),
                    round(float(r["value"][1]), 9),
                )
                for r in replayed.vm.query(case["expr"], at)
            )
            assert got == expected, (slot.index, case["eval_time"], case["expr"])
            checked += 1
    assert checked >= 3


# --- the page's cause, rendered by a live vmalert -------------------------------------------------

SLO_SUITE = ROOT / "tests" / "promtool" / "sidecar" / "slo.yaml"


def _expected_pages() -> dict[tuple[str, str], dict[str, str]]:
    """The annotations promtool expects of the suite's 1h/5m pages, by (alert, namespace)."""
    (group,) = yaml.safe_load(SLO_SUITE.read_text(encoding="utf-8"))["tests"]
    out = {}
    for case in group["alert_rule_test"]:
        for item in case.get("exp_alerts") or []:
            labels = item["exp_labels"]
            out[(labels["alertname"], labels["namespace"])] = item["exp_annotations"]
    return out


def test_the_page_names_its_cause_in_a_live_vmalert(tmp_path: Path) -> None:
    """The suite of ``slo.yaml`` ending now: the pack's records replayed over it, then a live
    vmalert evaluates the burn-rate alerts and renders their annotations (the cause and the
    advice through the ``query`` template function) as Prometheus does."""
    (group,) = yaml.safe_load(SLO_SUITE.read_text(encoding="utf-8"))["tests"]
    samples = max(len(expand(item["values"])) for item in group["input_series"])
    now = int(time.time()) // 60 * 60
    start = now - (samples - 1) * 60
    vm = start_victoria_metrics(tmp_path / "vm")
    children = [vm]
    try:
        lines: list[str] = []
        for item in group["input_series"]:
            lines += series_lines(item["series"], item["values"], start * 1000, 60)
        vm.import_text(lines)
        vm.flush()
        for n, rules in enumerate(_levels(RULES / "recording_rules.yaml")):
            path = tmp_path / f"records-{n}.yaml"
            path.write_text(yaml.safe_dump({"groups": [{"name": f"pack.{n}", "rules": rules}]}))
            replay(vm, [path], start, now, tmp_path)
            vm.flush()
        alerts = yaml.safe_load((RULES / "alerts.yaml").read_text(encoding="utf-8"))
        slo = [g for g in alerts["groups"] if g["name"] == "inference.slo"]
        path = tmp_path / "slo-alerts.yaml"
        path.write_text(yaml.safe_dump({"groups": slo}, sort_keys=False))
        vmalert = start_vmalert(tmp_path / "vmalert", [path], vm, interval="2s")
        children.append(vmalert)
        expected = _expected_pages()
        got: dict[tuple[str, str], dict[str, str]] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and set(got) != set(expected):
            time.sleep(1)
            for alert in vmalert.get_json("/api/v1/alerts")["data"]["alerts"] or []:
                labels = alert["labels"]
                if alert["state"] == "firing" and labels.get("long_window") == "1h":
                    got[(labels["alertname"], labels["namespace"])] = alert["annotations"]
        assert set(got) == set(expected)
        for key, annotations in expected.items():
            assert got[key] == annotations, key
    finally:
        for child in reversed(children):
            child.stop()
