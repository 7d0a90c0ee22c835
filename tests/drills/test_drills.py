"""End-to-end bottleneck drills: each injected cause fires its signature, pages, and ranks first.

One drill per scenario of :mod:`drills.scenarios`, one after another (each takes the CPU the
next one measures), each sized to what its engine serves on this machine. The GPU scenarios
run on a GPU machine only (``bench/gpu/run.sh``); with ``DRILL_SLOWDOWN`` set (``make
drills-slow``) the third-party engines' drills are left out, as they cannot be slowed. See
docs/drills.md for the last run's matrix at each speed.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from drills.harness import (
    POSTMORTEM,
    DrillResult,
    dump_results,
    expected_dedup_key,
    has_gpu,
    noting_failure,
    run_drill,
)
from drills.scenarios import (
    CPU_SCENARIOS,
    EXTERNAL_NAMES,
    EXTERNAL_SCENARIOS,
    GPU_SCENARIOS,
    Scenario,
    deadline,
)
from drills.slo import BURN_ALERTS, SloWatch, beside, check_advice, check_burn

from exporter.diagnose.timeline import PANELS
from exporter.signatures.render import runbook_url
from exporter.signatures.site import load_config

RECEIVER = {"critical": "pagerduty", "warning": "pagerduty-low-urgency"}
# Bounds on a whole drill beside its deadline: the stack's start (the engine waits up to 240 s
# for its model), the calibration (two closed loops of at most 120 s each), the pages and
# diagnose (60 s), shutdown.
DRILL_OVERHEAD_S = 240 + 2 * 120 + 60 + 60


def timed(scenarios: tuple[Scenario, ...]) -> list[object]:
    """The scenarios as parameters, each with a timeout of its deadline and the overhead."""
    return [
        pytest.param(
            s, id=s.name, marks=pytest.mark.timeout(deadline(s).seconds + DRILL_OVERHEAD_S)
        )
        for s in scenarios
    ]


def _explain(result: DrillResult) -> str:
    alerts = {name: seen.told() for name, seen in result.alerts.items()}
    return (
        f"\n  alerts: {alerts}\n  signals: {result.signals}\n  error: {result.error or '-'}"
        f"\n  logs: {result.workdir}"
    )


def check_quiet(result: DrillResult) -> None:
    assert not result.fired(), f"the healthy drill fired {sorted(result.fired())}{_explain(result)}"
    triggers = [p for p in result.pages if p["body"].get("event_action") == "trigger"]
    assert not triggers, f"the healthy drill paged: {[p['alertname'] for p in triggers]}"
    assert result.diagnose is not None, f"diagnose failed: {result.diagnose_error}"
    holding = [f["alert"] for f in result.diagnose["findings"] if f["status"] == "holds"]
    assert not holding, f"diagnose finds {holding} in the healthy drill"


def check_fired(scenario: Scenario, result: DrillResult) -> None:
    expected = scenario.expected
    assert expected is not None
    fired = result.fired()
    assert expected in fired, (
        f"{expected} did not fire within {result.sized.deadline_s:.0f}s"
        f" ({result.sized.deadline_how}){_explain(result)}"
        + beside(scenario.name, expected, SloWatch.from_json(result.slo).samples)
    )
    # The objectives' burn-rate alerts may fire beside the signature: its cause burns them.
    unexpected = sorted(set(fired) - {expected} - set(scenario.allowed) - BURN_ALERTS)
    assert not unexpected, f"unexpected alerts fired: {unexpected}{_explain(result)}"


def check_pages(scenario: Scenario, result: DrillResult) -> None:
    expected = scenario.expected
    assert expected is not None
    seen = result.alerts[expected]
    severity = seen.severity
    pages = [
        p
        for p in result.pages
        if p["alertname"] == expected and p["body"].get("event_action") == "trigger"
    ]
    assert len(pages) >= 2, f"expected a page and its repeat for {expected}, got {len(pages)}"
    allowed = {expected, *scenario.allowed, *BURN_ALERTS}
    strays = {p["alertname"] for p in result.pages} - allowed
    assert not strays, f"pages for alerts that must not fire: {sorted(strays)}"
    runbook = runbook_url(load_config(None, "fast"), expected)
    instances = {p["body"]["payload"]["custom_details"]["target"] for p in pages}
    assert instances == {"drill/reference-0"}, instances
    keys = {p["body"]["dedup_key"] for p in pages}
    assert len(keys) == 1, f"dedup_key changed between notifications of one group: {keys}"
    for page in pages:
        body = page["body"]
        payload = body["payload"]
        assert page["receiver"] == RECEIVER[severity], (page["receiver"], severity)
        assert payload["severity"] == severity
        summary = payload["summary"]
        assert summary.startswith(seen_summary_prefix(expected)), summary
        # The description quotes measured values, never the template's "?" for a missing one.
        assert re.search(r"\d", summary) and " ? " not in summary, summary
        details = payload["custom_details"]
        assert details["alertname"] == expected
        assert details["runbook_url"] == runbook
        assert body["links"][0]["href"] == runbook
        assert body["routing_key"].startswith("drill-routing-key")
    instance = pages[0]["body"]["payload"]["source"]
    assert instance == "drill/reference-0", instance


def seen_summary_prefix(alert: str) -> str:
    """The start of each alert's summary annotation (the page's payload.summary)."""
    return {
        "InferenceGPUStarvedQueueGrowing": "GPU starved while the queue grows on drill/reference-0",
        "InferenceTokenizerSlowerThanDecode": "Tokenizer slower than a decode step on drill/",
        "InferenceFrontendCPUSaturated": "Engine front-end thread saturated on drill/",
        "InferenceSoftirqCPUHigh": "Softirq load high on the node of drill/",
        "InferenceQueueWaitDominatesLatency": "Queue wait dominates request latency on drill/",
        "InferenceGPUUtilizationPulsing": "GPU utilisation pulses between idle and saturated",
        "InferenceGPUMemoryHeadroomLow": "KV cache nearly full on drill/",
    }.get(alert, "")


def check_dedup_key(scenario: Scenario, result: DrillResult, instance: str) -> None:
    expected = scenario.expected
    assert expected is not None
    severity = result.alerts[expected].severity
    keys = {
        p["body"]["dedup_key"]
        for p in result.pages
        if p["alertname"] == expected and p["body"].get("event_action") == "trigger"
    }
    assert keys == {expected_dedup_key(expected, severity, instance)}, keys


def check_diagnose(scenario: Scenario, result: DrillResult) -> None:
    assert result.diagnose is not None, f"diagnose failed: {result.diagnose_error}"
    findings = result.diagnose["findings"]
    ranked = [(f["alert"], f["status"]) for f in findings]
    assert findings and findings[0]["alert"] == scenario.expected, (
        f"diagnose ranks {ranked} for {scenario.name}"
    )
    assert findings[0]["status"] == "holds", ranked


def result_key(scenario: Scenario) -> str:
    """A drill's key in the results: the scenario, prefixed by a third-party engine's name."""
    return scenario.name if scenario.engine == "reference" else f"{scenario.engine}/{scenario.name}"


def check_postmortem(scenario: Scenario, result: DrillResult) -> None:
    """The drill's own `diagnose --report`: the cause first, every plot drawn from the drill's
    data, the window where the cause held and where its alert fired shaded."""
    page = (Path(result.workdir) / POSTMORTEM).read_text(encoding="utf-8")
    held = re.findall(r'<section[^>]*data-alert="(\w+)"[^>]*data-status="holds"', page)
    assert held and held[0] == scenario.expected, held
    plots = dict(re.findall(r'<figure data-panel="([a-z]+)">(.*?)</figure>', page, re.S))
    assert list(plots) == [panel.key for panel in PANELS]
    for key, body in plots.items():
        points = [int(n) for n in re.findall(r'data-points="(\d+)"', body)]
        # a few minutes of a drill at the fast profile's scrape interval
        assert points and max(points) >= 10, (key, points)
        bands = set(re.findall(r'<rect class="(\w+)" data-start=', body))
        assert {"incident", "firing"} <= bands, (key, bands)
    copy = Path(__file__).resolve().parents[2] / "build" / "drills" / f"{scenario.name}.html"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(page, encoding="utf-8")


def check_scaling(scenario: Scenario, result: DrillResult) -> None:
    """Issue 35: the reference engine's drills are advised to scale out only where the cause is
    capacity (queue-flood), and there with both gates open (:func:`drills.slo.check_advice`).
    The third-party engines' drills record the advice for the report only (llama-server's
    queue-flood is a capacity backlog the pack sees without a signature of its own), and so do
    the GPU drills: a KV cache or HBM bandwidth at their limit on a busy GPU are capacity."""
    if scenario.engine != "reference" or scenario.gpu:
        return
    watch = SloWatch.from_json(result.slo)
    assert not watch.error, watch.error
    check_advice(scenario.name, scenario.expected, watch)
    check_burn(scenario.name, scenario.expected, watch, slowdown=result.sized.slowdown)


def run_and_check(scenario: Scenario, workdir: Path, results: dict[str, DrillResult]) -> None:
    result = run_drill(scenario, workdir, device="cuda" if scenario.gpu else "cpu")
    results[result_key(scenario)] = result
    check_result(scenario, result)


def check_result(scenario: Scenario, result: DrillResult) -> None:
    with noting_failure(result):
        _check_result(scenario, result)


def _check_result(scenario: Scenario, result: DrillResult) -> None:
    assert not result.error, result.error + _explain(result)
    if scenario.restart_at_s is not None:
        assert result.restarted_at is not None, "the engine was not restarted"
    if scenario.expected is None:
        check_quiet(result)
        check_scaling(scenario, result)
        return
    check_fired(scenario, result)
    check_scaling(scenario, result)
    check_pages(scenario, result)
    check_dedup_key(scenario, result, result.instance)
    check_diagnose(scenario, result)
    if scenario.engine == "reference":  # the post-mortem's plots need the reference's data
        check_postmortem(scenario, result)


@pytest.mark.parametrize("scenario", timed(CPU_SCENARIOS))
def test_drill(
    scenario: Scenario,
    tmp_path_factory: pytest.TempPathFactory,
    drill_tools: None,
    drill_results: dict[str, DrillResult],
) -> None:
    run_and_check(scenario, tmp_path_factory.mktemp(f"drill-{scenario.name}"), drill_results)


@pytest.mark.parametrize("scenario", timed(GPU_SCENARIOS))
def test_gpu_drill(
    scenario: Scenario,
    tmp_path_factory: pytest.TempPathFactory,
    drill_tools: None,
    drill_results: dict[str, DrillResult],
) -> None:
    assert has_gpu(), "a GPU drill runs on a machine with an NVIDIA GPU (bench/gpu/run.sh)"
    try:
        run_and_check(scenario, tmp_path_factory.mktemp(f"drill-{scenario.name}"), drill_results)
    finally:
        dump_results(drill_results)  # at once: a lent GPU's time may end before the session


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            id=name,
            marks=pytest.mark.timeout(
                max(deadline(s).seconds for s in EXTERNAL_SCENARIOS if s.name == name)
                + DRILL_OVERHEAD_S
            ),
        )
        for name in EXTERNAL_NAMES
    ],
)
def test_external_drill(
    name: str,
    tmp_path_factory: pytest.TempPathFactory,
    drill_tools: None,
    external_tools: None,
    drill_results: dict[str, DrillResult],
) -> None:
    """One scenario on llama-server and on Triton, side by side (half the wall time; the two
    engines' drills share the CPU as the two engines of one node would)."""
    scenarios = [s for s in EXTERNAL_SCENARIOS if s.name == name]
    with ThreadPoolExecutor(len(scenarios)) as pool:
        futures = [
            (s, pool.submit(run_drill, s, tmp_path_factory.mktemp(f"drill-{s.engine}-{name}")))
            for s in scenarios
        ]
        runs = [(s, f.result()) for s, f in futures]
    for s, result in runs:
        drill_results[result_key(s)] = result
    failures = []
    for s, result in runs:
        try:
            check_result(s, result)
        except AssertionError as err:
            failures.append(f"{s.engine}: {err}")
    assert not failures, "\n".join(failures)
