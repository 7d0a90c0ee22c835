"""Collector ``tokenizer``: an active probe of the engine's tokenizer (of the first
``--engine.url`` when several are polled).

No mainstream engine exports tokenizer latency, yet "tokenizer slower than a decode step" is a
key CPU-side signature. Every ``--tokenizer.probe-interval`` (default 15 s) the probe sends
three requests to the engine's tokenize endpoint, one after the other: a 1-token prompt, a
~512-token one, the 1-token prompt again. The 1-token round trip is HTTP plus the front-end's
event loop; the long round trip less the faster of the two short ones is the tokenizer's own
time. One short round trip alone, inflated by a busy host (a scheduler's wait, a garbage
collection), made the difference read low: a 38.5 ms tokenizer read 20 ms on a loaded CI
machine; the faster of two taken around the long one is what the long one's overhead was at
most. A saturated front-end slows every round trip, which is itself a signal (the first short
round trip is the one ``inference_tokenizer_probe_rtt_seconds`` observes).
Cost: three small requests per interval (one tokenizes the long prompt), 0.2 requests per
second at defaults.

Emits (label ``engine``)::

    inference_tokenizer_latency_seconds{engine,source="probe"}   long minus the faster short
    inference_tokenizer_latency_seconds{engine,source="engine"}  as the engine reports it
                                      (TGI validation time as a proxy; instrumented servers)
    inference_tokenizer_probe_rtt_seconds{engine}                1-token round trip
    inference_tokenizer_probe_tokens{engine}                     tokens returned for the prompt
    inference_tokenizer_probes_total{engine}, inference_tokenizer_probe_failures_total{engine}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.backends.http import FetchError, fetch
from exporter.collectors.base import Collection, HttpPollingCollector
from exporter.collectors.engine_families import add_series
from exporter.collectors.shared_state import STALE_INTERVALS, EngineHub, EngineOptions, Shared
from exporter.config import ConfigError, Settings, flag, parse_url, section
from exporter.engines import BY_ENGINE
from exporter.engines.spec import Tokenize, token_count

log = logging.getLogger(__name__)

SHORT_PROMPT = "Hi"
MAX_RESPONSE = 4 * 1024 * 1024


@dataclass(frozen=True)
class TokenizerOptions:
    """The flags of the ``tokenizer`` collector (it also reads the engine's URL, timeout and
    poll interval)."""

    probe_interval: float = flag(
        "tokenizer.probe-interval",
        15.0,
        "How often the tokenizer probe runs: a 1-token, a ~512-token and the 1-token tokenize "
        "request again each time.",
        kind="duration",
        bounds=(1.0, 3600.0),
        metavar="DURATION",
    )
    url: str = flag(
        "tokenizer.url",
        "",
        "Tokenize endpoint; empty: the engine URL's host with the engine's tokenize path.",
        kind="str",
        metavar="URL",
    )
    prompt_file: Path | None = flag(
        "tokenizer.prompt-file",
        None,
        "Text of the probe prompt (default: a bundled ~512-token prompt).",
        kind="path",
        metavar="PATH",
    )
    model: str = flag(
        "tokenizer.model",
        "",
        "Model name sent with the probe where the engine wants one (default: from the engine's "
        "metrics).",
        kind="str",
        metavar="NAME",
    )


def default_prompt() -> str:
    return resources.files("exporter").joinpath("data/tokenizer-probe.txt").read_text("utf-8")


def request_body(engine: str, text: str, model: str) -> dict[str, Any]:
    """The tokenize request of the engine's API (vLLM and SGLang when the engine is unknown)."""
    spec = BY_ENGINE.get(engine)
    tokenize = spec.tokenize if spec is not None and spec.tokenize is not None else Tokenize()
    return tokenize.body(text, model)


class TokenizerCollector(HttpPollingCollector):
    """See the module docstring."""

    name = "tokenizer"

    def __init__(
        self,
        hub: EngineHub,
        engine_url: str,
        *,
        url: str = TokenizerOptions.url,
        interval: float = TokenizerOptions.probe_interval,
        timeout: float = EngineOptions.timeout,
        prompt: str | None = None,
        model: str = TokenizerOptions.model,
        engine_poll_interval: float = EngineOptions.poll_interval,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.hub = hub
        self.engine_url = engine_url
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self.prompt = prompt if prompt is not None else default_prompt()
        self.model = model
        self.engine_poll_interval = engine_poll_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._latency = m.BucketCounts(m.TOKENIZER_BUCKETS)
        self._rtt = m.BucketCounts(m.TOKENIZER_BUCKETS)
        self._tokens: float | None = None
        self._probes = 0
        self._failures = 0
        self._last_ok: bool | None = None
        self._last_error = ""

    # --- probing -----------------------------------------------------------------------------
    def target(self) -> tuple[str, str] | None:
        """(engine, tokenize URL), or None while the engine type is unknown."""
        engine = self.hub.engine
        if self.url:
            return engine, self.url
        spec = BY_ENGINE.get(engine)
        if spec is None or spec.tokenize is None:
            return None
        path = spec.tokenize.path
        parts = urlsplit(self.engine_url)
        return engine, urlunsplit((parts.scheme, parts.netloc, path, "", ""))

    def wait_ready(self, timeout: float) -> bool:
        # The first probe may wait for the engine to be recognised: never hold readiness.
        return True

    async def tick(self, session: aiohttp.ClientSession) -> None:
        target = self.target()
        if target is None:
            engine = self.hub.engine
            why = (
                "engine type not recognised yet"
                if engine == "unknown"
                else f"{engine} has no tokenize endpoint: set --tokenizer.url"
            )
            self._note(None, why)
            return
        engine, url = target
        model = self.model or next(iter(self.hub.served_names()), "")
        with self._lock:
            self._probes += 1
        try:
            short = request_body(engine, SHORT_PROMPT, model)
            short_rtt, _ = await self._call(session, url, short)
            long_rtt, tokens = await self._call(
                session, url, request_body(engine, self.prompt, model)
            )
            short_after, _ = await self._call(session, url, short)
        except (FetchError, ValueError) as err:
            with self._lock:
                self._failures += 1
            self._note(False, f"{url}: {err}")
            return
        with self._lock:
            self._rtt.observe(short_rtt)
            self._latency.observe(max(0.0, long_rtt - min(short_rtt, short_after)))
            self._tokens = float(tokens)
        self._note(True, "")

    async def _call(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any]
    ) -> tuple[float, int]:
        result = await fetch(
            session,
            url,
            method="POST",
            json_body=body,
            timeout=self.timeout,
            max_bytes=MAX_RESPONSE,
        )
        return result.elapsed, token_count(result.body)

    def _note(self, ok: bool | None, error: str) -> None:
        with self._lock:
            self._last_ok = ok
            changed = error != self._last_error
            self._last_error = error
        if changed and error:
            log.warning("tokenizer probe: %s", error)
        elif changed:
            log.info("tokenizer probe working")

    # --- scrape ------------------------------------------------------------------------------
    def collect(self) -> Collection:
        engine = self.hub.engine
        latency = m.histogram("inference_tokenizer_latency_seconds")
        rtt = m.histogram("inference_tokenizer_probe_rtt_seconds")
        tokens = m.gauge("inference_tokenizer_probe_tokens")
        probes = m.counter("inference_tokenizer_probes_total")
        failures = m.counter("inference_tokenizer_probe_failures_total")
        with self._lock:
            if self._latency.n:
                latency.add_metric([engine, "probe"], self._latency.buckets(), self._latency.total)
                rtt.add_metric([engine], self._rtt.buckets(), self._rtt.total)
            if self._tokens is not None:
                tokens.add_metric([engine], self._tokens)
            probes.add_metric([engine], float(self._probes))
            failures.add_metric([engine], float(self._failures))
            ok, error = self._last_ok, self._last_error
        families: dict[str, Metric] = {latency.name: latency}
        snapshot = self.hub.fresh(self._clock(), STALE_INTERVALS * self.engine_poll_interval)
        if snapshot is not None:
            for series in snapshot.series:
                if series.name == "inference_tokenizer_latency_seconds":
                    add_series(families, engine, series, "engine")
        metrics: list[Metric] = [f for f in (latency, rtt, tokens) if f.samples]
        metrics += [probes, failures]
        return Collection(metrics=metrics, success=ok is not False, error=error)


def load_prompt(path: Path | None) -> str | None:
    """The probe prompt from ``--tokenizer.prompt-file`` (None: the bundled one)."""
    return None if path is None else path.read_text(encoding="utf-8")


# --- construction -----------------------------------------------------------------------------


def check(settings: Settings) -> None:
    """Cross-field checks at start-up: the tokenize URL, when given, is a URL."""
    url = section(TokenizerOptions, settings).url
    if url:
        try:
            parse_url(url)
        except ValueError as err:
            raise ConfigError("--tokenizer.url", str(err)) from None


def build(settings: Settings, shared: Shared) -> TokenizerCollector:
    opts = section(TokenizerOptions, settings)
    engine = section(EngineOptions, settings)
    return TokenizerCollector(
        shared.engine_hub,
        engine.url[0],  # the first --engine.url: the engine whose tokenizer is probed
        url=opts.url,
        interval=opts.probe_interval,
        timeout=engine.timeout,
        prompt=load_prompt(opts.prompt_file),
        model=opts.model,
        engine_poll_interval=engine.poll_interval,
    )
