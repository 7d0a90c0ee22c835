"""Row "Roofline and latency budget": how far from the hardware limit, and where the time goes.

A decode step cannot be shorter than (weight bytes + live KV bytes) / peak HBM bandwidth, a
prefill cannot compute faster than the tensor peak; a request's latency splits into queue,
prefill, decode and the host's share. The panels read the rule pack's roofline records
(``docs/roofline.md``), so they show what the signatures measure; dashed lines are the
thresholds of the roofline signatures, or of the workload-shape advice.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    MODEL,
    AnyPanel,
    Query,
    Unit,
    alert_threshold,
    by,
    pct,
    rate,
    signal,
    target_legend,
    timeseries,
    warn,
)
from exporter.signatures.params import LONG_OUTPUT_TOKENS, LONG_PROMPT_TOKENS, PREFILL_PRECISION
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION, SM_ACTIVE
from exporter.signatures.signals.link_signals import GPUS, NVLINK_UTILIZATION
from exporter.signatures.signals.roofline_signals import (
    BUDGET_DECODE,
    BUDGET_HOST,
    BUDGET_PREFILL,
    BUDGET_QUEUE,
    BUDGET_TRANSFER,
    DECODE_EFFICIENCY,
    DECODE_FLOOR,
    INTER_TOKEN_MEAN,
    OUTPUT_TOKENS,
    PREFILL_EFFICIENCY,
    PROMPT_TOKENS,
    ROOFLINE_TOKENS,
)

TITLE = "Roofline and latency budget"

OVERHEAD = "InferenceDecodeOverheadBound"
SMS_IDLE = "InferenceGPUBusySMsIdle"
HOST = "InferenceHostLatencyShareHigh"
INTERCONNECT = "InferenceInterconnectBound"


def model_legend() -> str:
    return "{{model}} " + target_legend()


def efficiency() -> AnyPanel:
    below = alert_threshold(OVERHEAD, "efficiency_below")
    return timeseries(
        "Decode roofline efficiency",
        "The HBM floor of a decode step - (weight bytes + live KV-cache bytes) / peak HBM "
        "bandwidth of the GPU - over the mean inter-token latency, per served model: 1 means "
        "every step only moves bytes; 0.8-0.9 is excellent. Without the model facts "
        "(--model.path) it is the engine's estimated read bytes per second over the peak. Bad: "
        f"below {pct(below)} while the HBM bus is under half busy - steps wait on kernel "
        "launches, the scheduler or the host (CUDA graphs, overlap scheduling, larger batches).",
        [Query(signal(DECODE_EFFICIENCY, MODEL), model_legend())],
        unit=Unit.RATIO,
        thresholds=[warn(below)],
    )


def floor_vs_step() -> AnyPanel:
    return timeseries(
        "Decode step: HBM floor vs observed",
        "The shortest a decode step can take (the dashed line: weights and live KV cache read "
        "once at peak HBM bandwidth) and the mean inter-token latency a request sees. The gap "
        "is time spent on anything but moving bytes. Bad: the observed step several times its "
        "floor; the floor rising with the KV cache while the step rises faster.",
        [
            Query(signal(DECODE_FLOOR, MODEL), f"floor {model_legend()}", dashed=True),
            Query(signal(INTER_TOKEN_MEAN, MODEL), f"observed {model_legend()}"),
        ],
        unit=Unit.SECONDS,
    )


def budget() -> AnyPanel:
    above = alert_threshold(HOST, "host_share_above")
    parts = (
        ("queue", BUDGET_QUEUE),
        ("prefill", BUDGET_PREFILL),
        ("KV transfer", BUDGET_TRANSFER),
        ("decode", BUDGET_DECODE),
        ("host", BUDGET_HOST),
    )
    return timeseries(
        "Latency budget: queue, prefill, KV transfer, decode, host",
        "Where a request's end-to-end time goes, per served model, from rates of the engine's "
        "histogram sums: waiting in the queue, prefill, the KV transfer between prefill and "
        "decode engines (disaggregated serving; a decode engine's queue wait without it), "
        "decode, and the rest on the host "
        "(tokenize, detokenize, post-processing, streaming), stacked to 100 %. Engines that "
        "report all four histograms only (vLLM, SGLang, TensorRT-LLM, LMDeploy). Bad: the host "
        f"band above {pct(above)} (InferenceHostLatencyShareHigh); a growing queue band is "
        "overload.",
        [Query(signal(record, MODEL), f"{part} {model_legend()}") for part, record in parts],
        unit=Unit.RATIO,
        maximum=1.0,
        stack=True,
        bars=True,
        span=16,
    )


def prefill_efficiency() -> AnyPanel:
    return timeseries(
        "Prefill compute efficiency",
        "FLOPs of the prompt tokens computed (cached ones left out; 2 x parameters per token) "
        f"per second of prefill, over the GPU's dense {PREFILL_PRECISION} tensor peak. Prompts "
        "prefilled together are each charged the whole step, so batched prefills read low. "
        "Bad: low while prefill dominates the latency budget - prefill kernels or chunking "
        "leave the tensor cores idle.",
        [Query(signal(PREFILL_EFFICIENCY, MODEL), model_legend())],
        unit=Unit.RATIO,
        span=8,
    )


def tokens_vs_roofline() -> AnyPanel:
    generated = by("sum", rate("inference_generation_tokens_total", MODEL), "model")
    return timeseries(
        "Generated tokens/s vs the roofline",
        "Tokens generated per second and the dashed roofline: what the current batch would "
        "generate with every step at its HBM floor (mean requests running / floor). Bad: a "
        "wide gap at a steady batch - the same overhead the decode efficiency shows, in "
        "tokens/s.",
        [
            Query(generated, f"generated {model_legend()}"),
            Query(
                signal(ROOFLINE_TOKENS, MODEL),
                f"roofline {model_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.TOKENS_PER_SECOND,
        span=8,
    )


def utilisation_vs_sm_activity() -> AnyPanel:
    busy = alert_threshold(SMS_IDLE, "utilization_above")
    idle = alert_threshold(SMS_IDLE, "sm_active_below")
    return timeseries(
        "GPU-Util (device utilisation) vs SM activity",
        "Mean utilisation of the pod's GPUs, the device's (GPU-Util: a kernel was running, "
        "every tenant's work together), and mean SM activity (the SMs had a warp resident; GPM, "
        "Hopper and later, or dcgm-exporter's profiling field) over the pod's GPUs: what "
        "InferenceGPUBusySMsIdle reads. Bad: utilisation "
        f"above {pct(busy)} with SM activity below {pct(idle)} - tiny serial kernels keep "
        "GPU-Util at 100 % while the SMs idle (InferenceGPUBusySMsIdle).",
        [
            Query(
                signal(GPU_UTILIZATION),
                f"GPU-Util (device) {target_legend()}",
                thresholds=(warn(busy),),
            ),
            Query(
                signal(SM_ACTIVE),
                f"SM activity {target_legend()}",
                thresholds=(warn(idle),),
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        span=8,
    )


def interconnect() -> AnyPanel:
    links = alert_threshold(INTERCONNECT, "link_utilization_above")
    idle = alert_threshold(INTERCONNECT, "sm_active_below")
    return timeseries(
        "NVLink use vs SM activity",
        "Mean NVLink use of the pod's GPUs - bytes per second in each GPU's busier direction "
        "over its usable links' peak: the share of time the links would be busy at their peak "
        "rate, at least that share of each step spent communicating - against mean SM "
        "activity, and the pod's GPUs (right: its tensor-parallel degree). What "
        "InferenceInterconnectBound reads. Bad: links above "
        f"{pct(links)} of their peak while the SMs are active under {pct(idle)}, in a pod of "
        "several GPUs - the all-reduce (all-to-all) does not overlap compute. A GPU without "
        "NVLink has no line; in the dcgm layout the links need dcgm-exporter's "
        "DCGM_FI_PROF_NVLINK_* profiling fields.",
        [
            Query(
                signal(NVLINK_UTILIZATION),
                f"NVLink use {target_legend()}",
                thresholds=(warn(links),),
            ),
            Query(
                signal(SM_ACTIVE),
                f"SM activity {target_legend()}",
                thresholds=(warn(idle),),
            ),
            Query(signal(GPUS), f"GPUs {target_legend()}", axis="right", unit=Unit.COUNT),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        right_label="GPUs",
        span=8,
    )


def workload_shape() -> AnyPanel:
    return timeseries(
        "Workload shape: tokens per request",
        "Mean prompt and output tokens per finished request; the dashed lines are the rule of "
        f"thumb for disaggregated serving: prompts above {LONG_PROMPT_TOKENS} tokens make a pod "
        f"prefill-bound, outputs above {LONG_OUTPUT_TOKENS} decode-bound. Advice, not an "
        "alert. Bad: both long - prefill and decode compete for the same GPUs; separate "
        "prefill and decode pools would serve each better.",
        [
            Query(
                signal(PROMPT_TOKENS, MODEL),
                f"prompt {model_legend()}",
                thresholds=(warn(LONG_PROMPT_TOKENS),),
            ),
            Query(
                signal(OUTPUT_TOKENS, MODEL),
                f"output {model_legend()}",
                thresholds=(warn(LONG_OUTPUT_TOKENS),),
            ),
        ],
        unit=Unit.COUNT,
        span=8,
    )


def panels() -> Sequence[AnyPanel]:
    return [
        efficiency(),
        floor_vs_step(),
        budget(),
        prefill_efficiency(),
        tokens_vs_roofline(),
        utilisation_vs_sm_activity(),
        interconnect(),
        workload_shape(),
    ]
