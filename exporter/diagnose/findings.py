"""What a diagnosis finds: conditions, instances, evidence, findings, the roofline figures and
the pools' budgets (the whole run's result is :class:`~exporter.diagnose.diagnosis.Report`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exporter.diagnose.promql_eval import Labels
from exporter.signatures.definitions import AlertRule, Signature
from exporter.signatures.params import LONG_OUTPUT_TOKENS, LONG_PROMPT_TOKENS
from exporter.signatures.signals import (
    energy_signals,
    link_signals,
    pool_signals,
    roofline_signals,
)
from exporter.signatures.signals.signal import Signal

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
# Among signatures that hold, an alert already firing (it held for its whole `for`) ranks
# before a pending one, before none.
_STATE_RANK = {"firing": 0, "pending": 1}
# Among signatures that hold and share a severity: pools, then targets, then measures.
_TIER = {"pool": 0.0, "roofline": 2.0}


def json_number(value: float | None) -> float | str | None:
    """A float for JSON: NaN and infinities as strings (JSON has no such numbers)."""
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return value


def format_value(fmt: str, value: float | None) -> str:
    """``fmt % value``; ``?`` for no value, Prometheus' spelling of NaN and infinities."""
    if value is None:
        return "?"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return fmt % value


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
            "value": json_number(self.value),
            "threshold": json_number(self.threshold),
            "threshold_expr": self.threshold_expr,
            "holds": self.holds,
            "nearly": self.nearly,
            "relative_gap": json_number(self.gap),
        }


@dataclass
class Instance:
    """One label set an alert expression returns (or nearly returns), with its conditions."""

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


@dataclass
class Finding:
    """A signature that holds or nearly holds for one instance.

    ``covers`` are the other targets a cause holds on: a gateway's signature, on the engine
    targets of the pool it feeds (as the pack's holding records count it). ``explained_by``
    names the holding finding that explains this one on its target (:func:`explainer`), as
    ``alert on target``.
    """

    sig: Signature
    rule: AlertRule
    instance: Instance
    target: str
    evidence: list[EvidenceValue]
    state: str | None = None
    covers: tuple[str, ...] = ()
    explained_by: str | None = None

    @property
    def status(self) -> str:
        return "holds" if self.instance.holds else "nearly"

    def sort_key(self) -> tuple[float, ...]:
        severity = float(SEVERITY_RANK[self.rule.severity])
        conditions = self.instance.conditions
        if self.instance.holds:
            # Among signatures that hold: by severity, then a pool's cause (disaggregated
            # serving: a short pool, the KV link; it reads every engine of the pool, and the
            # queue waits on the pods of a short pool are its consequence), then a target's
            # cause, then a measure of where the time goes (the roofline group: a host-latency
            # share, a decode far from its floor, which a saturated thread or a flooded core
            # explains), then an alert already firing before a pending one before none, then
            # by margin.
            measure = _TIER.get(self.sig.family, 1.0)
            persisted = float(_STATE_RANK.get(self.state or "", len(_STATE_RANK)))
            margins = [c.gap for c in conditions if c.holds and c.gap is not None]
            return (0.0, severity, measure, persisted, -min(margins, default=math.inf))
        gaps = [c.gap for c in conditions if c.nearly and c.gap is not None]
        return (1.0, max(gaps, default=0.0), severity)


def explained_first(findings: list[Finding]) -> list[Finding]:
    """``findings`` (in rank order) with each holding finding placed before the first holding
    finding of an alert it explains (:attr:`~exporter.signatures.definitions.Signature.
    explains`): a gateway gating on stale endpoint metrics before the starved GPUs of its
    pool, whatever their severities and margins."""
    out = list(findings)
    for cause in [f for f in findings if f.instance.holds and f.sig.explains]:
        effects = [
            i for i, f in enumerate(out) if f.instance.holds and f.sig.alert in cause.sig.explains
        ]
        here = out.index(cause)
        if effects and min(effects) < here:
            out.insert(min(effects), out.pop(here))
    return out


def explainer(finding: Finding, findings: list[Finding]) -> Finding | None:
    """The first holding finding of ``findings`` that explains ``finding`` where it holds:
    one whose signature explains ``finding``'s alert (:attr:`~exporter.signatures.definitions.
    Signature.explains`) and holds on its target, itself or among those it covers (a gateway
    gating on stale endpoint metrics, on the engines whose GPUs it starves). ``None`` for a
    finding that does not hold, or that nothing explains there."""
    if not finding.instance.holds:
        return None
    for cause in findings:
        if (
            cause is not finding
            and cause.instance.holds
            and finding.sig.alert in cause.sig.explains
            and finding.target in (cause.target, *cause.covers)
        ):
            return cause
    return None


def mark_explained(findings: list[Finding]) -> None:
    """Set each finding's ``explained_by`` (:func:`explainer`)."""
    for finding in findings:
        cause = explainer(finding, findings)
        finding.explained_by = None if cause is None else f"{cause.sig.alert} on {cause.target}"


# The roofline figures diagnose shows, by key, and the signal of the pack each comes from.
FIGURES: dict[str, Signal] = {
    "floor": roofline_signals.DECODE_FLOOR,
    "itl": roofline_signals.INTER_TOKEN_MEAN,
    "efficiency": roofline_signals.DECODE_EFFICIENCY,
    "roofline_tokens": roofline_signals.ROOFLINE_TOKENS,
    "throughput": roofline_signals.ROOFLINE_THROUGHPUT,
    "prefill_efficiency": roofline_signals.PREFILL_EFFICIENCY,
    "e2e": roofline_signals.E2E_MEAN,
    "queue": roofline_signals.BUDGET_QUEUE,
    "prefill": roofline_signals.BUDGET_PREFILL,
    "decode": roofline_signals.BUDGET_DECODE,
    "host": roofline_signals.BUDGET_HOST,
    "transfer": roofline_signals.BUDGET_TRANSFER,
    "prompt_tokens": roofline_signals.PROMPT_TOKENS,
    "output_tokens": roofline_signals.OUTPUT_TOKENS,
    "joules_generated": energy_signals.ENERGY_PER_GENERATED,
    "joules_prompt": energy_signals.ENERGY_PER_PROMPT,
    "cost_generated": energy_signals.COST_PER_GENERATED,
    "cost_prompt": energy_signals.COST_PER_PROMPT,
}

# Figures of the whole target (its GPUs), shown with each model it serves.
TARGET_FIGURES: dict[str, Signal] = {
    "gpus": link_signals.GPUS,
    "nvlink": link_signals.NVLINK_UTILIZATION,
    "power": energy_signals.POWER,
    "idle_energy": energy_signals.IDLE_ENERGY,
    "cost_per_hour": energy_signals.COST,
}


@dataclass
class Roofline:
    """How far one served model on one target is from its hardware limit, and where its
    requests' time goes: the values of :data:`FIGURES` that its records hold (finite ones)."""

    target: str
    labels: Labels
    values: dict[str, float]

    @property
    def model(self) -> str:
        return dict(self.labels).get("model", "")

    def get(self, key: str) -> float | None:
        return self.values.get(key)

    @property
    def decode_source(self) -> str | None:
        """``floor``: efficiency = HBM floor / mean inter-token latency; ``read_bytes``: the
        engine's estimated read bandwidth / peak (no model facts); ``None``: no efficiency."""
        if "efficiency" not in self.values:
            return None
        return "floor" if "floor" in self.values else "read_bytes"

    @property
    def tokens_per_second(self) -> float | None:
        """Generated tokens per second (the roofline's times the share of it generated)."""
        roofline, share = self.get("roofline_tokens"), self.get("throughput")
        return None if roofline is None or share is None else roofline * share

    @property
    def communication_share(self) -> float | None:
        """The least share of a step spent moving data between the target's GPUs: NVLink use
        against its peak (the time the links would be busy at their peak rate), where the
        target has more than one GPU and its links are read; ``None`` elsewhere."""
        gpus, nvlink = self.get("gpus"), self.get("nvlink")
        if nvlink is None or (gpus is not None and gpus < 2):
            return None
        return nvlink

    @property
    def engine_time_split(self) -> tuple[float, float] | None:
        """Prefill's and decode's shares of the time requests spend in the engine's steps."""
        prefill, decode = self.get("prefill"), self.get("decode")
        if prefill is None or decode is None or prefill + decode <= 0:
            return None
        return prefill / (prefill + decode), decode / (prefill + decode)


# Each pool's latency budget (one series per pool, model and role) and its time to first
# token split (one per pool and model), by key, from the signals of the pack.
POOL_BUDGET: dict[str, Signal] = {
    "queue": pool_signals.POOL_BUDGET_QUEUE,
    "prefill": pool_signals.POOL_BUDGET_PREFILL,
    "transfer": pool_signals.POOL_BUDGET_TRANSFER,
    "decode": pool_signals.POOL_BUDGET_DECODE,
}
TTFT_SPLIT: dict[str, Signal] = {
    "queue_seconds": pool_signals.TTFT_QUEUE_MEAN,
    "prefill_seconds": pool_signals.TTFT_PREFILL_MEAN,
    "transfer_seconds": pool_signals.KV_TRANSFER_MEAN,
    "queue": pool_signals.TTFT_QUEUE_SHARE,
    "prefill": pool_signals.TTFT_PREFILL_SHARE,
    "transfer": pool_signals.TTFT_TRANSFER_SHARE,
}
#: The roles a pool budget is printed in, in the order a request meets them.
ROLE_ORDER = ("prefill", "decode", "both")


@dataclass
class PoolBudget:
    """Where the time of one model's requests goes in each pool of disaggregated serving:
    each role's shares of its engines' end-to-end latency (:data:`POOL_BUDGET`), and time to
    first token split into queue, prefill and KV transfer (:data:`TTFT_SPLIT`)."""

    labels: Labels  # the pool's labels and model
    name: str  # as the pool signatures' findings name it: ``pool namespace=llm job=...``
    roles: dict[str, dict[str, float]]
    ttft: dict[str, float]

    @property
    def model(self) -> str:
        return dict(self.labels).get("model", "")

    @property
    def ttft_seconds(self) -> float | None:
        """Time to first token: queue + prefill + transfer, means per request."""
        parts = [self.ttft.get(f"{key}_seconds") for key in ("queue", "prefill", "transfer")]
        return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)

    def ordered_roles(self) -> list[str]:
        return sorted(self.roles, key=lambda r: (*ROLE_ORDER, r).index(r))


def workload_advice(prompt_tokens: float | None, output_tokens: float | None) -> str | None:
    """The rule of thumb for disaggregated serving, from the mean prompt and output lengths:
    long prompts make a pod prefill-bound, long outputs decode-bound."""
    if prompt_tokens is None or output_tokens is None:
        return None
    long_prompt = prompt_tokens > LONG_PROMPT_TOKENS
    long_output = output_tokens > LONG_OUTPUT_TOKENS
    if long_prompt and long_output:
        return (
            f"long prompts (> {LONG_PROMPT_TOKENS} tokens) and long outputs "
            f"(> {LONG_OUTPUT_TOKENS}): prefill and decode compete for the same GPUs - the case "
            "for disaggregated serving, prefill and decode in separate pools"
        )
    if long_prompt:
        return (
            f"long prompts (> {LONG_PROMPT_TOKENS} tokens): this pod is prefill-bound - a "
            "separate prefill pool (disaggregated serving), or chunked prefill with a larger "
            "token budget per step"
        )
    if long_output:
        return (
            f"long outputs (> {LONG_OUTPUT_TOKENS} tokens): this pod is decode-bound - larger "
            "decode batches, or a separate decode pool (disaggregated serving)"
        )
    return (
        f"prompts up to {LONG_PROMPT_TOKENS} tokens and outputs up to {LONG_OUTPUT_TOKENS}: "
        "neither phase dominates by length; disaggregated serving would not pay"
    )
