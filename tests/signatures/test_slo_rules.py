"""The SLO rules of the generated pack against the real promtool.

The burn-rate alerts' window pairs (``tests/fixtures/slo/windows-*.yaml``: the SLO groups of
``alert_rules/`` alone, :mod:`support.slo_pack`), each pair with a firing case, a near miss and
its cold start, in the sidecar profile and, scaled, in the fast one; the cause in the page and
the scaling advice of every signature family run with the whole pack, in
``tests/promtool/sidecar/slo.yaml`` and ``advice.yaml`` (``test_rules.py`` runs those).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import FIXTURES, ROOT
from support.slo_pack import write_slo_pack

from exporter.config import format_duration, parse_duration
from exporter.signatures import parse_config
from exporter.signatures.slo.burn_alerts import ALERT_NAMES, slo_alerts

RULES = ROOT / "alert_rules"
WINDOWS = FIXTURES / "slo"
PACK_OF = {
    "windows-short.yaml": RULES,
    "windows-long.yaml": RULES,
    "windows-fast.yaml": RULES / "fast",
}
PROFILE_OF = {"windows-short.yaml": "sidecar", "windows-long.yaml": "sidecar"}
FULL_PACK = [ROOT / "tests" / "promtool" / "sidecar" / n for n in ("slo.yaml", "advice.yaml")]


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: run `make tools` (apt-get install prometheus)")
    return found


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", sorted(PACK_OF))
def test_window_pairs(promtool: str, name: str, tmp_path: Path) -> None:
    write_slo_pack(PACK_OF[name], tmp_path)
    shutil.copy(WINDOWS / name, tmp_path / name)
    result = subprocess.run(
        [promtool, "test", "rules", name],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _cases(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    alerts: list[dict[str, Any]] = []
    exprs: list[dict[str, Any]] = []
    for group in _load(path)["tests"]:
        alerts += group.get("alert_rule_test", [])
        exprs += group.get("promql_expr_test", [])
    return alerts, exprs


def test_every_window_pair_fires_misses_and_waits_out_its_cold_start() -> None:
    """Each burn-rate rule of the shipped objective's alert has, in the sidecar profile, a
    firing case, a near miss (its long window's burn rate asserted under the rule's rate, or
    over it with the short window recovered) and a cold start (both windows over the rate
    while the alert is silent)."""
    cfg = parse_config({})
    (ttft,) = [a for a in slo_alerts(cfg) if a.kind == "ttft"]
    pairs = {(dict(r.labels)["long_window"], dict(r.labels)["short_window"]) for r in ttft.rules}
    assert pairs == {("1h", "5m"), ("6h", "30m"), ("1d", "2h"), ("3d", "6h")}
    fired, near, cold = set(), set(), set()
    for name, profile in PROFILE_OF.items():
        assert profile == "sidecar"
        alerts, exprs = _cases(WINDOWS / name)
        for case in alerts:
            for item in case.get("exp_alerts") or []:
                labels = item["exp_labels"]
                fired.add((labels["long_window"], labels["short_window"]))
        for case in exprs:
            found = re.findall(r"burn_rate:ratio(\w+)\{namespace=\"(\w+)\"\}", case["expr"])
            windows = {w for w, _ in found}
            if len(windows) == 2 and case["exp_samples"]:
                cold.add(tuple(sorted(windows, key=parse_duration, reverse=True)))
            elif len(windows) == 1 and all(ns.startswith(("near", "recovered")) for _, ns in found):
                near.add(windows.pop())
    assert fired == pairs
    assert cold == pairs
    assert {long for long, _ in pairs} <= near


def test_the_fast_profile_scales_every_window_by_a_tenth() -> None:
    sidecar, fast = parse_config({}), parse_config({}, "fast")
    for kind in ALERT_NAMES:
        for slow, quick in zip(
            slo_alerts(sidecar, every_kind=True)[list(ALERT_NAMES).index(kind)].rules,
            slo_alerts(fast, every_kind=True)[list(ALERT_NAMES).index(kind)].rules,
            strict=True,
        ):
            for label in ("long_window", "short_window"):
                scaled = format_duration(parse_duration(dict(slow.labels)[label]) / 10)
                assert dict(quick.labels)[label] == scaled
            assert quick.severity == slow.severity


def test_the_cause_and_advice_suites_run_with_the_whole_pack() -> None:
    """slo.yaml and advice.yaml read the shipped pack (test_rules.py runs them with promtool):
    a page naming a signature on 3 of 4 pods, one naming none, and every signature family's
    advice."""
    alerts, exprs = _cases(FULL_PACK[0])
    summaries = [
        item["exp_annotations"]["summary"]
        for case in alerts
        for item in case.get("exp_alerts") or []
    ]
    assert any("cause: InferenceTokenizerSlowerThanDecode on 3 of 4 pods" in s for s in summaries)
    assert any("cause: none of the pack's signatures holds" in s for s in summaries)
    families = set()
    for path in FULL_PACK:
        for case in _cases(path)[1]:
            for sample in case.get("exp_samples") or []:
                families.update(re.findall(r'signature="(\w+)"', sample["labels"]))
    assert families >= {"cpu", "queue", "network", "memory", "gpu", "roofline", "pool", "meta"}
    assert exprs


@pytest.mark.parametrize("profile", ["sidecar", "node", "dcgm", "fast"])
def test_the_budget_over_the_period_runs_in_its_own_group_less_often(profile: str) -> None:
    """The budget's range read over the whole period (28 days of the base records) is the
    costliest read of the pack once Prometheus holds the period (``bench/slo_windows.py``): it
    runs in a group of its own every 2m30s (scaled in the fast profile), often enough that an
    instant query within Prometheus's 5-minute lookback always finds it; every other SLO
    record stays in ``inference.records.slo`` at the global interval, and no alert reads the
    budget (it would see it minutes late)."""
    pack = RULES if profile == "sidecar" else RULES / profile
    groups = _load(pack / "recording_rules.yaml")["groups"]
    names = [g["name"] for g in groups]
    budget = groups[names.index("inference.records.slo.budget")]
    slo = groups[names.index("inference.records.slo")]
    assert names.index("inference.records.slo.budget") == names.index("inference.records.slo") + 1
    scale = 0.1 if profile == "fast" else 1.0
    assert parse_duration(budget["interval"]) == 150 * scale
    assert "interval" not in slo
    period = format_duration(28 * 86400 * scale)
    assert [r["record"] for r in budget["rules"]] == [
        f"inference_pool:slo_{kind}_budget_remaining:ratio{period}"
        for kind in ("ttft", "availability")
    ]
    for rule in budget["rules"]:
        assert f"[{period}]" in rule["expr"]
    for rule in slo["rules"]:
        assert f"[{period}]" not in rule["expr"], rule["record"]
    alerts = (pack / "alerts.yaml").read_text(encoding="utf-8")
    assert "budget_remaining" not in alerts
