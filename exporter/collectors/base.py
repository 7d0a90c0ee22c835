"""What every collector is: a name, an optional background life, and ``collect()``."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric


@dataclass
class Collection:
    """One collector's output for one scrape.

    ``success`` false with metrics is allowed: a collector that lost one GPU still reports
    the others (and says which is missing through its own ``_up`` metrics).
    """

    metrics: list[Metric] = field(default_factory=list)
    success: bool = True
    error: str = ""


class Collector:
    """Base class. Subclasses set ``name`` and implement :meth:`collect`.

    ``collect`` must be cheap (it runs on every scrape, under a deadline): anything that can
    block belongs in a background thread started by :meth:`start`.
    """

    name = ""

    def start(self) -> None:
        """Start background work (pollers). Default: none."""

    def stop(self, timeout: float) -> None:
        """Stop background work within ``timeout`` seconds. Default: none."""

    def wait_ready(self, timeout: float) -> bool:
        """Block until the first reading exists or ``timeout`` passes; True when ready."""
        return True

    def collect(self) -> Collection:
        raise NotImplementedError
