"""The cold-start guard's signals: how much history a target, or a pool, has.

A rate over a window that holds only the last minute of data reads low (Prometheus divides the
extrapolated increase by the whole window), a regression over two points is noise: after a
restart of Prometheus, or for a new pod, a signature would go pending on a half-empty window.
``history<w>`` is 1 for a target whose sidecar was scraped between ``2w`` and ``w`` ago - its
series reach back a whole window - and absent before; an alert reading a signal of window ``w``
requires it (``and on (<join>)``). One series per target and window, over the one build-info
series of each target. The pools of disaggregated serving have their own, per pool and model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.config import format_duration
from exporter.signatures.promql_text import by
from exporter.signatures.signals.signal import PerWindow
from exporter.signatures.signals.signal_groups import POOL_GROUP, TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

BUILD_INFO = "inference_exporter_build_info"


def _target_history(ctx: SignalContext, seconds: float) -> str:
    window = format_duration(seconds)
    info = ctx.sidecar_series(BUILD_INFO)
    return f"group {ctx.by_target} (max_over_time({info}[{window}] offset {window}))"


def _pool_history(ctx: SignalContext, seconds: float) -> str:
    window = format_duration(seconds)
    info = ctx.sidecar_series("inference_engine_info")
    return f"group {by((*ctx.pool, 'model'))} (max_over_time({info}[{window}] offset {window}))"


#: 1 per sidecar target with a window of history (one signal per window the others read).
HISTORY = PerWindow(
    "inference:exporter_build_info:history{window}",
    TARGET_GROUP,
    _target_history,
    lambda window: (
        f"1 per sidecar target with at least {window} of history: the cold-start guard of "
        f"the alerts over {window} windows"
    ),
)

#: 1 per pool and model whose engines have a window of history.
POOL_HISTORY = PerWindow(
    "inference_pool:engine_info:history{window}",
    POOL_GROUP,
    _pool_history,
    lambda window: (
        f"1 per pool and model whose engines have {window} of history: the cold-start guard "
        f"of the pool signatures over {window} windows"
    ),
)
