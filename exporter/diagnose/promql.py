"""A small PromQL: the subset the generated rule pack uses, parsed, and evaluated over a few
scrapes of one target.

``diagnose --target`` has no Prometheus: it samples the sidecar's ``/metrics`` a few times
and evaluates the pack's own recording rules and alert expressions here, so its verdict
follows the catalogue and the site config. Where it differs from Prometheus, on purpose:

- every range selector covers all the samples taken (the sampling span), whatever duration it
  names; ``rate()`` and ``increase()`` are the plain difference over that span (counter resets
  handled), without Prometheus' extrapolation to the window's edges;
- an instant selector reads the last sample. ``offset`` reads the first sample, unless the
  caller says the offset reaches further back than samples can (the 1h baseline of the HBM
  signature): then :class:`NeedsHistoryError` is raised;
- matchers on target labels (which Prometheus attaches; the sidecar never exposes them) are
  ignored, and ``up`` is 1: the target answered.

The parser keeps each node's source span, so ``diagnose --prometheus.url`` can send the same
sub-expressions to a real Prometheus. Nothing here does I/O.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.config import parse_duration

Labels = tuple[tuple[str, str], ...]
NAME = "__name__"


class PromQLError(ValueError):
    """An expression outside the supported subset, or not PromQL at all."""


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


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in mapping.items() if v != ""))


# --- syntax -----------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|\#[^\n]*)
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+)(?![A-Za-z0-9_.])
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|nan)(?![A-Za-z0-9_:]))
    |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){}\[\],])
    """,
    re.VERBOSE,
)
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count", "group"})
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})
_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    "==": 3,
    "!=": 3,
    ">": 3,
    "<": 3,
    ">=": 3,
    "<=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 6,
}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int
    end: int


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise PromQLError(f"unexpected character {text[pos]!r} at {pos}")
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, match.group(), match.start(), match.end()))
        pos = match.end()
    return tokens


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def matches(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        found = re.fullmatch(self.value, value) is not None
        return found if self.op == "=~" else not found


@dataclass(frozen=True)
class Node:
    span: tuple[int, int]


@dataclass(frozen=True)
class Num(Node):
    value: float


@dataclass(frozen=True)
class Str(Node):
    value: str


@dataclass(frozen=True)
class Selector(Node):
    name: str | None
    matchers: tuple[Matcher, ...]
    offset: float = 0.0


@dataclass(frozen=True)
class Range(Node):
    selector: Selector
    seconds: float


@dataclass(frozen=True)
class Call(Node):
    func: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Aggregate(Node):
    op: str
    arg: Node
    grouping: tuple[str, ...] | None  # None: all labels away
    without: bool = False


@dataclass(frozen=True)
class Paren(Node):
    expr: Node


@dataclass(frozen=True)
class Negate(Node):
    expr: Node


@dataclass(frozen=True)
class Binary(Node):
    op: str
    lhs: Node
    rhs: Node
    bool_: bool = False
    on: tuple[str, ...] | None = None
    ignoring: tuple[str, ...] = ()
    group: str | None = None  # "left" or "right"
    include: tuple[str, ...] = ()

    @property
    def is_filter(self) -> bool:
        """A comparison that filters (no ``bool``)."""
        return self.op in COMPARISONS and not self.bool_


@dataclass
class _Parser:
    text: str
    tokens: list[Token]
    pos: int = 0

    def peek(self, offset: int = 0) -> Token | None:
        index = self.pos + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def next(self) -> Token:
        token = self.peek()
        if token is None:
            raise PromQLError("unexpected end of expression")
        self.pos += 1
        return token

    def expect(self, text: str) -> Token:
        token = self.next()
        if token.text != text:
            raise PromQLError(f"expected {text!r} at {token.start}, got {token.text!r}")
        return token

    def at(self, text: str) -> bool:
        token = self.peek()
        return token is not None and token.text == text

    def binary_op(self) -> str | None:
        token = self.peek()
        if token is None:
            return None
        if token.kind == "op" and token.text in _PRECEDENCE:
            return token.text
        if token.kind == "ident" and token.text in SET_OPS:
            return token.text
        return None

    def expr(self, min_prec: int = 1) -> Node:
        lhs = self.unary()
        while True:
            op = self.binary_op()
            if op is None or _PRECEDENCE[op] < min_prec:
                return lhs
            self.next()
            modifiers = self.modifiers(op)
            prec = _PRECEDENCE[op]
            rhs = self.expr(prec if op == "^" else prec + 1)
            lhs = Binary((lhs.span[0], rhs.span[1]), op, lhs, rhs, **modifiers)  # type: ignore[arg-type]

    def modifiers(self, op: str) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.at("bool"):
            if op not in COMPARISONS:
                raise PromQLError("bool modifier on a non-comparison")
            self.next()
            out["bool_"] = True
        if self.at("on") or self.at("ignoring"):
            kind = self.next().text
            names = self.label_list()
            if kind == "on":
                out["on"] = names
            else:
                out["ignoring"] = names
        if self.at("group_left") or self.at("group_right"):
            out["group"] = self.next().text.removeprefix("group_")
            out["include"] = self.label_list() if self.at("(") else ()
        return out

    def label_list(self) -> tuple[str, ...]:
        self.expect("(")
        names: list[str] = []
        while not self.at(")"):
            token = self.next()
            if token.kind != "ident":
                raise PromQLError(f"expected a label name at {token.start}")
            names.append(token.text)
            if not self.at(")"):
                self.expect(",")
        self.expect(")")
        return tuple(names)

    def unary(self) -> Node:
        token = self.peek()
        if token is not None and token.text in ("-", "+"):
            self.next()
            inner = self.unary()
            span = (token.start, inner.span[1])
            return Negate(span, inner) if token.text == "-" else inner
        return self.postfix(self.primary())

    def postfix(self, node: Node) -> Node:
        if self.at("["):
            if not isinstance(node, Selector):
                raise PromQLError("a range needs a plain selector (subqueries are not supported)")
            self.next()
            seconds = self.duration()
            end = self.expect("]").end
            node = Range((node.span[0], end), node, seconds)
        if self.at("offset"):
            self.next()
            token = self.peek()
            seconds = self.duration()
            end = token.end if token is not None else node.span[1]
            if isinstance(node, Selector):
                node = Selector((node.span[0], end), node.name, node.matchers, seconds)
            elif isinstance(node, Range):
                sel = node.selector
                node = Range(
                    (node.span[0], end),
                    Selector(sel.span, sel.name, sel.matchers, seconds),
                    node.seconds,
                )
            else:
                raise PromQLError("offset needs a selector")
        return node

    def duration(self) -> float:
        token = self.next()
        if token.kind != "duration":
            raise PromQLError(f"expected a duration at {token.start}, got {token.text!r}")
        return parse_duration(token.text)

    def primary(self) -> Node:
        token = self.next()
        if token.kind == "number":
            return Num((token.start, token.end), float(token.text))
        if token.kind == "string":
            return Str((token.start, token.end), _unquote(token.text))
        if token.text == "(":
            inner = self.expr()
            end = self.expect(")").end
            return Paren((token.start, end), inner)
        if token.text == "{":
            self.pos -= 1
            return self.selector(None, token.start)
        if token.kind != "ident":
            raise PromQLError(f"unexpected {token.text!r} at {token.start}")
        name = token.text
        if name in AGGREGATIONS and (self.at("(") or self.at("by") or self.at("without")):
            return self.aggregate(token)
        if self.at("("):
            self.next()
            args: list[Node] = []
            while not self.at(")"):
                args.append(self.expr())
                if not self.at(")"):
                    self.expect(",")
            end = self.expect(")").end
            return Call((token.start, end), name, tuple(args))
        return self.selector(name, token.start, token.end)

    def aggregate(self, token: Token) -> Node:
        grouping: tuple[str, ...] | None = None
        without = False
        if self.at("by") or self.at("without"):
            without = self.next().text == "without"
            grouping = self.label_list()
        self.expect("(")
        arg = self.expr()
        end = self.expect(")").end
        if self.at("by") or self.at("without"):
            without = self.next().text == "without"
            grouping = self.label_list()
            end = self.tokens[self.pos - 1].end
        return Aggregate((token.start, end), token.text, arg, grouping, without)

    def selector(self, name: str | None, start: int, end: int = 0) -> Selector:
        matchers: list[Matcher] = []
        if self.at("{"):
            self.next()
            while not self.at("}"):
                label = self.next()
                if label.kind != "ident":
                    raise PromQLError(f"expected a label name at {label.start}")
                op = self.next()
                if op.text not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"expected a matcher operator at {op.start}")
                value = self.next()
                if value.kind != "string":
                    raise PromQLError(f"expected a quoted value at {value.start}")
                matchers.append(Matcher(label.text, op.text, _unquote(value.text)))
                if not self.at("}"):
                    self.expect(",")
            end = self.expect("}").end
        if name is None and not matchers:
            raise PromQLError(f"empty selector at {start}")
        return Selector((start, end), name, tuple(matchers))


def _unquote(text: str) -> str:
    if text[0] == "`":
        return text[1:-1]
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), body)


def parse(text: str) -> Node:
    """The syntax tree of ``text``; :class:`PromQLError` outside the supported subset."""
    parser = _Parser(text, tokenize(text))
    node = parser.expr()
    if parser.peek() is not None:
        token = parser.next()
        raise PromQLError(f"unexpected {token.text!r} at {token.start}")
    return node


def source(text: str, node: Node) -> str:
    """The text of ``node`` in the expression it was parsed from."""
    return text[node.span[0] : node.span[1]]


def unparen(node: Node) -> Node:
    while isinstance(node, Paren):
        node = node.expr
    return node


# --- evaluation -------------------------------------------------------------------------------


@dataclass
class Scrape:
    """One read of the target: Unix time and every sample (``__name__`` among the labels)."""

    time: float
    samples: dict[Labels, float]


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

    @property
    def span(self) -> float:
        return self.scrapes[-1].time - self.scrapes[0].time

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
            raise NeedsHistoryError(f"offset {_duration(sel.offset)}")
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
            for labels, value in scrape.samples.items()
            if self._selected(sel, labels)
        ]

    def _selected(self, sel: Selector, labels: Labels) -> bool:
        if sel.name is not None and dict(labels).get(NAME) != sel.name:
            return False
        return self._matching(sel.matchers, labels)

    def series(self, rng: Range) -> dict[Labels, list[tuple[float, float]]]:
        sel = rng.selector
        if sel.name is not None and sel.name in self.records:
            raise NeedsHistoryError(f"a range of the recording rule {sel.name}")
        if sel.offset and self.needs_history(sel.offset):
            raise NeedsHistoryError(f"offset {_duration(sel.offset)}")
        out: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        for scrape in self.scrapes:
            for labels, value in scrape.samples.items():
                if self._selected(sel, labels):
                    out[labels].append((scrape.time, value))
        return out

    # functions

    def call(self, node: Call) -> Value:
        func, args = node.func, node.args
        if func in _RANGE_FUNCTIONS:
            if len(args) != 1 or not isinstance(unparen(args[0]), Range):
                raise PromQLError(f"{func}() needs a range selector")
            rng = unparen(args[0])
            assert isinstance(rng, Range)
            out: Vector = []
            for labels, points in self.series(rng).items():
                value = _RANGE_FUNCTIONS[func](points)
                if value is not None:
                    out.append(Sample(_drop_name(labels), value))
            return out
        if func == "histogram_quantile":
            q = self._scalar(args[0])
            return histogram_quantile(q, self._vector(args[1]))
        if func == "clamp":
            lo, hi = self._scalar(args[1]), self._scalar(args[2])
            return [
                Sample(s.without_name(), max(lo, min(hi, s.value))) for s in self._vector(args[0])
            ]
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
        for s in vector:
            match = pattern.fullmatch(s.get(src))
            if match is None:
                out.append(s)
                continue
            values = dict(s.labels)
            values[dst] = match.expand(template)
            out.append(Sample(labels_of(values), s.value))
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
        for s in self._vector(node.arg):
            groups[_group_key(s.labels, node.grouping, node.without)].append(s.value)
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
        for s in vector:
            a, b = (scalar, s.value) if scalar_left else (s.value, scalar)
            if op in COMPARISONS:
                hit = compare(op, a, b)
                if node.bool_:
                    out.append(Sample(s.without_name(), 1.0 if hit else 0.0))
                elif hit:
                    out.append(s)
            else:
                out.append(Sample(s.without_name(), arithmetic(op, a, b)))
        return out


def _duration(seconds: float) -> str:
    from exporter.config import format_duration as duration  # noqa: PLC0415

    return duration(seconds)


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


def compare(op: str, a: float, b: float) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == ">":
        return a > b
    if op == "<":
        return a < b
    if op == ">=":
        return a >= b
    return a <= b


def arithmetic(op: str, a: float, b: float) -> float:
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        if op == "%":
            return math.fmod(a, b)
        return float(a**b)
    except ZeroDivisionError:
        if op == "%" or a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * (1 if math.copysign(1, b) > 0 else -1)
    except (OverflowError, ValueError):
        return math.nan


def set_operation(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    keys = {match_key(s.labels, node.on, node.ignoring) for s in rhs}
    if node.op == "and":
        return [s for s in lhs if match_key(s.labels, node.on, node.ignoring) in keys]
    if node.op == "unless":
        return [s for s in lhs if match_key(s.labels, node.on, node.ignoring) not in keys]
    left = {match_key(s.labels, node.on, node.ignoring) for s in lhs}
    return lhs + [s for s in rhs if match_key(s.labels, node.on, node.ignoring) not in left]


def vector_binary(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """Arithmetic or comparison between two vectors, with PromQL's label matching."""
    one, many = (lhs, rhs) if node.group == "right" else (rhs, lhs)
    index: dict[Labels, Sample] = {}
    for s in one:
        key = match_key(s.labels, node.on, node.ignoring)
        if key in index:
            raise PromQLError("many-to-many matching: the 'one' side has duplicate series")
        index[key] = s
    out: Vector = []
    seen: set[Labels] = set()
    for s in many:
        other = index.get(match_key(s.labels, node.on, node.ignoring))
        if other is None:
            continue
        a, b = (other.value, s.value) if node.group == "right" else (s.value, other.value)
        if node.group is None:
            labels = match_key(s.labels, node.on) if node.on is not None else s.without_name()
        else:
            values = dict(s.without_name())
            for name in node.include:
                values[name] = other.get(name)
            labels = labels_of(values)
        if node.op in COMPARISONS:
            hit = compare(node.op, a, b)
            if node.bool_:
                out.append(Sample(labels, 1.0 if hit else 0.0))
            elif hit:
                out.append(Sample(s.labels if node.group is None else labels, s.value))
            continue
        if node.group is None and labels in seen:
            raise PromQLError("duplicate series after matching")
        seen.add(labels)
        out.append(Sample(labels, arithmetic(node.op, a, b)))
    return out


def histogram_quantile(q: float, buckets: Vector) -> Vector:
    """Prometheus' ``histogram_quantile`` over classic buckets (``le`` labels)."""
    groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
    for s in buckets:
        le = s.get("le")
        if not le:
            continue
        key = tuple(item for item in s.without_name() if item[0] != "le")
        groups[key].append((float(le), s.value))
    return [Sample(key, bucket_quantile(q, points)) for key, points in groups.items()]


def bucket_quantile(q: float, points: list[tuple[float, float]]) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    points = sorted(points)
    if len(points) < 2 or not math.isinf(points[-1][0]):
        return math.nan
    # Counts must not fall with the bound (a scrape between two bucket updates).
    fixed: list[tuple[float, float]] = []
    top = 0.0
    for bound, count in points:
        top = max(top, count)
        fixed.append((bound, top))
    total = fixed[-1][1]
    if total == 0 or math.isnan(total):
        return math.nan
    rank = q * total
    b = next(i for i, (_, count) in enumerate(fixed) if count >= rank)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    if b == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start, end, count = 0.0, fixed[b][0], fixed[b][1]
    if b > 0:
        start = fixed[b - 1][0]
        count -= fixed[b - 1][1]
        rank -= fixed[b - 1][1]
    return start + (end - start) * (rank / count) if count else start


def _increase(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    total = points[-1][1] - points[0][1]
    for (_, before), (_, after) in itertools.pairwise(points):
        if after < before:
            total += before  # a counter reset: count what it had reached
    return total


def _rate(points: list[tuple[float, float]]) -> float | None:
    increase = _increase(points)
    elapsed = points[-1][0] - points[0][0] if points else 0.0
    if increase is None or elapsed <= 0:
        return None
    return increase / elapsed


def _deriv(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    t0 = points[0][0]
    xs = [t - t0 for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def _avg(points: list[tuple[float, float]]) -> float | None:
    return sum(v for _, v in points) / len(points) if points else None


def _changes(points: list[tuple[float, float]]) -> float | None:
    if not points:
        return None
    return float(sum(1 for a, b in itertools.pairwise(points) if a[1] != b[1]))


def _max_over(points: list[tuple[float, float]]) -> float | None:
    return max(v for _, v in points) if points else None


_RANGE_FUNCTIONS: dict[str, Callable[[list[tuple[float, float]]], float | None]] = {
    "rate": _rate,
    "increase": _increase,
    "deriv": _deriv,
    "avg_over_time": _avg,
    "max_over_time": _max_over,
    "changes": _changes,
}


def _floor(value: float) -> float:
    return float(math.floor(value)) if math.isfinite(value) else value


def _ceil(value: float) -> float:
    return float(math.ceil(value)) if math.isfinite(value) else value


_ELEMENTWISE: dict[str, Callable[[float], float]] = {"floor": _floor, "ceil": _ceil, "abs": abs}


def _nan_aware(fn: Callable[[list[float]], float]) -> Callable[[list[float]], float]:
    def aggregate(values: list[float]) -> float:
        real = [v for v in values if not math.isnan(v)]
        return fn(real) if real else math.nan

    return aggregate


_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda values: float(sum(values)),
    "avg": lambda values: float(sum(values)) / len(values),
    "min": _nan_aware(min),
    "max": _nan_aware(max),
    "count": lambda values: float(len(values)),
    "group": lambda values: 1.0,
}
