"""Collector ``cpu``: node CPU time by mode, softirq load and the core that softirqs pin.

Emits (see ``docs/metrics.md``)::

    inference_cpu_seconds_total{mode}            user, nice, system, idle, iowait, irq,
                                                 softirq, steal; summed over all CPUs
    inference_cpu_all_modes_seconds_total        the modes above summed (the softirq share's
                                                 denominator in one series)
    inference_cpu_softirq_hottest_core_ratio     softirq share of the busiest softirq core
                                                 over the last window (>= min_window)
    inference_cpu_online                         number of online CPUs
    inference_softirqs_total{vector}             HI, TIMER, NET_TX, NET_RX, BLOCK, ...

Example (``tests/fixtures/proc/many-cpu-later``, 5 s after ``many-cpu``, NET_RX pinned to
cpu17)::

    inference_cpu_seconds_total{mode="softirq"} 24852.83
    inference_cpu_softirq_hottest_core_ratio 0.62
    inference_cpu_online 96.0
    inference_softirqs_total{vector="NET_RX"} 2.4052736e+07

How it reads: ``<procfs>/stat`` and ``<procfs>/softirqs`` on every scrape (a few hundred
microseconds). The hottest-core ratio needs two reads: each scrape keeps its per-CPU times
with the time of the read, and the ratio compares the current read with the newest kept
read at least ``min_window`` seconds old, so it is absent on the first scrape and while
scrapes come faster than that. A collector whose file is missing or garbled reports
unsuccessful and still emits what the other file gives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.backends import procfs
from exporter.backends.procfs import CpuStat, CpuTimes, ProcfsError, Softirqs
from exporter.collectors.base import Collection, Collector, WindowHistory
from exporter.collectors.shared_state import Shared
from exporter.config import Settings, flag, section


@dataclass(frozen=True)
class CpuOptions:
    """The flags of the ``cpu`` collector."""

    procfs: Path = flag(
        "path.procfs",
        Path("/proc"),
        "procfs mount point (in a container /proc/stat still shows the whole node, which is "
        "what the cpu collector reads).",
        kind="path",
        metavar="PATH",
    )


def hottest_softirq_ratio(
    before: Mapping[int, CpuTimes], after: Mapping[int, CpuTimes]
) -> float | None:
    """Highest Δsoftirq / Δtotal of any CPU between two reads; None when no CPU qualifies.

    CPUs in only one read (hotplug) are skipped, as are CPUs whose softirq or total time went
    backwards or did not move. A small drop in iowait alone is tolerated: the kernel
    documents that iowait can decrease (``Documentation/filesystems/proc.rst``).
    """
    hottest: float | None = None
    for cpu, now in after.items():
        then = before.get(cpu)
        if then is None:
            continue
        d_softirq = now.softirq - then.softirq
        d_total = now.total - then.total
        if d_softirq < 0 or d_total <= 0:
            continue
        ratio = min(1.0, d_softirq / d_total)
        if hottest is None or ratio > hottest:
            hottest = ratio
    return hottest


class CpuCollector(Collector):
    """Reads ``<proc_path>/stat`` and ``<proc_path>/softirqs`` on every :meth:`collect`."""

    name = "cpu"

    def __init__(
        self,
        proc_path: Path = CpuOptions.procfs,
        *,
        clock: Callable[[], float] = time.monotonic,
        min_window: float = 1.0,
        clk_tck: int | None = None,
    ) -> None:
        if min_window < 0:
            raise ValueError(f"min_window must not be negative, not {min_window}")
        self._proc_path = proc_path
        self._clock = clock
        self._min_window = min_window
        self._clk_tck = procfs.clock_ticks() if clk_tck is None else clk_tck
        self._window: WindowHistory[dict[int, CpuTimes]] = WindowHistory(min_window)

    def collect(self) -> Collection:
        result = Collection()
        errors: list[str] = []
        try:
            stat = procfs.read_stat(self._proc_path, clk_tck=self._clk_tck)
        except ProcfsError as exc:
            errors.append(str(exc))
        else:
            result.metrics.extend(self._stat_metrics(stat, self._clock()))
        try:
            softirqs = procfs.read_softirqs(self._proc_path)
        except ProcfsError as exc:
            errors.append(str(exc))
        else:
            result.metrics.append(_softirq_metric(softirqs))
        if errors:
            result.success = False
            result.error = "; ".join(errors)
        return result

    def _stat_metrics(self, stat: CpuStat, now: float) -> list[Metric]:
        seconds = m.counter("inference_cpu_seconds_total")
        by_mode = stat.aggregate.by_mode()
        for mode, value in by_mode.items():
            seconds.add_metric([mode], value)
        all_modes = m.counter("inference_cpu_all_modes_seconds_total")
        all_modes.add_metric([], sum(by_mode.values()))
        online = m.gauge("inference_cpu_online")
        online.add_metric([], len(stat.per_cpu))
        families: list[Metric] = [seconds, all_modes, online]
        baseline = self._window.push(now, stat.per_cpu)
        ratio = None if baseline is None else hottest_softirq_ratio(baseline[1], stat.per_cpu)
        if ratio is not None:
            hottest = m.gauge("inference_cpu_softirq_hottest_core_ratio")
            hottest.add_metric([], ratio)
            families.append(hottest)
        return families


def _softirq_metric(softirqs: Softirqs) -> Metric:
    family = m.counter("inference_softirqs_total")
    for vector, count in softirqs.counts.items():
        family.add_metric([vector], count)
    return family


# --- construction -----------------------------------------------------------------------------


def check(settings: Settings) -> None:
    """Nothing to check across flags."""


def build(settings: Settings, shared: Shared) -> CpuCollector:
    return CpuCollector(section(CpuOptions, settings).procfs)
