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

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

The KV-transfer families changed type in 2026 (``SchedulerMetricsCollector`` in
``python/sglang/srt/observability/metrics_collector.py``; at 00ae9c15, in
``python/sglang/srt/metrics/collector.py``, gauges). The histograms are observed once per
transfer by the prefill server (``compute_and_observe_kv_transfer_metrics`` in
``req_time_stats.py``: latency, size in MB = bytes / 2^20, speed in "GB/s" = MB / 1024 / s)
and, for bootstrap and allocation waits, by both servers. The gauges hold the last finished
transfer's values at the scheduler's last stats log (``multiprocess_mode="mostrecent"``): a
gauge of one transfer is not a distribution, so only the latency gauge is read, as the gauge
``inference_kv_transfer_last_seconds``; the size gauge cannot become a byte counter and the
bootstrap and allocation gauges are not read. ``sglang:kv_transfer_speed_gb_s`` is not read
in either form: each observation is the size over the latency of the same transfer, and the
bandwidth is ``rate(inference_kv_transfer_bytes_total)`` over
``rate(inference_kv_transfer_seconds_sum)`` of the same (prefill) server.
``sglang:kv_transfer_timeouts_total{stage}`` counts timeout observations per sender and
receiver, not failed requests, and is not added to the failures.

The server's role is the scheduler's ``engine_type`` label (``--disaggregation-mode``:
prefill, decode; unified is ``both``).

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

from exporter.engines.rules import LabelMatcher, Rule, Source, noted, rule
from exporter.engines.spec import (
    OPENAI_MODELS,
    EngineSpec,
    RoleLabel,
    Serving,
    Tokenize,
    Version,
    left_out,
)

PREFIX = "sglang:"
MODEL_LABELS = ("model_name", "name")
#: Labels whose values are copies of one scheduler's numbers (see the module docstring).
REPLICAS = ("tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank", "cp_rank", "pid")
#: SGLang's "MB" of KV transferred: the byte count divided by 1024 * 1024.
MIB = 1048576.0


def _s(metric: str, *matchers: LabelMatcher) -> Source:
    """A tokenizer-manager series: one per model."""
    return Source(metric, matchers, model_label=MODEL_LABELS)


def _sched(metric: str, *matchers: LabelMatcher, scale: float = 1.0) -> Source:
    """A scheduler series: tensor-parallel copies collapse to one."""
    return Source(metric, matchers, model_label=MODEL_LABELS, replicas=REPLICAS, scale=scale)


def _ms(metric: str, *matchers: LabelMatcher) -> Source:
    """A scheduler series in milliseconds, read in seconds."""
    return Source(metric, matchers, model_label=MODEL_LABELS, replicas=REPLICAS, divisor=1000.0)


def _stage(stage: str) -> Source:
    return _sched("sglang:per_stage_req_latency_seconds", LabelMatcher("stage", "=", stage))


def _waiting(metric: str, stage: str, *matchers: LabelMatcher) -> Source:
    """A disaggregation queue gauge, counted as waiting for ``stage``."""
    return Source(
        metric, matchers, model_label=MODEL_LABELS, replicas=REPLICAS, fixed=(("stage", stage),)
    )


def _failed(metric: str, reason: str) -> Source:
    return Source(metric, model_label=MODEL_LABELS, replicas=REPLICAS, fixed=(("reason", reason),))


#: The scheduler's ``engine_type`` label: ``--disaggregation-mode`` (``unified`` when off).
ROLE = RoleLabel("engine_type", (("prefill", "prefill"), ("decode", "decode"), ("unified", "both")))
_DECODE_SERVER = LabelMatcher("engine_type", "=", "decode")
_NOT_DECODE_SERVER = LabelMatcher("engine_type", "!=", "decode")


RULES: tuple[Rule, ...] = (
    rule(
        "inference_queue_depth",
        _sched("sglang:num_queue_reqs"),
        noted(_sched("sglang:num_requests_waiting"), "0.3"),
    ),
    rule(
        "inference_requests_running",
        _sched("sglang:num_running_reqs"),
        noted(_sched("sglang:num_requests_running"), "0.3"),
    ),
    rule(
        "inference_kv_cache_usage_ratio",
        noted(_sched("sglang:token_usage"), "the share of the KV token pool in use"),
        aggregate="max",
    ),
    rule("inference_kv_cache_capacity_tokens", _sched("sglang:max_total_num_tokens")),
    rule("inference_prompt_tokens_total", _s("sglang:prompt_tokens_total")),
    rule(
        "inference_prompt_tokens_cached_total",
        noted(_s("sglang:cached_tokens_total"), "every cache_source"),
        _sched("sglang:realtime_tokens_total", LabelMatcher("mode", "=", "prefill_cache")),
    ),
    rule("inference_generation_tokens_total", _s("sglang:generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("sglang:time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        _s("sglang:inter_token_latency_seconds"),
        noted(
            _s("sglang:time_per_output_token_seconds"),
            "releases before the ITL histogram: a per-request mean, the closest",
        ),
    ),
    rule("inference_e2e_request_latency_seconds", _s("sglang:e2e_request_latency_seconds")),
    rule(
        "inference_queue_time_seconds",
        _sched("sglang:queue_time_seconds"),
        _stage("prefill_waiting"),
        noted(_s("sglang:waiting_request_latency_seconds"), "0.3"),
    ),
    rule(
        "inference_prefill_time_seconds",
        noted(_stage("prefill_forward"), "the last chunk's forward of a chunked prefill"),
    ),
    rule("inference_decode_time_seconds", _stage("decode_loop")),
    rule(
        "inference_tokenizer_latency_seconds",
        _s("sglang:per_stage_req_latency_seconds", LabelMatcher("stage", "=", "tokenize")),
    ),
    rule(
        "inference_queue_depth_by_stage",
        (
            _waiting("sglang:num_queue_reqs", "prefill", _NOT_DECODE_SERVER),
            _waiting("sglang:num_queue_reqs", "decode", _DECODE_SERVER),
            _waiting("sglang:num_prefill_prealloc_queue_reqs", "prealloc"),
            noted(
                _waiting("sglang:num_prefill_bootstrap_queue_reqs", "prealloc"),
                "the later name of the one before",
            ),
            _waiting("sglang:num_decode_prealloc_queue_reqs", "prealloc"),
            _waiting("sglang:num_prefill_inflight_queue_reqs", "transfer"),
            _waiting("sglang:num_decode_transfer_queue_reqs", "transfer"),
        ),
    ),
    rule(
        "inference_kv_transfer_seconds",
        noted(_ms("sglang:kv_transfer_latency_ms"), "the histogram of 2026"),
    ),
    # The same name as a gauge (releases before the histogram): a histogram rule reads only
    # _bucket/_sum/_count, this gauge rule only the bare sample, so each form feeds one name.
    # Only a prefill server sets it; elsewhere it stays at 0, which is no transfer's latency.
    rule(
        "inference_kv_transfer_last_seconds",
        noted(
            _ms("sglang:kv_transfer_latency_ms", LabelMatcher("engine_type", "=", "prefill")),
            "the gauge of older releases: the last transfer's latency, set on a prefill server "
            "only",
        ),
    ),
    rule(
        "inference_kv_transfer_bytes_total",
        noted(
            _sched("sglang:kv_transfer_total_mb_sum", scale=MIB),
            "the histogram of 2026; SGLang's MB is 2^20 bytes",
        ),
    ),
    rule("inference_kv_transfer_bootstrap_seconds", _ms("sglang:kv_transfer_bootstrap_ms")),
    rule("inference_kv_transfer_alloc_wait_seconds", _ms("sglang:kv_transfer_alloc_ms")),
    rule(
        "inference_kv_transfer_failures_total",
        (
            _failed("sglang:num_transfer_failed_reqs_total", "transfer"),
            _failed("sglang:num_bootstrap_failed_reqs_total", "bootstrap"),
        ),
    ),
    rule(
        "inference_requests_rejected_total",
        Source(
            "sglang:num_queue_rejected_requests_total",
            model_label=MODEL_LABELS,
            replicas=REPLICAS,
            fixed=(("layer", "engine"),),
            note="the scheduler's waiting queue full or timed out; SGLang PR 34320",
        ),
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

LEFT_OUT = (
    *left_out(
        "other pools and views of the KV cache: token_usage, the main pool's share, is read",
        "sglang:num_used_tokens",
        "sglang:pending_prealloc_token_usage",
        "sglang:swa_token_usage",
        "sglang:mamba_usage",
        "sglang:decode_sum_seq_lens",
        "sglang:cache_config_info",
    ),
    *left_out(
        "a rate or ratio SGLang computes over its log interval: the counters read give it "
        "exactly for any window",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:new_token_ratio",
        "sglang:utilization",
        "sglang:kv_transfer_speed_gb_s",
    ),
    *left_out(
        "scheduler and start-up state: no bottleneck reads it",
        "sglang:max_running_requests_under_SLO",
        "sglang:engine_startup_time",
        "sglang:engine_load_weights_time",
        "sglang:is_cuda_graph",
        "sglang:cuda_graph_passes_total",
        "sglang:num_running_reqs_offline_batch",
        "sglang:num_paused_reqs",
        "sglang:num_prefill_retries_total",
    ),
    *left_out(
        "structured output's grammar queue and compilation: a queue before the scheduler's, "
        "for grammar requests only",
        "sglang:num_grammar_queue_reqs",
        "sglang:grammar_compilation_time_seconds",
        "sglang:num_grammar_cache_hit_total",
        "sglang:num_grammar_aborted_total",
        "sglang:num_grammar_timeout_total",
        "sglang:num_grammar_total",
        "sglang:grammar_schema_count",
        "sglang:grammar_ebnf_size",
        "sglang:grammar_tree_traversal_time_avg",
        "sglang:grammar_tree_traversal_time_max",
    ),
    *left_out(
        "speculative decoding's acceptance: no signature reads it yet",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
    ),
    *left_out(
        "retractions (SGLang's preemption): a symptom of a full KV cache, which the KV usage shows",
        "sglang:num_retracted_reqs",
        "sglang:num_retracted_requests_total",
        "sglang:num_retracted_input_tokens_total",
        "sglang:num_retracted_output_tokens_total",
        "sglang:num_retractions",
    ),
    *left_out(
        "expert-parallel load balance",
        "sglang:eplb_balancedness",
        "sglang:eplb_gpu_physical_count",
    ),
    *left_out(
        "the LoRA adapter pool",
        "sglang:lora_pool_slots_used",
        "sglang:lora_pool_slots_total",
        "sglang:lora_pool_utilization",
    ),
    *left_out(
        "routing keys of the batch and the prefill delayer's decisions: scheduling policy",
        "sglang:num_unique_running_routing_keys",
        "sglang:routing_key_running_req_count",
        "sglang:routing_key_all_req_count",
        "sglang:prefill_delayer_wait_forward_passes",
        "sglang:prefill_delayer_wait_seconds",
        "sglang:prefill_delayer_outcomes_total",
    ),
    *left_out(
        "GPU busy time as the engine counts it: the driver's (NVML) is read",
        "sglang:gpu_execution_seconds_total",
        "sglang:dp_cooperation_realtime_tokens_total",
        "sglang:dp_cooperation_gpu_execution_seconds_total",
    ),
    *left_out(
        "request sizes and counts: the token counters and the request histograms give them",
        "sglang:prompt_tokens_histogram",
        "sglang:generation_tokens_histogram",
        "sglang:num_requests_total",
        "sglang:num_so_requests_total",
    ),
    *left_out(
        "requests the client or the tokenizer manager aborted: no refusal at admission",
        "sglang:num_aborted_requests_total",
    ),
    *left_out(
        "the hierarchical KV cache's host and storage tiers",
        "sglang:prefetched_tokens_total",
        "sglang:backuped_tokens_total",
        "sglang:prefetch_pgs",
        "sglang:backup_pgs",
        "sglang:prefetch_bandwidth",
        "sglang:backup_bandwidth",
        "sglang:eviction_duration_seconds",
        "sglang:evicted_tokens_total",
        "sglang:load_back_duration_seconds",
        "sglang:load_back_tokens_total",
    ),
)

SPEC = EngineSpec(
    name="sglang",
    title="SGLang",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(),
    preallocates_memory=True,
    # The router (sglang_router, sglang-router) is no engine: it has no sglang: metrics.
    process=r"sglang(?![-_]router)",
    model=OPENAI_MODELS,
    version=Version(path="/get_server_info"),
    role=ROLE,
    left_out=LEFT_OUT,
    serving=Serving(images=(r"lmsysorg/sglang",), port=30000),
)
