"""``diagnose`` on a stalled engine, a gateway gating on stale endpoint metrics, and a dcgm
profile whose inputs are missing: the cause ranks first, its consequences do not outrank it,
and inputs of neither dcgm-exporter generation are named.

In process, over hand-written scrapes of one sidecar (the evaluator ``--target`` uses), and
over findings built by hand for the ranking.
"""

from __future__ import annotations

import asyncio

from exporter.diagnose.datasources import Scrape, TargetBackend, target_evaluator
from exporter.diagnose.diagnosis import Report
from exporter.diagnose.evaluate import evaluate, missing_inputs
from exporter.diagnose.findings import Condition, Finding, Instance, explained_first
from exporter.diagnose.promql_eval import Labels
from exporter.signatures import all_signatures, parse_config
from exporter.signatures.site import SiteConfig

STALLED = "InferenceEngineStalled"
STARVED = "InferenceGPUStarvedQueueGrowing"
VLLM = {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "role": "both"}


def lab(name: str, **labels: str) -> Labels:
    return tuple(sorted({"__name__": name, **labels}.items()))


def engine_scrape(t: float, *, queue: float, running: float, kv: float, tokens: float) -> Scrape:
    """One scrape of a sidecar in front of a vLLM whose GPU is 2 % busy."""
    return Scrape(
        t,
        {
            lab("inference_exporter_build_info", version="0.1.0"): 1,
            lab("inference_engine_info", version="0.11.0", **VLLM): 1,
            lab("inference_queue_depth", **VLLM): queue,
            lab("inference_requests_running", **VLLM): running,
            lab("inference_kv_cache_usage_ratio", **VLLM): kv,
            lab("inference_generation_tokens_total", **VLLM): tokens,
            lab("inference_gpu_busy_seconds_total", gpu="0", uuid="GPU-0"): 0.02 * t,
        },
    )


def diagnose(scrapes: list[Scrape], cfg: SiteConfig | None = None) -> Report:
    cfg = cfg or parse_config({})
    report = Report("target", "t", cfg, 0.25, scrapes[-1].time)
    backend = TargetBackend(target_evaluator(scrapes, cfg))
    asyncio.run(evaluate(backend, report, "t"))
    return report


def holding(report: Report) -> list[str]:
    return [f.sig.alert for f in report.findings if f.instance.holds]


def test_a_stalled_engine_ranks_first_and_the_starved_gpu_does_not_hold() -> None:
    """Requests arriving at an engine that admits nothing: its queue grows and its GPU idles,
    the starved-GPU conditions hold, and the stall explains them: only the stall holds."""
    report = diagnose(
        [engine_scrape(t, queue=2 + t, running=0, kv=0.01, tokens=500) for t in range(6)]
    )
    assert holding(report) == [STALLED]
    (stall,) = [f for f in report.findings if f.sig.alert == STALLED]
    assert report.findings[0] is stall
    assert stall.rule.severity == "critical"
    assert stall.instance.value == 7  # waiting now
    assert {e.key: e.value for e in stall.evidence} == {"waiting": 7, "kv": 1.0}
    assert STARVED not in {f.sig.alert for f in report.findings}
    # The same engine holding its KV cache has not stalled: the starved GPU holds then.
    held = diagnose(
        [engine_scrape(t, queue=2 + t, running=0, kv=0.6, tokens=500) for t in range(6)]
    )
    assert STARVED in holding(held) and STALLED not in holding(held)


def test_slow_but_moving_and_idle_engines_are_not_stalled() -> None:
    slow = diagnose(
        [engine_scrape(t, queue=6, running=1, kv=0.02, tokens=500 + 0.5 * t) for t in range(6)]
    )
    idle = diagnose([engine_scrape(t, queue=0, running=0, kv=0, tokens=500) for t in range(6)])
    for report in (slow, idle):
        assert STALLED not in holding(report)


def _finding(alert: str, gap: float, state: str) -> Finding:
    sig = {s.alert: s for s in all_signatures(parse_config({}))}[alert]
    cond = Condition("x", ">", 1.0 + gap, 1.0, holds=True, gap=gap)
    instance = Instance((), holds=True, nearly=False, value=1.0, conditions=[cond])
    return Finding(sig, sig.rules[0], instance, "t", [], state=state)


def test_a_gateway_on_stale_metrics_ranks_before_the_gpus_it_starves() -> None:
    """Both critical; the starved pool's engines are far over their thresholds and firing,
    the gateway just over and pending: the margin would rank the consequence first."""
    starved = _finding(STARVED, 3.0, "firing")
    stale = _finding("InferenceGatewayStaleEndpoints", 0.1, "pending")
    rejected = _finding("InferenceRequestsRejected", 2.0, "firing")
    lost = _finding("InferenceGPULost", 5.0, "firing")
    ranked = sorted([stale, starved, lost, rejected], key=Finding.sort_key)
    assert ranked.index(starved) < ranked.index(stale)
    ordered = explained_first(ranked)
    assert ordered.index(stale) < ordered.index(starved)
    assert ordered.index(stale) < ordered.index(rejected)
    # a finding it does not explain keeps its place
    assert ordered.index(lost) == ranked.index(lost)
    assert explained_first([starved]) == [starved]


def test_a_slow_kv_link_ranks_before_the_starved_gpu_waiting_on_it() -> None:
    """A disaggregated pool whose KV link holds back its first tokens (warning, pending) and a
    decode pod whose GPU starves with a request waiting for its cache (critical, just over):
    severity would rank the consequence first (the 8x-slowed kv-transfer-slow drill's diagnose
    did); the link is the cause. A starved GPU with no link cause keeps its rank."""
    starved = _finding(STARVED, 0.2, "pending")
    link = _finding("InferenceKVTransferBound", 0.5, "firing")
    ranked = sorted([link, starved], key=Finding.sort_key)
    assert ranked == [starved, link]
    assert explained_first(ranked) == [link, starved]
    failing = _finding("InferenceKVTransferFailing", 0.5, "firing")
    assert explained_first(sorted([failing, starved], key=Finding.sort_key))[0] is starved


def test_missing_dcgm_inputs_are_named_with_every_name_looked_for() -> None:
    """dcgm profile: a quantity with no series under any name is listed; one under 4.10's name
    is not; the other profiles list nothing."""
    series = {
        lab("inference_exporter_build_info", version="0.1.0"): 1,
        lab("DCGM_FI_DEV_GPU_UTIL_RATIO", gpu="0", UUID="GPU-0", namespace="a", pod="b"): 0.8,
        lab("DCGM_FI_DEV_FB_USED", gpu="0", UUID="GPU-0", namespace="a", pod="b"): 1000,
    }
    scrapes = [Scrape(0, series), Scrape(1, series)]
    dcgm = parse_config({}, "dcgm")
    backend = TargetBackend(target_evaluator(scrapes, dcgm))
    missing = asyncio.run(missing_inputs(backend, dcgm))
    titles = [line.split(":")[0] for line in missing]
    assert "GPU utilisation" not in titles and "framebuffer used" not in titles
    assert "framebuffer free" in titles and "SM activity" in titles
    assert (
        "framebuffer free: none of DCGM_FI_DEV_FB_FREE_BYTES (bytes, dcgm-exporter 4.9 and "
        "later), DCGM_FI_DEV_FB_FREE (MiB, dcgm-exporter 4.8 and before)"
    ) in missing
    assert any(line.endswith("(not in dcgm-exporter's default counters)") for line in missing)
    sidecar = parse_config({})
    backend = TargetBackend(target_evaluator(scrapes, sidecar))
    assert asyncio.run(missing_inputs(backend, sidecar)) == []
