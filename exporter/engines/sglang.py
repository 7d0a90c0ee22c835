"""SGLang: ``sglang:*`` metrics of ``--enable-metrics``.

Source: ``python/sglang/srt/metrics/collector.py``: ``SchedulerMetricsCollector`` (gauges, the
queue-time and per-stage histograms, one series per scheduler process: labels ``model_name``,
``engine_type``, ``tp_rank``, ``pp_rank``, since late 2025 ``moe_ep_rank``, and ``dp_rank`` and
``pid`` under data-parallel attention) and ``TokenizerMetricsCollector`` (token counters and
latency histograms, label ``model_name``). SGLang runs prometheus_client in multiprocess mode:
labels sorted, no ``_created`` samples. The model is the ``model_name`` label
(``--served-model-name``); releases up to 0.3 called it ``name``. Captured scrapes in
``tests/fixtures/engines/``: the documentation's examples of 0.3.5, 0.4.0.post2 and
0.4.3.post2, a 0.5 server of January 2026 (through a Dynamo worker, unchanged), excerpts of
0.5.1 and of a server with data-parallel attention (8 ranks).

==========================================  ==================================================
normalised                                  SGLang (older names after the first)
==========================================  ==================================================
inference_queue_depth                       sglang:num_queue_reqs; sglang:num_requests_waiting
                                            (0.3)
inference_requests_running                  sglang:num_running_reqs; sglang:num_requests_running
                                            (0.3)
inference_kv_cache_usage_ratio              sglang:token_usage (share of the KV token pool in
                                            use)
inference_kv_cache_capacity_tokens          sglang:max_total_num_tokens
inference_prompt_tokens_total               sglang:prompt_tokens_total
inference_prompt_tokens_cached_total        sglang:cached_tokens_total (all cache_source);
                                            sglang:realtime_tokens_total{mode="prefill_cache"}
inference_generation_tokens_total           sglang:generation_tokens_total
inference_time_to_first_token_seconds       sglang:time_to_first_token_seconds
inference_inter_token_latency_seconds       sglang:inter_token_latency_seconds;
                                            sglang:time_per_output_token_seconds (releases before
                                            the ITL histogram: a per-request mean, the closest)
inference_e2e_request_latency_seconds       sglang:e2e_request_latency_seconds
inference_queue_time_seconds                sglang:queue_time_seconds;
                                            sglang:per_stage_req_latency_seconds
                                            {stage="prefill_waiting"};
                                            sglang:waiting_request_latency_seconds (0.3)
inference_prefill_time_seconds              sglang:per_stage_req_latency_seconds
                                            {stage="prefill_forward"} (the last chunk's forward
                                            of a chunked prefill)
inference_decode_time_seconds               sglang:per_stage_req_latency_seconds
                                            {stage="decode_loop"}
inference_tokenizer_latency_seconds         sglang:per_stage_req_latency_seconds
                                            {stage="tokenize"}
inference_estimated_flops_total             sglang:estimated_flops_per_gpu_total
inference_estimated_read_bytes_total        sglang:estimated_read_bytes_per_gpu_total
inference_estimated_write_bytes_total       sglang:estimated_write_bytes_per_gpu_total
==========================================  ==================================================

Tensor-parallel ranks are copies, data-parallel ranks are not. Every tensor-parallel (and
pipeline, expert-parallel, context-parallel) rank of one scheduler group reports the same
batch when ``--enable-metrics-for-all-schedulers`` is on (by default only the first does):
summing them would count each request once per rank. So the scheduler series of one model
and ``dp_rank`` that differ only in ``tp_rank``, ``pp_rank``, ``moe_ep_rank``,
``attn_tp_rank``, ``attn_cp_rank``, ``cp_rank`` or ``pid`` are replicas: the largest is kept;
then the ``dp_rank`` groups (distinct requests) are summed, the KV usage is the fullest
rank's, and the per-GPU estimates are the mean (one GPU's share). The tokenizer manager's
series (tokens, TTFT, ITL, e2e) are per request already. SGLang's version comes from
``GET /get_server_info``; its tokenize endpoint is ``POST /tokenize``.
"""

from __future__ import annotations

from exporter.engines.rules import LabelMatcher, Rule, Source, rule
from exporter.engines.snapshot import EngineSpec, Serving, Tokenize, Version

PREFIX = "sglang:"
MODEL_LABELS = ("model_name", "name")
#: Labels whose values are copies of one scheduler's numbers (see the module docstring).
REPLICAS = ("tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank", "cp_rank", "pid")


def _s(metric: str, *matchers: LabelMatcher) -> Source:
    """A tokenizer-manager series: one per model."""
    return Source(metric, matchers, model_label=MODEL_LABELS)


def _sched(metric: str, *matchers: LabelMatcher) -> Source:
    """A scheduler series: tensor-parallel copies collapse to one."""
    return Source(metric, matchers, model_label=MODEL_LABELS, replicas=REPLICAS)


def _stage(stage: str) -> Source:
    return _sched("sglang:per_stage_req_latency_seconds", LabelMatcher("stage", "=", stage))


RULES: tuple[Rule, ...] = (
    rule(
        "inference_queue_depth",
        _sched("sglang:num_queue_reqs"),
        _sched("sglang:num_requests_waiting"),
    ),
    rule(
        "inference_requests_running",
        _sched("sglang:num_running_reqs"),
        _sched("sglang:num_requests_running"),
    ),
    rule("inference_kv_cache_usage_ratio", _sched("sglang:token_usage"), aggregate="max"),
    rule("inference_kv_cache_capacity_tokens", _sched("sglang:max_total_num_tokens")),
    rule("inference_prompt_tokens_total", _s("sglang:prompt_tokens_total")),
    rule(
        "inference_prompt_tokens_cached_total",
        _s("sglang:cached_tokens_total"),
        _sched("sglang:realtime_tokens_total", LabelMatcher("mode", "=", "prefill_cache")),
    ),
    rule("inference_generation_tokens_total", _s("sglang:generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("sglang:time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        _s("sglang:inter_token_latency_seconds"),
        _s("sglang:time_per_output_token_seconds"),
    ),
    rule("inference_e2e_request_latency_seconds", _s("sglang:e2e_request_latency_seconds")),
    rule(
        "inference_queue_time_seconds",
        _sched("sglang:queue_time_seconds"),
        _stage("prefill_waiting"),
        _s("sglang:waiting_request_latency_seconds"),
    ),
    rule("inference_prefill_time_seconds", _stage("prefill_forward")),
    rule("inference_decode_time_seconds", _stage("decode_loop")),
    rule(
        "inference_tokenizer_latency_seconds",
        _s("sglang:per_stage_req_latency_seconds", LabelMatcher("stage", "=", "tokenize")),
    ),
    rule(
        "inference_estimated_flops_total",
        _sched("sglang:estimated_flops_per_gpu_total"),
        aggregate="mean",
    ),
    rule(
        "inference_estimated_read_bytes_total",
        _sched("sglang:estimated_read_bytes_per_gpu_total"),
        aggregate="mean",
    ),
    rule(
        "inference_estimated_write_bytes_total",
        _sched("sglang:estimated_write_bytes_per_gpu_total"),
        aggregate="mean",
    ),
)

SPEC = EngineSpec(
    name="sglang",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(),
    preallocates_memory=True,
    process="sglang",
    version=Version(path="/get_server_info"),
    serving=Serving(images=(r"lmsysorg/sglang",), port=30000),
)
