"""Which signatures hold now, what each means for scaling, and the autoscalers' gate.

``inference:bottleneck_signature:holding`` is 1 per target and signature while the signature's
condition holds (its alert expression, cold-start guard included, without its ``for``: it is
pending or firing); ``inference_pool:bottleneck_signature:holding`` the same per pool and model
for the pool signatures (those over ``inference_pool:`` records). Each rule is one signature,
and its static labels say what it means for scaling (:class:`~exporter.signatures.definitions.
Advice`): ``alertname``, ``signature`` (the family), ``advice`` (the action) and
``blocks_scale_out``. The burn-rate pages read them to name their cause; the records below read
them to advise; a new signature is in both without code of its own. A gateway's signature
(over its ``inference_gateway`` series) holds on the gateway's target and on the engine
targets of the pool it feeds (``gateway.join`` and ``model``): a gateway gating on stale
metrics blocks scaling its engines out. A signature another explains
(:attr:`~exporter.signatures.definitions.Signature.explains`) does not hold on a target where
that one holds: the page names the cause, not its consequence. Nor does its advice stay while
the one that explains it held within the hold (the starved GPUs behind a stale gateway held a
minute before the gateway's staleness showed): the advice on the engines is the gateway's scrape
alone, never a second fix for the consequence.

A cause blocks scaling out for ``scaling.cause_hold`` after it last held (``max_over_time``),
so the gate does not flap with a signature at its threshold.

Per target (pod):

``inference:scale_out_blocked:flag``
    1 while a signature that blocks scaling out holds on the pod (within the hold).
``inference:scale_out_eligible:bool``
    1 where the backlog is capacity: requests wait (``scaling.queue_depth_at_least``) or the KV
    cache is full (``scaling.kv_cache_above``), the engine's GPUs are busy
    (``scaling.gpu_utilization_at_least``, the engine's own share), and no blocking cause holds
    on the pod or on its pool; 0 on every other pod with an engine. An autoscaler multiplies
    its queue or KV trigger by it.
``inference:scaling_advice:info``
    1 per pod and ``advice``/``cause``: the fix each signature holding on it, or on its pool,
    names (``cause`` = its alert name), ``advice="scale_out", cause="capacity"`` where the
    pod is eligible, and ``advice="none", cause="no_capacity_backlog"`` on every other pod with
    an engine (nothing holds, and no queue or full KV cache on busy GPUs).

Per pool and model, the same: ``inference_pool:scale_out_blocked:ratio`` (the share of the
pool's pods a blocking cause holds on; 1 for a pool cause), ``inference_pool:
scale_out_eligible:bool`` (the pool's mean backlog is capacity on busy GPUs and a blocking
cause holds on less than ``scaling.blocked_pods_share_at_least`` of its pods, none on the
pool), ``inference_pool:scaling_advice:ratio`` (per advice and cause, the share of the pool's
pods it holds on). A target serving several models counts for each of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from exporter.config import format_duration
from exporter.signatures.catalogue import all_signatures
from exporter.signatures.definitions import RecordingRule, Signature
from exporter.signatures.promql_text import by, num, on, regex_alternatives
from exporter.signatures.signals.engine_signals import KV_CACHE, QUEUE_DEPTH
from exporter.signatures.signals.gateway_signals import GATEWAYS, engine_targets
from exporter.signatures.signals.shared_gpu_signals import GPU_OWN_UTILIZATION
from exporter.signatures.signals.signal import Rule, Signal, Unit
from exporter.signatures.signals.signal_context import SignalContext
from exporter.signatures.site import SiteConfig

#: The rule group of the verdicts: after every record the signatures read.
VERDICT_GROUP = "inference.records.verdicts"
#: The label of a cause in the advice records (an alert name, or ``capacity``).
CAUSE = "cause"
CAPACITY = "capacity"
#: The advice where nothing is to be done: no cause holds, and the backlog is not capacity.
NONE = "none"
NO_BACKLOG = "no_capacity_backlog"
BLOCKS = 'blocks_scale_out="true"'


def _signal(name: str, unit: Unit, help_text: str) -> Signal:
    """A verdict signal as the views name it; its rules are written by :func:`verdict_rules`
    (several rules of one name tell their series apart by static labels)."""
    return Signal(name, unit, VERDICT_GROUP, Rule(lambda _ctx: name, help_text), help_text)


SERVED = _signal(
    "inference:served_model:info",
    "flag",
    "1 per target and model its engines serve: the pods of each pool the verdicts count",
)
POOL_PODS = _signal(
    "inference_pool:served_pods:count",
    "count",
    "targets serving the model in the pool",
)
HOLDING = _signal(
    "inference:bottleneck_signature:holding",
    "flag",
    "1 per target and signature while its condition holds (pending or firing)",
)
POOL_HOLDING = _signal(
    "inference_pool:bottleneck_signature:holding",
    "flag",
    "1 per pool, model and pool signature while its condition holds",
)
BLOCKED = _signal(
    "inference:scale_out_blocked:flag", "flag", "1 while a cause that blocks scaling out holds"
)
ELIGIBLE = _signal(
    "inference:scale_out_eligible:bool", "flag", "1 where the pod's backlog is capacity, else 0"
)
ADVICE = _signal("inference:scaling_advice:info", "flag", "what to do, per advice and cause")
POOL_BLOCKED = _signal(
    "inference_pool:scale_out_blocked:ratio",
    "ratio",
    "share of the pool's pods a cause that blocks scaling out holds on",
)
POOL_ELIGIBLE = _signal(
    "inference_pool:scale_out_eligible:bool", "flag", "1 where the pool's backlog is capacity"
)
POOL_ADVICE = _signal(
    "inference_pool:scaling_advice:ratio",
    "ratio",
    "share of the pool's pods each advice and cause holds on",
)


def is_pool_signature(sig: Signature) -> bool:
    """A signature of a pool (over ``inference_pool:`` records), not of one target."""
    return all("inference_pool:" in rule.expr for rule in sig.rules)


_GATEWAY_SERIES = re.compile(r"\binference_gateway[:_]")


def is_gateway_signature(sig: Signature) -> bool:
    """A signature of a gateway (over its ``inference_gateway`` series): it holds on the
    gateway's target, and on the engine targets of the pool the gateway feeds."""
    return all(_GATEWAY_SERIES.search(rule.expr) for rule in sig.rules)


def explainers(signatures: Sequence[Signature]) -> dict[str, tuple[str, ...]]:
    """Per alert name, the signatures that explain it (:attr:`Signature.explains`)."""
    out: dict[str, list[str]] = {}
    for sig in signatures:
        for alert in sig.explains:
            out.setdefault(alert, []).append(sig.alert)
    return {alert: tuple(names) for alert, names in out.items()}


def _labels(sig: Signature) -> tuple[tuple[str, str], ...]:
    return (
        ("alertname", sig.alert),
        ("signature", sig.family),
        ("advice", sig.advice.action),
        ("blocks_scale_out", "true" if sig.advice.blocks_scale_out else "false"),
    )


def _holding_expr(ctx: SignalContext, sig: Signature) -> str:
    """Where ``sig``'s condition holds: per target, or per pool and model for a pool signature;
    a gateway's also on the engine targets of the pool it feeds (``gateway.join`` and model)."""
    labels = (*ctx.pool, "model") if is_pool_signature(sig) else ctx.join
    exprs = [rule.expr for rule in sig.rules]
    body = exprs[0] if len(exprs) == 1 else "\n".join(f"(\n{e}\n)\nor" for e in exprs)[:-3]
    expr = f"group {by(labels)} (\n{body}\n)"
    if is_gateway_signature(sig):
        fed = (*ctx.cfg.gateway.labels, "model")
        gateways = regex_alternatives(GATEWAYS)
        engines = ctx.latest("inference_engine_info", f'engine!~"{gateways}"')
        expr += (
            f"\nor\ngroup {by(labels)} (\n{engines}\nand {on(fed)}\ngroup {by(fed)} (\n{body}\n)\n)"
        )
    return expr


def _holding_rule(
    ctx: SignalContext, sig: Signature, explained_by: Sequence[Signature] = ()
) -> RecordingRule:
    """The holding record of ``sig``, left out where a signature that explains it holds. The
    explaining conditions are written out, not read from their holding records: a rule that
    read its own group's output would see the last evaluation's on vmalert (it writes records
    through remote write), and each rule here is right in one pass on either engine."""
    pool = is_pool_signature(sig)
    labels = (*ctx.pool, "model") if pool else ctx.join
    expr = _holding_expr(ctx, sig)
    causes = [
        _holding_expr(ctx, other) for other in explained_by if is_pool_signature(other) == pool
    ]
    if causes:
        expr = f"(\n{expr}\n)\nunless {on(labels)}\n(\n" + "\nor\n".join(causes) + "\n)"
    return RecordingRule(
        (POOL_HOLDING if pool else HOLDING).name,
        expr,
        f"1 while {sig.alert} holds ({sig.advice.action}"
        + (", blocks scaling out)" if sig.advice.blocks_scale_out else ")"),
        window=0.0,
        group=VERDICT_GROUP,
        labels=_labels(sig),
    )


class _Verdicts:
    """The expressions of one configuration."""

    def __init__(self, cfg: SiteConfig, signatures: Sequence[Signature]) -> None:
        self.ctx = SignalContext(cfg)
        # Per alert of a target, the target signatures that explain it (a pool's are not: a
        # pool signature's advice is written per pool).
        self.explained = {
            alert: causes
            for alert, causes in explainers(
                [s for s in signatures if not is_pool_signature(s)]
            ).items()
        }
        self.cfg = cfg
        self.scaling = cfg.scaling
        self.hold = format_duration(cfg.scaling.cause_hold * cfg.profile.time_scale)
        self.target = on(self.ctx.join)
        self.pool_labels = (*self.ctx.pool, "model")
        self.pool = on(self.pool_labels)

    def held(self, signal: Signal, *matchers: str) -> str:
        """Where ``signal`` held within the hold: ``max_over_time(x{...}[hold])``."""
        body = ",".join(matchers)
        return f"max_over_time({signal.name}{{{body}}}[{self.hold}])"

    def served(self) -> str:
        """One series per engine target and model it serves (recorded once as
        :data:`SERVED`): a gateway's target is not one of its pool's pods."""
        return engine_targets(self.ctx)

    def pods(self) -> str:
        return SERVED.name

    def pool_pods(self) -> str:
        return f"count {by(self.pool_labels)} ({SERVED.name})"

    def per_model(self, signal: Signal) -> str:
        """A per-target signal on each model the target serves (labels: target, model)."""
        return f"{self.pods()} * {self.target} group_left\n{self.ctx.name(signal)}"

    def blocked(self) -> str:
        held = self.held(HOLDING, BLOCKS)
        return f"max {by(self.ctx.join)} (\n{held}\n)"

    def pool_causes(self) -> str:
        held = self.held(POOL_HOLDING, BLOCKS)
        return f"max {by(self.pool_labels)} (\n{held}\n)"

    def eligible(self) -> str:
        s = self.scaling
        backlog = (
            f"(\n{self.ctx.name(QUEUE_DEPTH)} >= {num(s.queue_depth_at_least)}\n"
            f"or\n{self.ctx.name(KV_CACHE)} > {num(s.kv_cache_above)}\n)"
        )
        busy = f"{self.ctx.name(GPU_OWN_UTILIZATION)} >= {num(s.gpu_utilization_at_least)}"
        pool_blocked = f"(\n{self.pods()}\nand {self.pool}\n{self.pool_causes()}\n)"
        return (
            f"clamp(\n{backlog}\nand {self.target}\n{busy}\n"
            f"unless {self.target}\n{BLOCKED.name}\n"
            f"unless {self.target}\n{pool_blocked},\n1, 1\n)\n"
            f"or {self.target}\n0 * group {by(self.ctx.join)} ({self.pods()})"
        )

    def advised(self, *matchers: str) -> str:
        """Where the signatures of ``matchers`` held on a target within the hold, but those
        that a signature that also held on the target within the hold explains: the cause's
        advice, not its consequence's. The explained alerts are read apart, grouped by the
        signatures that explain them, each group ``unless`` its causes held."""
        by_causes: dict[tuple[str, ...], list[str]] = {}
        for alert, causes in self.explained.items():
            by_causes.setdefault(causes, []).append(alert)
        if not by_causes:
            return self.held(HOLDING, *matchers)
        every = regex_alternatives(self.explained)
        parts = [self.held(HOLDING, *matchers, f'alertname!~"{every}"')]
        for causes, alerts in by_causes.items():
            mine = self.held(HOLDING, *matchers, f'alertname=~"{regex_alternatives(alerts)}"')
            cause = self.held(HOLDING, f'alertname=~"{regex_alternatives(causes)}"')
            parts.append(f"(\n{mine}\nunless {self.target}\n{cause}\n)")
        return "\nor\n".join(parts)

    def advice(self) -> str:
        held = self.advised('advice!="scale_out"')
        return (
            f"max {by((*self.ctx.join, 'advice', CAUSE))} (\n"
            f'label_replace(\n{held},\n"{CAUSE}", "$1", "alertname", "(.+)"\n)\n)'
        )

    def pod_causes(self) -> str:
        """The targets where a signature (other than a capacity one) held within the hold,
        on the target or on its pool."""
        held = self.held(HOLDING, 'advice!="scale_out"')
        pool_held = self.held(POOL_HOLDING, 'advice!="scale_out"')
        return (
            f"{held}\nor {self.target}\n"
            f"group {by(self.ctx.join)} (\n{self.pods()}\nand {self.pool}\n{pool_held}\n)"
        )

    def nothing(self) -> str:
        """Targets with an engine where no cause holds and the gate is closed."""
        return (
            f"group {by(self.ctx.join)} ({self.pods()})\nunless {self.target}\n(\n"
            f"{self.pod_causes()}\n)\nunless {self.target}\n{ELIGIBLE.name} == 1"
        )

    def pool_nothing(self) -> str:
        """Pools where no cause holds on any target or on the pool, and the gate is closed."""
        bp = by(self.pool_labels)
        held = self.held(HOLDING, 'advice!="scale_out"')
        pool_held = self.held(POOL_HOLDING, 'advice!="scale_out"')
        return (
            f"{POOL_PODS.name} * 0 + 1\nunless {self.pool}\n(\n"
            f"group {bp} (\n{self.pods()}\nand {self.target}\n{held}\n)\n"
            f"or {self.pool}\n{pool_held}\n)\nunless {self.pool}\n{POOL_ELIGIBLE.name} == 1"
        )

    def pool_cause_on_pods(self, sig: Signature) -> str:
        """The targets of the pools where the pool signature ``sig`` held within the hold."""
        held = self.held(POOL_HOLDING, f'alertname="{sig.alert}"')
        return f"group {by(self.ctx.join)} (\n{self.pods()}\nand {self.pool}\n{held}\n)"

    def pool_blocked(self) -> str:
        count = POOL_PODS.name
        return (
            f"{self.pool_causes()}\nor\n"
            f"count {by(self.pool_labels)} (\n{self.pods()}\nand {self.target}\n{BLOCKED.name}\n)"
            f"\n/ {self.pool}\n{count}"
        )

    def pool_eligible(self) -> str:
        s, bp = self.scaling, by(self.pool_labels)
        queue = f"avg {bp} (\n{self.per_model(QUEUE_DEPTH)}\n)"
        kv = f"avg {bp} (\n{self.per_model(KV_CACHE)}\n)"
        busy = f"avg {bp} (\n{self.per_model(GPU_OWN_UTILIZATION)}\n)"
        return (
            f"clamp(\n(\n{queue} >= {num(s.queue_depth_at_least)}\n"
            f"or\n{kv} > {num(s.kv_cache_above)}\n)\n"
            f"and {self.pool}\n{busy} >= {num(s.gpu_utilization_at_least)}\n"
            f"unless {self.pool}\n{POOL_BLOCKED.name} >= {num(s.blocked_pods_share_at_least)},\n"
            f"1, 1\n)\nor {self.pool}\n0 * {POOL_PODS.name}"
        )

    def pool_advice(self, sig: Signature) -> str:
        mine = f'alertname="{sig.alert}"'
        if is_pool_signature(sig):
            return f"max {by(self.pool_labels)} (\n{self.held(POOL_HOLDING, mine)}\n)"
        count = POOL_PODS.name
        held = self.held(HOLDING, mine)
        causes = self.explained.get(sig.alert)
        if causes:
            cause = self.held(HOLDING, f'alertname=~"{regex_alternatives(causes)}"')
            held = f"(\n{held}\nunless {self.target}\n{cause}\n)"
        return (
            f"count {by(self.pool_labels)} (\n{self.pods()}\nand {self.target}\n"
            f"{held}\n)\n/ {self.pool}\n{count}"
        )


def verdict_rules(cfg: SiteConfig) -> list[RecordingRule]:
    """The holding, advice and gate records of the configuration, in evaluation order."""
    signatures = all_signatures(cfg)
    v = _Verdicts(cfg, signatures)
    hold = format_duration(cfg.scaling.cause_hold * cfg.profile.time_scale)

    def rule(signal: Signal, expr: str, text: str, **labels: str) -> RecordingRule:
        return RecordingRule(
            signal.name, expr, text, window=0.0, group=VERDICT_GROUP, labels=tuple(labels.items())
        )

    share = num(round(cfg.scaling.blocked_pods_share_at_least * 100, 6))
    rules = [
        rule(SERVED, v.served(), "1 per target and model its engines serve"),
        rule(POOL_PODS, v.pool_pods(), "targets serving the model in the pool"),
    ]
    by_alert = {sig.alert: sig for sig in signatures}
    explained = explainers(signatures)
    rules += [
        _holding_rule(v.ctx, sig, [by_alert[a] for a in explained.get(sig.alert, ())])
        for sig in signatures
    ]
    rules += [
        rule(
            BLOCKED,
            v.blocked(),
            f"1 while a signature that blocks scaling out held on the target in the last {hold}",
        ),
        rule(
            ELIGIBLE,
            v.eligible(),
            "1 where the target's backlog is capacity (requests waiting or the KV cache full, "
            "the GPUs busy, no cause that blocks scaling out on it or its pool), 0 on every "
            "other target with an engine: the autoscalers' gate",
        ),
        rule(
            ADVICE,
            v.advice(),
            "1 per target and the fix each signature that held in the last "
            f"{hold} names (cause: its alert name)",
        ),
        *(
            rule(
                ADVICE,
                v.pool_cause_on_pods(sig),
                f"1 on the targets of the pools {sig.alert} held on in the last {hold}",
                advice=sig.advice.action,
                cause=sig.alert,
            )
            for sig in signatures
            if is_pool_signature(sig) and sig.advice.action != "scale_out"
        ),
        rule(
            ADVICE,
            f"{ELIGIBLE.name} == 1",
            "1 where the target's backlog is capacity: scale out",
            advice="scale_out",
            cause=CAPACITY,
        ),
        rule(
            ADVICE,
            v.nothing(),
            "1 where no cause holds and the backlog is not capacity (no queue or full KV cache "
            "on busy GPUs): nothing to do",
            advice=NONE,
            cause=NO_BACKLOG,
        ),
        rule(
            POOL_BLOCKED,
            v.pool_blocked(),
            "share of the pool's targets a cause that blocks scaling out held on in the last "
            f"{hold} (1 for a cause of the pool itself)",
        ),
        rule(
            POOL_ELIGIBLE,
            v.pool_eligible(),
            "1 where the pool's mean backlog is capacity on busy GPUs and causes that block "
            f"scaling out hold on fewer than {share} % of its targets, 0 on every other pool: "
            "the autoscalers' gate",
        ),
    ]
    rules += [
        rule(
            POOL_ADVICE,
            v.pool_advice(sig),
            f"share of the pool's targets {sig.alert} held on in the last {hold} "
            f"({sig.advice.action})",
            advice=sig.advice.action,
            cause=sig.alert,
        )
        for sig in signatures
        if sig.advice.action != "scale_out"
    ]
    rules += [
        rule(
            POOL_ADVICE,
            f"{POOL_ELIGIBLE.name} == 1",
            "1 where the pool's backlog is capacity: scale out",
            advice="scale_out",
            cause=CAPACITY,
        ),
        rule(
            POOL_ADVICE,
            v.pool_nothing(),
            "1 where no cause holds on the pool or its targets and the backlog is not "
            "capacity: nothing to do",
            advice=NONE,
            cause=NO_BACKLOG,
        ),
    ]
    return rules


def advice_table(cfg: SiteConfig) -> str:
    """What each signature says for scaling, as Markdown (``docs/slo.md``, by docgen)."""
    out = [
        "| signature | family | advice | blocks scaling out | holds on |",
        "|---|---|---|---|---|",
    ]
    for sig in all_signatures(cfg):
        blocks = "yes" if sig.advice.blocks_scale_out else "no"
        where = "the pool" if is_pool_signature(sig) else "a pod"
        out.append(
            f"| [{sig.alert}](runbooks/{sig.alert}.md) | {sig.family} | `{sig.advice.action}` "
            f"| {blocks} | {where} |"
        )
    return "\n".join(out) + "\n"
