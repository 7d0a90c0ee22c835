"""The GPU itself: idle under load, lost, reporting Xid errors, clocks held down, contended by
other tenants of a shared GPU.

Alerts carry ``signature="gpu"``.
"""

from __future__ import annotations

from exporter.metrics import GPU_LABELS
from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, on, pct, regex_alternatives
from exporter.signatures.signals.engine_signals import (
    GENERATION_TOKENS,
    QUEUE_DEPTH,
    QUEUE_TREND,
    REQUESTS_RUNNING,
)
from exporter.signatures.signals.gpu_signals import CLOCK_EVENTS, SM_CLOCK, TEMPERATURE, XID_NEW
from exporter.signatures.signals.latency_signals import INTER_TOKEN_MEDIAN
from exporter.signatures.signals.shared_gpu_signals import (
    GPU_DEVICE_UTILIZATION,
    GPU_ENGINE_SHARE,
    GPU_OTHER_TENANTS,
    GPU_OWN_UTILIZATION,
)


def gpu_underutilized(ctx: Context) -> Signature:
    alert = "InferenceGPUUnderutilized"
    util = ctx.ratio(alert, "utilization_below")
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="info",
        expr=(
            f"{ctx.name(GPU_OWN_UTILIZATION)} < {num(util)}\nand\n{ctx.name(REQUESTS_RUNNING)} > 0"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="GPU underutilised on {target}",
        description=(
            f"Mean GPU utilisation {{util}} % (below {pct(util)} %) for {hold} while "
            "{running} requests run on average: the GPU waits most of the time."
        ),
        evidence=(
            # On a GPU shared with other tenants, the engine's own share (sources.py).
            percent("util", "mean GPU utilisation", ctx.name(GPU_OWN_UTILIZATION)),
            Evidence(
                "running",
                "requests running",
                f"{ctx.name(REQUESTS_RUNNING)}{TARGET}",
                "requests",
                "%.1f",
            ),
        ),
        when=f"mean GPU utilisation < {pct(util)} % while requests are running",
    )
    return Signature(
        alert=alert,
        family="gpu",
        title="GPU underutilised under load",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("which other signatures hold for this target", 'ALERTS{alertstate="firing"}'),
                ("generation throughput (tokens/s)", ctx.name(GENERATION_TOKENS)),
            ),
            utilization_below=pct(util),
        ),
    )


def gpu_lost(ctx: Context) -> Signature:
    alert = "InferenceGPULost"
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="critical",
        expr=f"min {ctx.by('gpu', 'uuid')} ({ctx.selector('inference_gpu_up')}) == 0",
        for_seconds=ctx.for_seconds(alert),
        summary="GPU {labels.gpu} lost on {target}",
        description=(
            f"GPU {{labels.gpu}} ({{labels.uuid}}) has not answered NVML for {hold}: it errors "
            "or hangs (Xid 79, fallen off the bus, is the usual cause) and requests on it stall "
            "or fail."
        ),
        scope=("gpu", "uuid"),
        when="inference_gpu_up == 0",
    )
    return Signature(
        alert=alert,
        family="gpu",
        title="GPU lost",
        rules=(rule,),
        runbook=ctx.runbook(alert, queries=(("Xids on the same GPU", ctx.name(XID_NEW)),)),
    )


def gpu_xid_errors(ctx: Context) -> Signature:
    alert = "InferenceGPUXidErrors"
    critical = regex_alternatives(ctx.cfg.ints(alert, "critical_xids"))
    listed = critical.replace("|", ", ")
    window = ctx.window("xid")
    count = Evidence("count", f"new Xid errors in {window}", None, "errors")
    critical_rule = AlertRule(
        severity="critical",
        expr=f'{ctx.name(XID_NEW)}{{xid=~"{critical}"}} > 0',
        for_seconds=ctx.for_seconds(alert),
        summary="GPU {labels.gpu} reported Xid {labels.xid} on {target}",
        description=(
            "GPU {labels.gpu} ({labels.uuid}) reported Xid {labels.xid} ({count} new in the "
            f"last {window}): an Xid of this class ({listed}) means the GPU's state cannot be "
            "trusted until it is reset; drain the node."
        ),
        scope=("gpu", "uuid", "xid"),
        evidence=(count,),
        when=f"a new Xid {listed} within {window}",
    )
    warning_rule = AlertRule(
        severity="warning",
        expr=f'{ctx.name(XID_NEW)}{{xid!~"{critical}"}} > 0',
        for_seconds=ctx.for_seconds(alert),
        summary="GPU {labels.gpu} reported Xid {labels.xid} on {target}",
        description=(
            "GPU {labels.gpu} ({labels.uuid}) reported Xid {labels.xid} ({count} new in the "
            f"last {window}): usually an application fault (13, 31, 43) or a driver event; "
            "repeated Xids on one GPU point at hardware."
        ),
        scope=("gpu", "uuid", "xid"),
        evidence=(count,),
        when=f"any other new Xid within {window}",
    )
    return Signature(
        alert=alert,
        family="gpu",
        title="GPU Xid errors",
        rules=(critical_rule, warning_rule),
        runbook=ctx.runbook(
            alert,
            queries=(("new Xids per GPU", ctx.name(XID_NEW)),),
            critical_xids=listed,
        ),
    )


def gpu_throttled(ctx: Context) -> Signature:
    alert = "InferenceGPUThrottled"
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(CLOCK_EVENTS)} > 0",
        for_seconds=ctx.for_seconds(alert),
        summary="GPU {labels.gpu} clocks held down ({labels.reason}) on {target}",
        description=(
            f"GPU {{labels.gpu}} ({{labels.uuid}}) has been slowed by {{labels.reason}} for "
            f"{hold}; die at {{temp}} °C, SM clock {{clock}} MHz: every kernel runs slower "
            "until the cause (cooling, power delivery) is fixed."
        ),
        scope=("gpu", "uuid", "reason"),
        evidence=(
            Evidence(
                "temp",
                "GPU temperature",
                f"{ctx.name(TEMPERATURE)}{TARGET}",
                "°C",
                scope=GPU_LABELS,
            ),
            Evidence(
                "clock",
                "SM clock",
                f"{ctx.name(SM_CLOCK)}{TARGET} / 1000000",
                "MHz",
                scope=GPU_LABELS,
            ),
        ),
        when=(
            "a hardware or thermal clock event reason ("
            + ", ".join(ctx.cfg.names(alert, "reasons"))
            + ") active"
        ),
    )
    return Signature(
        alert=alert,
        family="gpu",
        title="GPU clocks throttled by hardware or heat",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("GPU temperature", ctx.name(TEMPERATURE)),
                ("SM clock (MHz)", f"{ctx.name(SM_CLOCK)} / 1000000"),
            ),
        ),
    )


def gpu_contended(ctx: Context) -> Signature:
    """The noisy neighbour: other tenants of a shared GPU (time-slicing, MPS) take a large
    share of it while the engine's queue grows or its decode slows."""
    alert = "InferenceGPUContended"
    others = ctx.ratio(alert, "others_above")
    growth = ctx.ratio(alert, "queue_growth_above")
    depth = ctx.ratio(alert, "queue_depth_at_least")
    rise = ctx.ratio(alert, "inter_token_rise_above")
    trend_seconds = ctx.window_seconds("queue_trend")
    trend = ctx.window("queue_trend")
    baseline = ctx.window("baseline")
    itl = ctx.name(INTER_TOKEN_MEDIAN)
    suffering = (
        f"(\n{ctx.name(QUEUE_TREND)} > {num(growth / trend_seconds)}\n"
        f"and\n{ctx.name(QUEUE_DEPTH)} >= {num(depth)}\n"
        f"or\n{itl} > {num(round(1 + rise, 9))} * ({itl} offset {baseline})\n)"
    )
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(GPU_OTHER_TENANTS)} > {num(others)}\nand {on(ctx.join)}\n{suffering}",
        for_seconds=ctx.for_seconds(alert),
        summary="Other tenants take {others} % of GPU {labels.gpu} on {target}",
        description=(
            "Other processes on GPU {labels.gpu} ({labels.uuid}) took {others} % of its time "
            f"(above {pct(others)} %), the engine {{engine}} %; the engine's queue grew by "
            f"{{growth}} requests in {trend} to {{depth}} waiting, its median inter-token latency "
            f"is {{itl}} ms ({{itl_before}} ms {baseline} earlier): a noisy neighbour on a GPU "
            "shared by time-slicing or MPS."
        ),
        scope=GPU_LABELS,
        evidence=(
            percent("others", "other tenants' share of the GPU", ctx.name(GPU_OTHER_TENANTS)),
            Evidence(
                "engine",
                "the engine's own share of the GPU",
                f"100 * {ctx.name(GPU_ENGINE_SHARE)}{TARGET}",
                "%",
                scope=GPU_LABELS,
            ),
            Evidence(
                "growth",
                f"queue growth over {trend}",
                f"{num(trend_seconds)} * {ctx.name(QUEUE_TREND)}{TARGET}",
                "requests",
                "%+.0f",
                scope=(),
            ),
            Evidence(
                "depth",
                "requests waiting",
                f"{ctx.name(QUEUE_DEPTH)}{TARGET}",
                "requests",
                scope=(),
            ),
            Evidence(
                "itl",
                "median inter-token latency",
                f"1000 * {itl}{TARGET}",
                "ms",
                "%.1f",
                scope=(),
            ),
            Evidence(
                "itl_before",
                f"median inter-token latency {baseline} earlier",
                f"1000 * {itl}{TARGET} offset {baseline}",
                "ms",
                "%.1f",
                scope=(),
            ),
        ),
        when=(
            f"other tenants' processes take more than {pct(others)} % of a shared GPU while the "
            f"queue grows over {trend} (at least {num(depth)} waiting) or median inter-token "
            f"latency is more than {pct(rise)} % above its value {baseline} earlier"
        ),
    )
    return Signature(
        alert=alert,
        family="gpu",
        title="GPU contended by other tenants",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("each GPU's tenants: processes by owner", ctx.selector("inference_gpu_processes")),
                ("the engine's own share of each shared GPU", ctx.name(GPU_ENGINE_SHARE)),
                ("other tenants' share of each shared GPU", ctx.name(GPU_OTHER_TENANTS)),
                ("the GPU's utilisation, every tenant together", ctx.name(GPU_DEVICE_UTILIZATION)),
            ),
            others_above=pct(others),
            baseline=baseline,
        ),
    )
