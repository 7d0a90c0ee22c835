"""The real NVML library through nvidia-ml-py (module ``pynvml``).

The module is imported lazily, in :meth:`PynvmlApi.init`, so a machine without it still
runs every other collector, and its absence is reported as ``LIBRARY_NOT_FOUND``. Tests pass
a stand-in module (``library=``) that answers as NVML does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from exporter.backends.nvml_api import (
    FUNCTION_NOT_FOUND,
    INSUFFICIENT_SIZE,
    LIBRARY_NOT_FOUND,
    NOT_FOUND,
    TIMEOUT,
    UNINITIALIZED,
    UNKNOWN,
    ClockKind,
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


class PynvmlApi:
    """:class:`~exporter.backends.nvml_api.NvmlApi` on top of nvidia-ml-py."""

    def __init__(self, library: ModuleType | None = None) -> None:
        self._library = library
        self._nvml: ModuleType | None = None
        self._event_set: Any = None

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
