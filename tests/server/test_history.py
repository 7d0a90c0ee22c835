"""The landing page's history: bounded rings of a few key values, drawn as sparklines."""

from __future__ import annotations

import re
import sys

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from support.clock import FakeClock

from exporter.server.history import MIN_SPACING_S, POINTS, TRACKED, History


def gauge(name: str, *values: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, "help", labels=["gpu"])
    for i, value in enumerate(values):
        family.add_metric([str(i)], value)
    return family


def test_ratios_are_averaged_counts_summed_others_ignored() -> None:
    clock = FakeClock()
    history = History(clock)
    history.observe(gauge("inference_gpu_utilization_ratio", 0.2, 0.6))
    history.observe(gauge("inference_queue_depth", 3, 4))
    history.observe(CounterMetricFamily("inference_softirqs", "help", value=7))
    assert history.points("inference_gpu_utilization_ratio") == [(clock.now, 0.4)]
    assert history.points("inference_queue_depth") == [(clock.now, 7.0)]
    assert "inference_softirqs" not in TRACKED


def test_rings_are_bounded_and_spaced() -> None:
    clock = FakeClock()
    history = History(clock)
    name = "inference_queue_depth"
    history.observe(gauge(name, 1))
    clock.advance(MIN_SPACING_S / 2)
    history.observe(gauge(name, 2))  # a second replica's scrape: replaces, does not add
    assert history.points(name) == [(1000.0, 2.0)]
    for i in range(3 * POINTS):
        clock.advance(MIN_SPACING_S)
        history.observe(gauge(name, i))
    points = history.points(name)
    assert len(points) == POINTS
    assert points[-1][1] == 3 * POINTS - 1
    # the ring holds floats, not the families: its size does not grow with uptime
    size = sys.getsizeof(history._rings[name])
    for _ in range(POINTS):
        clock.advance(MIN_SPACING_S)
        history.observe(gauge(name, 1))
    assert sys.getsizeof(history._rings[name]) == size


def test_rows_draw_a_sparkline_with_the_last_value() -> None:
    clock = FakeClock()
    history = History(clock)
    assert history.rows() == ""
    for value in (0.1, 0.5, 0.9, float("nan"), 0.45):
        history.observe(gauge("inference_gpu_utilization_ratio", value))
        clock.advance(MIN_SPACING_S)
    rows = history.rows()
    assert rows.count("<tr") == 1
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="spark"' in rows
    assert re.search(r'data-points="4"', rows)
    assert "<td>45 %</td><td>0 min</td>" in rows
