"""Declarative mapping rules and the one function that applies them.

Each engine module holds a table of :class:`Rule` (one per normalised name it can fill); this
module turns an engine's samples into :class:`~exporter.engines.snapshot.Series` with them.

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
  model label (absent label: model ``""``) and by the rule's own labels (``reason`` of
  ``inference_queue_depth_by_reason``), and aggregated per group. Counters and histograms
  are summed (Triton versions of one model, vLLM data-parallel engines, SGLang DP ranks);
  gauges are summed by default (requests waiting/running: the model's total); a rule may take
  the maximum instead (KV cache usage: the fullest engine is the one that preempts) or the
  mean (per-GPU estimates: one GPU's share whatever the number of engines).
* *Replicas*: series that differ only in a source's ``replicas`` labels report one quantity
  several times (SGLang's tensor-parallel ranks each report the same batch): one of them is
  kept, the largest (for a histogram, the one with the most observations), before summing.
* A source may take its value from labels (``value_labels``: the product of their numbers,
  for info-style series such as vLLM's ``cache_config_info``), or be a :class:`Product` of two
  gauges (blocks times tokens per block), or a :class:`CounterPair` (a duration counter over a
  request counter, as an ``+Inf``-only histogram). An ``engine_wide`` source has no model
  label: its series belong to the exposition's only model when there is exactly one.
* Histograms of one group with different bucket lists are merged on the bounds they share,
  so cumulative counts stay exact. Units are converted after aggregation (``scale`` then
  ``divisor``), which keeps e.g. Triton's integer microseconds exact in seconds.
* Non-finite values are skipped, a histogram series with a missing or non-finite ``_sum`` or
  non-finite/decreasing bucket counts is dropped, never raised.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import pairwise
from typing import Literal, TypeVar

from prometheus_client.metrics_core import Metric

from exporter.engines.snapshot import EngineSnapshot, Series, SeriesKind
from exporter.metrics import BY_NAME, CATALOGUE

MatchOp = Literal["=", "!=", "=~", "!~"]
Aggregate = Literal["sum", "max", "mean"]

#: Labels the collector sets itself; every other catalogue label of a normalised metric is
#: filled from the engine's series by the rule.
COLLECTOR_LABELS = frozenset({"engine", "model", "role", "source", "endpoint"})

#: The names an engine adapter may produce: the engine section's per-model metrics and the
#: engine-reported tokenizer latency. The exporter's own engine metrics (``inference_engine_up``
#: ..., ``inference_engine_info``) and the tokenizer probe's metrics are not in it: no engine
#: can set those.
NORMALISED: tuple[str, ...] = tuple(
    spec.name
    for spec in CATALOGUE
    if (spec.collector == "engine" and "model" in spec.labels and not spec.name.endswith("_info"))
    or spec.name == "inference_tokenizer_latency_seconds"
)

_INF = math.inf
# Where an engine-wide series goes until the exposition's only model is known.
_SOLE_MODEL = "\x00sole model"


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
    (``None``: the engine has none, model ``""``; several: the first not empty) and the unit
    conversion to base units (value x ``scale`` / ``divisor``; histograms convert bucket bounds
    and ``_sum``).

    ``replicas``: labels whose values are copies of one quantity (one series kept, the
    largest); ``value_labels``: the value is the product of these labels' numbers, not the
    sample's; ``engine_wide``: the series have no model label and belong to the exposition's
    only model; ``blank_models``: model label values that mean "no model" (``""``);
    ``fixed``: values of the rule's own labels that the source sets rather than reads (which
    of several failure counters a series came from: ``reason="expired"``); ``relabel``: the
    rule's labels read from a source label of another name (``("pool", "inference_pool")``);
    ``note``: what a
    reader of the mapping should know of this source (since when, what it means), shown in
    ``docs/engines.md`` and ``docs/metrics.md``, never read by the code.
    """

    metric: str
    matchers: tuple[LabelMatcher, ...] = ()
    model_label: str | tuple[str, ...] | None = None
    scale: float = 1.0
    divisor: float = 1.0
    replicas: tuple[str, ...] = ()
    value_labels: tuple[str, ...] = ()
    engine_wide: bool = False
    blank_models: tuple[str, ...] = ()
    fixed: tuple[tuple[str, str], ...] = ()
    relabel: tuple[tuple[str, str], ...] = ()
    note: str = ""

    @cached_property
    def plain_model(self) -> str | None:
        """The model label when reading it is all :meth:`model_of` does (the common case)."""
        if (
            isinstance(self.model_label, str)
            and not self.blank_models
            and not self.engine_wide
            and not self.fixed
        ):
            return self.model_label
        return None

    def model_of(self, labels: Mapping[str, str]) -> str:
        names = self.model_label
        if names is None:
            model = ""
        elif isinstance(names, str):
            model = labels.get(names, "")
        else:
            model = next((labels[n] for n in names if labels.get(n)), "")
        if model in self.blank_models:
            model = ""
        if not model and self.engine_wide:
            return _SOLE_MODEL
        return model


@dataclass(frozen=True)
class CounterPair:
    """A cumulative duration counter and the counter of what it timed, exposed as a histogram
    with only the ``+Inf`` bucket (Triton's ``nv_inference_*_duration_us`` with
    ``nv_inference_request_success``). Unit conversion comes from ``total``."""

    total: Source
    count: Source
    note: str = ""


@dataclass(frozen=True)
class Product:
    """A gauge that is the product of two: ``left`` aggregated as the rule says, times
    ``right`` (a per-unit factor, its largest value per model): KV blocks x tokens per
    block."""

    left: Source
    right: Source
    note: str = ""


AnySource = Source | CounterPair | Product
Alternative = tuple[AnySource, ...]


_S = TypeVar("_S", Source, CounterPair, Product)


def noted(source: _S, note: str) -> _S:
    """``source`` with a note for the reader of the mapping (see :class:`Source`)."""
    return replace(source, note=note)


@dataclass(frozen=True)
class Rule:
    """How one normalised metric is filled: alternatives tried in order. ``labels`` are the
    metric's own labels besides engine and model, taken from the sources' series; ``note``
    is for the reader of the mapping, as a source's."""

    target: str
    alternatives: tuple[Alternative, ...]
    aggregate: Aggregate = "sum"
    labels: tuple[str, ...] = ()
    note: str = ""

    @property
    def kind(self) -> SeriesKind:
        return BY_NAME[self.target].type


def rule(
    target: str,
    *alternatives: AnySource | Alternative,
    aggregate: Aggregate = "sum",
    note: str = "",
) -> Rule:
    """A :class:`Rule`; each alternative is one source or a tuple of sources to combine."""
    if target not in NORMALISED:
        raise ValueError(f"{target} is not a normalised engine metric")
    alts = tuple(a if isinstance(a, tuple) else (a,) for a in alternatives)
    labels = tuple(label for label in BY_NAME[target].labels if label not in COLLECTOR_LABELS)
    return Rule(target, alts, aggregate, labels, note)


def merge_tables(*tables: Iterable[Rule]) -> tuple[Rule, ...]:
    """One table from several: per target, the alternatives of each table in the order given
    (an engine that serves another's metrics reads them with the other's own rules)."""
    merged: dict[str, Rule] = {}
    for table in tables:
        for r in table:
            known = merged.get(r.target)
            if known is None:
                merged[r.target] = r
            elif known.aggregate != r.aggregate or known.labels != r.labels:
                raise ValueError(f"{r.target}: tables disagree on aggregation")
            else:
                merged[r.target] = Rule(
                    r.target, known.alternatives + r.alternatives, r.aggregate, r.labels, known.note
                )
    return tuple(merged.values())


def renamed(table: Iterable[Rule], rename: Callable[[str], tuple[str, ...]]) -> tuple[Rule, ...]:
    """Another engine's table under other names: each alternative once per spelling
    ``rename`` gives (in that order), every source of it renamed the same way (Ray re-exports
    ``vllm:x`` as ``ray_vllm_x``, older Ray as ``ray_vllm:x``)."""

    def one(source: AnySource, i: int) -> AnySource:
        if isinstance(source, CounterPair):
            return CounterPair(one_source(source.total, i), one_source(source.count, i))
        if isinstance(source, Product):
            return Product(one_source(source.left, i), one_source(source.right, i))
        return one_source(source, i)

    def one_source(source: Source, i: int) -> Source:
        return replace(source, metric=rename(source.metric)[i])

    out: list[Rule] = []
    for r in table:
        alternatives: list[Alternative] = []
        for alternative in r.alternatives:
            first = next(iter(source_names_of(alternative)))
            for i in range(len(rename(first))):
                alternatives.append(tuple(one(source, i) for source in alternative))
        out.append(Rule(r.target, tuple(alternatives), r.aggregate, r.labels, r.note))
    return tuple(out)


def source_names_of(alternative: Alternative) -> Iterable[str]:
    for source in alternative:
        if isinstance(source, CounterPair):
            yield from (source.total.metric, source.count.metric)
        elif isinstance(source, Product):
            yield from (source.left.metric, source.right.metric)
        else:
            yield source.metric


def source_names(rules: Iterable[Rule]) -> Iterable[str]:
    """Every metric name the rules read (for the family filter of the engine poll)."""
    for r in rules:
        for alternative in r.alternatives:
            yield from source_names_of(alternative)


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


def _sample_name(index: Container[str], metric: str) -> str:
    """The sample name a scalar source is exposed under: the name as written, else its
    ``_total`` twin (the parser renames counter samples to ``_total``; untyped ones keep the
    name they were written with). One of them only, so nothing is counted twice."""
    twin = metric[: -len("_total")] if metric.endswith("_total") else metric + "_total"
    return metric if metric in index or twin not in index else twin


# A group: (model, values of the rule's labels); a series key within it: the labels that are
# not replicas of one another.
Group = tuple[str, tuple[str, ...]]


RawRow = tuple[Labels, dict[str, str], float]


class _Samples:
    """The index with each sample name's label sets decoded once per poll, and its rows by
    the value of a label once a rule asks (several rules read one family with different
    equality matchers: TensorRT-LLM's request and KV block gauges by type)."""

    def __init__(self, index: SampleIndex) -> None:
        self.index = index
        self._decoded: dict[str, list[RawRow]] = {}
        self._by_label: dict[tuple[str, str], dict[str, list[RawRow]]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def rows(self, name: str) -> list[RawRow]:
        found = self._decoded.get(name)
        if found is None:
            series = self.index.get(name, {})
            found = self._decoded[name] = [(k, dict(k), v) for k, v in series.items()]
        return found

    def rows_with(self, name: str, label: str, value: str) -> list[RawRow]:
        """The rows whose ``label`` is ``value`` (missing: ``""``)."""
        buckets = self._by_label.get((name, label))
        if buckets is None:
            buckets = self._by_label[(name, label)] = defaultdict(list)
            for row in self.rows(name):
                buckets[row[1].get(label, "")].append(row)
        return buckets.get(value, [])


Row = tuple[Group, Labels, Labels, dict[str, str], float]


def _narrowed(
    samples: _Samples, name: str, source: Source
) -> tuple[list[RawRow], tuple[LabelMatcher, ...]]:
    """The rows of ``name`` worth trying and the matchers still to try: one equality matcher
    picks its rows from an index of the label's values."""
    matchers = source.matchers
    first = next((m for m in matchers if m.op == "=" and m.label != "le"), None)
    if first is None:
        return samples.rows(name), matchers
    rest = tuple(m for m in matchers if m is not first)
    return samples.rows_with(name, first.label, first.value), rest


def _accepted(matchers: tuple[LabelMatcher, ...], key: Labels, labels: dict[str, str]) -> bool:
    # A matcher never sees a bucket's le (it would match the model's buckets one by one).
    if "le" in labels and any(m.label == "le" for m in matchers):
        return all(m.matches({k: v for k, v in key if k != "le"}) for m in matchers)
    return all(m.matches(labels) for m in matchers)


def _rows(samples: _Samples, name: str, source: Source, keep: tuple[str, ...]) -> Iterable[Row]:
    """(group, series key, all labels, labels as a dict, value) of every series of ``name``
    the matchers accept (a bucket's ``le`` is not matched against). The dict is shared
    between rules: read it, never change it."""
    rows, matchers = _narrowed(samples, name, source)
    replicas = source.replicas
    model_of = source.model_of
    fixed = dict(source.fixed)
    read = tuple(dict(source.relabel).get(k, k) for k in keep)
    for key, labels, value in rows:
        if matchers and not _accepted(matchers, key, labels):
            continue
        kept = (
            tuple(fixed.get(k) or labels.get(r, "") for k, r in zip(keep, read, strict=True))
            if keep
            else ()
        )
        series_key = tuple(kv for kv in key if kv[0] not in replicas) if replicas else key
        yield (model_of(labels), kept), series_key, key, labels, value


def _value(source: Source, labels: Mapping[str, str]) -> float | None:
    product = 1.0
    for label in source.value_labels:
        try:
            product *= float(labels[label])
        except (KeyError, ValueError):
            return None
    return product if math.isfinite(product) else None


# --- scalar sources ------------------------------------------------------------------------------


def _combine(values: list[float], agg: Aggregate) -> float:
    if agg == "max":
        return max(values)
    total = math.fsum(values)
    return total / len(values) if agg == "mean" else total


def _scalars(
    samples: _Samples, source: Source, agg: Aggregate, keep: tuple[str, ...]
) -> dict[Group, float]:
    """Per-group aggregate of a gauge/counter source, converted to base units."""
    name = _sample_name(samples, source.metric)
    by_group: dict[Group, list[float]] = defaultdict(list)
    plain = source.plain_model
    if plain is not None and not keep and not source.replicas and not source.value_labels:
        # The common source (a model label, nothing else to work out), in one tight loop:
        # each series is distinct, none is a copy of another.
        rows, matchers = _narrowed(samples, name, source)
        for key, labels, value in rows:
            if matchers and not _accepted(matchers, key, labels):
                continue
            if value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
                by_group[(labels.get(plain, ""), ())].append(value)
    else:
        per_series: dict[Group, dict[Labels, float]] = defaultdict(dict)
        by_labels = bool(source.value_labels)
        for group, series_key, _, labels, raw in _rows(samples, name, source, keep):
            found = _value(source, labels) if by_labels else raw
            if found is None or not math.isfinite(found):
                continue
            known = per_series[group].get(series_key)
            if known is None or found > known:  # replicas: the largest copy
                per_series[group][series_key] = found
        for group, by_series in per_series.items():
            by_group[group] = list(by_series.values())
    out: dict[Group, float] = {}
    for group, values in by_group.items():
        converted = _combine(values, agg) * source.scale / source.divisor
        if math.isfinite(converted):
            out[group] = converted
    return out


def _product(samples: _Samples, product: Product, agg: Aggregate) -> dict[Group, float]:
    left = _scalars(samples, product.left, agg, ())
    right = _scalars(samples, product.right, "max", ())
    out: dict[Group, float] = {}
    for group, value in left.items():
        factor = right.get(group)
        if factor is not None and math.isfinite(value * factor):
            out[group] = value * factor
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


def _histograms(
    samples: _Samples, source: Source, keep: tuple[str, ...]
) -> dict[Group, list[_Hist]]:
    """Every valid histogram series of a source, by group, before unit conversion (of
    replicas, the one with the most observations)."""
    buckets: dict[Labels, dict[float, float]] = defaultdict(dict)
    parts: dict[Labels, dict[str, float]] = defaultdict(dict)
    groups: dict[Labels, tuple[Group, Labels]] = {}
    broken: set[Labels] = set()
    bucket_name = source.metric + "_bucket"
    for group, series_key, every, labels, value in _rows(samples, bucket_name, source, keep):
        le = labels.get("le", "")
        full = tuple(kv for kv in every if kv[0] != "le")
        key = full if series_key is every else tuple(kv for kv in series_key if kv[0] != "le")
        groups[full] = (group, key)
        bound = _bound(le)
        if bound is None:
            broken.add(full)
        else:
            buckets[full].setdefault(bound, value)
    for suffix in ("_sum", "_count"):
        for group, series_key, full, _, value in _rows(
            samples, source.metric + suffix, source, keep
        ):
            groups[full] = (group, series_key)
            parts[full][suffix] = value
    chosen: dict[Group, dict[Labels, _Hist]] = defaultdict(dict)
    for full in sorted(groups):
        if full in broken:
            continue
        hist = _one_histogram(
            dict(buckets.get(full, {})), parts[full].get("_sum"), parts[full].get("_count")
        )
        if hist is None:
            continue
        group, key = groups[full]
        known = chosen[group].get(key)
        if known is None or hist.count > known.count:
            chosen[group][key] = hist
    return {group: list(by_key.values()) for group, by_key in chosen.items()}


def _merge(hists: list[_Hist]) -> _Hist:
    """Sum of histograms on the bucket bounds all of them share (always ``+Inf``)."""
    if len(hists) == 1:
        return hists[0]
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
    if scale == 1.0 and divisor == 1.0:
        return hist
    buckets = {
        (b if b == _INF else b * scale / divisor): c for b, c in sorted(hist.buckets.items())
    }
    total = hist.sum * scale / divisor
    if not math.isfinite(total) or len(buckets) != len(hist.buckets):
        return None
    return _Hist(buckets, total, hist.count)


def _histogram_source(
    samples: _Samples, source: AnySource, keep: tuple[str, ...]
) -> dict[Group, _Hist]:
    """Per-group merged histogram of one source, in base units."""
    if isinstance(source, Product):
        return {}
    if isinstance(source, CounterPair):
        totals = _scalars(samples, source.total, "sum", keep)
        counts = _scalars(samples, source.count, "sum", keep)
        return {
            group: _Hist({_INF: counts[group]}, totals[group], counts[group])
            for group in totals
            if group in counts
        }
    out: dict[Group, _Hist] = {}
    for group, hists in _histograms(samples, source, keep).items():
        converted = _convert(_merge(hists), source.scale, source.divisor)
        if converted is not None:
            out[group] = converted
    return out


# --- rules ---------------------------------------------------------------------------------------


def _scalar_series(r: Rule, group: Group, value: float) -> Series:
    model, kept = group
    labels = tuple(zip(r.labels, kept, strict=True)) if kept else ()
    return Series(r.target, model, r.kind, value, (), 0.0, 0.0, labels)


def _apply(samples: _Samples, r: Rule) -> list[Series]:
    kind = r.kind
    for alternative in r.alternatives:
        if kind == "histogram":
            found: dict[Group, list[_Hist]] = defaultdict(list)
            for source in alternative:
                for group, hist in _histogram_source(samples, source, r.labels).items():
                    found[group].append(hist)
            if found:
                return [_histogram_series(r, group, _merge(found[group])) for group in found]
        else:
            scalars: dict[Group, list[float]] = defaultdict(list)
            for source in alternative:
                if isinstance(source, CounterPair):
                    continue
                values = (
                    _product(samples, source, r.aggregate)
                    if isinstance(source, Product)
                    else _scalars(samples, source, r.aggregate, r.labels)
                )
                for group, value in values.items():
                    scalars[group].append(value)
            if scalars:
                return [
                    _scalar_series(r, group, _combine(vals, r.aggregate))
                    for group, vals in scalars.items()
                ]
    return []


def _histogram_series(r: Rule, group: Group, hist: _Hist) -> Series:
    model, kept = group
    labels = tuple(zip(r.labels, kept, strict=True)) if kept else ()
    buckets = tuple(sorted(hist.buckets.items()))
    return Series(r.target, model, "histogram", 0.0, buckets, hist.sum, buckets[-1][1], labels)


def _settle_engine_wide(series: list[Series]) -> list[Series]:
    """Engine-wide series go to the exposition's only model (``""`` when there are several
    or none)."""
    if not any(s.model == _SOLE_MODEL for s in series):
        return series
    models = {s.model for s in series if s.model not in ("", _SOLE_MODEL)}
    sole = next(iter(models)) if len(models) == 1 else ""
    return [
        Series(s.name, sole, s.kind, s.value, s.buckets, s.sum, s.count, s.labels)
        if s.model == _SOLE_MODEL
        else s
        for s in series
    ]


def apply_rules(
    index: SampleIndex | Iterable[Metric],
    engine: str,
    rules: Iterable[Rule],
    *,
    max_series: int,
    model_alias: Callable[[SampleIndex], Mapping[str, str]] | None = None,
) -> EngineSnapshot:
    """Normalise an engine's samples (a :func:`index_samples` index, or parsed families) with
    ``rules``: at most ``max_series`` series per normalised name (groups in sorted order kept
    first); the rest are counted in ``dropped``. ``model_alias`` maps model names as some
    series spell them to the spelling the others use (Dynamo's lower-cased request metrics)."""
    if not isinstance(index, dict):
        index = index_samples(index)
    found: list[Series] = []
    samples = _Samples(index)
    for r in rules:
        found.extend(_apply(samples, r))
    if model_alias is not None:
        aliases = model_alias(index)
        if aliases:
            found = [
                Series(
                    s.name,
                    aliases.get(s.model, s.model),
                    s.kind,
                    s.value,
                    s.buckets,
                    s.sum,
                    s.count,
                    s.labels,
                )
                for s in found
            ]
    found = _settle_engine_wide(found)
    snapshot = EngineSnapshot(engine=engine, dropped=Counter())
    by_name: dict[str, list[Series]] = defaultdict(list)
    for s in found:
        by_name[s.name].append(s)
    for name, series in by_name.items():
        series.sort(key=lambda s: (s.model, s.labels))
        if len(series) > max_series:
            snapshot.dropped[name] += len(series) - max(max_series, 0)
        snapshot.series.extend(series[: max(max_series, 0)])
    return snapshot
