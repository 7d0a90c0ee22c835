"""The narrow NVML surface the exporter uses, as a protocol.

Three implementations exist: :class:`exporter.backends.nvml_library.PynvmlApi` (the real library),
:class:`exporter.backends.replay.ReplayApi` (a recorded or synthetic trace) and
:class:`support.nvml.FaultyApi` (wraps another and injects faults). The read logic
that turns these calls into readings lives once, in :mod:`exporter.backends.gpu_reader`, so replay
and fault tests exercise the same code a GPU does.

Units are NVML's own (percent, mW, mJ, MHz, KiB/s, MiB/s); converting them to base units is the
collector's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

# NVML return codes we act on (nvml.h, nvmlReturn_t).
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

ERROR_NAMES = {
    UNINITIALIZED: "UNINITIALIZED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_SUPPORTED: "NOT_SUPPORTED",
    NO_PERMISSION: "NO_PERMISSION",
    NOT_FOUND: "NOT_FOUND",
    INSUFFICIENT_SIZE: "INSUFFICIENT_SIZE",
    DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    TIMEOUT: "TIMEOUT",
    LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    GPU_IS_LOST: "GPU_IS_LOST",
    RESET_REQUIRED: "RESET_REQUIRED",
    LIB_RM_VERSION_MISMATCH: "LIB_RM_VERSION_MISMATCH",
    ARGUMENT_VERSION_MISMATCH: "ARGUMENT_VERSION_MISMATCH",
    UNKNOWN: "UNKNOWN",
}
ERROR_CODES = {name: code for code, name in ERROR_NAMES.items()}

# Errors after which the whole NVML session is unusable and must be re-initialised
# (driver unloaded or reloaded underneath us).
SESSION_ERRORS = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH})
# Errors meaning "this field does not exist here": the field is skipped from then on.
FIELD_ERRORS = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, INVALID_ARGUMENT})

ClockKind = Literal["sm", "mem"]
Direction = Literal["tx", "rx"]
PcieDirection = Direction

# GPM metric ids (nvml.h nvmlGpmMetricId_t).
GPM_GRAPHICS_UTIL = 1
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
# NVLink: NVML calls receive "read" and transmit "write" (MiB/s, all links; then two per link,
# receive first, from id 62 for link 0 to 97 for link 17). C2C: the CPU-GPU link of Grace
# parts (MiB/s, all C2C links). NVML 12.0 and later; C2C from 12.4.
GPM_NVLINK_RX_PER_SEC = 60
GPM_NVLINK_TX_PER_SEC = 61
GPM_NVLINK_LINKS = 18
GPM_C2C_TX_PER_SEC = 100
GPM_C2C_RX_PER_SEC = 101

# What one poll asks GPM for, whatever the GPU's links.
GPM_BASE_NAMES = {
    GPM_GRAPHICS_UTIL: "graphics_util",
    GPM_SM_UTIL: "sm_util",
    GPM_SM_OCCUPANCY: "sm_occupancy",
    GPM_ANY_TENSOR_UTIL: "any_tensor_util",
    GPM_DRAM_BW_UTIL: "dram_bw_util",
    GPM_PCIE_TX_PER_SEC: "pcie_tx_per_sec",
    GPM_PCIE_RX_PER_SEC: "pcie_rx_per_sec",
}


def gpm_nvlink_link_id(link: int, direction: Direction) -> int:
    """The GPM metric id of one NVLink link's receive (``rx``) or transmit (``tx``) rate."""
    return GPM_NVLINK_RX_PER_SEC + 2 + 2 * link + (1 if direction == "tx" else 0)


def gpm_nvlink_link_name(link: int, direction: Direction) -> str:
    return f"nvlink_l{link}_{direction}_per_sec"


GPM_NAMES = {
    **GPM_BASE_NAMES,
    GPM_NVLINK_RX_PER_SEC: "nvlink_rx_per_sec",
    GPM_NVLINK_TX_PER_SEC: "nvlink_tx_per_sec",
    **{
        gpm_nvlink_link_id(link, d): gpm_nvlink_link_name(link, d)
        for link in range(GPM_NVLINK_LINKS)
        for d in ("rx", "tx")
    },
    GPM_C2C_TX_PER_SEC: "c2c_tx_per_sec",
    GPM_C2C_RX_PER_SEC: "c2c_rx_per_sec",
}
GPM_IDS = {name: metric_id for metric_id, name in GPM_NAMES.items()}

# --- field values (nvmlDeviceGetFieldValues) --------------------------------------------------
# nvmlFieldValue_t.scopeId of a per-link counter summed over every link (nvml.h: "A scopeId of
# UINT_MAX returns aggregate value summed up across all links").
ALL_LINKS = 0xFFFFFFFF


@dataclass(frozen=True)
class FieldSpec:
    """One NVML field the exporter reads through ``nvmlDeviceGetFieldValues``.

    ``field_id`` is nvml.h's ``NVML_FI_*``; ``per_link`` fields are asked once per link with
    the link as ``scopeId``, the others once with ``scope``. ``moved`` gives the ids of a field
    nvml.h renumbered: ``(driver branch from which the id applies, id)``, newest first; a
    driver older than the last entry does not have the field. ``counter``: the value only grows
    (a replayed trace keeps it growing across loops). ``identity``: read once per NVML session
    with the GPU's identity, not per read."""

    name: str
    field_id: int
    per_link: bool = False
    scope: int = 0
    counter: bool = False
    moved: tuple[tuple[int, int], ...] = ()
    identity: bool = False

    def id_for(self, driver_branch: int | None) -> int | None:
        """The field's id for a driver of this branch (``550`` for 550.54.15); None where the
        driver predates the field. An unknown branch takes the newest id."""
        if not self.moved or driver_branch is None:
            return self.field_id
        for since, field_id in self.moved:
            if driver_branch >= since:
                return field_id
        return None


FIELD_SPECS: tuple[FieldSpec, ...] = (
    # NVLink (NVML_FI_DEV_NVLINK_*): how many links, each link's state and speed (MBps, one
    # direction), and the throughput counters (KiB, data plus protocol overhead) where GPM has
    # no NVLink metrics (before Hopper).
    FieldSpec("nvlink_link_count", 91, identity=True),
    FieldSpec("nvlink_speed_common_mbps", 90),
    FieldSpec("nvlink_speed_mbps", 164, per_link=True),
    FieldSpec("nvlink_state", 165, per_link=True),
    FieldSpec("nvlink_raw_tx_kib", 140, scope=ALL_LINKS, counter=True),
    FieldSpec("nvlink_raw_rx_kib", 141, scope=ALL_LINKS, counter=True),
    FieldSpec("nvlink_link_raw_tx_kib", 140, per_link=True, counter=True),
    FieldSpec("nvlink_link_raw_rx_kib", 141, per_link=True, counter=True),
    # C2C, the CPU-GPU link of Grace parts (NVML_FI_DEV_C2C_LINK_*): links, status, MBps.
    FieldSpec("c2c_link_count", 170, identity=True),
    FieldSpec("c2c_link_status", 171, per_link=True),
    FieldSpec("c2c_link_max_bw_mbps", 172, per_link=True),
    # NVML_FI_DEV_POWER_CURRENT_LIMIT, GPU scope (0): "Limit currently enforced in milliwatts
    # (This includes other limits set elsewhere. E.g. Out-of-band)"; and
    # NVML_FI_DEV_POWER_DEFAULT_LIMIT, "limit which device boots with" (both driver 535).
    FieldSpec("power_limit_mw", 190),
    FieldSpec("power_default_limit_mw", 189),
    # Power smoothing (Blackwell): nvml.h moved these ids between CUDA 13.0 (driver 580: 256,
    # 260) and 13.1 (driver 590: 251, 255, where 251 had been a clock-event counter), and they
    # first appear with driver 570 (CUDA 12.8).
    FieldSpec("power_smoothing_enabled", 251, moved=((590, 251), (570, 256))),
    FieldSpec("power_smoothing_floor_w", 255, moved=((590, 255), (570, 260))),
)
FIELDS_BY_NAME = {spec.name: spec for spec in FIELD_SPECS}

# A field to read: its name, and the link for a per-link field (None otherwise).
FieldKey = tuple[str, int | None]

# NVML_NVLINK_STATE_* (the values of NVML_FI_DEV_NVLINK_GET_STATE).
NVLINK_STATES = {0: "inactive", 1: "active", 2: "sleep", 3: "active_traffic_disabled"}
# NVML_FI_DEV_C2C_LINK_GET_STATUS.
C2C_STATES = {0: "inactive", 1: "active"}

# --- fabric (nvmlDeviceGetGpuFabricInfoV) -------------------------------------------------------
# NVML_GPU_FABRIC_STATE_*: 0 is "not supported".
FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 0 is "not supported".
FABRIC_HEALTH = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}
# NVML_GPU_FABRIC_HEALTH_MASK_*: each condition is a field of the health mask, (shift, width);
# 0 there means "not supported", 1 the condition holds, 2 it does not. Incorrect configuration
# is an enumeration: 1 "none", 2 and up a reason.
FABRIC_CONDITIONS = {
    "degraded_bandwidth": (0, 0x3),
    "route_recovery": (2, 0x3),
    "route_unhealthy": (4, 0x3),
    "access_timeout_recovery": (6, 0x3),
    "incorrect_configuration": (8, 0xF),
}

# --- workload power profiles (nvml.h NVML_POWER_PROFILE_*, Blackwell) ---------------------------
POWER_PROFILES = {
    0: "max_p",
    1: "max_q",
    2: "compute",
    3: "memory_bound",
    4: "network",
    5: "balanced",
    6: "llm_inference",
    7: "llm_training",
    8: "rbm",
    9: "dcpcie",
    10: "hmma_sparse",
    11: "hmma_dense",
    12: "sync_balanced",
    13: "hpc",
    14: "mig",
    15: "max_q_1",
    16: "network_bound",
    17: "high_throughput_inference",
    18: "medium_throughput_inference",
    19: "low_latency_inference",
    20: "training",
    21: "inference",
    22: "max_q_2",
    23: "max_q_3",
    24: "low_priority_background",
}


def power_profile_name(profile: int) -> str:
    return POWER_PROFILES.get(profile, f"profile_{profile}")


class NvmlError(Exception):
    """An NVML call failed with return code ``code``."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = code
        super().__init__(message or ERROR_NAMES.get(code, f"NVML error {code}"))

    @property
    def name(self) -> str:
        return ERROR_NAMES.get(self.code, str(self.code))


@dataclass(frozen=True)
class MigAttributes:
    """``nvmlDeviceGetAttributes`` of a MIG device (the call answers for MIG devices only)."""

    multiprocessor_count: int
    gpu_instance_slice_count: int
    compute_instance_slice_count: int
    memory_size_mib: int


@dataclass(frozen=True)
class ProcessMemory:
    """One entry of ``nvmlDeviceGetComputeRunningProcesses``: a host PID with a CUDA context."""

    pid: int
    # None where NVML answers NVML_VALUE_NOT_AVAILABLE (WDDM; some MIG set-ups).
    used_bytes: int | None


@dataclass(frozen=True)
class ProcessSample:
    """One entry of ``nvmlDeviceGetProcessUtilization``: a host PID's share of one sample
    period (``sm_pct``: time a kernel of the process ran, ``mem_pct``: memory controller)."""

    pid: int
    timestamp_us: int
    sm_pct: int
    mem_pct: int


@dataclass(frozen=True)
class FabricInfo:
    """``nvmlDeviceGetGpuFabricInfoV``: the GPU's registration in the NVLink fabric (NVSwitch
    systems, Hopper and newer). ``status`` is an NVML return code, meaningful once ``state`` is
    completed; ``health_mask`` needs the v2 structure (driver 550 and newer), ``health_summary``
    the v3 one; None where the driver answered an older version."""

    state: int
    status: int
    clique_id: int
    cluster_uuid: str
    health_mask: int | None = None
    health_summary: int | None = None


@dataclass(frozen=True)
class XidEvent:
    """One Xid error the driver reported."""

    gpu: int
    xid: int


class NvmlApi(Protocol):
    """The NVML calls the exporter makes. Each method is one NVML call (GPM: see below).

    Handles are opaque. Every method may raise :class:`NvmlError`.
    """

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def handle(self, index: int) -> object: ...

    def uuid(self, handle: object) -> str: ...

    def name(self, handle: object) -> str: ...

    def pci_bus_id(self, handle: object) -> str: ...

    def mig_mode(self, handle: object) -> int:
        """Current MIG mode: 1 enabled, 0 disabled."""
        ...

    def memory_bus_width_bits(self, handle: object) -> int: ...

    def max_clock_mhz(self, handle: object, kind: ClockKind) -> int:
        """The highest clock the GPU can run at (``nvmlDeviceGetMaxClockInfo``)."""
        ...

    def cuda_cores(self, handle: object) -> int:
        """CUDA (FP32) cores of the whole GPU; ``NOT_SUPPORTED`` in MIG mode."""
        ...

    def compute_capability(self, handle: object) -> tuple[int, int]: ...

    def utilization_samples(self, handle: object, last_seen_us: int) -> list[tuple[int, float]]:
        """GPU utilisation samples ``(timestamp_us, percent)`` newer than ``last_seen_us``."""
        ...

    def utilization_rates(self, handle: object) -> tuple[int, int]:
        """``(gpu_percent, memory_controller_busy_percent)``."""
        ...

    def memory_info(self, handle: object) -> tuple[int, int]:
        """``(used_bytes, total_bytes)``."""
        ...

    def power_usage_mw(self, handle: object) -> int: ...

    def total_energy_mj(self, handle: object) -> int: ...

    def temperature_c(self, handle: object) -> int: ...

    def clock_mhz(self, handle: object, kind: ClockKind) -> int: ...

    def clock_event_reasons(self, handle: object) -> int: ...

    def pcie_throughput_kibps(self, handle: object, direction: PcieDirection) -> int: ...

    def field_values(
        self, handle: object, keys: Sequence[FieldKey]
    ) -> dict[FieldKey, float | NvmlError]:
        """One ``nvmlDeviceGetFieldValues`` call for every key (:data:`FIELD_SPECS` names):
        each value, or the NvmlError NVML answered for that field alone."""
        ...

    def fabric_info(self, handle: object) -> FabricInfo: ...

    def enforced_power_limit_mw(self, handle: object) -> int:
        """``nvmlDeviceGetEnforcedPowerLimit``: where the power-limit field is missing."""
        ...

    def power_profiles(self, handle: object) -> frozenset[int]:
        """The workload power profiles the GPU enforces now (``NVML_POWER_PROFILE_*``;
        ``nvmlDeviceWorkloadPowerProfileGetCurrentProfiles`` enforcedProfilesMask)."""
        ...

    def gpm_supported(self, handle: object) -> bool: ...

    def gpm_sample(self, handle: object) -> object:
        """Take a GPM sample (allocation plus one sampling call)."""
        ...

    def gpm_metrics(
        self, older: object, newer: object, metric_ids: Sequence[int]
    ) -> dict[int, float | None]:
        """Metric values between two samples; ``None`` where the metric is unsupported."""
        ...

    def gpm_free(self, sample: object) -> None: ...

    # --- MIG (a GPU in MIG mode; ``mig`` is a MIG device handle) ---------------------------
    def mig_device_count(self, handle: object) -> int:
        """Slots for MIG devices on this GPU (``nvmlDeviceGetMaxMigDeviceCount``); 0 without
        MIG. Slots can be empty."""
        ...

    def mig_device_handle(self, handle: object, index: int) -> object:
        """The MIG device in slot ``index``; ``NOT_FOUND`` (or ``INVALID_ARGUMENT``) for an
        empty slot."""
        ...

    def gpu_instance_id(self, mig: object) -> int: ...

    def compute_instance_id(self, mig: object) -> int: ...

    def mig_attributes(self, mig: object) -> MigAttributes: ...

    def gpm_mig_sample(self, handle: object, gpu_instance_id: int) -> object:
        """A GPM sample of one GPU instance, taken through the parent GPU's ``handle``
        (``nvmlGpmMigSampleGet``); freed with :meth:`gpm_free`."""
        ...

    # --- processes -------------------------------------------------------------------------
    def compute_processes(self, handle: object) -> list[ProcessMemory]:
        """Processes with a compute context on the GPU or MIG device (host PIDs)."""
        ...

    def process_utilization(self, handle: object, last_seen_us: int) -> list[ProcessSample]:
        """Per-process samples newer than ``last_seen_us``; empty when there are none
        (NVML's ``NOT_FOUND``). ``NOT_SUPPORTED`` on MIG."""
        ...

    def register_xid_events(self, handles: Sequence[object]) -> None: ...

    def wait_xid_events(self, timeout_ms: int) -> list[XidEvent]:
        """Block up to ``timeout_ms`` for Xid events; empty on timeout."""
        ...
