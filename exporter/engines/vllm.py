"""vLLM: ``vllm:*`` metrics of the OpenAI-compatible server.

Sources: ``vllm/v1/metrics/loggers.py`` (V1 engine, 0.8 and later; labels ``model_name`` and
``engine``, the engine-core index, one series per data-parallel engine) and
``vllm/engine/metrics.py`` (V0 engine, up to 0.10; label ``model_name`` only). The model is the
``model_name`` label (``--served-model-name``).

=====================================  =======================================================
normalised                             vLLM (deprecated names after the first)
=====================================  =======================================================
inference_queue_depth                  vllm:num_requests_waiting
inference_requests_running             vllm:num_requests_running
inference_kv_cache_usage_ratio         vllm:kv_cache_usage_perc; vllm:gpu_cache_usage_perc
                                       (deprecated 0.9, hidden 0.10, then removed)
inference_prompt_tokens_total          vllm:prompt_tokens_total
inference_generation_tokens_total      vllm:generation_tokens_total
inference_time_to_first_token_seconds  vllm:time_to_first_token_seconds
inference_inter_token_latency_seconds  vllm:inter_token_latency_seconds (0.11+);
                                       vllm:time_per_output_token_seconds (deprecated 0.11,
                                       hidden 0.12, removed 0.13)
inference_e2e_request_latency_seconds  vllm:e2e_request_latency_seconds
inference_queue_time_seconds           vllm:request_queue_time_seconds;
                                       vllm:time_in_queue_requests (V0, deprecated 0.8)
inference_prefill_time_seconds         vllm:request_prefill_time_seconds
inference_decode_time_seconds          vllm:request_decode_time_seconds
=====================================  =======================================================

Not mapped: ``vllm:request_time_per_output_token_seconds`` (a per-request mean, not the
inter-token latency), ``vllm:num_requests_swapped`` (V0 only). Several data-parallel engines
of one model: counts and histograms are summed, KV cache usage is the highest engine's.
vLLM exports no tokenizer latency.
"""

from __future__ import annotations

from exporter.engines.model import EngineSpec, Tokenize
from exporter.engines.rules import Rule, Source, rule

PREFIX = "vllm:"
MODEL_LABEL = "model_name"


def _s(metric: str) -> Source:
    return Source(metric, model_label=MODEL_LABEL)


RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", _s("vllm:num_requests_waiting")),
    rule("inference_requests_running", _s("vllm:num_requests_running")),
    rule(
        "inference_kv_cache_usage_ratio",
        _s("vllm:kv_cache_usage_perc"),
        _s("vllm:gpu_cache_usage_perc"),
        aggregate="max",
    ),
    rule("inference_prompt_tokens_total", _s("vllm:prompt_tokens_total")),
    rule("inference_generation_tokens_total", _s("vllm:generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("vllm:time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        _s("vllm:inter_token_latency_seconds"),
        _s("vllm:time_per_output_token_seconds"),
    ),
    rule("inference_e2e_request_latency_seconds", _s("vllm:e2e_request_latency_seconds")),
    rule(
        "inference_queue_time_seconds",
        _s("vllm:request_queue_time_seconds"),
        _s("vllm:time_in_queue_requests"),
    ),
    rule("inference_prefill_time_seconds", _s("vllm:request_prefill_time_seconds")),
    rule("inference_decode_time_seconds", _s("vllm:request_decode_time_seconds")),
)

SPEC = EngineSpec(
    name="vllm",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(),
    preallocates_memory=True,
    process="vllm",
)
