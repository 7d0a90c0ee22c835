"""The engine's gauges and counters as the sidecar normalises them: the running batch, the
tokens it generates, the queue, the KV cache. One series per target, in every layout alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.signals.signal import Rule, Signal
from exporter.signatures.signals.signal_groups import TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def _requests_running(ctx: SignalContext) -> str:
    running = ctx.sidecar_series("inference_requests_running")
    return f"sum {ctx.by_target} (avg_over_time({running}[{ctx.window('rate')}]))"


REQUESTS_RUNNING = Signal(
    "inference:requests_running:mean{rate}",
    "requests",
    TARGET_GROUP,
    Rule(_requests_running, "requests in the running batch, mean over the window"),
    "requests running",
)


def _generation_tokens(ctx: SignalContext) -> str:
    generated = ctx.sidecar_series("inference_generation_tokens_total")
    return f"sum {ctx.by_target} (rate({generated}[{ctx.window('rate')}]))"


GENERATION_TOKENS = Signal(
    "inference:generation_tokens:rate{rate}",
    "tokens_per_second",
    TARGET_GROUP,
    Rule(_generation_tokens, "tokens generated per second"),
    "tokens/s",
)


def _tokens_per_request(ctx: SignalContext) -> str:
    return f"{ctx.name(GENERATION_TOKENS)}\n/\n({ctx.name(REQUESTS_RUNNING)} > 0)"


TOKENS_PER_REQUEST = Signal(
    "inference:generation_tokens_per_request:rate{rate}",
    "tokens_per_second",
    TARGET_GROUP,
    Rule(_tokens_per_request, "decode speed one running request sees, tokens per second"),
    "tokens/s per request",
)


def _traffic(ctx: SignalContext) -> str:
    finished = ctx.sidecar_series("inference_e2e_request_latency_seconds_count")
    return (
        f"clamp({ctx.name(REQUESTS_RUNNING)} > 0, 1, 1)\n"
        f"or\nclamp({ctx.name(GENERATION_TOKENS)} > 0, 1, 1)\n"
        # Engines that count neither running requests nor tokens (Triton) still count the
        # requests they finish.
        f"or\nclamp(sum {ctx.by_target} (rate({finished}[{ctx.window('rate')}])) > 0, 1, 1)"
    )


TRAFFIC = Signal(
    "inference:traffic:active",
    "flag",
    TARGET_GROUP,
    Rule(
        _traffic,
        "1 while the target has traffic (requests running, tokens generated or requests "
        "finished); absent when idle",
    ),
    "traffic",
)


def _queue_depth(ctx: SignalContext) -> str:
    return f"sum {ctx.by_target} ({ctx.sidecar_series('inference_queue_depth')})"


QUEUE_DEPTH = Signal(
    "inference:queue_depth:sum",
    "requests",
    TARGET_GROUP,
    Rule(_queue_depth, "requests waiting in the engine's queue now"),
    "requests waiting",
)


def _queue_trend(ctx: SignalContext) -> str:
    queue = ctx.sidecar_series("inference_queue_depth")
    return f"sum {ctx.by_target} (deriv({queue}[{ctx.window('queue_trend')}]))"


QUEUE_TREND = Signal(
    "inference:queue_depth:deriv{queue_trend}",
    "requests_per_second",
    TARGET_GROUP,
    Rule(_queue_trend, "queue growth in requests per second (linear regression over the window)"),
    "queue growth",
)


def _queue_wait_share(ctx: SignalContext) -> str:
    latency = ctx.window("latency")
    e2e_time = ctx.sidecar_series("inference_e2e_request_latency_seconds_sum")
    return (
        f"{ctx.queue_less_transfer(ctx.join, latency)}\n"
        f"/\n"
        f"sum {ctx.by_target} (rate({e2e_time}[{latency}]))"
    )


QUEUE_WAIT_SHARE = Signal(
    "inference:queue_time_per_e2e_latency:ratio{latency}",
    "ratio",
    TARGET_GROUP,
    Rule(
        _queue_wait_share,
        "share of end-to-end request latency spent waiting in the queue (a decode "
        "engine's wait for the KV transfer left out: it has its own share)",
    ),
    "queue share of latency",
)


def _kv_cache(ctx: SignalContext) -> str:
    return f"max {ctx.by_target} ({ctx.sidecar_series('inference_kv_cache_usage_ratio')})"


#: KV-cache usage now (the roofline's KV bytes are in :mod:`.roofline`).
KV_CACHE = Signal(
    "inference:kv_cache_usage:max",
    "ratio",
    TARGET_GROUP,
    Rule(_kv_cache, "KV-cache usage (0-1) where the engine reports it"),
    "KV cache",
)
