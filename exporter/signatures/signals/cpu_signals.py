"""The sidecar's process and cpu collectors: the engine's busiest thread and the node's
softirq load. One series per target, in every layout alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.signals.signal import Rule, Signal
from exporter.signatures.signals.signal_groups import TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

SOFTIRQ = 'mode="softirq"'


def _hottest_thread(ctx: SignalContext) -> str:
    series = ctx.sidecar_series("inference_engine_hottest_thread_cpu_ratio")
    return f"max {ctx.by_target} (avg_over_time({series}[{ctx.window('rate')}]))"


HOTTEST_THREAD = Signal(
    "inference:engine_hottest_thread_cpu:mean{rate}",
    "ratio",
    TARGET_GROUP,
    Rule(_hottest_thread, "CPU share of the engine's busiest thread (1 = one full core)"),
    "busiest thread",
)


def _softirq_share(ctx: SignalContext) -> str:
    rate = ctx.window("rate")
    softirq_seconds = ctx.sidecar_series("inference_cpu_seconds_total", SOFTIRQ)
    cpu_seconds = ctx.sidecar_series("inference_cpu_seconds_total")
    return (
        f"sum {ctx.by_target} (rate({softirq_seconds}[{rate}]))\n/\n"
        f"sum {ctx.by_target} (rate({cpu_seconds}[{rate}]))"
    )


SOFTIRQ_SHARE = Signal(
    "inference:cpu_softirq:ratio{rate}",
    "ratio",
    TARGET_GROUP,
    Rule(_softirq_share, "softirq share of all CPU time of the node"),
    "node",
)


def _softirq_hottest_core(ctx: SignalContext) -> str:
    series = ctx.sidecar_series("inference_cpu_softirq_hottest_core_ratio")
    return f"max {ctx.by_target} (avg_over_time({series}[{ctx.window('rate')}]))"


SOFTIRQ_HOTTEST_CORE = Signal(
    "inference:cpu_softirq_hottest_core:mean{rate}",
    "ratio",
    TARGET_GROUP,
    Rule(_softirq_hottest_core, "softirq share of the node's busiest core"),
    "busiest core",
)
