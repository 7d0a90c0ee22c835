"""SGLang: ``sglang:*`` metrics of ``--enable-metrics``.

Source: ``python/sglang/srt/metrics/collector.py``: ``SchedulerMetricsCollector`` (gauges and
the queue-time histogram, one series per scheduler: labels ``model_name``, ``engine_type``,
``tp_rank``, ``pp_rank`` and ``dp_rank`` under data parallelism) and
``TokenizerMetricsCollector`` (token counters and latency histograms, label ``model_name``).
SGLang runs prometheus_client in multiprocess mode: labels sorted, no ``_created`` samples.
The model is the ``model_name`` label (``--served-model-name``).

=====================================  =======================================================
normalised                             SGLang (older names after the first)
=====================================  =======================================================
inference_queue_depth                  sglang:num_queue_reqs
inference_requests_running             sglang:num_running_reqs
inference_kv_cache_usage_ratio         sglang:token_usage (share of the KV token pool in use)
inference_prompt_tokens_total          sglang:prompt_tokens_total
inference_generation_tokens_total      sglang:generation_tokens_total
inference_time_to_first_token_seconds  sglang:time_to_first_token_seconds
inference_inter_token_latency_seconds  sglang:inter_token_latency_seconds;
                                       sglang:time_per_output_token_seconds (releases before
                                       the ITL histogram: a per-request mean, the closest)
inference_e2e_request_latency_seconds  sglang:e2e_request_latency_seconds
inference_queue_time_seconds           sglang:queue_time_seconds
=====================================  =======================================================

Several schedulers (data-parallel ranks) of one model: queue and running requests and the
queue-time histograms are summed, KV usage is the fullest rank's. Only the first tensor-
parallel rank of each scheduler reports by default, so summing never counts a batch twice.
No prefill/decode time histograms; SGLang keeps tokenizer time in traces, not metrics.
"""

from __future__ import annotations

from exporter.engines.model import EngineSpec, Tokenize
from exporter.engines.rules import Rule, Source, rule

PREFIX = "sglang:"
MODEL_LABEL = "model_name"


def _s(metric: str) -> Source:
    return Source(metric, model_label=MODEL_LABEL)


RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", _s("sglang:num_queue_reqs")),
    rule("inference_requests_running", _s("sglang:num_running_reqs")),
    rule("inference_kv_cache_usage_ratio", _s("sglang:token_usage"), aggregate="max"),
    rule("inference_prompt_tokens_total", _s("sglang:prompt_tokens_total")),
    rule("inference_generation_tokens_total", _s("sglang:generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("sglang:time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        _s("sglang:inter_token_latency_seconds"),
        _s("sglang:time_per_output_token_seconds"),
    ),
    rule("inference_e2e_request_latency_seconds", _s("sglang:e2e_request_latency_seconds")),
    rule("inference_queue_time_seconds", _s("sglang:queue_time_seconds")),
)

SPEC = EngineSpec(
    name="sglang",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(),
    preallocates_memory=True,
    process="sglang",
)
