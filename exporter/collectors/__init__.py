"""The collector table: ``name -> (factory, enabled by default)``.

The CLI derives ``--collector.<name>`` / ``--no-collector.<name>`` from this table, and the app
builds the enabled collectors from it; a new collector is one module plus one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.collectors.base import Collection, Collector
from exporter.config import Settings

if TYPE_CHECKING:
    from exporter.collectors.engine import EngineHub


# Seconds between scans of the node's processes (see ProcessCollector).
PROCESS_SCAN_INTERVAL = 5.0


@dataclass
class Shared:
    """State that collectors of one exporter share (built once per :func:`build_collectors`)."""

    settings: Settings
    _hub: EngineHub | None = field(default=None, repr=False)

    @property
    def engine_hub(self) -> EngineHub:
        if self._hub is None:
            from exporter.collectors.engine import EngineHub  # noqa: PLC0415

            self._hub = EngineHub(configured=self.settings.engine_type)
        return self._hub


@dataclass(frozen=True)
class CollectorEntry:
    factory: Callable[[Settings, Shared], Collector]
    enabled_by_default: bool
    help: str


def _nvml(settings: Settings, shared: Shared) -> Collector:
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

    devices = frozenset(d.strip() for d in settings.gpu_devices.split(",") if d.strip())
    return NvmlCollector(
        api_factory,
        poll_interval=settings.gpu_poll_interval,
        deadline=settings.scrape_timeout,
        devices=devices,
    )


def _cpu(settings: Settings, shared: Shared) -> Collector:
    from exporter.collectors.cpu import CpuCollector  # noqa: PLC0415

    return CpuCollector(settings.procfs)


def _engine(settings: Settings, shared: Shared) -> Collector:
    from exporter.collectors.engine import EngineCollector  # noqa: PLC0415

    return EngineCollector(
        shared.engine_hub,
        settings.engine_url,
        poll_interval=settings.engine_poll_interval,
        timeout=settings.engine_timeout,
        max_body=settings.engine_max_body,
        max_series=settings.engine_max_series,
        mapping_file=settings.engine_mapping_file,
    )


def _tokenizer(settings: Settings, shared: Shared) -> Collector:
    from exporter.collectors.tokenizer import TokenizerCollector, load_prompt  # noqa: PLC0415

    return TokenizerCollector(
        shared.engine_hub,
        settings.engine_url,
        url=settings.tokenizer_url,
        interval=settings.tokenizer_probe_interval,
        timeout=settings.engine_timeout,
        prompt=load_prompt(settings.tokenizer_prompt_file),
        model=settings.tokenizer_model,
        engine_poll_interval=settings.engine_poll_interval,
    )


def _process(settings: Settings, shared: Shared) -> Collector:
    from exporter.collectors.process import ProcessCollector  # noqa: PLC0415

    return ProcessCollector(settings.process_match, interval=PROCESS_SCAN_INTERVAL)


COLLECTORS: dict[str, CollectorEntry] = {
    "nvml": CollectorEntry(_nvml, True, "GPU utilisation, HBM bandwidth, power, clocks, Xids"),
    "cpu": CollectorEntry(_cpu, True, "node CPU time by mode, softirq share, softirq vectors"),
    "engine": CollectorEntry(_engine, True, "the engine's queue, batch, KV cache and latencies"),
    "tokenizer": CollectorEntry(_tokenizer, True, "active probe of the engine's tokenizer"),
    "process": CollectorEntry(_process, True, "CPU of the engine's processes and hottest thread"),
}


def build_collectors(settings: Settings) -> list[Collector]:
    """The enabled collectors, in table order."""
    shared = Shared(settings)
    return [
        entry.factory(settings, shared)
        for name, entry in COLLECTORS.items()
        if settings.collectors.get(name, entry.enabled_by_default)
    ]


__all__ = ["COLLECTORS", "Collection", "Collector", "CollectorEntry", "build_collectors"]
