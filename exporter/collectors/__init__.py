"""The collector table: ``name -> (module, options, enabled by default, help)``.

Each collector module declares its own flags (an options dataclass whose fields are declared
with :func:`exporter.config.flag`), checks them across fields (``check(settings)``) and builds
its collector (``build(settings, shared)``), as node_exporter's collectors register theirs. The
CLI derives every serve flag from :func:`serve_options`: the server's own options, each
collector's, and ``--collector.<name>`` / ``--no-collector.<name>`` from this table; a new
collector is one module plus one row here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from exporter.collectors import (
    cpu,
    engine,
    model_facts,
    nvml,
    podresources,
    process,
    tokenizer,
)
from exporter.collectors.base import Collection, Collector
from exporter.collectors.shared_state import EngineHub, EngineOptions, EnginePids, Shared
from exporter.config import (
    CORE_OPTIONS,
    Option,
    Settings,
    collector_option,
    options_of,
    section,
)


@dataclass(frozen=True)
class CollectorEntry:
    module: ModuleType
    #: The collector's options dataclass: its flags.
    options_class: type
    enabled_by_default: bool
    help: str

    @property
    def options(self) -> tuple[Option, ...]:
        return options_of(self.options_class)

    def check(self, settings: Settings) -> None:
        self.module.check(settings)

    def build(self, settings: Settings, shared: Shared) -> Collector:
        build: Callable[[Settings, Shared], Collector] = self.module.build
        return build(settings, shared)


COLLECTORS: dict[str, CollectorEntry] = {
    "nvml": CollectorEntry(
        nvml, nvml.NvmlOptions, True, "GPU utilisation, HBM bandwidth, power, clocks, Xids"
    ),
    "cpu": CollectorEntry(
        cpu, cpu.CpuOptions, True, "node CPU time by mode, softirq share, softirq vectors"
    ),
    "engine": CollectorEntry(
        engine, EngineOptions, True, "the engine's queue, batch, KV cache and latencies"
    ),
    "tokenizer": CollectorEntry(
        tokenizer, tokenizer.TokenizerOptions, True, "active probe of the engine's tokenizer"
    ),
    "process": CollectorEntry(
        process,
        process.ProcessOptions,
        True,
        "CPU of the engine's processes and hottest thread",
    ),
    "model": CollectorEntry(
        model_facts,
        model_facts.ModelOptions,
        True,
        "the served model's weight and KV bytes, FLOPs per token",
    ),
    "podresources": CollectorEntry(
        podresources,
        podresources.PodResourcesOptions,
        False,
        "which pod holds each GPU, from the kubelet (the node agent)",
    ),
}


def serve_options() -> tuple[Option, ...]:
    """Every ``serve`` option: the server's, each collector's, then the collector toggles."""
    own = tuple(option for entry in COLLECTORS.values() for option in entry.options)
    toggles = tuple(
        collector_option(name, entry.enabled_by_default, entry.help)
        for name, entry in COLLECTORS.items()
    )
    return CORE_OPTIONS + own + toggles


def check_settings(settings: Settings) -> None:
    """Every collector's cross-field checks (whether enabled or not: a config is valid or not
    whatever is switched on today). Raises :class:`~exporter.config.ConfigError`."""
    for entry in COLLECTORS.values():
        entry.check(settings)


def default_settings(**overrides: Any) -> Settings:
    """Settings from every option's default, with ``overrides`` by option name (dots and dashes
    as ``_``, e.g. ``scrape_timeout=0.5``): for tests and for code that embeds the exporter."""
    options = serve_options()
    by_dest = {option.dest: option for option in options}
    unknown = sorted(set(overrides) - set(by_dest))
    if unknown:
        raise TypeError(f"unknown option {unknown[0]!r}")
    values: dict[str, Any] = {option.name: option.default for option in options}
    values.update({by_dest[dest].name: value for dest, value in overrides.items()})
    sources: Mapping[str, str] = {name: "default" for name in values}
    return Settings.of(values, sources)


def build_shared(settings: Settings) -> Shared:
    """The state the collectors share: the engine hub starts from the configured engine type
    (``--engine.type``), the engine's PIDs unknown until the process collector's first scan."""
    configured = section(EngineOptions, settings).type
    return Shared(engine_hub=EngineHub(configured=configured), engine_pids=EnginePids())


def build_collectors(settings: Settings) -> list[Collector]:
    """The enabled collectors, in table order, sharing one :class:`Shared`."""
    shared = build_shared(settings)
    return [
        entry.build(settings, shared)
        for name, entry in COLLECTORS.items()
        if settings.collectors.get(name, entry.enabled_by_default)
    ]


__all__ = [
    "COLLECTORS",
    "Collection",
    "Collector",
    "CollectorEntry",
    "build_collectors",
    "build_shared",
    "check_settings",
    "default_settings",
    "serve_options",
]
