"""Row "Memory": HBM bandwidth, memory-controller busy time and framebuffer use."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    GPU,
    AnyPanel,
    Query,
    Unit,
    alert_threshold,
    by,
    gpu_legend,
    pct,
    rate,
    series,
    timeseries,
    warn,
)

TITLE = "Memory"


def bandwidth() -> AnyPanel:
    above = alert_threshold("InferenceHBMBandwidthSaturated", "bandwidth_above")
    return timeseries(
        "HBM bandwidth utilisation",
        "HBM (DRAM) bandwidth used as a share of the theoretical peak, the exact mean over the "
        "interval (GPM, Hopper and newer; absent elsewhere). Decode reads the weights and the "
        f"KV cache for every token, so it lives here. Bad: above {pct(above)} - decode is "
        "memory-bound; more concurrent requests split the bandwidth and each one slows down.",
        [
            Query(
                by("max", rate("inference_gpu_dram_active_seconds_total", GPU), "gpu"),
                gpu_legend(),
            )
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        thresholds=[warn(above)],
        span=8,
    )


def busy() -> AnyPanel:
    return timeseries(
        "Memory controller busy (not bandwidth)",
        "Share of time the memory controller was reading or writing (NVML's 'memory "
        "utilisation', available on every GPU). It is NOT bandwidth: a trickle of traffic can "
        "keep it at 100 %, so high is not bad by itself; use it only where HBM bandwidth is "
        "absent. Bad: near 0 while requests run - the GPU is not even touching memory, it "
        "waits for work.",
        [Query(series("inference_gpu_memory_busy_ratio", GPU), gpu_legend())],
        unit=Unit.RATIO,
        maximum=1.0,
        span=8,
    )


def framebuffer() -> AnyPanel:
    return timeseries(
        "Framebuffer used",
        "GPU memory in use (solid) against its size (dashed). vLLM, SGLang and TGI pre-allocate "
        "most of it for the KV cache at start-up, so near full is normal for them - watch the "
        "KV-cache usage on the bottlenecks dashboard instead. Bad (other engines): used creeping "
        "up to the size, the next allocation fails with CUDA out of memory.",
        [
            Query(series("inference_gpu_memory_used_bytes", GPU), f"used {gpu_legend()}"),
            Query(
                series("inference_gpu_memory_total_bytes", GPU), f"size {gpu_legend()}", dashed=True
            ),
        ],
        unit=Unit.BYTES,
        span=8,
    )


def panels() -> Sequence[AnyPanel]:
    return [bandwidth(), busy(), framebuffer()]
