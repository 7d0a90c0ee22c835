"""``inference-bottleneck-exporter diagnose``: which bottleneck signatures hold right now.

Two sources, one verdict:

``--prometheus.url URL``
    evaluates the catalogue's alert expressions and evidence through the Prometheus HTTP API
    (``/api/v1/query``). The Prometheus must hold the pack's recording rules for the same
    profile and site config (``--profile``, ``--config``); the alerts' ``ALERTS`` state is
    shown when the alerting rules are loaded too.
``--target URL``
    no Prometheus: samples the sidecar's ``/metrics`` every ``--interval`` over
    ``--duration`` and evaluates the pack's recording rules and alert expressions itself
    (:mod:`exporter.diagnose.promql`): rates, ratios, derivatives and histogram medians come
    from the samples, every window is the sampling span. Signatures that compare with the
    past (the HBM signature's 1h baseline) need Prometheus history and are listed as such.

Each alert expression is split at its ``and``/``or``/``unless`` into conditions; every
comparison is measured against its threshold. A signature *holds* when its expression would
return the instance now (``for`` not considered: the text says how long the alert waits),
and *nearly holds* when every condition that fails misses its threshold by at most
``--nearly`` (default 10 %) of the threshold. The verdict lists what holds first
(critical before warning before info, then the clearest margin), then what nearly holds
(closest first), with the evidence numbers, the alert's own summary and description, and the
runbook link.

Exit codes: 0 nothing holds, 1 at least one signature holds, 2 usage, configuration or
connection error (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from exporter.backends.http import FetchError, fetch, make_session
from exporter.config import EXIT_USAGE, ArgumentParser, parse_duration
from exporter.config import format_duration as duration
from exporter.diagnose.promql import (
    NAME,
    SET_OPS,
    Binary,
    Evaluator,
    Labels,
    NeedsHistoryError,
    Node,
    Num,
    PromQLError,
    Sample,
    Scrape,
    Value,
    compare,
    match_key,
    parse,
    source,
    unparen,
)
from exporter.engines.parse import parse_exposition
from exporter.signatures.catalogue import catalogue
from exporter.signatures.config import PROFILES, SignatureConfigError, SiteConfig, load_config
from exporter.signatures.model import AlertRule, Evidence, Signature, fill
from exporter.signatures.promql import matchers, num, split_matchers
from exporter.signatures.render import runbook_url
from exporter.signatures.sources import recording_rules

PROG = "inference-bottleneck-exporter diagnose"
EXIT_NONE, EXIT_FOUND, EXIT_ERROR = 0, 1, EXIT_USAGE
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
ORDERED = frozenset({">", "<", ">=", "<="})
MAX_BODY = 16 * 1024 * 1024
DEFAULT_METRICS_PATH = "/metrics"


class DiagnoseError(Exception):
    """Something the user can fix; ``str()`` is the one line printed."""


# --- results ----------------------------------------------------------------------------------


@dataclass
class Condition:
    """One comparison (or presence test) of an alert expression, for one instance."""

    expr: str
    op: str | None
    value: float | None
    threshold: float | None = None
    threshold_expr: str | None = None
    holds: bool = False
    nearly: bool = False
    gap: float | None = None  # |value - threshold| / |threshold|

    def as_json(self) -> dict[str, Any]:
        return {
            "expr": self.expr,
            "op": self.op,
            "value": _json_number(self.value),
            "threshold": _json_number(self.threshold),
            "threshold_expr": self.threshold_expr,
            "holds": self.holds,
            "nearly": self.nearly,
            "relative_gap": _json_number(self.gap),
        }


@dataclass
class Instance:
    labels: Labels
    holds: bool
    nearly: bool
    value: float | None
    conditions: list[Condition]

    def get(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass
class EvidenceValue:
    key: str
    label: str
    value: float | None
    unit: str
    text: str


_STATE_RANK = {"firing": 0, "pending": 1}


@dataclass
class Finding:
    sig: Signature
    rule: AlertRule
    instance: Instance
    target: str
    evidence: list[EvidenceValue]
    state: str | None = None

    @property
    def status(self) -> str:
        return "holds" if self.instance.holds else "nearly"

    def sort_key(self) -> tuple[float, ...]:
        severity = float(SEVERITY_RANK[self.rule.severity])
        conditions = self.instance.conditions
        if self.instance.holds:
            # Among signatures that hold: by severity, then an alert already firing (it held
            # for its whole `for`) before a pending one before none, then by margin.
            persisted = float(_STATE_RANK.get(self.state or "", len(_STATE_RANK)))
            margins = [c.gap for c in conditions if c.holds and c.gap is not None]
            return (0.0, severity, persisted, -min(margins, default=math.inf))
        gaps = [c.gap for c in conditions if c.nearly and c.gap is not None]
        return (1.0, max(gaps, default=0.0), severity)


@dataclass
class Report:
    mode: str
    source: str
    cfg: SiteConfig
    margin: float
    evaluated_at: float
    findings: list[Finding] = field(default_factory=list)
    not_evaluated: dict[str, str] = field(default_factory=dict)
    no_data: list[str] = field(default_factory=list)
    checked: int = 0
    samples: int = 0
    span: float = 0.0

    @property
    def found(self) -> bool:
        return any(f.instance.holds for f in self.findings)


# --- backends ---------------------------------------------------------------------------------


class Backend(Protocol):
    async def value(self, text: str, node: Node) -> Value: ...


class TargetBackend:
    """Evaluates over scrapes of the sidecar with :class:`exporter.diagnose.promql.Evaluator`."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    async def value(self, text: str, node: Node) -> Value:
        return self.evaluator.eval(node)


class PrometheusBackend:
    """Instant queries through ``/api/v1/query``, all at one evaluation time."""

    def __init__(self, session: Any, base: str, timeout: float, at: float) -> None:
        self.session = session
        self.endpoint = base.rstrip("/") + "/api/v1/query"
        self.timeout = timeout
        self.at = at

    async def value(self, text: str, node: Node) -> Value:
        return await self.query(text)

    async def query(self, expr: str) -> Value:
        params = urllib.parse.urlencode({"query": expr, "time": f"{self.at:.3f}"})
        try:
            result = await fetch(
                self.session,
                f"{self.endpoint}?{params}",
                timeout=self.timeout,
                max_bytes=MAX_BODY,
                headers={"Accept": "application/json"},
            )
            body = json.loads(result.body)
        except FetchError as err:
            if err.reason == "status" and err.status in (400, 422):
                raise PromQLError(f"Prometheus rejected {expr!r}") from None
            raise DiagnoseError(f"cannot query {self.endpoint}: {err.message}") from None
        except ValueError:
            raise DiagnoseError(f"{self.endpoint} did not answer with JSON") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", "unknown error") if isinstance(body, dict) else "?"
            raise PromQLError(f"Prometheus: {error}")
        data = body.get("data", {})
        kind, result_data = data.get("resultType"), data.get("result")
        if kind == "scalar":
            return _float(result_data[1])
        if kind != "vector":
            raise PromQLError(f"unexpected result type {kind!r}")
        return [
            Sample(tuple(sorted(item["metric"].items())), _float(item["value"][1]))
            for item in result_data
        ]


def _float(text: object) -> float:
    try:
        return float(str(text))
    except ValueError:
        return math.nan


# --- evaluation of one alert rule -------------------------------------------------------------


def _closeness(op: str, value: float, threshold: float, margin: float) -> tuple[bool, bool, float]:
    """holds, nearly, relative gap of ``value op threshold``."""
    if math.isnan(value) or math.isnan(threshold):
        return False, False, math.nan
    holds = compare(op, value, threshold)
    if op not in ORDERED or threshold == 0 or math.isinf(threshold):
        return holds, False, math.nan
    gap = abs(value - threshold) / abs(threshold)
    return holds, (not holds and margin > 0 and gap <= margin), gap


async def _instances(backend: Backend, text: str, node: Node, margin: float) -> list[Instance]:
    node = unparen(node)
    if isinstance(node, Binary) and node.op in SET_OPS:
        left = await _instances(backend, text, node.lhs, margin)
        right = await _instances(backend, text, node.rhs, margin)
        return _combine(node, left, right, source(text, node.rhs))
    if isinstance(node, Binary) and node.is_filter:
        return await _comparison(backend, text, node, margin)
    value = await backend.value(source(text, node), node)
    if isinstance(value, float):
        raise PromQLError(f"{source(text, node)} is a scalar, not a condition")
    expr = source(text, node)
    return [
        Instance(
            s.without_name(), True, False, s.value, [Condition(expr, None, s.value, holds=True)]
        )
        for s in value
    ]


async def _comparison(backend: Backend, text: str, node: Binary, margin: float) -> list[Instance]:
    lhs = await backend.value(source(text, node.lhs), node.lhs)
    rhs_node = unparen(node.rhs)
    rhs: Value = (
        rhs_node.value
        if isinstance(rhs_node, Num)
        else await backend.value(source(text, node.rhs), node.rhs)
    )
    if isinstance(lhs, float):
        raise PromQLError(f"{source(text, node.lhs)} is a scalar")
    index: dict[Labels, float] = {}
    if isinstance(rhs, list):
        index = {match_key(s.labels, node.on, node.ignoring): s.value for s in rhs}
    out = []
    for s in lhs:
        threshold = (
            rhs
            if isinstance(rhs, float)
            else index.get(match_key(s.labels, node.on, node.ignoring))
        )
        if threshold is None:
            continue
        holds, nearly, gap = _closeness(node.op, s.value, threshold, margin)
        condition = Condition(
            source(text, node.lhs),
            node.op,
            s.value,
            threshold,
            None if isinstance(rhs, float) else source(text, node.rhs),
            holds,
            nearly,
            None if math.isnan(gap) else gap,
        )
        out.append(Instance(s.without_name(), holds, nearly, s.value, [condition]))
    return out


def _rank(inst: Instance) -> int:
    return 0 if inst.holds else 1 if inst.nearly else 2


def _combine(node: Binary, left: list[Instance], right: list[Instance], rhs: str) -> list[Instance]:
    def key(inst: Instance) -> Labels:
        return match_key(inst.labels, node.on, node.ignoring)

    best: dict[Labels, Instance] = {}
    for inst in right:
        current = best.get(key(inst))
        if current is None or _rank(inst) < _rank(current):
            best[key(inst)] = inst
    out: list[Instance] = []
    if node.op == "and":
        for a in left:
            b = best.get(key(a))
            if b is None:
                missing = Condition(rhs, None, None)
                out.append(Instance(a.labels, False, False, a.value, [*a.conditions, missing]))
                continue
            holds = a.holds and b.holds
            nearly = not holds and (a.holds or a.nearly) and (b.holds or b.nearly)
            out.append(Instance(a.labels, holds, nearly, a.value, a.conditions + b.conditions))
        return out
    if node.op == "unless":
        for a in left:
            b = best.get(key(a))
            if b is not None and b.holds:
                excluded = Condition(rhs, "unless", b.value, holds=True)
                out.append(Instance(a.labels, False, False, a.value, [*a.conditions, excluded]))
            else:
                out.append(a)
        return out
    used: set[Labels] = set()
    for a in left:
        b = best.get(key(a))
        if b is None:
            out.append(a)
            continue
        used.add(key(a))
        holds = a.holds or b.holds
        nearly = not holds and (a.nearly or b.nearly)
        out.append(Instance(a.labels, holds, nearly, a.value, a.conditions + b.conditions))
    out += [b for b in right if key(b) not in used]
    return out


# --- evidence and text ------------------------------------------------------------------------


def _format(fmt: str, value: float | None) -> str:
    if value is None:
        return "?"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return fmt % value


async def _evidence(
    backend: Backend, cfg: SiteConfig, rule: AlertRule, inst: Instance
) -> list[EvidenceValue]:
    out = []
    for item in rule.evidence:
        value = (
            inst.value
            if item.expr is None
            else await _evidence_value(backend, cfg, rule, item, inst)
        )
        out.append(EvidenceValue(item.key, item.label, value, item.unit, _format(item.fmt, value)))
    return out


async def _evidence_value(
    backend: Backend, cfg: SiteConfig, rule: AlertRule, item: Evidence, inst: Instance
) -> float | None:
    scope = rule.scope if item.scope is None else item.scope
    wanted = {label: inst.get(label) for label in (*cfg.join_labels, *scope)}
    query = item.query(matchers(wanted))
    try:
        value = await backend.value(query, parse(query))
    except (NeedsHistoryError, PromQLError):
        return None
    if isinstance(value, float):
        return value
    return value[0].value if value else None


def target_name(cfg: SiteConfig, labels: dict[str, str]) -> str:
    """How the alerts name a scrape target: ``namespace/pod``, else ``instance``."""
    if labels.get("pod"):
        namespace = labels.get("namespace")
        return f"{namespace}/{labels['pod']}" if namespace else labels["pod"]
    for name in ("instance", *cfg.join_labels):
        if labels.get(name):
            return labels[name]
    return "-"


def _texts(finding: Finding) -> tuple[str, str]:
    values = {"target": finding.target}
    values.update({f"labels.{k}": v for k, v in finding.instance.labels})
    values.update({e.key: e.text for e in finding.evidence})
    return fill(finding.rule.summary, values), fill(finding.rule.description, values)


# --- the two modes ----------------------------------------------------------------------------


async def _evaluate(
    backend: Backend,
    report: Report,
    fixed_target: str | None,
    states: list[Sample] | None = None,
) -> None:
    cfg = report.cfg
    for sig in catalogue(cfg):
        data = False
        for rule in sig.rules:
            report.checked += 1
            try:
                found = await _instances(backend, rule.expr, parse(rule.expr), report.margin)
            except NeedsHistoryError as err:
                report.not_evaluated[sig.alert] = f"needs Prometheus history ({err})"
                continue
            except PromQLError as err:
                report.not_evaluated[sig.alert] = f"cannot evaluate here ({err})"
                continue
            data = data or bool(found)
            for inst in found:
                if not (inst.holds or inst.nearly):
                    continue
                labels = dict(inst.labels)
                target = fixed_target or target_name(cfg, labels)
                finding = Finding(
                    sig, rule, inst, target, await _evidence(backend, cfg, rule, inst)
                )
                if states is not None:
                    finding.state = _state(states, sig, rule, inst)
                report.findings.append(finding)
        if not data and sig.alert not in report.not_evaluated:
            report.no_data.append(sig.alert)
    report.findings.sort(key=Finding.sort_key)


def _state(states: list[Sample], sig: Signature, rule: AlertRule, inst: Instance) -> str | None:
    found = None
    for s in states:
        labels = dict(s.labels)
        if labels.get("alertname") != sig.alert or labels.get("severity") != rule.severity:
            continue
        if all(labels.get(k, "") == v for k, v in inst.labels):
            if labels.get("alertstate") == "firing":
                return "firing"
            found = labels.get("alertstate")
    return found


async def _prometheus(url: str, cfg: SiteConfig, timeout: float, margin: float) -> Report:
    at = time.time()
    report = Report("prometheus", url, cfg, margin, at)
    async with make_session() as session:
        backend = PrometheusBackend(session, url, timeout, at)
        await _check_records(backend, cfg, url)
        states = await backend.query('ALERTS{alertname=~"Inference.+"}')
        assert isinstance(states, list)
        await _evaluate(backend, report, None, states)
    return report


async def _check_records(backend: PrometheusBackend, cfg: SiteConfig, url: str) -> None:
    """Fail with one line unless this Prometheus holds this profile's recording rules."""
    present = await backend.query('count by (__name__) ({__name__=~"inference(_gpu)?:.+"})')
    assert isinstance(present, list)
    names = {s.get(NAME) for s in present}
    if not names:
        sidecars = await backend.query("count(inference_exporter_build_info)")
        count = sidecars[0].value if isinstance(sidecars, list) and sidecars else 0
        if count:
            raise DiagnoseError(
                f"{url} scrapes {count:.0f} sidecar(s) but has none of the pack's recording "
                "rules (inference:*): load alert_rules/recording_rules.yaml, or use --target"
            )
        raise DiagnoseError(
            f"{url} has no inference-bottleneck-exporter series (inference_exporter_build_info)"
        )
    rules = recording_rules(cfg)
    # Windows appear in the names of the records that read a range.
    windowed = {r.record for r in rules if "[" in r.expr}
    unknown = sorted(names - {r.record for r in rules})
    if unknown and not names & windowed:
        example = f" (found e.g. {unknown[0]})"
        raise DiagnoseError(
            f"{url} holds recording rules of another profile or site config{example}; "
            f"pass the --profile and --config the loaded pack was generated with"
        )


def target_labels(cfg: SiteConfig) -> frozenset[str]:
    """Labels Prometheus attaches to a target: matchers on them do not apply to a scrape."""
    names = set(cfg.join_labels)
    for text in (cfg.selectors.exporter, cfg.selectors.sidecar, cfg.selectors.dcgm):
        for matcher in split_matchers(text) if text.strip() else []:
            names.add(matcher.split("=")[0].rstrip("!~"))
    return frozenset(names)


def metrics_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DiagnoseError(f"{url!r} is not an http(s) URL")
    if parts.path in ("", "/"):
        parts = parts._replace(path=DEFAULT_METRICS_PATH)
    return urllib.parse.urlunsplit(parts)


async def _scrapes(url: str, span: float, interval: float, timeout: float) -> list[Scrape]:
    count = max(2, int(span // interval) + 1)
    step = span / (count - 1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    out: list[Scrape] = []
    async with make_session() as session:
        for i in range(count):
            delay = start + i * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                result = await fetch(session, url, timeout=timeout, max_bytes=MAX_BODY)
            except FetchError as err:
                raise DiagnoseError(f"cannot read {url}: {err.message}") from None
            try:
                families = parse_exposition(result.body.decode("utf-8", errors="replace"))
            except ValueError as err:
                raise DiagnoseError(f"{url} is not a Prometheus exposition ({err})") from None
            samples: dict[Labels, float] = {}
            for family in families:
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    labels = tuple(sorted({**sample.labels, NAME: sample.name}.items()))
                    samples[labels] = float(sample.value)
            if i == 0 and not any(
                dict(k).get(NAME) == "inference_exporter_build_info" for k in samples
            ):
                raise DiagnoseError(
                    f"{url} is not an inference-bottleneck-exporter /metrics page "
                    "(no inference_exporter_build_info)"
                )
            out.append(Scrape(time.time(), samples))
    return out


async def _target(
    url: str, cfg: SiteConfig, *, span: float, interval: float, timeout: float, margin: float
) -> Report:
    scrapes = await _scrapes(url, span, interval, timeout)
    baseline = cfg.window("baseline")
    evaluator = Evaluator(
        scrapes,
        ignored_labels=target_labels(cfg),
        # Window offsets (new Xid counters) compare with the first sample; the baseline
        # compares a rate with its value an hour earlier, which samples cannot give.
        needs_history=lambda seconds: seconds == baseline,
    )
    for rule in recording_rules(cfg):
        try:
            evaluator.record(rule.record, rule.expr)
        except PromQLError as err:
            raise DiagnoseError(f"recording rule {rule.record}: {err}") from None
    report = Report("target", url, cfg, margin, scrapes[-1].time)
    report.samples, report.span = len(scrapes), evaluator.span
    await _evaluate(TargetBackend(evaluator), report, url)
    return report


# --- output -----------------------------------------------------------------------------------


def _json_number(value: float | None) -> float | str | None:
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return value


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="seconds")


def as_json(report: Report) -> dict[str, Any]:
    findings = []
    for rank, f in enumerate(report.findings, 1):
        summary, description = _texts(f)
        findings.append(
            {
                "rank": rank,
                "alert": f.sig.alert,
                "status": f.status,
                "severity": f.rule.severity,
                "signature": f.sig.group,
                "target": f.target,
                "labels": dict(f.instance.labels),
                "summary": summary,
                "description": description,
                "evidence": [
                    {
                        "key": e.key,
                        "label": e.label,
                        "value": _json_number(e.value),
                        "unit": e.unit,
                        "text": e.text,
                    }
                    for e in f.evidence
                ],
                "conditions": [c.as_json() for c in f.instance.conditions],
                "for": duration(f.rule.for_seconds),
                "alert_state": f.state,
                "runbook_url": runbook_url(report.cfg, f.sig.alert),
            }
        )
    out: dict[str, Any] = {
        "mode": report.mode,
        "source": report.source,
        "profile": report.cfg.profile.name,
        "evaluated_at": _iso(report.evaluated_at),
        "nearly_within": report.margin,
        "verdict": "found" if report.found else "none",
        "holds": sum(1 for f in report.findings if f.instance.holds),
        "nearly": sum(1 for f in report.findings if not f.instance.holds),
        "checked_rules": report.checked,
        "findings": findings,
        "not_evaluated": [
            {"alert": alert, "reason": reason} for alert, reason in report.not_evaluated.items()
        ],
        "no_data": report.no_data,
    }
    if report.mode == "target":
        out["samples"] = report.samples
        out["span_seconds"] = round(report.span, 3)
    return out


def _condition_text(c: Condition) -> str:
    if c.op is None and c.value is None:
        return f"{c.expr}: no data"
    if c.op is None:
        return f"{c.expr} present"
    if c.op == "unless":
        return f"excluded: {c.expr} present"
    value = _format("%.4g", c.value)
    threshold = _format("%.4g", c.threshold)
    against = f"{c.threshold_expr} = {threshold}" if c.threshold_expr else threshold
    if c.holds:
        state = "holds"
    elif c.nearly and c.gap is not None:
        state = f"nearly: {100 * c.gap:.0f} % short"
    else:
        state = "does not hold"
    return f"{c.expr} = {value} {c.op} {against}  ({state})"


def as_text(report: Report) -> str:
    holds = sum(1 for f in report.findings if f.instance.holds)
    nearly = len(report.findings) - holds
    where = (
        f"{report.source}, {report.samples} samples over {report.span:.0f}s "
        "(every window is the sampling span)"
        if report.mode == "target"
        else f"{report.source} at {_iso(report.evaluated_at)}"
    )
    pct = num(round(100 * report.margin, 6))
    lines = [
        f"diagnose {where}; profile {report.cfg.profile.name}",
        f"{holds} signature instance(s) hold, {nearly} nearly hold (within {pct} % of a "
        f"threshold); {report.checked} alert rules checked.",
    ]
    for rank, f in enumerate(report.findings, 1):
        summary, description = _texts(f)
        state = f", alert {f.state}" if f.state else ""
        lines += [
            "",
            f"{rank}. {f.status.upper():<6} {f.rule.severity:<8} {f.sig.alert} "
            f"[{f.sig.group}]{state}",
            f"   {summary}",
            f"   {description}",
        ]
        if f.evidence:
            evidence = "; ".join(f"{e.label} {e.text} {e.unit}".rstrip() for e in f.evidence)
            lines.append(f"   evidence: {evidence}")
        lines += [f"   condition: {_condition_text(c)}" for c in f.instance.conditions]
        wait = (
            f"fires after holding for {duration(f.rule.for_seconds)}; "
            if f.rule.for_seconds
            else ""
        )
        lines.append(f"   {wait}runbook: {runbook_url(report.cfg, f.sig.alert)}")
    if not report.findings:
        lines += ["", "No signature holds or nearly holds."]
    if report.not_evaluated:
        lines += ["", "Not evaluated:"]
        lines += [f"  {alert}: {reason}" for alert, reason in report.not_evaluated.items()]
    if report.no_data:
        lines += ["", f"No data (their inputs are absent): {', '.join(report.no_data)}"]
    return "\n".join(lines) + "\n"


# --- command line -----------------------------------------------------------------------------


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description=(
            "Rank the bottleneck signatures that hold (or nearly hold) now, from Prometheus "
            "or from a sidecar's /metrics."
        ),
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--prometheus.url",
        dest="prometheus_url",
        metavar="URL",
        help="evaluate the catalogue through this Prometheus's HTTP API",
    )
    where.add_argument(
        "--target",
        metavar="URL",
        help="sample this sidecar's /metrics and compute the signals here (no Prometheus)",
    )
    parser.add_argument(
        "--duration", default="60s", help="--target: how long to sample (default 60s)"
    )
    parser.add_argument(
        "--interval", default="5s", help="--target: time between samples (default 5s)"
    )
    parser.add_argument("--config", type=Path, help="site config of the rule pack (YAML)")
    parser.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default="sidecar",
        help="profile of the pack loaded in Prometheus (default sidecar)",
    )
    parser.add_argument("--output", choices=("text", "json"), default="text")
    parser.add_argument(
        "--nearly",
        type=float,
        default=0.1,
        metavar="RATIO",
        help="'nearly holds': every failing condition within this share of its threshold "
        "(default 0.1)",
    )
    parser.add_argument(
        "--timeout", default="10s", help="deadline of each HTTP request (default 10s)"
    )
    return parser


def _seconds(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise DiagnoseError(f"{flag}: {err}") from None
    if seconds <= 0:
        raise DiagnoseError(f"{flag}: must be longer than 0s")
    return seconds


def _run(args: argparse.Namespace) -> Report:
    timeout = _seconds(args.timeout, "--timeout")
    if not 0 <= args.nearly < 1 or math.isnan(args.nearly):
        raise DiagnoseError("--nearly: must be a ratio from 0 to below 1")
    try:
        cfg = load_config(args.config, args.profile)
    except SignatureConfigError as err:
        prefix = (
            f"{args.config}: " if args.config and not str(err).startswith(str(args.config)) else ""
        )
        raise DiagnoseError(f"{prefix}{err}") from None
    if args.prometheus_url is not None:
        url = args.prometheus_url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DiagnoseError(f"--prometheus.url: {url!r} is not an http(s) URL")
        return asyncio.run(_prometheus(url, cfg, timeout, args.nearly))
    if cfg.profile.source != "sidecar":
        raise DiagnoseError(
            f"--target reads the sidecar only; profile {cfg.profile.name!r} needs --prometheus.url"
        )
    span = _seconds(args.duration, "--duration")
    interval = _seconds(args.interval, "--interval")
    url = metrics_url(args.target)
    if sys.stderr.isatty():
        sys.stderr.write(f"sampling {url} for {args.duration}...\n")
    return asyncio.run(
        _target(url, cfg, span=span, interval=interval, timeout=timeout, margin=args.nearly)
    )


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        report = _run(args)
    except DiagnoseError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return EXIT_ERROR
    if args.output == "json":
        sys.stdout.write(json.dumps(as_json(report), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(as_text(report))
    return EXIT_FOUND if report.found else EXIT_NONE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
