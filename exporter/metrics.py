"""The metric catalogue: the one source of truth for every metric the exporter emits.

Collectors build their families through :func:`gauge`, :func:`counter` and
:func:`histogram`, so a name that is not in the catalogue cannot be emitted, and
``docs/metrics.md`` is generated from the same table (``python -m exporter.docgen``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

MetricType = Literal["gauge", "counter", "histogram"]

GPU_LABELS = ("gpu", "uuid")

# Buckets of inference_gpu_utilization_samples: fine at both ends, where "idle" and
# "saturated" are decided, coarse in the middle.
UTILIZATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.6, 0.75, 0.9, 0.95, 1.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the catalogue."""

    name: str
    type: MetricType
    collector: str
    labels: tuple[str, ...]
    help: str
    unit: str = ""
    source: str = ""
    gpus: str = ""

    @property
    def family_name(self) -> str:
        """Name handed to prometheus_client (which appends ``_total`` to counters)."""
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


_ALL = "all NVML GPUs"
_GPM = "Hopper and newer (GPM); absent elsewhere"

CATALOGUE: tuple[MetricSpec, ...] = (
    # --- self ---------------------------------------------------------------------------------
    MetricSpec(
        "inference_exporter_build_info",
        "gauge",
        "self",
        ("version",),
        "A metric with a constant '1' value labelled by the exporter's version.",
        source="package metadata",
    ),
    MetricSpec(
        "inference_scrape_collector_success",
        "gauge",
        "self",
        ("collector",),
        "1 when the collector ran within the deadline and could read its source, 0 otherwise.",
        source="scrape orchestration",
    ),
    MetricSpec(
        "inference_scrape_collector_duration_seconds",
        "gauge",
        "self",
        ("collector",),
        "Time the collector took during this scrape (the deadline when it timed out).",
        unit="seconds",
        source="scrape orchestration",
    ),
    # --- nvml ---------------------------------------------------------------------------------
    MetricSpec(
        "inference_nvml_up",
        "gauge",
        "nvml",
        (),
        "1 when NVML is initialised, 0 when the library is missing or initialisation failed.",
        source="nvmlInit",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_nvml_calls_total",
        "counter",
        "nvml",
        ("gpu",),
        "NVML calls the exporter made for this GPU; rate() shows the exporter's call budget.",
        source="counted by the backend",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "name", "driver_version", "pci_bus_id", "mig_mode"),
        "Identity of the GPU; constant 1.",
        source="nvmlDeviceGetUUID/Name/PciInfo/MigMode, nvmlSystemGetDriverVersion",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_up",
        "gauge",
        "nvml",
        GPU_LABELS,
        "1 when the last read of this GPU succeeded in time, 0 when it errors or hangs "
        "(e.g. GPU is lost, Xid 79).",
        source="every NVML call of the GPU",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_utilization_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Latest driver utilisation sample: share of the sample period in which a kernel ran (0-1).",
        unit="ratio",
        source="nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES); "
        "nvmlDeviceGetUtilizationRates().gpu when no sample is new",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_busy_seconds_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Integral of driver utilisation over time from every driver sample; rate() is the exact "
        "mean utilisation over any window.",
        unit="seconds",
        source="nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_seen_timestamp)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_utilization_samples",
        "histogram",
        "nvml",
        GPU_LABELS,
        "Every driver utilisation sample observed once (0-1): shows the idle share and "
        "utilisation that pulses between 0 and 1.",
        unit="ratio",
        source="nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_memory_bandwidth_utilization_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "HBM/DRAM bandwidth used as a share of the theoretical peak between two GPM samples.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_DRAM_BW_UTIL",
        gpus=_GPM,
    ),
    MetricSpec(
        "inference_gpu_dram_active_seconds_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Integral of DRAM bandwidth utilisation over time; rate() is the mean over any window.",
        unit="seconds",
        source="GPM NVML_GPM_METRIC_DRAM_BW_UTIL x interval",
        gpus=_GPM,
    ),
    MetricSpec(
        "inference_gpu_memory_busy_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Share of time the memory controller was busy reading or writing. NOT bandwidth: a "
        "trickle of traffic can keep it at 1; use "
        "inference_gpu_memory_bandwidth_utilization_ratio for bandwidth.",
        unit="ratio",
        source="nvmlDeviceGetUtilizationRates().memory",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_sm_active_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Share of time at least one warp was resident on an SM, averaged over all SMs.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_SM_UTIL",
        gpus=_GPM,
    ),
    MetricSpec(
        "inference_gpu_sm_occupancy_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Resident warps as a share of the maximum warps per SM, averaged over all SMs.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_SM_OCCUPANCY",
        gpus=_GPM,
    ),
    MetricSpec(
        "inference_gpu_tensor_active_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Share of time any tensor core pipe was active.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        gpus=_GPM,
    ),
    MetricSpec(
        "inference_gpu_memory_used_bytes",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Framebuffer memory in use (engines such as vLLM pre-allocate most of it by design).",
        unit="bytes",
        source="nvmlDeviceGetMemoryInfo().used",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_memory_total_bytes",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Framebuffer memory size.",
        unit="bytes",
        source="nvmlDeviceGetMemoryInfo().total",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_pcie_tx_bytes_per_second",
        "gauge",
        "nvml",
        GPU_LABELS,
        "PCIe transmit rate of the GPU (device to host).",
        unit="bytes per second",
        source="GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC (MiB/s); else "
        "nvmlDeviceGetPcieThroughput(TX) (KiB/s)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_pcie_rx_bytes_per_second",
        "gauge",
        "nvml",
        GPU_LABELS,
        "PCIe receive rate of the GPU (host to device: weights, inputs, swapped KV blocks).",
        unit="bytes per second",
        source="GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC (MiB/s); else "
        "nvmlDeviceGetPcieThroughput(RX) (KiB/s)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_power_watts",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Board power draw.",
        unit="watts",
        source="nvmlDeviceGetPowerUsage (mW)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_energy_joules_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Energy consumed since the driver was loaded.",
        unit="joules",
        source="nvmlDeviceGetTotalEnergyConsumption (mJ)",
        gpus="Volta and newer",
    ),
    MetricSpec(
        "inference_gpu_temperature_celsius",
        "gauge",
        "nvml",
        GPU_LABELS,
        "GPU die temperature.",
        unit="celsius",
        source="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_sm_clock_hertz",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Current SM clock.",
        unit="hertz",
        source="nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_memory_clock_hertz",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Current memory clock.",
        unit="hertz",
        source="nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) (MHz)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_clock_event_active",
        "gauge",
        "nvml",
        (*GPU_LABELS, "reason"),
        "1 while the clock event (throttle) reason is active, 0 otherwise.",
        source="nvmlDeviceGetCurrentClocksEventReasons (older drivers: "
        "nvmlDeviceGetCurrentClocksThrottleReasons)",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_xid_errors_total",
        "counter",
        "nvml",
        (*GPU_LABELS, "xid"),
        "Xid errors the driver reported for this GPU since the exporter started.",
        source="nvmlEventSetWait (nvmlEventTypeXidCriticalError) in a background thread",
        gpus=_ALL,
    ),
    # --- cpu ----------------------------------------------------------------------------------
    MetricSpec(
        "inference_cpu_seconds_total",
        "counter",
        "cpu",
        ("mode",),
        "CPU time of the node summed over all CPUs, by mode; softirq share = "
        "rate(mode=softirq) / sum(rate(all modes)).",
        unit="seconds",
        source="<procfs>/stat 'cpu' line (USER_HZ)",
    ),
    MetricSpec(
        "inference_cpu_softirq_hottest_core_ratio",
        "gauge",
        "cpu",
        (),
        "Softirq share of the single CPU with the most softirq time over the last window "
        "(>= 1 s); NET_RX is often pinned to one core and the node average hides it.",
        unit="ratio",
        source="<procfs>/stat 'cpuN' lines, difference between two reads",
    ),
    MetricSpec(
        "inference_cpu_online",
        "gauge",
        "cpu",
        (),
        "Number of online CPUs of the node.",
        source="<procfs>/stat 'cpuN' lines",
    ),
    MetricSpec(
        "inference_softirqs_total",
        "counter",
        "cpu",
        ("vector",),
        "Softirq invocations of the node by vector (NET_RX, NET_TX, TIMER, ...), summed over CPUs.",
        source="<procfs>/softirqs",
    ),
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}


def _checked(name: str, kind: MetricType) -> MetricSpec:
    entry = BY_NAME[name]
    if entry.type != kind:
        raise TypeError(f"{name} is a {entry.type} in the catalogue, not a {kind}")
    return entry


def gauge(name: str) -> GaugeMetricFamily:
    """A fresh gauge family for catalogue entry ``name``, with the catalogue's labels."""
    entry = _checked(name, "gauge")
    return GaugeMetricFamily(entry.family_name, entry.help, labels=list(entry.labels))


def counter(name: str) -> CounterMetricFamily:
    """A fresh counter family for catalogue entry ``name``, with the catalogue's labels."""
    entry = _checked(name, "counter")
    return CounterMetricFamily(entry.family_name, entry.help, labels=list(entry.labels))


def histogram(name: str) -> HistogramMetricFamily:
    """A fresh histogram family for catalogue entry ``name``, with the catalogue's labels."""
    entry = _checked(name, "histogram")
    return HistogramMetricFamily(entry.family_name, entry.help, labels=list(entry.labels))
