"""The target itself: the join labels that the node agent's and dcgm-exporter's series borrow
from the sidecar's one build-info series per scrape target."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from exporter.signatures.promql_text import by, on
from exporter.signatures.signals.guard_signals import BUILD_INFO
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_context import pod_labels
from exporter.signatures.signals.signal_groups import TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def _through_missed_scrapes(ctx: SignalContext, one_per: Sequence[str], *matchers: str) -> str:
    """One series per target from the sidecars' build info (``matchers`` narrow it): as scraped
    now, else (a failed scrape marks every series of the target stale, and every GPU record
    joined to it would vanish for an evaluation and restart its alerts' ``for``) as last
    scraped within the ``last_sample`` window. The last samples hold only where they name one
    target per ``one_per`` (the labels the readers join on): a pod replaced under the same
    name (a new ``instance``) has two there for a while, and a duplicate would fail every
    reader's join, for every pod; then the target scraped now stands alone (none, if its
    scrape failed)."""
    group, match = by(ctx.join), on(one_per)
    last = f"group {group} ({ctx.latest(BUILD_INFO, *matchers)})"
    # `or` without `on`: where the fallback is held back, the target scraped now has other
    # labels (its new instance) and still comes in; where both hold, they are one series.
    unique = f"(\n{last}\nunless {match}\ncount {by(one_per)} ({last}) > 1\n)"
    return f"{unique}\nor\ngroup {group} ({ctx.sidecar_series(BUILD_INFO, *matchers)})"


def _target_info(ctx: SignalContext) -> str:
    return _through_missed_scrapes(ctx, ctx.cfg.dcgm.target_labels)


_JOIN = Rule(
    _target_info,
    "1 per sidecar scrape target: the join labels every other record carries (through "
    "missed scrapes, as last scraped within the last_sample window)",
)


_IS_POD = ('namespace!=""', 'pod!=""')


def _target_pods(ctx: SignalContext) -> str:
    """Pods only: the node agent's series name the pod holding each GPU, and static targets
    (no pod) would all meet in one empty match group of the readers' joins."""
    return _through_missed_scrapes(ctx, pod_labels(ctx), *_IS_POD)


#: 1 per sidecar scrape target, with its join labels: what a GPU series from the node agent or
#: dcgm-exporter is joined to. The sidecar layout has nothing to join and does not record it.
TARGET_INFO = Signal(
    "inference:exporter_build_info:group",
    "flag",
    TARGET_GROUP,
    ByLayout(
        sidecar=None,
        node=Rule(
            _target_pods,
            "1 per sidecar scrape target that is a pod: the join labels every other record "
            "carries (through missed scrapes, as last scraped within the last_sample window)",
        ),
        dcgm=_JOIN,
    ),
    "sidecar target",
)
