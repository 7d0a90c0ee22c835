"""The pack's own eyes: the exporter's scrape, its collectors, the engine's metrics, NVML.

When one of these fires, the other signatures of the target are blind rather than green.
Alerts carry ``signature="meta"`` and go to the ``inference.meta`` rule group.

"Any member is 0" is written ``min by (...) (x == 0)``, not ``min by (...) (x) == 0``: the
same groups and values (a group is 0 where one of its series is), but the aggregation hashes
only the failing series, not every collector's (34,000 series at 10,000 GPUs, the costliest
alert input of the pack, evaluated at the alerts' interval).
"""

from __future__ import annotations

from typing import assert_never

from exporter.signatures.catalogue.context import Context
from exporter.signatures.definitions import TARGET, Advice, AlertRule, Evidence, Signature
from exporter.signatures.promql_text import on, selector
from exporter.signatures.signals.dcgm_fields import UTILIZATION, DcgmQuantity
from exporter.signatures.signals.engine_signals import GENERATION_TOKENS, TRAFFIC
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION


def exporter_down(ctx: Context) -> Signature:
    alert = "InferenceExporterDown"
    up = selector("up", ctx.cfg.selectors.exporter)
    hold = ctx.for_duration(alert)
    down = AlertRule(
        severity="warning",
        expr=f"min {ctx.by()} ({up} == 0)",
        for_seconds=ctx.for_seconds(alert),
        summary="Inference exporter {target} is down",
        description=(
            "Prometheus has failed to scrape the inference-bottleneck-exporter sidecar at "
            f"{{labels.instance}} for {hold}: every signature of this target is blind."
        ),
        when="the sidecar's scrape target is down",
        labels=(("condition", "down"),),
    )
    absent = AlertRule(
        severity="warning",
        expr=f"absent({up})",
        for_seconds=ctx.for_seconds(alert),
        summary="No inference exporter target is discovered",
        description=(
            f"No scrape target matching {up} has existed for {hold}: Prometheus finds no "
            "inference-bottleneck-exporter sidecar, so no signature can fire."
        ),
        when=f"no target matches {up}",
        labels=(("condition", "absent"),),
    )
    return Signature(
        alert=alert,
        family="meta",
        title="Exporter down or not discovered",
        rules=(down, absent),
        runbook=ctx.runbook(alert, queries=(("scrape health of the sidecars", up),)),
        advice=Advice(
            "fix_monitoring",
            blocks_scale_out=False,
            why=("the sidecar is not scraped: the pack cannot say what limits this pod"),
        ),
    )


def collector_failing(ctx: Context) -> Signature:
    alert = "InferenceCollectorFailing"
    hold = ctx.for_duration(alert)
    success = ctx.latest("inference_scrape_collector_success")
    rule = AlertRule(
        severity="warning",
        expr=f"min {ctx.by('collector')} ({success} == 0)",
        for_seconds=ctx.for_seconds(alert),
        summary="Collector {labels.collector} failing on {target}",
        description=(
            f"Collector {{labels.collector}} has failed every scrape for {hold} (last run took "
            "{took} s): its metrics are missing and the signatures that read them stay silent; "
            "the exporter's log says why."
        ),
        scope=("collector",),
        evidence=(
            Evidence(
                "took",
                "collector duration",
                f"{ctx.selector('inference_scrape_collector_duration_seconds')}{TARGET}",
                "s",
                "%.3f",
            ),
        ),
        when="inference_scrape_collector_success == 0",
    )
    return Signature(
        alert=alert,
        family="meta",
        title="A collector keeps failing",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "collector durations vs the scrape deadline",
                    ctx.selector("inference_scrape_collector_duration_seconds"),
                ),
            ),
        ),
        advice=Advice(
            "fix_monitoring",
            blocks_scale_out=False,
            why=(
                "collector {labels.collector} fails: the signatures that read it are blind on "
                "this pod"
            ),
        ),
    )


def engine_metrics_down(ctx: Context) -> Signature:
    alert = "InferenceEngineMetricsDown"
    hold = ctx.for_duration(alert)
    rate = ctx.window("rate")
    failures = ctx.selector("inference_engine_poll_failures_total")
    rule = AlertRule(
        severity="warning",
        expr=f"min {ctx.by('engine')} ({ctx.latest('inference_engine_up')} == 0)",
        for_seconds=ctx.for_seconds(alert),
        summary="Engine metrics unreadable on {target}",
        description=(
            f"The sidecar has not read the {{labels.engine}} engine's metrics endpoint for "
            f"{hold} ({{failures}} failed polls in the last {rate}): queue, latency and KV-cache "
            "signals are missing for this target."
        ),
        scope=("engine",),
        evidence=(
            Evidence(
                "failures",
                f"failed polls in {rate}",
                f"sum(increase({failures}{TARGET}[{rate}]))",
                "polls",
            ),
        ),
        when="inference_engine_up == 0",
    )
    return Signature(
        alert=alert,
        family="meta",
        title="Engine metrics unreadable",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                (
                    "failed polls by reason (connect, timeout, status, too_large, parse)",
                    ctx.rate("inference_engine_poll_failures_total"),
                ),
            ),
        ),
        advice=Advice(
            "fix_monitoring",
            blocks_scale_out=False,
            why=(
                "the engine's metrics are unreadable: its queue and latency are unknown on this pod"
            ),
        ),
    )


def nvml_unavailable(ctx: Context) -> Signature:
    alert = "InferenceNVMLUnavailable"
    hold = ctx.for_duration(alert)
    rule = AlertRule(
        severity="warning",
        expr=f"min {ctx.by()} ({ctx.latest('inference_nvml_up')} == 0)",
        for_seconds=ctx.for_seconds(alert),
        summary="NVML unavailable in the sidecar of {target}",
        description=(
            f"NVML has not initialised in the sidecar for {hold}: the NVIDIA driver library "
            "is not visible in the container, so GPU metrics and every GPU-based signature "
            "are missing."
        ),
        when="inference_nvml_up == 0",
    )
    return Signature(
        alert=alert,
        family="meta",
        title="NVML unavailable",
        rules=(rule,),
        runbook=ctx.runbook(
            alert, queries=(("NVML state per target", ctx.selector("inference_nvml_up")),)
        ),
        advice=Advice(
            "fix_monitoring",
            blocks_scale_out=False,
            why=("NVML is unavailable in the sidecar: the GPU signatures of this pod are blind"),
        ),
    )


def gpu_attribution_uncertain(ctx: Context) -> Signature:
    alert = "InferenceGPUAttributionUncertain"
    hold = ctx.for_duration(alert)
    all_visible = ctx.latest("inference_gpu_attribution_info", 'method="all-visible"')
    engine = ctx.latest("inference_gpu_processes", 'owner="engine"')
    other = ctx.latest("inference_gpu_processes", 'owner="other"')
    foreign = (
        f"count {ctx.by()} (\n{engine} == 0\nand {on((*ctx.join, 'gpu', 'uuid'))}\n{other} > 0\n)"
    )
    rule = AlertRule(
        severity="warning",
        expr=f"({foreign} > 0)\nand {on(ctx.join)}\nmax {ctx.by()} ({all_visible})",
        for_seconds=ctx.for_seconds(alert),
        summary="GPU verdicts of {target} average in other workloads' GPUs",
        description=(
            "The sidecar reads every GPU its container sees (all-visible), and on {gpus} of "
            f"them only other workloads' processes have computed for {hold}: they are not the "
            "engine's, and every GPU signature of this target averages them in."
        ),
        evidence=(Evidence("gpus", "GPUs where only other workloads compute", None, "GPUs"),),
        when="all-visible GPUs where other processes compute and the engine's do not",
    )
    return Signature(
        alert=alert,
        family="meta",
        title="GPUs not the engine's",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("how each target chose its GPUs", ctx.selector("inference_gpu_attribution_info")),
                ("each GPU's tenants: processes by owner", ctx.selector("inference_gpu_processes")),
            ),
        ),
        advice=Advice(
            "fix_monitoring",
            blocks_scale_out=False,
            why=(
                "the sidecar averages in {gpus} GPUs that are not the engine's: this pod's GPU "
                "verdicts are unsure"
            ),
        ),
    )


def _gpu_source(ctx: Context) -> str:
    """Where the layout reads GPU utilisation from, as the alert's description says it."""
    match ctx.cfg.profile.source:
        case "dcgm":
            names = UTILIZATION.described()
            return (
                f"dcgm-exporter reports no GPU utilisation for its pod under any name the pack "
                f"reads ({names}): a dcgm-exporter release that renamed it again, a counters "
                "file without it, or series without the pod's labels"
            )
        case "node":
            return (
                "the node agent attributes no GPU to its pod (inference_gpu_pod_info): the "
                "agent is not scraped on that node, or the kubelet's pod resources do not "
                "name the pod"
            )
        case "sidecar":
            return "the sidecar reports no GPU (its nvml collector is off, or sees no GPU)"
        case _:  # pragma: no cover - mypy proves it unreachable
            assert_never(ctx.cfg.profile.source)


def gpu_metrics_missing(ctx: Context) -> Signature:
    alert = "InferenceGPUMetricsMissing"
    hold = ctx.for_duration(alert)
    nvml_down = f"min {ctx.by()} ({ctx.latest('inference_nvml_up')} == 0)"
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{ctx.name(TRAFFIC)}\nunless {on(ctx.join)}\n{ctx.name(GPU_UTILIZATION)}\n"
            # NVML down in the sidecar has its own alert.
            f"unless {on(ctx.join)}\n{nvml_down}"
        ),
        for_seconds=ctx.for_seconds(alert),
        summary="No GPU metrics for the engine of {target}",
        description=(
            f"The engine of {{target}} has served traffic for {hold} ({{tokens}} tokens/s) but "
            f"{_gpu_source(ctx)}: every GPU signature of this target is blind, not green."
        ),
        evidence=(
            Evidence(
                "tokens",
                "tokens generated per second",
                f"{ctx.name(GENERATION_TOKENS)}{TARGET}",
                "tokens/s",
            ),
        ),
        when="a target with traffic and no GPU utilisation signal",
    )
    return Signature(
        alert=alert,
        family="meta",
        title="GPU metrics missing",
        rules=(rule,),
        runbook=ctx.runbook(
            alert,
            queries=(
                ("targets with traffic", ctx.name(TRAFFIC)),
                ("targets with a GPU utilisation signal", ctx.name(GPU_UTILIZATION)),
                *(
                    (f"dcgm-exporter's {quantity.title}, any name", _any_name(quantity))
                    for quantity in (UTILIZATION,)
                    if ctx.cfg.profile.source == "dcgm"
                ),
            ),
            dcgm_names=UTILIZATION.described(),
        ),
        advice=Advice(
            "fix_monitoring",
            blocks_scale_out=False,
            why=(
                "the pack reads no GPU utilisation for an engine generating {tokens} tokens/s: "
                "nothing to scale on until it can"
            ),
        ),
    )


def _any_name(quantity: DcgmQuantity) -> str:
    names = "|".join(quantity.metrics)
    return f'count by (__name__, namespace, pod) ({{__name__=~"{names}"}})'
