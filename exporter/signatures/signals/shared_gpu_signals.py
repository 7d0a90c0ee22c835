"""The engine's own share of GPUs it shares with other tenants (time-slicing, MPS).

A GPU counts as shared while other processes hold a compute context on it; the sidecar's NVML
collector tells them apart, and so does the node agent with hostPID (its processes mapped to
pods by cgroup, named by kube-state-metrics' ``kube_pod_info``). dcgm-exporter does not, so in
the dcgm layout no GPU counts as shared and the target's own utilisation is the GPUs'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, on
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_gpu
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION
from exporter.signatures.signals.node_join import (
    agent_gpu,
    cluster_labels,
    node_per_gpu,
    pods,
)
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_context import pod_labels
from exporter.signatures.signals.signal_groups import GPU_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def _on_gpu(ctx: SignalContext) -> str:
    return on((*ctx.join, *GPU_LABELS))


def _busy(ctx: SignalContext) -> str:
    return ctx.sidecar_series("inference_gpu_busy_seconds_total")


#: Each GPU's utilisation, every tenant's work together (one series per target and GPU).
GPU_DEVICE_UTILIZATION = Signal(
    "inference_gpu:utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: f"max {ctx.by_gpu} (rate({_busy(ctx)}[{ctx.window('rate')}]))",
            "mean utilisation (0-1) of each GPU, every tenant's work together",
        ),
        node=Rule(
            lambda ctx: node_per_gpu(ctx, f"rate({_busy(ctx)}[{ctx.window('rate')}])"),
            "mean utilisation (0-1) of each GPU the target's pod holds, every holder's work "
            "together (the node agent's)",
        ),
        dcgm=Rule(
            lambda ctx: dcgm_per_gpu(
                ctx,
                dcgm_quantity(
                    ctx,
                    dcgm_fields.UTILIZATION,
                    lambda s: f"avg_over_time({s}[{ctx.window('rate')}])",
                ),
            ),
            "mean utilisation (0-1) of each GPU (DCGM_FI_DEV_GPU_UTIL_RATIO, or "
            "DCGM_FI_DEV_GPU_UTIL in % before dcgm-exporter 4.9)",
        ),
    ),
    "device utilisation",
)


def _engine_share_sidecar(ctx: SignalContext) -> str:
    rate = ctx.window("rate")
    engine = ctx.sidecar_series("inference_gpu_engine_utilization_ratio")
    others = ctx.sidecar_series("inference_gpu_processes", 'owner="other"')
    return (
        f"max {ctx.by_gpu} (avg_over_time({engine}[{rate}]))\n"
        f"and {_on_gpu(ctx)}\n"
        f"(max {ctx.by_gpu} (max_over_time({others}[{rate}])) > 0)"
    )


def node_pod_share(ctx: SignalContext) -> str:
    """Each pod's own share of each GPU its processes run on, where the GPU is shared: the
    node agent's ``inference_gpu_pod_utilization_ratio{pod_uid}`` summed over the pod's
    containers, joined to ``kube_pod_info{uid}`` for ``namespace`` and ``pod`` (the agent's own
    target labels dropped first), then given the target's remaining join labels.

    Shared: processes of more than one pod on the GPU, or a live process of no pod (a host
    tenant). A pod UID without a ``kube_pod_info`` row joins no one; a process the agent could
    not map is no pod's share; a pod's processes on a GPU the kubelet did not give it are not
    its share (the device signal has only the GPUs it holds).
    """
    pj, agent = pod_labels(ctx), agent_gpu(ctx)
    rest = [label for label in ctx.join if label not in pj]
    rate = ctx.window("rate")
    util = ctx.sidecar_series("inference_gpu_pod_utilization_ratio")
    host = ctx.sidecar_series("inference_gpu_pod_unattributed_processes", 'reason="host"')
    cluster = cluster_labels(ctx)
    by_uid = by((*agent, "uid"))
    share = (
        f"sum {by_uid} (\nlabel_replace(avg_over_time({util}[{rate}]), "
        f'"uid", "$1", "pod_uid", "(.+)")\n)'
    )
    pods_on_gpu = (
        f"count {by(agent)} (max {by((*agent, 'pod_uid'))} (max_over_time({util}[{rate}])))"
    )
    shared = f"(\n{pods_on_gpu} > 1\nor\nmax {by(agent)} (max_over_time({host}[{rate}])) > 0\n)"
    # kube-state-metrics' names through one failed scrape of it, as the sidecars' facts are.
    names = f"max {by((*cluster, 'uid', 'namespace', 'pod'))} ({ctx.last('kube_pod_info')})"
    named = (
        f"(\n{share}\nand {on(agent)}\n{shared}\n)\n"
        f"* {on((*cluster, 'uid'))} group_left (namespace, pod)\n{names}"
    )
    grouped = f"max {by((*pj, *GPU_LABELS))} (\n{named}\n)"
    # Only GPUs the kubelet gave the pod: its processes on another GPU are no share of its own.
    held = f"and {_on_gpu(ctx)}\n{ctx.name(GPU_DEVICE_UTILIZATION)}"
    return f"{grouped}\n* {on(pj)} group_left ({', '.join(rest)})\n{pods(ctx)}\n{held}"


def _nothing(ctx: SignalContext) -> str:
    device = ctx.name(GPU_DEVICE_UTILIZATION)
    return f"{device} unless {device}"


#: The engine's (the pod's) own share of each GPU that other tenants share; absent on a GPU
#: it has to itself.
GPU_ENGINE_SHARE = Signal(
    "inference_gpu:engine_utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            _engine_share_sidecar,
            "the engine's own mean share (0-1) of each GPU that other tenants' processes "
            "share; absent on a GPU the engine has to itself",
        ),
        node=Rule(
            node_pod_share,
            "the pod's own mean share (0-1) of each GPU that other pods' or the host's "
            "processes share (the node agent's per-pod shares with hostPID, the pod UID named "
            "by kube-state-metrics' kube_pod_info); absent on a GPU the pod has to itself",
        ),
        dcgm=Rule(
            _nothing, "none: dcgm-exporter does not tell the engine's processes from other tenants'"
        ),
    ),
    "engine's own share",
)


def _other_tenants(ctx: SignalContext) -> str:
    return (
        f"clamp(\n{ctx.name(GPU_DEVICE_UTILIZATION)}\n- {_on_gpu(ctx)}\n"
        f"{ctx.name(GPU_ENGINE_SHARE)},\n0, 1\n)"
    )


#: Other tenants' share of each shared GPU.
GPU_OTHER_TENANTS = Signal(
    "inference_gpu:other_tenants_utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    Rule(
        _other_tenants,
        "other tenants' mean share (0-1) of each shared GPU: its utilisation less the engine's",
    ),
    "other tenants",
)


def _own_sidecar(ctx: SignalContext) -> str:
    return (
        f"avg {ctx.by_target} (\n{ctx.name(GPU_ENGINE_SHARE)}\nor\n"
        f"{ctx.name(GPU_DEVICE_UTILIZATION)}\n)"
    )


def _own_node(ctx: SignalContext) -> str:
    return (
        f"avg {ctx.by_target} (\n{ctx.name(GPU_ENGINE_SHARE)}\nor {_on_gpu(ctx)}\n"
        f"{ctx.name(GPU_DEVICE_UTILIZATION)}\n)"
    )


#: Mean utilisation of the target's GPUs counting only the engine's own share of a shared GPU:
#: what the utilisation signatures read.
GPU_OWN_UTILIZATION = Signal(
    "inference:gpu_own_utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            _own_sidecar,
            "mean GPU utilisation (0-1) over the target's GPUs, counting only the "
            "engine's own share of a GPU shared with other tenants",
        ),
        node=Rule(
            _own_node,
            "mean GPU utilisation (0-1) over the target's GPUs, counting only the pod's own "
            "share of a GPU shared with other tenants",
        ),
        dcgm=Rule(
            lambda ctx: ctx.name(GPU_UTILIZATION),
            "mean GPU utilisation (0-1) over the target's GPUs (no per-process shares here)",
        ),
    ),
    "engine's own utilisation",
)
