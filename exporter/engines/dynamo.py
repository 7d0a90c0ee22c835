"""NVIDIA Dynamo: the frontend's ``dynamo_frontend_*`` and the workers' ``dynamo_component_*``
with the engine's own metrics passed through.

Sources: ai-dynamo/dynamo ``docs/observability/metrics.md`` and the captured scrapes of its
``metrics_examples`` (January 2026, in ``tests/fixtures/engines/``): a frontend
(``python -m dynamo.frontend``, ``/metrics`` on its HTTP port) and three workers
(``python -m dynamo.vllm|sglang|trtllm``, ``/metrics`` on ``DYN_SYSTEM_PORT``). A worker serves
the engine's families unchanged (``vllm:*``, ``sglang:*``; TensorRT-LLM's with a ``trtllm_``
prefix Dynamo adds) next to its own ``dynamo_component_*``.

A worker is read with the engine's own rules (:mod:`~exporter.engines.vllm`,
:mod:`~exporter.engines.sglang`, :mod:`~exporter.engines.trtllm`), which come first; its
``dynamo_component_*`` families only fill what the engine's do not
(``dynamo_component_kvstats_gpu_cache_usage_percent``, later
``dynamo_component_gpu_cache_usage_percent``, a ratio with no model label; its
``dynamo_component_requests_total`` counts the engine's requests again and is not read).

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

``dynamo_frontend_queued_requests`` counts the requests that have not had their first response
yet (queued in the HTTP service, or being prefilled, or waiting for their KV transfer): the
frontend's queue, wider than an engine's waiting queue, and not split by stage, so it feeds
``inference_queue_depth`` only (``inference_queue_depth_by_stage`` comes from the engines'
own disaggregation queues). ``dynamo_frontend_inflight_requests`` counts every request in
flight to the engines.

The KV router (``--router-mode kv``) in the frontend adds
``dynamo_component_router_kv_transfer_estimated_latency_seconds``, a histogram of the time
from the prefill's completion to the decode worker's first token as the router sees it: the
KV transfer plus dispatch, network and one decode step, an upper bound (Dynamo's own word:
"estimated"). It is exported as ``inference_kv_transfer_upper_bound_seconds``, never into the
measured ``inference_kv_transfer_seconds``; its series carry no model (one per router), so it
belongs to the exposition's only model. Names from ai-dynamo/dynamo
``lib/runtime/src/metrics/prometheus_names.rs`` (``frontend_service``, ``router_request``; the
estimate is not there at 04070c75 and arrives in 2026) and ``lib/llm/src/kv_router``
(``kv_transfer_estimated_latency_secs``).

The frontend writes its request metrics' ``model`` label in lower case and its model
configuration gauges in the model's own case (``qwen/qwen3-0.6b`` and ``Qwen/Qwen3-0.6B``):
the lower-case names are mapped back to the configured spelling, so the frontend's series and
the workers' share one model name. An endpoint whose only families are the frontend's is of
layer ``frontend``: when the sidecar polls a frontend and workers together, the request-level
names (TTFT, ITL, end-to-end latency, prompt and generation tokens) come from the frontend
only and every other name from the workers only (``docs/engines.md``), so no request is
counted twice. No tokenize endpoint and no version.
"""

from __future__ import annotations

from exporter.engines import sglang, trtllm, vllm
from exporter.engines.rules import Product, Rule, SampleIndex, Source, merge_tables, noted, rule
from exporter.engines.spec import EngineSpec, Serving, left_out

FRONTEND = "dynamo_frontend_"
COMPONENT = "dynamo_component_"
MODEL_LABEL = "model"


def _f(metric: str) -> Source:
    return Source(metric, model_label=MODEL_LABEL)


FRONTEND_RULES: tuple[Rule, ...] = (
    rule(
        "inference_queue_depth",
        noted(
            _f("dynamo_frontend_queued_requests"),
            "requests without their first response yet: queued, prefilling or waiting for "
            "their KV transfer",
        ),
    ),
    rule("inference_requests_running", _f("dynamo_frontend_inflight_requests")),
    rule(
        "inference_kv_cache_capacity_tokens",
        Product(
            _f("dynamo_frontend_model_total_kv_blocks"),
            _f("dynamo_frontend_model_kv_cache_block_size"),
            note="every worker of the model, as the frontend sees them",
        ),
    ),
    rule("inference_prompt_tokens_total", _f("dynamo_frontend_input_sequence_tokens_sum")),
    rule(
        "inference_generation_tokens_total",
        _f("dynamo_frontend_output_tokens_total"),
        _f("dynamo_frontend_output_sequence_tokens_sum"),
    ),
    rule(
        "inference_time_to_first_token_seconds",
        _f("dynamo_frontend_time_to_first_token_seconds"),
    ),
    rule(
        "inference_inter_token_latency_seconds",
        _f("dynamo_frontend_inter_token_latency_seconds"),
    ),
    rule(
        "inference_e2e_request_latency_seconds",
        _f("dynamo_frontend_request_duration_seconds"),
    ),
)

#: The KV router's per-request metrics: ``dynamo_component_`` + ``router_`` + the frontend's
#: name (``dynamo_component="router"``), served by the frontend that routes.
ROUTER = COMPONENT + "router_"

ROUTER_RULES: tuple[Rule, ...] = (
    rule(
        "inference_kv_transfer_upper_bound_seconds",
        Source(ROUTER + "kv_transfer_estimated_latency_seconds", engine_wide=True),
    ),
)

COMPONENT_RULES: tuple[Rule, ...] = (
    rule(
        "inference_kv_cache_usage_ratio",
        Source("dynamo_component_kvstats_gpu_cache_usage_percent", engine_wide=True),
        Source("dynamo_component_gpu_cache_usage_percent", engine_wide=True),
        aggregate="max",
    ),
)


#: The tables of the engines a worker serves, which come first, then Dynamo's own.
READS_AS = ("vllm", "sglang", "trtllm")
OWN_RULES = (FRONTEND_RULES, ROUTER_RULES, COMPONENT_RULES)


#: The frontend's families no rule reads (``prometheus_names.rs``, ``frontend_service``).
LEFT_OUT = (
    *left_out(
        "requests by status: the request duration histogram counts them",
        "dynamo_frontend_requests_total",
    ),
    *left_out("clients that went away", "dynamo_frontend_disconnected_clients"),
    *left_out(
        "the router's predicted prefix-cache hits: the engines' own cached tokens are read",
        "dynamo_frontend_kv_hit_rate",
        "dynamo_frontend_cached_tokens",
    ),
    *left_out(
        "the frontend's tokenize and detokenize time, in ms: its form (histogram or gauge) "
        "is not in the names' file; with a capture it can feed the tokenizer latency",
        "dynamo_frontend_tokenizer_latency_ms",
    ),
    *left_out(
        "the model's configuration and migrations between workers",
        "dynamo_frontend_model_max_num_seqs",
        "dynamo_frontend_model_max_num_batched_tokens",
        "dynamo_frontend_model_context_length",
        "dynamo_frontend_model_migration_limit",
        "dynamo_frontend_model_migration_total",
    ),
    *left_out(
        "each worker's load and last latencies as the router keeps them: the workers' own "
        "series are read",
        "dynamo_frontend_worker_active_decode_blocks",
        "dynamo_frontend_worker_active_prefill_tokens",
        "dynamo_frontend_worker_last_time_to_first_token_seconds",
        "dynamo_frontend_worker_last_input_sequence_tokens",
        "dynamo_frontend_worker_last_inter_token_latency_seconds",
    ),
    *left_out(
        "requests queued in the router: already counted in dynamo_frontend_queued_requests "
        "(every request without its first response)",
        "dynamo_frontend_router_queue_pending_requests",
    ),
)


def model_alias(index: SampleIndex) -> dict[str, str]:
    """Lower-case model names of the frontend's request metrics -> the configured spelling
    (from the ``dynamo_frontend_model_*`` gauges)."""
    aliases: dict[str, str] = {}
    for name, series in index.items():
        if not name.startswith(FRONTEND + "model_"):
            continue
        for labels in series:
            model = dict(labels).get(MODEL_LABEL, "")
            if model and model.lower() != model:
                aliases[model.lower()] = model
    return aliases


SPEC = EngineSpec(
    name="dynamo",
    title="NVIDIA Dynamo",
    prefixes=(FRONTEND, COMPONENT),
    rules=merge_tables(vllm.RULES, sglang.RULES, trtllm.RULES, *OWN_RULES),
    tokenize=None,
    preallocates_memory=True,
    process=r"dynamo\.(frontend|vllm|sglang|trtllm)|dynamo-run",
    wraps=READS_AS,
    reads_as=READS_AS,
    own_rules=merge_tables(*OWN_RULES),
    frontend_prefixes=(FRONTEND, ROUTER),
    model_alias=model_alias,
    left_out=LEFT_OUT,
    role=sglang.ROLE,
    # The frontend serves /metrics on its HTTP port, a worker on DYN_SYSTEM_PORT (the
    # operator's default "system" port, 9090).
    serving=Serving(
        images=(r"ai-dynamo/",),
        port=8000,
        port_flags=("--http-port",),
        port_env=("DYN_SYSTEM_PORT",),
        defaults=((r"dynamo\.frontend", 8000), (r"dynamo\.(vllm|sglang|trtllm)", 9090)),
    ),
)
