"""Queue: requests spend more time waiting to be admitted than being served.

Alerts carry ``signature="queue"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, Advice, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, pct
from exporter.signatures.signals.engine_signals import (
    KV_CACHE,
    QUEUE_DEPTH,
    QUEUE_WAIT_SHARE,
    REQUESTS_RUNNING,
    TRAFFIC,
)
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION


def queue_wait_dominates_latency(ctx: Context) -> Signature:
    alert = "InferenceQueueWaitDominatesLatency"
    share = ctx.ratio(alert, "queue_share_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(QUEUE_WAIT_SHARE)} > {num(share)}\nand\n{ctx.name(TRAFFIC)}",
        for_seconds=ctx.for_seconds(alert),
        summary="Queue wait dominates request latency on {target}",
        description=(
            f"Requests spend {{share}} % of their end-to-end latency waiting in the engine's "
            f"queue (threshold {pct(share)} %), {{depth}} waiting now: the offered load "
            "exceeds what the server admits."
        ),
        evidence=(
            percent("share", "queue time share of end-to-end latency", ctx.name(QUEUE_WAIT_SHARE)),
            Evidence("depth", "requests waiting", f"{ctx.name(QUEUE_DEPTH)}{TARGET}", "requests"),
        ),
        when=f"queue time > {pct(share)} % of end-to-end latency (rate of sums), with traffic",
    )
    return Signature(
        alert=alert,
        family="queue",
        title="Queue wait dominates latency",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("mean GPU utilisation", ctx.name(GPU_UTILIZATION)),
                ("KV-cache usage (full cache = no room to admit)", ctx.name(KV_CACHE)),
                ("requests running", ctx.name(REQUESTS_RUNNING)),
            ),
        ),
        advice=Advice(
            "scale_out",
            blocks_scale_out=False,
            why=(
                "requests spend {share} % of their latency waiting in the queue ({depth} "
                "waiting): the offered load exceeds what the replicas admit"
            ),
        ),
    )
