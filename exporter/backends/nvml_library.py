"""The real NVML library through nvidia-ml-py (module ``pynvml``).

The module is imported lazily, in :meth:`PynvmlApi.init`, so a machine without it still
runs every other collector, and its absence is reported as ``LIBRARY_NOT_FOUND``. Tests pass
a stand-in module (``library=``) that answers as NVML does.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from exporter.backends.nvml_api import (
    ARGUMENT_VERSION_MISMATCH,
    FIELDS_BY_NAME,
    FUNCTION_NOT_FOUND,
    INSUFFICIENT_SIZE,
    LIBRARY_NOT_FOUND,
    NOT_FOUND,
    NOT_SUPPORTED,
    TIMEOUT,
    UNINITIALIZED,
    UNKNOWN,
    ClockKind,
    FabricInfo,
    FieldKey,
    MigAttributes,
    NvmlError,
    PcieDirection,
    ProcessMemory,
    ProcessSample,
    XidEvent,
)

T = TypeVar("T")


class _AbsentError(Exception):
    """Stands for an exception class the library does not have."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# c_nvmlValue_t's member for each nvmlValueType_t (NVML_VALUE_TYPE_*).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _field_value(entry: Any) -> float:
    """The value of one nvmlFieldValue_t, by its valueType."""
    kind = int(entry.valueType)
    member = _VALUE_MEMBERS[kind] if 0 <= kind < len(_VALUE_MEMBERS) else "ullVal"
    return float(getattr(entry.value, member))


def _driver_branch(version: str) -> int | None:
    """``550`` for driver ``550.54.15``; None where the version does not start with a number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _uuid_hex(raw: Any) -> str:
    """A fabric cluster UUID (16 bytes) in the usual 8-4-4-4-12 form."""
    h = bytes(raw).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class PynvmlApi:
    """:class:`~exporter.backends.nvml_api.NvmlApi` on top of nvidia-ml-py."""

    def __init__(self, library: ModuleType | None = None) -> None:
        self._library = library
        self._nvml: ModuleType | None = None
        self._event_set: Any = None
        self._branch: int | None = None
        # The newest nvmlGpuFabricInfo version the driver took (3, 2; 1: the unversioned call).
        self._fabric_version = 3

    @property
    def _lib(self) -> ModuleType:
        if self._nvml is None:
            raise NvmlError(UNINITIALIZED)
        return self._nvml

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        nvml = self._lib
        try:
            return fn(*args)
        except nvml.NVMLError as err:
            raise NvmlError(int(getattr(err, "value", UNKNOWN)), str(err)) from None

    def _fn(self, name: str) -> Callable[..., Any]:
        """A binding that older nvidia-ml-py releases lack: missing is FUNCTION_NOT_FOUND, as
        the library itself answers for a symbol an older driver lacks."""
        fn: Callable[..., Any] | None = getattr(self._lib, name, None)
        if fn is None:
            raise NvmlError(FUNCTION_NOT_FOUND, f"pynvml has no {name}")
        return fn

    def init(self) -> None:
        library = self._library
        if library is None:
            try:
                import pynvml  # noqa: PLC0415 - optional at run time, see module docstring
            except ImportError as err:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NvmlError(LIBRARY_NOT_FOUND, f"cannot import pynvml: {err}") from None
            library = pynvml
        self._nvml = library
        self._call(library.nvmlInit)
        self._branch = None
        self._fabric_version = 3

    def shutdown(self) -> None:
        nvml = self._lib
        if self._event_set is not None:
            with contextlib.suppress(NvmlError):
                self._call(nvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._call(nvml.nvmlShutdown)
        self._nvml = None

    def driver_version(self) -> str:
        return _text(self._call(self._lib.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._lib.nvmlDeviceGetCount))

    def handle(self, index: int) -> object:
        return self._call(self._lib.nvmlDeviceGetHandleByIndex, index)

    def uuid(self, handle: object) -> str:
        return _text(self._call(self._lib.nvmlDeviceGetUUID, handle))

    def name(self, handle: object) -> str:
        return _text(self._call(self._lib.nvmlDeviceGetName, handle))

    def pci_bus_id(self, handle: object) -> str:
        info = self._call(self._lib.nvmlDeviceGetPciInfo, handle)
        return _text(info.busId)

    def mig_mode(self, handle: object) -> int:
        current, _pending = self._call(self._lib.nvmlDeviceGetMigMode, handle)
        return int(current)

    def memory_bus_width_bits(self, handle: object) -> int:
        return int(self._call(self._fn("nvmlDeviceGetMemoryBusWidth"), handle))

    def max_clock_mhz(self, handle: object, kind: ClockKind) -> int:
        nvml = self._lib
        clock = nvml.NVML_CLOCK_SM if kind == "sm" else nvml.NVML_CLOCK_MEM
        return int(self._call(nvml.nvmlDeviceGetMaxClockInfo, handle, clock))

    def cuda_cores(self, handle: object) -> int:
        return int(self._call(self._fn("nvmlDeviceGetNumGpuCores"), handle))

    def compute_capability(self, handle: object) -> tuple[int, int]:
        major, minor = self._call(self._lib.nvmlDeviceGetCudaComputeCapability, handle)
        return int(major), int(minor)

    def utilization_samples(self, handle: object, last_seen_us: int) -> list[tuple[int, float]]:
        nvml = self._lib
        try:
            _kind, samples = self._call(
                nvml.nvmlDeviceGetSamples, handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, last_seen_us
            )
        except NvmlError as err:
            if err.code == NOT_FOUND:  # no sample newer than last_seen_us
                return []
            raise
        return [(int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples]

    def utilization_rates(self, handle: object) -> tuple[int, int]:
        rates = self._call(self._lib.nvmlDeviceGetUtilizationRates, handle)
        return int(rates.gpu), int(rates.memory)

    def memory_info(self, handle: object) -> tuple[int, int]:
        info = self._call(self._lib.nvmlDeviceGetMemoryInfo, handle)
        return int(info.used), int(info.total)

    def power_usage_mw(self, handle: object) -> int:
        return int(self._call(self._lib.nvmlDeviceGetPowerUsage, handle))

    def total_energy_mj(self, handle: object) -> int:
        return int(self._call(self._lib.nvmlDeviceGetTotalEnergyConsumption, handle))

    def temperature_c(self, handle: object) -> int:
        nvml = self._lib
        return int(self._call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU))

    def clock_mhz(self, handle: object, kind: ClockKind) -> int:
        nvml = self._lib
        clock = nvml.NVML_CLOCK_SM if kind == "sm" else nvml.NVML_CLOCK_MEM
        return int(self._call(nvml.nvmlDeviceGetClockInfo, handle, clock))

    def clock_event_reasons(self, handle: object) -> int:
        nvml = self._lib
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is None:  # nvidia-ml-py older than 12.535
            fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call(fn, handle))

    def pcie_throughput_kibps(self, handle: object, direction: PcieDirection) -> int:
        nvml = self._lib
        counter = (
            nvml.NVML_PCIE_UTIL_TX_BYTES if direction == "tx" else nvml.NVML_PCIE_UTIL_RX_BYTES
        )
        return int(self._call(nvml.nvmlDeviceGetPcieThroughput, handle, counter))

    def field_values(
        self, handle: object, keys: Sequence[FieldKey]
    ) -> dict[FieldKey, float | NvmlError]:
        if self._branch is None:
            self._branch = _driver_branch(self.driver_version()) or 0
        out: dict[FieldKey, float | NvmlError] = {}
        asked: list[FieldKey] = []
        ids: list[tuple[int, int]] = []
        for key in keys:
            name, link = key
            spec = FIELDS_BY_NAME[name]
            field_id = spec.id_for(self._branch or None)
            if field_id is None:  # the driver predates the field: do not ask
                out[key] = NvmlError(NOT_SUPPORTED, f"{name}: not in driver {self._branch}")
                continue
            scope = link if spec.per_link and link is not None else spec.scope
            asked.append(key)
            ids.append((field_id, scope))
        if not ids:
            return out
        values = self._call(self._fn("nvmlDeviceGetFieldValues"), handle, ids)
        for key, entry in zip(asked, values, strict=True):
            code = int(entry.nvmlReturn)
            out[key] = _field_value(entry) if code == 0 else NvmlError(code)
        return out

    def fabric_info(self, handle: object) -> FabricInfo:
        nvml = self._lib
        while self._fabric_version > 1:
            struct = getattr(nvml, f"c_nvmlGpuFabricInfo_v{self._fabric_version}_t", None)
            if struct is None or not hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV"):
                self._fabric_version -= 1  # an older nvidia-ml-py
                continue
            info = struct()
            try:
                self._call(nvml.nvmlDeviceGetGpuFabricInfoV, handle, ctypes.byref(info))
            except NvmlError as err:
                if err.code in (ARGUMENT_VERSION_MISMATCH, FUNCTION_NOT_FOUND):
                    self._fabric_version -= 1  # an older driver: ask the previous version
                    continue
                raise
            summary = int(getattr(info, "healthSummary", 0))  # v3 only; 0: not supported
            return FabricInfo(
                state=int(info.state),
                status=int(info.status),
                clique_id=int(info.cliqueId),
                cluster_uuid=_uuid_hex(info.clusterUuid),
                health_mask=int(info.healthMask),
                health_summary=summary or None,
            )
        old = nvml.c_nvmlGpuFabricInfo_t()
        self._call(self._fn("nvmlDeviceGetGpuFabricInfo"), handle, ctypes.byref(old))
        return FabricInfo(
            state=int(old.state),
            status=int(old.status),
            clique_id=int(old.cliqueId),
            cluster_uuid=_uuid_hex(old.clusterUuid),
        )

    def enforced_power_limit_mw(self, handle: object) -> int:
        return int(self._call(self._fn("nvmlDeviceGetEnforcedPowerLimit"), handle))

    def power_profiles(self, handle: object) -> frozenset[int]:
        nvml = self._lib
        get = self._fn("nvmlDeviceWorkloadPowerProfileGetCurrentProfiles")
        struct = getattr(nvml, "c_nvmlWorkloadPowerProfileCurrentProfiles_v1_t", None)
        if struct is None:
            raise NvmlError(FUNCTION_NOT_FOUND, "pynvml has no workload power profile structure")
        info = struct()
        self._call(get, handle, ctypes.byref(info))
        words = list(info.enforcedProfilesMask.mask)
        return frozenset(
            32 * w + bit for w, word in enumerate(words) for bit in range(32) if word >> bit & 1
        )

    def gpm_supported(self, handle: object) -> bool:
        nvml = self._lib
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return False
        return bool(self._call(nvml.nvmlGpmQueryDeviceSupport, handle).isSupportedDevice)

    def gpm_sample(self, handle: object) -> object:
        nvml = self._lib
        sample = self._call(nvml.nvmlGpmSampleAlloc)
        try:
            self._call(nvml.nvmlGpmSampleGet, handle, sample)
        except NvmlError:
            self._call(nvml.nvmlGpmSampleFree, sample)
            raise
        return sample

    def gpm_metrics(
        self, older: object, newer: object, metric_ids: Sequence[int]
    ) -> dict[int, float | None]:
        nvml = self._lib
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = older
        request.sample2 = newer
        for slot, metric_id in enumerate(metric_ids):
            request.metrics[slot].metricId = metric_id
        self._call(nvml.nvmlGpmMetricsGet, request)
        values: dict[int, float | None] = {}
        for slot, metric_id in enumerate(metric_ids):
            metric = request.metrics[slot]
            values[metric_id] = float(metric.value) if metric.nvmlReturn == 0 else None
        return values

    def gpm_free(self, sample: object) -> None:
        self._call(self._lib.nvmlGpmSampleFree, sample)

    def mig_device_count(self, handle: object) -> int:
        return int(self._call(self._lib.nvmlDeviceGetMaxMigDeviceCount, handle))

    def mig_device_handle(self, handle: object, index: int) -> object:
        return self._call(self._lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)

    def gpu_instance_id(self, mig: object) -> int:
        return int(self._call(self._lib.nvmlDeviceGetGpuInstanceId, mig))

    def compute_instance_id(self, mig: object) -> int:
        return int(self._call(self._lib.nvmlDeviceGetComputeInstanceId, mig))

    def mig_attributes(self, mig: object) -> MigAttributes:
        attrs = self._call(self._lib.nvmlDeviceGetAttributes, mig)
        return MigAttributes(
            multiprocessor_count=int(attrs.multiprocessorCount),
            gpu_instance_slice_count=int(attrs.gpuInstanceSliceCount),
            compute_instance_slice_count=int(attrs.computeInstanceSliceCount),
            memory_size_mib=int(attrs.memorySizeMB),
        )

    def gpm_mig_sample(self, handle: object, gpu_instance_id: int) -> object:
        nvml = self._lib
        get = self._fn("nvmlGpmMigSampleGet")
        sample = self._call(nvml.nvmlGpmSampleAlloc)
        try:
            self._call(get, handle, gpu_instance_id, sample)
        except NvmlError:
            self._call(nvml.nvmlGpmSampleFree, sample)
            raise
        return sample

    def compute_processes(self, handle: object) -> list[ProcessMemory]:
        nvml = self._lib
        mismatch: type[Exception] = getattr(nvml, "NVMLLibraryMismatchError", _AbsentError)
        try:
            procs = self._call(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        except mismatch as err:
            # The library lacks the versioned symbol the binding asks for (an older driver):
            # not an NVMLError, but the same meaning as a missing function.
            raise NvmlError(FUNCTION_NOT_FOUND, str(err)) from None
        # usedGpuMemory is None where NVML answered NVML_VALUE_NOT_AVAILABLE.
        return [
            ProcessMemory(
                pid=int(p.pid),
                used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            )
            for p in procs
        ]

    def process_utilization(self, handle: object, last_seen_us: int) -> list[ProcessSample]:
        fn = self._lib.nvmlDeviceGetProcessUtilization
        for attempt in (1, 2):
            try:
                samples = self._call(fn, handle, last_seen_us)
                break
            except NvmlError as err:
                # NOT_FOUND: no process ran a kernel since last_seen_us. The binding raises
                # NVMLError(0) (SUCCESS) when the sizing call finds nothing to size: the same.
                if err.code in (NOT_FOUND, 0):
                    return []
                # A process appeared between the binding's sizing call and its filling call:
                # size again once; the samples stay in the driver's buffer for the next poll.
                if err.code == INSUFFICIENT_SIZE:
                    if attempt == 1:
                        continue
                    return []
                raise
        return [
            ProcessSample(
                pid=int(s.pid),
                timestamp_us=int(s.timeStamp),
                sm_pct=int(s.smUtil),
                mem_pct=int(s.memUtil),
            )
            for s in samples
        ]

    def register_xid_events(self, handles: Sequence[object]) -> None:
        nvml = self._lib
        if self._event_set is None:
            self._event_set = self._call(nvml.nvmlEventSetCreate)
        for handle in handles:
            self._call(
                nvml.nvmlDeviceRegisterEvents,
                handle,
                nvml.nvmlEventTypeXidCriticalError,
                self._event_set,
            )

    def wait_xid_events(self, timeout_ms: int) -> list[XidEvent]:
        nvml = self._lib
        if self._event_set is None:
            return []
        try:
            data = self._call(nvml.nvmlEventSetWait_v2, self._event_set, timeout_ms)
        except NvmlError as err:
            if err.code == TIMEOUT:
                return []
            raise
        if int(data.eventType) != int(nvml.nvmlEventTypeXidCriticalError):
            return []
        index = int(self._call(nvml.nvmlDeviceGetIndex, data.device))
        return [XidEvent(gpu=index, xid=int(data.eventData))]
