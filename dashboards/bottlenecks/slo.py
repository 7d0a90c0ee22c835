"""Row "Service-level objectives": the error budgets, how fast they burn, goodput, and the
scaling advice with its cause beside them.

Every panel plots the SLO and verdict records the burn-rate alerts and the autoscalers' gate
read (``exporter/signatures/slo/``), per objective (``slo``) and pool, so a page's numbers are
the panel's. The pool panels narrow by the pool's variables and the model, as the pool row does
(an objective's series carry no pod); the gate and the advice per pod by the target variables.
The kinds of objective drawn are those the site config sets (``slo.objectives``).
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.models import dashboard as dashboard_models

from dashboards.bottlenecks.pools import pool, pool_legend, pool_signal
from dashboards.common import (
    AnyPanel,
    Query,
    Unit,
    column_labels,
    signal,
    site,
    stat_panel,
    state_timeline,
    table_panel,
    target_labels,
    target_legend,
    timeseries,
    warn,
)
from exporter.config import format_duration
from exporter.signatures.slo.burn_alerts import SHORT
from exporter.signatures.slo.slo_signals import (
    SLI,
    base_seconds,
    budget_signal,
    burn_rate_signal,
    goodput_signal,
    kinds,
)
from exporter.signatures.slo.verdict_signals import ADVICE, ELIGIBLE, POOL_ADVICE, POOL_ELIGIBLE
from exporter.signatures.slo_config import SliKind

TITLE = "Service-level objectives"

HOLD_SCALE_OUT = [
    dashboard_models.ValueMap(
        options={
            "0": dashboard_models.ValueMappingResult(text="hold", color="orange", index=0),
            "1": dashboard_models.ValueMappingResult(text="scale out", color="green", index=1),
        }
    )
]


def _legend(kind: SliKind, *extra: str) -> str:
    return " ".join((SHORT[kind], "{{slo}}", pool_legend(), *extra)).replace("  ", " ")


def _pages() -> tuple[tuple[float, float, float, str], ...]:
    """(long, short, burn rate, severity) of each burn-rate alert, windows scaled."""
    scale = site().profile.time_scale
    return tuple(
        (a.long * scale, a.short * scale, a.burn_rate, a.severity) for a in site().slo.burn_alerts
    )


def budget_left() -> AnyPanel:
    period = format_duration(site().slo.period * site().profile.time_scale)
    return stat_panel(
        "Error budget left",
        f"Share of each objective's error budget of the last {period} that is left, per pool "
        "and model (site config slo.objectives). Bad: below 0 - the objective is missed over "
        "the period; the burn-rate pages fire long before.",
        [Query(pool_signal(budget_signal(site(), kind)), _legend(kind)) for kind in kinds(site())],
        unit=Unit.RATIO,
        span=6,
        height=8,
        thresholds=[(0, "orange"), (0.25, "green")],
        base="red",
    )


def burn_rates() -> AnyPanel:
    pages = [p for p in _pages() if p[3] == "critical"]
    queries = [
        Query(
            pool_signal(burn_rate_signal(site(), kind, long)),
            _legend(kind, format_duration(long)),
        )
        for kind in kinds(site())
        for long, _, _, _ in pages
    ]
    rates = ", ".join(
        f"{rate:g}x over {format_duration(long)} and {format_duration(short)}"
        for long, short, rate, _ in pages
    )
    return timeseries(
        "Error budget burn rate",
        "How many times faster than the period allows each objective's budget burns, over the "
        f"long windows of the pages ({rates}: the dashed lines). Bad: a line over its page's "
        "rate - the page fires once the short window agrees.",
        queries,
        unit=Unit.COUNT,
        span=9,
        thresholds=tuple(warn(rate) for _, _, rate, _ in pages),
    )


def sli() -> AnyPanel:
    base = base_seconds(site())
    queries = [
        Query(pool_signal(SLI.at(kind, base)), _legend(kind, format_duration(base)))
        for kind in kinds(site())
    ]
    return timeseries(
        "Events meeting each objective",
        f"Share of requests (inter-token intervals for inter-token latency) that met each "
        f"objective over {format_duration(base)}, per pool and model: the SLI the burn rates "
        "divide by the budget. Bad: under the objective's target (site config "
        "slo.objectives) for longer than a burn-rate window.",
        queries,
        unit=Unit.RATIO,
        span=9,
        minimum=None,
        maximum=1.0,
    )


def goodput() -> AnyPanel:
    return timeseries(
        "Goodput: requests meeting both TTFT and ITL",
        "Share of requests that met both the time-to-first-token and the inter-token objective, "
        "at least (SLI_ttft + SLI_itl - 1: histograms count each objective apart, so the share "
        "meeting both is a lower bound; docs/slo.md), where an objective sets both. Bad: "
        "falling while the request rate holds.",
        [Query(pool_signal(goodput_signal(site())), "{{slo}} " + pool_legend())],
        unit=Unit.RATIO,
        span=6,
        maximum=1.0,
    )


def pool_advice() -> AnyPanel:
    # The pool's labels, job left out of the columns as in every table.
    grouping = (*pool(), "model", "advice", "cause")
    columns = tuple(label for label in grouping if label != "job")
    expr = pool_signal(POOL_ADVICE)
    return table_panel(
        "Scaling advice per pool, and its cause",
        "What to do about each pool of the model now: scale_out (cause capacity) where requests "
        "wait on busy GPUs and nothing else holds, otherwise the fix of each signature holding "
        "on its pods (the share of its pods, in the value) or on the pool; a cause blocks "
        "scaling out for scaling.cause_hold after it last held. Bad: any fix_* row while a "
        "burn-rate page fires - fix it, adding GPUs would not help (docs/slo.md).",
        [Query(f"max by ({', '.join(grouping)}) ({expr})", instant=True, format="table")],
        columns=columns,
        span=12,
    )


def gates() -> AnyPanel:
    pods = Query(signal(ELIGIBLE), target_legend())
    pools = Query(pool_signal(POOL_ELIGIBLE), "pool " + pool_legend())
    return state_timeline(
        "scale_out_eligible: the autoscalers' gate",
        "1 (scale out) where a pod's, or a pool's, backlog is capacity: requests wait or the KV "
        "cache is full on busy GPUs and no host-side, link, stall or GPU cause holds; 0 (hold) "
        "everywhere else. What an autoscaler multiplies its trigger by (examples/autoscaling). "
        "Bad: hold on pods whose queue grows - the advice says why.",
        [pods, pools],
        mappings=HOLD_SCALE_OUT,
        span=12,
    )


def pod_advice() -> AnyPanel:
    # The targets' join labels, job left out of the columns as in every table.
    columns = (*column_labels(), "advice", "cause")
    grouping = ", ".join((*target_labels(), "advice", "cause"))
    expr = f"max by ({grouping}) ({signal(ADVICE)})"
    return table_panel(
        "Scaling advice per pod",
        "Per selected pod, the fix each signature holding on it (or on its pool) names, or "
        "scale_out where its backlog is capacity. Bad: a fix_* row on the pods of a pool whose "
        "objectives burn.",
        [Query(expr, instant=True, format="table")],
        columns=columns,
        span=12,
    )


def panels() -> Sequence[AnyPanel]:
    slo: list[AnyPanel] = []
    if kinds(site()):
        slo = [budget_left(), burn_rates(), sli()]
    if any(o.ttft is not None and o.itl is not None for o in site().slo.objectives):
        slo.append(goodput())
    return [*slo, pool_advice(), gates(), pod_advice()]
