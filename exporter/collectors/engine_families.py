"""The engine's normalised series as metric families: the engine collector's output, and the
engine-reported tokenizer latency that the tokenizer probe exports next to its own."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.engines.snapshot import Series


def add_series(
    families: dict[str, Metric],
    engine: str,
    series: Series,
    extra: str,
    endpoint: str | None = None,
    *,
    role: str | None = None,
) -> None:
    """Add one normalised series to its family (created from the catalogue on first use).

    ``extra`` is the second label's value: the model for engine metrics, the source for the
    tokenizer latency; then ``role`` when given and the metric has one (engine metrics), the
    series' own labels, then
    ``endpoint`` when given.
    """
    # A gateway's series have no role: a router is no prefill or decode server.
    has_role = role is not None and "role" in m.BY_NAME[series.name].labels
    head = [engine, extra, role] if has_role and role is not None else [engine, extra]
    labels = [*head, *(value for _, value in series.labels)]
    optional: tuple[str, ...] = ()
    if endpoint is not None:
        labels.append(endpoint)
        optional = ("endpoint",)
    fam = families.get(series.name)
    if series.kind == "histogram":
        hist = fam if isinstance(fam, HistogramMetricFamily) else m.histogram(series.name, optional)
        hist.add_metric(labels, [(_bound(le), c) for le, c in series.buckets], series.sum)
        families[series.name] = hist
    elif series.kind == "counter":
        counter = fam if isinstance(fam, CounterMetricFamily) else m.counter(series.name, optional)
        counter.add_metric(labels, series.value)
        families[series.name] = counter
    else:
        gauge = fam if isinstance(fam, GaugeMetricFamily) else m.gauge(series.name, optional)
        gauge.add_metric(labels, series.value)
        families[series.name] = gauge


def _bound(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(float(le))
