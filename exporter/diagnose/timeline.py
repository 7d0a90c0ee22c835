"""The time series behind ``diagnose --report``: a window of the pack's records around the
evaluation time, the interval where the first cause held (or its alert fired), and what is
missing from the data.

Read through the Prometheus HTTP API (range queries, and the raw samples of ``up`` for scrape
gaps). The panels' queries are the pack's signals (:mod:`exporter.signatures.signals`), narrowed
to the first finding's target, so a plot shows what the alert read.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.diagnose.datasources import Matrix, PrometheusBackend
from exporter.diagnose.findings import Finding
from exporter.diagnose.promql_eval import NAME, Labels
from exporter.diagnose.promql_syntax import PromQLError
from exporter.signatures.promql_text import matchers, selector
from exporter.signatures.signals import (
    POD_LABELS,
    cpu_signals,
    engine_signals,
    gpu_signals,
    latency_signals,
    pool_labels,
    pool_signals,
    roofline_signals,
)
from exporter.signatures.signals.signal import Signal
from exporter.signatures.site import SiteConfig

# Points per plot: Prometheus answers at most 11,000 per series; a page needs far fewer.
POINTS = 240
# Series per query kept for a plot (one per GPU or target); the rest are counted.
MAX_SERIES = 6


@dataclass(frozen=True)
class SeriesSpec:
    name: str
    signal: Signal


@dataclass(frozen=True)
class PanelSpec:
    """One plot: its series (signals of the pack, of one unit), and the alert threshold it
    shows."""

    key: str
    title: str
    series: tuple[SeriesSpec, ...]
    stacked: bool = False
    threshold: tuple[str, str] | None = None  # (alert, parameter) of the site config
    threshold_label: str = ""

    def __post_init__(self) -> None:
        units = {item.signal.unit for item in self.series}
        if len(units) != 1:
            raise ValueError(f"plot {self.key}: series of units {sorted(units)}")

    @property
    def unit(self) -> str:
        """The axis's unit, the signals': ``ratio`` and ``seconds`` as such, else counts."""
        unit = self.series[0].signal.unit
        return unit if unit in ("ratio", "seconds") else "count"


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "gpu",
        "GPU utilisation (the device's) and the shares of idle and busy samples",
        (
            SeriesSpec("utilisation", gpu_signals.GPU_UTILIZATION),
            SeriesSpec("idle samples", gpu_signals.IDLE_SAMPLES),
            SeriesSpec("busy samples", gpu_signals.BUSY_SAMPLES),
        ),
        threshold=("InferenceFrontendCPUSaturated", "utilization_below"),
        threshold_label="starved below",
    ),
    PanelSpec(
        "queue",
        "Requests waiting in the queue",
        (SeriesSpec("waiting", engine_signals.QUEUE_DEPTH),),
    ),
    PanelSpec(
        "latency",
        "Client latency: mean end-to-end request latency",
        (SeriesSpec("end to end", roofline_signals.E2E_MEAN),),
    ),
    PanelSpec(
        "budget",
        "Latency budget: shares of end-to-end latency",
        (
            SeriesSpec("queue", roofline_signals.BUDGET_QUEUE),
            SeriesSpec("prefill", roofline_signals.BUDGET_PREFILL),
            SeriesSpec("decode", roofline_signals.BUDGET_DECODE),
            SeriesSpec("host", roofline_signals.BUDGET_HOST),
        ),
        stacked=True,
    ),
    PanelSpec(
        "roofline",
        "Decode roofline efficiency (HBM floor of a step / inter-token latency)",
        (SeriesSpec("efficiency", roofline_signals.DECODE_EFFICIENCY),),
        threshold=("InferenceDecodeOverheadBound", "efficiency_below"),
        threshold_label="overhead-bound below",
    ),
    PanelSpec(
        "tokenizer",
        "Tokenizer latency against a decode step (medians)",
        (
            SeriesSpec("tokenizer", latency_signals.TOKENIZER_MEDIAN),
            SeriesSpec("decode step", latency_signals.INTER_TOKEN_MEDIAN),
        ),
    ),
    PanelSpec(
        "softirq",
        "softirq share of CPU time",
        (
            SeriesSpec("node", cpu_signals.SOFTIRQ_SHARE),
            SeriesSpec("busiest core", cpu_signals.SOFTIRQ_HOTTEST_CORE),
        ),
        threshold=("InferenceSoftirqCPUHigh", "node_share_above"),
        threshold_label="node share above",
    ),
    PanelSpec(
        "thread",
        "Busiest engine thread (share of one core)",
        (SeriesSpec("busiest thread", cpu_signals.HOTTEST_THREAD),),
        threshold=("InferenceFrontendCPUSaturated", "hottest_thread_above"),
        threshold_label="saturated above",
    ),
)

# A pool's incident (disaggregated serving) adds where its requests' first token waits.
POOL_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "ttft",
        "Time to first token of the pool: shares in queue, prefill and KV transfer",
        (
            SeriesSpec("queue", pool_signals.TTFT_QUEUE_SHARE),
            SeriesSpec("prefill", pool_signals.TTFT_PREFILL_SHARE),
            SeriesSpec("KV transfer", pool_signals.TTFT_TRANSFER_SHARE),
        ),
        stacked=True,
        threshold=("InferenceKVTransferBound", "transfer_share_above"),
        threshold_label="transfer-bound above",
    ),
)

Points = list[tuple[float, float]]


@dataclass
class PlotSeries:
    name: str
    query: str
    points: Points

    def mean(self, start: float, end: float) -> float | None:
        """The mean of the points from ``start`` up to, not including, ``end``."""
        values = [v for t, v in self.points if start <= t < end and math.isfinite(v)]
        return statistics.fmean(values) if values else None


@dataclass
class Panel:
    spec: PanelSpec
    series: list[PlotSeries]
    threshold: float | None
    missing: list[str]  # queries that returned nothing
    more: int = 0  # series left out past MAX_SERIES


@dataclass
class Interval:
    start: float
    end: float


@dataclass
class Incident:
    """Where the first-ranked cause held (its expression's range query) and where its alert
    fired (``ALERTS``, when Prometheus evaluated the alerting rules)."""

    alert: str
    held: list[Interval]
    firing: list[Interval]

    @property
    def intervals(self) -> list[Interval]:
        """The incident: where the cause held, else where its alert fired."""
        return self.held or self.firing

    @property
    def start(self) -> float:
        return min(i.start for i in [*self.held, *self.firing])

    @property
    def end(self) -> float:
        return max(i.end for i in [*self.held, *self.firing])


@dataclass
class Quality:
    targets: list[str] = field(default_factory=list)
    scrape_gaps: list[tuple[str, Interval]] = field(default_factory=list)
    down: list[tuple[str, Interval]] = field(default_factory=list)
    failing: list[tuple[str, str, Interval]] = field(default_factory=list)  # target, collector
    errors: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    start: float
    end: float
    step: float
    scope: dict[str, str]  # the target's labels every query is narrowed to
    panels: list[Panel]
    incident: Incident | None
    quality: Quality

    @property
    def baseline(self) -> Interval | None:
        """The window before the incident: what the incident is compared with."""
        if self.incident is None or self.incident.start - self.start < 2 * self.step:
            return None
        return Interval(self.start, self.incident.start)


def runs(points: Points, step: float) -> list[Interval]:
    """The intervals covered by ``points`` spaced at most 1.5 ``step`` apart."""
    out: list[Interval] = []
    for t, _ in sorted(points):
        if out and t - out[-1].end <= 1.5 * step:
            out[-1].end = t
        else:
            out.append(Interval(t, t))
    return out


def _lead(findings: Sequence[Finding]) -> Finding | None:
    held = [f for f in findings if f.instance.holds]
    chosen = held or findings
    return chosen[0] if chosen else None


def _pooled(lead: Finding | None) -> bool:
    """Whether the lead is a pool's (its labels name no pod nor instance)."""
    if lead is None:
        return False
    labels = dict(lead.instance.labels)
    return not any(labels.get(k) for k in POD_LABELS)


def _scope(cfg: SiteConfig, lead: Finding | None) -> dict[str, str]:
    """The lead's target, or its pool (a pool signature's labels name no pod): the plots then
    show the pool's targets."""
    if lead is None:
        return {}
    labels = dict(lead.instance.labels)
    keys = pool_labels(cfg.join_labels) if _pooled(lead) else cfg.join_labels
    return {k: labels.get(k, "") for k in keys}


def _name(base: str, labels: Labels, scope: dict[str, str]) -> str:
    extra = [f"{k}={v}" for k, v in labels if k != NAME and k not in scope]
    return f"{base} {' '.join(extra)}".rstrip() if extra else base


async def _panel(
    backend: PrometheusBackend,
    cfg: SiteConfig,
    spec: PanelSpec,
    window: tuple[float, float, float],
    scope: dict[str, str],
) -> Panel:
    series: list[PlotSeries] = []
    missing, more = [], 0
    for item in spec.series:
        query = item.signal.record(cfg) + (matchers(scope) if scope else "")
        try:
            found = await backend.query_range(query, *window)
        except PromQLError:
            found = []
        found = [(labels, points) for labels, points in found if points]
        if not found:
            missing.append(query)
        more += max(len(found) - MAX_SERIES, 0)
        series += [
            PlotSeries(_name(item.name, labels, scope), query, points)
            for labels, points in sorted(found)[:MAX_SERIES]
        ]
    threshold = cfg.ratio(*spec.threshold) if spec.threshold else None
    return Panel(spec, series, threshold, missing, more)


def _matching(found: Matrix, lead: Finding) -> Points:
    wanted = dict(lead.instance.labels)
    points: Points = []
    for labels, values in found:
        have = dict(labels)
        if all(have.get(k, "") == v for k, v in wanted.items()):
            points += values
    return points


async def _incident(
    backend: PrometheusBackend, lead: Finding | None, window: tuple[float, float, float]
) -> Incident | None:
    if lead is None:
        return None
    step = window[2]
    alerts = selector("ALERTS", [f'alertname="{lead.sig.alert}"', 'alertstate="firing"'])
    found: list[Points] = []
    for query in (lead.rule.expr, alerts):
        try:
            found.append(_matching(await backend.query_range(query, *window), lead))
        except PromQLError:
            found.append([])
    held, firing = (runs(points, step) for points in found)
    return Incident(lead.sig.alert, held, firing) if held or firing else None


def _target(labels: Labels) -> str:
    d = dict(labels)
    if d.get("pod"):
        return f"{d.get('namespace', '')}/{d['pod']}".lstrip("/")
    return d.get("instance") or d.get("job") or "-"


async def _quality(
    backend: PrometheusBackend,
    cfg: SiteConfig,
    scope: dict[str, str],
    window: tuple[float, float, float],
) -> Quality:
    start, end, step = window
    quality = Quality()
    narrow = [f"{k}={json.dumps(v)}" for k, v in scope.items()]
    up = selector("up", cfg.selectors.exporter, narrow)
    try:
        raw = await backend.samples(up, start, end)
    except PromQLError as err:
        quality.errors.append(f"{up}: {err}")
        raw = []
    for labels, points in raw:
        target = _target(labels)
        quality.targets.append(target)
        times = [t for t, _ in points]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        interval = statistics.median(gaps) if gaps else 0.0
        quality.scrape_gaps += [
            (target, Interval(a, b))
            for a, b in itertools.pairwise(times)
            if interval and b - a > 2.5 * interval
        ]
        quality.down += [(target, i) for i in runs([(t, v) for t, v in points if v == 0], interval)]
    success = (
        selector("inference_scrape_collector_success", cfg.selectors.sidecar, narrow) + " == 0"
    )
    try:
        failing = await backend.query_range(success, start, end, step)
    except PromQLError as err:
        quality.errors.append(f"{success}: {err}")
        failing = []
    for labels, points in failing:
        collector = dict(labels).get("collector", "?")
        quality.failing += [(_target(labels), collector, i) for i in runs(points, step)]
    return quality


async def timeline(
    backend: PrometheusBackend,
    cfg: SiteConfig,
    findings: Sequence[Finding],
    evaluated_at: float,
    span: float,
    *,
    scope: Mapping[str, str] | None = None,
) -> Timeline:
    """The window of ``span`` seconds that ends at the evaluation time, around the first of the
    ranked ``findings``; its plots narrowed to ``scope`` (target labels) where given, else to
    the first finding's target or pool."""
    end = evaluated_at
    start = end - span
    step = max(span / POINTS, 1.0)
    window = (start, end, step)
    lead = _lead(findings)
    narrowed = dict(scope) if scope is not None else _scope(cfg, lead)
    specs = PANELS + (POOL_PANELS if _pooled(lead) else ())
    panels = [await _panel(backend, cfg, spec, window, narrowed) for spec in specs]
    incident = await _incident(backend, lead, window)
    quality = await _quality(backend, cfg, narrowed, window)
    return Timeline(start, end, step, narrowed, panels, incident, quality)
