"""Records from the sidecar's process and cpu collectors: the engine's busiest thread and the
node's softirq load. One series per target."""

from __future__ import annotations

from exporter.signatures.definitions import RecordingRule
from exporter.signatures.records.record_context import RecordContext

SOFTIRQ = 'mode="softirq"'


def cpu_records(ctx: RecordContext) -> list[RecordingRule]:
    """The engine's hottest thread, the softirq share of the node and of its busiest core."""
    records, by_target = ctx.records, ctx.by_target
    rate = ctx.window("rate")
    hottest_thread = ctx.sidecar_series("inference_engine_hottest_thread_cpu_ratio")
    softirq_seconds = ctx.sidecar_series("inference_cpu_seconds_total", SOFTIRQ)
    cpu_seconds = ctx.sidecar_series("inference_cpu_seconds_total")
    hottest_core = ctx.sidecar_series("inference_cpu_softirq_hottest_core_ratio")
    return [
        RecordingRule(
            records.hottest_thread,
            f"max {by_target} (avg_over_time({hottest_thread}[{rate}]))",
            "CPU share of the engine's busiest thread (1 = one full core)",
        ),
        RecordingRule(
            records.softirq_share,
            f"sum {by_target} (rate({softirq_seconds}[{rate}]))\n/\n"
            f"sum {by_target} (rate({cpu_seconds}[{rate}]))",
            "softirq share of all CPU time of the node",
        ),
        RecordingRule(
            records.softirq_hottest_core,
            f"max {by_target} (avg_over_time({hottest_core}[{rate}]))",
            "softirq share of the node's busiest core",
        ),
    ]
