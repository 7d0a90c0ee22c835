"""Queue: requests spend more time waiting to be admitted than being served.

Alerts carry ``signature="queue"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, pct


def queue_wait_dominates_latency(ctx: Context) -> Signature:
    alert = "InferenceQueueWaitDominatesLatency"
    records = ctx.records
    share = ctx.ratio(alert, "queue_share_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{records.queue_wait_share} > {num(share)}\nand\n{records.traffic}",
        for_seconds=ctx.for_seconds(alert),
        summary="Queue wait dominates request latency on {target}",
        description=(
            f"Requests spend {{share}} % of their end-to-end latency waiting in the engine's "
            f"queue (threshold {pct(share)} %), {{depth}} waiting now: the offered load "
            "exceeds what the server admits."
        ),
        evidence=(
            percent("share", "queue time share of end-to-end latency", records.queue_wait_share),
            Evidence("depth", "requests waiting", f"{records.queue_depth}{TARGET}", "requests"),
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
                ("mean GPU utilisation", records.gpu_utilization),
                ("KV-cache usage (full cache = no room to admit)", records.kv_cache),
                ("requests running", records.requests_running),
            ),
        ),
    )
