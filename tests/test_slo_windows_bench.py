"""``bench/slo_windows.py``: the SLO groups timed over a Prometheus holding their whole period.

A small history (2 pools, one day) against the real promtool and Prometheus: the benchmark
must find the pack's SLO groups and their intervals, write the base records' history where the
rules read it, and count what each rule reads; the numbers of docs/scale.md come from a full
run, not from here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT, bench_script

from exporter.signatures.slo.slo_signals import BUDGET_GROUP, SLO_GROUP

NODE = ROOT / "alert_rules" / "node"


bench = bench_script("slo_windows", "slo_windows_bench")


def _merged(tmp_path: Path) -> Path:
    """The node pack as before the budget had a group of its own: its rules at the end of
    the SLO group, at the global interval."""
    doc = yaml.safe_load((NODE / "recording_rules.yaml").read_text())
    groups = {g["name"]: g for g in doc["groups"]}
    groups[SLO_GROUP]["rules"] += groups.pop(BUDGET_GROUP)["rules"]
    out = tmp_path / "merged"
    out.mkdir()
    (out / "recording_rules.yaml").write_text(yaml.safe_dump({"groups": list(groups.values())}))
    return out


def test_a_pack_is_its_slo_groups_at_their_intervals() -> None:
    pack = bench.load_pack("node", NODE, 15.0)
    intervals = {rule.group: rule.interval_s for rule in pack.rules}
    assert intervals == {SLO_GROUP: 15.0, BUDGET_GROUP: 150.0}
    bases = bench.base_series(NODE)
    assert {name for name, _, _ in bases} == {
        f"inference_pool:slo_{kind}_{what}:rate5m"
        for kind in ("ttft", "availability")
        for what in ("good", "total")
    }
    assert all(
        by == ["namespace", "job", "model"] and static == {"slo": "default"}
        for _, by, static in bases
    )


def test_a_pack_without_slo_groups_is_refused(tmp_path: Path) -> None:
    (tmp_path / "recording_rules.yaml").write_text(
        "groups:\n  - name: inference.records\n    rules: []\n"
    )
    with pytest.raises(ValueError, match="no rule group"):
        bench.load_pack("x", tmp_path, 15.0)
    assert bench.main(["--pack", f"x={tmp_path}"]) == 2


def test_every_rule_reads_the_history_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench.c, "RESULTS", tmp_path / "results")
    merged = _merged(tmp_path)
    argv = [
        "--pools",
        "2",
        "--days",
        "1",
        "--repeat",
        "1",
        "--pack",
        f"before={merged}",
        "--pack",
        f"node={NODE}",
    ]
    assert bench.main(argv) == 0
    (result,) = (tmp_path / "results").glob("slo-windows-*.json")
    report = json.loads(result.read_text())
    per_series = 86400 // 15  # one day of samples, every 15 s
    assert report["samples_written"] == 2 * 4 * per_series
    before, now = report["packs"]["before"]["groups"], report["packs"]["node"]["groups"]
    assert set(before) == {SLO_GROUP}
    assert set(now) == {SLO_GROUP, BUDGET_GROUP}
    budget = {r["record"]: r for r in now[BUDGET_GROUP]["rules"]}
    # the 28-day budget reads the whole history of its pools' good and total records
    for name in (
        "inference_pool:slo_ttft_budget_remaining:ratio28d",
        "inference_pool:slo_availability_budget_remaining:ratio28d",
    ):
        assert budget[name]["samples"] == 2 * 2 * per_series
        old = {r["record"]: r["samples"] for r in before[SLO_GROUP]["rules"]}
        assert old[name] == budget[name]["samples"]
    # a one-day window reads what it can of it (Prometheus's window is left-open: one sample less)
    one_day = {r["record"]: r["samples"] for r in now[SLO_GROUP]["rules"]}
    assert one_day["inference_pool:slo_ttft_sli:ratio1d"] in (
        2 * 2 * per_series,
        2 * 2 * (per_series - 1),
    )
    # CPU a minute: the group's evaluation times its evaluations a minute
    assert now[BUDGET_GROUP]["ms_per_minute"] == pytest.approx(
        now[BUDGET_GROUP]["ms_per_evaluation"] * 60 / 150
    )
    assert before[SLO_GROUP]["ms_per_minute"] == pytest.approx(
        before[SLO_GROUP]["ms_per_evaluation"] * 4
    )
