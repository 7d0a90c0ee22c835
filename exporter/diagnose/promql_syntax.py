"""PromQL's syntax, the subset the rule pack uses: lexer, parser, tree with source spans.

A precedence-climbing parser over a regular-expression lexer; each node of the syntax tree
keeps its span in the source text.

The spans are why this parser exists: ``diagnose --prometheus.url`` sends the same
sub-expressions to a real Prometheus, and the report quotes them as the rules write them.
That is why parsing is not handed to the ``promql-parser`` package (Rust), although it is
faster (``bench/promql_parse.py``: the whole pack in 2.9-3.9 ms converted to these nodes,
against 5.9-8.3 ms here): it keeps no source positions, and printed back by it 84 of the 136
sub-expressions ``diagnose`` quotes change (``name`` becomes ``name{}``); 4 ms once per run
is not worth changed reports and a 4.7 MiB native extension in the sidecar image
(``docs/performance.md``). :mod:`exporter.diagnose.promql_eval` evaluates the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.config import parse_duration


class PromQLError(ValueError):
    """An expression outside the supported subset, or not PromQL at all."""


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
    escapes = {"n": "\n", "t": "\t"}
    return re.sub(r"\\(.)", lambda escape: escapes.get(escape[1], escape[1]), body)


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
