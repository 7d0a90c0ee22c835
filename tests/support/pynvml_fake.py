"""A stand-in for the ``pynvml`` module (nvidia-ml-py) that answers as NVML does on given GPUs.

It lets :class:`exporter.backends.nvml_library.PynvmlApi` run without a GPU: the adapter receives it
through ``PynvmlApi(library=...)``. Errors are nvidia-ml-py's own classes (``NVMLError(3)`` is an
``NVMLError_NotSupported`` with ``.value == 3``), and constants are its own, so the adapter's
error mapping is exercised as on a GPU.

Two layers:

* The identity and hardware-fact calls (UUID, name, PCI, MIG mode, GPM support, bus width,
  clocks, cores, compute capability) are modelled at the Python level.
* Every other call the exporter makes (readings, GPM, MIG devices, processes) runs
  **nvidia-ml-py's own binding code** (its Python wrappers, re-bound to this module) over a
  fake of the C library (:class:`_CLibrary`) that follows nvml.h: handles are ctypes pointers,
  out-parameters are written through ``byref``, buffers are sized by a first call with a NULL
  buffer. So the wrappers' quirks come from the real code, not from a re-implementation:
  ``nvmlDeviceGetProcessUtilization``'s sample-buffer protocol (``NOT_FOUND`` when no sample is
  newer than the timestamp, ``INSUFFICIENT_SIZE`` then a second call), ``usedGpuMemory`` turned
  into ``None`` for ``NVML_VALUE_NOT_AVAILABLE``, ``NVMLLibraryMismatchError`` when the versioned
  symbol is missing, ``nvmlDeviceIsMigDeviceHandle`` returning a ``c_uint``.

Each device answers from :class:`FakeGpu` / :class:`FakeMig`; a field set to :class:`Error`
raises that NVML error, as the driver does. What nvml.h documents for MIG is built in: on a
MIG device handle the device-level calls (utilisation, samples, per-process utilisation, power,
energy, temperature, clocks, clock events, PCIe) answer ``NOT_SUPPORTED``; on a GPU with MIG
enabled, utilisation, samples and per-process utilisation answer ``NOT_SUPPORTED`` ("On
MIG-enabled GPUs, querying device utilization rates is not currently supported", nvml.h).
``drop`` removes Python bindings the way an older nvidia-ml-py lacks them; ``missing`` removes
C symbols the way an older driver lacks them.

Links and power state run the real bindings too: ``nvmlDeviceGetFieldValues`` answers each
field by its id and scope as nvml.h defines them (NVLink link count, state, speed and
throughput counters, C2C links, the enforced power limit, power smoothing with the ids of the
fake driver's generation: nvml.h moved them between driver 580 and 590),
``nvmlDeviceGetGpuFabricInfoV`` checks the structure version it is given,
``nvmlDeviceWorkloadPowerProfileGetCurrentProfiles`` fills the 255-bit masks. The presets at
the end are hand-written from NVIDIA's published figures, not read from a device: an HGX H100
(18 NVLink 4 links at 26562 MBps each way, what ``nvidia-smi nvlink -s`` prints as 26.562
GB/s), a two-GPU tensor-parallel pod of them whose links run near their peak while the SMs
idle and one whose links and SMs are both busy, an H100 PCIe without NVLink bridges, an L4
without NVLink, and a GB200 (C2C to its Grace CPU, power smoothing, a workload power profile).
"""

# ruff: noqa: N802 - the functions carry pynvml's own names

from __future__ import annotations

import ctypes
import dataclasses
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
SUCCESS = pynvml.NVML_SUCCESS


@dataclass(frozen=True)
class Error:
    """An NVML return code the fake answers with instead of a value."""

    code: int


@dataclass
class FakeMig:
    """What one MIG device answers."""

    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    # (multiprocessorCount, gpuInstanceSliceCount, computeInstanceSliceCount, memorySizeMB)
    attributes: tuple[int, int, int, int] | Error = Error(NOT_SUPPORTED)
    memory: tuple[int, int] | Error = Error(NOT_SUPPORTED)  # (used, total) bytes
    # (pid, usedGpuMemory bytes or None for NVML_VALUE_NOT_AVAILABLE)
    processes: list[tuple[int, int | None]] | Error = field(default_factory=list)


@dataclass
class FakeLink:
    """One NVLink link: its state (NVML_NVLINK_STATE_*), speed (MBps, one direction) and the
    throughput counters (KiB, data plus protocol overhead)."""

    state: int | Error = 1
    speed_mbps: int = 26562
    tx_kib: int = 0
    rx_kib: int = 0


@dataclass
class FakeFabric:
    """What ``nvmlDeviceGetGpuFabricInfoV`` answers; ``max_version`` is the newest structure
    version the fake driver takes (1: it has only the unversioned call)."""

    state: int = 3  # completed
    status: int = 0
    clique_id: int = 1
    cluster_uuid: bytes = bytes(range(16))
    health_mask: int = 0
    health_summary: int = 0
    max_version: int = 3


@dataclass
class FakeGpu:
    """What one GPU answers (values as nvidia-ml-py returns them)."""

    name: str
    uuid: str
    pci_bus_id: str = "00000000:18:00.0"
    mig_mode: tuple[int, int] | Error = (0, 0)
    gpm_supported: bool = False
    memory_bus_width: int | Error = Error(NOT_SUPPORTED)
    max_clocks_mhz: dict[int, int | Error] = field(default_factory=dict)
    cuda_cores: int | Error = Error(NOT_SUPPORTED)
    compute_capability: tuple[int, int] | Error = Error(NOT_SUPPORTED)
    # --- readings -------------------------------------------------------------------------
    utilization: tuple[int, int] | Error = Error(NOT_SUPPORTED)  # (gpu %, memory %)
    samples: list[tuple[int, int]] | Error = Error(NOT_SUPPORTED)  # (timestamp µs, %)
    memory: tuple[int, int] | Error = Error(NOT_SUPPORTED)  # (used, total) bytes
    power_mw: int | Error = Error(NOT_SUPPORTED)
    energy_mj: int | Error = Error(NOT_SUPPORTED)
    temperature_c: int | Error = Error(NOT_SUPPORTED)
    clocks_mhz: dict[int, int] = field(default_factory=dict)
    clock_events: int | Error = Error(NOT_SUPPORTED)
    pcie_kibps: tuple[int, int] | Error = Error(NOT_SUPPORTED)  # (tx, rx)
    # GPM metric values (percent, MiB/s) between any two samples, by NVML_GPM_METRIC_* id.
    gpm: dict[int, float] = field(default_factory=dict)
    # GPM values of each GPU instance (nvmlGpmMigSampleGet), by GPU instance id.
    gpm_instances: dict[int, dict[int, float]] = field(default_factory=dict)
    # --- MIG --------------------------------------------------------------------------------
    max_mig_devices: int = 0
    mig_devices: dict[int, FakeMig] = field(default_factory=dict)  # by slot, may be sparse
    # --- processes --------------------------------------------------------------------------
    processes: list[tuple[int, int | None]] | Error = field(default_factory=list)
    # (pid, timestamp µs, smUtil, memUtil) in the driver's buffer
    process_samples: list[tuple[int, int, int, int]] | Error = field(default_factory=list)
    # A process appears between the sizing call and the filling call of
    # nvmlDeviceGetProcessUtilization (the buffer is then too small once).
    grow_between_calls: int = 0
    # --- links and power state ------------------------------------------------------------
    nvlinks: list[FakeLink] | None = None  # None: the link count answers NOT_SUPPORTED
    nvlink_fields: bool = True  # False: a driver before 520, no per-link state or speed
    c2c_links: list[tuple[int, int]] | None = None  # (status, max bandwidth MBps)
    power_limit_mw: int | Error = Error(NOT_SUPPORTED)
    power_limit_field: bool = True  # False: a driver before NVML_FI_DEV_POWER_CURRENT_LIMIT
    power_default_limit_mw: int | None = None  # None: the enforced limit is the default
    smoothing: tuple[int, float] | None = None  # (enabled, applied floor W): Blackwell
    fabric: FakeFabric | Error = Error(NOT_SUPPORTED)
    power_profiles: frozenset[int] | Error = Error(NOT_SUPPORTED)

    @property
    def mig_enabled(self) -> bool:
        return not isinstance(self.mig_mode, Error) and self.mig_mode[0] == 1


H100_SXM = FakeGpu(
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-6513270e-269e-0d37-f2a7-4de452e6b438",
    gpm_supported=True,
    memory_bus_width=5120,
    max_clocks_mhz={pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619},
    cuda_cores=132 * 128,
    compute_capability=(9, 0),
)
L4 = FakeGpu(
    name="NVIDIA L4",
    uuid="GPU-11111111-2222-3333-4444-555555555555",
    pci_bus_id="00000000:2A:00.0",
    mig_mode=Error(NOT_SUPPORTED),  # no MIG on an L4
    memory_bus_width=192,
    max_clocks_mhz={pynvml.NVML_CLOCK_SM: 2040, pynvml.NVML_CLOCK_MEM: 6251},
    cuda_cores=7424,
    compute_capability=(8, 9),
)


class _PciInfo:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id.encode()  # a c_char array: bytes


class _GpmSupport:
    def __init__(self, supported: bool) -> None:
        self.isSupportedDevice = int(supported)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


# Fake addresses of the ctypes handles the C layer hands out: (gpu + 1) << 20 | (slot + 1) << 8
# for devices (slot -1: the GPU itself), and GPM samples from 0x7000_0000 up.
def _device_address(gpu: int, slot: int | None) -> int:
    return (gpu + 1) << 20 | ((slot + 1) if slot is not None else 0) << 8


def _address(pointer: object) -> int:
    value = ctypes.cast(pointer, ctypes.c_void_p).value  # type: ignore[arg-type]
    return int(value or 0)


def _write_pointer(out: Any, address: int) -> None:
    ctypes.c_void_p.from_buffer(out._obj).value = address


def _set(out: Any, value: int) -> None:
    out._obj.value = value


@dataclass
class _GpmSample:
    gpu: int
    instance: int | None = None  # GPU instance id; None: the whole GPU
    taken: bool = False


class _CLibrary:
    """The C functions of libnvidia-ml that the re-bound wrappers call, answering from the
    fake GPUs. Each returns an ``nvmlReturn_t`` and writes its out-parameters."""

    def __init__(
        self, gpus: list[FakeGpu], log: Callable[[str, object], None], branch: int = 550
    ) -> None:
        self.gpus = gpus
        self.log = log
        self.branch = branch
        self.samples: dict[int, _GpmSample] = {}
        self.next_sample = 0x7000_0000
        self.initialised = False

    # --- handles ----------------------------------------------------------------------------
    def resolve(self, fn: str, handle: object) -> tuple[int, FakeGpu, FakeMig | None] | int:
        """The device behind a handle, or an error code."""
        if not self.initialised:
            return pynvml.NVML_ERROR_UNINITIALIZED
        if isinstance(handle, _Handle):
            gpu, slot = handle.index, None
        else:
            address = _address(handle)
            gpu, slot = (address >> 20) - 1, ((address >> 8) & 0xFFF) - 1
            slot = None if slot < 0 else slot
        if not 0 <= gpu < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        dev = self.gpus[gpu]
        if slot is None:
            self.log(fn, gpu)
            return gpu, dev, None
        mig = dev.mig_devices.get(slot)
        if mig is None or not dev.mig_enabled:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self.log(fn, f"{gpu}:{slot}")
        return gpu, dev, mig

    def _whole(self, fn: str, handle: object, *, mig_mode_ok: bool = True) -> FakeGpu | int:
        """A device-level call: NOT_SUPPORTED on MIG handles (and, unless ``mig_mode_ok``, on a
        GPU in MIG mode)."""
        found = self.resolve(fn, handle)
        if isinstance(found, int):
            return found
        _, dev, mig = found
        if mig is not None or (not mig_mode_ok and dev.mig_enabled):
            return NOT_SUPPORTED
        return dev

    def _scalar(self, fn: str, handle: object, out: Any, value: int | Error) -> int:
        dev = self._whole(fn, handle)
        if isinstance(dev, int):
            return dev
        if isinstance(value, Error):
            return value.code
        _set(out, value)
        return SUCCESS

    # --- readings ---------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: object, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetUtilizationRates", handle, mig_mode_ok=False)
        if isinstance(dev, int):
            return dev
        if isinstance(dev.utilization, Error):
            return dev.utilization.code
        out._obj.gpu, out._obj.memory = dev.utilization
        return SUCCESS

    def nvmlDeviceGetSamples(  # noqa: PLR0917 - the C function's parameters
        self, handle: object, kind: Any, last_seen: Any, value_type: Any, count: Any, buffer: Any
    ) -> int:
        dev = self._whole("nvmlDeviceGetSamples", handle, mig_mode_ok=False)
        if isinstance(dev, int):
            return dev
        if isinstance(dev.samples, Error):
            return dev.samples.code
        newer = [s for s in dev.samples if s[0] > last_seen.value]
        if not newer:
            return pynvml.NVML_ERROR_NOT_FOUND
        _set(value_type, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)
        if buffer is None:
            _set(count, len(newer))
            return SUCCESS
        for i, (ts, value) in enumerate(newer[: count._obj.value]):
            buffer[i].timeStamp = ts
            buffer[i].sampleValue.uiVal = value
        _set(count, min(len(newer), count._obj.value))
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: object, out: Any) -> int:
        found = self.resolve("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(found, int):
            return found
        _, dev, mig = found
        memory = mig.memory if mig is not None else dev.memory
        if isinstance(memory, Error):
            return memory.code
        used, total = memory
        out._obj.used, out._obj.total, out._obj.free = used, total, total - used
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: object, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetPowerUsage", handle)
        return dev if isinstance(dev, int) else self._value(out, dev.power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetTotalEnergyConsumption", handle)
        return dev if isinstance(dev, int) else self._value(out, dev.energy_mj)

    def nvmlDeviceGetTemperature(self, handle: object, sensor: Any, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetTemperature", handle)
        return dev if isinstance(dev, int) else self._value(out, dev.temperature_c)

    def nvmlDeviceGetClockInfo(self, handle: object, clock: Any, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetClockInfo", handle)
        if isinstance(dev, int):
            return dev
        return self._value(out, dev.clocks_mhz.get(clock.value, Error(NOT_SUPPORTED)))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return dev if isinstance(dev, int) else self._value(out, dev.clock_events)

    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: Any, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetPcieThroughput", handle)
        if isinstance(dev, int):
            return dev
        if isinstance(dev.pcie_kibps, Error):
            return dev.pcie_kibps.code
        tx, rx = dev.pcie_kibps
        _set(out, tx if counter.value == pynvml.NVML_PCIE_UTIL_TX_BYTES else rx)
        return SUCCESS

    @staticmethod
    def _value(out: Any, value: int | Error) -> int:
        if isinstance(value, Error):
            return value.code
        _set(out, value)
        return SUCCESS

    # --- links and power state --------------------------------------------------------------
    def _field(self, dev: FakeGpu, field_id: int, scope: int) -> tuple[int, float] | int:
        """(nvmlValueType_t, value) of one field, or the error code NVML answers for it."""
        uint, ullong, double = (
            pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
            pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
            pynvml.NVML_VALUE_TYPE_DOUBLE,
        )
        links = dev.nvlinks
        if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
            return NOT_SUPPORTED if links is None else (uint, len(links))
        per_link = {
            pynvml.NVML_FI_DEV_NVLINK_GET_STATE: ("state", uint),
            pynvml.NVML_FI_DEV_NVLINK_GET_SPEED: ("speed_mbps", uint),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: ("tx_kib", ullong),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: ("rx_kib", ullong),
        }
        if field_id in per_link:
            if links is None or not dev.nvlink_fields:
                return NOT_SUPPORTED
            attr, kind = per_link[field_id]
            if scope == 0xFFFFFFFF and attr in ("tx_kib", "rx_kib"):
                return kind, sum(getattr(link, attr) for link in links)
            if not 0 <= scope < len(links):
                return pynvml.NVML_ERROR_INVALID_ARGUMENT
            value = getattr(links[scope], attr)
            return value.code if isinstance(value, Error) else (kind, value)
        if field_id == pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
            active = [link.speed_mbps for link in links or [] if link.state == 1]
            return (uint, active[0]) if active else NOT_SUPPORTED
        c2c = dev.c2c_links
        if field_id == pynvml.NVML_FI_DEV_C2C_LINK_COUNT:
            return NOT_SUPPORTED if c2c is None else (uint, len(c2c))
        if field_id in (
            pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS,
            pynvml.NVML_FI_DEV_C2C_LINK_GET_MAX_BW,
        ):
            if c2c is None or not 0 <= scope < len(c2c):
                return NOT_SUPPORTED if c2c is None else pynvml.NVML_ERROR_INVALID_ARGUMENT
            status, bandwidth = c2c[scope]
            return uint, status if field_id == pynvml.NVML_FI_DEV_C2C_LINK_GET_STATUS else bandwidth
        if field_id in (
            pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
            pynvml.NVML_FI_DEV_POWER_DEFAULT_LIMIT,
        ):
            if not dev.power_limit_field or isinstance(dev.power_limit_mw, Error):
                return NOT_SUPPORTED
            if field_id == pynvml.NVML_FI_DEV_POWER_DEFAULT_LIMIT:
                return uint, dev.power_default_limit_mw or dev.power_limit_mw
            return uint, dev.power_limit_mw
        return self._smoothing(dev, field_id, uint, double)

    def _smoothing(
        self, dev: FakeGpu, field_id: int, uint: int, double: int
    ) -> tuple[int, float] | int:
        """Power smoothing by the ids of the fake driver's generation (nvml.h moved them
        between driver 580 and 590; 251 was a clock-event counter in ns before)."""
        if self.branch >= 590:
            ids = {251: "enabled", 255: "floor"}
        elif self.branch >= 570:
            ids = {256: "enabled", 260: "floor", 251: "sw_thermal_ns"}
        else:
            return NOT_SUPPORTED
        what = ids.get(field_id)
        if what == "sw_thermal_ns":
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 987_654_321
        if what is None or dev.smoothing is None:
            return NOT_SUPPORTED
        enabled, floor = dev.smoothing
        return (uint, enabled) if what == "enabled" else (double, floor)

    def nvmlDeviceGetFieldValues(self, handle: object, count: Any, values: Any) -> int:
        dev = self._whole("nvmlDeviceGetFieldValues", handle)
        if isinstance(dev, int):
            return dev
        entries = values._obj
        for i in range(count.value):
            entry = entries[i]
            answer = self._field(dev, int(entry.fieldId), int(entry.scopeId))
            entry.timestamp = 1_700_000_000_000_000
            if isinstance(answer, int):
                entry.nvmlReturn = answer
                continue
            kind, value = answer
            entry.valueType = kind
            member = {
                pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            }
            setattr(entry.value, member.get(kind, "ullVal"), value)
            entry.nvmlReturn = SUCCESS
        return SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object, out: Any) -> int:
        dev = self._whole("nvmlDeviceGetEnforcedPowerLimit", handle)
        return dev if isinstance(dev, int) else self._value(out, dev.power_limit_mw)

    def _fabric(self, fn: str, handle: object, version: int) -> FakeFabric | int:
        dev = self._whole(fn, handle)
        if isinstance(dev, int):
            return dev
        if isinstance(dev.fabric, Error):
            return dev.fabric.code
        if version > dev.fabric.max_version:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        return dev.fabric

    def nvmlDeviceGetGpuFabricInfoV(self, handle: object, info: Any) -> int:
        struct = info._obj
        version = {pynvml.nvmlGpuFabricInfo_v3: 3, pynvml.nvmlGpuFabricInfo_v2: 2}.get(
            struct.version, 99
        )
        fabric = self._fabric("nvmlDeviceGetGpuFabricInfoV", handle, version)
        if isinstance(fabric, int):
            return fabric
        if fabric.max_version < 2:
            return pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        self._fill_fabric(struct, fabric)
        struct.healthMask = fabric.health_mask
        if version >= 3:
            struct.healthSummary = fabric.health_summary
        return SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: object, info: Any) -> int:
        fabric = self._fabric("nvmlDeviceGetGpuFabricInfo", handle, 1)
        if isinstance(fabric, int):
            return fabric
        self._fill_fabric(info._obj, fabric)
        return SUCCESS

    @staticmethod
    def _fill_fabric(struct: Any, fabric: FakeFabric) -> None:
        struct.state, struct.status, struct.cliqueId = fabric.state, fabric.status, fabric.clique_id
        for i, byte in enumerate(fabric.cluster_uuid):
            struct.clusterUuid[i] = byte

    def nvmlDeviceWorkloadPowerProfileGetCurrentProfiles(self, handle: object, info: Any) -> int:
        dev = self._whole("nvmlDeviceWorkloadPowerProfileGetCurrentProfiles", handle)
        if isinstance(dev, int):
            return dev
        if isinstance(dev.power_profiles, Error):
            return dev.power_profiles.code
        struct = info._obj
        if struct.version != pynvml.nvmlWorkloadPowerProfileCurrentProfiles_v1:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        for profile in dev.power_profiles:
            word, bit = divmod(profile, 32)
            for mask in (
                struct.perfProfilesMask,
                struct.requestedProfilesMask,
                struct.enforcedProfilesMask,
            ):
                mask.mask[word] |= 1 << bit
        return SUCCESS

    # --- MIG --------------------------------------------------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object, out: Any) -> int:
        found = self.resolve("nvmlDeviceGetMaxMigDeviceCount", handle)
        if isinstance(found, int):
            return found
        _, dev, mig = found
        if mig is not None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        # "Returns zero if MIG is not supported or enabled."
        _set(out, dev.max_mig_devices if dev.mig_enabled else 0)
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: Any, out: Any) -> int:
        found = self.resolve("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if isinstance(found, int):
            return found
        gpu, dev, mig = found
        slot = int(index.value)
        if mig is not None or not dev.mig_enabled or slot >= dev.max_mig_devices:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if slot not in dev.mig_devices:
            return pynvml.NVML_ERROR_NOT_FOUND  # an empty slot: sparse indices are normal
        _write_pointer(out, _device_address(gpu, slot))
        return SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: object, out: Any) -> int:
        found = self.resolve("nvmlDeviceIsMigDeviceHandle", handle)
        if isinstance(found, int):
            return found
        _set(out, int(found[2] is not None))
        return SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: object, out: Any) -> int:
        found = self.resolve("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if isinstance(found, int):
            return found
        gpu, _, mig = found
        if mig is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _write_pointer(out, _device_address(gpu, None))
        return SUCCESS

    def _mig(self, fn: str, handle: object) -> FakeMig | int:
        found = self.resolve(fn, handle)
        if isinstance(found, int):
            return found
        mig = found[2]
        # These answer for MIG device handles only (nvml.h).
        return mig if mig is not None else pynvml.NVML_ERROR_NOT_SUPPORTED

    def nvmlDeviceGetGpuInstanceId(self, handle: object, out: Any) -> int:
        mig = self._mig("nvmlDeviceGetGpuInstanceId", handle)
        return mig if isinstance(mig, int) else self._value(out, mig.gpu_instance_id)

    def nvmlDeviceGetComputeInstanceId(self, handle: object, out: Any) -> int:
        mig = self._mig("nvmlDeviceGetComputeInstanceId", handle)
        return mig if isinstance(mig, int) else self._value(out, mig.compute_instance_id)

    def nvmlDeviceGetAttributes_v2(self, handle: object, out: Any) -> int:
        mig = self._mig("nvmlDeviceGetAttributes_v2", handle)
        if isinstance(mig, int):
            return mig
        if isinstance(mig.attributes, Error):
            return mig.attributes.code
        attrs = out._obj
        sms, gi_slices, ci_slices, memory_mb = mig.attributes
        attrs.multiprocessorCount = sms
        attrs.gpuInstanceSliceCount = gi_slices
        attrs.computeInstanceSliceCount = ci_slices
        attrs.memorySizeMB = memory_mb
        return SUCCESS

    # --- GPM --------------------------------------------------------------------------------
    def nvmlGpmSampleAlloc(self, out: Any) -> int:
        self.next_sample += 0x100
        self.samples[self.next_sample] = _GpmSample(gpu=-1)
        _write_pointer(out, self.next_sample)
        return SUCCESS

    def nvmlGpmSampleFree(self, sample: object) -> int:
        if self.samples.pop(_address(sample), None) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return SUCCESS

    def nvmlGpmSampleGet(self, handle: object, sample: object) -> int:
        found = self.resolve("nvmlGpmSampleGet", handle)
        if isinstance(found, int):
            return found
        gpu, dev, mig = found
        if mig is not None or not dev.gpm_supported:
            return NOT_SUPPORTED
        return self._take(sample, _GpmSample(gpu, None, True))

    def nvmlGpmMigSampleGet(self, handle: object, instance: int, sample: object) -> int:
        found = self.resolve("nvmlGpmMigSampleGet", handle)
        if isinstance(found, int):
            return found
        gpu, dev, mig = found
        if mig is not None or not dev.gpm_supported:
            return NOT_SUPPORTED
        if instance not in dev.gpm_instances:
            return pynvml.NVML_ERROR_NOT_FOUND
        return self._take(sample, _GpmSample(gpu, int(instance), True))

    def _take(self, sample: object, taken: _GpmSample) -> int:
        address = _address(sample)
        if address not in self.samples:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self.samples[address] = taken
        return SUCCESS

    def nvmlGpmMetricsGet(self, request: Any) -> int:
        req = request._obj
        first = self.samples.get(_address(req.sample1))
        second = self.samples.get(_address(req.sample2))
        if req.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if first is None or second is None or not (first.taken and second.taken):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if (first.gpu, first.instance) != (second.gpu, second.instance):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        dev = self.gpus[second.gpu]
        values = dev.gpm if second.instance is None else dev.gpm_instances[second.instance]
        for i in range(req.numMetrics):
            metric = req.metrics[i]
            if metric.metricId in values:
                metric.value = values[metric.metricId]
                metric.nvmlReturn = SUCCESS
            else:
                metric.nvmlReturn = NOT_SUPPORTED
        return SUCCESS

    # --- processes --------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: object, count: Any, buffer: Any
    ) -> int:
        found = self.resolve("nvmlDeviceGetComputeRunningProcesses_v3", handle)
        if isinstance(found, int):
            return found
        _, dev, mig = found
        procs = mig.processes if mig is not None else dev.processes
        if isinstance(procs, Error):
            return procs.code
        if not procs:
            _set(count, 0)
            return SUCCESS
        if buffer is None or count._obj.value < len(procs):
            _set(count, len(procs))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        gi = mig.gpu_instance_id if mig is not None else 0xFFFFFFFF
        ci = mig.compute_instance_id if mig is not None else 0xFFFFFFFF
        for i, (pid, used) in enumerate(procs):
            buffer[i].pid = pid
            buffer[i].usedGpuMemory = (
                pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            )
            buffer[i].gpuInstanceId = gi
            buffer[i].computeInstanceId = ci
        _set(count, len(procs))
        return SUCCESS

    def nvmlDeviceGetProcessUtilization(
        self, handle: object, buffer: Any, count: Any, last_seen: Any
    ) -> int:
        dev = self._whole("nvmlDeviceGetProcessUtilization", handle, mig_mode_ok=False)
        if isinstance(dev, int):
            return dev
        if isinstance(dev.process_samples, Error):
            return dev.process_samples.code
        newer = [s for s in dev.process_samples if s[1] > last_seen.value]
        if not newer:
            return pynvml.NVML_ERROR_NOT_FOUND
        if buffer is None:
            _set(count, len(newer))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        if dev.grow_between_calls:
            dev.grow_between_calls -= 1
            _set(count, len(newer) + 1)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        if count._obj.value < len(newer):
            _set(count, len(newer))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, ts, sm, mem) in enumerate(newer):
            buffer[i].pid, buffer[i].timeStamp = pid, ts
            buffer[i].smUtil, buffer[i].memUtil = sm, mem
            buffer[i].encUtil = buffer[i].decUtil = 0
        _set(count, len(newer))
        return SUCCESS


# The bindings that run nvidia-ml-py's own wrapper code over the fake C library. A decorated
# binding is re-bound underneath its decorator, which is applied again.
_REAL_BINDINGS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetAttributes",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceWorkloadPowerProfileGetCurrentProfiles",
)
_DECORATORS: dict[str, Callable[[Any], Any]] = {
    "nvmlDeviceGetComputeRunningProcesses": pynvml.throwOnVersionMismatch,
}


def _rebind(name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    binding = getattr(pynvml, name)
    decorator = _DECORATORS.get(name)
    inner = binding.__wrapped__ if decorator is not None else binding
    rebound = types.FunctionType(
        inner.__code__, namespace, inner.__name__, inner.__defaults__, inner.__closure__
    )
    return decorator(rebound) if decorator is not None else rebound


def fake_pynvml(
    gpus: list[FakeGpu],
    *,
    driver: str = "550.54.15",
    drop: Iterable[str] = (),
    missing: Iterable[str] = (),
) -> types.ModuleType:
    """A module answering for ``gpus``; ``module.calls`` lists ``(function, device)`` where
    device is the GPU index, or ``"gpu:slot"`` for a MIG device."""
    module = types.ModuleType("pynvml")
    calls: list[tuple[str, object]] = []
    library = _CLibrary(gpus, lambda fn, dev: calls.append((fn, dev)), int(driver.split(".", 1)[0]))
    absent = set(missing)

    def function_pointer(name: str) -> Callable[..., int]:
        if not library.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        fn: Callable[..., int] | None = getattr(library, name, None)
        if fn is None or name in absent:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return fn

    def answer(value: Any) -> Any:
        if isinstance(value, Error):
            raise pynvml.NVMLError(value.code)
        return value

    def device(fn: str, handle: object) -> FakeGpu | FakeMig:
        found = library.resolve(fn, handle)
        if isinstance(found, int):
            raise pynvml.NVMLError(found)
        return found[2] or found[1]

    def gpu(fn: str, handle: object) -> FakeGpu:
        dev = device(fn, handle)
        if isinstance(dev, FakeMig):
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return dev

    def nvmlInit() -> None:
        library.initialised = True

    def nvmlShutdown() -> None:
        library.initialised = False

    def nvmlSystemGetDriverVersion() -> str:
        return driver

    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        if not 0 <= index < len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(handle: object) -> str:
        return device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(handle: object) -> str:
        return device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(handle: object) -> _PciInfo:
        found = library.resolve("nvmlDeviceGetPciInfo", handle)
        if isinstance(found, int):
            raise pynvml.NVMLError(found)
        return _PciInfo(found[1].pci_bus_id)  # a MIG device sits on its GPU's bus

    def nvmlDeviceGetMigMode(handle: object) -> tuple[int, int]:
        mode: tuple[int, int] = answer(gpu("nvmlDeviceGetMigMode", handle).mig_mode)
        return mode

    def nvmlGpmQueryDeviceSupport(handle: object) -> _GpmSupport:
        return _GpmSupport(gpu("nvmlGpmQueryDeviceSupport", handle).gpm_supported)

    def nvmlDeviceGetMemoryBusWidth(handle: object) -> int:
        width: int = answer(gpu("nvmlDeviceGetMemoryBusWidth", handle).memory_bus_width)
        return width

    def nvmlDeviceGetMaxClockInfo(handle: object, clock_type: int) -> int:
        clocks = gpu("nvmlDeviceGetMaxClockInfo", handle).max_clocks_mhz
        if clock_type not in clocks:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        mhz: int = answer(clocks[clock_type])
        return mhz

    def nvmlDeviceGetNumGpuCores(handle: object) -> int:
        cores: int = answer(gpu("nvmlDeviceGetNumGpuCores", handle).cuda_cores)
        return cores

    def nvmlDeviceGetCudaComputeCapability(handle: object) -> tuple[int, int]:
        cc: tuple[int, int] = answer(
            gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability
        )
        return cc

    def nvmlEventSetCreate() -> None:
        # No event sets here: Xid events answer NOT_SUPPORTED, as on a vGPU guest.
        raise pynvml.NVMLError(NOT_SUPPORTED)

    functions = {name: fn for name, fn in locals().items() if name.startswith("nvml")}
    dropped = set(drop)
    for name, fn in functions.items():
        if name not in dropped:
            setattr(module, name, fn)
    namespace = dict(vars(pynvml))
    namespace["_nvmlGetFunctionPointer"] = function_pointer
    for name in _REAL_BINDINGS:
        namespace[name] = _rebind(name, namespace)
        if name not in dropped:
            setattr(module, name, namespace[name])
    for name in dir(pynvml):
        if name.startswith(("NVML", "c_nvml")) and not hasattr(module, name):
            setattr(module, name, getattr(pynvml, name))
    module.calls = calls  # type: ignore[attr-defined]
    module.library = library  # type: ignore[attr-defined]
    return module


# --- presets: links and power state (hand-written, see the module docstring) --------------------
# NVML_FI_DEV_NVLINK_GET_SPEED of an H100's NVLink 4 link: 26.562 GB/s each way, as
# `nvidia-smi nvlink -s` prints it (18 links; NVIDIA rates the GPU at 900 GB/s both ways).
H100_LINK_MBPS = 26562
# A GB200's NVLink 5 links: 50 GB/s each way (18 links, 1.8 TB/s both ways).
GB200_LINK_MBPS = 50000
# Fabric health on a healthy HGX: every condition reported and false (2), no incorrect
# configuration (1), per NVML_GPU_FABRIC_HEALTH_MASK_*.
HEALTHY_MASK = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8
MIB_PER_S = 1.0  # GPM rates are MiB/s


def hgx_h100(index: int = 0, *, links: int = 18, **changes: Any) -> FakeGpu:
    """An H100 SXM on an HGX board: NVLink to the NVSwitches, registered in the fabric,
    700 W limit, GPM (NVLink rates included)."""
    gpu = dataclasses.replace(
        H100_SXM,
        uuid=f"GPU-6513270e-269e-0d37-f2a7-4de452e6b43{index}",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        power_limit_mw=700_000,
        nvlinks=[FakeLink(speed_mbps=H100_LINK_MBPS) for _ in range(links)],
        fabric=FakeFabric(clique_id=1, health_mask=HEALTHY_MASK, max_version=2),
    )
    return dataclasses.replace(gpu, **changes)


def nvlink_gpm(
    tx_share: float, rx_share: float, links: int = 18, mbps: int = H100_LINK_MBPS
) -> dict[int, float]:
    """GPM NVLink rates (MiB/s) at the given share of each link's speed, totals and per link."""
    per_link_mib = mbps * 1e6 / (1024 * 1024)
    rates: dict[int, float] = {}
    for link in range(links):
        rates[pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC + 2 * link] = rx_share * per_link_mib
        rates[pynvml.NVML_GPM_METRIC_NVLINK_L0_TX_PER_SEC + 2 * link] = tx_share * per_link_mib
    rates[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = links * rx_share * per_link_mib
    rates[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = links * tx_share * per_link_mib
    return rates


def tp_pod(*, link_bound: bool) -> list[FakeGpu]:
    """Two HGX H100s serving one tensor-parallel engine. Link-bound: the all-reduces keep the
    links at 90 % of their peak each way while the SMs sit at 8 %; not bound: links at 60 %
    and SMs at 85 % (communication overlapped with compute)."""
    link, sm = (0.9, 8.0) if link_bound else (0.6, 85.0)
    gpm = {pynvml.NVML_GPM_METRIC_SM_UTIL: sm, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: sm / 2}
    return [hgx_h100(i, gpm={**gpm, **nvlink_gpm(link, link)}) for i in range(2)]


# An H100 PCIe without NVLink bridges: NVML counts 0 links.
H100_PCIE = dataclasses.replace(
    H100_SXM,
    name="NVIDIA H100 PCIe",
    uuid="GPU-22222222-3333-4444-5555-666666666666",
    power_limit_mw=350_000,
    nvlinks=[],
)
# An L4 answers no NVLink field at all.
L4_LINKLESS = dataclasses.replace(L4, power_limit_mw=72_000)


def gb200(**changes: Any) -> FakeGpu:
    """A GB200's Blackwell GPU: NVLink 5 to the rack's NVSwitches, C2C to its Grace CPU (10
    links here, each 40000 MBps; a hand-written figure), power smoothing at a 600 W floor,
    the llm_inference workload power profile, fabric health summary (v3)."""
    gpu = FakeGpu(
        name="NVIDIA GB200",
        uuid="GPU-b200b200-0000-1111-2222-333333333333",
        pci_bus_id="00000008:01:00.0",
        gpm_supported=True,
        compute_capability=(10, 0),
        power_limit_mw=1_200_000,
        nvlinks=[FakeLink(speed_mbps=GB200_LINK_MBPS) for _ in range(18)],
        c2c_links=[(1, 40000)] * 10,
        smoothing=(1, 600.0),
        fabric=FakeFabric(clique_id=4, health_mask=HEALTHY_MASK, health_summary=1),
        power_profiles=frozenset({pynvml.NVML_POWER_PROFILE_LLM_INFERENCE}),
        gpm={
            **nvlink_gpm(0.3, 0.3, mbps=GB200_LINK_MBPS),
            pynvml.NVML_GPM_METRIC_C2C_TOTAL_TX_PER_SEC: 20_000.0,
            pynvml.NVML_GPM_METRIC_C2C_TOTAL_RX_PER_SEC: 60_000.0,
        },
    )
    return dataclasses.replace(gpu, **changes)
