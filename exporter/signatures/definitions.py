"""Types of the signature catalogue.

A :class:`Signature` is one alert name with one or more :class:`AlertRule` variants (the Xid
alert is critical for some Xids and a warning for the rest), the :class:`Evidence` each
variant quotes, and the :class:`Runbook` that explains it. Expressions are plain PromQL over
the recording rules; evidence expressions contain the placeholder ``{target}`` where the
label matchers of one alert instance go, so the rule pack (through the ``query`` template
function) and ``diagnose`` (through the HTTP API) measure the same thing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning", "info"]
Family = Literal["cpu", "queue", "network", "memory", "gpu", "roofline", "pool", "meta"]
Effort = Literal["minutes", "hours", "days", "weeks"]
#: What to do when a signature holds, for the scaling advice and the autoscalers' gate
#: (``docs/slo.md``): ``scale_out`` where the signature is a capacity limit that more
#: replicas relieve, otherwise the fix it names. A new kind of fix is a new word here.
AdviceAction = Literal[
    "scale_out",  # capacity: more replicas (GPUs) relieve it
    "fix_host_cpu",  # the CPU side cannot feed the GPU (scheduler, copies, contention)
    "fix_frontend",  # the engine's front-end (API server thread, HTTP, detokenisation)
    "fix_tokenizer",  # tokenisation slower than a decode step
    "fix_host_feeding",  # bursty feeding: host-to-device copies, batch assembly
    "fix_softirq",  # interrupt handling takes the CPU (IRQ affinity, RPS, NIC queues)
    "fix_kv_link",  # the KV-cache transfer between prefill and decode pods
    "rebalance_pools",  # the other pool of a disaggregated fleet has the room
    "restart_engine",  # a stalled engine: restart it (and report it)
    "fix_gateway_scrape",  # the gateway queues or sheds on stale endpoint metrics
    "fix_interconnect",  # the GPUs' interconnect (NVLink, C2C, fabric) holds them back
    "fix_gpu",  # the GPU itself: lost, Xid errors, clocks held down (drain, repair, cool)
    "isolate_gpu",  # other tenants of a shared GPU take its time
    "tune_engine",  # the engine's own overhead (small batches, launches, scheduling)
    "fix_monitoring",  # the pack cannot see: nothing to scale on until it can
    "investigate",  # a symptom the other signatures of the target explain
]

SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")
FAMILIES: tuple[Family, ...] = (
    "cpu",
    "queue",
    "network",
    "memory",
    "gpu",
    "roofline",
    "pool",
    "meta",
)
EFFORTS: tuple[Effort, ...] = ("minutes", "hours", "days", "weeks")

TARGET = "{target}"
# A recording rule's name: level ``inference`` (per target), ``inference_gpu`` (per GPU) or
# ``inference_pool`` (per pool of disaggregated serving and model) or ``inference_gateway`` (per
# gateway, or per pool of a gateway, and model).
RECORD_NAME = re.compile(r"\binference(?:_gpu|_pool|_gateway)?:[a-z0-9_]+:[a-z0-9_]+\b")
# A ``{name}`` placeholder of a summary or description: an evidence key, ``target`` or
# ``labels.<name>``.
ANNOTATION_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_.]*)\}")


@dataclass(frozen=True)
class RecordingRule:
    """One ``level:metric:operation`` series and what it holds.

    ``window`` is how much history (seconds) the record needs before its value can be trusted:
    ``None`` takes the longest range its expression reads (``rate(x[5m])``: 300) or, for a
    record over other records, the longest window of those; ``0`` declares a record that is
    right from its first sample (an instant value, or one that handles a short history
    itself). Alerts over a windowed record stay silent until the target has that much history
    (the cold-start guard, :mod:`exporter.signatures.records`). ``group`` is the rule group
    it is evaluated in (``records.RECORD_GROUPS``): ``inference.records`` (per target, from the
    engine, tokenizer, process and cpu collectors), ``inference.records.latency`` (quantiles of
    the latency histograms, tens of buckets per target), ``inference.records.gpu`` and
    ``inference.records.gpu_state`` (from per-GPU series, whose cost grows with the GPUs: rates
    over windows, state now) and ``inference.records.roofline`` (per target and model: the
    GPUs' peaks, the model's facts, the engine's counters); a record reads records of its own
    group above it or of an earlier group.
    """

    record: str
    expr: str
    help: str
    window: float | None = None
    group: str = "inference.records"
    #: Static labels the rule adds: rules that write one record name for several things
    #: (one per signature, one per objective) tell their series apart by them.
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Evidence:
    """A measured value an alert quotes.

    ``expr`` is PromQL with ``{target}`` where the alert instance's matchers go (``None``
    quotes the alert expression's own value); ``fmt`` is a printf verb for the number.
    ``scope`` names the alert labels, besides the join labels, the evidence series carry
    (``None``: all of the rule's scope). ``name`` makes it a name rather than a number: the
    value of that label of the first series ``expr`` returns (a throttled GPU's cause).
    """

    key: str
    label: str
    expr: str | None
    unit: str
    fmt: str = "%.0f"
    scope: tuple[str, ...] | None = None
    name: str | None = None

    def query(self, matchers: str) -> str:
        """The concrete expression for one alert instance (``matchers`` with braces)."""
        if self.expr is None:
            raise ValueError(f"evidence {self.key} is the alert's value, not a query")
        return self.expr.replace(TARGET, matchers)


@dataclass(frozen=True)
class AlertRule:
    """One Prometheus alerting rule of a signature.

    ``summary`` and ``description`` are text with placeholders: ``{target}`` (the scrape
    target), ``{labels.<name>}`` (a label of the alert) and the evidence keys.
    ``scope`` lists the labels, besides the join labels, that tell two alerts of this rule
    apart (``gpu``, ``uuid``, ``collector`` ...). ``labels`` are extra static labels; two
    rules of one signature with the same severity differ in a ``condition`` label.
    ``history`` is set by the catalogue, not by a builder: the seconds of history the target
    needs before ``expr`` may hold (the cold-start guard; 0 when it reads no windowed record).
    """

    severity: Severity
    expr: str
    for_seconds: float
    summary: str
    description: str
    scope: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    when: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    history: float = 0.0
    #: Placeholders of ``summary``/``description`` that are Go templates of their own (a list
    #: over a query's results), rendered as they are: name -> template text.
    templates: tuple[tuple[str, str], ...] = ()

    def placeholders(self) -> set[str]:
        return set(ANNOTATION_PLACEHOLDER.findall(self.summary + " " + self.description))


@dataclass(frozen=True)
class Check:
    """Something to run on the node, and what to look for in its output."""

    command: str
    look_for: str


@dataclass(frozen=True)
class Fix:
    effort: Effort
    action: str
    detail: str


@dataclass(frozen=True)
class Runbook:
    meaning: str
    on_node: tuple[Check, ...]
    fixes: tuple[Fix, ...]
    queries: tuple[tuple[str, str], ...] = ()
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True)
class Advice:
    """What a signature that holds means for scaling (``docs/slo.md``).

    ``action`` is what to do (:data:`AdviceAction`), ``blocks_scale_out`` whether adding
    replicas is the wrong fix while the signature holds: the ``scale_out_eligible`` gate is 0
    on a pod (or pool) where a blocking signature holds, so an autoscaler that multiplies its
    trigger by the gate buys no GPUs for a backlog the host, a link or a stall causes.
    ``why`` is one sentence with the evidence placeholders of the signature's rules
    (``{thread}``): ``diagnose`` fills them ("scaling out would not help: the busiest engine
    thread is at 98 % of a core").
    """

    action: AdviceAction
    blocks_scale_out: bool
    why: str

    def __post_init__(self) -> None:
        if self.action == "scale_out" and self.blocks_scale_out:
            raise ValueError("an advice to scale out cannot block scaling out")


@dataclass(frozen=True)
class Signature:
    """One alert name of the catalogue.

    ``advice`` is required: every signature says what it means for scaling, so a new one is
    in the scaling advice and the autoscalers' gate without code of its own. ``explains`` names
    the alerts that are this one's consequences where both hold (a gateway gating on stale
    metrics starves its pool's GPUs): ``diagnose`` ranks this one first.
    """

    alert: str
    family: Family
    title: str
    rules: tuple[AlertRule, ...]
    runbook: Runbook
    advice: Advice
    explains: tuple[str, ...] = ()

    @property
    def severities(self) -> tuple[Severity, ...]:
        return tuple(dict.fromkeys(rule.severity for rule in self.rules))


def fill_placeholders(template: str, values: Mapping[str, str]) -> str:
    """Replace the ``{name}`` placeholders found in ``values``; leave the others.

    How ``diagnose`` prints a summary or description with its own numbers: ``values`` holds
    the evidence keys, ``target`` and ``labels.<name>``.
    """
    return ANNOTATION_PLACEHOLDER.sub(lambda match: values.get(match[1], match[0]), template)
