"""The sidecar's process and cpu collectors: the engine's busiest thread and the node's
softirq load. One series per sidecar target.

The softirq share is the node's: every sidecar reads the host's ``/proc/stat`` (a container
sees it whole), so each inference pod on a node carries its node's share itself. In the
``node`` layout the node agent reads the same file (its ``cpu`` collector, as the chart's
DaemonSet runs it) under its own pod; that target serves no engine, and the softirq signals
leave it out, so the alert names the inference pods of the node, never the agent."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.signatures.promql_text import on
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_groups import TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

SOFTIRQ = 'mode="softirq"'
#: A node agent's own scrape target: the one that runs the ``podresources`` collector, which
#: is off by default and on only in the node agent (the chart's DaemonSet); it reports whether
#: the collector ran at every scrape, failed or not.
AGENT = ("inference_scrape_collector_success", 'collector="podresources"')


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
    # The modes' sum in one series: 8 mode series per target would cost 8x the series read.
    cpu_seconds = ctx.sidecar_series("inference_cpu_all_modes_seconds_total")
    return (
        f"sum {ctx.by_target} (rate({softirq_seconds}[{rate}]))\n/\n"
        f"sum {ctx.by_target} (rate({cpu_seconds}[{rate}]))"
    )


def _without_agents(expr: Callable[[SignalContext], str]) -> Callable[[SignalContext], str]:
    """``expr`` but for the node agents' own targets (the ``node`` layout)."""

    def without(ctx: SignalContext) -> str:
        agents = ctx.latest(*AGENT)
        return f"(\n{expr(ctx)}\n)\nunless {on(ctx.join)}\n{agents}"

    return without


def _node_share(expr: Callable[[SignalContext], str], help_text: str) -> ByLayout:
    """A share of the node's CPU, per sidecar target; in the node layout the node agent's own
    reading of the same node is left out."""
    rule = Rule(expr, help_text)
    node = Rule(_without_agents(expr), f"{help_text}, per inference pod (not the node agent)")
    return ByLayout(sidecar=rule, node=node, dcgm=rule)


SOFTIRQ_SHARE = Signal(
    "inference:cpu_softirq:ratio{rate}",
    "ratio",
    TARGET_GROUP,
    _node_share(_softirq_share, "softirq share of all CPU time of the node"),
    "node",
)


def _softirq_hottest_core(ctx: SignalContext) -> str:
    series = ctx.sidecar_series("inference_cpu_softirq_hottest_core_ratio")
    return f"max {ctx.by_target} (avg_over_time({series}[{ctx.window('rate')}]))"


SOFTIRQ_HOTTEST_CORE = Signal(
    "inference:cpu_softirq_hottest_core:mean{rate}",
    "ratio",
    TARGET_GROUP,
    _node_share(_softirq_hottest_core, "softirq share of the node's busiest core"),
    "busiest core",
)
