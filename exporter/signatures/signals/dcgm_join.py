"""How dcgm-exporter's series (the ``dcgm`` layout) meet the sidecar's targets.

dcgm-exporter series belong to the GPU's pod (``namespace``, ``pod``) but not to the sidecar's
scrape target (their ``instance`` and ``job`` are dcgm-exporter's). They are aggregated by the
dcgm join labels and then given the target's remaining join labels from the target-info
signal (:data:`~.target_signals.TARGET_INFO`), one series per sidecar target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, on, selector
from exporter.signatures.signals.target_signals import TARGET_INFO

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

# The join labels a dcgm-exporter series must carry to count: a GPU no pod holds is no
# target's.
DCGM_REQUIRED = ("namespace", "pod")


def dcgm_series(ctx: SignalContext, metric: str, *matchers: str) -> str:
    """A dcgm-exporter series selector: only series attributed to a pod."""
    attributed = [
        f'{dcgm_label}!=""'
        for join_label, dcgm_label in ctx.cfg.dcgm.labels
        if join_label in DCGM_REQUIRED
    ]
    return selector(metric, *matchers, ctx.cfg.selectors.dcgm, attributed)


def _renamed(ctx: SignalContext, expr: str, *, gpu: bool) -> str:
    """dcgm-exporter labels renamed to the join labels (and UUID to uuid)."""
    for join_label, dcgm_label in ctx.cfg.dcgm.labels:
        if join_label != dcgm_label:
            expr = f'label_replace({expr}, "{join_label}", "$1", "{dcgm_label}", "(.*)")'
    if gpu:
        expr = f'label_replace({expr}, "uuid", "$1", "UUID", "(.*)")'
    return expr


def dcgm_per_target(ctx: SignalContext, inner: str, aggregation: str = "avg") -> str:
    """Per-target value from dcgm series ``inner`` (a range function over one metric)."""
    dcgm_join = ctx.cfg.dcgm.target_labels
    grouped = f"{aggregation} {by(dcgm_join)} ({_renamed(ctx, inner, gpu=False)})"
    return f"{grouped}\n* {on(dcgm_join)} group_right ()\n{ctx.name(TARGET_INFO)}"


def dcgm_per_gpu(
    ctx: SignalContext, inner: str, keep: tuple[str, ...] = (), target: Sequence[str] = ()
) -> str:
    """Per-GPU value from dcgm series ``inner``, with the target's join labels; ``target`` are
    matchers on those (a dashboard's variables)."""
    dcgm_join = ctx.cfg.dcgm.target_labels
    rest = [label for label in ctx.join if label not in dcgm_join]
    grouped = f"max {by((*dcgm_join, *GPU_LABELS, *keep))} ({_renamed(ctx, inner, gpu=True)})"
    targets = selector(ctx.name(TARGET_INFO), *target)
    return f"{grouped}\n* {on(dcgm_join)} group_left ({', '.join(rest)})\n{targets}"


def dcgm_matchers(ctx: SignalContext, matchers: Sequence[str]) -> list[str]:
    """``label op value`` matchers on join labels, rewritten for dcgm-exporter's labels (its
    ``exported_pod``); a matcher on a label dcgm-exporter does not carry is left out."""
    renamed = dict(ctx.cfg.dcgm.labels)
    out = []
    for matcher in matchers:
        label = matcher.split("=", 1)[0].rstrip("!~")
        if label in renamed:
            out.append(renamed[label] + matcher[len(label) :])
    return out
