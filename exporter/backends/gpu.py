"""Turn NVML calls into one reading per GPU, the same way for every :class:`NvmlApi`.

Fields a GPU does not support are dropped after the first ``NOT_SUPPORTED`` (logged once at
info) and cost no further calls. Errors that concern the whole GPU (lost, hung, unknown)
propagate as :class:`NvmlError` so the caller can mark the GPU down.

Call budget (counted in :attr:`GpuReader.calls`): one read makes at most 10 driver calls
(samples, utilisation rates, memory, power, energy, temperature, two clocks, clock events,
one GPM sample), or 11 on GPUs without GPM (two PCIe throughput calls instead of the GPM
sample). GPM sample allocation, freeing and metric computation happen inside the library
without the driver and are not counted.

Identity calls (UUID, name, PCI bus, MIG mode, GPM support) and the hardware facts behind the
peak figures (memory bus width, maximum SM and memory clocks, CUDA cores, compute capability:
:class:`~exporter.hardware.gpus.GpuFacts`) are made once per NVML session, not per read.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from exporter.backends.nvml_api import (
    FIELD_ERRORS,
    GPM_IDS,
    NOT_SUPPORTED,
    NvmlApi,
    NvmlError,
)
from exporter.hardware.gpus import GpuFacts

log = logging.getLogger(__name__)

T = TypeVar("T")

# GPM needs two samples at least this far apart to compute rates.
GPM_MIN_INTERVAL_S = 0.1

MIG_MODES = {0: "disabled", 1: "enabled"}


@dataclass(frozen=True)
class GpuIdentity:
    """What does not change while the driver stays loaded."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    mig_mode: str  # enabled | disabled | unsupported
    gpm_supported: bool
    facts: GpuFacts = field(default_factory=GpuFacts)


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
    )


class GpuReader:
    """Reads one GPU; keeps what must persist between reads (sample cursor, GPM sample)."""

    def __init__(
        self,
        api: NvmlApi,
        identity: GpuIdentity,
        handle: object,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.api = api
        self.identity = identity
        self.handle = handle
        self._clock = clock
        self.unsupported: set[str] = set()
        if not identity.gpm_supported:
            self.unsupported.add("gpm")
        self.last_seen_us = 0
        self.calls = 0
        self._gpm_prev: object | None = None
        self._gpm_prev_at = 0.0

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
            log.info(
                "GPU %d (%s): %s unsupported (%s); metric absent from now on",
                self.identity.index,
                self.identity.name,
                name,
                err.name,
            )
            return None

    def read(self) -> GpuReading:
        """One read of every supported field; raises NvmlError for GPU-wide failures."""
        api, h = self.api, self.handle
        reading = GpuReading()
        samples = self._field("samples", lambda: api.utilization_samples(h, self.last_seen_us))
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
        if "pcie_tx_per_sec" not in reading.gpm or "pcie_rx_per_sec" not in reading.gpm:
            reading.pcie_tx_kibps = self._field(
                "pcie_tx", lambda: api.pcie_throughput_kibps(h, "tx")
            )
            reading.pcie_rx_kibps = self._field(
                "pcie_rx", lambda: api.pcie_throughput_kibps(h, "rx")
            )
        return reading

    def _read_gpm(self, reading: GpuReading) -> None:
        now = self._clock()
        sample = self._field("gpm", lambda: self.api.gpm_sample(self.handle))
        if sample is None:
            return
        prev, prev_at = self._gpm_prev, self._gpm_prev_at
        if prev is not None and now - prev_at < GPM_MIN_INTERVAL_S:
            # Too close to the previous sample for a meaningful rate: keep the older one.
            self.api.gpm_free(sample)
            return
        self._gpm_prev, self._gpm_prev_at = sample, now
        if prev is None:
            return
        try:
            values = self.api.gpm_metrics(prev, sample, list(GPM_IDS.values()))
        except NvmlError as err:
            if err.code != NOT_SUPPORTED:
                raise
            values = {}
        finally:
            self.api.gpm_free(prev)
        for name, metric_id in GPM_IDS.items():
            value = values.get(metric_id)
            if value is not None:
                reading.gpm[name] = value
        reading.gpm_interval_s = now - prev_at

    def close(self) -> None:
        """Free the GPM sample kept between reads."""
        if self._gpm_prev is not None:
            with contextlib.suppress(NvmlError):
                self.api.gpm_free(self._gpm_prev)
            self._gpm_prev = None
