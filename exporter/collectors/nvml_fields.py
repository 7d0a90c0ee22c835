"""What a GPU's readings become: one row per metric, as dcgm-exporter's counter list has one
line per field.

A row names the metric (its type, help and labels are the catalogue's, ``exporter/metrics.py``),
where the value comes from (:class:`Source`: the latest reading in NVML's unit, a GPM metric,
what the collector folded from the readings, or a view of them: :data:`VIEWS`) and the
conversion to the metric's base unit (:class:`Unit`). Each series carries ``gpu`` and ``uuid``;
a row may add a fixed label value (``owner``), split a bit mask into one series per bit
(``reason``) or give one series per entry of a labelled source (``state``, ``link``). A row
whose source is absent on this GPU gives no series. Rows are in exposition order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from exporter.backends.gpu_reader import GpuReading
from exporter.collectors import nvml_links as links
from exporter.collectors.nvml_state import GpuState
from exporter.metrics import CLOCK_EVENT_BITS, THROTTLE_MASK

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


def _per_link(values: Mapping[int, float] | None, state: GpuState) -> dict[str, float] | None:
    """Per-link values, labelled by link, where ``--gpu.nvlink-per-link`` asks for them."""
    if not values or state.reader is None or not state.reader.per_link:
        return None
    return {str(link): value for link, value in sorted(values.items())}


# Views of the readings the table shows: (state, latest reading) -> value, or a mapping of
# label values to values; None where the GPU has nothing to show.
VIEWS: dict[str, Callable[[GpuState, GpuReading], Any]] = {
    "nvlink_tx_bytes": lambda s, r: s.links.totals.get("nvlink_tx"),
    "nvlink_rx_bytes": lambda s, r: s.links.totals.get("nvlink_rx"),
    "nvlink_links": lambda s, r: links.nvlink_links(s.identity, r),
    "nvlink_peak": lambda s, r: links.nvlink_peak(s.identity, r),
    "nvlink_link_tx_bytes": lambda s, r: _per_link(s.links.per_link.get("nvlink_tx"), s),
    "nvlink_link_rx_bytes": lambda s, r: _per_link(s.links.per_link.get("nvlink_rx"), s),
    "nvlink_link_peak": lambda s, r: _per_link(links.nvlink_link_speeds(s.identity, r), s),
    "c2c_tx_bytes": lambda s, r: s.links.totals.get("c2c_tx"),
    "c2c_rx_bytes": lambda s, r: s.links.totals.get("c2c_rx"),
    "c2c_links": lambda s, r: links.c2c_links(s.identity, r),
    "c2c_peak": lambda s, r: links.c2c_peak(s.identity, r),
    "fabric_state": lambda s, r: links.fabric_state(r),
    "fabric_health": lambda s, r: links.fabric_health(r),
    "fabric_conditions": lambda s, r: links.fabric_conditions(r),
    "fabric_info": lambda s, r: links.fabric_info(r),
    "power_default_limit": lambda s, r: r.fields.get(("power_default_limit_mw", None)),
    "power_smoothing_enabled": lambda s, r: r.fields.get(("power_smoothing_enabled", None)),
    "power_smoothing_floor": lambda s, r: r.fields.get(("power_smoothing_floor_w", None)),
    "power_profiles": lambda s, r: links.power_profiles(r),
}


@dataclass(frozen=True)
class Source:
    """Where a value comes from: ``reading`` (a :class:`GpuReading` attribute, NVML's unit),
    ``gpm`` (a GPM metric of the reading), ``state`` (a :class:`GpuState` attribute: what
    the collector folded from the readings) or ``view`` (an entry of :data:`VIEWS`). None where
    the GPU has no such value."""

    kind: Literal["reading", "gpm", "state", "view"]
    key: str

    def value(self, state: GpuState, latest: GpuReading) -> Any:
        if self.kind == "gpm":
            return latest.gpm.get(self.key)
        if self.kind == "view":
            return VIEWS[self.key](state, latest)
        return getattr(latest if self.kind == "reading" else state, self.key)


def reading(key: str) -> Source:
    return Source("reading", key)


def gpm(key: str) -> Source:
    return Source("gpm", key)


def kept(key: str) -> Source:
    return Source("state", key)


def view(key: str) -> Source:
    return Source("view", key)


@dataclass(frozen=True)
class Field:
    """One row: ``metric`` from ``source`` in ``unit``; where the source is absent,
    ``fallback`` (another source and its unit) instead. ``only_with``: the row gives a series
    only while that source is present. ``label``: a fixed value of the catalogue's extra label.
    ``bits``: the source is a bit mask, one series per bit, labelled by its name. ``mask``: the
    source is a bit mask, one series of its bits in ``mask``. ``each``: the
    source maps label values (a string, or a tuple for several labels) to values, one series
    per entry."""

    metric: str
    source: Source
    unit: Unit = AS_IS
    fallback: tuple[Source, Unit] | None = None
    only_with: Source | None = None
    label: str | None = None
    bits: Mapping[str, int] = field(default_factory=dict)
    mask: int | None = None
    each: bool = False

    def samples(self, state: GpuState, latest: GpuReading) -> Iterator[tuple[list[str], float]]:
        """(extra label values, value in base units) of each series of this row."""
        if self.only_with is not None and self.only_with.value(state, latest) is None:
            return
        raw, unit = self.source.value(state, latest), self.unit
        if raw is None and self.fallback is not None:
            raw, unit = self.fallback[0].value(state, latest), self.fallback[1]
        if raw is None:
            return
        if self.each:
            for key, value in raw.items():
                yield ([key] if isinstance(key, str) else list(key)), unit.base(value)
            return
        if self.bits:
            for name, bit in self.bits.items():
                yield [name], 1.0 if int(raw) & bit else 0.0
        elif self.mask is not None:
            yield [], float(int(raw) & self.mask)
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
    Field("inference_gpu_clock_throttle_reasons", reading("clock_events"), mask=THROTTLE_MASK),
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
    Field("inference_gpu_engine_busy_seconds_total", kept("engine_busy_seconds")),
    Field("inference_gpu_engine_memory_used_bytes", kept("engine_memory")),
    Field("inference_gpu_processes", kept("engine_processes"), label="engine"),
    Field("inference_gpu_processes", kept("other_processes"), label="other"),
    # Energy and what bounds power.
    Field(
        "inference_gpu_idle_energy_joules_total",
        kept("idle_energy_joules"),
        only_with=reading("energy_mj"),
    ),
    Field("inference_gpu_power_limit_watts", reading("power_limit_mw"), MILLI),
    Field("inference_gpu_power_default_limit_watts", view("power_default_limit"), MILLI),
    Field("inference_gpu_power_smoothing_enabled", view("power_smoothing_enabled")),
    Field("inference_gpu_power_smoothing_floor_watts", view("power_smoothing_floor")),
    Field("inference_gpu_power_profile_info", view("power_profiles"), each=True),
    # The links: NVLink, C2C (Grace), the NVLink fabric (NVSwitch systems).
    Field("inference_gpu_nvlink_transmit_bytes_total", view("nvlink_tx_bytes")),
    Field("inference_gpu_nvlink_receive_bytes_total", view("nvlink_rx_bytes")),
    Field("inference_gpu_nvlink_links", view("nvlink_links"), each=True),
    Field("inference_gpu_nvlink_peak_bytes_per_second", view("nvlink_peak")),
    Field(
        "inference_gpu_nvlink_link_transmit_bytes_total", view("nvlink_link_tx_bytes"), each=True
    ),
    Field("inference_gpu_nvlink_link_receive_bytes_total", view("nvlink_link_rx_bytes"), each=True),
    Field("inference_gpu_nvlink_link_peak_bytes_per_second", view("nvlink_link_peak"), each=True),
    Field("inference_gpu_c2c_transmit_bytes_total", view("c2c_tx_bytes")),
    Field("inference_gpu_c2c_receive_bytes_total", view("c2c_rx_bytes")),
    Field("inference_gpu_c2c_links", view("c2c_links"), each=True),
    Field("inference_gpu_c2c_peak_bytes_per_second", view("c2c_peak")),
    Field("inference_gpu_fabric_state", view("fabric_state"), each=True),
    Field("inference_gpu_fabric_health", view("fabric_health"), each=True),
    Field("inference_gpu_fabric_condition_active", view("fabric_conditions"), each=True),
    Field("inference_gpu_fabric_info", view("fabric_info"), each=True),
)
