"""How the node agent's series (the ``node`` layout) meet the sidecar's targets: each GPU given
to the pod holding it.

The node agent's series belong to the node: ``inference_gpu_pod_info`` names the pod holding
each GPU (``namespace``, ``pod``, kept by ``honorLabels``). Each GPU series is joined to it by
the agent's ``instance`` and the GPU, aggregated by pod, and given the sidecar target's
remaining join labels the same way the dcgm layout gives dcgm-exporter's (:func:`node_per_gpu`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, on, selector
from exporter.signatures.signals.target_signals import TARGET_INFO
from exporter.signatures.site import CLUSTER

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def pod_labels(ctx: SignalContext) -> tuple[str, ...]:
    """The labels naming the pod that holds a GPU."""
    return tuple(label for label in (CLUSTER, "namespace", "pod") if label in ctx.join)


def agent_gpu(ctx: SignalContext) -> tuple[str, ...]:
    """The labels naming one GPU of one node agent: its scrape target's ``instance``, whatever
    the join labels are."""
    agent = (CLUSTER, "instance") if CLUSTER in ctx.join else ("instance",)
    return (*agent, *GPU_LABELS)


def pods(ctx: SignalContext, *matchers: str) -> str:
    """The target-info signal of targets that are pods: static targets (no pod) would all meet
    in one empty match group, so only pods join. ``matchers`` narrow it (a dashboard's pod)."""
    return selector(ctx.name(TARGET_INFO), 'namespace!=""', 'pod!=""', *matchers)


def node_per_gpu(
    ctx: SignalContext, inner: str, keep: tuple[str, ...] = (), pod: Sequence[str] = ()
) -> str:
    """Per-GPU value of the node agent's series ``inner`` (one per agent and GPU, and per
    ``keep`` label), for each pod that holds the GPU, with the pod's target join labels.

    A GPU time-sliced between pods is every holder's. Where ``inner`` has several series per
    GPU (``keep``: an Xid, a clock event reason), PromQL cannot match them to several holders at
    once: those go to a GPU's only holder, and a shared GPU's stay the node's. ``pod`` are
    matchers on the holder's target labels (a dashboard's variables), applied before the join.
    """
    pj, agent = pod_labels(ctx), agent_gpu(ctx)
    rest = [label for label in ctx.join if label not in pj]
    info = ctx.sidecar_series("inference_gpu_pod_info", 'namespace!=""', 'pod!=""', *pod)
    holders = f"max {by((*agent, *pj))} ({info})"
    if keep:
        shared = f"({ctx.sidecar_series('inference_gpu_pods')} > 1)"
        holders = f"(\n{holders}\nunless {on(agent)}\n{shared}\n)"
        attributed = f"({inner})\n* {on(agent)} group_left ({', '.join(pj)})\n{holders}"
    else:
        attributed = f"({inner})\n* {on(agent)} group_right ()\n{holders}"
    grouped = f"max {by((*pj, *GPU_LABELS, *keep))} (\n{attributed}\n)"
    return f"{grouped}\n* {on(pj)} group_left ({', '.join(rest)})\n{pods(ctx, *pod)}"


def node_per_target(ctx: SignalContext, aggregation: str, inner: str) -> str:
    """Per-target ``aggregation`` of :func:`node_per_gpu` over the GPUs the target's pod
    holds."""
    return f"{aggregation} {ctx.by_target} (\n{node_per_gpu(ctx, inner)}\n)"
