"""The catalogue's alert expressions, measured condition by condition, and the two modes.

Each alert expression is split at its ``and``/``or``/``unless`` into conditions; every
comparison is measured against its threshold (:func:`instances`). A signature *holds* for an
instance when the expression returns it, and *nearly holds* when every failing condition misses
its threshold by at most the margin (a share of the threshold).
"""

from __future__ import annotations

import math
import re
import time

from exporter.backends.http import make_session
from exporter.diagnose.datasources import (
    Backend,
    PrometheusBackend,
    TargetBackend,
    sample_target,
    target_evaluator,
)
from exporter.diagnose.diagnosis import Report
from exporter.diagnose.findings import (
    FIGURES,
    POOL_BUDGET,
    TARGET_FIGURES,
    TTFT_SPLIT,
    Condition,
    EvidenceValue,
    Finding,
    Instance,
    PoolBudget,
    Roofline,
    explained_first,
    format_value,
    mark_explained,
)
from exporter.diagnose.promql_eval import (
    NAME,
    Labels,
    NeedsHistoryError,
    Sample,
    Scrape,
    Value,
    compare,
    match_key,
)
from exporter.diagnose.promql_syntax import (
    SET_OPS,
    Binary,
    Node,
    Num,
    PromQLError,
    parse,
    source,
    unparen,
)
from exporter.diagnose.timeline import timeline
from exporter.signatures.catalogue import all_signatures
from exporter.signatures.definitions import RECORD_NAME, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import matchers
from exporter.signatures.signals import POD_LABELS, pool_labels, recording_rules
from exporter.signatures.signals.dcgm_fields import QUANTITIES
from exporter.signatures.signals.gateway_signals import engine_targets, pool_of
from exporter.signatures.signals.signal_context import SignalContext
from exporter.signatures.site import SiteConfig
from exporter.signatures.slo.verdict_signals import is_gateway_signature

ORDERED = frozenset({">", "<", ">=", "<="})


# --- one alert expression ---------------------------------------------------------------------


def _closeness(op: str, value: float, threshold: float, margin: float) -> tuple[bool, bool, float]:
    """holds, nearly, relative gap of ``value op threshold``."""
    if math.isnan(value) or math.isnan(threshold):
        return False, False, math.nan
    holds = compare(op, value, threshold)
    if op not in ORDERED or threshold == 0 or math.isinf(threshold):
        return holds, False, math.nan
    gap = abs(value - threshold) / abs(threshold)
    return holds, (not holds and margin > 0 and gap <= margin), gap


async def instances(backend: Backend, text: str, node: Node, margin: float) -> list[Instance]:
    """The instances of the expression ``text`` (parsed as ``node``) with their conditions."""
    node = unparen(node)
    if isinstance(node, Binary) and node.op in SET_OPS:
        left = await instances(backend, text, node.lhs, margin)
        right = await instances(backend, text, node.rhs, margin)
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


# --- evidence ---------------------------------------------------------------------------------


async def _evidence(
    backend: Backend, cfg: SiteConfig, rule: AlertRule, inst: Instance
) -> list[EvidenceValue]:
    out = []
    for item in rule.evidence:
        if item.name is not None:  # a name: a label of the first series, not a number
            found = await _evidence_sample(backend, cfg, rule, item, inst)
            text = "?" if found is None else found.get(item.name) or "?"
            out.append(EvidenceValue(item.key, item.label, None, item.unit, text))
            continue
        value = (
            inst.value
            if item.expr is None
            else await _evidence_value(backend, cfg, rule, item, inst)
        )
        text = format_value(item.fmt, value)
        out.append(EvidenceValue(item.key, item.label, value, item.unit, text))
    return out


async def _evidence_result(
    backend: Backend, cfg: SiteConfig, rule: AlertRule, item: Evidence, inst: Instance
) -> Value | None:
    """An evidence query's answer for the instance; ``None`` where it cannot be had here."""
    scope = rule.scope if item.scope is None else item.scope
    wanted = {label: inst.get(label) for label in (*cfg.join_labels, *scope)}
    query = item.query(matchers(wanted))
    try:
        return await backend.value(query, parse(query))
    except (NeedsHistoryError, PromQLError):
        return None


async def _evidence_value(
    backend: Backend, cfg: SiteConfig, rule: AlertRule, item: Evidence, inst: Instance
) -> float | None:
    value = await _evidence_result(backend, cfg, rule, item, inst)
    if value is None or isinstance(value, float):
        return value
    return value[0].value if value else None


async def _evidence_sample(
    backend: Backend, cfg: SiteConfig, rule: AlertRule, item: Evidence, inst: Instance
) -> Sample | None:
    """The first series of a ``name`` evidence's query for the instance, if any."""
    value = await _evidence_result(backend, cfg, rule, item, inst)
    if value is None or isinstance(value, float) or not value:
        return None
    return value[0]


def target_name(cfg: SiteConfig, labels: dict[str, str]) -> str:
    """How the alerts name a scrape target: ``namespace/pod``, else ``instance``; a pool of
    disaggregated serving (no pod, no instance) by its labels: ``pool namespace=llm``."""
    if not any(labels.get(name) for name in POD_LABELS):
        pool = [f"{k}={labels[k]}" for k in pool_labels(cfg.join_labels) if labels.get(k)]
        if pool:
            return "pool " + " ".join(pool)
    if labels.get("pod"):
        namespace = labels.get("namespace")
        return f"{namespace}/{labels['pod']}" if namespace else labels["pod"]
    for name in ("instance", *cfg.join_labels):
        if labels.get(name):
            return labels[name]
    return "-"


# --- the catalogue ----------------------------------------------------------------------------


async def evaluate(
    backend: Backend,
    report: Report,
    fixed_target: str | None,
    states: list[Sample] | None = None,
) -> None:
    """Every alert rule of the catalogue into ``report``, findings in rank order."""
    cfg = report.cfg
    for sig in all_signatures(cfg):
        data = False
        for rule in sig.rules:
            report.checked += 1
            try:
                found = await instances(backend, rule.expr, parse(rule.expr), report.margin)
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
    if fixed_target is None:  # one target (--target): nothing else to cover
        await _covered_engines(backend, cfg, report.findings)
    report.findings = explained_first(sorted(report.findings, key=Finding.sort_key))
    mark_explained(report.findings)


async def _covered_engines(backend: Backend, cfg: SiteConfig, findings: list[Finding]) -> None:
    """The engine targets each holding gateway finding covers: those of the pool its gateway
    feeds (the gateway's pool labels and model, :func:`~exporter.signatures.signals.
    gateway_signals.pool_of`), as the pack's holding records count a gateway's cause on them.
    Where the engines cannot be read here, a gateway's finding covers none."""
    gateways = [f for f in findings if f.instance.holds and is_gateway_signature(f.sig)]
    if not gateways:
        return
    ctx = SignalContext(cfg)
    query = engine_targets(ctx)
    try:
        engines = await backend.value(query, parse(query))
    except (NeedsHistoryError, PromQLError):
        return
    if isinstance(engines, float):
        return
    pool = pool_of(ctx)
    for finding in gateways:
        mine = {label: finding.instance.get(label) for label in pool}
        fed = (
            target_name(cfg, labels)
            for labels in (dict(s.labels) for s in engines)
            if all(labels.get(label, "") == value for label, value in mine.items())
        )
        finding.covers = tuple(t for t in dict.fromkeys(fed) if t != finding.target)


def _state(states: list[Sample], sig: Signature, rule: AlertRule, inst: Instance) -> str | None:
    """The alert's ``ALERTS`` state for this instance: firing, pending or none."""
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


# --- roofline and latency budget --------------------------------------------------------------


# The series of the nvml collector: the GPUs and the driver.
_GPU_SERIES = re.compile(r"\binference_(?:gpu|nvml)_[a-z0-9_]+")

MAIN_FIGURES = frozenset(
    {"efficiency", "e2e", "prefill_efficiency", "prompt_tokens", "joules_generated"}
)


async def roofline(backend: Backend, cfg: SiteConfig, fixed_target: str | None) -> list[Roofline]:
    """The roofline figures and latency budget of each served model, from the pack's records
    (:data:`~exporter.diagnose.findings.FIGURES`, and the target's own
    :data:`~exporter.diagnose.findings.TARGET_FIGURES` with each model it serves); NaN and
    infinities (a zero division) left out, and models with none of :data:`MAIN_FIGURES`.
    Ordered by target and model."""
    found: dict[Labels, dict[str, float]] = {}
    for key, signal in FIGURES.items():
        name = signal.record(cfg)
        try:
            value = await backend.value(name, parse(name))
        except (NeedsHistoryError, PromQLError):
            continue
        if isinstance(value, float):
            continue
        for s in value:
            if math.isfinite(s.value):
                found.setdefault(s.without_name(), {})[key] = s.value
    out = [
        Roofline(fixed_target or target_name(cfg, dict(labels)), labels, values)
        for labels, values in found.items()
        # a model with nothing but its inter-token latency has nothing to show
        if values.keys() & MAIN_FIGURES
    ]
    for key, signal in TARGET_FIGURES.items():
        for s in await _record(backend, signal.record(cfg)):
            target = set(s.without_name())
            for r in out:
                if target <= set(r.labels):
                    r.values[key] = s.value
    return sorted(out, key=lambda r: (r.target, r.model))


async def _record(backend: Backend, name: str) -> list[Sample]:
    """A record's finite samples; none where it cannot be read here."""
    try:
        value = await backend.value(name, parse(name))
    except (NeedsHistoryError, PromQLError):
        return []
    if isinstance(value, float):
        return []
    return [s for s in value if math.isfinite(s.value)]


async def pool_budgets(backend: Backend, cfg: SiteConfig) -> list[PoolBudget]:
    """The latency budget of each pool by role, and its time to first token split, from the
    pack's pool records; none unless the targets include more than one role (colocated
    serving has the per-target budget of :func:`roofline` only). Ordered by pool."""
    roles: dict[Labels, dict[str, dict[str, float]]] = {}
    for key, signal in POOL_BUDGET.items():
        for s in await _record(backend, signal.record(cfg)):
            labels = dict(s.without_name())
            role = labels.pop("role", "")
            pool = tuple(sorted(labels.items()))
            roles.setdefault(pool, {}).setdefault(role, {})[key] = s.value
    if len({role for by_role in roles.values() for role in by_role}) < 2:
        return []
    ttft: dict[Labels, dict[str, float]] = {}
    for key, signal in TTFT_SPLIT.items():
        for s in await _record(backend, signal.record(cfg)):
            ttft.setdefault(s.without_name(), {})[key] = s.value
    pools = sorted(roles.keys() | ttft.keys())
    return [
        PoolBudget(pool, target_name(cfg, dict(pool)), roles.get(pool, {}), ttft.get(pool, {}))
        for pool in pools
    ]


async def missing_inputs(backend: Backend, cfg: SiteConfig) -> list[str]:
    """The dcgm profile's dcgm-exporter quantities with no series under any name it reads (a
    release that renamed them again, a counters file without them): one line each, naming
    every name that was looked for. Nothing for the other profiles."""
    if cfg.profile.source != "dcgm":
        return []
    out = []
    for quantity in QUANTITIES:
        names = "|".join(quantity.metrics)
        query = f'count({{__name__=~"{names}"}})'
        try:
            value = await backend.value(query, parse(query))
        except (NeedsHistoryError, PromQLError):
            continue
        if isinstance(value, list) and not value:
            note = "" if quantity.default else " (not in dcgm-exporter's default counters)"
            out.append(f"{quantity.title}: none of {quantity.described()}{note}")
    return out


# --- the two modes ----------------------------------------------------------------------------


async def diagnose_prometheus(
    url: str,
    cfg: SiteConfig,
    timeout: float,
    margin: float,
    *,
    at: float | None = None,
    window: float | None = None,
) -> Report:
    """The catalogue through a Prometheus that holds the pack for ``cfg``, at ``at`` (default
    now); with ``window``, also the time series of the ``window`` seconds up to then."""
    at = time.time() if at is None else at
    report = Report("prometheus", url, cfg, margin, at)
    async with make_session() as session:
        backend = PrometheusBackend(session, url, timeout, at)
        await backend.check_records(cfg)
        report.missing_inputs = await missing_inputs(backend, cfg)
        states = await backend.vector('ALERTS{alertname=~"Inference.+"}')
        await evaluate(backend, report, None, states)
        report.roofline = await roofline(backend, cfg, None)
        report.pools = await pool_budgets(backend, cfg)
        if window is not None:
            report.timeline = await timeline(
                backend, cfg, report.findings, report.evaluated_at, window
            )
    return report


#: Why a signature that reads the GPUs has no data on a sidecar that reads none.
NO_GPUS = (
    "reads the GPUs, which this sidecar does not (its nvml collector is off): the node agent "
    "(chart mode node) or dcgm-exporter (mode dcgm) reads them; diagnose --prometheus.url with "
    "that layout's --profile sees them"
)


def gpu_readers(cfg: SiteConfig) -> set[str]:
    """The alerts that read a GPU series, directly or through the signals they read."""
    exprs = {rule.record: rule.expr for rule in recording_rules(cfg)}
    reads_gpu: dict[str, bool] = {}

    def gpu(expr: str, seen: frozenset[str] = frozenset()) -> bool:
        if _GPU_SERIES.search(expr):
            return True
        for name in RECORD_NAME.findall(expr):
            if name not in seen and name in exprs:
                if name not in reads_gpu:
                    reads_gpu[name] = gpu(exprs[name], seen | {name})
                if reads_gpu[name]:
                    return True
        return False

    return {sig.alert for sig in all_signatures(cfg) if any(gpu(rule.expr) for rule in sig.rules)}


def _reads_no_gpu(scrapes: list[Scrape]) -> bool:
    """Whether the sidecar exports no GPU series at all (its nvml collector is off)."""
    return not any(_GPU_SERIES.match(dict(labels).get(NAME, "")) for labels in scrapes[-1].samples)


async def diagnose_target(
    url: str, cfg: SiteConfig, *, span: float, interval: float, timeout: float, margin: float
) -> Report:
    """The catalogue over samples of one sidecar's ``/metrics`` page.

    A sidecar that reads no GPU (the node and dcgm layouts: the node agent or dcgm-exporter
    reads them) says so: the signatures that read the GPUs are not evaluated, with the reason,
    instead of having no data."""
    scrapes = await sample_target(url, span, interval, timeout)
    evaluator = target_evaluator(scrapes, cfg)
    report = Report("target", url, cfg, margin, scrapes[-1].time)
    report.samples, report.span = len(scrapes), evaluator.span
    backend = TargetBackend(evaluator)
    await evaluate(backend, report, url)
    if _reads_no_gpu(scrapes):
        blind = gpu_readers(cfg)
        for alert in [a for a in report.no_data if a in blind]:
            report.no_data.remove(alert)
            report.not_evaluated[alert] = NO_GPUS
    report.roofline = await roofline(backend, cfg, url)
    report.pools = await pool_budgets(backend, cfg)
    return report
