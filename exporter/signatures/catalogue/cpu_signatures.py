"""CPU side: the host cannot feed the GPU.

A GPU waits while requests queue, the tokenizer is slower than a decode step, one GIL-bound
thread of the engine's front-end is saturated, or utilisation pulses between idle and flat out.
Alerts carry ``signature="cpu"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, on, pct
from exporter.signatures.signals.cpu_signals import HOTTEST_THREAD
from exporter.signatures.signals.engine_signals import (
    ENGINE_STALLED,
    QUEUE_DEPTH,
    QUEUE_TREND,
    TRAFFIC,
)
from exporter.signatures.signals.gpu_signals import BUSY_SAMPLES, GPU_UTILIZATION, IDLE_SAMPLES
from exporter.signatures.signals.latency_signals import INTER_TOKEN_MEDIAN, TOKENIZER_MEDIAN
from exporter.signatures.signals.shared_gpu_signals import GPU_OWN_UTILIZATION


def gpu_starved_queue_growing(ctx: Context) -> Signature:
    alert = "InferenceGPUStarvedQueueGrowing"
    util = ctx.ratio(alert, "utilization_below")
    growth = ctx.ratio(alert, "queue_growth_above")
    depth = ctx.ratio(alert, "queue_depth_at_least")
    trend_seconds = ctx.window_seconds("queue_trend")
    trend = ctx.window("queue_trend")
    rule = AlertRule(
        severity="critical",
        expr=(
            f"{ctx.name(GPU_OWN_UTILIZATION)} < {num(util)}\n"
            f"and\n{ctx.name(QUEUE_TREND)} > {num(growth / trend_seconds)}\n"
            f"and\n{ctx.name(QUEUE_DEPTH)} >= {num(depth)}\n"
            # A stalled engine's GPU idles because it admits nothing: its own signature.
            f"unless {on(ctx.join)}\n{ctx.name(ENGINE_STALLED)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="GPU starved while the queue grows on {target}",
        description=(
            f"Mean GPU utilisation {{util}} % (below {pct(util)} %) while the queue grew by "
            f"{{growth}} requests in {trend} to {{depth}} waiting: the CPU side (tokenizer, "
            "scheduler, host-to-device copies) cannot feed the GPU, and more GPUs will not help."
        ),
        evidence=(
            # On a GPU shared with other tenants, the engine's own share (sources.py).
            percent("util", "mean GPU utilisation", ctx.name(GPU_OWN_UTILIZATION)),
            Evidence(
                "growth",
                f"queue growth over {trend}",
                f"{num(trend_seconds)} * {ctx.name(QUEUE_TREND)}{TARGET}",
                "requests",
                "%+.0f",
            ),
            Evidence("depth", "requests waiting", f"{ctx.name(QUEUE_DEPTH)}{TARGET}", "requests"),
        ),
        when=(
            f"mean GPU utilisation < {pct(util)} % and the queue depth trend over {trend} "
            f"> {num(growth)} requests and at least {num(depth)} request waiting (its own queue "
            "or its share of its gateway's), the engine not stalled"
        ),
    )
    return Signature(
        alert=alert,
        family="cpu",
        title="GPU starved while the queue grows",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "engine processes' CPU time, per process (a process near 1 core is saturated)",
                    ctx.rate("inference_engine_process_cpu_seconds_total"),
                ),
                ("median tokenizer probe latency (ms)", f"1000 * {ctx.name(TOKENIZER_MEDIAN)}"),
                (
                    "median decode step, inter-token latency (ms)",
                    f"1000 * {ctx.name(INTER_TOKEN_MEDIAN)}",
                ),
            ),
        ),
    )


def tokenizer_slower_than_decode(ctx: Context) -> Signature:
    alert = "InferenceTokenizerSlowerThanDecode"
    factor = ctx.ratio(alert, "decode_step_factor")
    scaled = (
        ctx.name(INTER_TOKEN_MEDIAN)
        if factor == 1
        else f"{num(factor)} * {ctx.name(INTER_TOKEN_MEDIAN)}"
    )
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(TOKENIZER_MEDIAN)} > {scaled}\nand\n{ctx.name(TRAFFIC)}",
        for_seconds=ctx.for_seconds(alert),
        summary="Tokenizer slower than a decode step on {target}",
        description=(
            "Median tokenizer latency {tok} ms (probe, ~512-token prompt) exceeds the median "
            "inter-token latency {itl} ms while the server has traffic: tokenizing one prompt "
            "costs more than one decode step, so the front-end CPU, not the GPU, sets the pace."
        ),
        evidence=(
            Evidence(
                "tok",
                "median tokenizer latency",
                f"1000 * {ctx.name(TOKENIZER_MEDIAN)}{TARGET}",
                "ms",
                "%.1f",
            ),
            Evidence(
                "itl",
                "median inter-token latency",
                f"1000 * {ctx.name(INTER_TOKEN_MEDIAN)}{TARGET}",
                "ms",
                "%.1f",
            ),
        ),
        when=(
            f"median tokenizer probe latency > {num(factor)} x median inter-token latency, "
            "with traffic"
        ),
    )
    return Signature(
        alert=alert,
        family="cpu",
        title="Tokenizer slower than a decode step",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "probe round trip of a 1-token call (front-end/event-loop latency), ms",
                    f"1000 * histogram_quantile(0.5, sum {ctx.by('le')} "
                    f"(rate({ctx.selector('inference_tokenizer_probe_rtt_seconds_bucket')}"
                    f"[{ctx.window('latency')}])))",
                ),
                (
                    "probe failures",
                    ctx.rate("inference_tokenizer_probe_failures_total"),
                ),
            ),
        ),
    )


def frontend_cpu_saturated(ctx: Context) -> Signature:
    alert = "InferenceFrontendCPUSaturated"
    hot = ctx.ratio(alert, "hottest_thread_above")
    util = ctx.ratio(alert, "utilization_below")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(HOTTEST_THREAD)} > {num(hot)}\nand\n"
            f"{ctx.name(GPU_UTILIZATION)} < {num(util)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="Engine front-end thread saturated on {target}",
        description=(
            f"The busiest engine thread uses {{thread}} % of a core (threshold {pct(hot)} %) "
            f"while mean GPU utilisation is {{util}} % (below {pct(util)} %): a single "
            "GIL-bound thread (HTTP handling, tokenization, scheduling) caps throughput "
            "however many cores the node has."
        ),
        evidence=(
            percent("thread", "busiest engine thread, share of one core", ctx.name(HOTTEST_THREAD)),
            percent("util", "mean GPU utilisation", ctx.name(GPU_UTILIZATION)),
        ),
        when=(
            f"busiest engine thread > {pct(hot)} % of a core and mean GPU utilisation "
            f"< {pct(util)} %"
        ),
    )
    return Signature(
        alert=alert,
        family="cpu",
        title="GIL-bound engine front-end",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "CPU of each engine process (cores)",
                    ctx.rate("inference_engine_process_cpu_seconds_total"),
                ),
            ),
        ),
    )


def gpu_utilization_pulsing(ctx: Context) -> Signature:
    alert = "InferenceGPUUtilizationPulsing"
    idle_sample = ctx.ratio(alert, "idle_sample_at_most")
    idle_share = ctx.ratio(alert, "idle_share_above")
    busy_sample = ctx.ratio(alert, "busy_sample_above")
    busy_share = ctx.ratio(alert, "busy_share_above")
    window = ctx.window("pulsing")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(IDLE_SAMPLES)} > {num(idle_share)}\n"
            f"and\n{ctx.name(BUSY_SAMPLES)} > {num(busy_share)}\n"
            f"and\n{ctx.name(TRAFFIC)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="GPU utilisation pulses between idle and saturated on {target}",
        description=(
            f"Over {window}, {{idle}} % of GPU utilisation samples were idle "
            f"(at most {pct(idle_sample)} %) and {{busy}} % saturated "
            f"(above {pct(busy_sample)} %), mean {{util}} %: the GPU works in bursts and waits in "
            "between, typically for synchronous host-to-device copies or CPU-side batch assembly."
        ),
        evidence=(
            percent("idle", "idle samples", ctx.name(IDLE_SAMPLES)),
            percent("busy", "saturated samples", ctx.name(BUSY_SAMPLES)),
            percent("util", "mean GPU utilisation", ctx.name(GPU_UTILIZATION)),
        ),
        when=(
            f"over {window}, > {pct(idle_share)} % of utilisation samples "
            f"<= {pct(idle_sample)} % and > {pct(busy_share)} % above {pct(busy_sample)} %, "
            "with traffic"
        ),
    )
    return Signature(
        alert=alert,
        family="cpu",
        title="Bursty feeding: utilisation pulses",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "distribution of driver utilisation samples (sidecar profile)",
                    f"sum {ctx.by('le')} (increase("
                    f"{ctx.selector('inference_gpu_utilization_samples_bucket')}[{window}]))",
                ),
                (
                    "host-to-device PCIe traffic in bursts",
                    f"{ctx.selector('inference_gpu_pcie_rx_bytes_per_second')}",
                ),
            ),
            busy_sample_above=pct(busy_sample),
        ),
    )
