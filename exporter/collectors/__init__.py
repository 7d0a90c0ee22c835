"""The collector table: ``name -> (factory, enabled by default)``.

The CLI derives ``--collector.<name>`` / ``--no-collector.<name>`` from this table, and the app
builds the enabled collectors from it; a new collector is one module plus one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exporter.collectors.base import Collection, Collector
from exporter.config import Settings


@dataclass(frozen=True)
class CollectorEntry:
    factory: Callable[[Settings], Collector]
    enabled_by_default: bool
    help: str


def _nvml(settings: Settings) -> Collector:
    from exporter.backends.nvml_api import NvmlApi  # noqa: PLC0415
    from exporter.collectors.nvml import NvmlCollector  # noqa: PLC0415

    api_factory: Callable[[], NvmlApi]
    if settings.gpu_replay_file is not None:
        from exporter.backends.replay import ReplayApi, load_trace  # noqa: PLC0415

        trace = load_trace(settings.gpu_replay_file)
        api_factory = lambda: ReplayApi(trace)  # noqa: E731
    else:
        from exporter.backends.nvml import PynvmlApi  # noqa: PLC0415

        api_factory = PynvmlApi

    return NvmlCollector(
        api_factory, poll_interval=settings.gpu_poll_interval, deadline=settings.scrape_timeout
    )


def _cpu(settings: Settings) -> Collector:
    from exporter.collectors.cpu import CpuCollector  # noqa: PLC0415

    return CpuCollector(settings.procfs)


COLLECTORS: dict[str, CollectorEntry] = {
    "nvml": CollectorEntry(_nvml, True, "GPU utilisation, HBM bandwidth, power, clocks, Xids"),
    "cpu": CollectorEntry(_cpu, True, "node CPU time by mode, softirq share, softirq vectors"),
}


def build_collectors(settings: Settings) -> list[Collector]:
    """The enabled collectors, in table order."""
    return [
        entry.factory(settings)
        for name, entry in COLLECTORS.items()
        if settings.collectors.get(name, entry.enabled_by_default)
    ]


__all__ = ["COLLECTORS", "Collection", "Collector", "CollectorEntry", "build_collectors"]
