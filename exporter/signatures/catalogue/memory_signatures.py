"""GPU memory: HBM bandwidth saturated by concurrent decodes, KV cache or framebuffer full.

Alerts carry ``signature="memory"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, Advice, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, on, pct, regex_alternatives
from exporter.signatures.signals.engine_signals import (
    GENERATION_TOKENS,
    KV_CACHE,
    QUEUE_DEPTH,
    REQUESTS_RUNNING,
    TOKENS_PER_REQUEST,
)
from exporter.signatures.signals.gpu_signals import HBM_BANDWIDTH, MEMORY_USED
from exporter.signatures.signals.latency_signals import INTER_TOKEN_MEDIAN


def hbm_bandwidth_saturated(ctx: Context) -> Signature:
    alert = "InferenceHBMBandwidthSaturated"
    bandwidth_above = ctx.ratio(alert, "bandwidth_above")
    drop = ctx.ratio(alert, "per_request_drop_above")
    baseline = ctx.window("baseline")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(HBM_BANDWIDTH)} > {num(bandwidth_above)}\n"
            f"and\n{ctx.name(TOKENS_PER_REQUEST)} < {num(round(1 - drop, 9))} * "
            f"({ctx.name(TOKENS_PER_REQUEST)} offset {baseline})"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="HBM bandwidth saturated, decode slowing on {target}",
        description=(
            f"HBM bandwidth utilisation {{bw}} % (threshold {pct(bandwidth_above)} %) while "
            "generation "
            f"speed per running request fell to {{now}} tokens/s from {{before}} tokens/s "
            f"{baseline} earlier, with {{running}} requests running: decode is memory-bound and "
            "more concurrent decodes only split the same bandwidth."
        ),
        evidence=(
            percent("bw", "HBM bandwidth utilisation", ctx.name(HBM_BANDWIDTH)),
            Evidence(
                "now",
                "tokens/s per running request",
                f"{ctx.name(TOKENS_PER_REQUEST)}{TARGET}",
                "tokens/s",
                "%.1f",
            ),
            Evidence(
                "before",
                f"tokens/s per running request {baseline} earlier",
                f"{ctx.name(TOKENS_PER_REQUEST)}{TARGET} offset {baseline}",
                "tokens/s",
                "%.1f",
            ),
            Evidence(
                "running", "requests running", f"{ctx.name(REQUESTS_RUNNING)}{TARGET}", "requests"
            ),
        ),
        when=(
            f"HBM bandwidth utilisation > {pct(bandwidth_above)} % and tokens/s per running "
            "request more "
            f"than {pct(drop)} % below its value {baseline} earlier"
        ),
    )
    return Signature(
        alert=alert,
        family="memory",
        title="HBM bandwidth wall: too many concurrent decodes",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "total generation throughput (tokens/s): flat while concurrency rises",
                    ctx.name(GENERATION_TOKENS),
                ),
                ("requests running", ctx.name(REQUESTS_RUNNING)),
                ("median inter-token latency (ms)", f"1000 * {ctx.name(INTER_TOKEN_MEDIAN)}"),
            ),
            baseline=baseline,
        ),
        advice=Advice(
            "scale_out",
            blocks_scale_out=False,
            why=(
                "HBM bandwidth is {bw} % used and each request decodes slower than before: "
                "memory bandwidth is the limit, and more replicas add bandwidth"
            ),
        ),
    )


def gpu_memory_headroom_low(ctx: Context) -> Signature:
    alert = "InferenceGPUMemoryHeadroomLow"
    kv_cache_above = ctx.ratio(alert, "kv_cache_above")
    framebuffer_above = ctx.ratio(alert, "framebuffer_above")
    engines = regex_alternatives(ctx.cfg.names(alert, "preallocating_engines"))
    preallocating = ctx.latest("inference_engine_up", f'engine=~"{engines}"')
    kv_rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(KV_CACHE)} > {num(kv_cache_above)}",
        for_seconds=ctx.for_seconds(alert),
        summary="KV cache nearly full on {target}",
        description=(
            f"KV cache {{kv}} % full (threshold {pct(kv_cache_above)} %): the engine is about "
            "to stop "
            "admitting, queue or preempt (recompute or swap) requests; keep 10-15 % headroom."
        ),
        evidence=(percent("kv", "KV-cache usage", ctx.name(KV_CACHE)),),
        when=f"KV-cache usage > {pct(kv_cache_above)} % (engines that report it)",
        labels=(("condition", "kv_cache"),),
    )
    fb_rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(MEMORY_USED)} > {num(framebuffer_above)}\n"
            f"unless {on(ctx.join)}\n(\n{ctx.name(KV_CACHE)}\nor\n"
            f"group {ctx.by()} ({preallocating})\n)"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="GPU {labels.gpu} framebuffer nearly full on {target}",
        description=(
            f"GPU {{labels.gpu}} framebuffer {{fb}} % used (threshold {pct(framebuffer_above)} %) "
            "and the "
            "engine reports no KV-cache usage: the next allocation may fail with CUDA out "
            "of memory."
        ),
        scope=("gpu", "uuid"),
        evidence=(percent("fb", "framebuffer used", ctx.name(MEMORY_USED)),),
        when=(
            f"framebuffer used/total > {pct(framebuffer_above)} % on a GPU whose engine reports "
            "no KV-cache "
            f"usage and is not one that pre-allocates ({engines.replace('|', ', ')})"
        ),
        labels=(("condition", "framebuffer"),),
    )
    return Signature(
        alert=alert,
        family="memory",
        title="GPU memory headroom low",
        rules=(kv_rule, fb_rule),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "requests waiting (preempted requests return to the queue)",
                    ctx.name(QUEUE_DEPTH),
                ),
                (
                    "engine of each target (pre-allocating engines skip the framebuffer rule)",
                    ctx.selector("inference_engine_up"),
                ),
            ),
        ),
        advice=Advice(
            "scale_out",
            blocks_scale_out=False,
            why=(
                "the KV cache or the framebuffer is nearly full: the engine cannot admit more "
                "requests at once, and more replicas add room"
            ),
        ),
    )
