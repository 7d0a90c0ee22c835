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
    UNKNOWN: "UNKNOWN",
}
ERROR_CODES = {name: code for code, name in ERROR_NAMES.items()}

# Errors after which the whole NVML session is unusable and must be re-initialised
# (driver unloaded or reloaded underneath us).
SESSION_ERRORS = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH})
# Errors meaning "this field does not exist here": the field is skipped from then on.
FIELD_ERRORS = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_PERMISSION, INVALID_ARGUMENT})

ClockKind = Literal["sm", "mem"]
PcieDirection = Literal["tx", "rx"]

# GPM metric ids (nvml.h nvmlGpmMetricId_t).
GPM_GRAPHICS_UTIL = 1
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21

GPM_NAMES = {
    GPM_GRAPHICS_UTIL: "graphics_util",
    GPM_SM_UTIL: "sm_util",
    GPM_SM_OCCUPANCY: "sm_occupancy",
    GPM_ANY_TENSOR_UTIL: "any_tensor_util",
    GPM_DRAM_BW_UTIL: "dram_bw_util",
    GPM_PCIE_TX_PER_SEC: "pcie_tx_per_sec",
    GPM_PCIE_RX_PER_SEC: "pcie_rx_per_sec",
}
GPM_IDS = {name: metric_id for metric_id, name in GPM_NAMES.items()}


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
