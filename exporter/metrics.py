"""The metric catalogue: the one source of truth for every metric the exporter emits.

Collectors build their families through :func:`gauge`, :func:`counter` and
:func:`histogram`, so a name that is not in the catalogue cannot be emitted, and
``docs/metrics.md`` is generated from the same table (``python build-tools/docgen.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

MetricType = Literal["gauge", "counter", "histogram"]

GPU_LABELS = ("gpu", "uuid")
#: The pod holding a device, on the node agent's series of the device
#: (exporter.collectors.holder_labels); Prometheus keeps them over the target's (honorLabels).
HOLDER_LABELS = ("namespace", "pod", "container")
#: Series of the node agent that name their own pod (by UID) and stay the node's.
NODE_OWN_PREFIX = "inference_gpu_pod_"

# Buckets of inference_gpu_utilization_samples: fine at both ends, where "idle" and
# "saturated" are decided, coarse in the middle.
UTILIZATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.6, 0.75, 0.9, 0.95, 1.0)
# Tokenizer latency buckets, shared by the probe and exporter.instrument so that the
# source="probe" and source="engine" series can be compared bucket by bucket.
TOKENIZER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# NVML clock event reason bits (nvml.h nvmlClocksEventReason*) and the label values
# ``inference_gpu_clock_event_active{reason}`` takes; the dcgm profile decodes the same bits
# from DCGM's bitmask field.
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
}
#: The reasons that throttle a GPU (hardware and thermal slowdowns, not power caps or idling):
#: the bits ``inference_gpu_clock_throttle_reasons`` keeps, and the throttling alert's default.
THROTTLE_REASONS: tuple[str, ...] = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
THROTTLE_MASK = sum(CLOCK_EVENT_BITS[name] for name in THROTTLE_REASONS)


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
    def optional_labels(self) -> tuple[str, ...]:
        """Labels present only in some configurations: ``endpoint`` on the engine collector's
        metrics when several ``--engine.url`` are polled (one value per endpoint); the holder's
        ``namespace``, ``pod`` and ``container`` on the nvml collector's series of one device
        in the node agent (the ``podresources`` collector on)."""
        if self.collector == "engine":
            return ("endpoint",)
        if self.holder_labelled:
            return HOLDER_LABELS
        return ()

    @property
    def holder_labelled(self) -> bool:
        """Whether the node agent files this metric's series under the pod holding their
        device (a series of one device, named by ``gpu``; not one naming its own pod)."""
        return (
            self.collector == "nvml"
            and "gpu" in self.labels
            and not self.name.startswith(NODE_OWN_PREFIX)
        )

    @property
    def family_name(self) -> str:
        """Name handed to prometheus_client (which appends ``_total`` to counters)."""
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


_ALL = "all NVML GPUs"
_GPM = "Hopper and newer (GPM); absent elsewhere"
# What a MIG device has: no utilisation buffer, GPM per GPU instance, memory per instance.
_ALL_MIG_GPM = _ALL + "; MIG devices: from GPM graphics activity (Hopper and newer)"
_GPM_MIG = _GPM + "; MIG devices: their GPU instance's"
_GPU_ONLY = _ALL + "; not MIG devices (their GPU's series)"
_SHARES = (
    "where the engine's processes can be told among NVML's host PIDs (docs/nvml.md); "
    "MIG devices: memory, and the utilisation share only when no other process is on the "
    "device"
)

# The node agent's per-pod shares.
_POD_SHARES = (
    "the node agent where the host's /proc is visible (hostPID or --gpu.host-procfs) and the "
    "podresources collector is on; MIG devices: memory, and the utilisation share only when "
    "one container's processes are alone on the device"
)

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
    # --- self: the HTTP server's limits (exporter.server.limits; the webhook serves them too) ---
    MetricSpec(
        "inference_exporter_http_connections",
        "gauge",
        "self",
        (),
        "Connections open now (TLS handshakes included).",
        source="the HTTP server's own count",
    ),
    MetricSpec(
        "inference_exporter_http_connections_limit",
        "gauge",
        "self",
        (),
        "The most connections kept at once: --web.max-connections, lowered to fit the "
        "process's file limit.",
        source="flags and the process's file limit",
    ),
    MetricSpec(
        "inference_exporter_http_requests_in_flight",
        "gauge",
        "self",
        (),
        "Requests in their handlers now, the health probes not counted (capped by "
        "--web.max-requests).",
        source="the HTTP server's own count",
    ),
    MetricSpec(
        "inference_exporter_http_connections_closed_total",
        "counter",
        "self",
        ("reason",),
        "Connections the exporter closed to protect itself, by reason: header_timeout, "
        "body_timeout, write_timeout, idle_timeout (the --web.*-timeout flags), evicted (the "
        "oldest idle or slow connection, to make room at the connection limit or when out of "
        "file descriptors).",
        source="the HTTP server's own count",
    ),
    MetricSpec(
        "inference_exporter_http_connections_refused_total",
        "counter",
        "self",
        ("reason",),
        "Connections turned away, by reason: max_connections (every connection in a request: "
        "503 and closed), max_requests (a request past --web.max-requests: 503 and closed), "
        "out_of_files (an accept that found no file descriptor; the client waits in the "
        "backlog).",
        source="the HTTP server's own count",
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
        "inference_nvml_driver_info",
        "gauge",
        "nvml",
        ("driver_version",),
        "The NVIDIA driver NVML reports (one for the node's GPUs); constant 1.",
        source="nvmlSystemGetDriverVersion",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_attribution_info",
        "gauge",
        "nvml",
        ("method",),
        "How the exporter knows the GPUs it reads are the engine's: visible-devices (the UUIDs "
        "of NVIDIA_VISIBLE_DEVICES), devices-flag (--gpu.devices), dra or whole-node (declared "
        "with --gpu.attribution), replay, or all-visible (every GPU NVML shows, which is the "
        "engine's only when it holds them all); constant 1.",
        source="--gpu.attribution, --gpu.devices, NVIDIA_VISIBLE_DEVICES",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "name", "pci_bus_id"),
        "Identity of the GPU; constant 1.",
        source="nvmlDeviceGetUUID/Name/PciInfo",
        gpus=_ALL + "; MIG devices",
    ),
    MetricSpec(
        "inference_gpu_mig_mode_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "mig_mode"),
        "MIG mode of the GPU (enabled, disabled, unsupported; slice for a MIG device); constant 1.",
        source="nvmlDeviceGetMigMode",
        gpus=_ALL + "; MIG devices",
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
        "nvmlDeviceGetUtilizationRates().gpu when no sample is new; MIG devices: GPM "
        "NVML_GPM_METRIC_GRAPHICS_UTIL of the poll interval",
        gpus=_ALL_MIG_GPM,
    ),
    MetricSpec(
        "inference_gpu_busy_seconds_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Integral of driver utilisation over time from every driver sample; rate() is the exact "
        "mean utilisation over any window.",
        unit="seconds",
        source="nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_seen_timestamp); MIG "
        "devices: GPM NVML_GPM_METRIC_GRAPHICS_UTIL x poll interval",
        gpus=_ALL_MIG_GPM,
    ),
    MetricSpec(
        "inference_gpu_utilization_samples",
        "histogram",
        "nvml",
        GPU_LABELS,
        "Every driver utilisation sample observed once (0-1): shows the idle share and "
        "utilisation that pulses between 0 and 1.",
        unit="ratio",
        source="nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES); MIG devices: one GPM "
        "graphics activity value per poll",
        gpus=_ALL_MIG_GPM,
    ),
    MetricSpec(
        "inference_gpu_memory_bandwidth_utilization_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "HBM/DRAM bandwidth used as a share of the theoretical peak between two GPM samples.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_DRAM_BW_UTIL",
        gpus=_GPM_MIG,
    ),
    MetricSpec(
        "inference_gpu_dram_active_seconds_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Integral of DRAM bandwidth utilisation over time; rate() is the mean over any window.",
        unit="seconds",
        source="GPM NVML_GPM_METRIC_DRAM_BW_UTIL x interval",
        gpus=_GPM_MIG,
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
        gpus=_ALL + "; absent in MIG mode",
    ),
    MetricSpec(
        "inference_gpu_sm_active_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Share of time at least one warp was resident on an SM, averaged over all SMs.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_SM_UTIL",
        gpus=_GPM_MIG,
    ),
    MetricSpec(
        "inference_gpu_sm_occupancy_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Resident warps as a share of the maximum warps per SM, averaged over all SMs.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_SM_OCCUPANCY",
        gpus=_GPM_MIG,
    ),
    MetricSpec(
        "inference_gpu_tensor_active_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Share of time any tensor core pipe was active.",
        unit="ratio",
        source="GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        gpus=_GPM_MIG,
    ),
    MetricSpec(
        "inference_gpu_memory_used_bytes",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Framebuffer memory in use (engines such as vLLM pre-allocate most of it by design).",
        unit="bytes",
        source="nvmlDeviceGetMemoryInfo().used",
        gpus=_ALL + "; MIG devices: their GPU instance's; a GPU in MIG mode: privileged only",
    ),
    MetricSpec(
        "inference_gpu_memory_total_bytes",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Framebuffer memory size.",
        unit="bytes",
        source="nvmlDeviceGetMemoryInfo().total",
        gpus=_ALL + "; MIG devices: their GPU instance's; a GPU in MIG mode: privileged only",
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
        gpus=_GPU_ONLY,
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
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_power_watts",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Board power draw.",
        unit="watts",
        source="nvmlDeviceGetPowerUsage (mW)",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_energy_joules_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Energy consumed since the driver was loaded.",
        unit="joules",
        source="nvmlDeviceGetTotalEnergyConsumption (mJ)",
        gpus="Volta and newer; not MIG devices (their GPU's series)",
    ),
    MetricSpec(
        "inference_gpu_temperature_celsius",
        "gauge",
        "nvml",
        GPU_LABELS,
        "GPU die temperature.",
        unit="celsius",
        source="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_sm_clock_hertz",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Current SM clock.",
        unit="hertz",
        source="nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz)",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_memory_clock_hertz",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Current memory clock.",
        unit="hertz",
        source="nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) (MHz)",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_clock_event_active",
        "gauge",
        "nvml",
        (*GPU_LABELS, "reason"),
        "1 while the clock event (throttle) reason is active, 0 otherwise.",
        source="nvmlDeviceGetCurrentClocksEventReasons (older drivers: "
        "nvmlDeviceGetCurrentClocksThrottleReasons)",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_clock_throttle_reasons",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Bit mask of the active clock event reasons that throttle: hw_slowdown 0x8, "
        "sw_thermal 0x20, hw_thermal 0x40, hw_power_brake 0x80 (nvml.h's bits); 0 while none "
        "is. The same readings as inference_gpu_clock_event_active in one series per GPU, so "
        "a rule finds the throttled GPUs with > 0 without reading every reason's series.",
        source="nvmlDeviceGetCurrentClocksEventReasons (older drivers: "
        "nvmlDeviceGetCurrentClocksThrottleReasons), masked",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_xid_errors_total",
        "counter",
        "nvml",
        (*GPU_LABELS, "xid"),
        "Xid errors the driver reported for this GPU since the exporter started.",
        source="nvmlEventSetWait (nvmlEventTypeXidCriticalError) in a background thread",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_peak_memory_bandwidth_bytes_per_second",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Theoretical peak DRAM bandwidth of the whole GPU: bus width / 8 x maximum memory clock "
        "x 2, or the datasheet figure where it differs (exporter.hardware.gpus); a MIG device: "
        "its GPU instance's eighths of it; read once.",
        unit="bytes per second",
        source="nvmlDeviceGetMemoryBusWidth, nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM); "
        "product table; replay traces carry the facts; MIG: nvmlDeviceGetAttributes "
        "memorySizeMB",
        gpus=_ALL,
    ),
    MetricSpec(
        "inference_gpu_peak_flops",
        "gauge",
        "nvml",
        (*GPU_LABELS, "precision"),
        "Dense (no 2:4 sparsity) tensor peak of the whole GPU by precision (fp16, bf16 with FP32 "
        "accumulation; fp8, int8 where the architecture has them; int8 in operations/s): SMs x "
        "maximum SM clock x FLOPs per SM per clock, or the datasheet's clock where NVML's "
        "maximum is higher; a MIG device: its SMs' share of it; read once.",
        unit="FLOP per second",
        source="nvmlDeviceGetNumGpuCores, nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM), "
        "nvmlDeviceGetCudaComputeCapability; architecture and product tables; MIG: "
        "nvmlDeviceGetAttributes multiprocessorCount",
        gpus="Volta and newer with a known compute capability",
    ),
    MetricSpec(
        "inference_gpu_mig_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "parent_uuid", "profile"),
        "A MIG device's GPU (its UUID; the index is the part of gpu before the colon) and "
        "profile (e.g. 1g.10gb); constant 1.",
        source="nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetName (the profile after 'MIG')",
        gpus="MIG devices (Ampere and newer in MIG mode)",
    ),
    MetricSpec(
        "inference_gpu_mig_instance_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "gpu_instance_id", "compute_instance_id"),
        "A MIG device's GPU instance and compute instance (dcgm-exporter's GPU_I_ID); constant 1.",
        source="nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId",
        gpus="MIG devices (Ampere and newer in MIG mode)",
    ),
    MetricSpec(
        "inference_gpu_processes",
        "gauge",
        "nvml",
        (*GPU_LABELS, "owner"),
        "Processes with a compute context on the GPU or MIG device: owner engine (the "
        "engine's own) or other (other tenants sharing it by time-slicing or MPS).",
        source="nvmlDeviceGetComputeRunningProcesses, host PIDs matched to the engine's",
        gpus=_ALL + "; " + _SHARES,
    ),
    MetricSpec(
        "inference_gpu_pod_info",
        "gauge",
        "podresources",
        (*GPU_LABELS, "namespace", "pod", "container"),
        "The container the kubelet gave the GPU, MIG device or time-sliced replica to; "
        "constant 1, one series per container holding the device (the node agent's; "
        "Prometheus must keep these labels: honorLabels).",
        source="kubelet PodResources v1 List, device IDs matched to NVML's UUIDs and indices",
        gpus=_ALL + " a pod holds through a device plugin (nvidia.com/ resources)",
    ),
    MetricSpec(
        "inference_gpu_pods",
        "gauge",
        "podresources",
        GPU_LABELS,
        "Distinct pods holding the GPU or MIG device: 1 for a pod's own, more where "
        "time-slicing or MPS replicas share it (its utilisation is then theirs together).",
        source="kubelet PodResources v1 List",
        gpus=_ALL + " a pod holds through a device plugin",
    ),
    MetricSpec(
        "inference_podresources_devices",
        "gauge",
        "podresources",
        ("state",),
        "Devices by attribution state: attributed (held by a pod), unallocated (offered, held "
        "by none), unknown_to_kubelet (NVML shows it, no device plugin offers it), "
        "unknown_to_nvml (the kubelet names it, NVML does not show it: never attributed).",
        source="kubelet PodResources v1 List and GetAllocatableResources, NVML's devices",
    ),
    MetricSpec(
        "inference_gpu_engine_utilization_ratio",
        "gauge",
        "nvml",
        GPU_LABELS,
        "The engine's own share of the GPU (0-1): the sum of its processes' newest per-process "
        "SM samples; the rest of inference_gpu_utilization_ratio is other tenants'.",
        unit="ratio",
        source="nvmlDeviceGetProcessUtilization(last_seen_timestamp) smUtil; MIG devices: "
        "the device's utilisation when every process on it is the engine's",
        gpus=_ALL + "; " + _SHARES,
    ),
    MetricSpec(
        "inference_gpu_engine_memory_used_bytes",
        "gauge",
        "nvml",
        GPU_LABELS,
        "Framebuffer memory of the engine's own processes.",
        unit="bytes",
        source="nvmlDeviceGetComputeRunningProcesses usedGpuMemory",
        gpus=_ALL + "; " + _SHARES,
    ),
    MetricSpec(
        "inference_gpu_pod_utilization_ratio",
        "gauge",
        "nvml",
        (*GPU_LABELS, "pod_uid", "container_id"),
        "A container's own share of the GPU (0-1): the sum of its processes' newest "
        "per-process SM samples (the node agent with hostPID; pod_uid joins kube-state-metrics' "
        "kube_pod_info{uid} for the namespace and pod).",
        unit="ratio",
        source="nvmlDeviceGetProcessUtilization smUtil, host PIDs mapped to pods by "
        "/proc/<pid>/cgroup",
        gpus=_ALL + "; " + _POD_SHARES,
    ),
    MetricSpec(
        "inference_gpu_pod_memory_used_bytes",
        "gauge",
        "nvml",
        (*GPU_LABELS, "pod_uid", "container_id"),
        "Framebuffer memory of a container's processes on the GPU (the node agent with hostPID).",
        unit="bytes",
        source="nvmlDeviceGetComputeRunningProcesses usedGpuMemory, host PIDs mapped to pods",
        gpus=_ALL + "; " + _POD_SHARES,
    ),
    MetricSpec(
        "inference_gpu_pod_unattributed_processes",
        "gauge",
        "nvml",
        (*GPU_LABELS, "reason"),
        "Processes on the GPU the node agent gave to no pod, by reason: host (in no pod's "
        "cgroup: a host daemon, the MPS server), gone (ended before its cgroup was read), "
        "unreadable (its cgroup file could not be read).",
        source="nvmlDeviceGetComputeRunningProcesses, host /proc/<pid>/cgroup",
        gpus=_ALL + "; " + _POD_SHARES,
    ),
    # --- nvml: energy shares, power state, links (issue 36) ----------------------------------
    MetricSpec(
        "inference_gpu_engine_busy_seconds_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "The engine's own share of the GPU integrated over time: at each poll, the engine's "
        "share (inference_gpu_engine_utilization_ratio) times the time since the previous "
        "poll; rate() is the engine's mean share, the key to splitting a shared GPU's energy.",
        unit="seconds",
        source="nvmlDeviceGetProcessUtilization(last_seen_timestamp) smUtil, per poll",
        gpus=_ALL + "; " + _SHARES,
    ),
    MetricSpec(
        "inference_gpu_pod_busy_seconds_total",
        "counter",
        "nvml",
        (*GPU_LABELS, "pod_uid", "container_id"),
        "A container's own share of the GPU integrated over time (the node agent): at each "
        "poll, inference_gpu_pod_utilization_ratio times the time since the previous poll. "
        "Restarts from 0 when the container comes back to the GPU.",
        unit="seconds",
        source="nvmlDeviceGetProcessUtilization smUtil, host PIDs mapped to pods, per poll",
        gpus=_ALL + "; " + _POD_SHARES,
    ),
    MetricSpec(
        "inference_gpu_idle_energy_joules_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Energy the GPU consumed over poll intervals in which every utilisation sample of the "
        "driver was 0 % (no kernel ran at all); an interval with any work counts as busy, so "
        "this is a lower bound at poll resolution. rate() over rate() of "
        "inference_gpu_energy_joules_total is the share of energy spent idle.",
        unit="joules",
        source="nvmlDeviceGetTotalEnergyConsumption (mJ) and nvmlDeviceGetSamples, per poll",
        gpus="Volta and newer with a utilisation sample buffer; not MIG (no buffer there)",
    ),
    MetricSpec(
        "inference_gpu_power_limit_watts",
        "gauge",
        "nvml",
        GPU_LABELS,
        "The power limit the GPU enforces now: the lowest of the administrator's, the "
        "default and any set out of band; inference_gpu_clock_event_active{reason="
        '"power_cap"} means the GPU draws against it.',
        unit="watts",
        source="field NVML_FI_DEV_POWER_CURRENT_LIMIT (mW, GPU scope); older drivers: "
        "nvmlDeviceGetEnforcedPowerLimit",
        gpus=_GPU_ONLY,
    ),
    MetricSpec(
        "inference_gpu_power_default_limit_watts",
        "gauge",
        "nvml",
        GPU_LABELS,
        "The power limit the GPU boots with; an enforced limit "
        "(inference_gpu_power_limit_watts) below it is a cap someone set.",
        unit="watts",
        source="field NVML_FI_DEV_POWER_DEFAULT_LIMIT (mW, GPU scope)",
        gpus=_GPU_ONLY + "; driver 535 and newer",
    ),
    MetricSpec(
        "inference_gpu_power_smoothing_enabled",
        "gauge",
        "nvml",
        GPU_LABELS,
        "1 while power smoothing holds the GPU's power between a floor and a ceiling (the "
        "GPU then burns power at the floor even when idle and ramps clocks gradually), 0 "
        "when it is off.",
        source="field NVML_FI_PWR_SMOOTHING_ENABLED (id 251 from driver 590, 256 on 570-580)",
        gpus="Blackwell and newer with driver 570 or later; absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_power_smoothing_floor_watts",
        "gauge",
        "nvml",
        GPU_LABELS,
        "The power floor power smoothing applies now (total module power): the GPU's draw "
        "does not fall below it, idle or not.",
        unit="watts",
        source="field NVML_FI_PWR_SMOOTHING_APPLIED_TMP_FLOOR (W; id 255 from driver 590, "
        "260 on 570-580)",
        gpus="Blackwell and newer with driver 570 or later; absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_power_profile_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "profile"),
        "A workload power profile the GPU enforces now (max_p, max_q, llm_inference, "
        "memory_bound, ...: NVML_POWER_PROFILE_* in lower case); constant 1, one series per "
        "enforced profile, none when no profile is enforced.",
        source="nvmlDeviceWorkloadPowerProfileGetCurrentProfiles enforcedProfilesMask",
        gpus="Blackwell and newer; absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_nvlink_transmit_bytes_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Bytes the GPU sent over all its NVLink links (header and payload) since the "
        "exporter started; tensor-parallel all-reduces and expert-parallel all-to-alls travel "
        "here.",
        unit="bytes",
        source="GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC (MiB/s) x the poll interval "
        "(Hopper and newer); else field NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, all links (KiB)",
        gpus="GPUs with NVLink (Ampere and newer); not MIG devices",
    ),
    MetricSpec(
        "inference_gpu_nvlink_receive_bytes_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Bytes the GPU received over all its NVLink links (header and payload) since the "
        "exporter started.",
        unit="bytes",
        source="GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC (MiB/s) x the poll interval "
        "(Hopper and newer); else field NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, all links (KiB)",
        gpus="GPUs with NVLink (Ampere and newer); not MIG devices",
    ),
    MetricSpec(
        "inference_gpu_nvlink_links",
        "gauge",
        "nvml",
        (*GPU_LABELS, "state"),
        "The GPU's NVLink links by state: active, sleep (idle in low power, woken by traffic), "
        "inactive, active_traffic_disabled, unknown (the driver gives no state); every state "
        "is a series, 0 where no link is in it. All 0 on a GPU without NVLink (PCIe only).",
        source="field NVML_FI_DEV_NVLINK_LINK_COUNT (once), NVML_FI_DEV_NVLINK_GET_STATE per link",
        gpus=_GPU_ONLY + " that answer the link count",
    ),
    MetricSpec(
        "inference_gpu_nvlink_peak_bytes_per_second",
        "gauge",
        "nvml",
        GPU_LABELS,
        "The GPU's NVLink peak in one direction: the speeds of its usable (active or "
        "sleeping) links summed; rate() of inference_gpu_nvlink_transmit_bytes_total over it "
        "is how close the links run to their peak.",
        unit="bytes per second",
        source="field NVML_FI_DEV_NVLINK_GET_SPEED per link (MBps; else "
        "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON), NVML_FI_DEV_NVLINK_GET_STATE",
        gpus="GPUs with NVLink (driver 520 and newer); not MIG devices",
    ),
    MetricSpec(
        "inference_gpu_nvlink_link_transmit_bytes_total",
        "counter",
        "nvml",
        (*GPU_LABELS, "link"),
        "Bytes the GPU sent over one NVLink link since the exporter started (with "
        "--gpu.nvlink-per-link).",
        unit="bytes",
        source="GPM NVML_GPM_METRIC_NVLINK_L<n>_TX_PER_SEC x the poll interval; else field "
        "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX with the link as scope",
        gpus="GPUs with NVLink, with --gpu.nvlink-per-link; not MIG devices",
    ),
    MetricSpec(
        "inference_gpu_nvlink_link_receive_bytes_total",
        "counter",
        "nvml",
        (*GPU_LABELS, "link"),
        "Bytes the GPU received over one NVLink link since the exporter started (with "
        "--gpu.nvlink-per-link).",
        unit="bytes",
        source="GPM NVML_GPM_METRIC_NVLINK_L<n>_RX_PER_SEC x the poll interval; else field "
        "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX with the link as scope",
        gpus="GPUs with NVLink, with --gpu.nvlink-per-link; not MIG devices",
    ),
    MetricSpec(
        "inference_gpu_nvlink_link_peak_bytes_per_second",
        "gauge",
        "nvml",
        (*GPU_LABELS, "link"),
        "One usable NVLink link's speed in one direction (with --gpu.nvlink-per-link).",
        unit="bytes per second",
        source="field NVML_FI_DEV_NVLINK_GET_SPEED with the link as scope (MBps)",
        gpus="GPUs with NVLink, with --gpu.nvlink-per-link; not MIG devices",
    ),
    MetricSpec(
        "inference_gpu_c2c_transmit_bytes_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Bytes the GPU sent to its Grace CPU over the C2C link (offloaded KV cache, weights "
        "streamed from CPU memory) since the exporter started.",
        unit="bytes",
        source="GPM NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC (MiB/s) x the poll interval",
        gpus="Grace parts (GH200, GB200) with driver 550 and newer; absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_c2c_receive_bytes_total",
        "counter",
        "nvml",
        GPU_LABELS,
        "Bytes the GPU received from its Grace CPU over the C2C link since the exporter started.",
        unit="bytes",
        source="GPM NVML_GPM_METRIC_C2C_TOTAL_RX_PER_SEC (MiB/s) x the poll interval",
        gpus="Grace parts (GH200, GB200) with driver 550 and newer; absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_c2c_links",
        "gauge",
        "nvml",
        (*GPU_LABELS, "state"),
        "The GPU's C2C links by status: active, inactive, unknown; every state is a series.",
        source="field NVML_FI_DEV_C2C_LINK_COUNT (once), NVML_FI_DEV_C2C_LINK_GET_STATUS per link",
        gpus="Grace parts (GH200, GB200); absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_c2c_peak_bytes_per_second",
        "gauge",
        "nvml",
        GPU_LABELS,
        "The C2C peak in one direction: the bandwidth of the active C2C links summed.",
        unit="bytes per second",
        source="field NVML_FI_DEV_C2C_LINK_GET_MAX_BW per link (MBps)",
        gpus="Grace parts (GH200, GB200); absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_fabric_state",
        "gauge",
        "nvml",
        (*GPU_LABELS, "state"),
        "The GPU's registration in the NVLink fabric (Fabric Manager, NVSwitch systems) as a "
        "state set: not_started, in_progress, completed, failed (completed with an error "
        "status); 1 for the current state. Until completed the GPU has no NVLink peers.",
        source="nvmlDeviceGetGpuFabricInfoV state and status (older drivers: "
        "nvmlDeviceGetGpuFabricInfo)",
        gpus="Hopper and newer on NVSwitch systems (HGX, NVL); absent elsewhere",
    ),
    MetricSpec(
        "inference_gpu_fabric_health",
        "gauge",
        "nvml",
        (*GPU_LABELS, "status"),
        "The NVLink fabric's health summary for the GPU as a state set: healthy, unhealthy, "
        "limited_capacity; 1 for the current one.",
        source="nvmlDeviceGetGpuFabricInfoV healthSummary (v3 of the structure)",
        gpus="Hopper and newer on NVSwitch systems with a driver that has the v3 structure",
    ),
    MetricSpec(
        "inference_gpu_fabric_condition_active",
        "gauge",
        "nvml",
        (*GPU_LABELS, "condition"),
        "1 while a fabric health condition holds, 0 otherwise: degraded_bandwidth, "
        "route_recovery, route_unhealthy, access_timeout_recovery, incorrect_configuration; "
        "only the conditions the driver reports.",
        source="nvmlDeviceGetGpuFabricInfoV healthMask (v2 and later)",
        gpus="Hopper and newer on NVSwitch systems with driver 550 and newer",
    ),
    MetricSpec(
        "inference_gpu_fabric_info",
        "gauge",
        "nvml",
        (*GPU_LABELS, "cluster_uuid", "clique_id"),
        "The NVLink domain the GPU joined once registered: GPUs with the same cluster_uuid "
        "and clique_id reach each other over NVLink (one NVL72 rack, one HGX board); "
        "constant 1.",
        source="nvmlDeviceGetGpuFabricInfoV clusterUuid, cliqueId",
        gpus="Hopper and newer on NVSwitch systems; absent elsewhere",
    ),
    # --- cpu ----------------------------------------------------------------------------------
    MetricSpec(
        "inference_cpu_seconds_total",
        "counter",
        "cpu",
        ("mode",),
        "CPU time of the node summed over all CPUs, by mode; softirq share = "
        "rate(mode=softirq) / rate(inference_cpu_all_modes_seconds_total).",
        unit="seconds",
        source="<procfs>/stat 'cpu' line (USER_HZ)",
    ),
    MetricSpec(
        "inference_cpu_all_modes_seconds_total",
        "counter",
        "cpu",
        (),
        "CPU time of the node summed over all CPUs and all modes of "
        "inference_cpu_seconds_total (its sum, in one series): the softirq share's "
        "denominator without reading every mode's series.",
        unit="seconds",
        source="<procfs>/stat 'cpu' line (USER_HZ), the modes summed",
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
    # --- engine -------------------------------------------------------------------------------
    MetricSpec(
        "inference_engine_up",
        "gauge",
        "engine",
        ("engine",),
        "1 when the last poll of the engine's metrics endpoint succeeded and parsed, 0 otherwise.",
        source="poll of --engine.url",
    ),
    MetricSpec(
        "inference_engine_last_success_timestamp_seconds",
        "gauge",
        "engine",
        ("engine",),
        "Unix time of the last successful poll of the engine's metrics endpoint.",
        unit="seconds",
        source="poll of --engine.url",
    ),
    MetricSpec(
        "inference_engine_poll_failures_total",
        "counter",
        "engine",
        ("engine", "reason"),
        "Failed polls of the engine's metrics endpoint by reason (connect, timeout, status, "
        "too_large, protocol, parse, unrecognised); every reason is there from the start, at 0.",
        source="poll of --engine.url",
    ),
    MetricSpec(
        "inference_engine_series_dropped_total",
        "counter",
        "engine",
        ("engine", "metric"),
        "Normalised series dropped because a metric exceeded --engine.max-series.",
        source="poll of --engine.url",
    ),
    MetricSpec(
        "inference_queue_depth",
        "gauge",
        "engine",
        ("engine", "model", "role"),
        "Requests waiting in the engine's queue.",
    ),
    MetricSpec(
        "inference_requests_running",
        "gauge",
        "engine",
        ("engine", "model", "role"),
        "Requests being processed (in the running batch).",
    ),
    MetricSpec(
        "inference_kv_cache_usage_ratio",
        "gauge",
        "engine",
        ("engine", "model", "role"),
        "Share of the KV cache in use (0-1).",
        unit="ratio",
    ),
    MetricSpec(
        "inference_prompt_tokens_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Prompt (prefill) tokens processed.",
    ),
    MetricSpec(
        "inference_generation_tokens_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Tokens generated (decoded).",
    ),
    MetricSpec(
        "inference_time_to_first_token_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time from request arrival to the first generated token (engine's own buckets).",
        unit="seconds",
    ),
    MetricSpec(
        "inference_inter_token_latency_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time between consecutive generated tokens of a request: one decode step as a request "
        "sees it.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_e2e_request_latency_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "End-to-end request latency inside the engine.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_queue_time_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time requests spent waiting in the queue.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_prefill_time_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time requests spent in prefill.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_decode_time_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time requests spent in decode.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_h2d_copy_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Duration of host-to-device copies timed by the server's instrumentation (CUDA events; "
        "host wall time without CUDA).",
        unit="seconds",
        source="exporter.instrument.torch_h2d H2DTimer around Tensor.to; custom engines only",
    ),
    MetricSpec(
        "inference_engine_info",
        "gauge",
        "engine",
        ("engine", "version", "model", "role"),
        "Which engine (and version, where it tells) serves which model; constant 1, one series "
        "per model of the last good poll.",
    ),
    MetricSpec(
        "inference_engine_model_info",
        "gauge",
        "engine",
        ("engine", "model", "raw_model", "origin"),
        "The engine's own name for each model of inference_engine_info: raw_model as the "
        "engine gave it (a served name, a Hugging Face id or the path it loaded the model "
        "from), model as every series labels it (a path becomes the model it holds), origin "
        "where the name came from (metrics, or the API path that said it).",
    ),
    MetricSpec(
        "inference_engine_model_config_up",
        "gauge",
        "engine",
        ("engine",),
        "Whether the engine's model configurations answered on its HTTP API (--engine.api-url) "
        "at the last try: 1, and the request-level series count each client request once, at "
        "the model it entered; 0, and they count every model's requests, an ensemble's steps "
        "again (nested time summed twice). Only engines whose API says which models are steps "
        "of others (Triton), once asked.",
        source="Triton GET /v2/models/<name>/config, asked when the endpoint's models change",
    ),
    MetricSpec(
        "inference_engine_ensemble_step_info",
        "gauge",
        "engine",
        ("engine", "ensemble", "model"),
        "Constant 1 per model an ensemble composes (a step): its request time is nested in "
        "the ensemble's, so inference_e2e_request_latency_seconds leaves it out; its queue time "
        "is counted.",
        source="Triton ensemble_scheduling.step[].model_name of each model configuration",
    ),
    MetricSpec(
        "inference_queue_depth_by_reason",
        "gauge",
        "engine",
        ("engine", "model", "role", "reason"),
        "Requests waiting, by why they wait: capacity (no KV-cache room to admit them) or "
        "deferred (held back for another reason, e.g. a LoRA or grammar limit).",
    ),
    MetricSpec(
        "inference_kv_cache_capacity_tokens",
        "gauge",
        "engine",
        ("engine", "model", "role"),
        "Tokens the engine's KV-cache pool holds, summed over its data-parallel engines.",
    ),
    MetricSpec(
        "inference_prompt_tokens_cached_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Prompt tokens whose KV came from a cache (prefix-cache hit or KV transfer) instead of "
        "being computed; a part of inference_prompt_tokens_total.",
    ),
    MetricSpec(
        "inference_estimated_flops_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Floating-point operations the engine estimates it ran, PER GPU (one GPU's share; the "
        "mean over data-parallel engines or ranks): divide its rate by one GPU's peak.",
    ),
    MetricSpec(
        "inference_estimated_read_bytes_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Bytes the engine estimates it read from GPU memory, PER GPU (as "
        "inference_estimated_flops_total).",
        unit="bytes",
    ),
    MetricSpec(
        "inference_estimated_write_bytes_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Bytes the engine estimates it wrote to GPU memory, PER GPU (as "
        "inference_estimated_flops_total).",
        unit="bytes",
    ),
    # --- disaggregated serving: the KV transfer between prefill and decode pods ----------------
    MetricSpec(
        "inference_queue_depth_by_stage",
        "gauge",
        "engine",
        ("engine", "model", "role", "stage"),
        "Requests waiting, by the stage they wait for in disaggregated serving: prefill (the "
        "prefill forward), prealloc (KV room on the decode side, or its bootstrap handshake), "
        "transfer (the KV cache crossing from the prefill pod to the decode pod), decode (the "
        "decode batch). A colocated server has the prefill stage only.",
    ),
    MetricSpec(
        "inference_kv_transfer_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Duration of one KV-cache transfer between a prefill and a decode server, as the "
        "engine measured it (engine's own buckets; vLLM observes it on the side that reads, the "
        "decode server, SGLang on the side that sends, the prefill server).",
        unit="seconds",
    ),
    MetricSpec(
        "inference_kv_transfer_last_seconds",
        "gauge",
        "engine",
        ("engine", "model", "role"),
        "Duration of the most recent KV-cache transfer as the engine last logged it: engines "
        "that keep no histogram of their transfers. One value per log interval, not a "
        "distribution: it feeds no latency record.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_kv_transfer_bytes_total",
        "counter",
        "engine",
        ("engine", "model", "role"),
        "Bytes of KV cache transferred between prefill and decode servers.",
        unit="bytes",
    ),
    MetricSpec(
        "inference_kv_transfer_bootstrap_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time a disaggregated request waited for the prefill and decode servers to connect "
        "(the bootstrap handshake) before its KV room could be reserved.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_kv_transfer_alloc_wait_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "Time a disaggregated request waited, after the bootstrap, for KV-cache room to be "
        "allocated for it (on the decode server: a full decode pool shows here first).",
        unit="seconds",
    ),
    MetricSpec(
        "inference_kv_transfer_upper_bound_seconds",
        "histogram",
        "engine",
        ("engine", "model", "role"),
        "An upper bound of the KV transfer as a router sees it: from the prefill's completion "
        "to the decode server's first token, so it also holds the dispatch, the network and one "
        "decode step. An estimate, kept apart from the measured inference_kv_transfer_seconds.",
        unit="seconds",
    ),
    MetricSpec(
        "inference_pd_decisions_total",
        "counter",
        "engine",
        ("engine", "model", "role", "decision"),
        "Requests a disaggregation-aware router routed, by its decision: prefill_decode (a "
        "prefill pod first, then decode), decode_only (straight to a decode pod), "
        "encode_decode, encode_prefill_decode (multimodal encode first).",
    ),
    MetricSpec(
        "inference_kv_transfer_failures_total",
        "counter",
        "engine",
        ("engine", "model", "role", "reason"),
        "KV-cache transfers that failed, by reason: transfer (the copy failed), notification "
        "(the copy's completion notice failed), bootstrap (the two servers never connected), "
        "expired (the prefill server freed the KV before the decode server read it).",
    ),
    # --- the gateway in front of the engines: its queue (llm-d's endpoint picker) ------------
    MetricSpec(
        "inference_gateway_queue_depth",
        "gauge",
        "engine",
        ("engine", "model", "pool", "priority"),
        "Requests the gateway holds in its own queue (flow control) until the pool has room, by "
        "priority band, summed over tenants (fairness ids). They wait before any engine: the "
        "engines' queues stay short while this one grows.",
    ),
    MetricSpec(
        "inference_gateway_queue_time_seconds",
        "histogram",
        "engine",
        ("engine", "model", "pool"),
        "Time requests the gateway dispatched had waited in its queue (the gateway's own buckets).",
        unit="seconds",
    ),
    MetricSpec(
        "inference_gateway_pool_saturation",
        "gauge",
        "engine",
        ("engine", "model", "pool", "stage"),
        "The pool's saturation as the gateway computes it to gate dispatch, by stage (prefill, "
        "decode, effective: the larger, the one that gates). 1 is the gating set point, above "
        "1 oversubscription; an empty pool, or endpoints whose metrics are missing or stale, "
        "read as 1 (fail-closed): see inference_gateway_stale_endpoints.",
    ),
    MetricSpec(
        "inference_gateway_requests_total",
        "counter",
        "engine",
        ("engine", "model", "pool", "outcome"),
        "Requests the gateway's queue finished with, by outcome: dispatched, rejected_capacity "
        "(the queue full), rejected_no_endpoints, rejected_other, evicted_ttl (waited past "
        "their deadline), evicted_no_endpoints, evicted_context_cancelled (the client gave "
        "up), evicted_other, unknown (an outcome this exporter does not know yet).",
    ),
    MetricSpec(
        "inference_gateway_stale_endpoints",
        "gauge",
        "engine",
        ("engine", "model"),
        "Endpoints whose metrics the gateway found missing or stale at its last saturation "
        "check; it counts them as saturated, so a nonzero value while it queues or sheds load "
        "means its scrape of the engines is broken, not that the pool is full.",
    ),
    MetricSpec(
        "inference_gateway_ready_endpoints",
        "gauge",
        "engine",
        ("engine", "model", "pool"),
        "Endpoints of the pool the gateway can route to.",
    ),
    # --- requests refused at admission, by the engine or the gateway --------------------------
    MetricSpec(
        "inference_requests_rejected_total",
        "counter",
        "engine",
        ("engine", "model", "layer", "reason"),
        "Requests refused at admission, before any work: layer engine (the engine's own "
        "limit, e.g. vLLM's --max-num-queued-reqs, answered 503) or gateway (the gateway's "
        "queue: capacity, no_endpoints, other); reason as the layer names it.",
    ),
    # --- tokenizer ----------------------------------------------------------------------------
    MetricSpec(
        "inference_tokenizer_latency_seconds",
        "histogram",
        "tokenizer",
        ("engine", "source"),
        "Tokenizer latency of a ~512-token prompt: source=probe is the sidecar's probe minus its "
        "1-token round trip; source=engine is what the engine or its instrumentation reports.",
        unit="seconds",
        source="probe: POST to the engine's tokenize endpoint; engine: exporter.instrument "
        "tokenizer_timer()",
    ),
    MetricSpec(
        "inference_tokenizer_probe_rtt_seconds",
        "histogram",
        "tokenizer",
        ("engine",),
        "Round trip of a 1-token tokenize call: HTTP and event-loop overhead of the engine's "
        "front-end.",
        unit="seconds",
        source="POST to the engine's tokenize endpoint",
    ),
    MetricSpec(
        "inference_tokenizer_probe_tokens",
        "gauge",
        "tokenizer",
        ("engine",),
        "Tokens the engine returned for the probe prompt.",
        source="tokenize response",
    ),
    MetricSpec(
        "inference_tokenizer_probes_total",
        "counter",
        "tokenizer",
        ("engine",),
        "Tokenizer probes attempted (one pair of requests per probe interval).",
        source="tokenizer probe",
    ),
    MetricSpec(
        "inference_tokenizer_probe_failures_total",
        "counter",
        "tokenizer",
        ("engine",),
        "Tokenizer probes that failed (connection, status, timeout, unparsable response).",
        source="tokenizer probe",
    ),
    # --- model --------------------------------------------------------------------------------
    MetricSpec(
        "inference_model_weight_bytes",
        "gauge",
        "model",
        ("engine", "model"),
        "Bytes of weights one decode step reads, per GPU of the engine: the stored weights "
        "(quantised ones at their real size) less the untied input embedding, divided by "
        "--model.tensor-parallel. Mixture of experts: every expert (a batch of a few dozen "
        "tokens reaches them all).",
        unit="bytes",
        source="--model.path: model.safetensors.index.json metadata.total_size or the "
        "safetensors headers; --model.weight-bytes",
    ),
    MetricSpec(
        "inference_model_kv_cache_bytes_per_token",
        "gauge",
        "model",
        ("engine", "model"),
        "KV-cache bytes of one token on one GPU of the engine: 2 x layers x KV heads x head dim x "
        "dtype bytes (GQA through the KV heads; MLA: layers x (kv_lora_rank + qk_rope_head_dim) "
        "x dtype bytes).",
        unit="bytes",
        source="--model.path config.json, --model.kv-cache-dtype, --model.tensor-parallel",
    ),
    MetricSpec(
        "inference_model_flops_per_token",
        "gauge",
        "model",
        ("engine", "model"),
        "Forward FLOPs of one token on one GPU of the engine: 2 x non-embedding parameters the "
        "token passes through (MoE: its active experts) / --model.tensor-parallel; attention "
        "over the context and the LM head come on top.",
        unit="FLOP",
        source="--model.path config.json shapes",
    ),
    # --- process ------------------------------------------------------------------------------
    MetricSpec(
        "inference_engine_processes",
        "gauge",
        "process",
        (),
        "Engine processes the sidecar sees (cmdline matched by --process.match).",
        source="psutil, shared PID namespace",
    ),
    MetricSpec(
        "inference_engine_process_cpu_seconds_total",
        "counter",
        "process",
        ("process",),
        "CPU time (user + system) of the matched engine processes, by short process name.",
        unit="seconds",
        source="psutil Process.cpu_times()",
    ),
    MetricSpec(
        "inference_engine_hottest_thread_cpu_ratio",
        "gauge",
        "process",
        (),
        "CPU share of the busiest single thread of the engine's processes over the last window: "
        "near 1 means a GIL-bound or single-threaded front-end, however many cores the node has.",
        unit="ratio",
        source="psutil Process.threads(), difference between two reads",
    ),
    # --- webhook (the admission webhook process, not the sidecar) -----------------------------
    MetricSpec(
        "inference_webhook_reviews_total",
        "counter",
        "webhook",
        ("webhook", "result"),
        "Admission reviews answered, by webhook path (annotation: opt-in pods; namespace: pods "
        "of labelled namespaces) and result (injected, unchanged, not_requested, no_engine, "
        "refused, not_a_pod, malformed, oversized, timeout). Every answer allows the pod.",
        source="the webhook's own count",
    ),
    MetricSpec(
        "inference_webhook_review_duration_seconds",
        "histogram",
        "webhook",
        (),
        "Time from a review's arrival to its answer.",
        unit="seconds",
        source="the webhook's own clock",
    ),
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOGUE}


@dataclass(frozen=True)
class SeriesBudget:
    """The series one sidecar exposes at its defaults, by what multiplies them.

    Prometheus's memory and the rule pack's evaluation time grow with these (docs/scale.md
    turns them into sizing). ``tests/test_cardinality.py`` counts a real exposition of the CLI
    (a replayed 2-GPU trace, the bundled vLLM scrape with one model, two engine processes)
    and fails when a count differs: a change that adds series raises the budget here, on
    purpose, and ``docs/metrics.md`` shows the new one.
    """

    per_gpu: int
    """Series with a ``gpu`` label, per GPU (no Xid yet: one more per GPU and Xid seen)."""
    per_engine: int
    """The engine and tokenizer collectors' series for one vLLM engine serving one model
    (``role`` is a label with one value per endpoint: it adds no series)."""
    per_engine_process: int
    """The process collector's series per distinct engine process name."""
    per_sidecar: int
    """Everything else: the exporter's own, the cpu collector's, NVML's and the process
    collector's fixed series, ``process_*``."""
    max_labels: int
    """No series carries more labels (``__name__`` not counted) once Prometheus adds the
    target labels of a PodMonitor (:data:`POD_MONITOR_TARGET_LABELS`)."""

    def per_pod(self, gpus: int, processes: int = 2) -> int:
        """Series of one pod: a sidecar, one engine, ``gpus`` GPUs."""
        return (
            self.per_sidecar
            + self.per_engine
            + processes * self.per_engine_process
            + gpus * self.per_gpu
        )


SERIES_BUDGET = SeriesBudget(
    per_gpu=68, per_engine=193, per_engine_process=1, per_sidecar=56, max_labels=10
)
# The labels Prometheus adds to every series of a target found through the chart's PodMonitor.
POD_MONITOR_TARGET_LABELS = ("namespace", "pod", "container", "endpoint", "instance", "job")


def _checked(name: str, kind: MetricType) -> MetricSpec:
    entry = BY_NAME[name]
    if entry.type != kind:
        raise TypeError(f"{name} is a {entry.type} in the catalogue, not a {kind}")
    return entry


def _labels(entry: MetricSpec, optional: tuple[str, ...]) -> list[str]:
    unknown = [label for label in optional if label not in entry.optional_labels]
    if unknown:
        raise ValueError(f"{entry.name} has no optional label {unknown[0]!r}")
    return [*entry.labels, *optional]


def gauge(name: str, optional: tuple[str, ...] = ()) -> GaugeMetricFamily:
    """A fresh gauge family for catalogue entry ``name``, with the catalogue's labels (and
    the ``optional`` ones named, which the entry must allow)."""
    entry = _checked(name, "gauge")
    return GaugeMetricFamily(entry.family_name, entry.help, labels=_labels(entry, optional))


def counter(name: str, optional: tuple[str, ...] = ()) -> CounterMetricFamily:
    """A fresh counter family for catalogue entry ``name``, with the catalogue's labels."""
    entry = _checked(name, "counter")
    return CounterMetricFamily(entry.family_name, entry.help, labels=_labels(entry, optional))


def histogram(name: str, optional: tuple[str, ...] = ()) -> HistogramMetricFamily:
    """A fresh histogram family for catalogue entry ``name``, with the catalogue's labels."""
    entry = _checked(name, "histogram")
    return HistogramMetricFamily(entry.family_name, entry.help, labels=_labels(entry, optional))


@dataclass
class BucketCounts:
    """A histogram kept by a collector between scrapes (not thread-safe: guard it).

    Collectors that observe values themselves (driver samples, probe timings) keep one of these
    and turn it into a fresh family sample on each scrape with :meth:`buckets`.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs ending with ``+Inf``, as add_metric wants them."""
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            out.append((repr(float(bound)), float(running)))
        out.append(("+Inf", float(self.n)))
        return out
