"""The signature catalogue: its fixed alert contract, the rendered files, what diagnose reuses."""

from __future__ import annotations

import re

import pytest
import yaml
from support.paths import ROOT

from exporter.signatures import all_signatures, parse_config, recording_rules
from exporter.signatures.definitions import EFFORTS, FAMILIES, RECORD_NAME, SEVERITIES
from exporter.signatures.params import PARAMS
from exporter.signatures.render import alerts_yaml, pack_recording_rules, recording_rules_yaml
from exporter.signatures.slo.burn_alerts import slo_alerts

# Names, severities and signature groups are a fixed contract: Alertmanager routes, the
# dashboards and a site's silences match on them.
CONTRACT = {
    "InferenceGPUStarvedQueueGrowing": ({"critical"}, "cpu"),
    "InferenceTokenizerSlowerThanDecode": ({"warning"}, "cpu"),
    "InferenceFrontendCPUSaturated": ({"warning"}, "cpu"),
    "InferenceSoftirqCPUHigh": ({"warning"}, "network"),
    "InferenceHBMBandwidthSaturated": ({"warning"}, "memory"),
    "InferenceGPUMemoryHeadroomLow": ({"warning"}, "memory"),
    "InferenceQueueWaitDominatesLatency": ({"warning"}, "queue"),
    "InferenceEngineStalled": ({"critical"}, "queue"),
    "InferenceRequestsRejected": ({"warning"}, "queue"),
    "InferenceGatewayStaleEndpoints": ({"critical"}, "queue"),
    "InferenceGPUUtilizationPulsing": ({"warning"}, "cpu"),
    "InferenceGPUUnderutilized": ({"info"}, "gpu"),
    "InferenceDecodeOverheadBound": ({"warning"}, "roofline"),
    "InferenceGPUBusySMsIdle": ({"warning"}, "roofline"),
    "InferenceHostLatencyShareHigh": ({"warning"}, "roofline"),
    "InferenceKVTransferBound": ({"warning"}, "pool"),
    "InferenceKVTransferFailing": ({"warning"}, "pool"),
    "InferencePrefillPoolShort": ({"warning"}, "pool"),
    "InferenceDecodePoolShort": ({"warning"}, "pool"),
    "InferenceExporterDown": ({"warning"}, "meta"),
    "InferenceCollectorFailing": ({"warning"}, "meta"),
    "InferenceEngineMetricsDown": ({"warning"}, "meta"),
    "InferenceNVMLUnavailable": ({"warning"}, "meta"),
    "InferenceGPUAttributionUncertain": ({"warning"}, "meta"),
    "InferenceGPUMetricsMissing": ({"warning"}, "meta"),
    "InferenceGPULost": ({"critical"}, "gpu"),
    "InferenceGPUXidErrors": ({"critical", "warning"}, "gpu"),
    "InferenceGPUThrottled": ({"warning"}, "gpu"),
    "InferenceGPUContended": ({"warning"}, "gpu"),
    "InferenceInterconnectBound": ({"warning"}, "gpu"),
}
PROFILES = ("sidecar", "dcgm", "fast")


def test_catalogue_matches_the_contract() -> None:
    sigs = all_signatures(parse_config({}))
    assert [s.alert for s in sigs] == list(CONTRACT)
    for sig in sigs:
        severities, family = CONTRACT[sig.alert]
        assert set(sig.severities) == severities, sig.alert
        assert sig.family == family, sig.alert
        assert set(PARAMS[sig.alert]) and PARAMS[sig.alert][0].name == "for"


def test_default_thresholds() -> None:
    cfg = parse_config({})
    sig = {s.alert: s for s in all_signatures(cfg)}
    # Behind the cold-start guard of the longest window each reads; the engine's own share
    # where the GPU is shared with other tenants (sources.py).
    assert sig["InferenceGPUStarvedQueueGrowing"].rules[0].expr == (
        "(\ninference:gpu_own_utilization:mean5m < 0.6\n"
        "and\ninference:queue_depth:deriv10m > 0\n"
        "and\ninference:queue_depth:sum >= 1\n"
        "unless on (namespace, pod, instance, job)\ninference:engine_stalled:active\n)\n"
        "and on (namespace, pod, instance, job)\ninference:exporter_build_info:history10m"
    )
    assert sig["InferenceSoftirqCPUHigh"].rules[0].expr == (
        "(\ninference:cpu_softirq:ratio5m > 0.05\nor\n"
        "inference:cpu_softirq_hottest_core:mean5m > 0.5\n)\n"
        "and on (namespace, pod, instance, job)\ninference:exporter_build_info:history5m"
    )
    assert sig["InferenceGPUStarvedQueueGrowing"].rules[0].history == 600
    assert sig["InferenceSoftirqCPUHigh"].rules[0].history == 300
    # Instant signals and the meta alerts need no history.
    assert sig["InferenceGPULost"].rules[0].history == 0
    assert [r.history for r in sig["InferenceGPUMemoryHeadroomLow"].rules] == [0, 0]
    assert "< 0.8 * (inference:generation_tokens_per_request:rate5m offset 1h)" in (
        sig["InferenceHBMBandwidthSaturated"].rules[0].expr
    )
    xid = sig["InferenceGPUXidErrors"].rules
    assert [r.severity for r in xid] == ["critical", "warning"]
    assert '{xid=~"48|79|94|95"}' in xid[0].expr and '{xid!~"48|79|94|95"}' in xid[1].expr
    fors = {s.alert: [r.for_seconds for r in s.rules] for s in sig.values()}
    assert fors["InferenceGPUStarvedQueueGrowing"] == [600]
    assert fors["InferenceTokenizerSlowerThanDecode"] == [900]
    assert fors["InferenceGPUUnderutilized"] == [1800]
    assert fors["InferenceGPULost"] == [60]
    assert fors["InferenceExporterDown"] == [300, 300]


@pytest.mark.parametrize("profile", PROFILES)
def test_rendered_alerts(profile: str) -> None:
    cfg = parse_config({}, profile)
    data = yaml.safe_load(alerts_yaml(cfg))
    rules = [rule for group in data["groups"] for rule in group["rules"]]
    # The signatures, and the burn-rate alerts of the shipped objectives (their own group).
    burns = {burn.alert for burn in slo_alerts(cfg)}
    assert burns == {"InferenceTTFTBudgetBurn", "InferenceAvailabilityBudgetBurn"}
    assert {r["alert"] for r in rules} == set(CONTRACT) | burns
    slo = next(g for g in data["groups"] if g["name"] == "inference.slo")
    assert {r["alert"] for r in slo["rules"]} == burns
    seen: set[tuple[str, ...]] = set()
    for rule in rules:
        assert re.fullmatch(r"Inference[A-Z][A-Za-z]+", rule["alert"])
        labels, notes = rule["labels"], rule["annotations"]
        family = "slo" if rule["alert"] in burns else labels["signature"]
        assert labels["severity"] in SEVERITIES and family in (*FAMILIES, "slo")
        assert labels["signature"] == family
        assert set(notes) == {"summary", "description", "runbook_url"}
        assert notes["runbook_url"].endswith(f"/docs/runbooks/{rule['alert']}.md")
        # Two rules of one alert never share their label set.
        key = (rule["alert"], *sorted(f"{k}={v}" for k, v in labels.items()))
        assert key not in seen
        seen.add(key)
    meta = next(g for g in data["groups"] if g["name"] == "inference.meta")
    assert all(r["labels"]["signature"] == "meta" for r in meta["rules"])


@pytest.mark.parametrize("profile", PROFILES)
def test_rendered_records_parse_and_are_named_level_metric_operation(profile: str) -> None:
    cfg = parse_config({}, profile)
    data = yaml.safe_load(recording_rules_yaml(cfg))
    # Per-target records, the latency quantiles (tens of buckets per target), then those over
    # per-GPU series (their cost grows with the GPUs): rates over windows, then state.
    assert [g["name"] for g in data["groups"]] == [
        "inference.records",
        "inference.records.latency",
        "inference.records.gpu",
        "inference.records.gpu_state",
        "inference.records.roofline",
        "inference.records.energy",
        "inference.records.pool",
        "inference.records.gateway",
        # Per objective and pool (the period's budget every 2m30s, a group of its own); then
        # which signatures hold, the scaling advice, its gate.
        "inference.records.slo",
        "inference.records.slo.budget",
        "inference.records.verdicts",
    ]
    rules = [rule for group in data["groups"] for rule in group["rules"]]
    names = [r["record"] for r in rules]
    assert names == [r.record for r in pack_recording_rules(cfg)]
    assert names[: len(recording_rules(cfg))] == [r.record for r in recording_rules(cfg)]
    # A name two rules write (one per signature, one per objective) has a label per rule.
    keyed = [(r["record"], tuple(sorted(r.get("labels", {}).items()))) for r in rules]
    assert len(keyed) == len(set(keyed))
    for name in names:
        assert re.fullmatch(r"inference(_gpu|_pool|_gateway)?:[a-z0-9_]+:[a-z0-9_]+", name), name
    # A record only reads records defined before it: in its group, or in the group before.
    for i, rule in enumerate(rules):
        for used in re.findall(RECORD_NAME, rule["expr"]):
            assert used in names[:i], f"{rule['record']} reads {used} before it is recorded"
        if "vector(" in rule["expr"]:  # an objective's target: a constant of its own label
            assert set(rule["labels"]) == {"slo"}, rule
    # Nothing per GPU is read in the per-target groups (the roofline reads the GPUs' peaks:
    # the sidecar's, or the product table's by the name dcgm-exporter gives each GPU), no
    # histogram quantile outside its group.
    peaks = ("inference_gpu_peak_", "DCGM_FI_DEV_GPU_UTIL")
    for group in data["groups"]:
        for rule in group["rules"]:
            if group["name"] == "inference.records.verdicts":
                continue  # the signatures' own conditions, read as the alerts read them
            if group["name"] == "inference.records.roofline":
                per_gpu = re.findall(r"inference_gpu_[a-z_]+|DCGM_[A-Z_]+", rule["expr"])
                assert all(name.startswith(peaks) for name in per_gpu), rule
            elif "inference_gpu_" in rule["expr"] or "DCGM_" in rule["expr"]:
                assert group["name"].startswith("inference.records.gpu"), rule
            quantile = "histogram_quantile" in rule["expr"]
            assert quantile == (group["name"] == "inference.records.latency"), rule


@pytest.mark.parametrize("profile", PROFILES)
def test_alerts_read_only_defined_records(profile: str) -> None:
    cfg = parse_config({}, profile)
    records = {r.record for r in recording_rules(cfg)}
    for sig in all_signatures(cfg):
        for rule in sig.rules:
            texts = [rule.expr, *(e.expr or "" for e in rule.evidence)]
            for text in texts:
                for used in RECORD_NAME.findall(text):
                    assert used in records, f"{sig.alert} reads undefined {used}"


def test_evidence_is_reusable_by_diagnose() -> None:
    """Each evidence query scopes to one alert's labels, or to every target with no matchers."""
    for sig in all_signatures(parse_config({})):
        for rule in sig.rules:
            keys = [e.key for e in rule.evidence]
            assert len(keys) == len(set(keys))
            placeholders = rule.placeholders()
            for item in rule.evidence:
                assert item.key in placeholders, f"{sig.alert}: evidence {item.key} unused"
                if item.expr is not None:
                    assert "{target}" in item.expr
                    one = item.query('{instance="a:1",job="j"}')
                    assert '{instance="a:1",job="j"}' in one and "{target}" not in one
                    assert "{target}" not in item.query("")
            unknown = placeholders - set(keys) - {"target"}
            assert all(p.startswith("labels.") for p in unknown), (sig.alert, unknown)


def test_descriptions_quote_measured_values() -> None:
    """Every description but the pure state alerts quotes at least one measured number."""
    states = {"InferenceExporterDown", "InferenceNVMLUnavailable", "InferenceGPULost"}
    for sig in all_signatures(parse_config({})):
        for rule in sig.rules:
            if sig.alert not in states:
                assert rule.evidence, sig.alert


def test_starved_description_quotes_live_values() -> None:
    text = alerts_yaml(parse_config({}))
    assert "Mean GPU utilisation {{ with printf `100 * inference:gpu_own_utilization:mean5m" in text
    assert "requests in 10m to {{ with printf `inference:queue_depth:sum" in text


def test_runbooks_are_generated_for_every_alert() -> None:
    books = ROOT / "docs" / "runbooks"
    for sig in all_signatures(parse_config({})):
        text = (books / f"{sig.alert}.md").read_text(encoding="utf-8")
        for heading in ("## What it means", "## When it fires", "## How to confirm"):
            assert heading in text, (sig.alert, heading)
        assert "## Fixes, cheapest first" in text
        assert "On the node:" in text and "```promql" in text
        assert len(sig.runbook.on_node) >= 2 and len(sig.runbook.fixes) >= 2
        ranks = [EFFORTS.index(f.effort) for f in sig.runbook.fixes]
        assert ranks == sorted(ranks), f"{sig.alert}: fixes not ranked by effort"
    index = (books / "README.md").read_text(encoding="utf-8")
    assert all(f"[{alert}]({alert}.md)" in index for alert in CONTRACT)


def test_runbooks_name_the_on_node_tools() -> None:
    books = ROOT / "docs" / "runbooks"
    text = "".join(p.read_text(encoding="utf-8") for p in books.glob("Inference*.md"))
    for tool in ("py-spy dump", "mpstat -I SUM -P ALL", "/proc/interrupts", "nvidia-smi dmon"):
        assert tool in text, tool


def test_memory_caveat_for_preallocating_engines() -> None:
    sig = {s.alert: s for s in all_signatures(parse_config({}))}["InferenceGPUMemoryHeadroomLow"]
    framebuffer = sig.rules[1]
    preallocating = "vllm|sglang|tgi|nim|trtllm|dynamo|lmdeploy|ray"  # every such EngineSpec
    assert f'inference_engine_up{{engine=~"{preallocating}"}}' in framebuffer.expr
    assert "unless on (namespace, pod, instance, job)" in framebuffer.expr
    assert any("pre-allocate" in c or "reserve" in c for c in sig.runbook.caveats)
