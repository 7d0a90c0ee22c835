"""``custom``: any in-house server, through a YAML mapping file (``--engine.mapping-file``).

The file maps source metrics to normalised names::

    # Label that carries the model name, for every entry (optional; default: none, model "").
    model_label: model
    metrics:
      - target: inference_queue_depth        # a normalised name (see NORMALISED)
        source: myserver_pending_requests    # the name as exposed (counters with or
                                             # without _total)
        labels:                              # optional matchers, all must hold
          queue: interactive                 #   equal
          shard: {regex: "0|1"}              #   full-match regex
          state: {not: paused}               #   not equal
          pool: {not_regex: "batch-.*"}      #   not matching
      - target: inference_time_to_first_token_seconds
        source: myserver_ttft_milliseconds   # a histogram (or a summary: +Inf bucket only)
        scale: 0.001                         # optional multiplier: ms -> s (bucket bounds
                                             # and _sum of histograms)
        model_label: served_model            # optional, per entry; "" for none
      - target: inference_prompt_tokens_total
        source: myserver_request_prompt_tokens_sum   # a histogram's _sum works as a counter

Histogram targets read ``<source>_bucket/_sum/_count``; gauge and counter targets read the
source's samples. Several entries with one target are added together (two queues). Entries of
the file come first; the identity mapping is the fallback for every normalised name: a server
instrumented with our own names (``exporter.instrument``) is read as is, model from its
``model`` label (the tokenizer latency has no model). So ``custom`` without a file is the
identity mapping alone.

:func:`load_mapping` is the only function of the package that reads a file; its errors are
:class:`ValueError` with one ``file: where: problem`` line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from exporter.engines.rules import (
    NORMALISED,
    Aggregate,
    LabelMatcher,
    MatchOp,
    Rule,
    Source,
    rule,
)
from exporter.metrics import BY_NAME

IDENTITY_MODEL_LABEL = "model"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_OPS: dict[str, MatchOp] = {"equal": "=", "not": "!=", "regex": "=~", "not_regex": "!~"}
_TOP_KEYS = {"model_label", "metrics"}
_ENTRY_KEYS = {"target", "source", "labels", "scale", "model_label"}


@dataclass(frozen=True)
class MappingEntry:
    """One line of the mapping: a source metric feeding a normalised name."""

    target: str
    source: Source


@dataclass(frozen=True)
class CustomMapping:
    """A parsed mapping file (``origin`` is its path, for messages)."""

    entries: tuple[MappingEntry, ...] = ()
    origin: str = ""


def identity_source(target: str) -> Source:
    """The source a server instrumented with the normalised names exposes ``target`` as."""
    model_label = IDENTITY_MODEL_LABEL if "model" in BY_NAME[target].labels else None
    return Source(target, model_label=model_label)


def rules(mapping: CustomMapping | None) -> tuple[Rule, ...]:
    """The rules of ``custom``: the mapping's entries per target, then the identity."""
    entries = mapping.entries if mapping is not None else ()
    out: list[Rule] = []
    for target in NORMALISED:
        mapped = tuple(e.source for e in entries if e.target == target)
        alternatives = ((mapped,) if mapped else ()) + ((identity_source(target),),)
        aggregate: Aggregate = "max" if target == "inference_kv_cache_usage_ratio" else "sum"
        out.append(rule(target, *alternatives, aggregate=aggregate))
    return tuple(out)


# --- loading -------------------------------------------------------------------------------------


class _MappingError(Exception):
    """A problem in the file, before the file name is put in front of it."""


def load_mapping(path: Path) -> CustomMapping:
    """Read and check a mapping file. Raises :class:`ValueError` ``"<file>: <problem>"``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from None
    try:
        return CustomMapping(_entries(data), origin=str(path))
    except _MappingError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)


def _entries(data: object) -> tuple[MappingEntry, ...]:
    if not isinstance(data, Mapping):
        raise _MappingError("expected a mapping with a 'metrics' list at the top")
    unknown = sorted(str(k) for k in data if k not in _TOP_KEYS)
    if unknown:
        raise _MappingError(f"unknown key {unknown[0]!r} (expected model_label, metrics)")
    default_model = _model_label(data.get("model_label"), "model_label")
    items = data.get("metrics")
    if not isinstance(items, list) or not items:
        raise _MappingError("metrics: expected a non-empty list of mappings")
    return tuple(_entry(item, f"metrics[{i}]", default_model) for i, item in enumerate(items))


def _entry(item: object, where: str, default_model: str | None) -> MappingEntry:
    if not isinstance(item, Mapping):
        raise _MappingError(f"{where}: expected a mapping with target and source")
    unknown = sorted(str(k) for k in item if k not in _ENTRY_KEYS)
    if unknown:
        raise _MappingError(
            f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(_ENTRY_KEYS))})"
        )
    target = item.get("target")
    if not isinstance(target, str) or target not in NORMALISED:
        raise _MappingError(
            f"{where}.target: unknown normalised metric {target!r} "
            f"(one of: {', '.join(NORMALISED)})"
        )
    source = item.get("source")
    if not isinstance(source, str) or not _METRIC_NAME.fullmatch(source):
        raise _MappingError(f"{where}.source: not a metric name: {source!r}")
    model_label = (
        _model_label(item["model_label"], f"{where}.model_label")
        if "model_label" in item
        else default_model
    )
    return MappingEntry(
        target,
        Source(
            source,
            _matchers(item.get("labels"), f"{where}.labels"),
            model_label=model_label,
            scale=_scale(item.get("scale", 1.0), f"{where}.scale"),
        ),
    )


def _model_label(value: object, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _LABEL_NAME.fullmatch(value):
        raise _MappingError(f"{where}: not a label name: {value!r}")
    return value


def _scale(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _MappingError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _MappingError(f"{where}: must be a positive finite number, got {value!r}")
    return float(value)


def _matchers(value: object, where: str) -> tuple[LabelMatcher, ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise _MappingError(f"{where}: expected a mapping of label name to matcher")
    return tuple(_matcher(name, spec, f"{where}.{name}") for name, spec in value.items())


def _matcher(name: object, spec: object, where: str) -> LabelMatcher:
    if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name):
        raise _MappingError(f"{where}: not a label name: {name!r}")
    op: MatchOp = "="
    if isinstance(spec, Mapping):
        if len(spec) != 1 or next(iter(spec)) not in _OPS:
            raise _MappingError(
                f"{where}: expected one of {', '.join(sorted(_OPS))} as the only key, "
                f"got {sorted(str(k) for k in spec)}"
            )
        key, spec = next(iter(spec.items()))
        op = _OPS[key]
    if isinstance(spec, bool) or not isinstance(spec, str | int):
        raise _MappingError(f"{where}: expected a string value, got {spec!r}")
    try:
        return LabelMatcher(name, op, str(spec))
    except re.error as exc:
        raise _MappingError(f"{where}: invalid regex {spec!r}: {exc}") from None
