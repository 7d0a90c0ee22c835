"""Row "What is the GPU waiting for": each CPU-, queue- and memory-side suspect next to the GPU.

Each panel puts one suspect beside the signal it starves or saturates; dashed lines are the
thresholds of the matching signature alert (shipped defaults).
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    GPU,
    MODEL,
    AnyPanel,
    Query,
    Unit,
    alert_threshold,
    by,
    gpu_legend,
    over,
    pct,
    quantile,
    rate,
    series,
    target_legend,
    timeseries,
    warn,
)

TITLE = "What is the GPU waiting for"

STARVED = "InferenceGPUStarvedQueueGrowing"
FRONTEND = "InferenceFrontendCPUSaturated"
SOFTIRQ = "InferenceSoftirqCPUHigh"
HBM = "InferenceHBMBandwidthSaturated"
HEADROOM = "InferenceGPUMemoryHeadroomLow"


def utilisation_vs_queue() -> AnyPanel:
    low = alert_threshold(STARVED, "utilization_below")
    return timeseries(
        "GPU utilisation vs queue depth",
        "Mean GPU utilisation over the selected GPUs (left, exact mean of every driver sample) "
        "and requests waiting in the engine's queue (right). "
        f"Bad: utilisation below {pct(low)} while the queue grows - the GPU is starved by "
        "the CPU side (tokenizer, scheduler, host-to-device copies) and more GPUs will not "
        "help. A full GPU with a growing queue is plain overload.",
        [
            Query(
                by("avg", rate("inference_gpu_busy_seconds_total", GPU)),
                f"GPU utilisation {target_legend()}",
            ),
            Query(
                by("sum", series("inference_queue_depth", MODEL)),
                f"queue {target_legend()}",
                axis="right",
                unit=Unit.COUNT,
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        thresholds=[warn(low)],
        right_label="requests waiting",
    )


def tokenizer_vs_decode() -> AnyPanel:
    return timeseries(
        "Tokenizer latency vs inter-token latency",
        "Median time to tokenize a ~512-token prompt (the sidecar's probe; source=engine where "
        "the engine reports its own) against the median inter-token latency, i.e. one decode "
        "step as a request sees it. Bad: the tokenizer line above the decode line while "
        "requests run - tokenizing one prompt costs more than a decode step, so the front-end "
        "CPU sets the pace. The dashed line is the probe's 1-token round trip (HTTP and event "
        "loop, not tokenizing): when it climbs too, the whole front-end is saturated.",
        [
            Query(
                quantile(0.5, "inference_tokenizer_latency_seconds", extra=("source",)),
                f"tokenizer p50 ({{{{source}}}}) {target_legend()}",
            ),
            Query(
                quantile(0.5, "inference_inter_token_latency_seconds", MODEL),
                f"inter-token p50 {target_legend()}",
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
    softirq_seconds = by("sum", rate("inference_cpu_seconds_total", 'mode="softirq"'))
    all_seconds = by("sum", rate("inference_cpu_seconds_total"))
    return timeseries(
        "Softirq share: node and hottest core",
        "Share of the node's CPU time spent in softirq (interrupt handling, mostly NET_RX for "
        "request and streaming traffic), and the share of its busiest single core. "
        f"Bad: the node above {pct(node)} or one core above {pct(core)} - the interrupts eat "
        "the CPU that tokenizes and schedules for the GPU (NET_RX is often pinned to one core, "
        "which the node average hides).",
        [
            Query(
                f"{softirq_seconds}\n/\n{all_seconds}",
                f"node {target_legend()}",
                thresholds=(warn(node),),
            ),
            Query(
                by("max", series("inference_cpu_softirq_hottest_core_ratio")),
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
        "CPU share of the engine's single busiest thread (left; 100 % = one full core) and the "
        "CPU used by the engine's processes by name (right, cores). "
        f"Bad: the hottest thread above {pct(above)} while GPU utilisation is low - a GIL-bound "
        "front-end (HTTP, tokenization, scheduling) caps throughput however many cores the node "
        "has. Needs shareProcessNamespace: true on the pod.",
        [
            Query(
                by("max", series("inference_engine_hottest_thread_cpu_ratio")),
                f"hottest thread {target_legend()}",
            ),
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
    tokens = by("sum", rate("inference_generation_tokens_total", MODEL))
    running = by("sum", f"avg_over_time({over('inference_requests_running', MODEL)})")
    return timeseries(
        "HBM bandwidth utilisation vs generation tokens/s",
        "HBM bandwidth used as a share of the peak (left; GPM, Hopper and newer) against tokens "
        "generated per second and per running request (right). "
        f"Bad: bandwidth above {pct(above)} while tokens/s stays flat and tokens/s per request "
        "falls - decode is memory-bound, and more concurrent decodes only split the same "
        "bandwidth.",
        [
            Query(
                by("avg", rate("inference_gpu_dram_active_seconds_total", GPU)),
                f"HBM bandwidth {target_legend()}",
            ),
            Query(tokens, f"tokens/s {target_legend()}", axis="right", unit=Unit.TOKENS_PER_SECOND),
            Query(
                f"{tokens}\n/\n({running} > 0)",
                f"tokens/s per request {target_legend()}",
                axis="right",
                unit=Unit.TOKENS_PER_SECOND,
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
    used = series("inference_gpu_memory_used_bytes", GPU)
    total = series("inference_gpu_memory_total_bytes", GPU)
    return timeseries(
        "KV-cache and framebuffer headroom",
        "KV-cache usage as the engine reports it and framebuffer used per GPU (headroom is what "
        f"is left to 100 %). Bad: KV cache above {pct(kv)} - the engine is about to queue or "
        "preempt requests; keep 10-15 % headroom. Framebuffer near 100 % is normal for vLLM, "
        "SGLang and TGI (they pre-allocate it); for other engines above "
        f"{pct(framebuffer)} the next allocation may fail with CUDA out of memory.",
        [
            Query(
                by("max", series("inference_kv_cache_usage_ratio", MODEL)),
                f"KV cache {target_legend()}",
                thresholds=(warn(kv),),
            ),
            Query(
                by("max", f"{used}\n/\n{total}", "gpu"),
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
