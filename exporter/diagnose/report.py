"""A diagnosis as text for people (:func:`as_text`) or as a JSON document (:func:`as_json`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from exporter.config import format_duration as duration
from exporter.diagnose.model import Condition, Finding, Report, format_value, json_number
from exporter.signatures.model import fill
from exporter.signatures.promql import num
from exporter.signatures.render import runbook_url


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="seconds")


def _texts(finding: Finding) -> tuple[str, str]:
    """The alert's summary and description, filled in as Alertmanager would show them."""
    values = {"target": finding.target}
    values.update({f"labels.{k}": v for k, v in finding.instance.labels})
    values.update({e.key: e.text for e in finding.evidence})
    return fill(finding.rule.summary, values), fill(finding.rule.description, values)


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
                        "value": json_number(e.value),
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
    value = format_value("%.4g", c.value)
    threshold = format_value("%.4g", c.threshold)
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
