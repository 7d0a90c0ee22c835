"""``diagnose`` and the post-mortem print the scaling advice and why, from the signatures that
hold and what each declares (``Signature.advice``)."""

from __future__ import annotations

import json
from pathlib import Path

from support.incident import Recorded, run_diagnose

from exporter.diagnose.advice import scaling_advice
from exporter.diagnose.findings import EvidenceValue, Finding, Instance
from exporter.signatures import all_signatures, parse_config

SIGS = {s.alert: s for s in all_signatures(parse_config({}))}


def finding(
    alert: str,
    target: str,
    holds: bool = True,
    labels: tuple[tuple[str, str], ...] = (),
    **evidence: str,
) -> Finding:
    sig = SIGS[alert]
    values = [EvidenceValue(key, key, None, "", text) for key, text in evidence.items()]
    instance = Instance((("instance", target), *labels), holds, not holds, None, [])
    return Finding(sig, sig.rules[0], instance, target, values)


def test_a_blocking_cause_outranks_capacity_and_says_why() -> None:
    findings = [
        finding("InferenceQueueWaitDominatesLatency", "a:1", share="62", depth="9"),
        finding("InferenceFrontendCPUSaturated", "a:1", thread="98", util="41"),
        finding("InferenceQueueWaitDominatesLatency", "b:1", share="55", depth="4"),
        finding("InferenceEngineMetricsDown", "c:1"),
        finding("InferenceSoftirqCPUHigh", "d:1", holds=False, node="4", core="40"),
    ]
    a, b, c = scaling_advice(findings)
    assert (a.target, a.action, a.blocks_scale_out) == ("a:1", "fix_frontend", True)
    assert a.text() == (
        "fix_frontend; scaling out would not help: the engine's front-end thread is at 98 % "
        "of a core while the GPU is 41 % busy: that one thread caps throughput, and each new "
        "replica would hit the same cap with an idle GPU (InferenceFrontendCPUSaturated)"
    )
    assert (b.action, b.blocks_scale_out) == ("scale_out", False)
    assert b.text().startswith("scale out: requests spend 55 % of their latency waiting")
    assert (c.action, c.blocks_scale_out) == ("fix_monitoring", False)
    # A signature that only nearly holds advises nothing.
    assert all(x.target != "d:1" for x in (a, b, c))


def test_several_blocking_causes_name_the_others() -> None:
    (advice,) = scaling_advice(
        [
            finding("InferenceGPUStarvedQueueGrowing", "a:1", util="31", depth="12", growth="+6"),
            finding("InferenceTokenizerSlowerThanDecode", "a:1", tok="48.0", itl="21.5"),
        ]
    )
    assert advice.action == "fix_host_cpu"
    assert advice.also == ("fix_tokenizer (InferenceTokenizerSlowerThanDecode)",)
    assert advice.as_json()["why"].startswith("the GPU is 31 % busy while 12 requests wait")


def test_refusals_are_capacity_but_never_lead_a_stall_or_a_gateway_cause() -> None:
    engine = (("layer", "engine"),)
    hung, full, gated, blind = scaling_advice(
        [
            finding("InferenceRequestsRejected", "hung:1", labels=engine, share="100", refused="2"),
            finding("InferenceEngineStalled", "hung:1", waiting="8", kv="1"),
            finding("InferenceRequestsRejected", "full:1", labels=engine, share="25", refused="1"),
            finding("InferenceGatewayStaleEndpoints", "epp:1", stale="3", queued="140", util="20"),
            finding("InferenceGPUMetricsMissing", "blind:1", tokens="100"),
        ]
    )
    assert hung.text() == (
        "restart_engine; scaling out would not help: 8 requests wait while the engine runs none "
        "and generates no token, its KV cache at 1 %: the engine has stopped, and new replicas "
        "would not drain its queue (InferenceEngineStalled)"
    )
    assert full.text() == (
        "scale out: the engine refuses 25 % of arrivals (1 per second): the replicas admit less "
        "than arrives (InferenceRequestsRejected)"
    )
    assert gated.text() == (
        "fix_gateway_scrape; scaling out would not help: the gateway counts 3 endpoints with "
        "stale metrics as saturated and holds 140 requests while the pool's GPUs are 20 % busy: "
        "new replicas would be gated the same way (InferenceGatewayStaleEndpoints)"
    )
    assert blind.text() == (
        "fix_monitoring: the pack reads no GPU utilisation for an engine generating 100 "
        "tokens/s: nothing to scale on until it can (InferenceGPUMetricsMissing)"
    )


# --- the command and the post-mortem, over a recorded incident (frontend-gil) ------------------


diagnose = run_diagnose


def test_diagnose_prints_the_advice(recorded: Recorded, tmp_path: Path) -> None:
    at = ("--prometheus.url", recorded.url, "--time", str(recorded.end))
    text = diagnose(*at)
    assert text.returncode == 1, text.stdout + text.stderr
    section = text.stdout.split("Scaling advice:\n", 1)[1].split("\n\n", 1)[0]
    (line,) = section.splitlines()
    assert line.startswith(
        "  10.0.3.7:10960: fix_host_cpu; scaling out would not help: the GPU is "
    )
    assert (
        "(InferenceGPUStarvedQueueGrowing); also fix_frontend (InferenceFrontendCPUSaturated)"
        in line
    )
    data = json.loads(diagnose(*at, "--output", "json").stdout)
    (advice,) = data["scaling_advice"]
    assert advice["action"] == "fix_host_cpu" and advice["blocks_scale_out"] is True
    assert advice["text"] == line.split(": ", 1)[1]
    report = tmp_path / "incident.html"
    result = diagnose(*at, "--report", str(report))
    assert result.returncode == 1, result.stdout + result.stderr
    page = report.read_text()
    assert '<ul id="scaling-advice"><li data-action="fix_host_cpu">10.0.3.7:10960: ' in page
    assert page.index('id="scaling-advice"') < page.index('class="cause"')
    markdown = tmp_path / "incident.md"
    assert diagnose(*at, "--report", str(markdown)).returncode == 1
    assert "### Scaling advice\n\n- 10.0.3.7:10960: fix_host_cpu; scaling out would not help" in (
        markdown.read_text()
    )
