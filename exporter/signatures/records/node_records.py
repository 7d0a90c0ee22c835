"""GPU records from the node agent (the ``node`` profile): each GPU given to the pod holding it.

The node agent's series belong to the node: ``inference_gpu_pod_info`` names the pod holding
each GPU (``namespace``, ``pod``, kept by ``honorLabels``). Each GPU series is joined to it by
the agent's ``instance`` and the GPU, aggregated by pod, and given the sidecar target's
remaining join labels the same way the dcgm profile gives dcgm-exporter's (:func:`node_per_gpu`).

A pod's own share of a shared GPU comes from the agent's per-pod shares (hostPID), which name
the pod by UID only: kube-state-metrics' ``kube_pod_info{uid, namespace, pod}`` names it
(:func:`node_pod_share`).
"""

from __future__ import annotations

from exporter.metrics import GPU_LABELS
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import by, num, on, regex_alternatives, selector
from exporter.signatures.records.dcgm_records import held_down
from exporter.signatures.records.record_context import RecordContext
from exporter.signatures.site import CLUSTER

SAMPLES = "inference_gpu_utilization_samples"


def pod_labels(ctx: RecordContext) -> tuple[str, ...]:
    """The labels naming the pod that holds a GPU."""
    return tuple(label for label in (CLUSTER, "namespace", "pod") if label in ctx.join)


def agent_gpu(ctx: RecordContext) -> tuple[str, ...]:
    """The labels naming one GPU of one node agent: its scrape target's ``instance``, whatever
    the join labels are."""
    agent = (CLUSTER, "instance") if CLUSTER in ctx.join else ("instance",)
    return (*agent, *GPU_LABELS)


def node_per_gpu(ctx: RecordContext, inner: str, keep: tuple[str, ...] = ()) -> str:
    """Per-GPU value of the node agent's series ``inner`` (one per agent and GPU, and per
    ``keep`` label), for each pod that holds the GPU, with the pod's target join labels.

    A GPU time-sliced between pods is every holder's. Where ``inner`` has several series per
    GPU (``keep``: an Xid, a clock event reason), PromQL cannot match them to several holders at
    once: those go to a GPU's only holder, and a shared GPU's stay the node's.
    """
    pj, agent = pod_labels(ctx), agent_gpu(ctx)
    rest = [label for label in ctx.join if label not in pj]
    info = ctx.sidecar_series("inference_gpu_pod_info", 'namespace!=""', 'pod!=""')
    holders = f"max {by((*agent, *pj))} ({info})"
    if keep:
        shared = f"({ctx.sidecar_series('inference_gpu_pods')} > 1)"
        holders = f"(\n{holders}\nunless {on(agent)}\n{shared}\n)"
        attributed = f"({inner})\n* {on(agent)} group_left ({', '.join(pj)})\n{holders}"
    else:
        attributed = f"({inner})\n* {on(agent)} group_right ()\n{holders}"
    grouped = f"max {by((*pj, *GPU_LABELS, *keep))} (\n{attributed}\n)"
    # Static targets (no pod) would all meet in one empty match group: only pods join.
    pods = selector(ctx.records.target_info, 'namespace!=""', 'pod!=""')
    return f"{grouped}\n* {on(pj)} group_left ({', '.join(rest)})\n{pods}"


def node_gpu_records(ctx: RecordContext) -> list[RecordingRule]:
    """GPU records from the node agent's series, each GPU given to the pod holding it."""
    cfg, records, by_target = ctx.cfg, ctx.records, ctx.by_target
    rate = ctx.window("rate")
    pulse = ctx.window("pulsing")
    xid = ctx.window("xid")
    idle = num(cfg.ratio("InferenceGPUUtilizationPulsing", "idle_sample_at_most"))
    busy = num(cfg.ratio("InferenceGPUUtilizationPulsing", "busy_sample_above"))
    reasons = regex_alternatives(cfg.names("InferenceGPUThrottled", "reasons"))
    busy_seconds = ctx.sidecar_series("inference_gpu_busy_seconds_total")
    count = ctx.sidecar_series(f"{SAMPLES}_count")
    idle_bucket = ctx.sidecar_series(f"{SAMPLES}_bucket", f'le="{idle}"')
    busy_bucket = ctx.sidecar_series(f"{SAMPLES}_bucket", f'le="{busy}"')
    dram = ctx.sidecar_series("inference_gpu_dram_active_seconds_total")
    sm_active = ctx.sidecar_series("inference_gpu_sm_active_ratio")
    throttled = ctx.sidecar_series("inference_gpu_clock_event_active", f'reason=~"{reasons}"')
    xids = ctx.sidecar_series("inference_gpu_xid_errors_total")
    build = ctx.sidecar_series("inference_exporter_build_info")
    agent = agent_gpu(ctx)[: -len(GPU_LABELS)]
    agent_history = f"group {by(agent)} (max_over_time({build}[{xid}] offset {xid}))"
    new_xids = (
        f"(increase({xids}[{xid}]) > 0 and {xids} offset {xid})\n"
        f"or\n(({xids} unless {xids} offset {xid}) and {on(agent)} {agent_history})"
    )

    def over(aggregation: str, inner: str) -> str:
        return f"{aggregation} {by_target} (\n{node_per_gpu(ctx, inner)}\n)"

    return [
        RecordingRule(
            records.gpu_utilization,
            over("avg", f"rate({busy_seconds}[{rate}])"),
            "mean GPU utilisation (0-1) over the GPUs the target's pod holds (the node "
            "agent's, from every driver sample)",
        ),
        RecordingRule(
            records.utilization_samples,
            over("sum", f"increase({count}[{pulse}])"),
            "driver utilisation samples in the window, the two shares' denominator",
        ),
        RecordingRule(
            records.idle_samples,
            f"{over('sum', f'increase({idle_bucket}[{pulse}])')}\n/\n{records.utilization_samples}",
            f"share of driver utilisation samples at or below {idle}",
        ),
        RecordingRule(
            records.busy_samples,
            f"1 - (\n{over('sum', f'increase({busy_bucket}[{pulse}])')}\n/\n"
            f"{records.utilization_samples}\n)",
            f"share of driver utilisation samples above {busy}",
        ),
        RecordingRule(
            records.hbm_bandwidth,
            over("avg", f"rate({dram}[{rate}])"),
            "mean HBM bandwidth utilisation (0-1) over the pod's GPUs (GPM, Hopper+)",
        ),
        RecordingRule(
            records.sm_active,
            over("avg", f"avg_over_time({sm_active}[{rate}])"),
            "mean share of time the SMs had a warp resident (0-1) over the pod's GPUs "
            "(GPM, Hopper+)",
        ),
        RecordingRule(
            records.memory_used,
            node_per_gpu(
                ctx,
                f"{ctx.sidecar_series('inference_gpu_memory_used_bytes')}\n/\n"
                f"{ctx.sidecar_series('inference_gpu_memory_total_bytes')}",
            ),
            "framebuffer used / total per GPU the pod holds",
        ),
        RecordingRule(
            records.xid_new,
            node_per_gpu(ctx, new_xids, keep=("xid",)),
            "Xid errors in the window per GPU and Xid (as in the sidecar profile, the node "
            "agent's counters and its own history), for the GPU's only holder",
            window=0.0,
        ),
        RecordingRule(
            records.clock_events,
            node_per_gpu(ctx, f"{throttled} > 0", keep=("reason",)),
            "1 per GPU and reason while a hardware or thermal clock event reason holds the "
            "clocks down (the GPU's only holder); absent otherwise",
        ),
        RecordingRule(
            records.temperature,
            held_down(
                ctx, node_per_gpu(ctx, ctx.sidecar_series("inference_gpu_temperature_celsius"))
            ),
            "GPU temperature (°C) of throttled GPUs: the throttling alert's evidence",
        ),
        RecordingRule(
            records.sm_clock,
            held_down(ctx, node_per_gpu(ctx, ctx.sidecar_series("inference_gpu_sm_clock_hertz"))),
            "SM clock (Hz) of throttled GPUs: the throttling alert's evidence",
        ),
    ]


def node_shares(ctx: RecordContext) -> tuple[RecordingRule, RecordingRule, RecordingRule]:
    """Each GPU's utilisation for each pod holding it; the pod's own share of a GPU other
    tenants' processes share (the node agent's per-pod shares, where it runs with hostPID,
    named by kube-state-metrics' ``kube_pod_info``); the target's own utilisation counting only
    that share."""
    records = ctx.records
    on_gpu = on((*ctx.join, *GPU_LABELS))
    busy = ctx.sidecar_series("inference_gpu_busy_seconds_total")
    device = RecordingRule(
        records.gpu_device_utilization,
        node_per_gpu(ctx, f"rate({busy}[{ctx.window('rate')}])"),
        "mean utilisation (0-1) of each GPU the target's pod holds, every holder's work "
        "together (the node agent's)",
    )
    engine_share = RecordingRule(
        records.gpu_engine_share,
        node_pod_share(ctx),
        "the pod's own mean share (0-1) of each GPU that other pods' or the host's processes "
        "share (the node agent's per-pod shares with hostPID, the pod UID named by "
        "kube-state-metrics' kube_pod_info); absent on a GPU the pod has to itself",
    )
    own = RecordingRule(
        records.gpu_own_utilization,
        f"avg {ctx.by_target} (\n{records.gpu_engine_share}\nor {on_gpu}\n"
        f"{records.gpu_device_utilization}\n)",
        "mean GPU utilisation (0-1) over the target's GPUs, counting only the pod's own "
        "share of a GPU shared with other tenants",
    )
    return device, engine_share, own


def node_pod_share(ctx: RecordContext) -> str:
    """Each pod's own share of each GPU its processes run on, where the GPU is shared: the
    node agent's ``inference_gpu_pod_utilization_ratio{pod_uid}`` summed over the pod's
    containers, joined to ``kube_pod_info{uid}`` for ``namespace`` and ``pod`` (the agent's own
    target labels dropped first), then given the target's remaining join labels.

    Shared: processes of more than one pod on the GPU, or a live process of no pod (a host
    tenant). A pod UID without a ``kube_pod_info`` row joins no one; a process the agent could
    not map is no pod's share; a pod's processes on a GPU the kubelet did not give it are not
    its share (the device record, :func:`node_shares`, has only the GPUs it holds).
    """
    pj, agent = pod_labels(ctx), agent_gpu(ctx)
    rest = [label for label in ctx.join if label not in pj]
    rate = ctx.window("rate")
    util = ctx.sidecar_series("inference_gpu_pod_utilization_ratio")
    host = ctx.sidecar_series("inference_gpu_pod_unattributed_processes", 'reason="host"')
    cluster = (CLUSTER,) if CLUSTER in ctx.join else ()
    by_uid = by((*agent, "uid"))
    share = (
        f"sum {by_uid} (\nlabel_replace(avg_over_time({util}[{rate}]), "
        f'"uid", "$1", "pod_uid", "(.+)")\n)'
    )
    pods_on_gpu = (
        f"count {by(agent)} (max {by((*agent, 'pod_uid'))} (max_over_time({util}[{rate}])))"
    )
    shared = f"(\n{pods_on_gpu} > 1\nor\nmax {by(agent)} (max_over_time({host}[{rate}])) > 0\n)"
    names = f"max {by((*cluster, 'uid', 'namespace', 'pod'))} (kube_pod_info)"
    named = (
        f"(\n{share}\nand {on(agent)}\n{shared}\n)\n"
        f"* {on((*cluster, 'uid'))} group_left (namespace, pod)\n{names}"
    )
    grouped = f"max {by((*pj, *GPU_LABELS))} (\n{named}\n)"
    pods = selector(ctx.records.target_info, 'namespace!=""', 'pod!=""')
    # Only GPUs the kubelet gave the pod: its processes on another GPU are no share of its own.
    held = f"and {on((*ctx.join, *GPU_LABELS))}\n{ctx.records.gpu_device_utilization}"
    return f"{grouped}\n* {on(pj)} group_left ({', '.join(rest)})\n{pods}\n{held}"


def node_peaks(ctx: RecordContext, precision: str) -> tuple[str, str]:
    """The slowest GPU's peak bandwidth and FLOPs of each target, from the node agent."""
    bandwidth = ctx.sidecar_series("inference_gpu_peak_memory_bandwidth_bytes_per_second")
    flops = ctx.sidecar_series("inference_gpu_peak_flops", precision)
    return (
        f"min {ctx.by_target} (\n{node_per_gpu(ctx, bandwidth)}\n)",
        f"min {ctx.by_target} (\n{node_per_gpu(ctx, flops)}\n)",
    )
