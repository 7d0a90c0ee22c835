"""The fast text encoder writes exactly what prometheus_client's generate_latest writes."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om
from prometheus_client.utils import floatToGoString

from exporter.server.exposition import OpenMetricsEncoder, TextEncoder, go_float


class Odd:
    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily("odd_values", 'help with \\ backslash\nand "quotes"', labels=["v"])
        for i, value in enumerate(
            [0.0, -0.0, 1e-9, 123456789.0, 1e22, math.inf, -math.inf, math.nan]
        ):
            fam.add_metric([f"case{i}"], value)
        fam.add_metric(['quote " back \\ newline \n tab \t'], 1.0)
        fam.add_metric(["ünïcödé ✓"], 2.0, timestamp=1700000000.123)
        yield fam


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    Counter("requests", "Requests.", ["code", "method"], registry=reg).labels("200", "GET").inc(3)
    Gauge("temperature_celsius", "Temp.", registry=reg).set(21.5)
    h = Histogram("latency_seconds", "Latency.", ["path"], registry=reg)
    h.labels("/a").observe(0.2)
    h.labels("/b").observe(7.0)
    Summary("size_bytes", "Size.", registry=reg).observe(512)
    Info("build", "Build.", registry=reg).info({"version": "1.2.3", "commit": "abc"})
    reg.register(Odd())
    return reg


def test_matches_generate_latest_byte_for_byte() -> None:
    reg = registry()
    encoder = TextEncoder()
    expected = generate_latest(reg)
    assert encoder.encode(reg) == expected
    # second pass: served from the prefix cache, still identical
    assert encoder.encode(reg) == expected
    assert b'v="quote \\" back \\\\ newline \\n tab \t"' in expected
    assert b"_created" in expected  # OpenMetrics-only samples moved to their own gauges


def test_openmetrics_matches_prometheus_client_byte_for_byte() -> None:
    reg = registry()
    encoder = OpenMetricsEncoder()
    for escaping in (om.UNDERSCORES, om.ALLOWUTF8):
        expected = om.generate_latest(reg, escaping=escaping)
        assert encoder.encode(reg, escaping) == expected
        assert encoder.encode(reg, escaping) == expected  # from the prefix cache
    assert encoder.encode(reg).endswith(b"# EOF\n")


def test_openmetrics_exemplars_go_through_prometheus_client() -> None:
    reg = CollectorRegistry(auto_describe=False)
    c = Counter("hits", "Hits.", registry=reg)
    c.inc(1, exemplar={"trace_id": "abc"})
    assert OpenMetricsEncoder().encode(reg) == om.generate_latest(reg)


def test_cache_is_bounded() -> None:
    encoder = TextEncoder()

    class Many:
        def __init__(self, start: int) -> None:
            self.start = start

        def collect(self) -> Iterator[Metric]:
            fam = GaugeMetricFamily("many", "Many.", labels=["i"])
            for i in range(self.start, self.start + 15_000):
                fam.add_metric([str(i)], float(i))
            yield fam

    for start in (0, 15_000, 30_000):
        reg = CollectorRegistry(auto_describe=False)
        reg.register(Many(start))
        assert encoder.encode(reg) == generate_latest(reg)
        assert len(encoder._series) <= 20_000


def test_go_float_matches_float_to_go_string() -> None:
    rng = random.Random(5)
    values = [0.0, -0.0, 1.0, -1.0, 12.0, 1e-9, 123456.0, 1234567.0, 1e22, -1e22, 0.1 + 0.2]
    values += [math.inf, -math.inf, 3, 10**7, 2**53]
    values += [rng.uniform(-1e12, 1e12) for _ in range(2000)]
    values += [10 ** rng.uniform(-12, 18) for _ in range(2000)]
    for value in values:
        assert go_float(value) == floatToGoString(value), value
    assert go_float(math.nan) == floatToGoString(math.nan) == "NaN"


def test_reused_value_texts_never_mix_up_equal_values() -> None:
    """A series reuses its last value's text when the value is unchanged (by ==): 0.0 and
    -0.0, 1 and 1.0 and True, NaN must still print as prometheus_client prints them, from one
    scrape to the next, in both encoders."""
    history: list[float] = [0.0, -0.0, -0.0, 0.0, 1, 1.0, True, math.nan, math.nan, 2.5, 2.5]
    history += [2**53, float(2**53), 1e22, 1e22, math.inf, math.inf, -math.inf, 5e-324, -0.0]
    current = {"value": 0.0}

    class One:
        def collect(self) -> Iterator[Metric]:
            fam = GaugeMetricFamily("v", "Values.", labels=["i"])
            fam.add_metric(["a"], current["value"])
            fam.add_metric(["b"], -current["value"])
            yield fam

    reg = CollectorRegistry(auto_describe=False)
    reg.register(One())
    text, openmetrics = TextEncoder(), OpenMetricsEncoder()
    for value in history:
        current["value"] = value
        assert text.encode(reg) == generate_latest(reg), value
        assert openmetrics.encode(reg) == om.generate_latest(reg), value  # type: ignore[no-untyped-call]
