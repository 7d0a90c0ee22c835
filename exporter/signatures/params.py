"""The tunable parameters of every alert: names, kinds and defaults.

The defaults are rules of thumb of GPU LLM serving (a GPU under 60 % busy while its queue grows
is starved by the CPU side; softirq above 5 % of CPU time competes with the engine; keep 10-15 %
of the KV cache free).

A site overrides them under ``signatures.<AlertName>.<param>`` in the config file; the
config loader validates against this table, the catalogue reads the merged values, and the
runbooks list them. ``for`` is a parameter of every alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exporter.engines import SPECS
from exporter.metrics import THROTTLE_REASONS

ParamKind = Literal["ratio", "number", "factor", "duration", "bucket", "xids", "names", "reasons"]
ParamValue = float | tuple[int, ...] | tuple[str, ...]


@dataclass(frozen=True)
class Param:
    """One tunable of one alert."""

    name: str
    kind: ParamKind
    default: ParamValue
    help: str


def _for(default: float) -> Param:
    return Param("for", "duration", default, "how long the condition must hold before firing")


MIN = 60.0

# Workload shape, advice rather than alerts (``diagnose`` and the dashboard): mean prompts longer
# than this make a pod prefill-bound, mean outputs longer than this decode-bound - the rule of
# thumb for splitting prefill and decode into separate pools (disaggregated serving).
LONG_PROMPT_TOKENS = 2048
LONG_OUTPUT_TOKENS = 512
# The tensor peak the prefill compute efficiency is measured against: what LLM serving
# computes in unless the model is quantised to fp8 (whose peak is twice this one).
PREFILL_PRECISION = "bf16"

PARAMS: dict[str, tuple[Param, ...]] = {
    "InferenceGPUStarvedQueueGrowing": (
        _for(10 * MIN),
        Param("utilization_below", "ratio", 0.6, "mean GPU utilisation of the target below this"),
        Param(
            "queue_growth_above",
            "number",
            0.0,
            "queue trend (requests per queue_trend window, from deriv) above this",
        ),
        Param("queue_depth_at_least", "number", 1.0, "and at least this many requests waiting"),
    ),
    "InferenceEngineStalled": (
        _for(10 * MIN),
        Param(
            "queue_depth_at_least",
            "number",
            1.0,
            "requests waiting in the engine's own queue (the gateway's left out) at least this",
        ),
        Param(
            "kv_cache_below",
            "ratio",
            0.05,
            "while none runs, no token was generated in the rate window and the KV cache is "
            "below this: nothing holds the engine's memory, it has stopped admitting",
        ),
    ),
    "InferenceRequestsRejected": (
        _for(5 * MIN),
        Param(
            "rejected_share_above",
            "ratio",
            0.05,
            "share of arrivals refused at admission (refused / (refused + served)) above this",
        ),
    ),
    "InferenceGatewayStaleEndpoints": (
        _for(5 * MIN),
        Param(
            "utilization_below",
            "ratio",
            0.5,
            "mean GPU utilisation of the engines of the gateway's pool below this",
        ),
        Param(
            "queue_depth_at_least",
            "number",
            1.0,
            "while the gateway holds at least this many requests in its queue (or sheds any)",
        ),
    ),
    "InferenceTokenizerSlowerThanDecode": (
        _for(15 * MIN),
        Param(
            "decode_step_factor",
            "factor",
            1.0,
            "median tokenizer latency above this many median inter-token latencies",
        ),
    ),
    "InferenceFrontendCPUSaturated": (
        _for(10 * MIN),
        Param("hottest_thread_above", "ratio", 0.9, "busiest engine thread's share of one core"),
        Param("utilization_below", "ratio", 0.6, "while mean GPU utilisation is below this"),
    ),
    "InferenceSoftirqCPUHigh": (
        _for(10 * MIN),
        Param("node_share_above", "ratio", 0.05, "softirq share of all CPU time of the node"),
        Param("hottest_core_above", "ratio", 0.5, "or softirq share of the busiest single core"),
    ),
    "InferenceHBMBandwidthSaturated": (
        _for(15 * MIN),
        Param("bandwidth_above", "ratio", 0.9, "HBM bandwidth utilisation above this"),
        Param(
            "per_request_drop_above",
            "ratio",
            0.2,
            "generation tokens/s per running request this far below its value one baseline "
            "window earlier",
        ),
    ),
    "InferenceGPUMemoryHeadroomLow": (
        _for(10 * MIN),
        Param("kv_cache_above", "ratio", 0.9, "KV-cache usage above this (engines that report it)"),
        Param(
            "framebuffer_above",
            "ratio",
            0.97,
            "framebuffer used/total above this (only engines that report no KV cache and do "
            "not pre-allocate)",
        ),
        Param(
            "preallocating_engines",
            "names",
            tuple(spec.name for spec in SPECS if spec.preallocates_memory),
            "engines that reserve most of the framebuffer at start-up by design; their "
            "framebuffer usage never fires",
        ),
    ),
    "InferenceQueueWaitDominatesLatency": (
        _for(15 * MIN),
        Param("queue_share_above", "ratio", 0.3, "queue time as a share of end-to-end latency"),
    ),
    "InferenceKVTransferBound": (
        _for(10 * MIN),
        Param(
            "transfer_share_above",
            "ratio",
            0.3,
            "KV transfer as a share of time to first token (queue + prefill + transfer)",
        ),
        Param(
            "decode_kv_usage_below",
            "ratio",
            0.9,
            "while the decode pool has free slots: its KV-cache usage below this and no queue",
        ),
    ),
    "InferenceKVTransferFailing": (
        _for(5 * MIN),
        Param(
            "failure_ratio_above",
            "ratio",
            0.01,
            "share of KV transfers that failed or expired (of failed + successful)",
        ),
    ),
    "InferencePrefillPoolShort": (
        _for(10 * MIN),
        Param("queue_depth_at_least", "number", 1.0, "prefill pool: mean requests waiting"),
        Param("other_queue_below", "number", 1.0, "while the decode pool waits on fewer than this"),
    ),
    "InferenceDecodePoolShort": (
        _for(10 * MIN),
        Param("queue_depth_at_least", "number", 1.0, "decode pool: mean requests waiting"),
        Param(
            "other_queue_below", "number", 1.0, "while the prefill pool waits on fewer than this"
        ),
    ),
    "InferenceGPUUtilizationPulsing": (
        _for(5 * MIN),
        Param(
            "idle_sample_at_most",
            "bucket",
            0.05,
            "a utilisation sample at or below this counts as idle (a bucket bound of "
            "inference_gpu_utilization_samples)",
        ),
        Param("idle_share_above", "ratio", 0.3, "share of idle samples above this"),
        Param(
            "busy_sample_above",
            "bucket",
            0.9,
            "a utilisation sample above this counts as saturated (a bucket bound of "
            "inference_gpu_utilization_samples)",
        ),
        Param("busy_share_above", "ratio", 0.2, "and share of saturated samples above this"),
    ),
    "InferenceGPUUnderutilized": (
        _for(30 * MIN),
        Param("utilization_below", "ratio", 0.3, "mean GPU utilisation below this"),
    ),
    "InferenceDecodeOverheadBound": (
        _for(15 * MIN),
        Param(
            "efficiency_below",
            "ratio",
            0.33,
            "decode roofline efficiency (HBM floor of a step / mean inter-token latency) below "
            "this: steps take three times their floor or more",
        ),
        Param(
            "bandwidth_below",
            "ratio",
            0.5,
            "while measured HBM bandwidth utilisation is below this (the bus is not the limit)",
        ),
    ),
    "InferenceGPUBusySMsIdle": (
        _for(15 * MIN),
        Param("utilization_above", "ratio", 0.9, "mean GPU utilisation (GPU-Util) above this"),
        Param("sm_active_below", "ratio", 0.3, "while mean SM activity is below this"),
    ),
    "InferenceInterconnectBound": (
        _for(15 * MIN),
        Param(
            "link_utilization_above",
            "ratio",
            0.7,
            "mean NVLink use of the pod's GPUs (bytes per second in the busier direction over "
            "the links' peak) above this: the links run near their peak",
        ),
        Param("sm_active_below", "ratio", 0.3, "while mean SM activity is below this"),
    ),
    "InferenceHostLatencyShareHigh": (
        _for(15 * MIN),
        Param(
            "host_share_above",
            "ratio",
            0.25,
            "share of end-to-end latency outside queue, prefill and decode above this",
        ),
    ),
    "InferenceExporterDown": (_for(5 * MIN),),
    "InferenceCollectorFailing": (_for(15 * MIN),),
    "InferenceEngineMetricsDown": (_for(5 * MIN),),
    "InferenceNVMLUnavailable": (_for(15 * MIN),),
    "InferenceGPUAttributionUncertain": (_for(15 * MIN),),
    "InferenceGPUMetricsMissing": (_for(15 * MIN),),
    "InferenceGPULost": (_for(1 * MIN),),
    "InferenceGPUXidErrors": (
        _for(0.0),
        Param(
            "critical_xids",
            "xids",
            (48, 79, 94, 95),
            "Xids that mean the GPU needs a reset or the node drained (critical); others warn",
        ),
    ),
    "InferenceGPUContended": (
        _for(10 * MIN),
        Param(
            "others_above",
            "ratio",
            0.3,
            "other tenants' share of a shared GPU's time (its utilisation less the engine's) "
            "above this",
        ),
        Param(
            "queue_growth_above",
            "number",
            0.0,
            "queue trend (requests per queue_trend window, from deriv) above this",
        ),
        Param("queue_depth_at_least", "number", 1.0, "and at least this many requests waiting"),
        Param(
            "inter_token_rise_above",
            "ratio",
            0.2,
            "or median inter-token latency this far above its value one baseline window earlier",
        ),
    ),
    "InferenceGPUThrottled": (
        _for(10 * MIN),
        Param(
            "reasons",
            "reasons",
            THROTTLE_REASONS,
            "clock event reasons that count: hardware and thermal slowdowns, not power caps "
            "or idle clocks",
        ),
        Param(
            "power_cap_draw_at_least",
            "ratio",
            0.95,
            "a slowdown counts as the power cap when the GPU draws at least this share of the "
            "power limit it enforces (the description names the cause)",
        ),
    ),
}
