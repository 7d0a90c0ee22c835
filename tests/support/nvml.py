"""A fault-injecting NVML: wraps another :class:`NvmlApi` and breaks it on demand.

Used by the fault tests (and usable from a REPL) to reproduce what drivers do in the field:
the library missing, ``nvmlInit`` failing, a GPU falling off the bus (Xid 79,
``GPU_IS_LOST``), a call that never returns (Xid 45-style hangs), a driver reload
(``UNINITIALIZED`` until re-init) and single unsupported fields.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

from exporter.backends.nvml_api import (
    ClockKind,
    FabricInfo,
    FieldKey,
    MigAttributes,
    NvmlApi,
    NvmlError,
    PcieDirection,
    ProcessMemory,
    ProcessSample,
    XidEvent,
)

T = TypeVar("T")


class FaultyApi:
    """Delegates to ``inner`` unless a fault is set. Thread-safe; faults can change any time."""

    def __init__(self, inner: NvmlApi) -> None:
        self.inner = inner
        self.init_error: int | None = None
        self.session_error: int | None = None
        self.lost: dict[int, int] = {}
        self.hanging: set[int] = set()
        self.field_errors: dict[tuple[int, str], int] = {}
        self.calls: Counter[str] = Counter()
        self.release = threading.Event()
        self._lock = threading.Lock()

    # --- controls ----------------------------------------------------------------------------
    def lose(self, gpu: int, code: int) -> None:
        self.lost[gpu] = code

    def recover(self, gpu: int) -> None:
        self.lost.pop(gpu, None)

    def hang(self, gpu: int) -> None:
        self.release.clear()
        self.hanging.add(gpu)

    def unhang(self, gpu: int) -> None:
        self.hanging.discard(gpu)
        self.release.set()

    # --- plumbing ----------------------------------------------------------------------------
    def _gpu_of(self, handle: object) -> int | None:
        if isinstance(handle, int):
            return handle
        if isinstance(handle, tuple) and handle and isinstance(handle[0], int):
            return handle[0]
        gpu = getattr(handle, "gpu", None)  # a MIG device: faults of its GPU apply
        return gpu if isinstance(gpu, int) else None

    def _call(self, method: str, handle: object, fn: Callable[[], T]) -> T:
        with self._lock:
            self.calls[method] += 1
        if self.session_error is not None:
            raise NvmlError(self.session_error)
        gpu = self._gpu_of(handle)
        if gpu is not None:
            while gpu in self.hanging:
                self.release.wait(0.05)
            if gpu in self.lost:
                raise NvmlError(self.lost[gpu])
            code = self.field_errors.get((gpu, method))
            if code is not None:
                raise NvmlError(code)
        return fn()

    # --- NvmlApi -----------------------------------------------------------------------------
    def init(self) -> None:
        with self._lock:
            self.calls["init"] += 1
        if self.init_error is not None:
            raise NvmlError(self.init_error)
        self.inner.init()

    def shutdown(self) -> None:
        self.release.set()
        self.inner.shutdown()

    def driver_version(self) -> str:
        return self._call("driver_version", None, self.inner.driver_version)

    def device_count(self) -> int:
        return self._call("device_count", None, self.inner.device_count)

    def handle(self, index: int) -> object:
        return self._call("handle", None, lambda: self.inner.handle(index))

    def uuid(self, handle: object) -> str:
        return self._call("uuid", handle, lambda: self.inner.uuid(handle))

    def name(self, handle: object) -> str:
        return self._call("name", handle, lambda: self.inner.name(handle))

    def pci_bus_id(self, handle: object) -> str:
        return self._call("pci_bus_id", handle, lambda: self.inner.pci_bus_id(handle))

    def mig_mode(self, handle: object) -> int:
        return self._call("mig_mode", handle, lambda: self.inner.mig_mode(handle))

    def memory_bus_width_bits(self, handle: object) -> int:
        return self._call(
            "memory_bus_width_bits", handle, lambda: self.inner.memory_bus_width_bits(handle)
        )

    def max_clock_mhz(self, handle: object, kind: ClockKind) -> int:
        return self._call("max_clock_mhz", handle, lambda: self.inner.max_clock_mhz(handle, kind))

    def cuda_cores(self, handle: object) -> int:
        return self._call("cuda_cores", handle, lambda: self.inner.cuda_cores(handle))

    def compute_capability(self, handle: object) -> tuple[int, int]:
        return self._call(
            "compute_capability", handle, lambda: self.inner.compute_capability(handle)
        )

    def utilization_samples(self, handle: object, last_seen_us: int) -> list[tuple[int, float]]:
        return self._call(
            "utilization_samples",
            handle,
            lambda: self.inner.utilization_samples(handle, last_seen_us),
        )

    def utilization_rates(self, handle: object) -> tuple[int, int]:
        return self._call("utilization_rates", handle, lambda: self.inner.utilization_rates(handle))

    def memory_info(self, handle: object) -> tuple[int, int]:
        return self._call("memory_info", handle, lambda: self.inner.memory_info(handle))

    def power_usage_mw(self, handle: object) -> int:
        return self._call("power_usage_mw", handle, lambda: self.inner.power_usage_mw(handle))

    def total_energy_mj(self, handle: object) -> int:
        return self._call("total_energy_mj", handle, lambda: self.inner.total_energy_mj(handle))

    def temperature_c(self, handle: object) -> int:
        return self._call("temperature_c", handle, lambda: self.inner.temperature_c(handle))

    def clock_mhz(self, handle: object, kind: ClockKind) -> int:
        return self._call("clock_mhz", handle, lambda: self.inner.clock_mhz(handle, kind))

    def clock_event_reasons(self, handle: object) -> int:
        return self._call(
            "clock_event_reasons", handle, lambda: self.inner.clock_event_reasons(handle)
        )

    def pcie_throughput_kibps(self, handle: object, direction: PcieDirection) -> int:
        return self._call(
            "pcie_throughput_kibps",
            handle,
            lambda: self.inner.pcie_throughput_kibps(handle, direction),
        )

    def field_values(
        self, handle: object, keys: Sequence[FieldKey]
    ) -> dict[FieldKey, float | NvmlError]:
        return self._call("field_values", handle, lambda: self.inner.field_values(handle, keys))

    def fabric_info(self, handle: object) -> FabricInfo:
        return self._call("fabric_info", handle, lambda: self.inner.fabric_info(handle))

    def enforced_power_limit_mw(self, handle: object) -> int:
        return self._call(
            "enforced_power_limit_mw", handle, lambda: self.inner.enforced_power_limit_mw(handle)
        )

    def power_profiles(self, handle: object) -> frozenset[int]:
        return self._call("power_profiles", handle, lambda: self.inner.power_profiles(handle))

    def gpm_supported(self, handle: object) -> bool:
        return self._call("gpm_supported", handle, lambda: self.inner.gpm_supported(handle))

    def gpm_sample(self, handle: object) -> object:
        return self._call("gpm_sample", handle, lambda: self.inner.gpm_sample(handle))

    def gpm_metrics(
        self, older: object, newer: object, metric_ids: Sequence[int]
    ) -> dict[int, float | None]:
        return self._call(
            "gpm_metrics", newer, lambda: self.inner.gpm_metrics(older, newer, metric_ids)
        )

    def gpm_free(self, sample: object) -> None:
        self.inner.gpm_free(sample)

    def mig_device_count(self, handle: object) -> int:
        return self._call("mig_device_count", handle, lambda: self.inner.mig_device_count(handle))

    def mig_device_handle(self, handle: object, index: int) -> object:
        return self._call(
            "mig_device_handle", handle, lambda: self.inner.mig_device_handle(handle, index)
        )

    def gpu_instance_id(self, mig: object) -> int:
        return self._call("gpu_instance_id", mig, lambda: self.inner.gpu_instance_id(mig))

    def compute_instance_id(self, mig: object) -> int:
        return self._call("compute_instance_id", mig, lambda: self.inner.compute_instance_id(mig))

    def mig_attributes(self, mig: object) -> MigAttributes:
        return self._call("mig_attributes", mig, lambda: self.inner.mig_attributes(mig))

    def gpm_mig_sample(self, handle: object, gpu_instance_id: int) -> object:
        return self._call(
            "gpm_mig_sample", handle, lambda: self.inner.gpm_mig_sample(handle, gpu_instance_id)
        )

    def compute_processes(self, handle: object) -> list[ProcessMemory]:
        return self._call("compute_processes", handle, lambda: self.inner.compute_processes(handle))

    def process_utilization(self, handle: object, last_seen_us: int) -> list[ProcessSample]:
        return self._call(
            "process_utilization",
            handle,
            lambda: self.inner.process_utilization(handle, last_seen_us),
        )

    def register_xid_events(self, handles: Sequence[object]) -> None:
        self._call("register_xid_events", None, lambda: self.inner.register_xid_events(handles))

    def wait_xid_events(self, timeout_ms: int) -> list[XidEvent]:
        return self._call("wait_xid_events", None, lambda: self.inner.wait_xid_events(timeout_ms))
