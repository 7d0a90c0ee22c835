"""Pools: disaggregated serving, where prefill and decode run on different engines and the KV
cache crosses between them.

These are fleet-level rules: they read the pool records (every engine of one model and role
that shares the join labels besides pod and instance), not one target. Alerts carry
``signature="pool"``, the pool's labels and ``model``; the alert's name says which pool.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, Advice, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, on, pct
from exporter.signatures.signals.pool_signals import (
    KV_FAILURE_RATIO,
    KV_TRANSFER_MEAN,
    POOL_ENGINES,
    POOL_KV_CACHE,
    POOL_QUEUE,
    POOL_QUEUE_TREND,
    POOL_RATIO_NOW,
    POOL_RATIO_SUGGESTED,
    TTFT_TRANSFER_SHARE,
)
from exporter.signatures.signals.signal import Role

_POOL_TARGET = "{labels.model}"


def kv_transfer_bound(ctx: Context) -> Signature:
    alert = "InferenceKVTransferBound"
    share = ctx.ratio(alert, "transfer_share_above")
    kv_below = ctx.ratio(alert, "decode_kv_usage_below")
    op = on((*ctx.pool, "model"))
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(TTFT_TRANSFER_SHARE)} > {num(share)}\n"
            f"and {op}\n{ctx.name(POOL_QUEUE.decode)} < 1\n"
            f"and {op}\n{ctx.name(POOL_KV_CACHE.decode)} < {num(kv_below)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="KV-cache transfer holds back the first token of " + _POOL_TARGET,
        description=(
            f"The KV transfer between the prefill and decode pools takes {{share}} % of time "
            f"to first token (threshold {pct(share)} %; {{transfer}} s per transfer) while the "
            f"decode pool has free slots (no queue, KV cache under {pct(kv_below)} % used): "
            "the link between the pools, not either pool, is the wall."
        ),
        scope=("model",),
        evidence=(
            percent(
                "share", "KV transfer share of time to first token", ctx.name(TTFT_TRANSFER_SHARE)
            ),
            Evidence(
                "transfer", "mean KV transfer", f"{ctx.name(KV_TRANSFER_MEAN)}{TARGET}", "s", "%.3f"
            ),
        ),
        when=(
            f"KV transfer > {pct(share)} % of queue + prefill + transfer, decode pool without "
            f"a queue and its KV cache under {pct(kv_below)} %"
        ),
    )
    return Signature(
        alert=alert,
        family="pool",
        title="KV-cache transfer bound",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("mean KV transfer, seconds", ctx.name(KV_TRANSFER_MEAN)),
                ("transfer share of time to first token", ctx.name(TTFT_TRANSFER_SHARE)),
                ("decode pool KV-cache usage", ctx.name(POOL_KV_CACHE.decode)),
            ),
            transfer_share_above=f"{pct(share)} %",
        ),
        advice=Advice(
            "fix_kv_link",
            blocks_scale_out=True,
            why=(
                "the KV transfer takes {share} % of time to first token ({transfer} s each) "
                "while the decode pool has room: the link between the pools is the limit"
            ),
        ),
        # The pools' GPUs wait on the link: a decode pod's starved GPU with a request waiting
        # for its cache is the link's consequence (diagnose ranks the link first).
        explains=("InferenceGPUStarvedQueueGrowing",),
    )


def kv_transfer_failing(ctx: Context) -> Signature:
    alert = "InferenceKVTransferFailing"
    ratio = ctx.ratio(alert, "failure_ratio_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(KV_FAILURE_RATIO)} > {num(ratio)}",
        for_seconds=ctx.for_seconds(alert),
        summary="KV-cache transfers failing for " + _POOL_TARGET,
        description=(
            f"{{ratio}} % of KV-cache transfers between the prefill and decode pools fail or "
            f"expire (threshold {pct(ratio)} %): each one is a request prefilled again, or "
            "lost."
        ),
        scope=("model",),
        evidence=(
            percent("ratio", "failed or expired share of transfers", ctx.name(KV_FAILURE_RATIO)),
        ),
        when=f"failed or expired KV transfers > {pct(ratio)} % of transfers",
    )
    return Signature(
        alert=alert,
        family="pool",
        title="KV-cache transfers failing",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("failed or expired share of transfers", ctx.name(KV_FAILURE_RATIO)),
                (
                    "failures by reason, per second",
                    f"sum by (model, reason) ({ctx.rate('inference_kv_transfer_failures_total')})",
                ),
            ),
            failure_ratio_above=f"{pct(ratio)} %",
        ),
        advice=Advice(
            "fix_kv_link",
            blocks_scale_out=True,
            why=(
                "{ratio} % of KV transfers fail or expire: requests are prefilled again or "
                "lost, whatever the pools' size"
            ),
        ),
    )


def _pool_short(ctx: Context, alert: str, short: Role, other: Role) -> Signature:
    depth = ctx.ratio(alert, "queue_depth_at_least")
    other_below = ctx.ratio(alert, "other_queue_below")
    op = on((*ctx.pool, "model"))
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(POOL_QUEUE.of(short))} >= {num(depth)}\n"
            f"and {op}\n{ctx.name(POOL_QUEUE_TREND.of(short))} > 0\n"
            f"and {op}\n{ctx.name(POOL_QUEUE.of(other))} < {num(other_below)}\n"
            f"and {op}\n{ctx.name(POOL_QUEUE_TREND.of(other))} <= 0"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary=f"The {short} pool of " + _POOL_TARGET + f" is short while {other} idles",
        description=(
            f"{{depth}} requests wait in the {short} pool and its queue grows, while the "
            f"{other} pool has no queue: move engines from {other} to {short}. Prefill:decode "
            "engines now {now}, the queues suggest {suggested}."
        ),
        scope=("model",),
        evidence=(
            Evidence("depth", f"requests waiting in the {short} pool", None, "requests", "%.1f"),
            Evidence(
                "now",
                "prefill engines per decode engine now",
                f"{ctx.name(POOL_RATIO_NOW)}{TARGET}",
                "",
                "%.2f",
            ),
            Evidence(
                "suggested",
                "prefill engines per decode engine the queues suggest",
                f"{ctx.name(POOL_RATIO_SUGGESTED)}{TARGET}",
                "",
                "%.2f",
            ),
        ),
        when=(
            f"{short} pool: mean queue >= {num(depth)} and growing; {other} pool: queue "
            f"< {num(other_below)} and not growing"
        ),
    )
    return Signature(
        alert=alert,
        family="pool",
        title=f"{short.capitalize()} pool short",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (f"{short} engines", ctx.name(POOL_ENGINES.of(short))),
                (f"mean {short} queue", ctx.name(POOL_QUEUE.of(short))),
                (f"mean {other} queue", ctx.name(POOL_QUEUE.of(other))),
                ("prefill:decode engines suggested", ctx.name(POOL_RATIO_SUGGESTED)),
            ),
            queue_depth_at_least=num(depth),
        ),
        advice=Advice(
            "rebalance_pools",
            blocks_scale_out=True,
            why=(
                f"{{depth}} requests wait in the {short} pool while the {other} pool has no "
                f"queue: move engines from {other} to {short} (the queues suggest {{suggested}} "
                "prefill engines per decode engine) rather than adding GPUs"
            ),
        ),
    )


def prefill_pool_short(ctx: Context) -> Signature:
    return _pool_short(ctx, "InferencePrefillPoolShort", "prefill", "decode")


def decode_pool_short(ctx: Context) -> Signature:
    return _pool_short(ctx, "InferenceDecodePoolShort", "decode", "prefill")
