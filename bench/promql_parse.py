"""Parse time of the rule pack's PromQL: ``diagnose``'s own parser against ``promql-parser``.

``diagnose`` parses every recording rule, alert expression and evidence query of the pack on
each run (:func:`exporter.diagnose.promql_syntax.parse`). The question is whether the maintained
``promql-parser`` package (Rust, via PyO3) could take that over without losing speed. Three
ways from the texts of the ``sidecar`` and ``fast`` packs to something the evaluator can walk,
each timed over the whole pack in this process (median CPU per pass over batches of 10, the
three taking turns in each round, after one warm-up):

* ``ours``: :func:`exporter.diagnose.promql_syntax.parse` (tokenizer and precedence climbing in
  Python), which also keeps each node's source span;
* ``promql_parser.parse``: the Rust parser alone, to its Python objects;
* ``promql_parser + conversion``: the Rust parse and a walk of its objects into the
  evaluator's nodes, which adopting it would need (the evaluator walks its own nodes; reading
  the PyO3 objects instead costs the same attribute accesses on every evaluation). Its
  objects carry no source positions, so the spans are lost:
  ``quoted_differently_by_promql_parser`` counts the sub-expressions ``diagnose`` quotes
  (conditions, thresholds) whose text would change.

``promql-parser`` is not a dependency: ``python -m pip install promql-parser`` first.
Run: ``python bench/promql_parse.py`` (prints JSON).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.diagnose.promql_syntax import (  # noqa: E402
    SET_OPS,
    Aggregate,
    Binary,
    Call,
    Matcher,
    Negate,
    Node,
    Num,
    Paren,
    Range,
    Selector,
    Str,
    parse,
    source,
)
from exporter.signatures import all_signatures, parse_config, recording_rules  # noqa: E402
from exporter.signatures.promql_text import matchers  # noqa: E402

try:
    import promql_parser
except ImportError:  # pragma: no cover
    sys.exit("promql-parser is not installed: python -m pip install promql-parser")

_NO_SPAN = (0, 0)
_MATCH_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def pack_texts() -> list[str]:
    """Every expression ``diagnose`` parses for the packs it evaluates with ``--target``."""
    texts: list[str] = []
    instance = matchers({"namespace": "", "pod": "", "instance": "a:1", "job": "j", "gpu": "0"})
    for profile in ("sidecar", "fast"):
        cfg = parse_config({}, profile)
        texts += [rule.expr for rule in recording_rules(cfg)]
        for sig in all_signatures(cfg):
            for rule in sig.rules:
                texts.append(rule.expr)
                texts += [e.query(instance) for e in rule.evidence if e.expr is not None]
    return texts


def _selector(vs: Any, offset: Any) -> Selector:
    found = tuple(
        Matcher(m.name, _MATCH_OPS[str(m.op).split(".")[-1].split("(")[0]], m.value)
        for m in vs.matchers.matchers
    )
    seconds = offset.total_seconds() if offset is not None else 0.0
    return Selector(_NO_SPAN, vs.name, found, seconds)


def convert(expr: Any) -> Node:
    """promql-parser's tree as the evaluator's nodes (without source spans)."""
    kind = type(expr).__name__
    if kind == "NumberLiteral":
        return Num(_NO_SPAN, expr.val)
    if kind == "StringLiteral":
        return Str(_NO_SPAN, expr.val)
    if kind == "ParenExpr":
        return Paren(_NO_SPAN, convert(expr.expr))
    if kind == "UnaryExpr":
        return Negate(_NO_SPAN, convert(expr.expr))
    if kind == "VectorSelector":
        return _selector(expr, expr.offset)
    if kind == "MatrixSelector":
        vs = expr.vector_selector
        return Range(_NO_SPAN, _selector(vs, vs.offset), expr.range.total_seconds())
    if kind == "Call":
        return Call(_NO_SPAN, expr.func.name, tuple(convert(a) for a in expr.args))
    if kind == "AggregateExpr":
        mod = expr.modifier
        grouping = tuple(mod.labels) if mod is not None else None
        without = mod is not None and str(mod.type).endswith("Without")
        return Aggregate(_NO_SPAN, str(expr.op), convert(expr.expr), grouping, without)
    if kind == "BinaryExpr":
        mod = expr.modifier
        options: dict[str, Any] = {}
        if mod is not None:
            options["bool_"] = mod.return_bool
            if mod.matching is not None:
                labels = tuple(mod.matching.labels)
                on = str(mod.matching.type).endswith("Include")
                options["on" if on else "ignoring"] = labels
            card = str(mod.card).split(".")[-1]
            if card in ("ManyToOne", "OneToMany"):
                options["group"] = "left" if card == "ManyToOne" else "right"
                options["include"] = tuple(mod.group_labels or ())
        return Binary(_NO_SPAN, str(expr.op), convert(expr.lhs), convert(expr.rhs), **options)
    raise TypeError(f"no conversion for {kind}")


def interleaved(fns: list[Callable[[], object]], rounds: int) -> list[float]:
    """Median CPU milliseconds per call of each of ``fns``, timed in turn in each round (10
    calls each), so that a neighbour's load on this shared machine falls on all of them."""
    for fn in fns:
        fn()
    per_call: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, per_call, strict=True):
            start = time.process_time()
            for _ in range(10):
                fn()
            times.append((time.process_time() - start) / 10)
    return [round(statistics.median(times) * 1000, 3) for times in per_call]


def measure(rounds: int = 60) -> dict[str, Any]:
    texts = pack_texts()
    # The conversion gives the same trees as ours, spans aside.
    for text in texts:
        assert _unspanned(convert(promql_parser.parse(text))) == _unspanned(parse(text)), text
    ours, rust, both = interleaved(
        [
            lambda: [parse(t) for t in texts],
            lambda: [promql_parser.parse(t) for t in texts],
            lambda: [convert(promql_parser.parse(t)) for t in texts],
        ],
        rounds,
    )
    quoted = quoted_texts()
    return {
        "quoted_subexpressions": len(quoted),
        "quoted_differently_by_promql_parser": sum(ours != theirs for ours, theirs in quoted),
        "example": next(pair for pair in quoted if pair[0] != pair[1]),
        "python": platform.python_version(),
        "promql_parser": _version("promql-parser"),
        "expressions": len(texts),
        "characters": sum(len(t) for t in texts),
        "ours_ms": ours,
        "promql_parser_ms": rust,
        "promql_parser_and_conversion_ms": both,
        "promql_parser_vs_ours": round(rust / ours, 3),
        "promql_parser_and_conversion_vs_ours": round(both / ours, 3),
    }


def quoted_texts() -> list[tuple[str, str]]:
    """Each sub-expression ``diagnose`` quotes in its report (and sends to a Prometheus): as the
    rule writes it (our spans) and as promql-parser prints it (it keeps no positions)."""
    out: list[tuple[str, str]] = []

    def walk(text: str, ours: Node, theirs: Any) -> None:
        while isinstance(ours, Paren):
            ours, theirs = ours.expr, theirs.expr
        if isinstance(ours, Binary) and ours.op in SET_OPS:
            walk(text, ours.lhs, theirs.lhs)
            walk(text, ours.rhs, theirs.rhs)
            pairs = [(ours.rhs, theirs.rhs)]
        elif isinstance(ours, Binary) and ours.is_filter:
            pairs = [(ours.lhs, theirs.lhs), (ours.rhs, theirs.rhs)]
        else:
            pairs = [(ours, theirs)]
        out.extend((source(text, o), str(t)) for o, t in pairs)

    for profile in ("sidecar", "fast"):
        for sig in all_signatures(parse_config({}, profile)):
            for rule in sig.rules:
                walk(rule.expr, parse(rule.expr), promql_parser.parse(rule.expr))
    return out


def _unspanned(node: Node) -> object:
    """A node's fields without source spans, recursively (for comparing trees)."""
    if isinstance(node, Paren):  # promql-parser keeps parentheses as we do; compare inside
        return ("paren", _unspanned(node.expr))
    fields: list[object] = [type(node).__name__]
    for name, value in vars(node).items():
        if name == "span":
            continue
        if isinstance(value, Node):
            fields.append(_unspanned(value))
        elif isinstance(value, tuple):
            fields.append(tuple(_unspanned(v) if isinstance(v, Node) else v for v in value))
        else:
            fields.append(value)
    return tuple(fields)


def _version(name: str) -> str:
    from importlib.metadata import version  # noqa: PLC0415

    return version(name)


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
