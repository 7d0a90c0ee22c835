"""Every signature says what it means for scaling (``Signature.advice``).

The advice is a declared property of each signature: what to do while it holds, and whether
adding replicas is the wrong fix (``blocks_scale_out``). The scaling advice records and the
``scale_out_eligible`` gate are generated from it, and ``diagnose`` prints its ``why`` with
the signature's own numbers, so the sentence may only name evidence the signature quotes.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from exporter.signatures import all_signatures, parse_config
from exporter.signatures.__main__ import runbook_files
from exporter.signatures.definitions import ANNOTATION_PLACEHOLDER, Advice, AdviceAction
from exporter.signatures.slo.verdict_signals import (
    explainers,
    is_gateway_signature,
    is_pool_signature,
    verdict_rules,
)

PROFILES = ("sidecar", "node", "dcgm", "fast")
# A host-side, link or stall cause: more replicas are the wrong fix while one holds.
MUST_BLOCK = {
    "InferenceGPUStarvedQueueGrowing": "fix_host_cpu",
    "InferenceTokenizerSlowerThanDecode": "fix_tokenizer",
    "InferenceFrontendCPUSaturated": "fix_frontend",
    "InferenceSoftirqCPUHigh": "fix_softirq",
    "InferenceGPUUtilizationPulsing": "fix_host_feeding",
    "InferenceHostLatencyShareHigh": "fix_frontend",
    "InferenceKVTransferBound": "fix_kv_link",
    "InferenceKVTransferFailing": "fix_kv_link",
    "InferencePrefillPoolShort": "rebalance_pools",
    "InferenceDecodePoolShort": "rebalance_pools",
    "InferenceEngineStalled": "restart_engine",
    "InferenceGatewayStaleEndpoints": "fix_gateway_scrape",
}
# Capacity: the backlog they describe is what more replicas relieve.
CAPACITY = {
    "InferenceQueueWaitDominatesLatency",
    "InferenceGPUMemoryHeadroomLow",
    "InferenceHBMBandwidthSaturated",
    "InferenceRequestsRejected",
}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_signature_has_advice_that_quotes_its_own_evidence(profile: str) -> None:
    for sig in all_signatures(parse_config({}, profile)):
        assert isinstance(sig.advice, Advice), sig.alert
        assert sig.advice.action in get_args(AdviceAction), sig.alert
        assert sig.advice.why and not sig.advice.why.endswith("."), sig.alert
        wanted = set(ANNOTATION_PLACEHOLDER.findall(sig.advice.why))
        for rule in sig.rules:
            quoted = {e.key for e in rule.evidence}
            labels = {f"labels.{label}" for label in rule.scope}
            assert wanted <= quoted | labels, (sig.alert, wanted - quoted - labels)


def test_host_link_and_stall_causes_block_scaling_out() -> None:
    advice = {s.alert: s.advice for s in all_signatures(parse_config({}))}
    for alert, action in MUST_BLOCK.items():
        assert advice[alert].action == action, alert
        assert advice[alert].blocks_scale_out, alert
    for alert in CAPACITY:
        assert advice[alert].action == "scale_out", alert
        assert not advice[alert].blocks_scale_out, alert
    # The pack's blind spots neither block nor allow: the gate needs the pod's own signals.
    for alert, item in advice.items():
        if alert.endswith(("Down", "Failing", "Missing", "Unavailable", "Uncertain")) and (
            "KV" not in alert
        ):
            assert item.action == "fix_monitoring" and not item.blocks_scale_out, alert


def test_an_advice_to_scale_out_cannot_block_it() -> None:
    with pytest.raises(ValueError, match="cannot block"):
        Advice("scale_out", blocks_scale_out=True, why="x")


def test_gateway_and_pool_signatures_are_told_apart() -> None:
    """A gateway's signature holds on the engines it feeds too; a pool's on its pool."""
    sigs = all_signatures(parse_config({}, "sidecar"))
    assert {s.alert for s in sigs if is_gateway_signature(s)} == {"InferenceGatewayStaleEndpoints"}
    assert {s.alert for s in sigs if is_pool_signature(s)} == {
        "InferencePrefillPoolShort",
        "InferenceDecodePoolShort",
        "InferenceKVTransferBound",
        "InferenceKVTransferFailing",
    }


def test_an_explained_signature_is_left_out_where_its_cause_holds_in_one_pass() -> None:
    """The explained signature's holding record writes out the explaining conditions: it reads
    no holding record (vmalert would see its own group's records one evaluation late)."""
    cfg = parse_config({}, "sidecar")
    sigs = all_signatures(cfg)
    explained = explainers(sigs)
    assert explained["InferenceRequestsRejected"] == ("InferenceGatewayStaleEndpoints",)
    assert explained["InferenceDecodeOverheadBound"] == ("InferenceSoftirqCPUHigh",)
    holding = [r for r in verdict_rules(cfg) if r.record.endswith(":bottleneck_signature:holding")]
    assert len(holding) == len(sigs)
    causes = [s for s in sigs if s.explains and not is_pool_signature(s)]
    assert {c.alert for c in causes} == {
        "InferenceGatewayStaleEndpoints",
        "InferenceSoftirqCPUHigh",
    }
    for rule in holding:
        assert ":bottleneck_signature:holding" not in rule.expr, rule.labels
        alert = dict(rule.labels)["alertname"]
        for cause in causes:
            assert (cause.rules[0].expr in rule.expr) == (
                alert in cause.explains or alert == cause.alert
            ), (alert, cause.alert)


def test_the_runbooks_say_what_explains_what() -> None:
    """Each runbook names the signatures it explains and those that explain it; a pool's cause
    of a pod's signature only ranks first in ``diagnose`` (the advice is per pool)."""
    cfg = parse_config({}, "sidecar")
    pages = {p.stem: text for p, text in runbook_files(cfg, Path("runbooks")).items()}
    link = "[InferenceDecodeOverheadBound](InferenceDecodeOverheadBound.md)"
    assert f"**Explains:** {link}. " in pages["InferenceSoftirqCPUHigh"]
    assert "name this cause alone" in pages["InferenceSoftirqCPUHigh"]
    cause = "[InferenceSoftirqCPUHigh](InferenceSoftirqCPUHigh.md)"
    assert f"**Explained by:** {cause}. " in pages["InferenceDecodeOverheadBound"]
    starved = pages["InferenceGPUStarvedQueueGrowing"]
    assert "**Explained by:** [InferenceGatewayStaleEndpoints]" in starved
    assert "**Explained by the pool's:** [InferenceKVTransferBound]" in starved
    kv = pages["InferenceKVTransferBound"]
    assert "written per pool" in kv and "name this cause alone" not in kv
    for alert in ("InferenceEngineStalled", "InferenceTokenizerSlowerThanDecode"):
        assert "**Explain" not in pages[alert], alert
