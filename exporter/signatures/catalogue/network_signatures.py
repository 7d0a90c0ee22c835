"""Network: interrupt handling (softirq) takes the CPU that feeds the GPU.

Alerts carry ``signature="network"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import AlertRule, Signature
from exporter.signatures.promql_text import num, pct


def softirq_cpu_high(ctx: Context) -> Signature:
    alert = "InferenceSoftirqCPUHigh"
    records = ctx.records
    node = ctx.ratio(alert, "node_share_above")
    core = ctx.ratio(alert, "hottest_core_above")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{records.softirq_share} > {num(node)}\n"
            f"or\n{records.softirq_hottest_core} > {num(core)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="Softirq load high on the node of {target}",
        description=(
            f"Softirq takes {{node}} % of the node's CPU time (threshold {pct(node)} %) and "
            f"{{core}} % of its busiest core (threshold {pct(core)} %): interrupt handling, "
            "usually NET_RX for request and streaming traffic, eats the CPU that tokenizes and "
            "schedules for the GPU."
        ),
        evidence=(
            percent("node", "softirq share of node CPU", records.softirq_share, "%.1f"),
            percent("core", "softirq share of the busiest core", records.softirq_hottest_core),
        ),
        when=f"softirq > {pct(node)} % of node CPU time, or > {pct(core)} % of the busiest core",
    )
    return Signature(
        alert=alert,
        family="network",
        title="Softirq load steals CPU from the GPU's feeders",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "softirq invocations per second by vector",
                    ctx.rate("inference_softirqs_total"),
                ),
            ),
        ),
    )
