"""Row "Memory": HBM bandwidth, memory-controller busy time and framebuffer use."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    RATE_INTERVAL,
    AnyPanel,
    Query,
    Select,
    Unit,
    alert_threshold,
    gpu_gauge,
    gpu_legend,
    gpu_reading,
    pct,
    signal,
    target_legend,
    timeseries,
    warn,
)
from exporter.signatures.signals.gpu_signals import HBM_BANDWIDTH

TITLE = "Memory"

MIB = 2**20


def bandwidth() -> AnyPanel:
    above = alert_threshold("InferenceHBMBandwidthSaturated", "bandwidth_above")

    def nvml(select: Select) -> str:
        return f"rate({select('inference_gpu_dram_active_seconds_total')}[{RATE_INTERVAL}])"

    def dcgm(select: Select) -> str:
        return select("DCGM_FI_PROF_DRAM_ACTIVE")

    return timeseries(
        "HBM bandwidth utilisation",
        "HBM (DRAM) bandwidth used as a share of the theoretical peak per GPU, the exact mean "
        "over the interval (GPM, Hopper and newer; dcgm-exporter's DRAM activity), and the "
        "mean over the pod's GPUs that InferenceHBMBandwidthSaturated reads (dashed, with its "
        "threshold). Decode reads the weights and the "
        f"KV cache for every token, so it lives here. Bad: above {pct(above)} - decode is "
        "memory-bound; more concurrent requests split the bandwidth and each one slows down.",
        [
            Query(gpu_reading(nvml, dcgm), gpu_legend()),
            Query(
                signal(HBM_BANDWIDTH),
                f"pod mean {target_legend()}",
                dashed=True,
                thresholds=(warn(above),),
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        span=8,
    )


def busy() -> AnyPanel:
    return timeseries(
        "Memory controller busy (not bandwidth)",
        "Share of time the memory controller was reading or writing (NVML's 'memory "
        "utilisation', dcgm-exporter's DCGM_FI_DEV_MEM_COPY_UTIL, available on every GPU). It "
        "is NOT bandwidth: a trickle of traffic can "
        "keep it at 100 %, so high is not bad by itself; use it only where HBM bandwidth is "
        "absent. Bad: near 0 while requests run - the GPU is not even touching memory, it "
        "waits for work.",
        [
            Query(
                gpu_gauge("inference_gpu_memory_busy_ratio", "DCGM_FI_DEV_MEM_COPY_UTIL", " / 100"),
                gpu_legend(),
            )
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        span=8,
    )


def framebuffer() -> AnyPanel:
    def used(select: Select) -> str:
        return select("inference_gpu_memory_used_bytes")

    def used_mib(select: Select) -> str:
        return f"{select('DCGM_FI_DEV_FB_USED')} * {MIB}"

    def total(select: Select) -> str:
        return select("inference_gpu_memory_total_bytes")

    def total_mib(select: Select) -> str:
        return f"({select('DCGM_FI_DEV_FB_USED')} + {select('DCGM_FI_DEV_FB_FREE')}) * {MIB}"

    return timeseries(
        "Framebuffer used",
        "GPU memory in use (solid) against its size (dashed). vLLM, SGLang and TGI pre-allocate "
        "most of it for the KV cache at start-up, so near full is normal for them - watch the "
        "KV-cache usage on the bottlenecks dashboard instead. Bad (other engines): used creeping "
        "up to the size, the next allocation fails with CUDA out of memory.",
        [
            Query(gpu_reading(used, used_mib), f"used {gpu_legend()}"),
            Query(gpu_reading(total, total_mib), f"size {gpu_legend()}", dashed=True),
        ],
        unit=Unit.BYTES,
        span=8,
    )


def panels() -> Sequence[AnyPanel]:
    return [bandwidth(), busy(), framebuffer()]
