"""The generated rule pack against the real promtool.

``promtool check rules`` (every lint, fatal) on every generated file; ``promtool test rules``
on every unit-test file under ``tests/promtool/`` and on the site-config fixtures under
``tests/fixtures/rules/``; coverage of those unit tests (every alert has a near miss and a
firing case in each profile it depends on, the healthy baselines assert every alert silent);
the committed files equal a fresh generation; the test series use the exporter's real names
and labels. promtool missing is a failure, not a skip: ``make tools`` installs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import FIXTURES, ROOT

from exporter.metrics import BY_NAME
from exporter.signatures import all_signatures, parse_config, recording_rules
from exporter.signatures.__main__ import DEFAULT_OUT, DEFAULT_RUNBOOKS, main, pack_files
from exporter.signatures.promql_text import matchers

RULES = ROOT / "alert_rules"
PROMTOOL_TESTS = ROOT / "tests" / "promtool"
UNIT_TESTS = sorted(PROMTOOL_TESTS.rglob("*.yaml"))
# Rule files; alert_rules/alertmanager.yaml is Alertmanager's (tests/signatures/test_alertmanager.py checks it).
GENERATED = sorted(p for p in RULES.rglob("*.yaml") if p.name != "alertmanager.yaml")
SITE_FIXTURES = sorted(p.parent for p in (FIXTURES / "rules").glob("*/config.yaml"))
PROFILE_OF_FIXTURE = {
    "dcgm-exported-labels": "dcgm",
    "cluster-join": "sidecar",
    "gpu-cost": "sidecar",
    "gpu-cost-dcgm": "dcgm",
    "gpu-cost-node": "node",
    "gpu-peaks-dcgm": "dcgm",
    "throttle-reasons": "sidecar",
    "slo-objectives": "sidecar",
}
# Labels Prometheus adds to a target: a PodMonitor's, and a static config's (instance, job).
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "instance", "job", "cluster"}
ALERTS = [s.alert for s in all_signatures(parse_config({}))]


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
    )
    if found is None:
        pytest.fail("promtool not found: run `make tools` (apt-get install prometheus)")
    return found


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def test_the_pack_exists() -> None:
    names = {p.relative_to(RULES).as_posix() for p in GENERATED}
    assert names == {
        "recording_rules.yaml",
        "alerts.yaml",
        "dcgm/recording_rules.yaml",
        "dcgm/alerts.yaml",
        "node/recording_rules.yaml",
        "node/alerts.yaml",
        "fast/recording_rules.yaml",
        "fast/alerts.yaml",
    }
    assert (RULES / "alertmanager.yaml").is_file()
    assert len(UNIT_TESTS) >= 6


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.relative_to(RULES).as_posix())
def test_promtool_check_rules(promtool: str, path: Path) -> None:
    result = run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Nothing but the header and the success line: no lint findings, no warnings.
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    assert lines[0] == f"Checking {path}"
    assert re.fullmatch(r"SUCCESS: \d+ rules found", lines[1]), output
    assert len(lines) == 2, output


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.relative_to(PROMTOOL_TESTS).as_posix())
def test_promtool_unit_tests(promtool: str, path: Path) -> None:
    result = run(promtool, "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("fixture", SITE_FIXTURES, ids=lambda p: p.name)
def test_site_config_fixture(promtool: str, fixture: Path, tmp_path: Path) -> None:
    """A site config regenerates a working pack: its own promtool test passes against it."""
    profile = PROFILE_OF_FIXTURE[fixture.name]
    args = ["--config", str(fixture / "config.yaml"), "--profile", profile, "--out", str(tmp_path)]
    assert main(args) == 0
    shutil.copy(fixture / "test.yaml", tmp_path / "test.yaml")
    for name in ("recording_rules.yaml", "alerts.yaml"):
        check = run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(tmp_path / name))
        assert check.returncode == 0, check.stdout + check.stderr
    result = run(promtool, "test", "rules", str(tmp_path / "test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_files_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter.signatures", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr + "\nrun: python -m exporter.signatures"
    assert result.stderr == ""


def test_generation_is_deterministic() -> None:
    cfg = parse_config({})
    first = pack_files(cfg, DEFAULT_OUT, DEFAULT_RUNBOOKS)
    second = pack_files(parse_config({}), DEFAULT_OUT, DEFAULT_RUNBOOKS)
    assert first == second


# --- coverage of the unit tests ---------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _alert_cases(paths: list[Path]) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    for path in paths:
        for group in _load(path)["tests"]:
            for case in group.get("alert_rule_test", []):
                yield case["alertname"], case["eval_time"], case.get("exp_alerts") or []


def _tests_of(profile: str, *, baseline: bool) -> list[Path]:
    return [
        p for p in UNIT_TESTS if p.parent.name == profile and (p.stem == "baseline") == baseline
    ]


# Alerts that cannot fire in the dcgm profile: their signal exists only in the sidecar's NVML
# collector (the dcgm baseline still asserts them silent).
SIDECAR_ONLY = {
    "InferenceGPUContended": "the engine's share of a shared GPU needs NVML's per-process data",
}


def _gpu_sourced_alerts() -> set[str]:
    """Alerts whose expression or evidence reads a record the dcgm profile fills differently."""
    side = {r.record: r.expr for r in recording_rules(parse_config({}, "sidecar"))}
    dcgm = {r.record: r.expr for r in recording_rules(parse_config({}, "dcgm"))}
    differ = {name for name in side if side[name] != dcgm.get(name)}
    out = set()
    for sig in all_signatures(parse_config({}, "dcgm")):
        for rule in sig.rules:
            texts = [rule.expr, *(e.expr or "" for e in rule.evidence)]
            if any(name in text for text in texts for name in differ):
                out.add(sig.alert)
    return out - set(SIDECAR_ONLY)


@pytest.mark.parametrize("profile", ["sidecar", "dcgm"])
def test_every_alert_has_a_firing_case_and_a_near_miss(profile: str) -> None:
    must = set(ALERTS) if profile == "sidecar" else _gpu_sourced_alerts()
    fired: set[str] = set()
    quiet: set[str] = set()
    severities: dict[str, set[str]] = {}
    for alert, _, expected in _alert_cases(_tests_of(profile, baseline=False)):
        (fired if expected else quiet).add(alert)
        for item in expected:
            labels = item["exp_labels"]
            severities.setdefault(alert, set()).add(labels["severity"])
            # Exact labels and annotations are asserted, never left to chance.
            assert set(item["exp_annotations"]) == {"summary", "description", "runbook_url"}
            assert "signature" in labels
    assert must - fired == set(), f"{profile}: no firing case for {sorted(must - fired)}"
    assert must - quiet == set(), f"{profile}: no near miss for {sorted(must - quiet)}"
    # Every variant of an alert (the critical and the warning Xid) is exercised.
    for sig in all_signatures(parse_config({}, profile)):
        if sig.alert in must:
            assert severities[sig.alert] == set(sig.severities), sig.alert


def test_both_kinds_of_target_fire() -> None:
    """Static targets (instance, job) and PodMonitor targets (namespace, pod, ...) both alert."""
    kinds: dict[str, set[str]] = {}
    for alert, _, expected in _alert_cases(_tests_of("sidecar", baseline=False)):
        for item in expected:
            labels = item["exp_labels"]
            kinds.setdefault("pod" if "pod" in labels else "static", set()).add(alert)
    assert len(kinds["pod"]) >= 6 and len(kinds["static"]) >= 6, kinds


@pytest.mark.parametrize("profile", ["sidecar", "dcgm"])
def test_healthy_baseline_asserts_every_alert_silent(profile: str) -> None:
    (path,) = _tests_of(profile, baseline=True)
    silent: dict[str, set[str]] = {}
    for alert, when, expected in _alert_cases([path]):
        assert expected == [], f"{alert} expected to fire in the baseline"
        silent.setdefault(alert, set()).add(when)
    assert set(silent) == set(ALERTS)
    for alert, times in silent.items():
        hours = max(_hours(t) for t in times)
        assert len(times) >= 4 and hours >= 3, f"{alert}: {sorted(times)}"
    # The baseline runs for several hours of series.
    (group,) = _load(path)["tests"]
    assert all(str(s["values"]).endswith("x240") for s in group["input_series"])


COLD_START = ROOT / "tests" / "promtool" / "sidecar" / "coldstart.yaml"
# Guarded signatures that cannot hold during a cold start anyway, and why.
COLD_BY_DESIGN = {
    "InferenceHBMBandwidthSaturated": "compares with its value one baseline (1h) earlier",
}


def test_every_guarded_signature_has_a_cold_start_case() -> None:
    """A signature over a windowed record is held by the cold-start guard, and
    ``coldstart.yaml`` shows it silent while the window fills (a new one fails here until it
    has its case)."""
    guarded = {
        sig.alert for sig in all_signatures(parse_config({})) if any(r.history for r in sig.rules)
    }
    assert guarded >= {"InferenceGPUUnderutilized", "InferenceGPUStarvedQueueGrowing"}
    exprs = [
        case["expr"]
        for group in _load(COLD_START)["tests"]
        for case in group.get("promql_expr_test", [])
        if "ALERTS" in case["expr"]
    ]
    named = {
        alert
        for expr in exprs
        for found in re.findall(r'alertname=~?"([^"]+)"', expr)
        for alert in found.split("|")
    }
    assert guarded - named - set(COLD_BY_DESIGN) == set()
    assert set(COLD_BY_DESIGN) <= guarded


def test_guarded_rules_require_the_history_of_their_longest_window() -> None:
    for profile in ("sidecar", "dcgm", "fast"):
        cfg = parse_config({}, profile)
        records = {r.record: r for r in recording_rules(cfg)}
        for sig in all_signatures(cfg):
            for rule in sig.rules:
                if not rule.history:
                    continue
                guard = re.search(
                    r"\bon \(([^)]*)\)\n(inference(_pool)?:[a-z_]+:history\w+)$", rule.expr
                )
                assert guard, f"{profile} {sig.alert}: {rule.expr}"
                if guard[3]:  # a pool's alert: the pool's labels and model, no pod
                    pool = [label for label in cfg.join_labels if label not in ("pod", "instance")]
                    assert guard[1].split(", ") == [*pool, "model"]
                else:
                    assert guard[1].split(", ") == list(cfg.join_labels)
                assert records[guard[2]].window == 0.0
                read = [records[n].window for n in records if n in rule.expr and n != guard[2]]
                assert rule.history == max(w or 0.0 for w in read), sig.alert


def _hours(text: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m|h)", text)
    assert match, text
    return int(match[1]) * {"s": 1 / 3600, "m": 1 / 60, "h": 1.0}[match[2]]


# --- the series are the exporter's ------------------------------------------------------------

_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _exporter_spec(name: str) -> tuple[str, tuple[str, ...]]:
    """Catalogue entry of a sample name (histogram and counter suffixes resolved)."""
    if name in BY_NAME:
        return name, BY_NAME[name].labels
    for suffix in ("_bucket", "_count", "_sum"):
        base = name.removesuffix(suffix)
        if base != name and base in BY_NAME and BY_NAME[base].type == "histogram":
            extra = ("le",) if suffix == "_bucket" else ()
            return base, (*BY_NAME[base].labels, *extra)
    raise AssertionError(f"{name} is not in the metric catalogue (exporter/metrics.py)")


def _input_series() -> Iterator[tuple[Path, str, dict[str, str]]]:
    paths = [*UNIT_TESTS, *(p / "test.yaml" for p in SITE_FIXTURES)]
    for path in paths:
        for group in _load(path)["tests"]:
            for item in group["input_series"]:
                match = _SERIES.match(item["series"])
                assert match, item["series"]
                yield path, match[1], dict(_LABEL.findall(match[2]))


def test_test_series_use_the_exporters_names_and_labels() -> None:
    seen = set()
    for path, name, labels in _input_series():
        if not name.startswith("inference_"):
            continue
        base, expected = _exporter_spec(name)
        # The node agent's attribution carries a pod's namespace, pod and container as its own.
        own = set(labels) - (TARGET_LABELS - set(expected))
        if base == "inference_exporter_build_info":
            own -= {"version"}
            expected = ()
        assert own == set(expected), f"{path.name}: {name}{{{labels}}} vs catalogue {expected}"
        seen.add(base)
    assert len(seen) >= 25


def test_dcgm_series_look_like_dcgm_exporter() -> None:
    for path, name, labels in _input_series():
        if name.startswith("DCGM_FI_"):
            assert {"gpu", "UUID", "device", "modelName"} <= set(labels), path.name
            # dcgm-exporter 4.8.3 renamed Hostname to hostname
            assert {"Hostname", "hostname"} & set(labels), path.name
            assert {"instance", "job"} <= set(labels)


def test_rules_only_read_catalogued_metrics() -> None:
    """Every inference_* metric and label matcher in the rules exists in exporter/metrics.py
    (or is a target label Prometheus adds to every series: the node profile keeps its target
    info to pods)."""
    for path in GENERATED:
        text = path.read_text(encoding="utf-8")
        for name, body in re.findall(
            r"\b(inference_[a-z0-9_]+)(?![a-z0-9_:])(?:\{([^}]*)\})?", text
        ):
            _, labels = _exporter_spec(name)
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body):
                assert label in labels or label in TARGET_LABELS, (
                    f"{path}: {name} has no label {label}"
                )


def test_runbook_and_evidence_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    """What the runbooks tell people to run, and what diagnose will run, parses."""
    queries: list[str] = []
    for profile in ("sidecar", "dcgm", "fast"):
        for sig in all_signatures(parse_config({}, profile)):
            queries += [q for _, q in sig.runbook.queries]
            for rule in sig.rules:
                for item in rule.evidence:
                    if item.expr is not None:
                        queries.append(item.query(matchers({"instance": "a:1", "job": "j"})))
                        queries.append(item.query(""))
    rules = [{"record": f"runbook:query:q{i}", "expr": q} for i, q in enumerate(queries)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}), encoding="utf-8")
    result = run(promtool, "check", "rules", "--lint=none", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_config_one_profile_refuses_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole pack builds every profile: dcgm's join check fails like any config error."""
    site = tmp_path / "site.yaml"
    site.write_text("join_labels: [instance, job]\n", encoding="utf-8")
    assert main(["--config", str(site), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"python -m exporter.signatures: error: {site}: dcgm.join: ")
    assert not (tmp_path / "out").exists()


def test_any_member_zero_is_filtered_before_the_aggregation() -> None:
    """Where any series of a group is 0: ``min by (...) (x == 0)`` in every pack, never
    ``min by (...) (x) == 0``: the same groups and values, but the aggregation hashes only the
    failing series instead of every collector's, GPU's or target's (the collectors' series are
    the costliest alert input at 10,000 GPUs; docs/scale.md). The alerts' promtool suites
    check both the firing and the silent cases of each such alert."""
    # A state read as it is now or as its last sample (``last_over_time(x[1m])``).
    state = r"(?:[a-z_]+(?:\{[^{}]*\})?|last_over_time\([a-z_]+(?:\{[^{}]*\})?\[[0-9a-z]+\]\))"
    late = re.compile(rf"min by \([^()]*\) \({state}\)\s*==\s*0")
    early = re.compile(rf"min by \([^()]*\) \({state} == 0\)")
    seen = dict.fromkeys(GENERATED, 0)
    for path in GENERATED:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                assert not late.search(rule["expr"]), (path, rule.get("alert") or rule["record"])
                seen[path] += len(early.findall(rule["expr"]))
    # InferenceExporterDown, InferenceCollectorFailing, InferenceEngineMetricsDown,
    # InferenceNVMLUnavailable, InferenceGPUMetricsMissing and InferenceGPULost: in each
    # profile's alerts, and again in its verdicts' holding records
    assert seen == dict.fromkeys(GENERATED, 6)
