"""What the ``nvml`` collector knows of one GPU (or MIG device), folded from its readings:
the latest reading, counters that only grow (busy and DRAM-active seconds, Xids, NVML
calls, bytes over the links, energy spent idle, the engine's and each pod's busy seconds), the
utilisation histogram, and the engine's share of the device."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from prometheus_client.samples import Sample

from exporter import metrics as m
from exporter.backends.gpu_reader import GpuIdentity, GpuReader, GpuReading
from exporter.backends.pod_cgroups import POD, UNATTRIBUTED, Lookup, PodContainer
from exporter.collectors.nvml_links import LinkCounters
from exporter.hardware.gpus import Peaks

# A driver sample stands for the period since the one before it. Periods longer than this
# (samples lost while the GPU was unreachable) are not credited beyond it.
MAX_SAMPLE_PERIOD_S = 2.0
# A share read at a poll stands for the time since the previous poll; a gap longer than this
# many poll intervals (polls failed meanwhile) is not credited.
MAX_POLL_GAP = 2.5


def all_idle(samples: list[tuple[int, float]]) -> bool:
    """Whether the driver's samples say no kernel ran at all: every one at 0 %."""
    return bool(samples) and all(value <= 0.0 for _, value in samples)


def integrate_samples(
    previous: tuple[int, float] | None, samples: list[tuple[int, float]]
) -> tuple[float, tuple[int, float] | None]:
    """Busy seconds in ``samples`` (``(timestamp_us, percent)``, sorted).

    Each sample's value covers the time since the sample before it; the very first sample
    ever seen has no known period and adds nothing. Returns (busy seconds, last sample).
    """
    busy = 0.0
    last = previous
    for ts, value in samples:
        if last is not None and ts > last[0]:
            period = min((ts - last[0]) / 1e6, MAX_SAMPLE_PERIOD_S)
            busy += period * min(max(value, 0.0), 100.0) / 100.0
        last = (ts, value)
    return busy, last


@dataclass
class GpuState:
    """Everything the collector knows about one GPU; guarded by ``lock``."""

    identity: GpuIdentity
    peaks: Peaks | None = None
    reader: GpuReader | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    latest: GpuReading | None = None
    latest_at: float = 0.0
    latest_util: float | None = None
    error: str = ""
    inflight_since: float | None = None
    busy_seconds: float = 0.0
    last_sample: tuple[int, float] | None = None
    samples: m.BucketCounts = field(default_factory=lambda: m.BucketCounts(m.UTILIZATION_BUCKETS))
    dram_active_seconds: float = 0.0
    xids: Counter[int] = field(default_factory=Counter)
    calls: int = 0
    attempted: bool = False
    # How often the collector polls (a longer gap between two polls is not credited).
    poll_interval_s: float = 3.0
    links: LinkCounters = field(default_factory=LinkCounters)
    # Energy of the poll intervals in which every driver sample was 0 % (None: no energy
    # counter or no sample buffer here).
    idle_energy_joules: float | None = None
    last_energy_mj: float | None = None
    # The engine's share and each container's, times the poll interval, summed.
    engine_busy_seconds: float | None = None
    pod_busy_seconds: dict[PodContainer, float] = field(default_factory=dict)
    # Per-process shares of the latest reading; None where not known.
    engine_util: float | None = None
    engine_memory: float | None = None
    engine_processes: int | None = None
    other_processes: int | None = None
    # Each container's share and memory, and the processes given to no pod by reason (the
    # node agent's mapping of NVML's processes to pods); None where not mapped.
    pod_util: dict[PodContainer, float] | None = None
    pod_memory: dict[PodContainer, float] | None = None
    unattributed: dict[str, int] | None = None
    # The histogram's samples as last rendered, with the counts and count they came from:
    # they change once per poll, scrapes come far more often.
    hist_rendered: tuple[m.BucketCounts, int, list[Sample]] | None = None

    def apply(
        self,
        reading: GpuReading,
        now: float,
        engine: frozenset[int] | None = None,
        pods: dict[int, Lookup] | None = None,
    ) -> None:
        """Fold one successful reading into the state (counters only grow); ``engine`` is
        the engine's PIDs among the reading's processes (None: not known), ``pods`` the owner
        of each of its PIDs (None: not mapped)."""
        gap = now - self.latest_at if self.latest is not None else None
        recent = gap is not None and 0.0 < gap <= MAX_POLL_GAP * self.poll_interval_s
        self._apply_idle_energy(reading, recent)
        self.links.apply(reading)
        busy, self.last_sample = integrate_samples(self.last_sample, reading.samples)
        self.busy_seconds += busy
        for _, value in reading.samples:
            self.samples.observe(min(max(value, 0.0), 100.0) / 100.0)
        graphics = reading.gpm.get("graphics_util")
        if reading.samples:
            self.latest_util = reading.samples[-1][1] / 100.0
        elif not reading.has_samples and graphics is not None and reading.gpm_interval_s:
            # No sample buffer (MIG): GPM graphics activity over the poll interval stands in,
            # one value per poll.
            share = min(max(graphics, 0.0), 100.0) / 100.0
            self.busy_seconds += reading.gpm_interval_s * share
            self.samples.observe(share)
            self.latest_util = share
        elif reading.util_gpu_pct is not None and self.last_sample is None:
            # No sample buffer on this GPU: the driver's own average is the best we have.
            self.latest_util = reading.util_gpu_pct / 100.0
        dram = reading.gpm.get("dram_bw_util")
        if dram is not None and reading.gpm_interval_s:
            self.dram_active_seconds += reading.gpm_interval_s * dram / 100.0
        self._apply_processes(reading, engine)
        self._apply_pods(reading, pods)
        self._apply_busy_shares(gap if recent else None)
        self.latest = reading
        self.latest_at = now
        self.error = ""

    def _apply_idle_energy(self, reading: GpuReading, recent: bool) -> None:
        """The energy since the previous poll counts as idle when every driver sample since
        then is 0 %: nothing ran for the whole interval (a mixed interval counts as busy)."""
        energy = reading.energy_mj
        if energy is None or not reading.has_samples:
            return
        if self.idle_energy_joules is None:
            self.idle_energy_joules = 0.0
        last, self.last_energy_mj = self.last_energy_mj, float(energy)
        if recent and last is not None and energy >= last and all_idle(reading.samples):
            self.idle_energy_joules += (energy - last) / 1000.0

    def _apply_busy_shares(self, gap: float | None) -> None:
        """The engine's share and each container's, credited for the time since the previous
        poll; containers gone from the GPU drop out (a counter that comes back restarts)."""
        if self.engine_util is not None:
            self.engine_busy_seconds = (self.engine_busy_seconds or 0.0) + (
                self.engine_util * gap if gap else 0.0
            )
        shares = self.pod_util or {}
        self.pod_busy_seconds = {
            owner: self.pod_busy_seconds.get(owner, 0.0) + (share * gap if gap else 0.0)
            for owner, share in shares.items()
        }

    def _apply_processes(self, reading: GpuReading, engine: frozenset[int] | None) -> None:
        procs = reading.processes
        if procs is None or engine is None:
            self.engine_util = self.engine_memory = None
            self.engine_processes = self.other_processes = None
            return
        mine = [p for p in procs if p.pid in engine]
        others = len(procs) - len(mine)
        self.engine_processes, self.other_processes = len(mine), others
        used = [p.used_bytes for p in mine if p.used_bytes is not None]
        # Memory NVML does not report (NVML_VALUE_NOT_AVAILABLE) leaves the sum unknown.
        self.engine_memory = float(sum(used)) if len(used) == len(mine) else None
        if not mine:
            self.engine_util = 0.0  # the engine runs nothing here
        elif reading.process_samples is not None:
            ordered = sorted(reading.process_samples, key=lambda s: s.timestamp_us)
            newest = {s.pid: s for s in ordered}  # each process's newest sample
            share = sum(min(max(s.sm_pct, 0), 100) for pid, s in newest.items() if pid in engine)
            self.engine_util = min(share, 100) / 100.0
        elif others == 0 and self.latest_util is not None:
            # No per-process utilisation (MIG), but no one else on the device either.
            self.engine_util = self.latest_util
        else:
            self.engine_util = None

    def _apply_pods(self, reading: GpuReading, pods: dict[int, Lookup] | None) -> None:
        """Each container's share of the device: its processes' newest SM samples summed, as
        the engine's share is; processes of no pod only counted."""
        procs = reading.processes
        if procs is None or pods is None:
            self.pod_util = self.pod_memory = self.unattributed = None
            return
        pids = {p.pid for p in procs} | {s.pid for s in reading.process_samples or ()}
        owner: dict[int, PodContainer] = {}
        unattributed = dict.fromkeys(UNATTRIBUTED, 0)
        for pid in pids:
            found = pods.get(pid)
            if found is not None and found.result == POD and found.owner is not None:
                owner[pid] = found.owner
            else:
                unattributed[found.result if found is not None else "gone"] += 1
        util: dict[PodContainer, float] = dict.fromkeys(owner.values(), 0.0)
        if reading.process_samples is not None:
            newest = {
                s.pid: s for s in sorted(reading.process_samples, key=lambda s: s.timestamp_us)
            }
            for pid, sample in newest.items():
                if pid in owner:
                    util[owner[pid]] += min(max(sample.sm_pct, 0), 100) / 100.0
        elif len(util) == 1 and not any(unattributed.values()) and self.latest_util is not None:
            # No per-process utilisation (MIG), but one container alone on the device.
            util = {next(iter(util)): self.latest_util}
        else:
            util = {}
        memory: dict[PodContainer, float] = {}
        unknown: set[PodContainer] = set()
        for proc in procs:
            container = owner.get(proc.pid)
            if container is None:
                continue
            if proc.used_bytes is None:
                unknown.add(container)
            memory[container] = memory.get(container, 0.0) + float(proc.used_bytes or 0)
        self.pod_util = {k: min(v, 1.0) for k, v in util.items()}
        self.pod_memory = {k: v for k, v in memory.items() if k not in unknown}
        self.unattributed = unattributed
