"""A small PromQL evaluator: the rule pack's subset, over a few scrapes of one target.

``diagnose --target`` has no Prometheus: it samples the sidecar's ``/metrics`` a few times
and evaluates the pack's own recording rules and alert expressions here, so its verdict
follows the catalogue and the site config. The arithmetic is Prometheus 2.x's (extrapolated
``rate``/``increase``, Kahan-summed ``avg_over_time`` and ``deriv``, ``histogram_quantile``'s
bucket handling, NaN and infinities as Go's float64 gives them, vector matching's result
labels), over sample times in whole milliseconds as Prometheus stores them. What differs,
on purpose:

- every range selector covers all the samples taken, whatever duration it names: the window
  is the sampling span, from the first scrape to the last, and the evaluation time is the
  last scrape. For a series present in every scrape ``rate()`` is then the plain increase
  (counter resets counted) over the span; one that appears or vanishes while sampling is
  extrapolated towards the span's edges as Prometheus would;
- an instant selector reads the last scrape (a series missing from it is stale). ``offset``
  reads the first scrape, unless the caller says the offset reaches further back than
  samples can (the 1h baseline of the HBM signature): then :class:`NeedsHistoryError` is
  raised;
- matchers on target labels (which Prometheus attaches; the sidecar never exposes them) are
  ignored, and ``up`` is 1: the target answered.

``tests/diagnose/test_promql_vs_prometheus.py`` holds this to a real Prometheus: every
recording rule, alert expression, sub-expression and evidence query of the pack (and the
rest of the subset) on the same samples, with every window set to the sampling span.

The syntax tree comes from :mod:`exporter.diagnose.promql_syntax`. Nothing here does I/O.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.config import format_duration
from exporter.diagnose.promql_syntax import (
    COMPARISONS,
    SET_OPS,
    Aggregate,
    Binary,
    Call,
    Matcher,
    Negate,
    Node,
    Num,
    Paren,
    PromQLError,
    Range,
    Selector,
    Str,
    parse,
    unparen,
)

Labels = tuple[tuple[str, str], ...]
NAME = "__name__"


class NeedsHistoryError(Exception):
    """The expression needs samples older than the ones taken."""


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float

    def get(self, name: str) -> str:
        for key, value in self.labels:
            if key == name:
                return value
        return ""

    def without_name(self) -> Labels:
        return tuple(item for item in self.labels if item[0] != NAME)


Vector = list[Sample]
Value = float | Vector
Point = tuple[int, float]  # milliseconds since the epoch, value


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in mapping.items() if v != ""))


@dataclass
class Scrape:
    """One read of the target: Unix time and every sample (``__name__`` among the labels)."""

    time: float
    samples: dict[Labels, float]
    _by_name: dict[str | None, list[tuple[Labels, float]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def named(self, name: str | None) -> Iterable[tuple[Labels, float]]:
        """The samples of the metric ``name`` (every sample for ``None``); a selector reads
        one metric of hundreds, and a rule pack evaluates thousands of selectors."""
        if name is None:
            return self.samples.items()
        if self._by_name is None:
            index: dict[str | None, list[tuple[Labels, float]]] = defaultdict(list)
            for labels, value in self.samples.items():
                index[dict(labels).get(NAME)].append((labels, value))
            self._by_name = dict(index)
        return self._by_name.get(name, ())


@dataclass
class Evaluator:
    """Evaluates expressions over ``scrapes`` (oldest first) of one target.

    ``records`` holds recording-rule results by name (``None``: the rule needed history);
    ``ignored_labels`` are target labels whose matchers do not apply; ``needs_history(s)``
    says whether an ``offset`` of ``s`` seconds reaches beyond the samples.
    """

    scrapes: Sequence[Scrape]
    ignored_labels: frozenset[str] = frozenset()
    needs_history: Callable[[float], bool] = lambda seconds: False
    records: dict[str, Vector | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.scrapes:
            raise ValueError("no scrapes to evaluate")
        # Whole milliseconds, as Prometheus stores sample times: differences of float Unix
        # times would be off by up to 2.4e-7 s, a relative 4e-9 in a rate over a minute.
        self._ms = [round(scrape.time * 1000) for scrape in self.scrapes]

    @property
    def span(self) -> float:
        return (self._ms[-1] - self._ms[0]) / 1000

    def record(self, name: str, expr: str) -> None:
        """Evaluate a recording rule and keep its result under ``name``."""
        try:
            value = self.eval(parse(expr))
        except NeedsHistoryError:
            self.records[name] = None
            return
        if not isinstance(value, list):
            raise PromQLError(f"recording rule {name} is not a vector")
        self.records[name] = [
            Sample(tuple(sorted((*s.without_name(), (NAME, name)))), s.value) for s in value
        ]

    def eval(self, node: Node) -> Value:
        if isinstance(node, Num):
            return node.value
        if isinstance(node, Paren):
            return self.eval(node.expr)
        if isinstance(node, Negate):
            value = self.eval(node.expr)
            if isinstance(value, float):
                return -value
            return [Sample(s.without_name(), -s.value) for s in value]
        if isinstance(node, Selector):
            return self.instant(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, Aggregate):
            return self.aggregate(node)
        if isinstance(node, Binary):
            return self.binary(node)
        raise PromQLError(f"cannot evaluate {type(node).__name__} here")

    # selectors

    def _matching(self, matchers: Iterable[Matcher], labels: Labels) -> bool:
        values = dict(labels)
        return all(
            m.matches(values.get(m.label, ""))
            for m in matchers
            if m.label not in self.ignored_labels
        )

    def instant(self, sel: Selector) -> Vector:
        if sel.offset and self.needs_history(sel.offset):
            raise NeedsHistoryError(f"offset {format_duration(sel.offset)}")
        name = sel.name
        if name is not None and name in self.records:
            if sel.offset:
                raise NeedsHistoryError(f"an earlier value of {name}")
            stored = self.records[name]
            if stored is None:
                raise NeedsHistoryError(f"{name} needs history")
            return [s for s in stored if self._matching(sel.matchers, s.labels)]
        if name == "up":
            up = [Sample(((NAME, "up"),), 1.0)]
            return [s for s in up if self._matching(sel.matchers, s.labels)]
        scrape = self.scrapes[0] if sel.offset else self.scrapes[-1]
        return [
            Sample(labels, value)
            for labels, value in scrape.named(sel.name)
            if self._selected(sel, labels)
        ]

    def _selected(self, sel: Selector, labels: Labels) -> bool:
        if sel.name is not None and dict(labels).get(NAME) != sel.name:
            return False
        return self._matching(sel.matchers, labels)

    def series(self, rng: Range) -> dict[Labels, list[Point]]:
        """Every sample of the selected series, whatever the range says: the window is the
        sampling span."""
        sel = rng.selector
        if sel.name is not None and sel.name in self.records:
            raise NeedsHistoryError(f"a range of the recording rule {sel.name}")
        if sel.offset and self.needs_history(sel.offset):
            raise NeedsHistoryError(f"offset {format_duration(sel.offset)}")
        out: dict[Labels, list[Point]] = defaultdict(list)
        for ms, scrape in zip(self._ms, self.scrapes, strict=True):
            for labels, value in scrape.named(sel.name):
                if self._selected(sel, labels):
                    out[labels].append((ms, value))
        return out

    # functions

    def call(self, node: Call) -> Value:
        func, args = node.func, node.args
        if func in _RANGE_FUNCTIONS:
            if len(args) != 1 or not isinstance(unparen(args[0]), Range):
                raise PromQLError(f"{func}() needs a range selector")
            rng = unparen(args[0])
            assert isinstance(rng, Range)
            window = Window(self._ms[0], self._ms[-1])
            out: Vector = []
            # Prometheus 2.x keeps the metric name through last_over_time alone.
            keep_name = func == "last_over_time"
            for labels, points in self.series(rng).items():
                value = _RANGE_FUNCTIONS[func](points, window)
                if value is not None:
                    out.append(Sample(labels if keep_name else _drop_name(labels), value))
            return out
        if func == "histogram_quantile":
            quantile = self._scalar(args[0])
            return histogram_quantile(quantile, self._vector(args[1]))
        if func == "clamp":
            vector = self._vector(args[0])
            lo, hi = self._scalar(args[1]), self._scalar(args[2])
            if hi < lo:
                return []
            return [Sample(s.without_name(), _go_max(lo, _go_min(hi, s.value))) for s in vector]
        if func in {"clamp_min", "clamp_max"}:
            vector, bound = self._vector(args[0]), self._scalar(args[1])
            clamp = _go_max if func == "clamp_min" else _go_min
            return [Sample(s.without_name(), clamp(bound, s.value)) for s in vector]
        if func in _ELEMENTWISE:
            fn = _ELEMENTWISE[func]
            return [Sample(s.without_name(), fn(s.value)) for s in self._vector(args[0])]
        if func == "absent":
            if self._vector(args[0]):
                return []
            arg = unparen(args[0])
            equal = (
                {m.label: m.value for m in arg.matchers if m.op == "=" and m.label != NAME}
                if isinstance(arg, Selector)
                else {}
            )
            return [Sample(labels_of(equal), 1.0)]
        if func == "label_replace":
            return self._label_replace(args)
        raise PromQLError(f"function {func}() is not supported")

    def _label_replace(self, args: Sequence[Node]) -> Vector:
        vector = self._vector(args[0])
        dst, repl, src, regex = (self._string(a) for a in args[1:5])
        pattern = re.compile(regex)
        template = re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", repl)
        out: Vector = []
        for sample in vector:
            match = pattern.fullmatch(sample.get(src))
            if match is None:
                out.append(sample)
                continue
            values = dict(sample.labels)
            values[dst] = match.expand(template)
            out.append(Sample(labels_of(values), sample.value))
        return out

    def _string(self, node: Node) -> str:
        if not isinstance(node, Str):
            raise PromQLError("expected a string argument")
        return node.value

    def _scalar(self, node: Node) -> float:
        value = self.eval(node)
        if not isinstance(value, float):
            raise PromQLError("expected a scalar")
        return value

    def _vector(self, node: Node) -> Vector:
        value = self.eval(node)
        if isinstance(value, float):
            raise PromQLError("expected an instant vector")
        return value

    # aggregation

    def aggregate(self, node: Aggregate) -> Vector:
        groups: dict[Labels, list[float]] = defaultdict(list)
        for sample in self._vector(node.arg):
            groups[_group_key(sample.labels, node.grouping, node.without)].append(sample.value)
        fn = _AGGREGATIONS[node.op]
        return [Sample(key, fn(values)) for key, values in groups.items()]

    # binary operators

    def binary(self, node: Binary) -> Value:
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        op = node.op
        if op in SET_OPS:
            if isinstance(lhs, float) or isinstance(rhs, float):
                raise PromQLError(f"{op} needs two vectors")
            return set_operation(node, lhs, rhs)
        if isinstance(lhs, float) and isinstance(rhs, float):
            if op in COMPARISONS:
                if not node.bool_:
                    raise PromQLError("comparisons between scalars must use the bool modifier")
                return 1.0 if compare(op, lhs, rhs) else 0.0
            return arithmetic(op, lhs, rhs)
        if isinstance(lhs, float) or isinstance(rhs, float):
            return self._with_scalar(node, lhs, rhs)
        return vector_binary(node, lhs, rhs)

    def _with_scalar(self, node: Node, lhs: Value, rhs: Value) -> Vector:
        assert isinstance(node, Binary)
        op = node.op
        vector, scalar_left = (rhs, True) if isinstance(lhs, float) else (lhs, False)
        assert isinstance(vector, list)
        scalar = lhs if scalar_left else rhs
        assert isinstance(scalar, float)
        out: Vector = []
        for sample in vector:
            left, right = (scalar, sample.value) if scalar_left else (sample.value, scalar)
            if op in COMPARISONS:
                hit = compare(op, left, right)
                if node.bool_:
                    out.append(Sample(sample.without_name(), 1.0 if hit else 0.0))
                elif hit:
                    out.append(sample)
            else:
                out.append(Sample(sample.without_name(), arithmetic(op, left, right)))
        return out


def _drop_name(labels: Labels) -> Labels:
    return tuple(item for item in labels if item[0] != NAME)


def _group_key(labels: Labels, grouping: tuple[str, ...] | None, without: bool) -> Labels:
    if grouping is None:
        return ()
    if without:
        return tuple(item for item in labels if item[0] not in grouping and item[0] != NAME)
    return tuple(item for item in labels if item[0] in grouping)


def match_key(labels: Labels, on: tuple[str, ...] | None, ignoring: tuple[str, ...] = ()) -> Labels:
    """The labels two samples must share to match (``on``/``ignoring``, never the name)."""
    if on is not None:
        return tuple(item for item in labels if item[0] in on)
    return tuple(item for item in labels if item[0] != NAME and item[0] not in ignoring)


def compare(op: str, left: float, right: float) -> bool:
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == ">":
        return left > right
    if op == "<":
        return left < right
    if op == ">=":
        return left >= right
    return left <= right


def arithmetic(op: str, left: float, right: float) -> float:
    """``left op right`` as Go's float64 (IEEE 754) arithmetic gives it: no exceptions."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        return _divide(left, right)
    if op == "%":
        return _mod(left, right)
    return _pow(left, right)


def _divide(dividend: float, divisor: float) -> float:
    if divisor != 0:
        return dividend / divisor
    if dividend == 0 or math.isnan(dividend):
        return math.nan
    return math.copysign(math.inf, dividend) * math.copysign(1.0, divisor)


def _mod(dividend: float, divisor: float) -> float:
    """Go's ``math.Mod``: NaN for an infinite dividend or a zero divisor, the dividend for an
    infinite divisor."""
    if math.isnan(dividend) or math.isnan(divisor) or math.isinf(dividend) or divisor == 0:
        return math.nan
    if math.isinf(divisor):
        return dividend
    return math.fmod(dividend, divisor)


def _pow(base: float, exponent: float) -> float:
    """Go's ``math.Pow``: NaN for a negative base and a fractional exponent, infinities on
    overflow."""
    try:
        return math.pow(base, exponent)
    except ValueError:
        if base == 0:  # 0 ** negative: an infinity with the base's sign for odd integer exponents
            odd = exponent == math.floor(exponent) and math.fmod(exponent, 2) != 0
            return math.copysign(math.inf, base) if odd else math.inf
        return math.nan
    except OverflowError:
        odd = exponent == math.floor(exponent) and math.fmod(exponent, 2) != 0
        return -math.inf if base < 0 and odd else math.inf


def set_operation(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    keys = {match_key(s.labels, node.on, node.ignoring) for s in rhs}
    if node.op == "and":
        return [s for s in lhs if match_key(s.labels, node.on, node.ignoring) in keys]
    if node.op == "unless":
        return [s for s in lhs if match_key(s.labels, node.on, node.ignoring) not in keys]
    left = {match_key(s.labels, node.on, node.ignoring) for s in lhs}
    return lhs + [s for s in rhs if match_key(s.labels, node.on, node.ignoring) not in left]


def _result_labels(node: Binary, many: Labels, one: Labels) -> Labels:
    """The labels of one result of a vector-vector operation (Prometheus' ``resultMetric``)."""
    values = dict(many)
    if node.op not in COMPARISONS:
        values.pop(NAME, None)
    if node.group is None:
        if node.on is not None:
            values = {k: v for k, v in values.items() if k in node.on}
        else:
            for name in node.ignoring:
                values.pop(name, None)
    for name in node.include:
        values[name] = dict(one).get(name, "")
    if node.bool_:
        values.pop(NAME, None)
    return labels_of(values)


def vector_binary(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """Arithmetic or comparison between two vectors, with PromQL's label matching."""
    if not lhs or not rhs:
        return []
    # The "many" side is walked, the "one" side looked up (for one-to-one, the right side).
    many, one = (rhs, lhs) if node.group == "right" else (lhs, rhs)
    index: dict[Labels, Sample] = {}
    for sample in one:
        key = match_key(sample.labels, node.on, node.ignoring)
        if key in index:
            raise PromQLError("many-to-many matching: the 'one' side has duplicate series")
        index[key] = sample
    out: Vector = []
    matched: dict[Labels, set[Labels]] = {}
    for sample in many:
        key = match_key(sample.labels, node.on, node.ignoring)
        other = index.get(key)
        if other is None:
            continue
        left, right = (
            (other.value, sample.value) if node.group == "right" else (sample.value, other.value)
        )
        if node.op in COMPARISONS:
            hit = compare(node.op, left, right)
            if not hit and not node.bool_:
                continue
            # A filter keeps the left operand's value, whichever side is the "many" one.
            value = (1.0 if hit else 0.0) if node.bool_ else left
        else:
            value = arithmetic(node.op, left, right)
        labels = _result_labels(node, sample.labels, other.labels)
        if node.group is None:
            if key in matched:
                raise PromQLError("multiple matches for labels: use group_left or group_right")
            matched[key] = set()
        elif labels in matched.setdefault(key, set()):
            raise PromQLError("multiple matches for labels: grouping labels must be unique")
        else:
            matched[key].add(labels)
        out.append(Sample(labels, value))
    return out


def histogram_quantile(quantile: float, buckets: Vector) -> Vector:
    """Prometheus' ``histogram_quantile`` over classic buckets (``le`` labels)."""
    groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
    for sample in buckets:
        try:
            bound = float(sample.get("le"))
        except ValueError:
            continue  # no bucket label, or not a number: Prometheus skips the sample too
        # Grouped with the name, which the result drops.
        groups[tuple(item for item in sample.labels if item[0] != "le")].append(
            (bound, sample.value)
        )
    out: Vector = []
    for key, points in groups.items():
        labels = _drop_name(key)
        if any(s.labels == labels for s in out):
            raise PromQLError("histogram_quantile: duplicate series after dropping the name")
        out.append(Sample(labels, bucket_quantile(quantile, points)))
    return out


def _search(count: int, found: Callable[[int], bool]) -> int:
    """Go's ``sort.Search``: the binary search Prometheus uses, also where ``found`` is not
    monotonic (a NaN count)."""
    low, high = 0, count
    while low < high:
        middle = (low + high) // 2
        if not found(middle):
            low = middle + 1
        else:
            high = middle
    return low


def bucket_quantile(quantile: float, points: list[tuple[float, float]]) -> float:
    if math.isnan(quantile):
        return math.nan
    if quantile < 0:
        return -math.inf
    if quantile > 1:
        return math.inf
    ordered = sorted(points, key=lambda point: point[0])
    if not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan
    # Buckets with the same bound add up (``0.1`` and ``0.10``).
    fixed: list[list[float]] = []
    for bound, count in ordered:
        if fixed and fixed[-1][0] == bound:
            fixed[-1][1] += count
        else:
            fixed.append([bound, count])
    # Counts must not fall with the bound (a scrape between two bucket updates); a NaN count
    # stays NaN, as in Prometheus.
    top = fixed[0][1]
    for bucket in fixed[1:]:
        if bucket[1] > top:
            top = bucket[1]
        elif bucket[1] < top:
            bucket[1] = top
    if len(fixed) < 2:
        return math.nan
    total = fixed[-1][1]
    if total == 0:
        return math.nan
    rank = quantile * total
    index = _search(len(fixed) - 1, lambda bucket: fixed[bucket][1] >= rank)
    if index == len(fixed) - 1:
        return fixed[-2][0]
    if index == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start, end, count = 0.0, fixed[index][0], fixed[index][1]
    if index > 0:
        start = fixed[index - 1][0]
        count -= fixed[index - 1][1]
        rank -= fixed[index - 1][1]
    return start + (end - start) * _divide(rank, count)


# --- range functions: Prometheus 2.x's arithmetic, over a window that is the sampling span ---


@dataclass(frozen=True)
class Window:
    """The range a range selector covers, in milliseconds: the first to the last scrape."""

    start: int
    end: int


def _kahan(inc: float, total: float, compensation: float) -> tuple[float, float]:
    """One step of Kahan-Babuska summation, as Prometheus' ``kahanSumInc``."""
    summed = total + inc
    if abs(total) >= abs(inc):
        compensation += (total - summed) + inc
    else:
        compensation += (inc - summed) + total
    return summed, compensation


def _extrapolated(points: list[Point], window: Window, *, rate: bool) -> float | None:
    """Prometheus' ``extrapolatedRate`` for a counter: the increase (counter resets counted)
    extrapolated towards the window's edges where the first or last sample lies within
    1.1 average intervals of them, by half an interval where it does not (a series that
    appeared or vanished while sampling), never below the counter's zero."""
    if len(points) < 2 or window.end <= window.start:
        return None
    (first_t, first), (last_t, last) = points[0], points[-1]
    result = last - first
    for (_, before), (_, after) in itertools.pairwise(points):
        if after < before:
            result += before  # a counter reset: count what it had reached
    to_start = (first_t - window.start) / 1000
    to_end = (window.end - last_t) / 1000
    sampled = (last_t - first_t) / 1000
    average = sampled / (len(points) - 1)
    if result > 0 and first >= 0:
        to_start = min(to_start, sampled * (first / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = _divide(interval, sampled)
    if rate:
        factor /= (window.end - window.start) / 1000
    return result * factor


def _increase(points: list[Point], window: Window) -> float | None:
    return _extrapolated(points, window, rate=False)


def _rate(points: list[Point], window: Window) -> float | None:
    return _extrapolated(points, window, rate=True)


def _deriv(points: list[Point], window: Window) -> float | None:
    """The least-squares slope per second, as Prometheus' ``linearRegression``."""
    if len(points) < 2:
        return None
    t0, first = points[0]
    count = sum_x = c_x = sum_y = c_y = sum_xy = c_xy = sum_x2 = c_x2 = 0.0
    constant = True
    for stamp, value in points:
        constant = constant and value == first
        count += 1.0
        seconds = (stamp - t0) / 1e3
        sum_x, c_x = _kahan(seconds, sum_x, c_x)
        sum_y, c_y = _kahan(value, sum_y, c_y)
        sum_xy, c_xy = _kahan(seconds * value, sum_xy, c_xy)
        sum_x2, c_x2 = _kahan(seconds * seconds, sum_x2, c_x2)
    if constant:
        return math.nan if math.isinf(first) else 0.0
    sum_x, sum_y, sum_xy, sum_x2 = sum_x + c_x, sum_y + c_y, sum_xy + c_xy, sum_x2 + c_x2
    cov_xy = sum_xy - sum_x * sum_y / count
    var_x = sum_x2 - sum_x * sum_x / count
    return _divide(cov_xy, var_x)


def _mean(values: Iterable[float], *, kahan: bool) -> float:
    """Prometheus' running mean (``avg_over_time`` compensates it, ``avg`` does not); an
    infinite mean stays infinite unless the other infinity or a NaN comes along."""
    mean = compensation = count = 0.0
    for value in values:
        count += 1
        if math.isinf(mean):
            if math.isinf(value) and (mean > 0) == (value > 0):
                continue
            if not math.isinf(value) and not math.isnan(value):
                continue
        step = value / count - mean / count
        if kahan:
            mean, compensation = _kahan(step, mean, compensation)
        else:
            mean += step
    return mean if math.isinf(mean) else mean + compensation


def _avg(points: list[Point], window: Window) -> float | None:
    return _mean((v for _, v in points), kahan=True) if points else None


def _changes(points: list[Point], window: Window) -> float | None:
    if not points:
        return None
    changed = (
        a != b and not (math.isnan(a) and math.isnan(b))
        for (_, a), (_, b) in itertools.pairwise(points)
    )
    return float(sum(changed))


def _max_over(points: list[Point], window: Window) -> float | None:
    if not points:
        return None
    top = points[0][1]
    for _, value in points:
        if value > top or math.isnan(top):
            top = value
    return top


def _last(points: list[Point], window: Window) -> float | None:
    """The newest sample in the window (the pack reads a fact or a state as last scraped)."""
    return points[-1][1] if points else None


_RANGE_FUNCTIONS: dict[str, Callable[[list[Point], Window], float | None]] = {
    "rate": _rate,
    "increase": _increase,
    "deriv": _deriv,
    "avg_over_time": _avg,
    "max_over_time": _max_over,
    "last_over_time": _last,
    "changes": _changes,
}


def _floor(value: float) -> float:
    return float(math.floor(value)) if math.isfinite(value) else value


def _ceil(value: float) -> float:
    return float(math.ceil(value)) if math.isfinite(value) else value


_ELEMENTWISE: dict[str, Callable[[float], float]] = {"floor": _floor, "ceil": _ceil, "abs": abs}


def _go_max(left: float, right: float) -> float:
    """Go's ``math.Max``: NaN when either is NaN."""
    return math.nan if math.isnan(left) or math.isnan(right) else max(left, right)


def _go_min(left: float, right: float) -> float:
    return math.nan if math.isnan(left) or math.isnan(right) else min(left, right)


def _extreme(pick: Callable[[float, float], bool]) -> Callable[[list[float]], float]:
    """``min``/``max`` as Prometheus aggregates them: a NaN gives way to any other value."""

    def aggregate(values: list[float]) -> float:
        best = values[0]
        for value in values[1:]:
            if pick(value, best) or math.isnan(best):
                best = value
        return best

    return aggregate


_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda values: float(sum(values)),
    "avg": lambda values: _mean(values, kahan=False),
    "min": _extreme(lambda value, best: value < best),
    "max": _extreme(lambda value, best: value > best),
    "count": lambda values: float(len(values)),
    "group": lambda values: 1.0,
}
