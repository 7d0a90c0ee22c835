"""Row "Request latency decomposition": where one request's time goes.

A request waits in the queue, is prefilled (prompt processed, first token), then decoded token
by token; the engine's end-to-end latency also holds what happens around them in the front-end
(tokenization, detokenization, HTTP, scheduling). Stacked means per request show the parts; the
end-to-end line on top shows what is left unexplained.
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
    mean_per_request,
    pct,
    quantile,
    series,
    signal,
    target_legend,
    timeseries,
    warn,
)
from exporter.signatures.signals.engine_signals import QUEUE_WAIT_SHARE

TITLE = "Request latency decomposition"

QUEUE_WAIT = "InferenceQueueWaitDominatesLatency"

QUEUE = "inference_queue_time_seconds"
PREFILL = "inference_prefill_time_seconds"
DECODE = "inference_decode_time_seconds"
E2E = "inference_e2e_request_latency_seconds"


def decomposition() -> AnyPanel:
    queue, prefill, decode, e2e = (
        mean_per_request(name, MODEL) for name in (QUEUE, PREFILL, DECODE, E2E)
    )
    rest = f"clamp_min(\n({e2e})\n-\n(({queue})\n+\n({prefill})\n+\n({decode}))\n, 0)"
    return timeseries(
        "Request latency: queue, prefill, decode vs end-to-end",
        "Mean time per request in the engine's queue, in prefill and in decode, stacked, plus "
        "the rest of the end-to-end latency (front-end: tokenization, detokenization, HTTP, "
        "scheduling); the dashed line is the mean end-to-end latency itself. Prefill and "
        "decode times come from vLLM only; other engines show queue and end-to-end. Bad: the "
        "queue band growing (offered load above capacity), the rest band growing (the CPU side "
        "is slow), decode growing at constant load (HBM bandwidth wall).",
        [
            Query(queue, f"queue {target_legend()}"),
            Query(prefill, f"prefill {target_legend()}"),
            Query(decode, f"decode {target_legend()}"),
            Query(rest, f"front-end and rest {target_legend()}"),
            Query(e2e, f"end-to-end {target_legend()}", stack=False, dashed=True),
        ],
        unit=Unit.SECONDS,
        stack=True,
        span=16,
    )


def queue_share() -> AnyPanel:
    above = alert_threshold(QUEUE_WAIT, "queue_share_above")
    return timeseries(
        "Share of latency spent in the queue",
        "Time requests spent waiting in the engine's queue as a share of their end-to-end "
        "latency (a decode engine's wait for the KV transfer left out), over the rule pack's "
        "window: what InferenceQueueWaitDominatesLatency reads. "
        f"Bad: above {pct(above)} while the server has traffic - the offered load "
        "exceeds what the server admits; scale out or shed load, the GPU work itself is fine.",
        [Query(signal(QUEUE_WAIT_SHARE), f"queue share {target_legend()}")],
        unit=Unit.RATIO,
        maximum=1.0,
        thresholds=[warn(above)],
        span=8,
    )


def ttft_itl() -> AnyPanel:
    ttft = "inference_time_to_first_token_seconds"
    itl = "inference_inter_token_latency_seconds"
    return timeseries(
        "Time to first token and inter-token latency",
        "Median and 90th percentile of the time to the first token (queue + prefill as a user "
        "sees it) and of the time between tokens (one decode step). Bad: TTFT rising with the "
        "queue (admission), inter-token latency rising with the batch size (HBM bandwidth), "
        "or a p90 far above the p50 (preemptions, long prompts stalling decodes).",
        [
            Query(quantile(0.5, ttft, MODEL), f"TTFT p50 {target_legend()}"),
            Query(quantile(0.9, ttft, MODEL), f"TTFT p90 {target_legend()}", dashed=True),
            Query(quantile(0.5, itl, MODEL), f"inter-token p50 {target_legend()}"),
            Query(quantile(0.9, itl, MODEL), f"inter-token p90 {target_legend()}", dashed=True),
        ],
        unit=Unit.SECONDS,
    )


def batch() -> AnyPanel:
    return timeseries(
        "Requests running and waiting",
        "Requests in the engine's running batch and requests waiting in its queue. Bad: the "
        "queue staying above zero while the batch is small (the engine cannot admit more: "
        "KV cache full, or the CPU side cannot keep up), or a batch pinned at the engine's "
        "limit with a growing queue (overload).",
        [
            Query(
                by("sum", series("inference_requests_running", MODEL)), f"running {target_legend()}"
            ),
            Query(by("sum", series("inference_queue_depth", MODEL)), f"waiting {target_legend()}"),
        ],
        unit=Unit.COUNT,
    )


def panels() -> Sequence[AnyPanel]:
    return [decomposition(), queue_share(), ttft_itl(), batch()]
