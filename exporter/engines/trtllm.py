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

from exporter.engines.rules import Product, Rule, Source, noted, rule
from exporter.engines.spec import OPENAI_MODELS, EngineSpec, Serving, Version, left_out

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
        "inference_prompt_tokens_cached_total",
        noted(_s("trtllm_prompt_cached_tokens_total"), "the collector of 2026"),
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

LEFT_OUT = (
    *left_out(
        "finished and failed requests: the request histograms count the finished ones",
        "trtllm_request_success_total",
        "trtllm_request_error_total",
        "trtllm_num_requests_completed_total",
    ),
    *left_out(
        "prefill plus decode time, each read on its own",
        "trtllm_request_inference_time_seconds",
    ),
    *left_out(
        "prefix-cache reuse in other units (hit tokens, per request, blocks, rates): the "
        "cached prompt tokens are read",
        "trtllm_prompt_cache_hit_tokens_total",
        "trtllm_prompt_cached_tokens_per_request",
        "trtllm_kv_cache_hit_rate",
        "trtllm_kv_cache_iter_reuse_rate",
        "trtllm_kv_cache_reused_blocks_total",
        "trtllm_kv_cache_missed_blocks_total",
        "trtllm_kv_cache_iter_reused_blocks_total",
        "trtllm_kv_cache_iter_full_reused_blocks_total",
        "trtllm_kv_cache_iter_partial_reused_blocks_total",
        "trtllm_kv_cache_iter_missed_blocks_total",
        "trtllm_kv_cache_gen_alloc_blocks_total",
    ),
    *left_out(
        "the KV cache's host and disk tiers",
        "trtllm_kv_cache_host_utilization",
        "trtllm_kv_cache_onboard_bytes_total",
        "trtllm_kv_cache_offload_bytes_total",
        "trtllm_kv_cache_disk_prefetch_blocks_total",
        "trtllm_kv_cache_intra_device_copy_bytes_total",
    ),
    *left_out(
        "KV blocks free and used: the utilisation, and the capacity from max blocks x "
        "tokens per block, are read",
        "trtllm_kv_cache_free_blocks",
        "trtllm_kv_cache_used_blocks",
    ),
    *left_out(
        "one iteration's batch and its limits: the request counts and the request "
        "histograms are read",
        "trtllm_scheduled_batch_size",
        "trtllm_max_num_active_requests",
        "trtllm_max_batch_size_static",
        "trtllm_max_batch_size_runtime",
        "trtllm_max_num_tokens_runtime",
        "trtllm_num_context_requests",
        "trtllm_num_generation_requests",
        "trtllm_num_paused_requests",
        "trtllm_num_scheduled_requests",
        "trtllm_total_context_tokens",
        "trtllm_avg_decoded_tokens_per_iter",
        "trtllm_prefill_batch_occupancy",
        "trtllm_prefill_batch_tokens",
        "trtllm_iteration_latency_seconds",
    ),
    *left_out(
        "process memory: the GPU's comes from the driver (NVML)",
        "trtllm_gpu_memory_usage_bytes",
        "trtllm_cpu_memory_usage_bytes",
        "trtllm_pinned_memory_usage_bytes",
    ),
    *left_out(
        "speculative decoding's acceptance: no signature reads it yet",
        "trtllm_spec_decode_drafted_tokens_total",
        "trtllm_spec_decode_accepted_tokens_total",
        "trtllm_spec_decode_num_draft_tokens_total",
        "trtllm_spec_decode_num_accepted_tokens_total",
        "trtllm_spec_decode_acceptance_length",
        "trtllm_spec_decode_draft_overhead",
    ),
    *left_out("output quality", "trtllm_prefill_perplexity", "trtllm_generation_perplexity"),
    *left_out(
        "configuration (info series)",
        "trtllm_model_config_info",
        "trtllm_parallel_config_info",
        "trtllm_speculative_config_info",
        "trtllm_kv_cache_config_info",
    ),
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
    left_out=LEFT_OUT,
    signatures=tuple(
        frozenset({a, b}) for i, a in enumerate(UNPREFIXED) for b in UNPREFIXED[i + 1 :]
    ),
    model=OPENAI_MODELS,
    version=Version(path="/version"),
    serving=Serving(images=(r"tensorrt-llm",), port=8000),
)
