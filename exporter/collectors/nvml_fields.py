"""What a GPU's readings become: one row per metric, as dcgm-exporter's counter list has one
line per field.

A row names the metric (its type, help and labels are the catalogue's, ``exporter/metrics.py``),
where the value comes from (:class:`Source`: the latest reading in NVML's unit, a GPM metric, or
what the collector folded from the readings) and the conversion to the metric's base unit
(:class:`Unit`). Each series carries ``gpu`` and ``uuid``; a row may add a fixed label value
(``owner``) or split a bit mask into one series per bit (``reason``). A row whose source is
absent on this GPU gives no series. Rows are in exposition order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from exporter.backends.gpu_reader import GpuReading
from exporter.collectors.nvml_state import GpuState
from exporter.metrics import CLOCK_EVENT_BITS

MIB = 1024 * 1024
KIB = 1024


@dataclass(frozen=True)
class Unit:
    """NVML's unit to the metric's base unit: ``value * multiply / divide``."""

    multiply: float = 1
    divide: float = 1

    def base(self, raw: float) -> float:
        return float(raw) * self.multiply / self.divide


AS_IS = Unit()
PERCENT = Unit(divide=100)  # % -> ratio 0-1
MILLI = Unit(divide=1000)  # mW -> W, mJ -> J
MEGAHERTZ = Unit(multiply=1e6)  # MHz -> Hz
KIB_PER_S = Unit(multiply=KIB)  # KiB/s -> B/s
MIB_PER_S = Unit(multiply=MIB)  # MiB/s (GPM) -> B/s


@dataclass(frozen=True)
class Source:
    """Where a value comes from: ``reading`` (a :class:`GpuReading` attribute, NVML's unit),
    ``gpm`` (a GPM metric of the reading) or ``state`` (a :class:`GpuState` attribute: what
    the collector folded from the readings). None where the GPU has no such value."""

    kind: Literal["reading", "gpm", "state"]
    key: str

    def value(self, state: GpuState, latest: GpuReading) -> float | None:
        if self.kind == "gpm":
            return latest.gpm.get(self.key)
        value: float | None = getattr(latest if self.kind == "reading" else state, self.key)
        return value


def reading(key: str) -> Source:
    return Source("reading", key)


def gpm(key: str) -> Source:
    return Source("gpm", key)


def kept(key: str) -> Source:
    return Source("state", key)


@dataclass(frozen=True)
class Field:
    """One row: ``metric`` from ``source`` in ``unit``; where the source is absent,
    ``fallback`` (another source and its unit) instead. ``only_with``: the row gives a series
    only while that source is present. ``label``: a fixed value of the catalogue's extra label.
    ``bits``: the source is a bit mask, one series per bit, labelled by its name."""

    metric: str
    source: Source
    unit: Unit = AS_IS
    fallback: tuple[Source, Unit] | None = None
    only_with: Source | None = None
    label: str | None = None
    bits: Mapping[str, int] = field(default_factory=dict)

    def samples(self, state: GpuState, latest: GpuReading) -> Iterator[tuple[list[str], float]]:
        """(extra label values, value in base units) of each series of this row."""
        if self.only_with is not None and self.only_with.value(state, latest) is None:
            return
        raw, unit = self.source.value(state, latest), self.unit
        if raw is None and self.fallback is not None:
            raw, unit = self.fallback[0].value(state, latest), self.fallback[1]
        if raw is None:
            return
        if self.bits:
            for name, bit in self.bits.items():
                yield [name], 1.0 if int(raw) & bit else 0.0
        else:
            yield ([] if self.label is None else [self.label]), unit.base(raw)


#: Every reading-to-metric row of a healthy GPU, in exposition order. The utilisation
#: histogram and busy seconds (from the driver's samples), identity, health, peaks and Xids
#: are not readings of one poll: :mod:`exporter.collectors.nvml_families` writes them.
FIELDS: tuple[Field, ...] = (
    Field(
        "inference_gpu_dram_active_seconds_total",
        kept("dram_active_seconds"),
        only_with=gpm("dram_bw_util"),
    ),
    Field("inference_gpu_energy_joules_total", reading("energy_mj"), MILLI),
    Field("inference_gpu_clock_event_active", reading("clock_events"), bits=CLOCK_EVENT_BITS),
    Field("inference_gpu_utilization_ratio", kept("latest_util")),
    Field("inference_gpu_memory_bandwidth_utilization_ratio", gpm("dram_bw_util"), PERCENT),
    Field("inference_gpu_memory_busy_ratio", reading("mem_busy_pct"), PERCENT),
    Field("inference_gpu_sm_active_ratio", gpm("sm_util"), PERCENT),
    Field("inference_gpu_sm_occupancy_ratio", gpm("sm_occupancy"), PERCENT),
    Field("inference_gpu_tensor_active_ratio", gpm("any_tensor_util"), PERCENT),
    Field("inference_gpu_memory_used_bytes", reading("memory_used_bytes")),
    Field("inference_gpu_memory_total_bytes", reading("memory_total_bytes")),
    Field(
        "inference_gpu_pcie_tx_bytes_per_second",
        gpm("pcie_tx_per_sec"),
        MIB_PER_S,
        fallback=(reading("pcie_tx_kibps"), KIB_PER_S),
    ),
    Field(
        "inference_gpu_pcie_rx_bytes_per_second",
        gpm("pcie_rx_per_sec"),
        MIB_PER_S,
        fallback=(reading("pcie_rx_kibps"), KIB_PER_S),
    ),
    Field("inference_gpu_power_watts", reading("power_mw"), MILLI),
    Field("inference_gpu_temperature_celsius", reading("temperature_c")),
    Field("inference_gpu_sm_clock_hertz", reading("sm_clock_mhz"), MEGAHERTZ),
    Field("inference_gpu_memory_clock_hertz", reading("mem_clock_mhz"), MEGAHERTZ),
    # The engine's share, where its processes can be told among NVML's.
    Field("inference_gpu_engine_utilization_ratio", kept("engine_util")),
    Field("inference_gpu_engine_memory_used_bytes", kept("engine_memory")),
    Field("inference_gpu_processes", kept("engine_processes"), label="engine"),
    Field("inference_gpu_processes", kept("other_processes"), label="other"),
)
