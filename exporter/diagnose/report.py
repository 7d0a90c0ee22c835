"""A diagnosis as text for people (:func:`as_text`) or as a JSON document (:func:`as_json`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from exporter.config import format_duration as duration
from exporter.diagnose.advice import scaling_advice
from exporter.diagnose.diagnosis import Report
from exporter.diagnose.findings import (
    Condition,
    Finding,
    PoolBudget,
    Roofline,
    format_value,
    json_number,
    workload_advice,
)
from exporter.signatures.definitions import fill_placeholders
from exporter.signatures.params import PREFILL_PRECISION
from exporter.signatures.promql_text import num
from exporter.signatures.render import runbook_url


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat(timespec="seconds")


def texts(finding: Finding) -> tuple[str, str]:
    """The alert's summary and description, filled in as Alertmanager would show them."""
    values = {"target": finding.target}
    values.update({f"labels.{k}": v for k, v in finding.instance.labels})
    values.update({e.key: e.text for e in finding.evidence})
    return fill_placeholders(finding.rule.summary, values), fill_placeholders(
        finding.rule.description, values
    )


# --- roofline and latency budget --------------------------------------------------------------


def _share(ratio: float) -> str:
    return f"{100 * ratio:.0f} %"


def roofline_summary(r: Roofline) -> str:
    """The one line: how far decode is from its floor, and where a request's time goes."""
    parts = []
    efficiency, floor, itl = r.get("efficiency"), r.get("floor"), r.get("itl")
    if efficiency is not None and floor is not None and itl is not None:
        parts.append(
            f"decode at {_share(efficiency)} of its HBM floor ({1000 * floor:.1f} ms floor, "
            f"{1000 * itl:.1f} ms observed)"
        )
    elif efficiency is not None:
        parts.append(
            f"decode reads {_share(efficiency)} of the peak HBM bandwidth (the engine's estimate; "
            "no model facts for the floor)"
        )
    budget = [r.get(key) for key in ("e2e", "queue", "prefill", "decode", "host")]
    if all(value is not None for value in budget):
        e2e, queue, prefill, decode, host = (float(v or 0.0) for v in budget)
        transfer = r.get("transfer")
        moved = "" if transfer is None else f"KV transfer {_share(transfer)}, "
        parts.append(
            f"of {e2e:.1f} s end to end: queue {_share(queue)}, prefill {_share(prefill)}, "
            f"{moved}decode {_share(decode)}, host {_share(host)}"
        )
    communication = r.communication_share
    if communication is not None:
        gpus = r.get("gpus")
        over = "" if gpus is None else f" of its {gpus:.0f} GPUs"
        parts.append(
            f"communication at least {_share(communication)} of a step (NVLink{over} at "
            f"{_share(communication)} of its peak)"
        )
    return "; ".join(parts) or "no roofline figures (see docs/roofline.md for their inputs)"


def _joules(value: float) -> str:
    return f"{value:.3g} J"


def energy_line(r: Roofline, currency: str) -> str | None:
    """What a token of the model costs on the target: joules per generated and per prompt
    token, the GPUs' power and the share of it spent idle, and the cost per million tokens
    where the site prices a GPU-hour; ``None`` without an energy figure."""
    generated, prompt = r.get("joules_generated"), r.get("joules_prompt")
    if generated is None and prompt is None:
        return None
    per = [
        f"{_joules(v)} per {kind} token"
        for kind, v in (("generated", generated), ("prompt", prompt))
        if v is not None
    ]
    power, idle, gpus = r.get("power"), r.get("idle_energy"), r.get("gpus")
    draw = []
    if power is not None:
        over = "" if gpus is None else f" over {gpus:.0f} GPU{'s' if gpus != 1 else ''}"
        draw.append(f"{power:.0f} W{over}")
    if idle is not None:
        draw.append(f"{_share(idle)} of the energy idle")
    line = f"energy: {', '.join(per)}" + (f" ({', '.join(draw)})" if draw else "")
    costs = [
        f"{v:.3g} {currency} per million {kind} tokens"
        for kind, v in (("generated", r.get("cost_generated")), ("prompt", r.get("cost_prompt")))
        if v is not None
    ]
    if costs:
        hourly = r.get("cost_per_hour")
        rate = "" if hourly is None else f" (the GPUs: {hourly:.2f} {currency} an hour)"
        line += f"; cost: {', '.join(costs)}{rate}"
    return line


def _roofline_details(r: Roofline) -> list[str]:
    lines = []
    tokens, roofline, share = r.tokens_per_second, r.get("roofline_tokens"), r.get("throughput")
    if tokens is not None and roofline is not None and share is not None:
        lines.append(
            f"throughput: {tokens:.0f} tokens/s, {_share(share)} of the {roofline:.0f} tokens/s "
            "its batch would reach with every step at the floor"
        )
    prefill = r.get("prefill_efficiency")
    if prefill is not None:
        lines.append(
            f"prefill at {_share(prefill)} of the {PREFILL_PRECISION} tensor peak (FLOPs of the "
            "computed prompt tokens per second of prefill; batched prefills read low)"
        )
    prompt, output = r.get("prompt_tokens"), r.get("output_tokens")
    if prompt is not None and output is not None:
        split = r.engine_time_split
        time = (
            f", prefill {_share(split[0])} and decode {_share(split[1])} of the engine's time"
            if split is not None
            else ""
        )
        lines.append(
            f"workload: {prompt:.0f} prompt and {output:.0f} output tokens per request{time}; "
            f"{workload_advice(prompt, output)}"
        )
    return lines


def _roofline_json(r: Roofline) -> dict[str, Any]:
    split = r.engine_time_split
    return {
        "target": r.target,
        "labels": dict(r.labels),
        "model": r.model,
        "summary": roofline_summary(r),
        "decode": {
            "efficiency": r.get("efficiency"),
            "floor_seconds": r.get("floor"),
            "observed_seconds": r.get("itl"),
            "source": r.decode_source,
        },
        "throughput": {
            "tokens_per_second": r.tokens_per_second,
            "roofline_tokens_per_second": r.get("roofline_tokens"),
            "share": r.get("throughput"),
        },
        "prefill_efficiency": r.get("prefill_efficiency"),
        "interconnect": {
            "gpus": r.get("gpus"),
            "nvlink_utilization": r.get("nvlink"),
            "communication_share_at_least": r.communication_share,
        },
        "latency_budget": {
            "e2e_seconds": r.get("e2e"),
            "queue": r.get("queue"),
            "prefill": r.get("prefill"),
            "decode": r.get("decode"),
            "transfer": r.get("transfer"),
            "host": r.get("host"),
        },
        "energy": {
            "joules_per_generated_token": r.get("joules_generated"),
            "joules_per_prompt_token": r.get("joules_prompt"),
            "power_watts": r.get("power"),
            "idle_energy_share": r.get("idle_energy"),
            "cost_per_million_generated_tokens": r.get("cost_generated"),
            "cost_per_million_prompt_tokens": r.get("cost_prompt"),
            "cost_per_hour": r.get("cost_per_hour"),
        },
        "workload": {
            "prompt_tokens": r.get("prompt_tokens"),
            "output_tokens": r.get("output_tokens"),
            "prefill_time_share": None if split is None else split[0],
            "decode_time_share": None if split is None else split[1],
            "advice": workload_advice(r.get("prompt_tokens"), r.get("output_tokens")),
        },
    }


BUDGET_PARTS = ("queue", "prefill", "transfer", "decode")


def _part(values: dict[str, float], key: str) -> str:
    value = values.get(key)
    return f"{key} -" if value is None else f"{key} {_share(value)}"


def pool_lines(pool: PoolBudget) -> list[str]:
    """One pool's budget: time to first token split, then each role's shares of its
    engines' end-to-end latency."""
    lines = []
    ttft = pool.ttft_seconds
    if ttft is not None:
        split = ", ".join(_part(pool.ttft, key) for key in ("queue", "prefill", "transfer"))
        lines.append(f"time to first token {1000 * ttft:.0f} ms: {split}")
    for role in pool.ordered_roles():
        shares = ", ".join(_part(pool.roles[role], key) for key in BUDGET_PARTS)
        lines.append(f"{role} pool, of its end-to-end latency: {shares}")
    return lines


def _pool_json(pool: PoolBudget) -> dict[str, Any]:
    return {
        "labels": dict(pool.labels),
        "pool": pool.name,
        "model": pool.model,
        "time_to_first_token": {
            "seconds": pool.ttft_seconds,
            **{
                f"{key}_seconds": pool.ttft.get(f"{key}_seconds")
                for key in ("queue", "prefill", "transfer")
            },
            **{key: pool.ttft.get(key) for key in ("queue", "prefill", "transfer")},
        },
        "roles": {
            role: {key: pool.roles[role].get(key) for key in BUDGET_PARTS}
            for role in pool.ordered_roles()
        },
    }


def as_json(report: Report) -> dict[str, Any]:
    findings = []
    for rank, f in enumerate(report.findings, 1):
        summary, description = texts(f)
        findings.append(
            {
                "rank": rank,
                "alert": f.sig.alert,
                "status": f.status,
                "severity": f.rule.severity,
                "signature": f.sig.family,
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
                "covers": list(f.covers),
                "explained_by": f.explained_by,
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
        "missing_inputs": report.missing_inputs,
        "roofline": [_roofline_json(r) for r in report.roofline],
        "pools": [_pool_json(p) for p in report.pools],
        "scaling_advice": [a.as_json() for a in scaling_advice(report.findings)],
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
        summary, description = texts(f)
        state = f", alert {f.state}" if f.state else ""
        lines += [
            "",
            f"{rank}. {f.status.upper():<6} {f.rule.severity:<8} {f.sig.alert} "
            f"[{f.sig.family}]{state}",
            f"   {summary}",
            f"   {description}",
        ]
        if f.covers:
            lines.append(f"   holds on the engines it feeds too: {', '.join(f.covers)}")
        if f.explained_by:
            lines.append(f"   a consequence of {f.explained_by}: its advice is that cause's")
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
    advice = scaling_advice(report.findings)
    if advice:
        lines += ["", "Scaling advice:"]
        lines += [f"  {a.target}: {a.text()}" for a in advice]
    if report.roofline:
        lines += ["", "Roofline and latency budget:"]
        for r in report.roofline:
            lines.append(f"  {r.target} {r.model}".rstrip())
            lines.append(f"    {roofline_summary(r)}")
            lines += [f"    {line}" for line in _roofline_details(r)]
            energy = energy_line(r, report.cfg.cost.currency)
            if energy is not None:
                lines.append(f"    {energy}")
    if report.pools:
        lines += ["", "Latency budget per pool:"]
        for pool in report.pools:
            lines.append(f"  {pool.name} {pool.model}".rstrip())
            lines += [f"    {line}" for line in pool_lines(pool)]
    if report.not_evaluated:
        lines += ["", "Not evaluated:"]
        lines += [f"  {alert}: {reason}" for alert, reason in report.not_evaluated.items()]
    if report.no_data:
        lines += ["", f"No data (their inputs are absent): {', '.join(report.no_data)}"]
    if report.missing_inputs:
        lines += ["", "Missing inputs (no series under any name the pack reads):"]
        lines += [f"  {line}" for line in report.missing_inputs]
    return "\n".join(lines) + "\n"
