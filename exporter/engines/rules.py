"""Declarative mapping rules and the one function that applies them.

Each engine module holds a table of :class:`Rule` (one per normalised name it can fill); this
module turns parsed families into :class:`~exporter.engines.model.Series` with them.

How a rule is applied:

* Samples are looked up by *sample* name, not family name, so a counter is found whether the
  engine wrote ``# TYPE x counter`` + ``x`` (Triton, TGI, llama.cpp) or ``# TYPE x_total
  counter`` + ``x_total`` (prometheus_client), and with or without a ``# TYPE`` line at all.
  A histogram source reads ``<name>_bucket``, ``<name>_sum`` and ``<name>_count``; a summary
  (no buckets) becomes a histogram with only the ``+Inf`` bucket.
* A rule lists *alternatives*, tried in order: the first with at least one usable series wins
  and the others are ignored. That is how deprecated names are supported without counting a
  value twice while an engine exports both the old and the new name.
* Every source of the winning alternative contributes: values are grouped by the source's
  model label (absent label: model ``""``) and aggregated per model. Counters and histograms
  are summed (Triton versions of one model, vLLM data-parallel engines, SGLang DP ranks);
  gauges are summed by default (requests waiting/running: the model's total) and a rule may
  take the maximum instead (KV cache usage: the fullest engine is the one that preempts).
* Histograms of one model with different bucket lists are merged on the bounds they share,
  so cumulative counts stay exact. Units are converted after aggregation (``scale`` then
  ``divisor``), which keeps e.g. Triton's integer microseconds exact in seconds.
* Non-finite values are skipped, a histogram series with a missing or non-finite ``_sum`` or
  non-finite/decreasing bucket counts is dropped, never raised.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

from prometheus_client.metrics_core import Metric

from exporter.engines.model import EngineSnapshot, Series, SeriesKind
from exporter.metrics import BY_NAME, CATALOGUE

MatchOp = Literal["=", "!=", "=~", "!~"]
Aggregate = Literal["sum", "max"]

#: The names an engine adapter may produce: the engine section's per-model metrics and the
#: engine-reported tokenizer latency. The exporter's own engine metrics (``inference_engine_up``
#: ...) and the tokenizer probe's metrics are not in it: no engine can set those.
NORMALISED: tuple[str, ...] = tuple(
    spec.name
    for spec in CATALOGUE
    if (spec.collector == "engine" and "model" in spec.labels)
    or spec.name == "inference_tokenizer_latency_seconds"
)

_INF = math.inf


@dataclass(frozen=True)
class LabelMatcher:
    """One PromQL-style label matcher; a missing label matches as ``""``. Regexes are
    anchored (full match), as in Prometheus."""

    label: str
    op: MatchOp
    value: str
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            object.__setattr__(self, "_regex", re.compile(self.value))

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.label, "")
        if self._regex is not None:
            return (self._regex.fullmatch(got) is not None) == (self.op == "=~")
        return (got == self.value) == (self.op == "=")


@dataclass(frozen=True)
class Source:
    """One source metric: its exposed name, label matchers, the label that carries the model
    (``None``: the engine has none, model ``""``) and the unit conversion to base units
    (value x ``scale`` / ``divisor``; histograms convert bucket bounds and ``_sum``)."""

    metric: str
    matchers: tuple[LabelMatcher, ...] = ()
    model_label: str | None = None
    scale: float = 1.0
    divisor: float = 1.0


@dataclass(frozen=True)
class CounterPair:
    """A cumulative duration counter and the counter of what it timed, exposed as a histogram
    with only the ``+Inf`` bucket (Triton's ``nv_inference_*_duration_us`` with
    ``nv_inference_request_success``). Unit conversion comes from ``total``."""

    total: Source
    count: Source


Alternative = tuple[Source | CounterPair, ...]


@dataclass(frozen=True)
class Rule:
    """How one normalised metric is filled: alternatives tried in order."""

    target: str
    alternatives: tuple[Alternative, ...]
    aggregate: Aggregate = "sum"

    @property
    def kind(self) -> SeriesKind:
        return BY_NAME[self.target].type


def rule(
    target: str, *alternatives: Source | CounterPair | Alternative, aggregate: Aggregate = "sum"
) -> Rule:
    """A :class:`Rule`; each alternative is one source or a tuple of sources to combine."""
    if target not in NORMALISED:
        raise ValueError(f"{target} is not a normalised engine metric")
    alts = tuple(a if isinstance(a, tuple) else (a,) for a in alternatives)
    return Rule(target, alts, aggregate)


# --- sample index ------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]
SampleIndex = dict[str, dict[Labels, float]]


def index_samples(families: Iterable[Metric]) -> SampleIndex:
    """Sample name -> label set -> value, first occurrence of a duplicated series kept."""
    index: SampleIndex = defaultdict(dict)
    for family in families:
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            index[sample.name].setdefault(key, float(sample.value))
    return index


def _sample_name(index: SampleIndex, metric: str) -> str:
    """The sample name a scalar source is exposed under: the name as written, else its
    ``_total`` twin (the parser renames counter samples to ``_total``; untyped ones keep the
    name they were written with). One of them only, so nothing is counted twice."""
    twin = metric[: -len("_total")] if metric.endswith("_total") else metric + "_total"
    return metric if metric in index or twin not in index else twin


def _selected(
    index: SampleIndex, name: str, source: Source
) -> Iterable[tuple[str, dict[str, str], float]]:
    """(model, labels, value) of every series of ``name`` the matchers accept (a bucket's
    ``le`` is not matched against), in a deterministic order."""
    for key, value in sorted(index.get(name, {}).items()):
        labels = dict(key)
        matched = {k: v for k, v in key if k != "le"}
        if all(m.matches(matched) for m in source.matchers):
            model = labels.get(source.model_label, "") if source.model_label else ""
            yield model, labels, value


# --- scalar sources ------------------------------------------------------------------------------


def _scalars(index: SampleIndex, source: Source, agg: Aggregate) -> dict[str, float]:
    """Per-model aggregate of a gauge/counter source, converted to base units."""
    values: dict[str, list[float]] = defaultdict(list)
    for model, _, value in _selected(index, _sample_name(index, source.metric), source):
        if math.isfinite(value):
            values[model].append(value)
    out: dict[str, float] = {}
    for model, vals in values.items():
        total = max(vals) if agg == "max" else math.fsum(vals)
        converted = total * source.scale / source.divisor
        if math.isfinite(converted):
            out[model] = converted
    return out


# --- histogram sources ---------------------------------------------------------------------------


@dataclass
class _Hist:
    buckets: dict[float, float]
    sum: float
    count: float


def _bound(text: str) -> float | None:
    try:
        bound = float(text)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def _one_histogram(
    buckets: dict[float, float], total: float | None, count: float | None
) -> _Hist | None:
    """A validated cumulative histogram, or None when it cannot be trusted."""
    if total is None or not math.isfinite(total):
        return None
    if _INF not in buckets:
        if count is None:
            return None
        buckets[_INF] = count
    bounds = sorted(buckets)
    counts = [buckets[b] for b in bounds]
    if not all(math.isfinite(c) and c >= 0 for c in counts):
        return None
    if any(b < a for a, b in pairwise(counts)):
        return None
    return _Hist(dict(zip(bounds, counts, strict=True)), total, counts[-1])


def _histograms(index: SampleIndex, source: Source) -> dict[str, list[_Hist]]:
    """Every valid histogram series of a source, by model, before unit conversion."""
    buckets: dict[Labels, dict[float, float]] = defaultdict(dict)
    parts: dict[Labels, dict[str, float]] = defaultdict(dict)
    models: dict[Labels, str] = {}
    broken: set[Labels] = set()
    for model, labels, value in _selected(index, source.metric + "_bucket", source):
        le = labels.pop("le", "")
        group = tuple(sorted(labels.items()))
        models[group] = model
        bound = _bound(le)
        if bound is None:
            broken.add(group)
        else:
            buckets[group].setdefault(bound, value)
    for suffix in ("_sum", "_count"):
        for model, labels, value in _selected(index, source.metric + suffix, source):
            group = tuple(sorted(labels.items()))
            models[group] = model
            parts[group][suffix] = value
    out: dict[str, list[_Hist]] = defaultdict(list)
    for group in sorted(models):
        if group in broken:
            continue
        hist = _one_histogram(
            dict(buckets.get(group, {})), parts[group].get("_sum"), parts[group].get("_count")
        )
        if hist is not None:
            out[models[group]].append(hist)
    return out


def _merge(hists: list[_Hist]) -> _Hist:
    """Sum of histograms on the bucket bounds all of them share (always ``+Inf``)."""
    shared = set(hists[0].buckets)
    for h in hists[1:]:
        shared &= set(h.buckets)
    bounds = sorted(shared)
    return _Hist(
        {b: math.fsum(h.buckets[b] for h in hists) for b in bounds},
        math.fsum(h.sum for h in hists),
        math.fsum(h.count for h in hists),
    )


def _convert(hist: _Hist, scale: float, divisor: float) -> _Hist | None:
    buckets = {
        (b if b == _INF else b * scale / divisor): c for b, c in sorted(hist.buckets.items())
    }
    total = hist.sum * scale / divisor
    if not math.isfinite(total) or len(buckets) != len(hist.buckets):
        return None
    return _Hist(buckets, total, hist.count)


def _histogram_source(index: SampleIndex, source: Source | CounterPair) -> dict[str, _Hist]:
    """Per-model merged histogram of one source, in base units."""
    if isinstance(source, CounterPair):
        totals = _scalars(index, source.total, "sum")
        counts = _scalars(index, source.count, "sum")
        return {
            model: _Hist({_INF: counts[model]}, totals[model], counts[model])
            for model in totals
            if model in counts
        }
    out: dict[str, _Hist] = {}
    for model, hists in _histograms(index, source).items():
        converted = _convert(_merge(hists), source.scale, source.divisor)
        if converted is not None:
            out[model] = converted
    return out


# --- rules ---------------------------------------------------------------------------------------


def _apply(index: SampleIndex, r: Rule) -> list[Series]:
    kind = r.kind
    for alternative in r.alternatives:
        if kind == "histogram":
            found: dict[str, list[_Hist]] = defaultdict(list)
            for source in alternative:
                for model, hist in _histogram_source(index, source).items():
                    found[model].append(hist)
            if found:
                return [_histogram_series(r.target, model, _merge(found[model])) for model in found]
        else:
            scalars: dict[str, list[float]] = defaultdict(list)
            for source in alternative:
                if isinstance(source, CounterPair):
                    continue
                for model, value in _scalars(index, source, r.aggregate).items():
                    scalars[model].append(value)
            if scalars:
                return [
                    Series(
                        r.target,
                        model,
                        kind,
                        value=max(vals) if r.aggregate == "max" else math.fsum(vals),
                    )
                    for model, vals in scalars.items()
                ]
    return []


def _histogram_series(name: str, model: str, hist: _Hist) -> Series:
    buckets = tuple(sorted(hist.buckets.items()))
    return Series(name, model, "histogram", buckets=buckets, sum=hist.sum, count=buckets[-1][1])


def apply_rules(
    families: Iterable[Metric], engine: str, rules: Iterable[Rule], *, max_series: int
) -> EngineSnapshot:
    """Normalise ``families`` with ``rules``: at most ``max_series`` series per normalised
    name (models in sorted order kept first); the rest are counted in ``dropped``."""
    index = index_samples(families)
    snapshot = EngineSnapshot(engine=engine, dropped=Counter())
    for r in rules:
        series = sorted(_apply(index, r), key=lambda s: s.model)
        if len(series) > max_series:
            snapshot.dropped[r.target] += len(series) - max(max_series, 0)
            series = series[: max(max_series, 0)]
        snapshot.series.extend(series)
    return snapshot
