"""The GPU itself: idle under load, lost, reporting Xid errors, clocks held down.

Alerts carry ``signature="gpu"``.
"""

from __future__ import annotations

from exporter.signatures.catalogue.context import GPU_LABELS, Context, percent
from exporter.signatures.model import TARGET, AlertRule, Evidence, Signature
from exporter.signatures.promql import num, pct, regex_alternatives


def gpu_underutilized(ctx: Context) -> Signature:
    alert = "InferenceGPUUnderutilized"
    records = ctx.records
    util = ctx.ratio(alert, "utilization_below")
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="info",
        expr=f"{records.gpu_utilization} < {num(util)}\nand\n{records.requests_running} > 0",
        for_seconds=ctx.for_seconds(alert),
        summary="GPU underutilised on {target}",
        description=(
            f"Mean GPU utilisation {{util}} % (below {pct(util)} %) for {hold} while "
            "{running} requests run on average: the GPU waits most of the time."
        ),
        evidence=(
            percent("util", "mean GPU utilisation", records.gpu_utilization),
            Evidence(
                "running",
                "requests running",
                f"{records.requests_running}{TARGET}",
                "requests",
                "%.1f",
            ),
        ),
        when=f"mean GPU utilisation < {pct(util)} % while requests are running",
    )
    return Signature(
        alert=alert,
        group="gpu",
        title="GPU underutilised under load",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("which other signatures hold for this target", 'ALERTS{alertstate="firing"}'),
                ("generation throughput (tokens/s)", records.generation_tokens),
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
        group="gpu",
        title="GPU lost",
        rules=(rule,),
        runbook=ctx.runbook(alert, queries=(("Xids on the same GPU", ctx.records.xid_new),)),
    )


def gpu_xid_errors(ctx: Context) -> Signature:
    alert = "InferenceGPUXidErrors"
    records = ctx.records
    critical = regex_alternatives(ctx.cfg.ints(alert, "critical_xids"))
    listed = critical.replace("|", ", ")
    window = ctx.window("xid")
    count = Evidence("count", f"new Xid errors in {window}", None, "errors")
    critical_rule = AlertRule(
        severity="critical",
        expr=f'{records.xid_new}{{xid=~"{critical}"}} > 0',
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
        expr=f'{records.xid_new}{{xid!~"{critical}"}} > 0',
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
        group="gpu",
        title="GPU Xid errors",
        rules=(critical_rule, warning_rule),
        runbook=ctx.runbook(
            alert,
            queries=(("new Xids per GPU", records.xid_new),),
            critical_xids=listed,
        ),
    )


def gpu_throttled(ctx: Context) -> Signature:
    alert = "InferenceGPUThrottled"
    records = ctx.records
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="warning",
        expr=f"{records.clock_events} > 0",
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
                "temp", "GPU temperature", f"{records.temperature}{TARGET}", "°C", scope=GPU_LABELS
            ),
            Evidence(
                "clock",
                "SM clock",
                f"{records.sm_clock}{TARGET} / 1000000",
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
        group="gpu",
        title="GPU clocks throttled by hardware or heat",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("GPU temperature", records.temperature),
                ("SM clock (MHz)", f"{records.sm_clock} / 1000000"),
            ),
        ),
    )
