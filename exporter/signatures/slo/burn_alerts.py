"""The burn-rate alerts: an objective's error budget burns too fast, and what holds meanwhile.

One alert name per kind of objective (``InferenceTTFTBudgetBurn``, ...), one rule per burn-rate
alert of the site config (the SRE workbook's by default: 14.4x over 1h and 5m, 6x over 6h and
30m page; 3x over 1d and 2h, 1x over 3d and 6h are tickets). A rule fires when the budget
burns at least that fast over both its windows: the long one says enough budget is gone to
matter, the short one that it is still burning (it resets the alert minutes after a fix).

Each rule waits until the base SLO record has existed for its long window (the cold-start
guard): the longer windows average the base record, so until it reaches back a whole window,
the long window is as short as the record's history and would page on a few minutes of errors
after Prometheus or the pack starts.

The page names its cause: the signatures holding at that moment on the pool's pods
(``inference:bottleneck_signature:holding``, :mod:`.verdict_signals`) and on the pool itself,
each with the pods it holds on ("InferenceTokenizerSlowerThanDecode on 3 of 4 pods"), through
the ``query`` template function; when none holds it says so (capacity, or a cause the pack
does not see). The description adds the pool's scaling advice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.config import format_duration
from exporter.signatures import runbook_templates
from exporter.signatures.definitions import TARGET, AlertRule, Evidence, Runbook
from exporter.signatures.promql_text import by, num, on, pct, printf_matchers, regex_alternatives
from exporter.signatures.signals.gateway_signals import GATEWAYS
from exporter.signatures.signals.signal_context import pool_labels
from exporter.signatures.site import SiteConfig
from exporter.signatures.slo.slo_signals import (
    BURN_RATE,
    SLI,
    SLO_LABEL,
    TOTAL,
    base_seconds,
    kinds,
    slo_labels,
)
from exporter.signatures.slo.verdict_signals import BLOCKS, HOLDING, POOL_ADVICE, POOL_HOLDING
from exporter.signatures.slo_config import BurnAlert, SliKind

#: The rule group of the burn-rate alerts.
SLO_ALERT_GROUP = "inference.slo"
#: The ``signature`` label of the burn-rate alerts (a symptom, not a bottleneck family).
SLO_FAMILY = "slo"
ALERT_NAMES: Mapping[SliKind, str] = {
    "ttft": "InferenceTTFTBudgetBurn",
    "itl": "InferenceITLBudgetBurn",
    "e2e": "InferenceE2ELatencyBudgetBurn",
    "availability": "InferenceAvailabilityBudgetBurn",
}
SHORT: Mapping[SliKind, str] = {
    "ttft": "TTFT",
    "itl": "Inter-token latency",
    "e2e": "End-to-end latency",
    "availability": "Availability",
}
EVENTS: Mapping[SliKind, str] = {
    "ttft": "requests",
    "itl": "inter-token intervals",
    "e2e": "requests",
    "availability": "requests",
}
WHAT: Mapping[SliKind, str] = {
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "e2e": "end-to-end latency",
    "availability": "availability: finished, not refused or evicted",
}


@dataclass(frozen=True)
class SloAlert:
    """One burn-rate alert name: the rules of one kind of objective, and its runbook."""

    alert: str
    kind: SliKind
    title: str
    rules: tuple[AlertRule, ...]
    runbook: Runbook


def _printf(labels: tuple[str, ...]) -> str:
    """Go template: a printf call of matchers for the alert's own values of ``labels``."""
    return printf_matchers(labels)


def _go(action: str) -> str:
    """One Go template action: ``{{ action }}``."""
    return "{{ " + action + " }}"


def _plural_pods() -> str:
    return " " + _go('if eq $pods "1"') + "pod" + _go("else") + "pods" + _go("end")


def cause_template(cfg: SiteConfig) -> str:
    """The signatures holding on the alert's pool now, each with the pods it holds on.

    A Go template over two queries: the pool's pods of the model (``$pods``), and per alert
    name the pods of the pool it holds on, or -1 for a signature of the pool itself; the
    most widespread first, and of as widespread ones a cause that blocks scaling out first
    (its count + 0.25, printed rounded: a capacity symptom never leads a cause with a fix)."""
    join, pool = cfg.join_labels, pool_labels(cfg.join_labels)
    targets = by(join)
    # The pool's engine targets: a gateway scraped in the pool's job is not one of its pods.
    engines = f'inference_engine_info{{%s,engine!~"{regex_alternatives(GATEWAYS)}"}}'
    pods = f"count(group {targets} ({engines}))"

    def counted(matchers: str) -> str:
        return (
            f"count by (alertname) (group {by((*join, 'alertname'))} "
            f"({HOLDING.name}{{{matchers}}}) and {on(join)} group {targets} ({engines}))"
        )

    holding = (
        f"sort_desc({counted(f'%s,{BLOCKS}')} + 0.25 or {counted('%s')} "
        f"or -1 * group by (alertname) ({POOL_HOLDING.name}{{%s}}))"
    )
    in_pool = f"({_printf(pool)})"
    of_model = f"({_printf((*pool, 'model'))})"
    return "".join(
        (
            _go('$pods := "0"'),
            _go(f"with printf `{pods}` {of_model} | query"),
            _go('$pods = . | first | value | printf "%.0f"'),
            _go("end"),
            _go(
                f"with printf `{holding}` {in_pool} {of_model} {in_pool} {of_model} {of_model}"
                " | query"
            ),
            _go("range $i, $c := ."),
            _go("if $i"),
            ", ",
            _go("end"),
            _go("$c.Labels.alertname"),
            " ",
            _go("if lt $c.Value 0.0"),
            "on the pool",
            _go("else"),
            "on ",
            _go('$c.Value | printf "%.0f"'),
            " of ",
            _go("$pods"),
            _plural_pods(),
            _go("end"),
            _go("end"),
            _go("else"),
            _go('if eq $pods "0"'),
            "no engine of the pool is seen (down, or not scraped)",
            _go("else"),
            "none of the pack's signatures holds on its ",
            _go("$pods"),
            _plural_pods(),
            " (capacity, or a cause the pack does not see)",
            _go("end"),
            _go("end"),
        )
    )


def advice_template(cfg: SiteConfig) -> str:
    """The pool's scaling advice now: each advice with its cause and share of the pods."""
    pool = pool_labels(cfg.join_labels)
    query = f"sort_desc({POOL_ADVICE.name}{{%s}})"
    return "".join(
        (
            _go(f"with printf `{query}` ({_printf((*pool, 'model'))}) | query"),
            _go("range $i, $a := ."),
            _go("if $i"),
            "; ",
            _go("end"),
            _go('if eq $a.Labels.advice "none"'),
            "none (no backlog waits on busy GPUs, and no cause with a fix of its own holds)",
            _go("else"),
            _go("$a.Labels.advice"),
            " (",
            _go("$a.Labels.cause"),
            _go("if lt $a.Value 1.0"),
            ", ",
            _go("$a.Value | humanizePercentage"),
            " of its pods",
            _go("end"),
            ")",
            _go("end"),
            _go("end"),
            _go("else"),
            "none (the pack sees no engine of the pool)",
            _go("end"),
        )
    )


def _objectives(cfg: SiteConfig, kind: SliKind) -> str:
    out = []
    for slo in cfg.slo.objectives:
        objective = slo.objective(kind)
        if objective is not None:
            out.append(f"{slo.name}: {objective.text()}")
    return "; ".join(out)


def _rule(cfg: SiteConfig, kind: SliKind, alert: BurnAlert) -> AlertRule:
    scale = cfg.profile.time_scale
    long, short = alert.long * scale, alert.short * scale
    lw, sw = format_duration(long), format_duration(short)
    match = on(slo_labels(cfg))
    rate = num(alert.burn_rate)
    guard = f"present_over_time({TOTAL.at(kind, base_seconds(cfg)).name}[{sw}] offset {lw})"
    expr = (
        f"{BURN_RATE.at(kind, long).name} > {rate}\nand {match}\n"
        f"{BURN_RATE.at(kind, short).name} > {rate}\nand {match}\n{guard}"
    )
    events = EVENTS[kind]
    spent = pct(round(alert.budget_spent, 4))
    period = format_duration(30 * 86400 * scale)
    action = "page" if alert.severity == "critical" else "ticket"
    return AlertRule(
        severity=alert.severity,
        expr=expr,
        for_seconds=0.0,
        summary=(
            f"{SHORT[kind]} budget of {{labels.model}} ({{labels.slo}}) burning at {{burn}}x "
            f"over {lw} — cause: {{cause}}"
        ),
        description=(
            f"{{good}} % of {{labels.model}} {events} met objective {{labels.slo}} "
            f"({WHAT[kind]}) over the last {lw}, {{good_short}} % over {sw}: its error budget "
            f"burns {{burn}}x over {lw} and {{burn_short}}x over {sw}, at least {rate}x on both "
            f"({spent} % of a {period} budget in {lw}: a {action}). Scaling advice for the "
            "pool: {advice}."
        ),
        scope=("model", SLO_LABEL),
        evidence=(
            Evidence("burn", f"burn rate over {lw}", None, "x", "%.1f"),
            Evidence(
                "burn_short",
                f"burn rate over {sw}",
                f"{BURN_RATE.at(kind, short).name}{TARGET}",
                "x",
                "%.1f",
            ),
            Evidence(
                "good",
                f"{events} that met the objective over {lw}",
                f"100 * {SLI.at(kind, long).name}{TARGET}",
                "%",
                "%.2f",
            ),
            Evidence(
                "good_short",
                f"{events} that met the objective over {sw}",
                f"100 * {SLI.at(kind, short).name}{TARGET}",
                "%",
                "%.2f",
            ),
        ),
        when=(
            f"the budget burns at least {rate}x over {lw} and over {sw} ({spent} % of a "
            f"{period} budget in {lw})"
        ),
        labels=(("long_window", lw), ("short_window", sw)),
        templates=(("cause", cause_template(cfg)), ("advice", advice_template(cfg))),
    )


def _queries(cfg: SiteConfig, kind: SliKind) -> tuple[tuple[str, str], ...]:
    first = cfg.slo.burn_alerts[0]
    scale = cfg.profile.time_scale
    long = format_duration(first.long * scale)
    return (
        (f"burn rate of each objective over {long}", BURN_RATE.at(kind, first.long * scale).name),
        (
            f"share of {EVENTS[kind]} that met each objective over {long}",
            SLI.at(kind, first.long * scale).name,
        ),
        ("the signatures holding on each pod now, and what each means for scaling", HOLDING.name),
        ("the signatures holding on each pool now", POOL_HOLDING.name),
        ("each pool's scaling advice (share of its pods)", POOL_ADVICE.name),
    )


def slo_alerts(cfg: SiteConfig, *, every_kind: bool = False) -> tuple[SloAlert, ...]:
    """The burn-rate alerts of every kind of objective the site config sets (``every_kind``:
    of every kind there is, for the runbook pages a site's objectives link to)."""
    out = []
    for kind in ALERT_NAMES if every_kind else kinds(cfg):
        alert = ALERT_NAMES[kind]
        rules = tuple(_rule(cfg, kind, burn) for burn in cfg.slo.burn_alerts)
        runbook = runbook_templates.runbook(alert, _queries(cfg, kind))
        out.append(SloAlert(alert, kind, f"{SHORT[kind]} error budget burning", rules, runbook))
    return tuple(out)


def objectives_text(cfg: SiteConfig, kind: SliKind) -> str:
    """The objectives of one kind as the config writes them (``chat: 500ms @ 99%; ...``)."""
    return _objectives(cfg, kind)
