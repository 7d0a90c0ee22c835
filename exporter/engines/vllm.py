"""vLLM: ``vllm:*`` metrics of the OpenAI-compatible server.

Sources: ``vllm/v1/metrics/loggers.py`` (V1 engine, 0.8 and later; labels ``model_name`` and
``engine``, the engine-core index, one series per data-parallel engine) and
``vllm/engine/metrics.py`` (V0 engine, up to 0.10; label ``model_name`` only). The model is the
``model_name`` label (``--served-model-name``). Captured scrapes in
``tests/fixtures/engines/``: a V0 server of mid-2024 and a V1 server of January 2026 (seen
through a Dynamo worker, which passes the ``vllm:`` lines through unchanged), and a
data-parallel excerpt (``engine="1"``).

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

How several series of one model combine:

* Data-parallel engines (label ``engine``): counts, counters and histograms are summed, KV
  cache usage is the fullest engine's, the KV capacity is the engines' pools added up, and
  the per-GPU estimates (``--enable-mfu-metrics``) are the mean over engines: still one GPU's
  share, so their rate divided by one GPU's peak is the model-FLOPs utilisation.
* ``--api-server-count`` above 1: the API servers share one prometheus_client multiprocess
  directory, whose collector already sums counters and histograms over the processes and keeps
  the most recent value of each gauge; the exposition has no ``pid`` label and nothing is
  counted twice.
* ``vllm:cache_config_info`` has no ``model_name`` label: it belongs to the server's model.
* ``vllm:prompt_tokens_total`` already counts cached tokens; ``prompt_tokens_by_source`` splits
  the same tokens, so it is read only for the cached part, and only without
  ``prompt_tokens_cached_total``.

vLLM's metrics do not say whether a server is a prefill or a decode server of a
disaggregated pair (both usually run ``kv_role`` ``kv_both``): ``--engine.role`` says it.

Not mapped: ``vllm:request_time_per_output_token_seconds`` (a per-request mean, not the
inter-token latency), ``vllm:num_requests_swapped`` (V0 only). vLLM exports no tokenizer
latency and no version; the version comes from ``GET /version``.
"""

from __future__ import annotations

from exporter.engines.rules import LabelMatcher, Rule, Source, rule
from exporter.engines.spec import OPENAI_MODELS, EngineSpec, Serving, Tokenize, Version, left_out

PREFIX = "vllm:"
MODEL_LABEL = "model_name"


def _s(
    metric: str, *matchers: LabelMatcher, value_labels: tuple[str, ...] = (), note: str = ""
) -> Source:
    return Source(
        metric,
        matchers,
        model_label=MODEL_LABEL,
        value_labels=value_labels,
        engine_wide=bool(value_labels),
        note=note,
    )


def _failed(metric: str, reason: str, note: str = "") -> Source:
    return Source(metric, model_label=MODEL_LABEL, fixed=(("reason", reason),), note=note)


RULES: tuple[Rule, ...] = (
    rule("inference_queue_depth", _s("vllm:num_requests_waiting")),
    rule(
        "inference_queue_depth_by_reason",
        _s("vllm:num_requests_waiting_by_reason", note="reason capacity or deferred"),
    ),
    rule("inference_requests_running", _s("vllm:num_requests_running")),
    rule(
        "inference_kv_cache_usage_ratio",
        _s("vllm:kv_cache_usage_perc"),
        _s("vllm:gpu_cache_usage_perc", note="deprecated 0.9, hidden 0.10, then removed"),
        aggregate="max",
    ),
    rule(
        "inference_kv_cache_capacity_tokens",
        _s("vllm:cache_config_info", value_labels=("kv_cache_size_tokens",)),
        _s("vllm:cache_config_info", value_labels=("num_gpu_blocks", "block_size")),
        note="no model label: the server's model",
    ),
    rule("inference_prompt_tokens_total", _s("vllm:prompt_tokens_total")),
    rule(
        "inference_prompt_tokens_cached_total",
        _s("vllm:prompt_tokens_cached_total"),
        _s(
            "vllm:prompt_tokens_by_source_total",
            LabelMatcher("source", "!=", "local_compute"),
            note="read only without the first: it splits the same tokens",
        ),
    ),
    rule("inference_generation_tokens_total", _s("vllm:generation_tokens_total")),
    rule("inference_time_to_first_token_seconds", _s("vllm:time_to_first_token_seconds")),
    rule(
        "inference_inter_token_latency_seconds",
        _s("vllm:inter_token_latency_seconds", note="0.11 and later"),
        _s(
            "vllm:time_per_output_token_seconds",
            note="deprecated 0.11, hidden 0.12, removed 0.13",
        ),
    ),
    rule("inference_e2e_request_latency_seconds", _s("vllm:e2e_request_latency_seconds")),
    rule(
        "inference_queue_time_seconds",
        _s("vllm:request_queue_time_seconds"),
        _s("vllm:time_in_queue_requests", note="V0, deprecated 0.8"),
    ),
    rule("inference_prefill_time_seconds", _s("vllm:request_prefill_time_seconds")),
    rule("inference_decode_time_seconds", _s("vllm:request_decode_time_seconds")),
    rule(
        "inference_kv_transfer_seconds",
        _s(
            "vllm:nixl_xfer_time_seconds",
            note="NixlConnector; on the decode server, which reads the KV",
        ),
    ),
    rule("inference_kv_transfer_bytes_total", _s("vllm:nixl_bytes_transferred_sum")),
    rule(
        "inference_kv_transfer_failures_total",
        (
            _failed("vllm:nixl_num_failed_transfers_total", "transfer"),
            _failed("vllm:nixl_num_failed_notifications_total", "notification"),
            _failed("vllm:nixl_num_kv_expired_reqs_total", "expired", "on the prefill server"),
        ),
    ),
    rule(
        "inference_requests_rejected_total",
        Source(
            "vllm:admission_rejections_total",
            model_label=MODEL_LABEL,
            fixed=(("layer", "engine"),),
            note="--max-num-queued-reqs, --max-num-queued-tokens: HTTP 503; vLLM PR 55812",
        ),
    ),
    rule(
        "inference_estimated_flops_total",
        _s("vllm:estimated_flops_per_gpu_total", note="--enable-mfu-metrics"),
        aggregate="mean",
    ),
    rule(
        "inference_estimated_read_bytes_total",
        _s("vllm:estimated_read_bytes_per_gpu_total"),
        aggregate="mean",
    ),
    rule(
        "inference_estimated_write_bytes_total",
        _s("vllm:estimated_write_bytes_per_gpu_total"),
        aggregate="mean",
    ),
)

LEFT_OUT = (
    *left_out(
        "prefix-cache lookups in tokens: the cached share of the prompt is read "
        "(prompt_tokens_cached), the hit rate is no bottleneck",
        "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
    ),
    *left_out(
        "preemptions: a symptom of a full KV cache, which the KV usage shows",
        "vllm:num_preemptions_total",
    ),
    *left_out(
        "finished requests by finish reason: the request histograms count them",
        "vllm:request_success_total",
    ),
    *left_out(
        "request and batch sizes: the workload, not a bottleneck; the token counters give "
        "the throughput",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_n",
        "vllm:request_params_max_tokens",
    ),
    *left_out(
        "prefill plus decode time, each read on its own",
        "vllm:request_inference_time_seconds",
    ),
    *left_out("LoRA adapters by name: label values without bound", "vllm:lora_requests_info"),
    *left_out(
        "speculative decoding's acceptance: no signature reads it yet",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ),
)

SPEC = EngineSpec(
    name="vllm",
    title="vLLM",
    prefixes=(PREFIX,),
    rules=RULES,
    tokenize=Tokenize(),
    preallocates_memory=True,
    process="vllm",
    left_out=LEFT_OUT,
    model=OPENAI_MODELS,
    version=Version(path="/version"),
    serving=Serving(
        images=(
            r"vllm-openai",
            r"(^|/)vllm/",
            r"llm-d/llm-d(-(cuda|rocm|xpu|cpu|gaudi|hpu))?(:|@|$)",
            r"kthena-engine:vllm",
        ),
        port=8000,
    ),
)
