"""How the node agent's series (the ``node`` layout) meet the sidecar's targets.

The node agent files each device's series under the pod holding the device: ``namespace``,
``pod`` and ``container`` of the holder, kept by ``honorLabels``; a device several pods share
has a copy of each series per pod, one no pod holds carries none of them
(:mod:`exporter.collectors.holder_labels`). A GPU signal of a pod is then its expression over
the agent's series aggregated by pod, given the sidecar target's remaining join labels
(``instance``, ``job``) from the target-info signal, as the dcgm layout gives dcgm-exporter's
(:func:`node_per_gpu`, :func:`node_per_target`). Nothing joins a device to
``inference_gpu_pod_info`` at evaluation time: a join per device and record cost the GPU
record groups 2-6x the sidecar profile's at fleet scale (``docs/scale.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, on, selector
from exporter.signatures.signals.signal_context import pod_labels
from exporter.signatures.signals.target_signals import TARGET_INFO
from exporter.signatures.site import CLUSTER

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def cluster_labels(ctx: SignalContext) -> tuple[str, ...]:
    """``cluster`` where the join labels name it (a pack for several clusters), else none."""
    return (CLUSTER,) if CLUSTER in ctx.join else ()


def agent_gpu(ctx: SignalContext) -> tuple[str, ...]:
    """The labels naming one GPU of one node agent: its scrape target's ``instance``, whatever
    the join labels are."""
    return (*cluster_labels(ctx), "instance", *GPU_LABELS)


def pods(ctx: SignalContext, *matchers: str) -> str:
    """The target-info signal: in the node layout one series per sidecar target that is a pod
    (static targets hold no GPU). ``matchers`` narrow it (a dashboard's pod)."""
    return selector(ctx.name(TARGET_INFO), *matchers)


def holder_matchers(ctx: SignalContext, matchers: Sequence[str]) -> list[str]:
    """The ``matchers`` on labels naming the holding pod (:func:`pod_labels`), which the node
    agent's series carry too: a dashboard narrows them to its pod before aggregating."""
    labels = pod_labels(ctx)
    return [m for m in matchers if m.split("=", 1)[0].rstrip("!~") in labels]


def _per_pod_gpu(ctx: SignalContext, inner: str, keep: tuple[str, ...] = ()) -> str:
    """``inner`` once per pod and GPU (and ``keep`` label): a node agent replaced by another
    (a new ``instance``) has both agents' series in a window for a while."""
    return f"max {by((*pod_labels(ctx), *GPU_LABELS, *keep))} ({inner})"


def node_per_gpu(
    ctx: SignalContext, inner: str, keep: tuple[str, ...] = (), pod: Sequence[str] = ()
) -> str:
    """Per-GPU value of the node agent's series ``inner`` (one per pod holding the GPU, and
    per ``keep`` label: an Xid, a clock event reason) with the pod's target join labels.

    ``pod`` are matchers on the pod's target labels (a dashboard's variables): only its GPUs
    join. Narrow ``inner``'s selectors to the pod too (:func:`holder_matchers`), or every GPU is
    aggregated before the join drops the others."""
    pj = pod_labels(ctx)
    rest = [label for label in ctx.join if label not in pj]
    grouped = _per_pod_gpu(ctx, inner, keep)
    return f"{grouped}\n* {on(pj)} group_left ({', '.join(rest)})\n{pods(ctx, *pod)}"


def node_per_target(ctx: SignalContext, aggregation: str, inner: str) -> str:
    """Per-target ``aggregation`` of the node agent's series ``inner`` over the GPUs the
    target's pod holds."""
    pj = pod_labels(ctx)
    grouped = f"{aggregation} {by(pj)} ({_per_pod_gpu(ctx, inner)})"
    return f"{grouped}\n* {on(pj)} group_right ()\n{pods(ctx)}"
