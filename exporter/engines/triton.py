"""Triton Inference Server: ``nv_inference_*`` metrics (port 8002) and, for TensorRT-LLM
models, the backend's ``nv_trt_llm_*`` gauges.

Sources: ``docs/user_guide/metrics.md`` of triton-inference-server/server (counters per model
and version, rendered by prometheus-cpp: no ``_total``, labels ``model`` and ``version``) and
the TensorRT-LLM backend README ("Triton Metrics"). The model is the ``model`` label; the
versions of one model are summed into one series.

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

The cumulative microsecond counters become histograms with only a ``+Inf`` bucket: ``_sum``
is the counter in seconds, ``_count`` is ``nv_inference_request_success`` (the requests they
timed), so ``rate(_sum) / rate(_count)`` is the mean latency. Compute time
(``nv_inference_compute_*_duration_us``) is not mapped to prefill or decode: for an LLM it
spans the whole generation. No token counters (TensorRT-LLM reports token counts as gauges
per iteration), no tokenizer latency.
"""

from __future__ import annotations

from exporter.engines.rules import CounterPair, LabelMatcher, Product, Rule, Source, noted, rule
from exporter.engines.spec import EngineSpec, Serving, Version

PREFIX = "nv_inference_"
# The TensorRT-LLM backend's own families (a server may show only those).
BACKEND_PREFIX = "nv_trt_llm_"
MODEL_LABEL = "model"

_US = 1e6
_MS = 1e3


def _s(metric: str, *matchers: LabelMatcher, divisor: float = 1.0) -> Source:
    return Source(metric, matchers, model_label=MODEL_LABEL, divisor=divisor)


def _trt(metric: str, label: str, value: str) -> Source:
    return _s(metric, LabelMatcher(label, "=", value))


def _timed(counter: str) -> CounterPair:
    return CounterPair(_s(counter, divisor=_US), _s("nv_inference_request_success"))


RULES: tuple[Rule, ...] = (
    rule(
        "inference_queue_depth",
        (
            noted(_s("nv_inference_pending_request_count"), "23.12 and later"),
            noted(
                _trt("nv_trt_llm_request_metrics", "request_type", "waiting"),
                "TensorRT-LLM's own queue: Triton hands it requests at once, so its pending "
                "count stays at 0",
            ),
        ),
    ),
    rule(
        "inference_requests_running",
        noted(
            _trt("nv_trt_llm_request_metrics", "request_type", "active"),
            "TensorRT-LLM models only; Triton itself has no gauge",
        ),
    ),
    rule(
        "inference_kv_cache_usage_ratio",
        _trt("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "fraction"),
        aggregate="max",
    ),
    rule(
        "inference_kv_cache_capacity_tokens",
        Product(
            _trt("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "max"),
            _trt("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "tokens_per"),
        ),
    ),
    rule(
        "inference_time_to_first_token_seconds",
        noted(
            _s("nv_inference_first_response_histogram_ms", divisor=_MS),
            "decoupled models, --metrics-config histogram_latencies=true",
        ),
    ),
    rule(
        "inference_e2e_request_latency_seconds",
        _timed("nv_inference_request_duration_us"),
        noted(_s("nv_inference_request_summary_us", divisor=_US), "summary_latencies"),
    ),
    rule(
        "inference_queue_time_seconds",
        _timed("nv_inference_queue_duration_us"),
        noted(_s("nv_inference_queue_summary_us", divisor=_US), "summary_latencies"),
    ),
)

# Triton's Python and vLLM backends export their own families next to nv_inference_*: the
# server is still Triton, so it is recognised before the engines it wraps.
SPEC = EngineSpec(
    name="triton",
    title="Triton",
    prefixes=(PREFIX, BACKEND_PREFIX),
    rules=RULES,
    tokenize=None,
    process="tritonserver",
    wraps=("vllm",),
    version=Version(path="/v2"),
    # A Triton serving no model (the last one unloaded) exports only its server-wide
    # families, none with the nv_inference_ prefix: still Triton, with nothing to normalise.
    signatures=(
        frozenset({"nv_pinned_memory_pool_total_bytes"}),
        frozenset({"nv_cpu_utilization", "nv_cpu_memory_used_bytes"}),
    ),
    serving=Serving(images=(r"tritonserver",), port=8002, port_flags=("--metrics-port",)),
)
