"""What a GPU's links and power state become: the bytes moved over NVLink and C2C since the
exporter started, the links by state and their peak, the fabric's state and health, power
smoothing and the workload power profiles.

:class:`LinkCounters` folds each reading into byte counters: GPM rates (MiB/s, Hopper and
newer) times the interval they cover, or the differences of NVLink's own throughput counters
(KiB, field values) where GPM has no NVLink metrics. Either way the counter starts at 0 when the
exporter starts, so ``rate()`` is exact for any scrape interval and a driver reload (a counter
that steps back) loses one interval, not the series.

The other functions here are views of the latest reading for the field table
(:mod:`exporter.collectors.nvml_fields`); each returns None where NVML gave nothing to show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.backends.gpu_reader import TX_RX, GpuIdentity, GpuReading
from exporter.backends.nvml_api import (
    C2C_STATES,
    FABRIC_CONDITIONS,
    FABRIC_HEALTH,
    FABRIC_STATES,
    GPM_NVLINK_LINKS,
    NVLINK_STATES,
    FieldKey,
    gpm_nvlink_link_name,
    power_profile_name,
)

MIB = 1024 * 1024
KIB = 1024
# NVML's MBps (link speeds): megabytes, 10^6 bytes, per second and direction.
MBPS = 1e6

# GPM rates (MiB/s) and the byte counters they feed.
GPM_RATES = {
    "nvlink_tx": "nvlink_tx_per_sec",
    "nvlink_rx": "nvlink_rx_per_sec",
    "c2c_tx": "c2c_tx_per_sec",
    "c2c_rx": "c2c_rx_per_sec",
}
# NVLink's throughput counters (KiB, field values) and the byte counters they feed.
COUNTER_FIELDS = {
    "nvlink_raw_tx_kib": "nvlink_tx",
    "nvlink_raw_rx_kib": "nvlink_rx",
    "nvlink_link_raw_tx_kib": "nvlink_tx",
    "nvlink_link_raw_rx_kib": "nvlink_rx",
}
# Link states whose bandwidth a transfer can use (a sleeping link wakes on traffic).
USABLE_NVLINK = frozenset({"active", "sleep"})
FABRIC_FAILED = "failed"

Labelled = Mapping[str, float]


@dataclass
class LinkCounters:
    """Bytes moved over the GPU's links since the exporter started: ``totals`` by counter
    (``nvlink_tx``, ``nvlink_rx``, ``c2c_tx``, ``c2c_rx``), ``per_link`` by counter and link."""

    totals: dict[str, float] = field(default_factory=dict)
    per_link: dict[str, dict[int, float]] = field(default_factory=dict)
    last: dict[FieldKey, float] = field(default_factory=dict)

    def _add(self, counter: str, link: int | None, value: float) -> None:
        if link is None:
            self.totals[counter] = self.totals.get(counter, 0.0) + value
        else:
            links = self.per_link.setdefault(counter, {})
            links[link] = links.get(link, 0.0) + value

    def apply(self, reading: GpuReading) -> None:
        """Fold one reading in: GPM rates over its interval, counter fields by difference."""
        interval = reading.gpm_interval_s
        if interval:
            for counter, name in GPM_RATES.items():
                rate = reading.gpm.get(name)
                if rate is not None:
                    self._add(counter, None, max(rate, 0.0) * MIB * interval)
            for link in range(GPM_NVLINK_LINKS):
                for d in TX_RX:
                    rate = reading.gpm.get(gpm_nvlink_link_name(link, d))
                    if rate is not None:
                        self._add(f"nvlink_{d}", link, max(rate, 0.0) * MIB * interval)
        for key, value in reading.fields.items():
            if key[0] not in COUNTER_FIELDS:
                continue
            counter = COUNTER_FIELDS[key[0]]
            previous = self.last.get(key)
            self.last[key] = value
            # The first value is the baseline; a counter that steps back was reset.
            step = 0.0 if previous is None or value < previous else (value - previous) * KIB
            self._add(counter, key[1], step)


def _links_by_state(
    count: int | None, states: Mapping[int, str], answered: Mapping[int, float]
) -> dict[str, float] | None:
    """Links by state (every state named, 0 where none is), ``unknown`` for links whose state
    NVML did not answer; None where the link count is unknown."""
    if count is None:
        return None
    out = dict.fromkeys(states.values(), 0.0)
    for link in range(count):
        value = answered.get(link)
        name = "unknown" if value is None else states.get(int(value), "unknown")
        out[name] = out.get(name, 0.0) + 1.0
    return out


def _per_link(reading: GpuReading, name: str) -> dict[int, float]:
    return {k[1]: v for k, v in reading.fields.items() if k[0] == name and k[1] is not None}


def nvlink_links(identity: GpuIdentity, reading: GpuReading) -> dict[str, float] | None:
    """NVLink links by state (``NVML_FI_DEV_NVLINK_GET_STATE``)."""
    return _links_by_state(identity.links.nvlink, NVLINK_STATES, _per_link(reading, "nvlink_state"))


def nvlink_link_speeds(identity: GpuIdentity, reading: GpuReading) -> dict[int, float]:
    """Each usable NVLink link's speed in bytes/s, one direction: its own speed, else the
    speed common to the active links."""
    states = _per_link(reading, "nvlink_state")
    speeds = _per_link(reading, "nvlink_speed_mbps")
    common = reading.fields.get(("nvlink_speed_common_mbps", None))
    out: dict[int, float] = {}
    for link in range(identity.links.nvlink or 0):
        state = states.get(link)
        if state is not None and NVLINK_STATES.get(int(state)) not in USABLE_NVLINK:
            continue
        speed = speeds.get(link, common)
        if speed:
            out[link] = speed * MBPS
    return out


def nvlink_peak(identity: GpuIdentity, reading: GpuReading) -> float | None:
    """The GPU's NVLink peak in one direction: the speeds of its usable links summed."""
    speeds = nvlink_link_speeds(identity, reading)
    return sum(speeds.values()) if speeds else None


def c2c_links(identity: GpuIdentity, reading: GpuReading) -> dict[str, float] | None:
    """C2C links by status (``NVML_FI_DEV_C2C_LINK_GET_STATUS``); none on a GPU without C2C."""
    if not identity.links.c2c:
        return None
    return _links_by_state(identity.links.c2c, C2C_STATES, _per_link(reading, "c2c_link_status"))


def c2c_peak(identity: GpuIdentity, reading: GpuReading) -> float | None:
    """The C2C peak in one direction: the bandwidth of the active C2C links summed."""
    status = _per_link(reading, "c2c_link_status")
    bandwidth = _per_link(reading, "c2c_link_max_bw_mbps")
    total = sum(bw * MBPS for link, bw in bandwidth.items() if status.get(link, 1) == 1)
    return total or None


def fabric_state(reading: GpuReading) -> dict[str, float] | None:
    """The fabric registration as a state set: not_started, in_progress, completed, and
    failed (completed with an error status)."""
    fabric = reading.fabric
    if fabric is None or fabric.state not in FABRIC_STATES:
        return None
    now = FABRIC_STATES[fabric.state]
    if now == "completed" and fabric.status != 0:
        now = FABRIC_FAILED
    return {name: float(name == now) for name in (*FABRIC_STATES.values(), FABRIC_FAILED)}


def fabric_health(reading: GpuReading) -> dict[str, float] | None:
    """The fabric's health summary as a state set (v3 of the structure)."""
    fabric = reading.fabric
    if fabric is None or fabric.health_summary not in FABRIC_HEALTH:
        return None
    now = FABRIC_HEALTH[fabric.health_summary or 0]
    return {name: float(name == now) for name in FABRIC_HEALTH.values()}


def fabric_conditions(reading: GpuReading) -> dict[str, float] | None:
    """Each condition of the fabric's health mask the driver reports: 1 while it holds."""
    fabric = reading.fabric
    if fabric is None or fabric.health_mask is None or fabric.state not in FABRIC_STATES:
        return None
    out: dict[str, float] = {}
    for name, (shift, width) in FABRIC_CONDITIONS.items():
        value = (fabric.health_mask >> shift) & width
        if value == 0:
            continue  # not supported
        if name == "incorrect_configuration":
            out[name] = float(value >= 2)  # 1 is "none", 2 and up a reason
        elif value in (1, 2):
            out[name] = float(value == 1)
    return out or None


def fabric_info(reading: GpuReading) -> dict[tuple[str, ...], float] | None:
    """The GPU's NVLink domain once registered: its cluster UUID and clique."""
    fabric = reading.fabric
    if fabric is None or FABRIC_STATES.get(fabric.state) != "completed":
        return None
    return {(fabric.cluster_uuid, str(fabric.clique_id)): 1.0}


def power_profiles(reading: GpuReading) -> dict[str, float] | None:
    """The workload power profiles the GPU enforces, by name."""
    if reading.power_profiles is None:
        return None
    return {power_profile_name(p): 1.0 for p in sorted(reading.power_profiles)}
