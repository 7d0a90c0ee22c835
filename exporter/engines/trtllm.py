"""TensorRT-LLM's ``trtllm-serve``: ``trtllm_*`` metrics at ``/prometheus/metrics``.

Source: ``tensorrt_llm/metrics/collector.py`` (``MetricsCollector``, prometheus_client; labels
``model_name`` and ``engine_type``; the request histograms need ``return_perf_metrics: true``,
the iteration gauges ``enable_iter_perf_stats: true`` in ``--extra_llm_api_options``).
``GET /metrics`` on the same port is a JSON list of iteration statistics, not Prometheus.

The names changed three times, all read:

1. ``pytrtllm:*`` (a 2025 proposal that was not merged; a pasted scrape exists);
2. unprefixed ``time_to_first_token_seconds``, ``time_per_output_token_seconds``,
   ``e2e_request_latency_seconds``, ``request_queue_time_seconds`` and
   ``request_success_total{finish_reason}``, with ``model_name="undefined"`` (releases of
   mid-2025 to early 2026; the model is then unknown, ``""``);
3. ``trtllm_*`` (Dynamo's TensorRT-LLM worker added the prefix first, briefly as ``trtllm:``,
   then TensorRT-LLM itself, with the iteration gauges).

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

Recognised by the ``trtllm_``, ``trtllm:`` or ``pytrtllm:`` prefix, or, for the unprefixed
releases, by two of the four unprefixed histograms together (an exposition with NIM's gauges
is NIM's, checked first). No captured scrape of the ``trtllm_`` iteration gauges was found:
those rows follow the collector's source. No tokenize endpoint; the version comes from
``GET /version``.
"""

from __future__ import annotations

from exporter.engines.rules import Product, Rule, Source, rule
from exporter.engines.spec import OPENAI_MODELS, EngineSpec, Serving, Version

PREFIXES = ("trtllm_", "trtllm:", "pytrtllm:")
MODEL_LABEL = "model_name"
# The first metrics collector labelled every series model_name="undefined".
_BLANK = ("undefined",)
# Histograms of the unprefixed releases; two of them recognise the engine.
UNPREFIXED = (
    "time_to_first_token_seconds",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
)


def _s(metric: str) -> Source:
    return Source(metric, model_label=MODEL_LABEL, blank_models=_BLANK)


def _named(name: str, *, older: tuple[str, ...] = ("trtllm:",)) -> tuple[Source, ...]:
    """``trtllm_<name>`` and the older spellings given, newest first."""
    return (_s("trtllm_" + name), *(_s(prefix + name) for prefix in older))


def _histogram(name: str) -> tuple[Source, ...]:
    return (*_named(name), _s(name))


RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", *_named("num_requests_waiting", older=("trtllm:", "pytrtllm:"))),
    rule(
        "inference_requests_running",
        *_named("num_requests_running", older=("trtllm:", "pytrtllm:")),
    ),
    rule(
        "inference_kv_cache_usage_ratio",
        *_named("kv_cache_utilization"),
        aggregate="max",
        note="used over max blocks",
    ),
    rule(
        "inference_kv_cache_capacity_tokens",
        Product(_s("trtllm_kv_cache_max_blocks"), _s("trtllm_kv_cache_tokens_per_block")),
    ),
    rule(
        "inference_prompt_tokens_total",
        *_named("prompt_tokens_total", older=("trtllm:", "pytrtllm:")),
    ),
    rule(
        "inference_generation_tokens_total",
        *_named("generation_tokens_total", older=("trtllm:", "pytrtllm:")),
    ),
    rule("inference_time_to_first_token_seconds", *_histogram("time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        *_histogram("time_per_output_token_seconds"),
        note="one observation per request: its mean time per output token",
    ),
    rule("inference_e2e_request_latency_seconds", *_histogram("e2e_request_latency_seconds")),
    rule("inference_queue_time_seconds", *_histogram("request_queue_time_seconds")),
    rule("inference_prefill_time_seconds", *_named("request_prefill_time_seconds")),
    rule("inference_decode_time_seconds", *_named("request_decode_time_seconds")),
)

SPEC = EngineSpec(
    name="trtllm",
    title="TensorRT-LLM",
    prefixes=PREFIXES,
    rules=RULES,
    tokenize=None,
    preallocates_memory=True,
    process="trtllm-serve",
    metrics_path="/prometheus/metrics",
    signatures=tuple(
        frozenset({a, b}) for i, a in enumerate(UNPREFIXED) for b in UNPREFIXED[i + 1 :]
    ),
    model=OPENAI_MODELS,
    version=Version(path="/version"),
    serving=Serving(images=(r"tensorrt-llm",), port=8000),
)
