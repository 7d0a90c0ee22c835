"""The series-read yardstick (``bench/series_reads.py``): which series each rule reads, what the
fit makes of given costs, and one run against a real Prometheus. Its numbers on a fleet are not
tested (docs/scale.md has them)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.paths import ROOT, bench_script
from support.promstack import start_prometheus, wait_until

reads = bench_script("series_reads", "series_reads_bench")


def test_selectors_keep_each_read_with_its_range_and_offset() -> None:
    expr = (
        "sum by (pod) (rate(a_total[5m])) / on (pod) group_left () b:ratio"
        ' and increase(c_total{k="x"}[10m] offset 10m) > 0 or c_total offset 10m'
        ' or {__name__=~"d|e"}'
    )
    got = reads.selectors(expr)
    assert [(r.text, r.name, r.ranged, r.recorded) for r in got] == [
        ("a_total[5m]", "a_total", True, False),
        ("b:ratio", "b:ratio", False, True),
        ('c_total{k="x"}[10m] offset 10m', "c_total", True, False),
        ("c_total offset 10m", "c_total", False, False),
        ('{__name__=~"d|e"}', "d|e", False, False),
    ]
    assert got[0].query == "count(last_over_time(a_total[5m]))"
    assert got[1].query == "count(b:ratio)"


def _pack(tmp: Path, records: list[dict[str, str]], alerts: list[dict[str, str]]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    for name, group, rules in (
        ("recording_rules.yaml", "t.records", records),
        ("alerts.yaml", "t.alerts", alerts),
    ):
        (tmp / name).write_text(yaml.safe_dump({"groups": [{"name": group, "rules": rules}]}))
    return tmp


def test_measure_sums_reads_per_group_and_fits_given_costs(tmp_path: Path) -> None:
    pack = _pack(
        tmp_path,
        [
            {"record": "x:rate5m", "expr": "sum by (pod) (rate(x_total[5m]))"},
            {"record": "y:max", "expr": "max by (pod) (y) * on (pod) group_left () x:rate5m"},
            {"record": "z:sum", "expr": "sum(x_total) + sum(y) + count(x:rate5m)"},
        ],
        [{"alert": "High", "expr": "y:max > 1 and on (pod) x:rate5m > 0"}],
    )
    series = {
        "count(last_over_time(x_total[5m]))": 300,
        "count(x_total)": 300,
        "count(y)": 50,
        "count(x:rate5m)": 20,
        "count(y:max)": 20,
    }
    asked: list[str] = []

    def count(query: str) -> int:
        asked.append(query)
        return series[query]

    # Costs made by a known rule: 10 us a raw series, 4 us a recorded one, 0.05 ms a selector.
    def cost(expr: str) -> float:
        rule = reads.RuleReads("", "", expr, tuple(reads.selectors(expr)))
        raw = sum(series[r.query] for r in rule.reads if not r.recorded)
        recorded = sum(series[r.query] for r in rule.reads if r.recorded)
        return 0.010 * raw + 0.004 * recorded + 0.05 * len(rule.reads)

    rules = reads.pack_rules([pack / "recording_rules.yaml", pack / "alerts.yaml"])
    result = reads.measure(rules, count, cost)
    assert sorted(asked) == sorted(series), "each distinct read is counted once"
    by_rule = {r["rule"]: r for r in result["rules"]}
    assert (by_rule["y:max"]["raw_series"], by_rule["y:max"]["recorded_series"]) == (50, 20)
    assert (by_rule["z:sum"]["raw_series"], by_rule["z:sum"]["recorded_series"]) == (350, 20)
    assert result["groups"]["t.records"]["raw_series"] == 300 + 50 + 350
    assert result["groups"]["t.alerts"] == {
        "rules": 1,
        "selectors": 2,
        "raw_series": 0,
        "recorded_series": 40,
        "cost_ms": pytest.approx(0.004 * 40 + 0.1),
    }
    assert result["total"]["rules"] == 4
    fit = result["fit"]
    assert fit["us_per_raw_series"] == pytest.approx(10.0)
    assert fit["us_per_recorded_series"] == pytest.approx(4.0)
    assert fit["ms_per_selector"] == pytest.approx(0.05)
    assert fit["r2"] == pytest.approx(1.0)
    # x_total is read by two rules (600 series an evaluation); y by two; nothing else twice.
    assert [(d["name"], d["rules"], d["series_read"]) for d in result["raw_read_again"]] == [
        ("x_total", 2, 600),
        ("y", 2, 100),
    ]


def test_every_rule_of_the_shipped_packs_parses_into_reads() -> None:
    for layout in ("", "node", "dcgm", "fast"):
        directory = ROOT / "alert_rules" / layout
        rules = reads.pack_rules([directory / "recording_rules.yaml", directory / "alerts.yaml"])
        assert len(rules) > 100
        assert all(read.name for rule in rules for read in rule.reads)
    node = ROOT / "alert_rules" / "node"
    rules = reads.pack_rules([node / "recording_rules.yaml"])
    utilization = next(r for r in rules if r.name == "inference:gpu_utilization:mean5m")
    assert [(r.name, r.ranged) for r in utilization.reads] == [
        ("inference_gpu_busy_seconds_total", True),
        ("inference:exporter_build_info:group", False),
    ]


def test_bad_pack_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reads.main(["--pack", str(tmp_path), "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no recording_rules.yaml" in err


EXPOSITION = b'demo_total{k="a"} 1\ndemo_total{k="b"} 2\ndemo_total{k="c"} 3\n'


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_against_a_real_prometheus(tmp_path: Path, target: str) -> None:
    pack = _pack(
        tmp_path / "pack",
        [{"record": "demo:sum", "expr": "sum by (k) (demo_total)"}],
        [{"alert": "DemoSeen", "expr": "demo:sum > 0 and on (k) last_over_time(demo_total[1m])"}],
    )
    prometheus = start_prometheus(
        tmp_path / "prom", [target], [pack / "recording_rules.yaml", pack / "alerts.yaml"]
    )
    try:
        wait_until(lambda: len(prometheus.query("demo:sum")) == 3, timeout=30, what="the record")
        out = tmp_path / "out"
        assert (
            reads.main(
                ["--url", prometheus.url, "--pack", str(pack), "--repeat", "2", "--out", str(out)]
            )
            == 0
        )
    finally:
        prometheus.stop()
    result = json.loads((out / "series-reads-latest.json").read_text())
    rows = {r["rule"]: r for r in result["rules"]}
    assert (rows["demo:sum"]["raw_series"], rows["demo:sum"]["recorded_series"]) == (3, 0)
    assert (rows["DemoSeen"]["raw_series"], rows["DemoSeen"]["recorded_series"]) == (3, 3)
    assert all(r["cost_ms"] > 0 for r in result["rules"])
    assert result["head_series"] >= 3
    assert result["fleet"] is None
