"""Network: interrupt handling (softirq) takes the CPU that feeds the GPU.

Alerts carry ``signature="network"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import Advice, AlertRule, Signature
from exporter.signatures.promql_text import num, pct
from exporter.signatures.signals.cpu_signals import SOFTIRQ_HOTTEST_CORE, SOFTIRQ_SHARE


def softirq_cpu_high(ctx: Context) -> Signature:
    alert = "InferenceSoftirqCPUHigh"
    node = ctx.ratio(alert, "node_share_above")
    core = ctx.ratio(alert, "hottest_core_above")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(SOFTIRQ_SHARE)} > {num(node)}\n"
            f"or\n{ctx.name(SOFTIRQ_HOTTEST_CORE)} > {num(core)}"
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
            percent("node", "softirq share of node CPU", ctx.name(SOFTIRQ_SHARE), "%.1f"),
            percent("core", "softirq share of the busiest core", ctx.name(SOFTIRQ_HOTTEST_CORE)),
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
        advice=Advice(
            "fix_softirq",
            blocks_scale_out=True,
            why=(
                "softirq takes {node} % of the node's CPU and {core} % of its busiest core: "
                "interrupt handling starves the threads that feed the GPU"
            ),
        ),
        # The interrupts take the host's CPU between decode steps: the steps stretch far above
        # their HBM floor with the bus idle, which the decode-overhead signature reports.
        explains=("InferenceDecodeOverheadBound",),
    )
