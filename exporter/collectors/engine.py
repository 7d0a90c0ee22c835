"""Collector ``engine``: the inference engine's own metrics, normalised to fixed names.

Emits (``engine`` = the engine type; ``model`` from the engine's model label, empty if none)::

    inference_engine_up{engine}                           last poll succeeded and parsed
    inference_engine_last_success_timestamp_seconds{engine}
    inference_engine_poll_failures_total{engine,reason}   connect, timeout, status, too_large,
                                                          protocol, parse, unrecognised
    inference_engine_series_dropped_total{engine,metric}  over --engine.max-series
    inference_queue_depth{engine,model}, inference_requests_running, inference_kv_cache_usage_ratio
    inference_prompt_tokens_total, inference_generation_tokens_total
    inference_time_to_first_token_seconds, inference_inter_token_latency_seconds,
    inference_e2e_request_latency_seconds, inference_queue_time_seconds,
    inference_prefill_time_seconds, inference_decode_time_seconds   (engine's own buckets)

A background thread polls ``--engine.url`` every ``--engine.poll-interval`` with its own event
loop (a hostile or hung engine cannot stall the exporter's HTTP server) and keeps the last good
snapshot; ``collect()`` serves it without waiting. When the last success is older than three
intervals the normalised series disappear rather than go stale.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.backends.http import FetchError, fetch
from exporter.collectors.base import Collection, HttpPollingCollector, Shared
from exporter.config import ConfigError, Option, Settings, section
from exporter.engines import (
    ENGINES,
    detect_names,
    load_mapping,
    normalise,
    parse_exposition,
    select_families,
    source_keys,
)
from exporter.engines.model import EngineSnapshot, Series
from exporter.priority import SCRAPES

log = logging.getLogger(__name__)

# Normalised series that belong to another collector's family (the tokenizer collector
# exports the engine-reported tokenizer latency next to its own probe's).
FOREIGN = frozenset({"inference_tokenizer_latency_seconds"})
STALE_INTERVALS = 3
DEFAULT_POLL_INTERVAL = 5.0
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_BODY = 16 * 1024**2
DEFAULT_MAX_SERIES = 1000


@dataclass
class EngineHub:
    """What the engine collector learned, shared with the tokenizer collector."""

    configured: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    detected: str | None = None
    snapshot: EngineSnapshot | None = None
    snapshot_at: float = 0.0
    last_success_wall: float | None = None
    up: bool = False

    @property
    def engine(self) -> str:
        """The engine label: the configured type, else the detected one, else ``unknown``."""
        if self.configured != "auto":
            return self.configured
        return self.detected or "unknown"

    def models(self) -> list[str]:
        with self.lock:
            snap = self.snapshot
        return sorted({s.model for s in snap.series if s.model}) if snap else []

    def fresh(self, now: float, max_age: float) -> EngineSnapshot | None:
        with self.lock:
            if self.snapshot is not None and now - self.snapshot_at <= max_age:
                return self.snapshot
        return None


def add_series(families: dict[str, Metric], engine: str, series: Series, extra: str) -> None:
    """Add one normalised series to its family (created from the catalogue on first use).

    ``extra`` is the second label's value: the model for engine metrics, the source for the
    tokenizer latency.
    """
    labels = [engine, extra]
    fam = families.get(series.name)
    if series.kind == "histogram":
        hist = fam if isinstance(fam, HistogramMetricFamily) else m.histogram(series.name)
        hist.add_metric(labels, [(_bound(le), c) for le, c in series.buckets], series.sum)
        families[series.name] = hist
    elif series.kind == "counter":
        counter = fam if isinstance(fam, CounterMetricFamily) else m.counter(series.name)
        counter.add_metric(labels, series.value)
        families[series.name] = counter
    else:
        gauge = fam if isinstance(fam, GaugeMetricFamily) else m.gauge(series.name)
        gauge.add_metric(labels, series.value)
        families[series.name] = gauge


def _bound(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(float(le))


class EngineCollector(HttpPollingCollector):
    """See the module docstring."""

    name = "engine"

    def __init__(
        self,
        hub: EngineHub,
        url: str,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        max_body: int = DEFAULT_MAX_BODY,
        max_series: int = DEFAULT_MAX_SERIES,
        mapping_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.hub = hub
        self.url = url
        self.poll_interval = self.interval = poll_interval
        self.timeout = timeout
        self.max_body = max_body
        self.max_series = max_series
        self.mapping = load_mapping(mapping_file) if mapping_file is not None else None
        # Every engine's families while auto-detecting (one set: the engine may change).
        self._keys = frozenset().union(*(source_keys(e, self.mapping) for e in ENGINES))
        self._clock = clock
        self._failures: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()
        self._last_error = ""
        self._built: tuple[EngineSnapshot, str, list[Metric]] | None = None

    # --- polling -----------------------------------------------------------------------------
    async def tick(self, session: aiohttp.ClientSession) -> None:
        """One poll: fetch, parse, recognise, normalise, publish."""
        try:
            result = await fetch(
                session,
                self.url,
                timeout=self.timeout,
                max_bytes=self.max_body,
                headers={"Accept": "text/plain;version=0.0.4"},
            )
        except FetchError as err:
            self._fail(err.reason, str(err))
            return
        loop = asyncio.get_running_loop()
        try:
            snapshot = await loop.run_in_executor(None, self._digest, result.body)
        except ValueError as err:
            reason = "unrecognised" if "recognise" in str(err) else "parse"
            self._fail(reason, str(err))
            return
        self._dropped.update(snapshot.dropped)
        with self.hub.lock:
            self.hub.snapshot = snapshot
            self.hub.snapshot_at = self._clock()
            self.hub.last_success_wall = time.time()
            self.hub.up = True
        if self._last_error:
            log.info("engine metrics at %s readable again", self.url)
            self._last_error = ""

    def _digest(self, body: bytes) -> EngineSnapshot:
        text = body.decode("utf-8", errors="replace")
        # Only the families the rules read are parsed (a vLLM server exposes five times
        # more, a Triton server with many models ten times): same snapshot, less CPU.
        pause = SCRAPES.step_aside  # a scrape in flight goes first (exporter.priority)
        selected, names, samples = select_families(text, self._keys, pause)
        families = parse_exposition(selected, pause)
        engine = self.hub.configured
        if engine == "auto":
            found = detect_names(names, samples)
            if found is None:
                parse_exposition(text)  # not an exposition at all: a parse failure, as before
                raise ValueError("could not recognise the engine from its metric names")
            if found != self.hub.detected:
                log.info("engine at %s recognised as %s", self.url, found)
                self.hub.detected = found
            engine = found
        return normalise(families, engine, mapping=self.mapping, max_series=self.max_series)

    def _fail(self, reason: str, message: str) -> None:
        self._failures[reason] += 1
        with self.hub.lock:
            self.hub.up = False
        text = f"{reason}: {message}"
        if text != self._last_error:
            log.warning("engine metrics at %s: %s", self.url, text)
            self._last_error = text

    # --- scrape ------------------------------------------------------------------------------
    def collect(self) -> Collection:
        engine = self.hub.engine
        up = m.gauge("inference_engine_up")
        with self.hub.lock:
            is_up, last_wall = self.hub.up, self.hub.last_success_wall
        up.add_metric([engine], 1.0 if is_up else 0.0)
        out = Collection(metrics=[up], success=is_up, error="" if is_up else self._last_error)
        if last_wall is not None:
            ts = m.gauge("inference_engine_last_success_timestamp_seconds")
            ts.add_metric([engine], last_wall)
            out.metrics.append(ts)
        failures = m.counter("inference_engine_poll_failures_total")
        for reason, count in sorted(self._failures.items()):
            failures.add_metric([engine, reason], float(count))
        dropped = m.counter("inference_engine_series_dropped_total")
        for metric, count in sorted(self._dropped.items()):
            dropped.add_metric([engine, metric], float(count))
        out.metrics += [f for f in (failures, dropped) if f.samples]
        snapshot = self.hub.fresh(self._clock(), STALE_INTERVALS * self.poll_interval)
        if snapshot is not None:
            out.metrics += self._families_of(snapshot, engine)
        return out

    def _families_of(self, snapshot: EngineSnapshot, engine: str) -> list[Metric]:
        """The normalised families of a snapshot, built once per snapshot (a poll every 5 s,
        scrapes as often as they come; nobody modifies a family after it is built)."""
        cached = self._built
        if cached is not None and cached[0] is snapshot and cached[1] == engine:
            return cached[2]
        families: dict[str, Metric] = {}
        for series in snapshot.series:
            if series.name not in FOREIGN:
                add_series(families, engine, series, series.model)
        built = list(families.values())
        self._built = (snapshot, engine, built)  # one assignment: safe for concurrent scrapes
        return built


# --- flags and construction -------------------------------------------------------------------

OPTIONS: tuple[Option, ...] = (
    Option(
        "engine.url",
        "url",
        "http://127.0.0.1:8000/metrics",
        "The engine's own Prometheus endpoint (configuration only, never taken from a request).",
        metavar="URL",
        attr="url",
    ),
    Option(
        "engine.type",
        "choice",
        "auto",
        "Engine whose metric names to read; auto recognises it from the names.",
        choices=("auto", *ENGINES),
        attr="type",
    ),
    Option(
        "engine.mapping-file",
        "path",
        None,
        "YAML mapping of an in-house server's metrics to the normalised names (engine.type "
        "custom; docs/engines.md).",
        metavar="PATH",
        attr="mapping_file",
    ),
    Option(
        "engine.poll-interval",
        "duration",
        DEFAULT_POLL_INTERVAL,
        "How often the engine's metrics are polled (off the scrape path).",
        minimum=0.5,
        maximum=300.0,
        metavar="DURATION",
        attr="poll_interval",
    ),
    Option(
        "engine.timeout",
        "duration",
        DEFAULT_TIMEOUT,
        "Deadline of one engine poll, body included (slow-drip bodies are cut).",
        minimum=0.1,
        maximum=60.0,
        metavar="DURATION",
        attr="timeout",
    ),
    Option(
        "engine.max-body",
        "bytes",
        DEFAULT_MAX_BODY,
        "Largest engine response read; a larger one is a failed poll.",
        minimum=1024,
        maximum=1024**3,
        metavar="SIZE",
        attr="max_body",
    ),
    Option(
        "engine.max-series",
        "int",
        DEFAULT_MAX_SERIES,
        "Most normalised series kept per metric; the rest are dropped and counted.",
        minimum=1,
        maximum=1_000_000,
        metavar="N",
        attr="max_series",
    ),
)


@dataclass(frozen=True)
class EngineOptions:
    url: str
    type: str
    mapping_file: Path | None
    poll_interval: float
    timeout: float
    max_body: int
    max_series: int


def check(settings: Settings) -> None:
    """Cross-field checks at start-up: the custom mapping is given and valid."""
    opts = section(EngineOptions, OPTIONS, settings)
    if opts.type == "custom" and opts.mapping_file is None:
        raise ConfigError("--engine.mapping-file", "required with --engine.type custom")
    if opts.mapping_file is not None:
        try:
            load_mapping(opts.mapping_file)
        except ValueError as err:
            raise ConfigError("--engine.mapping-file", str(err)) from None


def build(settings: Settings, shared: Shared) -> EngineCollector:
    opts = section(EngineOptions, OPTIONS, settings)
    return EngineCollector(
        shared.engine_hub,
        opts.url,
        poll_interval=opts.poll_interval,
        timeout=opts.timeout,
        max_body=opts.max_body,
        max_series=opts.max_series,
        mapping_file=opts.mapping_file,
    )
