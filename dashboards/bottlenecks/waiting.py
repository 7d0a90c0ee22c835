"""Row "What is the GPU waiting for": each CPU-, queue- and memory-side suspect next to the GPU.

Each panel puts one suspect beside the signal it starves or saturates; dashed lines are the
thresholds of the matching signature alert, drawn on the signal that alert reads (the rule
pack's records, so every layout shows the same thing).
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    AnyPanel,
    Query,
    Unit,
    alert_threshold,
    by,
    gpu_legend,
    pct,
    quantile,
    rate,
    signal,
    target_legend,
    timeseries,
    warn,
)
from exporter.signatures.signals.cpu_signals import (
    HOTTEST_THREAD,
    SOFTIRQ_HOTTEST_CORE,
    SOFTIRQ_SHARE,
)
from exporter.signatures.signals.engine_signals import (
    GENERATION_TOKENS,
    KV_CACHE,
    QUEUE_DEPTH,
    TOKENS_PER_REQUEST,
)
from exporter.signatures.signals.gpu_signals import HBM_BANDWIDTH, MEMORY_USED
from exporter.signatures.signals.latency_signals import INTER_TOKEN_MEDIAN, TOKENIZER_MEDIAN
from exporter.signatures.signals.shared_gpu_signals import GPU_OWN_UTILIZATION

TITLE = "What is the GPU waiting for"

STARVED = "InferenceGPUStarvedQueueGrowing"
FRONTEND = "InferenceFrontendCPUSaturated"
SOFTIRQ = "InferenceSoftirqCPUHigh"
HBM = "InferenceHBMBandwidthSaturated"
HEADROOM = "InferenceGPUMemoryHeadroomLow"


def utilisation_vs_queue() -> AnyPanel:
    low = alert_threshold(STARVED, "utilization_below")
    return timeseries(
        "GPU utilisation (the engine's own share) vs queue depth",
        "Mean utilisation of the pod's GPUs counting only the engine's own share of a GPU other "
        "tenants share (left; exact mean of every driver sample over the rule pack's window) "
        "and requests waiting in the engine's queue (right): what InferenceGPUStarvedQueueGrowing "
        "and InferenceGPUUnderutilized read. "
        f"Bad: utilisation below {pct(low)} while the queue grows - the GPU is starved by "
        "the CPU side (tokenizer, scheduler, host-to-device copies) and more GPUs will not "
        "help. A full GPU with a growing queue is plain overload. The device's own "
        "utilisation, every tenant's work together, is on the GPU detail dashboard.",
        [
            Query(
                signal(GPU_OWN_UTILIZATION),
                f"engine's own utilisation {target_legend()}",
            ),
            Query(
                signal(QUEUE_DEPTH),
                f"queue {target_legend()}",
                axis="right",
                unit=Unit.of(QUEUE_DEPTH.unit),
            ),
        ],
        unit=Unit.of(GPU_OWN_UTILIZATION.unit),
        maximum=1.0,
        thresholds=[warn(low)],
        right_label="requests waiting",
    )


def tokenizer_vs_decode() -> AnyPanel:
    return timeseries(
        "Tokenizer latency vs inter-token latency",
        "Median time to tokenize a ~512-token prompt (the sidecar's probe) against the median "
        "inter-token latency, i.e. one decode step as a request sees it: what "
        "InferenceTokenizerSlowerThanDecode reads; the engine's own tokenizer histogram where it "
        "reports one. Bad: the tokenizer line above the decode line while "
        "requests run - tokenizing one prompt costs more than a decode step, so the front-end "
        "CPU sets the pace. The dashed line is the probe's 1-token round trip (HTTP and event "
        "loop, not tokenizing): when it climbs too, the whole front-end is saturated.",
        [
            Query(signal(TOKENIZER_MEDIAN), f"tokenizer p50 (probe) {target_legend()}"),
            Query(signal(INTER_TOKEN_MEDIAN), f"inter-token p50 {target_legend()}"),
            Query(
                quantile(0.5, "inference_tokenizer_latency_seconds", 'source="engine"'),
                f"tokenizer p50 (engine) {target_legend()}",
            ),
            Query(
                quantile(0.5, "inference_tokenizer_probe_rtt_seconds"),
                f"1-token round trip p50 {target_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.SECONDS,
    )


def softirq() -> AnyPanel:
    node = alert_threshold(SOFTIRQ, "node_share_above")
    core = alert_threshold(SOFTIRQ, "hottest_core_above")
    return timeseries(
        "Softirq share: node and hottest core",
        "Share of the node's CPU time spent in softirq (interrupt handling, mostly NET_RX for "
        "request and streaming traffic), and the share of its busiest single core: what "
        "InferenceSoftirqCPUHigh reads. "
        f"Bad: the node above {pct(node)} or one core above {pct(core)} - the interrupts eat "
        "the CPU that tokenizes and schedules for the GPU (NET_RX is often pinned to one core, "
        "which the node average hides).",
        [
            Query(signal(SOFTIRQ_SHARE), f"node {target_legend()}", thresholds=(warn(node),)),
            Query(
                signal(SOFTIRQ_HOTTEST_CORE),
                f"hottest core {target_legend()}",
                thresholds=(warn(core),),
            ),
        ],
        unit=Unit.RATIO,
    )


def hottest_thread() -> AnyPanel:
    above = alert_threshold(FRONTEND, "hottest_thread_above")
    return timeseries(
        "Engine hottest-thread CPU",
        "CPU share of the engine's single busiest thread (left; 100 % = one full core; what "
        "InferenceFrontendCPUSaturated reads) and the CPU used by the engine's processes by "
        "name (right, cores). "
        f"Bad: the hottest thread above {pct(above)} while GPU utilisation is low - a GIL-bound "
        "front-end (HTTP, tokenization, scheduling) caps throughput however many cores the node "
        "has. Needs shareProcessNamespace: true on the pod.",
        [
            Query(signal(HOTTEST_THREAD), f"hottest thread {target_legend()}"),
            Query(
                by("sum", rate("inference_engine_process_cpu_seconds_total"), "process"),
                f"{{{{process}}}} {target_legend()}",
                axis="right",
                unit=Unit.CORES,
            ),
        ],
        unit=Unit.RATIO,
        thresholds=[warn(above)],
        right_label="cores",
    )


def bandwidth_vs_tokens() -> AnyPanel:
    above = alert_threshold(HBM, "bandwidth_above")
    return timeseries(
        "HBM bandwidth utilisation vs generation tokens/s",
        "HBM bandwidth used as a share of the peak, mean over the pod's GPUs (left; GPM, Hopper "
        "and newer, or dcgm-exporter's DRAM activity) against tokens generated per second and "
        "per running request (right): what InferenceHBMBandwidthSaturated reads. "
        f"Bad: bandwidth above {pct(above)} while tokens/s stays flat and tokens/s per request "
        "falls - decode is memory-bound, and more concurrent decodes only split the same "
        "bandwidth.",
        [
            Query(signal(HBM_BANDWIDTH), f"HBM bandwidth {target_legend()}"),
            Query(
                signal(GENERATION_TOKENS),
                f"tokens/s {target_legend()}",
                axis="right",
                unit=Unit.of(GENERATION_TOKENS.unit),
            ),
            Query(
                signal(TOKENS_PER_REQUEST),
                f"tokens/s per request {target_legend()}",
                axis="right",
                unit=Unit.of(TOKENS_PER_REQUEST.unit),
                dashed=True,
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        thresholds=[warn(above)],
        right_label="tokens/s",
    )


def headroom() -> AnyPanel:
    kv = alert_threshold(HEADROOM, "kv_cache_above")
    framebuffer = alert_threshold(HEADROOM, "framebuffer_above")
    return timeseries(
        "KV-cache and framebuffer headroom",
        "KV-cache usage as the engine reports it and framebuffer used per GPU of the pod "
        "(headroom is what is left to 100 %): what InferenceGPUMemoryHeadroomLow reads. Bad: KV "
        f"cache above {pct(kv)} - the engine is about to queue or "
        "preempt requests; keep 10-15 % headroom. Framebuffer near 100 % is normal for vLLM, "
        "SGLang and TGI (they pre-allocate it); for other engines above "
        f"{pct(framebuffer)} the next allocation may fail with CUDA out of memory.",
        [
            Query(signal(KV_CACHE), f"KV cache {target_legend()}", thresholds=(warn(kv),)),
            Query(
                by("max", signal(MEMORY_USED), "gpu"),
                f"framebuffer {gpu_legend()}",
                thresholds=(warn(framebuffer),),
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
    )


def panels() -> Sequence[AnyPanel]:
    return [
        utilisation_vs_queue(),
        tokenizer_vs_decode(),
        softirq(),
        hottest_thread(),
        bandwidth_vs_tokens(),
        headroom(),
    ]
