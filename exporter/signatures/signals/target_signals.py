"""The target itself: the join labels that the node agent's and dcgm-exporter's series borrow
from the sidecar's one build-info series per scrape target."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.signals.guard_signals import BUILD_INFO
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_groups import TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def _target_info(ctx: SignalContext) -> str:
    return f"group {ctx.by_target} ({ctx.sidecar_series(BUILD_INFO)})"


_JOIN = Rule(
    _target_info, "1 per sidecar scrape target: the join labels every other record carries"
)

#: 1 per sidecar scrape target, with its join labels: what a GPU series from the node agent or
#: dcgm-exporter is joined to. The sidecar layout has nothing to join and does not record it.
TARGET_INFO = Signal(
    "inference:exporter_build_info:group",
    "flag",
    TARGET_GROUP,
    ByLayout(sidecar=None, node=_JOIN, dcgm=_JOIN),
    "sidecar target",
)
