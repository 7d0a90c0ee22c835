"""The SLO signals: for each objective, good and total events, the SLI and the burn rate over
each window, the budget left, goodput.

Per objective (an entry of ``slo.objectives``) and per pool and model (the join labels that do
not name a pod, and ``model``), with the objective's name as the ``slo`` label:

``inference_pool:slo_<sli>_good:rate<base>``, ``..._total:rate<base>``
    events per second that met the objective, and all events, over the base window (the
    shortest window of the burn-rate alerts, 5m): requests (time to first token, end-to-end
    latency, availability) or inter-token intervals (inter-token latency). The good ones of a
    latency objective are the histogram's cumulative bucket at the threshold
    (``le="0.5"``: a bucket bound, :mod:`~exporter.signatures.slo_buckets`).
``inference_pool:slo_<sli>_objective:ratio``
    the target (0.99), one series per objective (``slo`` label only).
``inference_pool:slo_<sli>_sli:ratio<w>``, ``inference_pool:slo_<sli>_burn_rate:ratio<w>``
    the share of good events over each window ``w`` of the burn-rate alerts, and how many
    times faster than the period allows the budget burns: ``(1 - SLI) / (1 - target)``.
    Windows longer than the base are the base records summed over the window (a ratio of sums,
    so the busy minutes weigh more, as in a rate over the raw counters), which costs one series
    per objective and pool instead of every pod's buckets over days.
``inference_pool:slo_<sli>_budget_remaining:ratio<period>``
    the share of the period's budget left (below 0: overspent), from the base records over the
    period: a range read of 161,280 samples per objective and pool for 28 days at a 15 s
    interval (far cheaper than a subquery's evaluations, and still the costliest read of the
    pack once Prometheus holds the period: 0.4-0.5 s an evaluation of each record for 20
    pools, ``docs/scale.md``).
    It is evaluated in a group of its own, :data:`BUDGET_GROUP`, every
    :func:`budget_interval_seconds` (2m30s: half of Prometheus's 5-minute lookback, so an
    instant query always finds it), whatever the global interval; no alert reads it (the
    dashboards, ``diagnose``).
``inference_pool:slo_goodput:ratio<base>``, ``inference_pool:slo_goodput:rate<base>``
    where an objective sets both time to first token and inter-token latency: the share (and
    requests per second) of requests that met both, at least. Histograms count each
    objective apart, never per request, so the share meeting both is bounded, not measured:
    at least ``SLI_ttft + SLI_itl - 1`` (Fréchet's lower bound, whatever the two correlate),
    at most the smaller of the two. The inter-token SLI counts intervals, not requests: a
    request of many tokens weighs more, and one slow step makes one interval bad, not the
    request. The pack records the lower bound: an objective met at that is met.

Which engines, roles and requests: a latency objective reads the engines it names (or every
engine whose bucket bounds the pack knows) and the engines that decode (``role!="prefill"``:
in disaggregated serving the decode engine's histograms start when the request reaches it, so
its time to first token holds the KV transfer but not the prefill pool's wait, which the pool
signals measure). Availability counts requests the engines finished, refused (layer engine or
gateway) and the gateway evicted (deadline, no endpoint; not the client's cancellations):
good = finished, total = finished + refused + evicted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.config import format_duration
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import by, num, on, regex_alternatives, split_matchers
from exporter.signatures.signals.gateway_signals import GATEWAYS
from exporter.signatures.signals.signal import Rule, Signal, Unit
from exporter.signatures.signals.signal_context import DECODES, SignalContext, pool_labels
from exporter.signatures.site import SiteConfig
from exporter.signatures.slo_buckets import (
    HISTOGRAM,
    LatencySli,
    is_bound,
    known_bounds,
    le_label,
)
from exporter.signatures.slo_config import SliKind, Slo

#: The rule group of the SLO records: per objective and pool, after the pools' records.
SLO_GROUP = "inference.records.slo"
#: The rule group of the budget left over the period: the period's range read (28 days of the
#: base records) at its own, longer interval (:func:`budget_interval_seconds`).
BUDGET_GROUP = "inference.records.slo.budget"
#: How often the budget group runs (seconds, before the time scale): half of the 5-minute
#: lookback of Prometheus and vmalert, so the record is never too old for an instant query.
BUDGET_INTERVAL_S = 150.0
#: The label that names the objective (``slo.objectives[].name``).
SLO_LABEL = "slo"
#: The gateway's outcomes that are the service's failures (not the client's cancellations).
EVICTED = ("evicted_ttl", "evicted_no_endpoints", "evicted_other")
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def slo_labels(cfg: SiteConfig) -> tuple[str, ...]:
    """The labels of one objective's series: the pool's, ``model`` and ``slo``."""
    return (*pool_labels(cfg.join_labels), "model", SLO_LABEL)


def base_seconds(cfg: SiteConfig) -> float:
    """The base window: the shortest window of the burn-rate alerts, after the time scale."""
    return cfg.slo.windows()[0] * cfg.profile.time_scale


def windows(cfg: SiteConfig) -> tuple[float, ...]:
    """Every window of the burn-rate alerts (seconds, after the time scale), shortest first."""
    return tuple(w * cfg.profile.time_scale for w in cfg.slo.windows())


def period_seconds(cfg: SiteConfig) -> float:
    return cfg.slo.period * cfg.profile.time_scale


def budget_interval_seconds(cfg: SiteConfig) -> float:
    """The budget group's interval (seconds, after the time scale)."""
    return BUDGET_INTERVAL_S * cfg.profile.time_scale


def group_intervals(cfg: SiteConfig) -> dict[str, float]:
    """The record groups that run at their own interval (seconds), whatever the global one."""
    return {BUDGET_GROUP: budget_interval_seconds(cfg)} if kinds(cfg) else {}


def kinds(cfg: SiteConfig) -> tuple[SliKind, ...]:
    """The objectives some entry sets, in the order of their records."""
    return tuple(k for k in ("ttft", "itl", "e2e", "availability") if cfg.slo.has(k))


# --- the signals, as the views name them ------------------------------------------------------


@dataclass(frozen=True)
class SloFamily:
    """One record per objective kind (and window): ``name`` holds ``{sli}`` and ``{window}``."""

    name: str
    unit: Unit
    title: str
    group: str = SLO_GROUP

    def at(self, kind: str, seconds: float | None = None) -> Signal:
        """The signal of ``kind`` over ``seconds`` (already scaled; ``None``: no window)."""
        window = "" if seconds is None else format_duration(seconds)
        name = self.name.replace("{sli}", kind).replace("{window}", window)
        return Signal(name, self.unit, self.group, Rule(lambda _ctx: name, self.title), self.title)


GOOD = SloFamily("inference_pool:slo_{sli}_good:rate{window}", "count", "good events/s")
TOTAL = SloFamily("inference_pool:slo_{sli}_total:rate{window}", "count", "events/s")
OBJECTIVE = SloFamily("inference_pool:slo_{sli}_objective:ratio", "ratio", "objective")
SLI = SloFamily("inference_pool:slo_{sli}_sli:ratio{window}", "ratio", "SLI")
BURN_RATE = SloFamily("inference_pool:slo_{sli}_burn_rate:ratio{window}", "count", "burn rate")
BUDGET_REMAINING = SloFamily(
    "inference_pool:slo_{sli}_budget_remaining:ratio{window}",
    "ratio",
    "error budget left",
    BUDGET_GROUP,
)
GOODPUT = SloFamily("inference_pool:slo_goodput:ratio{window}", "ratio", "goodput")
GOODPUT_RATE = SloFamily(
    "inference_pool:slo_goodput:rate{window}", "requests_per_second", "goodput, requests/s"
)


def sli_signal(cfg: SiteConfig, kind: SliKind, seconds: float) -> Signal:
    return SLI.at(kind, seconds)


def burn_rate_signal(cfg: SiteConfig, kind: SliKind, seconds: float) -> Signal:
    return BURN_RATE.at(kind, seconds)


def budget_signal(cfg: SiteConfig, kind: SliKind) -> Signal:
    return BUDGET_REMAINING.at(kind, period_seconds(cfg))


def goodput_signal(cfg: SiteConfig) -> Signal:
    return GOODPUT.at("", base_seconds(cfg))


def total_signal(cfg: SiteConfig, kind: SliKind) -> Signal:
    return TOTAL.at(kind, base_seconds(cfg))


# --- the expressions --------------------------------------------------------------------------


def regex_literal(text: str) -> str:
    """``text`` matched literally inside a PromQL regular expression (RE2)."""
    return _RE2_SPECIAL.sub(r"\\\1", text)


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _matchers(cfg: SiteConfig, slo: Slo, *, latency: bool) -> list[str]:
    """The series one objective reads: the site's and its own matchers, its model (or every
    model no other objective names), and for a latency objective its engines that decode."""
    out = split_matchers(cfg.selectors.sidecar) if cfg.selectors.sidecar.strip() else []
    out += list(slo.selector)
    if slo.model is not None:
        out.append(f"model={_quoted(slo.model)}")
    else:
        named = sorted({s.model for s in cfg.slo.objectives if s.model is not None})
        if named:
            out.append(f"model!~{_quoted('|'.join(regex_literal(m) for m in named))}")
    if latency:
        out.append(f"engine=~{_quoted('|'.join(regex_literal(e) for e in slo.engines))}")
        out.append(DECODES)
    return out


def _series(metric: str, matchers: Sequence[str]) -> str:
    return f"{metric}{{{','.join(matchers)}}}" if matchers else metric


def _le(slo: Slo, sli: LatencySli, threshold: float) -> str:
    """The ``le`` value of the threshold as the sidecar writes it (the bound it equals)."""
    own = slo.buckets.get(sli)
    groups = [own] if own is not None else [known_bounds(e, sli) or () for e in slo.engines]
    for group in groups:
        for bound in group:
            if is_bound(threshold, (bound,)):
                return le_label(bound)
    return le_label(threshold)


def _gateway_failures(ctx: SignalContext, m: Sequence[str], base: str) -> str:
    """The requests a gateway refused or evicted per second, on the pools of the engines it
    feeds (``gateway.join`` and ``model``, whatever job scrapes the gateway), or on the
    gateway's own labels where no engine of its pool is seen (its engines gone: an outage)."""
    pool, fed = (*ctx.pool, "model"), (*ctx.cfg.gateway.labels, "model")
    refused = _series("inference_requests_rejected_total", [*m, 'layer="gateway"'])
    evicted = _series(
        "inference_gateway_requests_total", [*m, f"outcome=~{_quoted('|'.join(EVICTED))}"]
    )
    failed = f"rate({refused}[{base}])\nor\nrate({evicted}[{base}])"
    gateways = regex_alternatives(GATEWAYS)
    engines = _series("inference_engine_info", [*m, f'engine!~"{gateways}"', DECODES])
    # Through a failed scrape of the engines, not onto the gateway's own labels for a moment.
    engines = ctx.last(engines)
    both = tuple(dict.fromkeys((*pool, *fed)))
    fed_engines = f"group {by(both)} ({engines})"
    return (
        f"sum {by(pool)} (\nsum {by(fed)} (\n{failed}\n)\n"
        f"* {on(fed)} group_right ()\n{fed_engines}\n)\nor\n"
        f"sum {by(pool)} (\nsum {by(both)} (\n{failed}\n)\nunless {on(fed)}\n{fed_engines}\n)"
    )


def _good_total(ctx: SignalContext, slo: Slo, kind: SliKind, base: str) -> tuple[str, str]:
    """The good and total events per second of one objective over the base window."""
    group = by((*ctx.pool, "model"))
    if kind == "availability":
        m = _matchers(ctx.cfg, slo, latency=False)
        finished = _series("inference_e2e_request_latency_seconds_count", [*m, DECODES])
        refused = _series("inference_requests_rejected_total", [*m, 'layer!="gateway"'])
        failed = f"rate({refused}[{base}])\nor\n{_gateway_failures(ctx, m, base)}"
        # Different label sets (role; layer and reason; the pool's): `or` keeps them all.
        total = f"sum {group} (\nrate({finished}[{base}])\nor\n{failed}\n)"
        good = f"sum {group} (rate({finished}[{base}]))\nor\n0 * sum {group} (\n{failed}\n)"
        return good, total
    objective = slo.objective(kind)
    assert objective is not None and objective.threshold is not None
    m = _matchers(ctx.cfg, slo, latency=True)
    histogram = HISTOGRAM[kind]
    le = _le(slo, kind, objective.threshold)
    bucket = _series(f"{histogram}_bucket", [*m, f"le={_quoted(le)}"])
    good = f"sum {group} (rate({bucket}[{base}]))"
    total = f"sum {group} (rate({_series(histogram + '_count', m)}[{base}]))"
    return good, total


def _help(slo: Slo, kind: SliKind, what: str) -> str:
    objective = slo.objective(kind)
    assert objective is not None
    model = slo.model if slo.model is not None else "every model no other objective names"
    return f"{what} of objective {slo.name} ({kind} {objective.text()}; {model})"


def _objective_rules(ctx: SignalContext, kind: SliKind, base: str) -> list[RecordingRule]:
    rules = []
    for slo in ctx.cfg.slo.objectives:
        objective = slo.objective(kind)
        if objective is None:
            continue
        labels = ((SLO_LABEL, slo.name),)
        good, total = _good_total(ctx, slo, kind, base)
        unit = "inter-token intervals" if kind == "itl" else "requests"
        rules += [
            RecordingRule(
                TOTAL.at(kind, base_seconds(ctx.cfg)).name,
                total,
                _help(slo, kind, f"{unit} per second"),
                group=SLO_GROUP,
                labels=labels,
            ),
            RecordingRule(
                GOOD.at(kind, base_seconds(ctx.cfg)).name,
                good,
                _help(slo, kind, f"{unit} per second that met the objective"),
                group=SLO_GROUP,
                labels=labels,
            ),
            RecordingRule(
                OBJECTIVE.at(kind).name,
                f"vector({num(objective.target)})",
                _help(slo, kind, "the target"),
                window=0.0,
                group=SLO_GROUP,
                labels=labels,
            ),
        ]
    return rules


def _window_rules(ctx: SignalContext, kind: SliKind) -> list[RecordingRule]:
    cfg = ctx.cfg
    labels = slo_labels(cfg)
    match = on(labels)
    base = base_seconds(cfg)
    good, total = GOOD.at(kind, base).name, TOTAL.at(kind, base).name
    objective = OBJECTIVE.at(kind).name
    rules = []
    for seconds in windows(cfg):
        window = format_duration(seconds)
        if seconds == base:
            ratio = f"{good}\n/ {match}\n({total} > 0)"
        else:
            ratio = (
                f"sum_over_time({good}[{window}])\n/ {match}\n"
                f"(sum_over_time({total}[{window}]) > 0)"
            )
        sli = SLI.at(kind, seconds).name
        rules += [
            RecordingRule(
                sli,
                ratio,
                f"share of {kind} events that met the objective over {window}",
                window=seconds,
                group=SLO_GROUP,
            ),
            RecordingRule(
                BURN_RATE.at(kind, seconds).name,
                f"(1 - {sli})\n/ on ({SLO_LABEL}) group_left ()\n(1 - {objective})",
                f"how many times faster than the period allows the {kind} error budget "
                f"burns, over {window}",
                window=seconds,
                group=SLO_GROUP,
            ),
        ]
    return rules


def _budget_rule(ctx: SignalContext, kind: SliKind) -> RecordingRule:
    cfg = ctx.cfg
    match = on(slo_labels(cfg))
    base = base_seconds(cfg)
    good, total = GOOD.at(kind, base).name, TOTAL.at(kind, base).name
    objective = OBJECTIVE.at(kind).name
    period = period_seconds(cfg)
    span = format_duration(period)
    return RecordingRule(
        BUDGET_REMAINING.at(kind, period).name,
        f"1 - (\n1 - sum_over_time({good}[{span}])\n/ {match}\n"
        f"(sum_over_time({total}[{span}]) > 0)\n)\n"
        f"/ on ({SLO_LABEL}) group_left ()\n(1 - {objective})",
        f"share of the {kind} error budget of the last {span} left (below 0: overspent)",
        window=0.0,
        group=BUDGET_GROUP,
    )


def _goodput_rules(ctx: SignalContext) -> list[RecordingRule]:
    cfg = ctx.cfg
    if not any(s.ttft is not None and s.itl is not None for s in cfg.slo.objectives):
        return []
    base = base_seconds(cfg)
    match = on(slo_labels(cfg))
    ratio = GOODPUT.at("", base).name
    return [
        RecordingRule(
            ratio,
            f"clamp_min(\n{SLI.at('ttft', base).name}\n+ {match}\n"
            f"{SLI.at('itl', base).name}\n- 1,\n0\n)",
            "share of requests that met both the time-to-first-token and the inter-token "
            "objective, at least (SLI_ttft + SLI_itl - 1: histograms count each apart)",
            group=SLO_GROUP,
        ),
        RecordingRule(
            GOODPUT_RATE.at("", base).name,
            f"{ratio}\n* {match}\n{TOTAL.at('ttft', base).name}",
            "requests per second that met both objectives, at least",
            group=SLO_GROUP,
        ),
    ]


def slo_rules(cfg: SiteConfig) -> list[RecordingRule]:
    """Every SLO record of the configuration, in evaluation order (empty without objectives)."""
    ctx = SignalContext(cfg)
    base = format_duration(base_seconds(cfg))
    rules: list[RecordingRule] = []
    for kind in kinds(cfg):
        rules += _objective_rules(ctx, kind, base)
    for kind in kinds(cfg):
        rules += _window_rules(ctx, kind)
    rules += _goodput_rules(ctx)
    return rules + [_budget_rule(ctx, kind) for kind in kinds(cfg)]
