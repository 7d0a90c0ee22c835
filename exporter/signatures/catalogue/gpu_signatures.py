"""The GPU itself: idle under load, waiting on its peers' links, lost, reporting Xid errors,
clocks held down, contended by other tenants of a shared GPU.

Alerts carry ``signature="gpu"``.
"""

from __future__ import annotations

from exporter.metrics import GPU_LABELS
from exporter.signatures.catalogue.context import Context, percent
from exporter.signatures.definitions import TARGET, Advice, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import num, on, pct, regex_alternatives
from exporter.signatures.signals.engine_signals import (
    GENERATION_TOKENS,
    QUEUE_DEPTH,
    QUEUE_TREND,
    REQUESTS_RUNNING,
    TRAFFIC,
)
from exporter.signatures.signals.gpu_signals import (
    CLOCK_EVENTS,
    GPU_UTILIZATION,
    SM_ACTIVE,
    SM_CLOCK,
    TEMPERATURE,
    XID_NEW,
)
from exporter.signatures.signals.latency_signals import INTER_TOKEN_MEDIAN
from exporter.signatures.signals.link_signals import GPUS, NVLINK_UTILIZATION
from exporter.signatures.signals.power_signals import CLOCK_CAUSE, POWER_DRAW, POWER_LIMIT
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
        advice=Advice(
            "investigate",
            blocks_scale_out=True,
            why=(
                "the GPU is {util} % busy with {running} requests running: it waits most of the "
                "time, and another GPU would wait too"
            ),
        ),
    )


def interconnect_bound(ctx: Context) -> Signature:
    """A tensor- or expert-parallel pod whose GPUs wait on their links: NVLink near its peak
    while the SMs idle, in a pod of more than one GPU."""
    alert = "InferenceInterconnectBound"
    links = ctx.ratio(alert, "link_utilization_above")
    sm_below = ctx.ratio(alert, "sm_active_below")
    join = on(ctx.join)
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(NVLINK_UTILIZATION)} > {num(links)}\n"
            f"and {join}\n{ctx.name(SM_ACTIVE)} < {num(sm_below)}\n"
            f"and {join}\n{ctx.name(GPUS)} > 1\n"
            f"and {join}\n{ctx.name(TRAFFIC)}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="GPUs wait on their NVLink peers on {target}",
        description=(
            "The pod's {gpus} GPUs move data over NVLink at {links} % of the links' peak "
            f"(above {pct(links)} %) while their SMs are active {{sm}} % of the time (below "
            f"{pct(sm_below)} %), GPU utilisation {{util}} %, with traffic: at least {{links}} % "
            "of each step is communication that does not overlap compute - the all-reduce of "
            "tensor parallelism or the all-to-all of expert parallelism."
        ),
        evidence=(
            percent("links", "mean NVLink use against its peak", ctx.name(NVLINK_UTILIZATION)),
            percent("sm", "mean SM activity", ctx.name(SM_ACTIVE)),
            percent("util", "mean GPU utilisation", ctx.name(GPU_UTILIZATION)),
            Evidence("gpus", "GPUs of the pod", f"{ctx.name(GPUS)}{TARGET}", "GPUs"),
        ),
        when=(
            f"mean NVLink use > {pct(links)} % of the links' peak while mean SM activity "
            f"< {pct(sm_below)} %, in a pod of more than one GPU, with traffic"
        ),
    )
    rate = ctx.window("rate")
    return Signature(
        alert=alert,
        family="gpu",
        title="Bound by the GPU interconnect",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("NVLink use against its peak, per pod", ctx.name(NVLINK_UTILIZATION)),
                ("GPUs per pod (the tensor-parallel degree)", ctx.name(GPUS)),
                (
                    "each GPU's usable and lost links",
                    ctx.selector("inference_gpu_nvlink_links"),
                ),
                (
                    "the NVLink fabric's health (NVSwitch systems)",
                    ctx.selector("inference_gpu_fabric_condition_active") + " == 1",
                ),
                (
                    "C2C use against its peak (Grace parts: offloaded KV and weights)",
                    f"rate({ctx.selector('inference_gpu_c2c_transmit_bytes_total')}[{rate}])\n"
                    f"/\n{ctx.selector('inference_gpu_c2c_peak_bytes_per_second')}",
                ),
            ),
            link_utilization_above=pct(links),
            sm_active_below=pct(sm_below),
        ),
        advice=Advice(
            "fix_interconnect",
            blocks_scale_out=True,
            why=(
                "the pod's {gpus} GPUs wait on NVLink at {links} % of its peak with their SMs "
                "{sm} % active: another replica would split its work the same way and wait too"
            ),
        ),
    )


def gpu_lost(ctx: Context) -> Signature:
    alert = "InferenceGPULost"
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="critical",
        expr=f"min {ctx.by('gpu', 'uuid')} ({ctx.latest('inference_gpu_up')} == 0)",
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
        advice=Advice(
            "fix_gpu",
            blocks_scale_out=True,
            why=(
                "GPU {labels.gpu} stopped answering: the replica is broken, not short; drain "
                "and repair it"
            ),
        ),
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
        advice=Advice(
            "fix_gpu",
            blocks_scale_out=True,
            why=(
                "GPU {labels.gpu} reported Xid {labels.xid}: its state cannot be trusted until "
                "it is reset"
            ),
        ),
    )


def gpu_throttled(ctx: Context) -> Signature:
    alert = "InferenceGPUThrottled"
    hold = ctx.for_duration(alert)
    capped = ctx.ratio(alert, "power_cap_draw_at_least")
    rule = AlertRule(
        severity="warning",
        expr=f"{ctx.name(CLOCK_EVENTS)} > 0",
        for_seconds=ctx.for_seconds(alert),
        summary="GPU {labels.gpu} clocks held down ({labels.reason}) on {target}",
        description=(
            f"GPU {{labels.gpu}} ({{labels.uuid}}) has been slowed by {{labels.reason}} for "
            f"{hold}, cause: {{cause}}; die at {{temp}} °C, drawing {{power}} W of the "
            "{limit} W limit it enforces, SM clock {clock} MHz: every kernel runs slower "
            "until the cause is fixed."
        ),
        scope=("gpu", "uuid", "reason"),
        evidence=(
            Evidence(
                "cause",
                "what holds the clocks down",
                f"{ctx.name(CLOCK_CAUSE)}{TARGET}",
                "",
                scope=("gpu", "uuid", "reason"),
                name="cause",
            ),
            Evidence(
                "temp",
                "GPU temperature",
                f"{ctx.name(TEMPERATURE)}{TARGET}",
                "°C",
                scope=GPU_LABELS,
            ),
            Evidence(
                "power",
                "power draw",
                f"{ctx.name(POWER_DRAW)}{TARGET}",
                "W",
                scope=GPU_LABELS,
            ),
            Evidence(
                "limit",
                "enforced power limit",
                f"{ctx.name(POWER_LIMIT)}{TARGET}",
                "W",
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
                ("what holds each throttled GPU's clocks down", ctx.name(CLOCK_CAUSE)),
                ("GPU temperature", ctx.name(TEMPERATURE)),
                ("SM clock (MHz)", f"{ctx.name(SM_CLOCK)} / 1000000"),
                (
                    "power draw against the enforced limit",
                    f"{ctx.name(POWER_DRAW)}\n/\n{ctx.name(POWER_LIMIT)}",
                ),
                (
                    "power smoothing and its floor (Blackwell)",
                    ctx.selector("inference_gpu_power_smoothing_floor_watts")
                    + "\nand\n"
                    + ctx.selector("inference_gpu_power_smoothing_enabled")
                    + " == 1",
                ),
                (
                    "workload power profiles enforced",
                    ctx.selector("inference_gpu_power_profile_info"),
                ),
            ),
            power_cap_draw_at_least=pct(capped),
        ),
        advice=Advice(
            "fix_gpu",
            blocks_scale_out=True,
            why=(
                "GPU {labels.gpu} runs with its clocks held down ({labels.reason}) at {temp} "
                "°C: every replica on hardware like it runs slower until cooling or power is "
                "fixed"
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
        advice=Advice(
            "isolate_gpu",
            blocks_scale_out=True,
            why=(
                "other tenants take {others} % of GPU {labels.gpu}: the engine shares its GPU, "
                "it is not short of GPUs"
            ),
        ),
    )
