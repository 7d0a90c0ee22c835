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

An ensemble (TensorRT-LLM's ``ensemble`` of ``preprocessing``, ``tensorrt_llm`` and
``postprocessing``) counts each client request once for itself and once more in every step
it runs: the steps' request time is nested in the ensemble's. Nothing in the metrics says
which models are steps; each model's configuration on Triton's HTTP API does
(``GET /v2/models/<name>/config``: ``platform: "ensemble"`` and
``ensemble_scheduling.step[].model_name``), read by :func:`ensemble_steps` through
:data:`COMPOSITION`. The end-to-end latency and the time to first token then come from the
entry points alone, the queue time from every model.
"""

from __future__ import annotations

import json
from typing import Any

from exporter.engines.rules import CounterPair, LabelMatcher, Product, Rule, Source, noted, rule
from exporter.engines.spec import Composition, EngineSpec, Serving, Version

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


def ensemble_steps(body: bytes) -> tuple[str, ...]:
    """The models a Triton model configuration (``GET /v2/models/<name>/config``) composes:
    each ``ensemble_scheduling.step[].model_name`` of an ensemble, in order, without repeats;
    ``()`` for any other model. ValueError when the answer is not a model configuration."""
    try:
        config: Any = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise ValueError("not a Triton model configuration (no 'name')")
    scheduling = config.get("ensemble_scheduling")
    if config.get("platform") != "ensemble" and not isinstance(scheduling, dict):
        return ()
    steps = scheduling.get("step") if isinstance(scheduling, dict) else None
    if not isinstance(steps, list):
        raise ValueError(f"ensemble {config['name']!r} has no ensemble_scheduling.step list")
    names: list[str] = []
    for step in steps:
        name = step.get("model_name") if isinstance(step, dict) else None
        if isinstance(name, str) and name.strip() and name.strip() not in names:
            names.append(name.strip())
    return tuple(names)


#: The request-level names: time and count of whole client requests, nested in an ensemble.
#: A decoupled ensemble and its decoupled step each report a first-response histogram (Triton's
#: qa/L0_metrics ensemble test checks both): the step's first response is nested in the
#: ensemble's, so time to first token counts the ensemble's alone.
ENTRY_ONLY = frozenset(
    {"inference_e2e_request_latency_seconds", "inference_time_to_first_token_seconds"}
)

COMPOSITION = Composition(
    path="/v2/models/{model}/config",
    read=ensemble_steps,
    entry_only=ENTRY_ONLY,
    doc=(
        "Ensembles: each model's configuration on Triton's HTTP API (`--engine.api-url`, by "
        "default port 8000 of the metrics URL's host when the metrics are on 8002; "
        "`GET /v2/models/<name>/config`, asked once when the endpoint comes up and again when "
        "the set of models changes) says which models an ensemble composes "
        "(`ensemble_scheduling.step[].model_name`). `inference_e2e_request_latency_seconds` "
        "(time and count of requests) and `inference_time_to_first_token_seconds` (a decoupled "
        "ensemble and its decoupled step each report a first-response histogram, the step's "
        "nested in the ensemble's) then come from the entry points alone: the models no "
        "ensemble composes (ensembles, BLS models, plain models), so each client request counts "
        "once; where no entry point reports first responses (an ensemble that is not "
        "decoupled), its steps' still count. `inference_queue_time_seconds` and "
        "`inference_queue_depth` still come from every model: each step waits in its own "
        "queue (the ensemble's own stays near 0). "
        "Where an ensemble runs steps in parallel, their queue times overlap and the sum is an "
        "upper bound of the client's wait. A BLS model's calls to other models happen inside "
        "its Python code: Triton's API cannot show them, so the models it calls count as entry "
        "points unless an ensemble composes them (their request time is then counted twice), "
        "and a model that clients call directly and an ensemble composes counts as a step. "
        "When the API does not answer, every model counts, as before, and "
        "`inference_engine_model_config_up` is 0."
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
    composition=COMPOSITION,
)
