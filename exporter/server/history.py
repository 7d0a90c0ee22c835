"""The sidecar's own last minutes, for its landing page: a few key values per scrape in
bounded rings, drawn as sparklines (:func:`exporter.svgchart.sparkline`, no script).

Each scrape hands every family to :meth:`History.observe`: one dictionary look-up for the
families not tracked, a sum over a tracked family's few samples. At most one point per
:data:`MIN_SPACING_S` (several Prometheus replicas scrape more often), :data:`POINTS` points
per value: memory stays fixed whatever the uptime.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from exporter.signatures.signals.cpu_signals import HOTTEST_THREAD, SOFTIRQ_HOTTEST_CORE
from exporter.signatures.signals.engine_signals import QUEUE_DEPTH
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION, HBM_BANDWIDTH
from exporter.signatures.signals.signal import Signal
from exporter.signatures.site import SiteConfig
from exporter.svgchart import format_tick, sparkline

POINTS = 120
MIN_SPACING_S = 5.0


@dataclass(frozen=True)
class Tracked:
    label: str
    unit: str  # "ratio" (mean of the samples, drawn 0-100 %) or "count" (their sum)
    # The rule pack's signal over the same value: what the alerts and dashboards read.
    signal: Signal


TRACKED: dict[str, Tracked] = {
    "inference_gpu_utilization_ratio": Tracked(
        "GPU utilisation (mean of GPUs)", "ratio", GPU_UTILIZATION
    ),
    "inference_queue_depth": Tracked("requests waiting", "count", QUEUE_DEPTH),
    "inference_engine_hottest_thread_cpu_ratio": Tracked(
        "busiest engine thread", "ratio", HOTTEST_THREAD
    ),
    "inference_gpu_memory_bandwidth_utilization_ratio": Tracked(
        "HBM bandwidth", "ratio", HBM_BANDWIDTH
    ),
    "inference_cpu_softirq_hottest_core_ratio": Tracked(
        "softirq, busiest core", "ratio", SOFTIRQ_HOTTEST_CORE
    ),
}
# The shipped pack: the sidecar cannot know a site's config; its windows name the records.
_PACK = SiteConfig()


class History:
    """Bounded rings of (time, value) per tracked family, newest last."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rings: dict[str, deque[tuple[float, float]]] = {
            name: deque(maxlen=POINTS) for name in TRACKED
        }

    def observe(self, family: Metric) -> None:
        tracked = TRACKED.get(family.name)
        if tracked is None:
            return
        values = [s.value for s in family.samples if math.isfinite(s.value)]
        if not values:
            return
        value = sum(values) / len(values) if tracked.unit == "ratio" else sum(values)
        now = self._clock()
        with self._lock:
            ring = self._rings[family.name]
            if ring and now - ring[-1][0] < MIN_SPACING_S:
                ring[-1] = (ring[-1][0], value)
            else:
                ring.append((now, value))

    def points(self, name: str) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._rings[name])

    def rows(self) -> str:
        """Table rows: what, sparkline, last value, over how long, the pack's signal of it."""
        out = []
        for name, tracked in TRACKED.items():
            points = self.points(name)
            if not points:
                continue
            values = [v for _, v in points]
            span = points[-1][0] - points[0][0]
            chart = sparkline(
                values, y_max=1.0 if tracked.unit == "ratio" else None, label=tracked.label
            )
            out.append(
                f'<tr data-series="{html.escape(name)}"><td>{html.escape(tracked.label)}</td>'
                f"<td>{chart}</td><td>{html.escape(format_tick(values[-1], tracked.unit))}</td>"
                f"<td>{span / 60:.0f} min</td>"
                f"<td><code>{html.escape(tracked.signal.record(_PACK))}</code></td></tr>"
            )
        return "".join(out)
