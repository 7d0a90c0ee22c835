"""llm-d's endpoint picker (the inference scheduler, later the llm-d router's EPP): the
gateway's own queue (flow control) and its disaggregation decisions.

Source: llm-d/llm-d-router ``docs/metrics.md`` and ``pkg/epp/metrics/`` (2026). The picker
sits in front of a pool of engines (an ``InferencePool``). With flow control on (the
``flowControl`` feature gate) it holds requests in its own queue while the pool is saturated
and dispatches them by priority: requests then wait *before* any engine, whose own queues stay
short, so the gateway's queue is read into ``inference_gateway_*`` (queue depth by priority,
the time dispatched requests waited, the saturation that gates dispatch by stage, requests by
outcome, endpoints whose metrics it finds stale, ready endpoints) and its refusals into
``inference_requests_rejected_total{layer="gateway"}``. The saturation is fail-closed: an
endpoint whose metrics are missing or stale counts as saturated, so a gateway whose scrape of
the engines is broken sheds load and queues while the GPUs idle; the stale count says so.

Names moved three times, and the picker writes a deprecated name next to its successor while
both live (dual emission): ``inference_extension_flow_control_*`` and ``inference_pool_*``
(the Gateway API inference extension's picker, and llm-d's until August 2026), then
``llm_d_router_epp_`` and ``llm_d_epp_``. A rule takes the first alternative that has series,
newest first, so nothing is counted twice whatever the picker emits. The pool saturation of
releases before stage-aware gating has no ``stage``: it is the ``effective`` one. The queue's
model is ``target_model_name`` (the model the pool serves the request with), else
``model_name`` (the one the request named); the pool is ``inference_pool`` (``name`` on the
pool gauges).

The disaggregation decisions: for every request the picker routes it counts which stages ran,
label ``decision_type`` = ``decode-only``, ``prefill-decode``, ``encode-decode`` or
``encode-prefill-decode``, and ``model_name`` (``unknown`` when the request names none: model
``""`` here, as is every count of the first release, which had no ``model_name``). Two
plugins write two counters: the ``disagg-profile-handler`` ``disagg_decision_total`` (all four
decisions), the deprecated ``pd-profile-handler`` ``pd_decision_total`` (the first two), under
the prefixes ``llm_d_inference_scheduler_`` (llm-d-inference-scheduler, whose first release
had no ``model_name``), ``llm_d_router_epp_`` and ``llm_d_epp_``.

The mapping is :data:`RULES` below, each source with its note; ``docs/engines.md`` shows
it as a table (``python build-tools/docgen.py``).

The picker routes; it runs no model. Its endpoint is of layer ``frontend`` (nothing it
exports is counted twice against the engines polled with it) and its ``role`` is what
``--engine.role`` says (``both`` by default); the gateway's own series carry no role. It
serves ``/metrics`` on port 9090.
"""

from __future__ import annotations

from exporter.engines.rules import LabelMatcher, Rule, Source, noted, rule
from exporter.engines.spec import EngineSpec, left_out

#: Newest first.
PREFIXES = ("llm_d_epp_", "llm_d_router_epp_", "llm_d_inference_scheduler_")
#: The Gateway API inference extension's names, which llm-d's picker also wrote until 2026.
GIE_PREFIXES = ("inference_extension_", "inference_pool_")
#: Flow control's families, newest first.
FLOW = ("llm_d_epp_", "llm_d_router_epp_", "inference_extension_")
MODEL_LABEL = "model_name"
#: The queue's model: the one the pool serves the request with, else the one it named.
QUEUE_MODEL = ("target_model_name", "model_name")
#: The gateway queue's terminal outcomes -> the contract's ``outcome``.
OUTCOMES = (
    ("Dispatched", "dispatched"),
    ("RejectedCapacity", "rejected_capacity"),
    ("RejectedNoEndpoints", "rejected_no_endpoints"),
    ("RejectedOther", "rejected_other"),
    ("EvictedTTL", "evicted_ttl"),
    ("EvictedNoEndpoints", "evicted_no_endpoints"),
    ("EvictedContextCancelled", "evicted_context_cancelled"),
    ("EvictedOther", "evicted_other"),
)
#: Outcomes that refuse a request at admission -> ``inference_requests_rejected_total``'s
#: ``reason``.
REJECTIONS = (
    ("RejectedCapacity", "capacity"),
    ("RejectedNoEndpoints", "no_endpoints"),
    ("RejectedOther", "other"),
)
_POOL = (("pool", "inference_pool"),)
#: ``decision_type`` -> the contract's ``decision``.
DECISIONS = (
    ("prefill-decode", "prefill_decode"),
    ("decode-only", "decode_only"),
    ("encode-decode", "encode_decode"),
    ("encode-prefill-decode", "encode_prefill_decode"),
)


def _decisions(metric: str) -> tuple[Source, ...]:
    """One source per decision of one counter."""
    return tuple(
        Source(
            metric,
            (LabelMatcher("decision_type", "=", theirs),),
            model_label=MODEL_LABEL,
            blank_models=("unknown",),
            fixed=(("decision", ours),),
        )
        for theirs, ours in DECISIONS
    )


def _queue(prefix: str) -> Source:
    return Source(prefix + "flow_control_queue_size", model_label=QUEUE_MODEL, relabel=_POOL)


def _queue_time(prefix: str) -> Source:
    return Source(
        prefix + "flow_control_request_queue_duration_seconds",
        (LabelMatcher("outcome", "=", "Dispatched"),),
        model_label=QUEUE_MODEL,
        relabel=_POOL,
    )


def _saturation(prefix: str) -> tuple[Source, ...]:
    """The saturation by stage; a series without one (releases before stage-aware gating)
    is the effective saturation."""
    metric = prefix + "flow_control_pool_saturation"
    return (
        Source(metric, (LabelMatcher("stage", "!=", ""),), engine_wide=True, relabel=_POOL),
        Source(
            metric,
            (LabelMatcher("stage", "=", ""),),
            engine_wide=True,
            relabel=_POOL,
            fixed=(("stage", "effective"),),
        ),
    )


def _outcomes(metric: str) -> tuple[Source, ...]:
    """One source per known outcome, and one for those this table does not know yet."""
    known = "|".join(theirs for theirs, _ in OUTCOMES)
    return (
        *(
            Source(
                metric,
                (LabelMatcher("outcome", "=", theirs),),
                engine_wide=True,
                relabel=_POOL,
                fixed=(("outcome", ours),),
            )
            for theirs, ours in OUTCOMES
        ),
        Source(
            metric,
            (LabelMatcher("outcome", "!~", known),),
            engine_wide=True,
            relabel=_POOL,
            fixed=(("outcome", "unknown"),),
        ),
    )


def _rejected(metric: str) -> tuple[Source, ...]:
    return tuple(
        Source(
            metric,
            (LabelMatcher("outcome", "=", theirs),),
            engine_wide=True,
            fixed=(("layer", "gateway"), ("reason", ours)),
        )
        for theirs, ours in REJECTIONS
    )


RULES: tuple[Rule, ...] = (
    rule("inference_gateway_queue_depth", *(_queue(prefix) for prefix in FLOW)),
    rule("inference_gateway_queue_time_seconds", *(_queue_time(prefix) for prefix in FLOW)),
    rule(
        "inference_gateway_pool_saturation",
        *(_saturation(prefix) for prefix in FLOW),
        aggregate="max",
    ),
    rule(
        "inference_gateway_requests_total",
        _outcomes("llm_d_epp_flow_control_requests_total"),
        note="a counter of 2026: no older name",
    ),
    rule(
        "inference_gateway_stale_endpoints",
        noted(
            Source("llm_d_epp_flow_control_stale_endpoints", engine_wide=True),
            "one series per saturation detector: the largest",
        ),
        aggregate="max",
    ),
    rule(
        "inference_gateway_ready_endpoints",
        Source("llm_d_epp_ready_endpoints", engine_wide=True, relabel=(("pool", "name"),)),
        Source("inference_pool_ready_pods", engine_wide=True, relabel=(("pool", "name"),)),
    ),
    rule(
        "inference_requests_rejected_total",
        _rejected("llm_d_epp_flow_control_requests_total"),
    ),
    rule(
        "inference_pd_decisions_total",
        *(_decisions(prefix + "disagg_decision_total") for prefix in PREFIXES),
        *(_decisions(prefix + "pd_decision_total") for prefix in PREFIXES),
    ),
)

_EPP = "llm_d_epp_"
LEFT_OUT = (
    *left_out(
        "requests as the gateway sees them (latency, sizes, tokens, in flight): the "
        "engines' own series measure the same requests; the gateway's own wait is the "
        "flow-control queue time, which is read",
        *(
            _EPP + name
            for name in (
                "request_total",
                "request_error_total",
                "request_duration_seconds",
                "request_size_bytes",
                "response_size_bytes",
                "request_input_tokens",
                "request_output_tokens",
                "request_cached_tokens",
                "request_running",
                "request_ntpot_seconds",
                "request_ttft_seconds",
                "request_streaming_tpot_seconds",
                "request_streaming_itl_seconds",
            )
        ),
    ),
    *left_out(
        "means and spreads over the pool's endpoints, and each endpoint's queue as the "
        "picker last scraped it, of the engines' own series, which are read per pod",
        *(
            _EPP + name
            for name in (
                "average_kv_cache_utilization",
                "average_queue_size",
                "average_running_requests",
                "std_dev_kv_cache_utilization",
                "std_dev_queue_size",
                "std_dev_running_requests",
                "per_endpoint_queue_size",
                "inflight_requests",
                "inflight_tokens",
            )
        ),
    ),
    *left_out(
        "the picker's own cost and health (scheduling, plugins, ext_proc streams, dispatch "
        "cycle, data-layer errors; stale endpoints, which is read, says when its scrape of "
        "the engines failed)",
        *(
            _EPP + name
            for name in (
                "scheduler_e2e_duration_seconds",
                "scheduler_attempts_total",
                "request_processing_duration_seconds",
                "response_processing_duration_seconds",
                "plugin_duration_seconds",
                "extproc_streams_inflight",
                "extproc_stream_duration_seconds",
                "extproc_streams_total",
                "flow_control_dispatch_cycle_duration_seconds",
                "flow_control_request_enqueue_duration_seconds",
                "datalayer_poll_errors_total",
                "datalayer_extract_errors_total",
                "info",
            )
        ),
    ),
    *left_out(
        "the queue in bytes and its fill against the configured limits: its depth and its "
        "refusals are read",
        *(
            _EPP + name
            for name in (
                "flow_control_queue_bytes",
                "flow_control_capacity_utilization_requests",
                "flow_control_capacity_utilization_bytes",
                "flow_control_global_capacity_utilization_requests",
                "flow_control_global_capacity_utilization_bytes",
            )
        ),
    ),
    *left_out(
        "routing policy state: model rewrites, prefix-cache and encoder-cache indexes, "
        "fairness, predicted latency, DisaggregatedSet rollouts",
        *(
            _EPP + name
            for name in (
                "model_rewrite_decisions_total",
                "prefix_indexer_size",
                "prefix_indexer_hit_ratio",
                "prefix_indexer_hit_bytes",
                "encoder_cache_queries_total",
                "encoder_cache_hits_total",
                "encoder_cache_hit_ratio",
                "program_aware_jains_fairness_index",
                "program_aware_avg_wait_time_milliseconds",
                "program_aware_attained_service_tokens",
                "inference_request_metric",
                "request_predicted_ttft_seconds",
                "request_ttft_prediction_duration_seconds",
                "request_predicted_tpot_seconds",
                "request_tpot_prediction_duration_seconds",
                "request_slo_violation_total",
                "disaggregatedset_strict_header_no_match_total",
                "disaggregatedset_revision_gating_share",
                "kv_cache_index_admissions_total",
                "kv_cache_index_evictions_total",
                "kv_cache_index_lookup_requests_total",
                "kv_cache_index_lookup_hits_total",
                "kv_cache_index_max_pod_hit_count_total",
                "kv_cache_index_lookup_latency_seconds",
                "kv_cache_events_dedup_removed_hashes_suppressed_total",
                "kv_cache_events_dedup_removed_hashes_forwarded_total",
            )
        ),
    ),
)

SPEC = EngineSpec(
    name="llmd-epp",
    title="llm-d endpoint picker",
    prefixes=(*PREFIXES, *GIE_PREFIXES),
    rules=RULES,
    tokenize=None,
    process=r"(^|/)epp( |$)",
    frontend_prefixes=(*PREFIXES, *GIE_PREFIXES),
    left_out=LEFT_OUT,
)
