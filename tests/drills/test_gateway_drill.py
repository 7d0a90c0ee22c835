"""The gateway drill: the reference engine behind a stand-in llm-d endpoint picker whose reads of
the engine's metrics break (:data:`drills.scenarios.GATEWAY_SCENARIOS`).

The same harness as the CPU matrix (:func:`drills.harness.run_drill`, the default node layout
and its fast rules): the stack with the gateway in front of the engine (its own sidecar,
``--engine.type llmd-epp``, scraped as ``drill/gateway-0``), the calibration against the engine
itself before Prometheus starts (the pack reads none of it), a load that keeps well within what
the engine serves sent to the gateway. The gateway's endpoint metrics go stale; it holds every
request until its TTL evicts it, and none reaches the engine, whose GPU idles.
``InferenceGatewayStaleEndpoints`` must fire on the gateway's target before the deadline from its
rule timings, page on the critical receiver with the gateway's stable ``dedup_key``, rank first
in ``diagnose``, whose advice is ``fix_gateway_scrape`` with scaling out blocked, on the gateway
and on the engine alike (nothing else: the starved GPU is its consequence); the pack's own
scale-out gate is closed on the engine's pod by that cause, and its advice records say the
scrape alone.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from drills.harness import (
    JOB,
    POSTMORTEM,
    DrillResult,
    noting_failure,
    route_key,
    run_drill,
)
from drills.scenarios import GATEWAY_SCENARIOS, STALE_ENDPOINTS, Scenario, deadline

from exporter.lab.stack import GATEWAY_TARGET_LABELS
from exporter.signatures.render import runbook_url
from exporter.signatures.site import load_config

# Beside its deadline: the stack's start, the calibration, the pages and diagnose, shutdown
# (as the CPU matrix's drills).
DRILL_OVERHEAD_S = 240 + 2 * 120 + 60 + 60
GATEWAY = "drill/gateway-0"
ENGINE = "drill/reference-0"
RECEIVER = {"critical": "pagerduty", "warning": "pagerduty-low-urgency"}


def _explain(result: DrillResult) -> str:
    alerts = {name: seen.told() for name, seen in result.alerts.items()}
    samples = result.slo.get("samples") or [{}]
    return (
        f"\n  alerts: {alerts}\n  signals: {result.signals}\n  load: {result.load}"
        f"\n  advice (every pod, last look): {samples[-1].get('pod_advice', '-')}"
        f"\n  error: {result.error or '-'}\n  logs: {result.workdir}"
    )


def gateway_dedup_key(alertname: str, severity: str, instance: str) -> str:
    """Alertmanager's dedup_key of the gateway target's group."""
    labels = {"alertname": alertname, "instance": instance, "job": JOB, **GATEWAY_TARGET_LABELS}
    body = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return hashlib.sha256(f"{route_key(severity)}:{{{body}}}".encode()).hexdigest()


def check_held(result: DrillResult) -> None:
    """The gateway, not the engine, held the load: its endpoint stale, its saturation at the
    set point, requests in its queue and shed, none dispatched; the engine's own queue empty
    and its share of the gateway's queue what the pack counts for it."""
    s = result.signals
    assert s.get("gateway_stale") == 1, _explain(result)
    assert s.get("gateway_saturation") == 1.0, _explain(result)
    assert (s.get("gateway_queue") or 0) >= 1, _explain(result)
    assert not s.get("gateway_dispatched"), _explain(result)
    assert not s.get("engine_own_queue"), _explain(result)
    # Nothing ran on the engine while Prometheus watched: the load stopped at the gateway, and
    # the calibration before Prometheus started (its full batch, read by the pack, left a
    # second advice on the engine at 8x slower).
    assert s.get("engine_ran") == 0, _explain(result)
    assert s.get("engine_share_less_gateway_queue") == 0, _explain(result)
    assert (s.get("pool_gpu_util") or 1.0) < 0.5, _explain(result)
    load = result.load
    assert load is not None and load.get("completed") == 0, _explain(result)
    # evicted at the gateway's TTL: 503 (flow control: EvictedTTL)
    assert load["errors"].get("HTTP 503", 0) >= 1, load["errors"]


def check_fired(scenario: Scenario, result: DrillResult) -> None:
    fired = result.fired()
    assert STALE_ENDPOINTS in fired, (
        f"{STALE_ENDPOINTS} did not fire within {result.sized.deadline_s:.0f}s"
        f" ({result.sized.deadline_how}){_explain(result)}"
    )
    unexpected = sorted(set(fired) - {STALE_ENDPOINTS} - set(scenario.allowed))
    assert not unexpected, f"unexpected alerts fired: {unexpected}{_explain(result)}"
    description = result.alerts[STALE_ENDPOINTS].description
    # The page quotes what it measured: one stale endpoint, saturation 1.00, the queue.
    assert "metrics of 1 endpoints" in description, description
    assert "saturation 1.00" in description and " ? " not in description, description


def check_pages(scenario: Scenario, result: DrillResult) -> None:
    """A page and its repeat on the critical receiver, for the gateway's target, with its
    runbook and the group's stable dedup_key."""
    severity = result.alerts[STALE_ENDPOINTS].severity
    assert severity == "critical", severity
    pages = [
        p
        for p in result.pages
        if p["alertname"] == STALE_ENDPOINTS and p["body"].get("event_action") == "trigger"
    ]
    assert len(pages) >= 2, f"expected a page and its repeat, got {len(pages)}{_explain(result)}"
    strays = {p["alertname"] for p in result.pages} - {STALE_ENDPOINTS, *scenario.allowed}
    assert not strays, f"pages for alerts that must not fire: {sorted(strays)}"
    runbook = runbook_url(load_config(None, "fast"), STALE_ENDPOINTS)
    for page in pages:
        payload = page["body"]["payload"]
        assert page["receiver"] == RECEIVER[severity], page["receiver"]
        assert payload["source"] == GATEWAY and payload["severity"] == severity
        summary = f"Gateway {GATEWAY} gates reference-tiny on stale endpoint metrics"
        assert payload["summary"].startswith(summary), payload["summary"]
        details = payload["custom_details"]
        assert details["alertname"] == STALE_ENDPOINTS and details["runbook_url"] == runbook
        assert details["target"] == GATEWAY, details["target"]
        assert details["description"].endswith(
            "Fix the gateway's scrape of the engines; do not scale."
        )
    keys = {p["body"]["dedup_key"] for p in pages}
    assert keys == {gateway_dedup_key(STALE_ENDPOINTS, severity, result.gateway_instance)}, keys


def check_diagnose(result: DrillResult) -> None:
    """The gateway's cause first, holding, on the gateway's target; its advice the scrape,
    scaling out blocked; no target advised to scale out."""
    assert result.diagnose is not None, f"diagnose failed: {result.diagnose_error}"
    findings = result.diagnose["findings"]
    ranked = [(f["alert"], f["status"]) for f in findings]
    assert findings and findings[0]["alert"] == STALE_ENDPOINTS, f"diagnose ranks {ranked}"
    assert findings[0]["status"] == "holds", ranked
    advice = result.diagnose["scaling_advice"]
    assert advice and advice[0]["cause"] == STALE_ENDPOINTS, advice
    assert advice[0]["action"] == "fix_gateway_scrape" and advice[0]["blocks_scale_out"], advice
    assert "scaling out would not help" in advice[0]["text"], advice[0]["text"]
    assert not [a for a in advice if a["action"] == "scale_out"], advice
    # the engine behind it: the scrape alone, the starved GPU (where it holds) its consequence
    engine = [a for a in advice if a["target"] == ENGINE]
    assert [(a["action"], a["cause"], a["also"]) for a in engine] == [
        ("fix_gateway_scrape", STALE_ENDPOINTS, [])
    ], advice
    assert {a["action"] for a in advice} == {"fix_gateway_scrape"}, advice
    explained = [f for f in findings if f["target"] == ENGINE and f["status"] == "holds"]
    assert all(f["explained_by"] == f"{STALE_ENDPOINTS} on {GATEWAY}" for f in explained), [
        (f["alert"], f["explained_by"]) for f in explained
    ]


def check_gate(result: DrillResult) -> None:
    """The pack's own verdict records: the engine's pod blocked from scaling out by the
    gateway's cause, its advice and its pool's the scrape, and nothing else (the starved
    GPU's fix_host_cpu is the gateway's consequence, not a second cause)."""
    s = result.signals
    assert s.get("scale_out_blocked") == 1, _explain(result)
    assert s.get("scale_out_eligible") == 0, _explain(result)
    assert s.get("pool_scale_out_eligible") == 0, _explain(result)
    assert s.get("engine_advice_fix_gateway_scrape") == 1, _explain(result)
    assert not s.get("engine_advice_other"), _explain(result)
    # the share of the pool's pods where it holds: the engine's, and the gateway's where the
    # pack counts the gateway's target among the pool's
    assert (s.get("pool_advice_fix_gateway_scrape") or 0) >= 0.5, _explain(result)


def check_postmortem(result: DrillResult) -> None:
    page = (Path(result.workdir) / POSTMORTEM).read_text(encoding="utf-8")
    held = re.findall(r'<section[^>]*data-alert="(\w+)"[^>]*data-status="holds"', page)
    assert held and held[0] == STALE_ENDPOINTS, held


def check_gateway_drill(scenario: Scenario, result: DrillResult) -> None:
    assert not result.error, result.error + _explain(result)
    check_fired(scenario, result)
    check_held(result)
    check_pages(scenario, result)
    check_diagnose(result)
    check_gate(result)
    check_postmortem(result)


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(
            s, id=s.name, marks=pytest.mark.timeout(deadline(s).seconds + DRILL_OVERHEAD_S)
        )
        for s in GATEWAY_SCENARIOS
    ],
)
def test_gateway_drill(
    scenario: Scenario,
    tmp_path_factory: pytest.TempPathFactory,
    drill_tools: None,
    drill_results: dict[str, DrillResult],
) -> None:
    result = run_drill(scenario, tmp_path_factory.mktemp(f"drill-{scenario.name}"))
    drill_results[scenario.name] = result  # the drill report's gateway section
    with noting_failure(result):
        check_gateway_drill(scenario, result)
