"""Row "Prefill and decode pools": disaggregated serving, one pool per role and model.

A pool is every engine of one model with one role (``prefill``, ``decode``) that shares the
join labels that do not name a pod, as in the rule pack's pool records and signatures
(``exporter/signatures/signals/pool.py``). The panels group the sidecar's series the
same way: engines per role, the queue by stage, the KV-cache transfer between the pools (its
time, its bandwidth), the transfers that failed, by reason, and the router's P/D decisions.
Where a pool signature draws its threshold, the panel plots the pool signal it reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    MODEL,
    AnyPanel,
    Query,
    Unit,
    alert_threshold,
    pct,
    rate,
    series,
    site,
    target_labels,
    target_matchers,
    timeseries,
    warn,
)
from exporter.signatures.promql_text import selector
from exporter.signatures.signals import pool_labels
from exporter.signatures.signals.pool_signals import (
    KV_FAILURE_RATIO,
    POOL_QUEUE,
    TTFT_PREFILL_SHARE,
    TTFT_QUEUE_SHARE,
    TTFT_TRANSFER_SHARE,
)
from exporter.signatures.signals.signal import ROLES, Signal

TITLE = "Prefill and decode pools"


def pool() -> tuple[str, ...]:
    """The labels of one pool besides ``model``: the join labels that do not name a pod."""
    return pool_labels(target_labels())


def by_pool(aggregation: str, inner: str, *extra: str) -> str:
    """``aggregation by (<pool labels>, model, extra...) (inner)``."""
    return f"{aggregation} by ({', '.join((*pool(), 'model', *extra))}) ({inner})"


def pool_signal(sig: Signal) -> str:
    """A pool signal narrowed by the variables of the pool's labels (a pool has no pod) and the
    model."""
    mine = [m for m in target_matchers() if m.split("=", 1)[0] in pool()]
    return selector(sig.record(site()), mine, MODEL)


def pool_legend(*extra: str) -> str:
    """A pool in a legend: its labels but ``namespace`` and ``job`` (``{{cluster}}`` where the
    site joins on it), its model and whatever else the panel splits it by."""
    named = [label for label in pool() if label not in ("namespace", "job")]
    return " ".join("{{" + label + "}}" for label in (*named, "model", *extra))


def sizes() -> AnyPanel:
    return timeseries(
        "Pool sizes: engines per role",
        "Engines of each model per role (prefill, decode; unified engines have no role), "
        "across the pods of one pool. Bad: a pool shrinking while its queue grows, or a "
        "prefill:decode ratio far from what the pool signatures suggest.",
        [
            Query(
                by_pool("count", series("inference_engine_info", MODEL), "role"),
                pool_legend("role"),
            )
        ],
        unit=Unit.COUNT,
    )


def queues() -> AnyPanel:
    levels = {
        role: alert_threshold(f"Inference{role.capitalize()}PoolShort", "queue_depth_at_least")
        for role in ROLES
    }
    return timeseries(
        "Pool queues: prefill and decode",
        "Requests each pool of a model holds waiting, mean over the rule pack's window (the "
        "decode pool's also those waiting for KV room): what InferencePrefillPoolShort and "
        "InferenceDecodePoolShort read, each against its threshold. Bad: one pool's queue at "
        "its threshold and growing while the other's is empty - move engines from the idle "
        f"pool (prefill at {levels['prefill']:g}, decode at {levels['decode']:g} requests).",
        [
            Query(
                pool_signal(POOL_QUEUE.of(role)),
                f"{role} {pool_legend()}",
                thresholds=(warn(levels[role]),),
            )
            for role in ROLES
        ],
        unit=Unit.of(POOL_QUEUE.unit),
    )


def ttft_split() -> AnyPanel:
    above = alert_threshold("InferenceKVTransferBound", "transfer_share_above")
    parts = (
        ("queue", TTFT_QUEUE_SHARE),
        ("prefill", TTFT_PREFILL_SHARE),
        ("KV transfer", TTFT_TRANSFER_SHARE),
    )
    return timeseries(
        "Time to first token: queue, prefill, KV transfer",
        "Where a disaggregated request's time to first token goes, per model: the queues, "
        "prefill, and the KV-cache transfer between the pools, stacked to 100 %: what "
        f"InferenceKVTransferBound reads. Bad: the KV transfer above {pct(above)} while the "
        "decode pool has room - the link between the pools is the wall.",
        [
            Query(
                pool_signal(sig),
                f"{part} {pool_legend()}",
                thresholds=(warn(above),) if sig is TTFT_TRANSFER_SHARE else (),
            )
            for part, sig in parts
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        stack=True,
    )


def queue_by_stage() -> AnyPanel:
    return timeseries(
        "Pool queue by stage",
        "Requests each pool holds waiting, by stage of the engine's queue (SGLang only): "
        "prefill or decode (waiting to run), prealloc (waiting for KV room or the bootstrap "
        "with the other side) and transfer (the KV cache in flight). "
        "Bad: the decode pool's prealloc stage growing (too few decode engines or too little "
        "KV room), the prefill pool's waiting stage growing (too few prefill engines).",
        [
            Query(
                by_pool("sum", series("inference_queue_depth_by_stage", MODEL), "role", "stage"),
                pool_legend("role", "stage"),
            )
        ],
        unit=Unit.COUNT,
    )


def transfer_time() -> AnyPanel:
    buckets = by_pool("sum", rate("inference_kv_transfer_seconds_bucket", MODEL), "le")
    bound = by_pool("sum", rate("inference_kv_transfer_upper_bound_seconds_bucket", MODEL), "le")
    return timeseries(
        "KV-cache transfer time",
        "Median and 90th percentile of one KV-cache transfer from the prefill to the decode "
        "pool, wherever an engine observes it; where only a router sees the hand-over "
        "(Dynamo's KV router), the p90 of its upper bound (prefill done to the first decode "
        "token: the transfer plus dispatch and one decode step), drawn apart. Bad: a p90 "
        "rising at constant prompt length (a slow or shared link), or the transfer a large "
        "share of the time to first token.",
        [
            Query(f"histogram_quantile(0.5, {buckets})", f"p50 {pool_legend()}"),
            Query(f"histogram_quantile(0.9, {buckets})", f"p90 {pool_legend()}", dashed=True),
            Query(
                f"histogram_quantile(0.9, {bound})",
                f"p90 upper bound (router) {pool_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.SECONDS,
    )


def bandwidth() -> AnyPanel:
    return timeseries(
        "KV-cache transfer bandwidth",
        "Bytes of KV cache moved between the pools per second. No metric gives the peak of "
        "the link between them, so no peak line is drawn: compare with the interconnect's "
        "rated bandwidth by hand. Bad: flat at a level while transfer time and the decode "
        "pool's transfer stage grow (the link is saturated).",
        [
            Query(
                by_pool("sum", rate("inference_kv_transfer_bytes_total", MODEL)),
                pool_legend(),
            )
        ],
        unit=Unit.BYTES_PER_SECOND,
    )


def failures() -> AnyPanel:
    above = alert_threshold("InferenceKVTransferFailing", "failure_ratio_above")
    return timeseries(
        "KV-cache transfer failures",
        "Share of KV-cache transfers that failed or expired, per pool (left; what "
        "InferenceKVTransferFailing reads), and failures per second by reason (right). Bad: "
        f"the share above {pct(above)} for long - requests are re-prefilled or dropped.",
        [
            Query(
                pool_signal(KV_FAILURE_RATIO),
                f"failed share {pool_legend()}",
                thresholds=(warn(above),),
            ),
            Query(
                by_pool("sum", rate("inference_kv_transfer_failures_total", MODEL), "reason"),
                pool_legend("reason"),
                axis="right",
                unit=Unit.PER_SECOND,
            ),
        ],
        unit=Unit.RATIO,
        right_label="failures/s",
    )


def decisions() -> AnyPanel:
    return timeseries(
        "P/D routing decisions",
        "Requests per second a disaggregation-aware router sent through a prefill pod first "
        "(prefill_decode) or straight to decode (decode_only; encode_* for multimodal), per "
        "model, from the router's own counter (llm-d's endpoint picker). Bad: decode_only "
        "rising while the prefill pool idles (the router's threshold keeps prompts away from "
        "it), or prefill_decode rising with the prefill pool's queue (scale prefill).",
        [
            Query(
                by_pool("sum", rate("inference_pd_decisions_total", MODEL), "decision"),
                pool_legend("decision"),
            )
        ],
        unit=Unit.PER_SECOND,
    )


def panels() -> Sequence[AnyPanel]:
    return [
        sizes(),
        queues(),
        ttft_split(),
        queue_by_stage(),
        transfer_time(),
        bandwidth(),
        failures(),
        decisions(),
    ]
