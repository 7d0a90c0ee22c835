"""Records over the sidecar's one build-info series per scrape target: the join labels that
dcgm-exporter series borrow, and the cold-start guard's history."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.config import format_duration
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.records.record_context import RecordContext

BUILD_INFO = "inference_exporter_build_info"


def join_records(ctx: RecordContext) -> list[RecordingRule]:
    """The join labels of each target, for dcgm-exporter's and the node agent's series; the
    sidecar's profiles have nothing to join and do not record them."""
    if not (ctx.from_dcgm or ctx.from_node):
        return []
    return [
        RecordingRule(
            ctx.records.target_info,
            f"group {ctx.by_target} ({ctx.sidecar_series(BUILD_INFO)})",
            "1 per sidecar scrape target: the join labels every other record carries",
        )
    ]


def history_records(ctx: RecordContext, windows: Sequence[float]) -> list[RecordingRule]:
    """The cold-start guard's records: one per window the other records read.

    A rate over a window that holds only the last minute of data reads low (Prometheus
    divides the extrapolated increase by the whole window), a regression over two points is
    noise: after a restart of Prometheus, or for a new pod, a signature would go pending on
    a half-empty window. ``history<w>`` is 1 for a target whose sidecar was scraped
    between ``2w`` and ``w`` ago - its series reach back a whole window - and absent
    before; an alert reading a record of window ``w`` requires it (``and on (<join>)``).
    One series per target and window, over the one build-info series of each target.
    """
    info = ctx.sidecar_series(BUILD_INFO)
    rules = []
    for seconds in windows:
        window = format_duration(seconds)
        rules.append(
            RecordingRule(
                ctx.records.history(seconds),
                f"group {ctx.by_target} (max_over_time({info}[{window}] offset {window}))",
                f"1 per sidecar target with at least {window} of history: the "
                f"cold-start guard of the alerts over {window} windows",
                window=0.0,
            )
        )
    return rules
