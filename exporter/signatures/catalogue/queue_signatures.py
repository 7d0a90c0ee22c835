"""Queue and admission: requests spend more time waiting to be admitted than being served,
are refused at admission, wait at an engine that has stopped, or wait at a gateway that gates
on stale endpoint metrics.

Alerts carry ``signature="queue"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, Advice, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import by, num, on, pct
from exporter.signatures.signals.engine_signals import (
    GENERATION_TOKENS,
    KV_CACHE,
    QUEUE_DEPTH,
    QUEUE_WAIT_SHARE,
    REJECTED_SHARE,
    REQUESTS_RUNNING,
    TRAFFIC,
    engine_queue,
    stall,
)
from exporter.signatures.signals.gateway_signals import (
    GATEWAY_QUEUE,
    GATEWAY_SHED,
    POOL_ENGINES,
    POOL_GPU_UTILIZATION,
    pool_of,
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


def engine_stalled(ctx: Context) -> Signature:
    alert = "InferenceEngineStalled"
    hold = ctx.for_duration(alert)
    rate = ctx.window("rate")
    kv = ctx.ratio(alert, "kv_cache_below")
    depth = ctx.ratio(alert, "queue_depth_at_least")
    waiting = engine_queue(ctx.signal_context)
    rule = AlertRule(
        severity="critical",
        expr=stall(ctx.signal_context),
        for_seconds=ctx.for_seconds(alert),
        summary="Engine stalled on {target}",
        description=(
            f"{{waiting}} requests wait in the engine's queue, none has run and no token has "
            f"been generated for {rate} and more ({hold} held), with the KV cache at {{kv}} % "
            f"(below {pct(kv)} %): the engine has stopped admitting work. Restart it and "
            "report it; more GPUs will not help."
        ),
        evidence=(
            Evidence("waiting", "requests waiting in the engine's queue", None, "requests"),
            percent("kv", "KV-cache usage", ctx.name(KV_CACHE)),
        ),
        when=(
            f"at least {num(depth)} request waiting in the engine's own queue, none running "
            f"and no token generated over {rate}, KV cache under {pct(kv)} %"
        ),
    )
    return Signature(
        alert=alert,
        family="queue",
        title="Engine stalled",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("requests waiting in the engine's own queue", waiting),
                ("tokens generated per second", ctx.name(GENERATION_TOKENS)),
                ("KV-cache usage", ctx.name(KV_CACHE)),
                (
                    "the engine's metrics polls (a stalled engine still answers /metrics)",
                    ctx.selector("inference_engine_up"),
                ),
            ),
            kv_cache_below=f"{pct(kv)} %",
        ),
        advice=Advice(
            "restart_engine",
            blocks_scale_out=True,
            why=(
                "{waiting} requests wait while the engine runs none and generates no token, its "
                "KV cache at {kv} %: the engine has stopped, and new replicas would not drain its "
                "queue"
            ),
        ),
    )


def requests_rejected(ctx: Context) -> Signature:
    alert = "InferenceRequestsRejected"
    share = ctx.ratio(alert, "rejected_share_above")
    rate = ctx.window("rate")
    refused = ctx.selector("inference_requests_rejected_total")
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(REJECTED_SHARE)} > {num(share)}",
        for_seconds=ctx.for_seconds(alert),
        summary="Requests refused at admission by the {labels.layer} on {target}",
        description=(
            f"The {{labels.layer}} refuses {{share}} % of the requests that arrive (threshold "
            f"{pct(share)} %; {{refused}} per second over {rate}): clients get errors before "
            "any work is done."
        ),
        scope=("layer",),
        evidence=(
            percent("share", "share of arrivals refused", ctx.name(REJECTED_SHARE)),
            Evidence(
                "refused",
                "requests refused per second",
                f"sum(rate({refused}{TARGET}[{rate}]))",
                "requests/s",
                "%.2f",
            ),
        ),
        when=f"refused > {pct(share)} % of arrivals (refused + served) over {rate}",
    )
    return Signature(
        alert=alert,
        family="queue",
        title="Requests refused at admission",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("share of arrivals refused, by layer", ctx.name(REJECTED_SHARE)),
                (
                    "refusals per second by layer and reason",
                    f"sum by (layer, reason) (rate({refused}[{rate}]))",
                ),
                ("requests waiting", ctx.name(QUEUE_DEPTH)),
                ("mean GPU utilisation", ctx.name(GPU_UTILIZATION)),
            ),
            rejected_share_above=f"{pct(share)} %",
        ),
        advice=Advice(
            "scale_out",
            blocks_scale_out=False,
            why=(
                "the {labels.layer} refuses {share} % of arrivals ({refused} per second): the "
                "replicas admit less than arrives"
            ),
        ),
    )


def gateway_stale_endpoints(ctx: Context) -> Signature:
    alert = "InferenceGatewayStaleEndpoints"
    util = ctx.ratio(alert, "utilization_below")
    depth = ctx.ratio(alert, "queue_depth_at_least")
    rate = ctx.window("rate")
    gateway = by((*ctx.join, "model"))
    per_gateway = on((*ctx.join, "model"))
    pool = pool_of(ctx.signal_context)
    stale = ctx.latest("inference_gateway_stale_endpoints")
    # The effective saturation is the larger of the stages': the largest of them all.
    saturation = ctx.selector("inference_gateway_pool_saturation")
    expr = (
        f"max {gateway} ({stale}) > 0\n"
        f"and {per_gateway}\n(\n"
        f"sum {gateway} ({ctx.name(GATEWAY_QUEUE)}) >= {num(depth)}\n"
        f"or {per_gateway}\n"
        f"sum {gateway} ({ctx.name(GATEWAY_SHED)}) > 0\n)\n"
        f"and {on(pool)}\n{ctx.name(POOL_GPU_UTILIZATION)} < {num(util)}"
    )
    # The pool's records have no pod: read through the gateway's own series.
    mine = f"group {by(pool)} ({ctx.selector('inference_gateway_stale_endpoints')}{TARGET})"
    rule = AlertRule(
        severity="critical",
        expr=expr,
        for_seconds=ctx.for_seconds(alert),
        summary="Gateway {target} gates {labels.model} on stale endpoint metrics",
        description=(
            "The gateway finds the metrics of {stale} endpoints missing or stale and counts "
            "them as saturated (saturation {saturation}): it holds {queued} requests and sheds "
            f"{{shed}} per second while the pool's GPUs are {{util}} % busy (below "
            f"{pct(util)} %). Fix the gateway's scrape of the engines; do not scale."
        ),
        scope=("model",),
        evidence=(
            Evidence("stale", "endpoints with stale metrics", None, "endpoints"),
            Evidence(
                "saturation",
                "pool saturation the gateway gates on",
                f"max({saturation}{TARGET})",
                "",
                "%.2f",
            ),
            Evidence(
                "queued",
                "requests in the gateway's queue",
                f"sum({ctx.name(GATEWAY_QUEUE)}{TARGET})",
                "requests",
            ),
            Evidence(
                "shed",
                f"requests shed per second over {rate}",
                f"sum({ctx.name(GATEWAY_SHED)}{TARGET})",
                "requests/s",
                "%.2f",
            ),
            Evidence(
                "util",
                "mean GPU utilisation of the pool",
                f"100 * ({ctx.name(POOL_GPU_UTILIZATION)} and {on(pool)} {mine})",
                "%",
            ),
        ),
        when=(
            f"endpoints with stale metrics, the gateway queueing ({num(depth)} or more) or "
            f"shedding, the pool's GPUs under {pct(util)} % busy"
        ),
    )
    return Signature(
        alert=alert,
        family="queue",
        title="Gateway gating on stale endpoint metrics",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("endpoints the gateway finds stale", stale),
                ("the gateway's queue per pool and model", ctx.name(GATEWAY_QUEUE)),
                ("requests shed per second", ctx.name(GATEWAY_SHED)),
                ("mean GPU utilisation of the pool", ctx.name(POOL_GPU_UTILIZATION)),
                (
                    "engine targets the pack joins to each gateway's pool (none: see "
                    "gateway.join in the site config)",
                    ctx.name(POOL_ENGINES),
                ),
            ),
            utilization_below=f"{pct(util)} %",
            pool_labels=", ".join(f"`{label}`" for label in ctx.cfg.gateway.labels) or "no",
        ),
        advice=Advice(
            "fix_gateway_scrape",
            blocks_scale_out=True,
            why=(
                "the gateway counts {stale} endpoints with stale metrics as saturated and holds "
                "{queued} requests while the pool's GPUs are {util} % busy: new replicas would "
                "be gated the same way"
            ),
        ),
        # The pool's GPUs idle behind the gateway: starved, underused; its sheds: refusals.
        explains=(
            "InferenceGPUStarvedQueueGrowing",
            "InferenceGPUUnderutilized",
            "InferenceRequestsRejected",
        ),
    )
