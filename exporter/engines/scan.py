"""The engine poll's fast path: from an exposition's text straight to the sample index.

The sidecar needs of an engine's ``/metrics`` only the samples of the families its adapters
read, as ``sample name -> labels -> value`` (:data:`~exporter.engines.rules.SampleIndex`), and
the names of every family and sample (to recognise the engine). prometheus_client's text
parser builds a ``Metric`` and a ``Sample`` per line and walks label strings character by
character; on a Triton server with 384 models (10k series) that was most of a 0.2-0.5 s poll.

:func:`scan` reads the lines once: each line's name decides whether it is kept (the
families in ``keys``, whole: every ``_bucket``, ``_sum``, ``_count``, ``_total``), and a kept
line is decoded with one regular expression when it has the plain shape every engine writes
(``name{label="value",...} value [timestamp]``, ``# HELP`` and ``# TYPE`` lines with single
tokens). The lines are grouped into families, cleaned, merged and indexed exactly as
:func:`~exporter.engines.parse.parse_exposition` followed by
:func:`~exporter.engines.rules.index_samples` would (the same state machine as
prometheus_client's parser: a sample outside the current family's names starts an untyped
family of its own; a counter family not named ``*_total`` has its samples renamed to
``*_total``). Any kept line of another shape (spaces inside braces, tabs, escapes in names,
``__`` labels, hexadecimal or very long numbers, a HELP line with quotes in its name, ...)
sends the kept text to prometheus_client's parser instead, so an unusual exposition is read
exactly as before and a malformed one fails exactly as before. ``tests/engines/test_scan.py``
checks both paths give the same index on every fixture and on fuzzed expositions.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.engines.parse import parse_exposition
from exporter.engines.rules import Labels, SampleIndex, index_samples
from exporter.priority import no_pause

_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# A label name that prometheus_client accepts without a second look: not reserved (__).
_LABEL_NAME = r"(?:[a-zA-Z][a-zA-Z0-9_]*|_[a-zA-Z0-9][a-zA-Z0-9_]*)"
# Unrolled (no alternation per character): the regular expression engine runs it fast.
_LABEL_VALUE = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
# Decimal numbers of at most 30 significant characters (longer integers overflow a float
# differently in the two paths), Inf and NaN as Prometheus writes them.
_NUMBER = r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?"
_VALUE = rf"(?:{_NUMBER}|[+-]?Inf|NaN)"
_PAIR = rf"{_LABEL_NAME}={_LABEL_VALUE}"
# The sample line: its label text is checked on its own (_LABEL_LIST), once per distinct
# text, so the line's pattern takes it as any text between the braces.
_SAMPLE = re.compile(rf"({_NAME})(?:\{{(.*)\}})? +({_VALUE})(?: +-?[0-9]{{1,20}})?")
_LABEL_LIST = re.compile(rf"(?:{_PAIR}(?:,{_PAIR})*,?)?")
_LABEL = re.compile(rf'({_LABEL_NAME})="([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
# A sample line's name: up to the first brace, space or tab.
_HEAD = re.compile(r"[^{ \t]*")
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_COMMENT = re.compile(rf"#[ \t]+(HELP|TYPE)[ \t]+({_NAME})(?:[ \t]+(.*))?")
_TYPES = frozenset(
    {"counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info"}
    | {"stateset", "untyped"}
)
_ALLOWED = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_WITH_SERIES_PARTS = frozenset({"histogram", "gaugehistogram", "summary"})

Sample = tuple[str, Labels, float]


@dataclass
class Scanned:
    """What :func:`scan` read: the index of the kept families' samples, and the names of
    every family (HELP/TYPE lines) and sample (all lines, kept or not)."""

    index: SampleIndex
    families: set[str] = field(default_factory=set)
    samples: set[str] = field(default_factory=set)
    fast: bool = True


class _OddLineError(Exception):
    """A kept line the fast path does not decode: prometheus_client reads the text."""


def family_key(name: str) -> str:
    """A name without its sample suffix (``x_total`` -> ``x``)."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def line_name(line: str) -> str:
    """The metric name a stripped line is about: the family of a HELP/TYPE/UNIT line, a
    sample's name; ``""`` for any other comment."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE", "UNIT") else ""
    head = _HEAD.match(line)
    return head.group() if head is not None else ""


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


@dataclass
class _Family:
    name: str
    type: str
    samples: list[Sample]


class _Grouper:
    """prometheus_client's text parser's grouping of lines into families, on decoded lines."""

    def __init__(self) -> None:
        self.out: list[_Family] = []
        self.name = ""
        self.type = "untyped"
        self.samples: list[Sample] = []
        self.allowed: tuple[str, ...] = ()

    def _emit(self, name: str, typ: str, samples: list[Sample]) -> None:
        if typ not in _TYPES:
            raise _OddLineError  # prometheus_client raises on the family; let it say so
        if typ == "counter":
            if name.endswith("_total"):
                name = name[: -len("_total")]
                if not name:
                    raise _OddLineError  # a family named "" : prometheus_client refuses it
            else:
                samples = [(s[0] + "_total", s[1], s[2]) for s in samples]
        self.out.append(_Family(name, "unknown" if typ == "untyped" else typ, samples))

    def help(self, name: str) -> None:
        if name != self.name:
            if self.name:
                self._emit(self.name, self.type, self.samples)
            self.name, self.type, self.samples, self.allowed = name, "untyped", [], (name,)

    def type_line(self, name: str, typ: str) -> None:
        if name != self.name:
            if self.name:
                self._emit(self.name, self.type, self.samples)
            self.name, self.samples = name, []
        self.type = typ
        self.allowed = tuple(name + s for s in _ALLOWED.get(typ, ("",)))

    def sample(self, sample: Sample) -> None:
        if sample[0] in self.allowed:
            self.samples.append(sample)
            return
        if self.name:
            self._emit(self.name, self.type, self.samples)
        self.name, self.type, self.samples, self.allowed = "", "untyped", [], ()
        self._emit(sample[0], "untyped", [sample])

    def finish(self) -> list[_Family]:
        if self.name:
            self._emit(self.name, self.type, self.samples)
            self.name = ""
        return self.out


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _clean(family: _Family) -> None:
    """:func:`exporter.engines.parse._clean` on decoded samples."""
    if family.type not in _WITH_SERIES_PARTS:
        family.samples = [s for s in family.samples if _finite(s[2])]
        return
    bad = {_series(s[1]) for s in family.samples if not _finite(s[2])}
    if bad:
        family.samples = [s for s in family.samples if _series(s[1]) not in bad]


def _series(labels: Labels) -> Labels:
    return tuple(kv for kv in labels if kv[0] not in ("le", "quantile"))


def _index(families: list[_Family]) -> SampleIndex:
    """:func:`~exporter.engines.parse._merged` then
    :func:`~exporter.engines.rules.index_samples`: blocks of one name merged in order of
    first appearance, the first value of a repeated series kept."""
    order: dict[str, list[_Family]] = {}
    for family in families:
        _clean(family)
        order.setdefault(family.name, []).append(family)
    index: SampleIndex = {}
    for blocks in order.values():
        for block in blocks:
            for name, labels, value in block.samples:
                series = index.get(name)
                if series is None:
                    index[name] = {labels: value}
                elif labels not in series:
                    series[labels] = value
    return index


def scan(text: str, keys: frozenset[str], pause: Callable[[], None] = no_pause) -> Scanned:
    """Index the samples of the families in ``keys`` (names and family keys, see
    :func:`family_key`) and collect every family and sample name. Raises :class:`ValueError`
    when a kept line is malformed (as :func:`~exporter.engines.parse.parse_exposition`).

    ``pause`` is called every 256 kept lines (the engine poller passes
    :meth:`exporter.priority.ScrapeGate.step_aside`)."""
    kept, families, samples = _kept_lines(text, keys, pause)
    try:
        return Scanned(_index(_grouped(kept, pause)), families, samples)
    except _OddLineError:
        pass
    # An unusual kept line: prometheus_client reads the kept text (and raises as before).
    parsed = parse_exposition("\n".join(kept) + "\n", pause)
    return Scanned(dict(index_samples(parsed)), families, samples, fast=False)


def _grouped(kept: list[str], pause: Callable[[], None]) -> list[_Family]:
    """The kept lines decoded and grouped into families; :class:`_OddLineError` for a line
    of another shape than the plain one."""
    grouper = _Grouper()
    # Label sets repeat (one per model across a model's families): decoded once.
    decoded: dict[str, Labels] = {}
    fullmatch = _SAMPLE.fullmatch
    # The current family's names and samples, kept in locals (the hot loop's lookups).
    allowed, current = grouper.allowed, grouper.samples
    for start in range(0, len(kept), 256):
        pause()
        for line in kept[start : start + 256]:
            if line[0] == "#":
                _comment(grouper, line)
                allowed, current = grouper.allowed, grouper.samples
                continue
            match = fullmatch(line)
            if match is None:
                raise _OddLineError
            name, label_text, text = match.groups()
            value = float(text)
            if value == 0.0 and text[0] == "-" and text[1:].isdigit():
                value = 0.0  # prometheus_client reads "-0" as the integer 0, not as -0.0
            if not label_text:
                labels: Labels = ()
            else:
                found = decoded.get(label_text)
                labels = found if found is not None else _labels(label_text, decoded)
            if name in allowed:
                current.append((name, labels, value))
            else:
                grouper.sample((name, labels, value))
                allowed, current = grouper.allowed, grouper.samples
    return grouper.finish()


def _labels(label_text: str, decoded: dict[str, Labels]) -> Labels:
    """The sorted label pairs of a label text (remembered in ``decoded``). A bucket's labels
    are the series' labels plus ``le``: the series' part is decoded once for all buckets."""
    if _LABEL_LIST.fullmatch(label_text) is None:
        raise _OddLineError
    at = label_text.find('le="')
    if (at == 0 or (at > 0 and label_text[at - 1] == ",")) and "\\" not in label_text:
        end = label_text.index('"', at + 4)
        rest = label_text[:at] + label_text[end + 2 :]
        if 'le="' not in rest:
            base = decoded.get(rest)
            if base is None:
                base = _labels(rest, decoded)
            pair = ("le", label_text[at + 4 : end])
            where = bisect_left(base, pair)
            labels = decoded[label_text] = (*base[:where], pair, *base[where:])
            return labels
    pairs = _LABEL.findall(label_text)
    if len({name for name, _ in pairs}) != len(pairs):
        raise _OddLineError  # a label given twice: prometheus_client refuses the line
    if "\\" in label_text:
        pairs = [(k, _unescape(v)) for k, v in pairs]
    pairs.sort()
    labels = decoded[label_text] = tuple(pairs)
    return labels


def _wanted(name: str, keys: frozenset[str]) -> bool:
    return name in keys or family_key(name) in keys


def _kept_lines(
    text: str, keys: frozenset[str], pause: Callable[[], None]
) -> tuple[list[str], set[str], set[str]]:
    """The kept lines (stripped) and every family and sample name, line by line as
    ``select_families`` reads them."""
    families: set[str] = set()
    samples: set[str] = set()
    kept: list[str] = []
    relevant: dict[str, bool] = {}
    head = _HEAD.match
    for number, raw in enumerate(text.splitlines()):
        if not number & 255:
            pause()
        if not raw:
            continue
        first = raw[0]
        if first != "#" and not first.isspace() and not raw[-1].isspace():
            # the common sample line: no blanks around it, its name up to {, space or tab
            line = raw
            name = head(raw).group()  # type: ignore[union-attr]  # matches every string
            if not name:
                continue
            samples.add(name)
        else:
            line = raw.strip()
            if not line:
                continue
            name = line_name(line)
            if not name:
                continue
            (families if line[0] == "#" else samples).add(name)
        wanted = relevant.get(name)
        if wanted is None:
            wanted = relevant[name] = _wanted(name, keys)
        if wanted:
            kept.append(line)
    return kept, families, samples


def _comment(grouper: _Grouper, line: str) -> None:
    match = _COMMENT.fullmatch(line)
    if match is None:
        if "HELP" in line or "TYPE" in line:
            raise _OddLineError
        return  # "# UNIT ...": prometheus_client's text parser skips it
    kind, name, rest = match.groups()
    if kind == "HELP":
        grouper.help(name)
        return
    if rest is None or rest not in _TYPES:
        raise _OddLineError
    grouper.type_line(name, rest)
