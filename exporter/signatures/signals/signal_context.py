"""What every signal's expression reads: the site config, the names of other signals, the
sidecar's series.

An expression never writes a window or selector itself: it asks the :class:`SignalContext`, so
a site's config regenerates every record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from exporter.config import format_duration
from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, on, selector
from exporter.signatures.signals.guard_signals import HISTORY
from exporter.signatures.site import CLUSTER, SiteConfig

if TYPE_CHECKING:
    from exporter.signatures.signals.signal import Signal

#: The engines that decode: every engine but a disaggregated prefill engine (role ``prefill``),
#: whose one token per request is no decode step. Their queue time holds the KV transfer they
#: observe: a decode engine reads the cache while its request waits (vLLM keeps it in the
#: waiting queue, WAITING_FOR_REMOTE_KVS, and records it scheduled only once the cache is in);
#: a prefill engine that observes the transfer (SGLang's sender) does so after the request left
#: its queue.
DECODES = 'role!="prefill"'

#: Join labels that name one pod: a pool is what the other join labels and the model share.
POD_LABELS = ("pod", "instance")


def pod_labels(ctx: SignalContext) -> tuple[str, ...]:
    """The labels naming the pod that holds a GPU (the node layout's join)."""
    return tuple(label for label in (CLUSTER, "namespace", "pod") if label in ctx.join)


def pool_labels(join: Sequence[str]) -> tuple[str, ...]:
    """The labels of one pool of disaggregated serving, besides ``model``: the join labels
    that do not name one pod (``namespace``, ``job``, ``cluster``)."""
    return tuple(label for label in join if label not in POD_LABELS)


class SignalContext:
    """One site config as the signals' expressions need it.

    ``history_windows`` collects the windows of the history records that expressions read
    themselves (:meth:`history`), so that the cold-start guard records them too.
    """

    def __init__(self, cfg: SiteConfig) -> None:
        self.cfg = cfg
        self.join = cfg.join_labels
        self.by_target = by(self.join)
        self.by_gpu = by((*self.join, *GPU_LABELS))
        self.pool = pool_labels(self.join)
        self.history_windows: set[float] = set()

    def name(self, signal: Signal) -> str:
        """The series another signal is read from in this config (:meth:`Signal.record`)."""
        return signal.record(self.cfg)

    def window(self, name: str) -> str:
        """A look-back window of the site config as PromQL writes it (``5m``)."""
        return format_duration(self.cfg.window_seconds(name))

    def sidecar_series(self, metric: str, *matchers: str) -> str:
        """``metric{...}`` with the site's sidecar matchers and ``matchers``."""
        return selector(metric, self.cfg.selectors.sidecar, *matchers)

    def latest(self, metric: str, *matchers: str) -> str:
        """:meth:`sidecar_series` as its last sample within the ``last_sample`` window: a
        fact, a state or a join read as it is now, through missed scrapes. A failed scrape
        marks every series of the target stale at once, and an instant read then finds
        nothing for one evaluation: every alert that reads the record restarts its ``for``
        (a 15m ``for`` with one failed scrape of the target in each 15m never fires)."""
        return self.last(self.sidecar_series(metric, *matchers))

    def last(self, series: str) -> str:
        """Any series selector (kube-state-metrics', dcgm-exporter's) as its last sample within
        the ``last_sample`` window, as :meth:`latest` reads the sidecars'."""
        return f"last_over_time({series}[{self.window('last_sample')}])"

    def queue_less_transfer(self, labels: Sequence[str], window: str, *matchers: str) -> str:
        """Seconds per second requests wait in the engines' queue, grouped by ``labels``, less
        the KV transfer where it is part of that wait (:data:`DECODES`): the
        transfer has a share of its own, counted once. At most the queue time is taken
        away (an engine that starts the queue clock after the transfer loses no more than
        its queue); engines without transfer metrics keep their queue time as it is.

        ``max(queue - transfer, 0)`` where a transfer is counted, else the queue: each rate
        read twice at most (the queue) and once (the transfer), where taking away
        ``min(transfer, queue)`` read the queue four times and the transfer twice."""
        group, match = by(labels), on(labels)
        queue = self.sidecar_series("inference_queue_time_seconds_sum", *matchers)
        transfer = self.sidecar_series("inference_kv_transfer_seconds_sum", DECODES, *matchers)
        waited = f"sum {group} (rate({queue}[{window}]))"
        moved = f"sum {group} (rate({transfer}[{window}]))"
        return f"(\nclamp_min(\n{waited}\n- {match}\n{moved},\n0\n)\nor {match}\n{waited}\n)"

    def history(self, seconds: float) -> str:
        """The cold-start guard's history record of ``seconds``, for an expression that reads
        it itself (the guard then records that window too)."""
        self.history_windows.add(seconds)
        return self.name(HISTORY.at(seconds))
