"""Turn NVML calls into one reading per GPU, the same way for every :class:`NvmlApi`.

Fields a GPU does not support are dropped after the first ``NOT_SUPPORTED`` (logged once at
info) and cost no further calls. Errors that concern the whole GPU (lost, hung, unknown)
propagate as :class:`NvmlError` so the caller can mark the GPU down.

Call budget (counted in :attr:`GpuReader.calls`): one read makes at most 10 driver calls for
the readings (samples, utilisation rates, memory, power, energy, temperature, two clocks,
clock events, one GPM sample), or 11 on GPUs without GPM (two PCIe throughput calls instead of
the GPM sample), plus 2 with per-process reads on (compute processes, process utilisation).
GPM sample allocation, freeing and metric computation happen inside the library without the
driver and are not counted. The links and the power state add (:meth:`GpuReader._read_links`)
one ``nvmlDeviceGetFieldValues`` for every field value at once (the enforced power limit, power
smoothing, each NVLink and C2C link's state and speed, and the NVLink throughput counters
where GPM has none), ``nvmlDeviceGetGpuFabricInfoV`` (NVSwitch systems) and the workload power
profiles (Blackwell); each of these is made only while the GPU answers it, so a GPU without any
costs one call each on the first read and none after; fabric and power profiles, which change
only when someone acts, are read every :data:`SLOW_EVERY` reads.

A MIG device (:class:`MigSlice`) is read by the same :class:`GpuReader`: its memory and
processes through its own handle, GPM through the parent GPU's handle and the GPU instance id
(``nvmlGpmMigSampleGet``). What belongs to the physical GPU (power, energy, temperature,
clocks, clock events, PCIe) is read on the parent only and never asked of a MIG handle; the
utilisation buffer, utilisation rates and per-process utilisation, which nvml.h documents as
not supported in MIG mode, cost one call each on the first read and none after. Steady state:
3 calls per read of a MIG device (memory, GPM sample, compute processes).

Identity calls (UUID, name, PCI bus, MIG mode, GPM support, the NVLink and C2C link counts) and
the hardware facts behind the
peak figures (memory bus width, maximum SM and memory clocks, CUDA cores, compute capability:
:class:`~exporter.hardware.gpus.GpuFacts`) are made once per NVML session, not per read; so
are the MIG enumeration and each MIG device's identity (:func:`read_mig_slices`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from exporter.backends.nvml_api import (
    FIELD_ERRORS,
    GPM_BASE_NAMES,
    GPM_C2C_RX_PER_SEC,
    GPM_C2C_TX_PER_SEC,
    GPM_NAMES,
    GPM_NVLINK_LINKS,
    GPM_NVLINK_RX_PER_SEC,
    GPM_NVLINK_TX_PER_SEC,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    Direction,
    FabricInfo,
    FieldKey,
    MigAttributes,
    NvmlApi,
    NvmlError,
    ProcessMemory,
    ProcessSample,
    gpm_nvlink_link_id,
)
from exporter.hardware.gpus import GpuFacts

log = logging.getLogger(__name__)

T = TypeVar("T")

# GPM needs two samples at least this far apart to compute rates.
GPM_MIN_INTERVAL_S = 0.1

# The fabric and the workload power profiles change when an operator or the Fabric Manager
# acts, not from poll to poll: read on the first poll and every this many after (30 s at the
# default interval), the last answer standing in between.
SLOW_EVERY = 10

TX_RX: tuple[Direction, Direction] = ("tx", "rx")
# What each C2C link answers, every read.
C2C_FIELDS = ("c2c_link_status", "c2c_link_max_bw_mbps")

MIG_MODES = {0: "disabled", 1: "enabled"}
# The mig_mode of a MIG device itself.
MIG_SLICE = "slice"

# Fields of the physical GPU: read on the parent, never asked of a MIG device.
PARENT_FIELDS = frozenset(
    {"power", "energy", "temperature", "sm_clock", "mem_clock", "clock_events"}
    | {"pcie_tx", "pcie_rx", "fields", "fabric", "power_profiles", "power_limit"}
)

MIB = 1024 * 1024
GIB = 1024 * MIB
# MIG memory is allotted in eighths of the GPU's memory, bandwidth with it (MIG user guide:
# "a GPU memory slice is roughly one eighth of the total GPU memory resources, including both
# capacity and bandwidth").
MEMORY_SLICES = 8

_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")
_NAME_GB = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


@dataclass(frozen=True)
class MigSlice:
    """A MIG device: one compute instance of one GPU instance of a GPU in MIG mode."""

    parent_index: int
    parent_uuid: str
    parent_name: str
    # The slot of nvmlDeviceGetMigDeviceHandleByIndex: NVIDIA_VISIBLE_DEVICES "<gpu>:<slot>".
    slot: int
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # "1g.10gb", "1c.3g.71gb"; "" when the name carries none
    attributes: MigAttributes | None = None
    parent_memory_total_bytes: int | None = None

    @property
    def memory_fraction(self) -> float | None:
        """The GPU instance's share of the GPU's memory and bandwidth, in whole eighths (as
        the NVIDIA container stack names profiles); None when a size is unknown."""
        total = self.parent_memory_total_bytes
        if self.attributes is None or not total or self.attributes.memory_size_mib <= 0:
            return None
        share = self.attributes.memory_size_mib * MIB / total
        return min(1.0, math.ceil(share * MEMORY_SLICES - 1e-9) / MEMORY_SLICES)


def mig_profile(name: str) -> str:
    """The profile in a MIG device's name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` -> ``1g.10gb``)."""
    match = _PROFILE.search(name)
    return match.group(1) if match else ""


@dataclass(frozen=True)
class Links:
    """How many NVLink and C2C links the GPU has (``NVML_FI_DEV_NVLINK_LINK_COUNT``,
    ``NVML_FI_DEV_C2C_LINK_COUNT``); None where NVML does not say."""

    nvlink: int | None = None
    c2c: int | None = None


@dataclass(frozen=True)
class GpuIdentity:
    """What does not change while the driver stays loaded (a GPU, or a MIG device of one)."""

    index: int  # the GPU's NVML index (a MIG device's: its parent's)
    uuid: str
    name: str
    pci_bus_id: str
    mig_mode: str  # enabled | disabled | unsupported; slice for a MIG device
    gpm_supported: bool
    facts: GpuFacts = field(default_factory=GpuFacts)
    mig: MigSlice | None = None
    links: Links = field(default_factory=Links)

    @property
    def label(self) -> str:
        """The ``gpu`` label: the index, ``<gpu>:<slot>`` for a MIG device."""
        return str(self.index) if self.mig is None else f"{self.index}:{self.mig.slot}"


@dataclass
class GpuReading:
    """Raw values of one read, in NVML's units; ``None`` where unsupported."""

    samples: list[tuple[int, float]] = field(default_factory=list)
    util_gpu_pct: int | None = None
    mem_busy_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_events: int | None = None
    pcie_tx_kibps: int | None = None
    pcie_rx_kibps: int | None = None
    gpm: dict[str, float] = field(default_factory=dict)
    gpm_interval_s: float | None = None
    # False where the GPU has no utilisation sample buffer (MIG).
    has_samples: bool = True
    # Per-process reads (None: not read, or not supported here).
    processes: list[ProcessMemory] | None = None
    process_samples: list[ProcessSample] | None = None
    # Field values NVML answered (FIELD_SPECS units: KiB, MBps, mW, W), by field and link.
    fields: dict[FieldKey, float] = field(default_factory=dict)
    fabric: FabricInfo | None = None
    # The enforced power limit (the field, else nvmlDeviceGetEnforcedPowerLimit), mW.
    power_limit_mw: float | None = None
    power_profiles: frozenset[int] | None = None


def _optional(fn: Callable[[], T]) -> T | None:
    """One call whose answer may not exist on this GPU or driver (None then)."""
    try:
        return fn()
    except NvmlError as err:
        if err.code not in FIELD_ERRORS:
            raise
        return None


def read_facts(api: NvmlApi, handle: object) -> GpuFacts:
    """The hardware facts behind the peak figures: five calls, once per NVML session."""
    return GpuFacts(
        memory_bus_width_bits=_optional(lambda: api.memory_bus_width_bits(handle)) or None,
        max_memory_clock_mhz=_optional(lambda: api.max_clock_mhz(handle, "mem")) or None,
        max_sm_clock_mhz=_optional(lambda: api.max_clock_mhz(handle, "sm")) or None,
        cuda_cores=_optional(lambda: api.cuda_cores(handle)) or None,
        compute_capability=_optional(lambda: api.compute_capability(handle)),
    )


def read_links(api: NvmlApi, handle: object) -> Links:
    """The GPU's NVLink and C2C link counts: one field-values call, once per NVML session."""
    counts = _optional(
        lambda: api.field_values(handle, [("nvlink_link_count", None), ("c2c_link_count", None)])
    )
    if counts is None:
        return Links()
    nvlink, c2c = counts.get(("nvlink_link_count", None)), counts.get(("c2c_link_count", None))
    return Links(
        nvlink=None if nvlink is None or isinstance(nvlink, NvmlError) else int(nvlink),
        c2c=None if c2c is None or isinstance(c2c, NvmlError) else int(c2c),
    )


def read_identity(api: NvmlApi, index: int, handle: object) -> GpuIdentity:
    """Identity calls, made once per NVML session."""
    try:
        mig = MIG_MODES.get(api.mig_mode(handle), "unsupported")
    except NvmlError as err:
        if err.code not in FIELD_ERRORS:
            raise
        mig = "unsupported"
    gpm = False
    if mig != "enabled":
        try:
            gpm = api.gpm_supported(handle)
        except NvmlError as err:
            if err.code not in FIELD_ERRORS:
                raise
    return GpuIdentity(
        index=index,
        uuid=api.uuid(handle),
        name=api.name(handle),
        pci_bus_id=api.pci_bus_id(handle),
        mig_mode=mig,
        gpm_supported=gpm,
        facts=read_facts(api, handle),
        links=read_links(api, handle),
    )


def _parent_memory_total(api: NvmlApi, handle: object, name: str) -> int | None:
    """The GPU's memory size: NVML answers it in MIG mode only to privileged callers, so the
    ``<n>GB`` of the product name stands in (eighths of 80 GiB and of 81559 MiB agree)."""
    memory = _optional(lambda: api.memory_info(handle))
    if memory is not None and memory[1] > 0:
        return memory[1]
    match = _NAME_GB.search(name)
    return int(match.group(1)) * GIB if match else None


def _attributes(api: NvmlApi, mig: object) -> MigAttributes | None:
    return _optional(lambda: api.mig_attributes(mig))


def read_mig_slices(
    api: NvmlApi, parent: GpuIdentity, handle: object
) -> list[tuple[GpuIdentity, object]]:
    """The MIG devices of a GPU in MIG mode with their handles, once per NVML session.

    Slots can be empty (``NOT_FOUND``): profiles take varying numbers of slots. Costs one count
    call, one call per slot, five per MIG device (UUID, name, GPU and compute instance ids,
    attributes), and one for the GPU's memory size and one for GPM support.
    """
    count = _optional(lambda: api.mig_device_count(handle)) or 0
    if count <= 0:
        return []
    gpm = bool(_optional(lambda: api.gpm_supported(handle)))
    total = _parent_memory_total(api, handle, parent.name)
    out: list[tuple[GpuIdentity, object]] = []
    for slot in range(count):
        try:
            mig = api.mig_device_handle(handle, slot)
        except NvmlError as err:
            if err.code in (NOT_FOUND, INVALID_ARGUMENT):
                continue  # an empty slot
            raise
        name = api.name(mig)
        piece = MigSlice(
            parent_index=parent.index,
            parent_uuid=parent.uuid,
            parent_name=parent.name,
            slot=slot,
            gpu_instance_id=api.gpu_instance_id(mig),
            compute_instance_id=api.compute_instance_id(mig),
            profile=mig_profile(name),
            attributes=_attributes(api, mig),
            parent_memory_total_bytes=total,
        )
        identity = GpuIdentity(
            index=parent.index,
            uuid=api.uuid(mig),
            name=name,
            pci_bus_id=parent.pci_bus_id,
            mig_mode=MIG_SLICE,
            gpm_supported=gpm,
            facts=parent.facts,
            mig=piece,
        )
        out.append((identity, mig))
    return out


class GpuReader:
    """Reads one GPU or MIG device; keeps what must persist between reads (sample cursors,
    GPM sample, the fields this GPU does not answer).

    ``parent`` is the GPU's handle for a MIG device (GPM is sampled through it).
    ``processes`` turns the per-process reads on (they are only useful when the engine's
    processes can be told apart; the collector decides). ``per_link`` also reads each NVLink
    link's throughput (GPM metrics, or counters), not only the GPU's total.
    """

    def __init__(
        self,
        api: NvmlApi,
        identity: GpuIdentity,
        handle: object,
        *,
        clock: Callable[[], float],
        parent: object | None = None,
        processes: bool = False,
        per_link: bool = False,
    ) -> None:
        self.api = api
        self.identity = identity
        self.handle = handle
        self.parent = parent
        self.processes = processes
        self.per_link = per_link
        self._clock = clock
        self.unsupported: set[str] = set()
        # Field values the GPU does not answer: each (field, link) dropped alone, each field
        # said once.
        self.dropped_fields: set[FieldKey] = set()
        self.unsupported_fields: set[str] = set()
        if not identity.gpm_supported:
            self.unsupported.add("gpm")
        if identity.mig is not None:
            self.unsupported |= PARENT_FIELDS
            if parent is None:
                raise ValueError("a MIG device is read with its GPU's handle (parent=)")
        # NVLink throughput: from GPM where it has the metrics (Hopper and newer), else from
        # the throughput counters (field values); decided by the first GPM answer.
        self.nvlink_via_gpm = identity.gpm_supported and bool(identity.links.nvlink)
        self.last_seen_us = 0
        self.last_process_us = 0
        self.calls = 0
        self.reads = 0
        self._fabric: FabricInfo | None = None
        self._profiles: frozenset[int] | None = None
        self._gpm_prev: object | None = None
        self._gpm_prev_at = 0.0
        self._newly_unsupported: list[str] = []

    def _field(self, name: str, fn: Callable[[], T]) -> T | None:
        if name in self.unsupported:
            return None
        self.calls += 1
        try:
            return fn()
        except NvmlError as err:
            if err.code not in FIELD_ERRORS:
                raise
            self.unsupported.add(name)
            self._say_unsupported(name, err)
            return None

    def _say_unsupported(self, name: str, err: NvmlError) -> None:
        self._newly_unsupported.append(f"{name} ({err.name})")

    def _flush_unsupported(self) -> None:
        """One line for every field a read found unsupported, not one line each: a driver
        that lacks a dozen fields (an older GPU, every new generation's fields) says so once."""
        if self._newly_unsupported:
            log.info(
                "GPU %s (%s): unsupported, absent from now on: %s",
                self.identity.label,
                self.identity.name,
                ", ".join(self._newly_unsupported),
            )
            self._newly_unsupported = []

    def read(self) -> GpuReading:
        """One read of every supported field; raises NvmlError for GPU-wide failures."""
        try:
            return self._read()
        finally:
            self._flush_unsupported()

    def _read(self) -> GpuReading:
        api, h = self.api, self.handle
        reading = GpuReading()
        samples = self._field("samples", lambda: api.utilization_samples(h, self.last_seen_us))
        reading.has_samples = "samples" not in self.unsupported
        if samples:
            samples.sort()
            reading.samples = [s for s in samples if s[0] > self.last_seen_us]
            if reading.samples:
                self.last_seen_us = reading.samples[-1][0]
        rates = self._field("utilization_rates", lambda: api.utilization_rates(h))
        if rates is not None:
            reading.util_gpu_pct, reading.mem_busy_pct = rates
        memory = self._field("memory", lambda: api.memory_info(h))
        if memory is not None:
            reading.memory_used_bytes, reading.memory_total_bytes = memory
        reading.power_mw = self._field("power", lambda: api.power_usage_mw(h))
        reading.energy_mj = self._field("energy", lambda: api.total_energy_mj(h))
        reading.temperature_c = self._field("temperature", lambda: api.temperature_c(h))
        reading.sm_clock_mhz = self._field("sm_clock", lambda: api.clock_mhz(h, "sm"))
        reading.mem_clock_mhz = self._field("mem_clock", lambda: api.clock_mhz(h, "mem"))
        reading.clock_events = self._field("clock_events", lambda: api.clock_event_reasons(h))
        self._read_gpm(reading)
        if self.processes:
            self._read_processes(reading)
        if "pcie_tx_per_sec" not in reading.gpm or "pcie_rx_per_sec" not in reading.gpm:
            reading.pcie_tx_kibps = self._field(
                "pcie_tx", lambda: api.pcie_throughput_kibps(h, "tx")
            )
            reading.pcie_rx_kibps = self._field(
                "pcie_rx", lambda: api.pcie_throughput_kibps(h, "rx")
            )
        self._read_links(reading)
        return reading

    # --- links and power state ---------------------------------------------------------------
    def wanted_fields(self) -> list[FieldKey]:
        """The field values one read asks for: the power state, and each link's state and
        speed (the throughput counters too where GPM has no NVLink metrics)."""
        keys: list[FieldKey] = [
            ("power_limit_mw", None),
            ("power_default_limit_mw", None),
            ("power_smoothing_enabled", None),
            ("power_smoothing_floor_w", None),
        ]
        links = range(self.identity.links.nvlink or 0)
        if links:
            keys += [("nvlink_state", link) for link in links]
            speeds: list[FieldKey] = [("nvlink_speed_mbps", link) for link in links]
            keys += speeds
            if any(key in self.dropped_fields for key in speeds):
                keys.append(("nvlink_speed_common_mbps", None))  # for the links without one
            if not self.nvlink_via_gpm:
                keys += [("nvlink_raw_tx_kib", None), ("nvlink_raw_rx_kib", None)]
                if self.per_link:
                    keys += [(f"nvlink_link_raw_{d}_kib", link) for link in links for d in TX_RX]
        c2c = range(self.identity.links.c2c or 0)
        keys += [(name, link) for name in C2C_FIELDS for link in c2c]
        return [k for k in keys if k not in self.dropped_fields]

    def _drop(self, key: FieldKey, err: NvmlError) -> None:
        self.dropped_fields.add(key)
        if key[0] not in self.unsupported_fields:
            self.unsupported_fields.add(key[0])
            self._say_unsupported(key[0], err)

    def _read_links(self, reading: GpuReading) -> None:
        """Field values, fabric and workload power profiles; the enforced power limit through
        its own call where the field is missing."""
        api, h = self.api, self.handle
        keys = self.wanted_fields()
        values = self._field("fields", lambda: api.field_values(h, keys)) if keys else None
        for key, value in (values or {}).items():
            if isinstance(value, NvmlError):
                if value.code in FIELD_ERRORS:
                    self._drop(key, value)
                continue
            if key[0] == "power_smoothing_enabled" and value not in (0, 1):
                # Not an enablement: nvml.h numbered these fields differently for this driver.
                self.dropped_fields |= {key, ("power_smoothing_floor_w", None)}
                self.unsupported_fields |= {key[0], "power_smoothing_floor_w"}
                log.warning(
                    "GPU %s: power smoothing field answered %s, not 0 or 1 (field ids differ "
                    "for this driver); power smoothing absent from now on",
                    self.identity.label,
                    value,
                )
                continue
            reading.fields[key] = value
        if ("power_smoothing_floor_w", None) in self.dropped_fields:
            reading.fields.pop(("power_smoothing_floor_w", None), None)
        reading.power_limit_mw = reading.fields.get(("power_limit_mw", None))
        missing = ("power_limit_mw", None) in self.dropped_fields or "fields" in self.unsupported
        if reading.power_limit_mw is None and missing:
            limit = self._field("power_limit", lambda: api.enforced_power_limit_mw(h))
            reading.power_limit_mw = None if limit is None else float(limit)
        if self.reads % SLOW_EVERY == 0:
            self._fabric = self._field("fabric", lambda: api.fabric_info(h))
            self._profiles = self._field("power_profiles", lambda: api.power_profiles(h))
        self.reads += 1
        reading.fabric, reading.power_profiles = self._fabric, self._profiles

    def _read_processes(self, reading: GpuReading) -> None:
        api, h = self.api, self.handle
        reading.processes = self._field("processes", lambda: api.compute_processes(h))
        samples = self._field(
            "process_utilization", lambda: api.process_utilization(h, self.last_process_us)
        )
        if samples is None:
            return
        reading.process_samples = [s for s in samples if s.timestamp_us > self.last_process_us]
        if reading.process_samples:
            self.last_process_us = max(s.timestamp_us for s in reading.process_samples)

    # --- GPM ---------------------------------------------------------------------------------
    def gpm_ids(self) -> list[int]:
        """The GPM metrics one read asks for: the base ones, and the links' where it has
        them."""
        ids = list(GPM_BASE_NAMES)
        if self.nvlink_via_gpm:
            ids += [GPM_NVLINK_RX_PER_SEC, GPM_NVLINK_TX_PER_SEC]
            if self.per_link:
                links = range(min(self.identity.links.nvlink or 0, GPM_NVLINK_LINKS))
                ids += [gpm_nvlink_link_id(link, d) for link in links for d in TX_RX]
        if self.identity.links.c2c:
            ids += [GPM_C2C_TX_PER_SEC, GPM_C2C_RX_PER_SEC]
        return ids

    def _gpm_sample(self) -> object:
        mig = self.identity.mig
        if mig is None:
            return self.api.gpm_sample(self.handle)
        return self.api.gpm_mig_sample(self.parent, mig.gpu_instance_id)

    def _read_gpm(self, reading: GpuReading) -> None:
        now = self._clock()
        sample = self._field("gpm", self._gpm_sample)
        if sample is None:
            self.nvlink_via_gpm = False  # no GPM here: the counters it is
            return
        prev, prev_at = self._gpm_prev, self._gpm_prev_at
        if prev is not None and now - prev_at < GPM_MIN_INTERVAL_S:
            # Too close to the previous sample for a meaningful rate: keep the older one.
            self.api.gpm_free(sample)
            return
        self._gpm_prev, self._gpm_prev_at = sample, now
        if prev is None:
            return
        ids = self.gpm_ids()
        try:
            values = self.api.gpm_metrics(prev, sample, ids)
        except NvmlError as err:
            if err.code != NOT_SUPPORTED:
                raise
            values = {}
        finally:
            self.api.gpm_free(prev)
        for metric_id in ids:
            value = values.get(metric_id)
            if value is not None:
                reading.gpm[GPM_NAMES[metric_id]] = value
        reading.gpm_interval_s = now - prev_at
        # GPM answered the other metrics and not NVLink's: it has none here.
        if self.nvlink_via_gpm and reading.gpm and "nvlink_tx_per_sec" not in reading.gpm:
            self.nvlink_via_gpm = False
            log.info(
                "GPU %s (%s): GPM has no NVLink metrics here; reading the NVLink throughput "
                "counters instead",
                self.identity.label,
                self.identity.name,
            )

    def close(self) -> None:
        """Free the GPM sample kept between reads."""
        if self._gpm_prev is not None:
            with contextlib.suppress(NvmlError):
                self.api.gpm_free(self._gpm_prev)
            self._gpm_prev = None
