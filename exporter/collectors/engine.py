"""Collector ``engine``: the inference engine's own metrics, normalised to fixed names.

Emits (``engine`` = the engine type; ``model`` from the engine's model label, empty if none;
with several ``--engine.url``, every series also carries ``endpoint``)::

    inference_engine_up{engine}                           last poll succeeded and parsed
    inference_engine_last_success_timestamp_seconds{engine}
    inference_engine_poll_failures_total{engine,reason}   connect, timeout, status, too_large,
                                                          protocol, parse, unrecognised (all
                                                          there from the start, at 0)
    inference_engine_series_dropped_total{engine,metric}  over --engine.max-series
    inference_engine_info{engine,version,model,role}      1 per model of the last good poll
    inference_engine_model_info{engine,model,raw_model,origin}  1 per model: the engine's own
                                                          name for it and where it came from
    inference_engine_model_config_up{engine}              Triton: its model configurations
                                                          answered (which models are steps)
    inference_engine_ensemble_step_info{engine,ensemble,model}  1 per step of each ensemble
    inference_queue_depth{engine,model,role},
    inference_queue_depth_by_reason{engine,model,role,reason},
    inference_queue_depth_by_stage{engine,model,role,stage}, inference_kv_transfer_seconds,
    inference_kv_transfer_bytes_total, inference_kv_transfer_failures_total{...,reason},
    inference_requests_running, inference_kv_cache_usage_ratio,
    inference_kv_cache_capacity_tokens, inference_prompt_tokens_total,
    inference_prompt_tokens_cached_total, inference_generation_tokens_total,
    inference_estimated_flops_total, inference_estimated_read_bytes_total,
    inference_estimated_write_bytes_total,
    inference_time_to_first_token_seconds, inference_inter_token_latency_seconds,
    inference_e2e_request_latency_seconds, inference_queue_time_seconds,
    inference_prefill_time_seconds, inference_decode_time_seconds   (engine's own buckets)

``role`` is the server's part in disaggregated serving (prefill, decode, both): what the
engine's metrics say where they say it, else ``--engine.role``. ``model`` is the name people
read (:func:`exporter.engines.models.readable`: a path becomes the model it holds) of what the
engine's metrics call the model, or, where they call it nothing (llama.cpp, TGI), of what the
engine's API says (``/v1/models``, TGI's ``/info``), asked once each time the endpoint comes up.

A background thread polls every ``--engine.url`` every ``--engine.poll-interval`` with its own
event loop (a hostile or hung engine cannot stall the exporter's HTTP server), each endpoint
on its own (its own deadline, engine type, failures and last good snapshot); ``collect()``
serves the snapshots without waiting. When an endpoint's last success is older than three
intervals its normalised series disappear rather than go stale. After each first success of
an endpoint (and after it recovers or its engine changes) the engine's version endpoint is
asked once, for ``inference_engine_info``. The engine's API (version, model, model
configurations) is on ``--engine.api-url``, by default the metrics URL's host and port (port
8000 where the metrics are on Triton's 8002).

An engine whose API says which models are steps of others (Triton's ensembles:
:class:`exporter.engines.spec.Composition`) is asked each model's configuration once when the
endpoint comes up and again when its set of models changes; the request-level series then
come from the models clients call (:func:`exporter.engines.models.entry_points`). When the
API does not answer, every model counts as before, ``inference_engine_model_config_up`` is 0
and the question is asked again a minute later.

Several endpoints: each keeps its own ``inference_engine_up{engine,endpoint}`` and series
(``endpoint`` is the URL's ``host:port``, plus the path when two URLs share one), so nothing
collides and a rule's ``sum`` over a pod adds disaggregated prefill and decode servers as it
should. A front-end (Dynamo's frontend) polled with the engines behind it counts the same
requests again: the request-level names come from the front-end only and every other name
from the engines only (:func:`exporter.engines.layered`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter import metrics as m
from exporter.backends.http import FetchError, FetchReason, fetch
from exporter.collectors.base import Collection, HttpPollingCollector
from exporter.collectors.engine_families import add_series
from exporter.collectors.shared_state import STALE_INTERVALS, EngineHub, EngineOptions, Shared
from exporter.config import ConfigError, Settings, section
from exporter.engines import (
    BY_ENGINE,
    UnrecognisedError,
    digest,
    layered,
    load_mapping,
    poll_keys,
)
from exporter.engines.models import FROM_METRICS, entry_points, metric_models
from exporter.engines.snapshot import EngineSnapshot, Role
from exporter.engines.spec import Composition
from exporter.priority import SCRAPES

log = logging.getLogger(__name__)

# Normalised series that belong to another collector's family (the tokenizer collector
# exports the engine-reported tokenizer latency next to its own probe's).
FOREIGN = frozenset({"inference_tokenizer_latency_seconds"})
#: Every reason of inference_engine_poll_failures_total: the fetch's and the body's.
REASONS: tuple[str, ...] = (*get_args(FetchReason), "parse", "unrecognised")
MAX_VERSION_BODY = 1024 * 1024
#: Triton's HTTP port where its metrics are on 8002 (its defaults).
API_PORTS = {8002: 8000}
#: Seconds before an API that did not say which models are steps is asked again.
CONFIG_RETRY = 60.0
#: Most model configurations asked per endpoint (a repository of hundreds is rare), and at once.
MAX_CONFIGS, CONFIGS_AT_ONCE = 512, 8


@dataclass
class Endpoint:
    """One polled ``--engine.url``: its label, state and counters."""

    url: str
    label: str
    hub: EngineHub
    failures: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    last_error: str = ""
    # Ask the version endpoint at the next success: first poll, recovery, engine change.
    version_wanted: bool = True
    # The same for the model endpoint, asked only when the metrics name no model.
    model_wanted: bool = True
    # What the engine's API last called its model, and the path that said it.
    api_model: tuple[str, str] = ("", "")
    # The engine's HTTP API (scheme://host:port[/prefix]): version, model, configurations.
    api: str = ""
    # The models the last configurations were asked for (None: ask at the next success),
    # each ensemble's steps they gave (raw names; None: the API did not answer), when to
    # ask again after no answer.
    configs_for: frozenset[str] | None = None
    ensembles: dict[str, tuple[str, ...]] | None = None
    configs_retry_at: float = 0.0


def endpoint_labels(urls: Sequence[str]) -> list[str]:
    """The ``endpoint`` label of each URL: ``host:port``, with the path where two URLs share
    a ``host:port``. Raises :class:`ValueError` when a URL is given twice."""

    def host_port(url: str) -> str:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{host}:{port}"

    short = [host_port(url) for url in urls]
    labels = [
        s if short.count(s) == 1 else s + (urlsplit(url).path or "/")
        for s, url in zip(short, urls, strict=True)
    ]
    for index, label in enumerate(labels):
        if label in labels[:index]:
            raise ValueError(f"{urls[index]!r} is given twice")
    return labels


def default_api(url: str) -> str:
    """The engine's HTTP API for a metrics URL: same scheme and host, port 8000 where the
    metrics are on 8002 (Triton's defaults), else the same port."""
    parts = urlsplit(url)
    netloc = parts.netloc
    port = parts.port
    if port in API_PORTS:
        netloc = f"{netloc.rsplit(':', 1)[0]}:{API_PORTS[port]}"
    return urlunsplit((parts.scheme, netloc, "", "", ""))


def api_url(base: str, path: str) -> str:
    """``path`` (absolute) on the API at ``base`` (which may carry a path prefix)."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


def version_of(body: bytes, keys: Sequence[str]) -> str:
    """The version in a version endpoint's JSON answer: the first of ``keys`` holding a
    string or a number; ``""`` when there is none."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return ""
    if not isinstance(data, dict):
        return ""
    for key in keys:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:100]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    return ""


class EngineCollector(HttpPollingCollector):
    """See the module docstring."""

    name = "engine"

    def __init__(
        self,
        hub: EngineHub,
        url: str,
        *,
        more_urls: Sequence[str] = (),
        api_urls: Sequence[str] = (),
        poll_interval: float = EngineOptions.poll_interval,
        timeout: float = EngineOptions.timeout,
        max_body: int = EngineOptions.max_body,
        max_series: int = EngineOptions.max_series,
        mapping_file: Path | None = None,
        role: Role = "both",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.hub = hub
        self.role = role
        self.url = url
        urls = [url, *more_urls]
        if api_urls and len(api_urls) != len(urls):
            raise ValueError(f"{len(api_urls)} API URLs for {len(urls)} engine URLs")
        apis = list(api_urls) or [default_api(u) for u in urls]
        self.endpoints = [
            Endpoint(u, label, hub if i == 0 else EngineHub(configured=hub.configured), api=a)
            for i, (u, label, a) in enumerate(zip(urls, endpoint_labels(urls), apis, strict=True))
        ]
        self.several = len(self.endpoints) > 1
        self.poll_interval = self.interval = poll_interval
        self.timeout = timeout
        self.max_body = max_body
        self.max_series = max_series
        self.mapping = load_mapping(mapping_file) if mapping_file is not None else None
        # Every engine's families while auto-detecting (one set: the engine may change).
        self._keys = poll_keys(self.mapping)
        self._clock = clock
        self._built: tuple[tuple[object, ...], list[Metric]] | None = None

    # --- polling -----------------------------------------------------------------------------
    async def tick(self, session: aiohttp.ClientSession) -> None:
        """One poll of every endpoint, side by side: fetch, parse, recognise, normalise."""
        await asyncio.gather(*(self._poll(session, ep) for ep in self.endpoints))

    async def _poll(self, session: aiohttp.ClientSession, ep: Endpoint) -> None:
        try:
            result = await fetch(
                session,
                ep.url,
                timeout=self.timeout,
                max_bytes=self.max_body,
                headers={"Accept": "text/plain;version=0.0.4"},
            )
        except FetchError as err:
            self._fail(ep, err.reason, str(err))
            return
        loop = asyncio.get_running_loop()
        try:
            snapshot = await loop.run_in_executor(None, self._digest, result.body, ep)
        except UnrecognisedError as err:
            self._fail(ep, "unrecognised", str(err))
            return
        except ValueError as err:
            self._fail(ep, "parse", str(err))
            return
        if ep.model_wanted:  # read without the API's last answer: does it name its model?
            ep.model_wanted = False
            ep.api_model = ("", "")
            if any(not s.model for s in snapshot.series):
                ep.api_model = await self._model(session, ep, snapshot.engine)
                if ep.api_model[0]:
                    snapshot = await loop.run_in_executor(None, self._digest, result.body, ep)
        spec = BY_ENGINE.get(snapshot.engine)
        if spec is not None and spec.composition is not None:
            snapshot = await self._entry_points(session, ep, snapshot, spec.composition)
        ep.dropped.update(snapshot.dropped)
        if snapshot.version:  # in the metrics themselves (Ray): current at every poll
            with ep.hub.lock:
                ep.hub.version = snapshot.version
        elif ep.version_wanted:
            ep.version_wanted = False
            version = await self._version(session, ep, snapshot.engine)
            with ep.hub.lock:
                ep.hub.version = version
        with ep.hub.lock:
            ep.hub.snapshot = snapshot
            ep.hub.snapshot_at = self._clock()
            ep.hub.last_success_wall = time.time()
            ep.hub.up = True
        if ep.last_error:
            log.info("engine metrics at %s readable again", ep.url)
            ep.last_error = ""

    def _digest(self, body: bytes, ep: Endpoint | None = None) -> EngineSnapshot:
        """One body's snapshot, for ``ep`` (default: the first endpoint)."""
        ep = ep if ep is not None else self.endpoints[0]
        text = body.decode("utf-8", errors="replace")
        # Only the families the rules read are decoded (a vLLM server exposes five times
        # more, a Triton server with many models ten times): same snapshot, less CPU.
        snapshot = digest(
            text,
            ep.hub.configured,
            keys=self._keys,
            mapping=self.mapping,
            max_series=self.max_series,
            pause=SCRAPES.step_aside,  # a scrape in flight goes first (exporter.priority)
            default_model="" if ep.model_wanted else ep.api_model[0],
            model_origin=ep.api_model[1],
        )
        if ep.hub.configured == "auto" and snapshot.engine != ep.hub.detected:
            log.info("engine at %s recognised as %s", ep.url, snapshot.engine)
            ep.hub.detected = snapshot.engine
            ep.version_wanted = ep.model_wanted = True
        return snapshot

    async def _entry_points(
        self,
        session: aiohttp.ClientSession,
        ep: Endpoint,
        snapshot: EngineSnapshot,
        composition: Composition,
    ) -> EngineSnapshot:
        """``snapshot`` counting requests at the models clients call: the configurations are
        asked when the endpoint's models change (and a minute after no answer)."""
        models = metric_models(snapshot)
        now = self._clock()
        if models != ep.configs_for or (ep.ensembles is None and now >= ep.configs_retry_at):
            ep.configs_for = models
            ep.ensembles = await self._configs(session, ep, sorted(models), composition)
            if ep.ensembles is None:
                ep.configs_retry_at = now + CONFIG_RETRY
        if not ep.ensembles:
            return snapshot
        steps = frozenset(step for names in ep.ensembles.values() for step in names)
        return entry_points(snapshot, steps, composition.entry_only)

    async def _configs(
        self,
        session: aiohttp.ClientSession,
        ep: Endpoint,
        models: list[str],
        composition: Composition,
    ) -> dict[str, tuple[str, ...]] | None:
        """Each ensemble among ``models`` with its steps, from the models' configurations;
        None when the API did not answer (logged once per outage). A model whose configuration
        is missing (unloaded since the poll) composes nothing, unless none is there: then the
        URL is not the engine's API."""
        if len(models) > MAX_CONFIGS:
            log.warning(
                "%s serves %d models; only the first %d configurations are read",
                ep.url,
                len(models),
                MAX_CONFIGS,
            )
            models = models[:MAX_CONFIGS]
        gate = asyncio.Semaphore(CONFIGS_AT_ONCE)
        missing: list[str] = []

        async def one(model: str) -> tuple[str, ...] | None:
            path = composition.path.format(model=quote(model, safe=""))
            url = api_url(ep.api, path)
            async with gate:
                try:
                    result = await fetch(
                        session, url, timeout=self.timeout, max_bytes=MAX_VERSION_BODY
                    )
                except FetchError as err:
                    if err.status in (400, 404):  # gone since the poll, or not a model
                        missing.append(model)
                        return ()
                    log.debug("no model configuration from %s: %s", url, err)
                    return None
            try:
                return composition.read(result.body)
            except ValueError as err:
                log.debug("%s: %s", url, err)
                return None

        # One first: a silent API costs one deadline, not one per model.
        first = [await one(models[0])] if models else []
        answers = first + list(await asyncio.gather(*(one(m) for m in models[1:])))
        if any(answer is None for answer in answers) or (models and len(missing) == len(models)):
            if ep.ensembles is not None or ep.configs_retry_at == 0.0:
                log.warning(
                    "no model configurations from %s (--engine.api-url): which models are "
                    "ensemble steps is unknown, so request time counts every model's requests",
                    ep.api,
                )
            return None
        if ep.ensembles is None and ep.configs_retry_at:
            log.info("model configurations from %s readable again", ep.api)
        return {m: steps for m, steps in zip(models, answers, strict=True) if steps}

    async def _version(self, session: aiohttp.ClientSession, ep: Endpoint, engine: str) -> str:
        """The engine's version from its version endpoint, or ``""`` (none, or no answer)."""
        spec = BY_ENGINE.get(engine)
        if spec is None or spec.version.path is None:
            return ""
        url = api_url(ep.api, spec.version.path)
        try:
            result = await fetch(session, url, timeout=self.timeout, max_bytes=MAX_VERSION_BODY)
        except FetchError as err:
            log.debug("no version from %s: %s", url, err)
            return ""
        return version_of(result.body, spec.version.keys)

    async def _model(
        self, session: aiohttp.ClientSession, ep: Endpoint, engine: str
    ) -> tuple[str, str]:
        """What the engine's API calls its model, and the path asked; ``("", "")`` when the
        engine has no such API or did not answer with a name."""
        spec = BY_ENGINE.get(engine)
        if spec is None or spec.model is None:
            return "", ""
        url = api_url(ep.api, spec.model.path)
        try:
            result = await fetch(session, url, timeout=self.timeout, max_bytes=MAX_VERSION_BODY)
        except FetchError as err:
            log.debug("no model name from %s: %s", url, err)
            return "", ""
        name = spec.model.read(result.body)
        return (name, spec.model.path) if name else ("", "")

    def _fail(self, ep: Endpoint, reason: str, message: str) -> None:
        ep.failures[reason] += 1
        # The engine may come back as another version, serving other models.
        ep.version_wanted = ep.model_wanted = True
        ep.configs_for = None
        with ep.hub.lock:
            ep.hub.up = False
        text = f"{reason}: {message}"
        if text != ep.last_error:
            log.warning("engine metrics at %s: %s", ep.url, text)
            ep.last_error = text

    # --- scrape ------------------------------------------------------------------------------
    def collect(self) -> Collection:
        optional = ("endpoint",) if self.several else ()
        up = m.gauge("inference_engine_up", optional)
        ts = m.gauge("inference_engine_last_success_timestamp_seconds", optional)
        failures = m.counter("inference_engine_poll_failures_total", optional)
        dropped = m.counter("inference_engine_series_dropped_total", optional)
        info = m.gauge("inference_engine_info", optional)
        named = m.gauge("inference_engine_model_info", optional)
        config_up = m.gauge("inference_engine_model_config_up", optional)
        steps = m.gauge("inference_engine_ensemble_step_info", optional)
        now = self._clock()
        fresh: list[tuple[Endpoint, str, EngineSnapshot]] = []
        errors: list[str] = []
        for ep in self.endpoints:
            engine = ep.hub.engine
            tail = [ep.label] if self.several else []
            with ep.hub.lock:
                is_up, last_wall, version = ep.hub.up, ep.hub.last_success_wall, ep.hub.version
            up.add_metric([engine, *tail], 1.0 if is_up else 0.0)
            if not is_up:
                errors.append(f"{ep.url}: {ep.last_error}" if self.several else ep.last_error)
            if last_wall is not None:
                ts.add_metric([engine, *tail], last_wall)
            for reason in REASONS:
                failures.add_metric([engine, reason, *tail], float(ep.failures[reason]))
            for metric, count in sorted(ep.dropped.items()):
                dropped.add_metric([engine, metric, *tail], float(count))
            snapshot = ep.hub.fresh(now, STALE_INTERVALS * self.poll_interval)
            if snapshot is not None:
                fresh.append((ep, engine, snapshot))
                models = sorted({s.model for s in snapshot.series if s.name not in FOREIGN})
                role = self.role_of(snapshot)
                for model in models or [""]:
                    info.add_metric([engine, version, model, role, *tail], 1.0)
                for model in models:
                    raw, origin = snapshot.models.get(model, (model, FROM_METRICS))
                    named.add_metric([engine, model, raw, origin, *tail], 1.0)
                self._composition(ep, engine, snapshot, tail=tail, config_up=config_up, steps=steps)
        out = Collection(
            metrics=[up, failures],
            success=not errors,
            error="; ".join(e for e in errors if e),
        )
        out.metrics += [f for f in (ts, dropped, info, named, config_up, steps) if f.samples]
        out.metrics += self._families_of(fresh)
        return out

    @staticmethod
    def _composition(
        ep: Endpoint,
        engine: str,
        snapshot: EngineSnapshot,
        *,
        tail: list[str],
        config_up: GaugeMetricFamily,
        steps: GaugeMetricFamily,
    ) -> None:
        """Whether the endpoint's model configurations answered, and each ensemble's steps
        under the names its series carry (only once they were asked)."""
        spec = BY_ENGINE.get(engine)
        if spec is None or spec.composition is None or ep.configs_for is None:
            return
        ensembles = ep.ensembles
        config_up.add_metric([engine, *tail], 0.0 if ensembles is None else 1.0)
        names = {raw: name for name, (raw, _) in snapshot.models.items()}
        for ensemble, models in sorted((ensembles or {}).items()):
            for model in models:
                labels = [engine, names.get(ensemble, ensemble), names.get(model, model)]
                steps.add_metric([*labels, *tail], 1.0)

    def role_of(self, snapshot: EngineSnapshot) -> Role:
        """The endpoint's role: what its metrics say (SGLang's ``engine_type``), else
        ``--engine.role``."""
        return snapshot.role if snapshot.role is not None else self.role

    def _families_of(self, fresh: list[tuple[Endpoint, str, EngineSnapshot]]) -> list[Metric]:
        """The normalised families of the fresh snapshots, built once per set of snapshots (a
        poll every 5 s, scrapes as often as they come; nobody modifies a family after it is
        built)."""
        key = tuple((id(snap), engine, ep.label) for ep, engine, snap in fresh)
        cached = self._built
        if cached is not None and cached[0] == key:
            return cached[1]
        families: dict[str, Metric] = {}
        kept = layered([snap for _, _, snap in fresh])
        for (ep, engine, snap), series_list in zip(fresh, kept, strict=True):
            endpoint = ep.label if self.several else None
            role = self.role_of(snap)
            for series in series_list:
                if series.name not in FOREIGN:
                    add_series(families, engine, series, series.model, endpoint, role=role)
        built = list(families.values())
        self._built = (key, built)  # one assignment: safe for concurrent scrapes
        return built


# --- construction -----------------------------------------------------------------------------


def check(settings: Settings) -> None:
    """Cross-field checks at start-up: the URLs are distinct, one API URL per engine URL
    where given, the custom mapping is given and valid."""
    opts = section(EngineOptions, settings)
    try:
        endpoint_labels(opts.url)
    except ValueError as err:
        raise ConfigError("--engine.url", str(err)) from None
    if opts.api_url and len(opts.api_url) != len(opts.url):
        raise ConfigError(
            "--engine.api-url",
            f"{len(opts.api_url)} given for {len(opts.url)} --engine.url; give one per "
            "--engine.url, in the same order",
        )
    if opts.type == "custom" and opts.mapping_file is None:
        raise ConfigError("--engine.mapping-file", "required with --engine.type custom")
    if opts.mapping_file is not None:
        try:
            load_mapping(opts.mapping_file)
        except ValueError as err:
            raise ConfigError("--engine.mapping-file", str(err)) from None


def build(settings: Settings, shared: Shared) -> EngineCollector:
    opts = section(EngineOptions, settings)
    first, *more = opts.url
    return EngineCollector(
        shared.engine_hub,
        first,
        more_urls=more,
        api_urls=opts.api_url,
        poll_interval=opts.poll_interval,
        timeout=opts.timeout,
        max_body=opts.max_body,
        max_series=opts.max_series,
        mapping_file=opts.mapping_file,
        role=opts.role,
    )
