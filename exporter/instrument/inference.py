"""The serving metrics of a custom inference server, under the catalogue's names.

Exposes (names, types and help from :mod:`exporter.metrics`)::

    inference_queue_depth{model}                     gauge      .queue_depth
    inference_requests_running{model}                gauge      .requests_running
    inference_kv_cache_usage_ratio{model}            gauge      .kv_cache_usage (0-1)
    inference_prompt_tokens_total{model}             counter    .prompt_tokens
    inference_generation_tokens_total{model}         counter    .generation_tokens
    inference_time_to_first_token_seconds{model}     histogram  .ttft, observe_ttft()
    inference_inter_token_latency_seconds{model}     histogram  .itl, observe_itl()
    inference_e2e_request_latency_seconds{model}     histogram  .e2e
    inference_queue_time_seconds{model}              histogram  .queue_time
    inference_prefill_time_seconds{model}            histogram  .prefill_time
    inference_decode_time_seconds{model}             histogram  .decode_time
    inference_tokenizer_latency_seconds{source="engine"}
                                                     histogram  tokenizer_timer()

The catalogue gives these metrics an ``engine`` label as well: the sidecar adds it when it polls
the server (``--engine.type custom``), so the server does not set it. The tokenizer histogram
has no ``model`` label, as in the catalogue (``engine``, ``source``); ``source`` is fixed to
``engine``, which is how the sidecar tells it from its own probe (``source="probe"``), and its
buckets are the probe's, so the two can be compared and aggregated.

Several :class:`InferenceMetrics` (one per model) may share a registry: the metric objects are
created once per registry and each instance binds its own ``model``.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from exporter.metrics import BY_NAME, MetricSpec, MetricType
from exporter.metrics import TOKENIZER_BUCKETS as TOKENIZER_BUCKETS_SHARED

# Time to first token: prefill of short prompts (tens of ms) to long prompts behind a queue.
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# One decode step: a few ms on small models, up to a second under heavy batching or swapping.
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
# Whole requests and their decode phase: up to minutes for long generations.
E2E_BUCKETS = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0, 120.0, 240.0, 480.0, 960.0,
)  # fmt: skip
# Queueing: zero when idle, then anywhere up to minutes when overloaded.
QUEUE_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# Prefill of one request: as TTFT without the queue.
PHASE_BUCKETS = TTFT_BUCKETS
# The sidecar's tokenizer probe uses the same buckets (exporter.collectors.tokenizer).
TOKENIZER_BUCKETS = TOKENIZER_BUCKETS_SHARED

TOKENIZER_SOURCE = "engine"

F = TypeVar("F", bound=Callable[..., Any])


def _spec(name: str, kind: MetricType) -> MetricSpec:
    spec = BY_NAME[name]
    if spec.type != kind:
        raise TypeError(f"{name} is a {spec.type} in the catalogue, not a {kind}")
    return spec


def _gauge(name: str, registry: CollectorRegistry) -> Gauge:
    spec = _spec(name, "gauge")
    return Gauge(spec.family_name, spec.help, ["model"], registry=registry)


def _counter(name: str, registry: CollectorRegistry) -> Counter:
    spec = _spec(name, "counter")
    return Counter(spec.family_name, spec.help, ["model"], registry=registry)


def _histogram(
    name: str,
    registry: CollectorRegistry,
    buckets: tuple[float, ...],
    labels: tuple[str, ...] = ("model",),
) -> Histogram:
    spec = _spec(name, "histogram")
    return Histogram(spec.family_name, spec.help, list(labels), registry=registry, buckets=buckets)


@dataclass(frozen=True)
class _Families:
    """The unbound metric objects of one registry."""

    queue_depth: Gauge
    requests_running: Gauge
    kv_cache_usage: Gauge
    prompt_tokens: Counter
    generation_tokens: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    tokenizer: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> _Families:
        return cls(
            queue_depth=_gauge("inference_queue_depth", registry),
            requests_running=_gauge("inference_requests_running", registry),
            kv_cache_usage=_gauge("inference_kv_cache_usage_ratio", registry),
            prompt_tokens=_counter("inference_prompt_tokens_total", registry),
            generation_tokens=_counter("inference_generation_tokens_total", registry),
            ttft=_histogram("inference_time_to_first_token_seconds", registry, TTFT_BUCKETS),
            itl=_histogram("inference_inter_token_latency_seconds", registry, ITL_BUCKETS),
            e2e=_histogram("inference_e2e_request_latency_seconds", registry, E2E_BUCKETS),
            queue_time=_histogram("inference_queue_time_seconds", registry, QUEUE_BUCKETS),
            prefill_time=_histogram("inference_prefill_time_seconds", registry, PHASE_BUCKETS),
            decode_time=_histogram("inference_decode_time_seconds", registry, E2E_BUCKETS),
            tokenizer=_histogram(
                "inference_tokenizer_latency_seconds", registry, TOKENIZER_BUCKETS, ("source",)
            ),
        )


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_FAMILIES_LOCK = threading.Lock()


def _families_of(registry: CollectorRegistry) -> _Families:
    with _FAMILIES_LOCK:
        families = _FAMILIES.get(registry)
        if families is None:
            families = _Families.create(registry)
            _FAMILIES[registry] = families
        return families


class Timer:
    """Observes elapsed seconds, as a context manager (``with``, ``async with``) or a decorator.

    As a decorator it wraps plain and ``async def`` functions alike and observes once per call,
    also when the call raises. Each use has its own start time, so one timer may decorate a
    function that runs in many threads or tasks at once.
    """

    def __init__(
        self, observe: Callable[[float], None], *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._observe = observe
        self._clock = clock
        self._starts: list[float] = []

    def __enter__(self) -> Timer:
        self._starts.append(self._clock())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._observe(self._clock() - self._starts.pop())

    async def __aenter__(self) -> Timer:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, traceback)

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = self._clock()
                try:
                    return await func(*args, **kwargs)
                finally:
                    self._observe(self._clock() - start)

            return cast(F, timed_async)

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self._clock()
            try:
                return func(*args, **kwargs)
            finally:
                self._observe(self._clock() - start)

        return cast(F, timed)


class InferenceMetrics:
    """The serving metrics of one model, registered in ``registry``.

    Attributes are prometheus_client metrics already bound to ``model``: set the gauges,
    ``inc()`` the token counters, ``observe()`` the histograms (seconds).
    """

    def __init__(
        self,
        model: str,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        families = _families_of(registry)
        self.model = model
        self._clock = clock
        self.queue_depth: Gauge = families.queue_depth.labels(model=model)
        self.requests_running: Gauge = families.requests_running.labels(model=model)
        self.kv_cache_usage: Gauge = families.kv_cache_usage.labels(model=model)
        self.prompt_tokens: Counter = families.prompt_tokens.labels(model=model)
        self.generation_tokens: Counter = families.generation_tokens.labels(model=model)
        self.ttft: Histogram = families.ttft.labels(model=model)
        self.itl: Histogram = families.itl.labels(model=model)
        self.e2e: Histogram = families.e2e.labels(model=model)
        self.queue_time: Histogram = families.queue_time.labels(model=model)
        self.prefill_time: Histogram = families.prefill_time.labels(model=model)
        self.decode_time: Histogram = families.decode_time.labels(model=model)
        self.tokenizer_latency: Histogram = families.tokenizer.labels(source=TOKENIZER_SOURCE)

    def observe_ttft(self, seconds: float) -> None:
        """Record one request's time from arrival to its first generated token."""
        self.ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        """Record the time between two consecutive generated tokens of one request."""
        self.itl.observe(seconds)

    def tokenizer_timer(self) -> Timer:
        """A :class:`Timer` feeding ``inference_tokenizer_latency_seconds{source="engine"}``.

        ``with metrics.tokenizer_timer(): ids = tok.encode(text)``, or decorate the tokenize
        function (plain or async) with ``@metrics.tokenizer_timer()``.
        """
        return Timer(self.tokenizer_latency.observe, clock=self._clock)
