"""A small PromQL: the subset the generated rule pack uses, parsed, and evaluated over a few
scrapes of one target.

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

The parser keeps each node's source span, so ``diagnose --prometheus.url`` can send the same
sub-expressions to a real Prometheus, and the report quotes them as the rules write them.
That is why parsing is not handed to the ``promql-parser`` package (Rust), although it is
faster (``bench/promql_parse.py``: the whole pack in 2.9-3.9 ms converted to these nodes,
against 5.9-8.3 ms here): it keeps no source positions, and printed back by it 84 of the 136
sub-expressions ``diagnose`` quotes change (``name`` becomes ``name{}``); 4 ms once per run
is not worth changed reports and a 4.7 MiB native extension in the sidecar image
(``docs/performance.md``). Nothing here does I/O.
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
Point = tuple[int, float]  # milliseconds since the epoch, value


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

    def series(self, rng: Range) -> dict[Labels, list[Point]]:
        """Every sample of the selected series, whatever the range says: the window is the
        sampling span."""
        sel = rng.selector
        if sel.name is not None and sel.name in self.records:
            raise NeedsHistoryError(f"a range of the recording rule {sel.name}")
        if sel.offset and self.needs_history(sel.offset):
            raise NeedsHistoryError(f"offset {_duration(sel.offset)}")
        out: dict[Labels, list[Point]] = defaultdict(list)
        for ms, scrape in zip(self._ms, self.scrapes, strict=True):
            for labels, value in scrape.samples.items():
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
            for labels, points in self.series(rng).items():
                value = _RANGE_FUNCTIONS[func](points, window)
                if value is not None:
                    out.append(Sample(_drop_name(labels), value))
            return out
        if func == "histogram_quantile":
            q = self._scalar(args[0])
            return histogram_quantile(q, self._vector(args[1]))
        if func == "clamp":
            vector = self._vector(args[0])
            lo, hi = self._scalar(args[1]), self._scalar(args[2])
            if hi < lo:
                return []
            return [Sample(s.without_name(), _go_max(lo, _go_min(hi, s.value))) for s in vector]
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
    """``a op b`` as Go's float64 (IEEE 754) arithmetic gives it: no exceptions."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return _divide(a, b)
    if op == "%":
        return _mod(a, b)
    return _pow(a, b)


def _divide(a: float, b: float) -> float:
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _mod(a: float, b: float) -> float:
    """Go's ``math.Mod``: NaN for an infinite ``a`` or a zero ``b``, ``a`` for an infinite ``b``."""
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return math.nan
    if math.isinf(b):
        return a
    return math.fmod(a, b)


def _pow(a: float, b: float) -> float:
    """Go's ``math.Pow``: NaN for a negative base and a fractional exponent, infinities on
    overflow."""
    try:
        return math.pow(a, b)
    except ValueError:
        if a == 0:  # 0 ** negative: an infinity with the sign of a for odd integer exponents
            odd = b == math.floor(b) and math.fmod(b, 2) != 0
            return math.copysign(math.inf, a) if odd else math.inf
        return math.nan
    except OverflowError:
        odd = b == math.floor(b) and math.fmod(b, 2) != 0
        return -math.inf if a < 0 and odd else math.inf


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
    for s in one:
        key = match_key(s.labels, node.on, node.ignoring)
        if key in index:
            raise PromQLError("many-to-many matching: the 'one' side has duplicate series")
        index[key] = s
    out: Vector = []
    matched: dict[Labels, set[Labels]] = {}
    for s in many:
        key = match_key(s.labels, node.on, node.ignoring)
        other = index.get(key)
        if other is None:
            continue
        a, b = (other.value, s.value) if node.group == "right" else (s.value, other.value)
        if node.op in COMPARISONS:
            hit = compare(node.op, a, b)
            if not hit and not node.bool_:
                continue
            # A filter keeps the left operand's value, whichever side is the "many" one.
            value = (1.0 if hit else 0.0) if node.bool_ else a
        else:
            value = arithmetic(node.op, a, b)
        labels = _result_labels(node, s.labels, other.labels)
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


def histogram_quantile(q: float, buckets: Vector) -> Vector:
    """Prometheus' ``histogram_quantile`` over classic buckets (``le`` labels)."""
    groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
    for s in buckets:
        try:
            bound = float(s.get("le"))
        except ValueError:
            continue  # no bucket label, or not a number: Prometheus skips the sample too
        # Grouped with the name, which the result drops.
        groups[tuple(item for item in s.labels if item[0] != "le")].append((bound, s.value))
    out: Vector = []
    for key, points in groups.items():
        labels = _drop_name(key)
        if any(s.labels == labels for s in out):
            raise PromQLError("histogram_quantile: duplicate series after dropping the name")
        out.append(Sample(labels, bucket_quantile(q, points)))
    return out


def _search(n: int, found: Callable[[int], bool]) -> int:
    """Go's ``sort.Search``: the binary search Prometheus uses, also where ``found`` is not
    monotonic (a NaN count)."""
    i, j = 0, n
    while i < j:
        h = (i + j) // 2
        if not found(h):
            i = h + 1
        else:
            j = h
    return i


def bucket_quantile(q: float, points: list[tuple[float, float]]) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
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
    rank = q * total
    b = _search(len(fixed) - 1, lambda i: fixed[i][1] >= rank)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    if b == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start, end, count = 0.0, fixed[b][0], fixed[b][1]
    if b > 0:
        start = fixed[b - 1][0]
        count -= fixed[b - 1][1]
        rank -= fixed[b - 1][1]
    return start + (end - start) * _divide(rank, count)


# --- range functions: Prometheus 2.x's arithmetic, over a window that is the sampling span ---


@dataclass(frozen=True)
class Window:
    """The range a range selector covers, in milliseconds: the first to the last scrape."""

    start: int
    end: int


def _kahan(inc: float, total: float, c: float) -> tuple[float, float]:
    """One step of Kahan-Babuska summation, as Prometheus' ``kahanSumInc``."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


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
    n = sum_x = c_x = sum_y = c_y = sum_xy = c_xy = sum_x2 = c_x2 = 0.0
    constant = True
    for t, y in points:
        constant = constant and y == first
        n += 1.0
        x = (t - t0) / 1e3
        sum_x, c_x = _kahan(x, sum_x, c_x)
        sum_y, c_y = _kahan(y, sum_y, c_y)
        sum_xy, c_xy = _kahan(x * y, sum_xy, c_xy)
        sum_x2, c_x2 = _kahan(x * x, sum_x2, c_x2)
    if constant:
        return math.nan if math.isinf(first) else 0.0
    sum_x, sum_y, sum_xy, sum_x2 = sum_x + c_x, sum_y + c_y, sum_xy + c_xy, sum_x2 + c_x2
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    return _divide(cov_xy, var_x)


def _mean(values: Iterable[float], *, kahan: bool) -> float:
    """Prometheus' running mean (``avg_over_time`` compensates it, ``avg`` does not); an
    infinite mean stays infinite unless the other infinity or a NaN comes along."""
    mean = c = count = 0.0
    for value in values:
        count += 1
        if math.isinf(mean):
            if math.isinf(value) and (mean > 0) == (value > 0):
                continue
            if not math.isinf(value) and not math.isnan(value):
                continue
        step = value / count - mean / count
        if kahan:
            mean, c = _kahan(step, mean, c)
        else:
            mean += step
    return mean if math.isinf(mean) else mean + c


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


_RANGE_FUNCTIONS: dict[str, Callable[[list[Point], Window], float | None]] = {
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


def _go_max(a: float, b: float) -> float:
    """Go's ``math.Max``: NaN when either is NaN."""
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def _go_min(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else min(a, b)


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
