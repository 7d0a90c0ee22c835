"""The engine's gauges and counters as the sidecar normalises them: the running batch, the
tokens it generates, the queue (with the engine's share of its gateway's queue), the KV cache,
the requests refused at admission, and an engine that has stopped. One series per target, in
every layout alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.promql_text import by, num, on
from exporter.signatures.signals.gateway_signals import QUEUE_SHARE, QUEUE_TREND_SHARE
from exporter.signatures.signals.signal import Rule, Signal
from exporter.signatures.signals.signal_groups import TARGET_GROUP

STALLED = "InferenceEngineStalled"

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


def engine_queue(ctx: SignalContext) -> str:
    """Requests waiting in the engine's own queue, per target (its gateway's share left out),
    as last scraped (:meth:`SignalContext.latest`)."""
    return f"sum {ctx.by_target} ({ctx.latest('inference_queue_depth')})"


def _queue_depth(ctx: SignalContext) -> str:
    # The share has the join labels alone, never an engine series' labels: `or` adds it.
    queue = ctx.latest("inference_queue_depth")
    return f"sum {ctx.by_target} (\n{queue}\nor\n{ctx.name(QUEUE_SHARE)}\n)"


QUEUE_DEPTH = Signal(
    "inference:queue_depth:sum",
    "requests",
    TARGET_GROUP,
    Rule(
        _queue_depth,
        "requests waiting for the engine now: its own queue and its share of its pool's "
        "gateway queue",
    ),
    "requests waiting",
)


def _queue_trend(ctx: SignalContext) -> str:
    queue = ctx.sidecar_series("inference_queue_depth")
    trend = f"deriv({queue}[{ctx.window('queue_trend')}])"
    return f"sum {ctx.by_target} (\n{trend}\nor\n{ctx.name(QUEUE_TREND_SHARE)}\n)"


QUEUE_TREND = Signal(
    "inference:queue_depth:deriv{queue_trend}",
    "requests_per_second",
    TARGET_GROUP,
    Rule(
        _queue_trend,
        "queue growth in requests per second (linear regression over the window): the "
        "engine's own queue and its share of its pool's gateway queue",
    ),
    "queue growth",
)


def _rejected(ctx: SignalContext, *labels: str) -> str:
    refused = ctx.sidecar_series("inference_requests_rejected_total")
    return f"sum {by((*ctx.join, *labels))} (rate({refused}[{ctx.window('rate')}]))"


def _rejected_share(ctx: SignalContext) -> str:
    rate, op = ctx.window("rate"), on(ctx.join)
    served = ctx.sidecar_series("inference_e2e_request_latency_seconds_count")
    passed = ctx.sidecar_series("inference_gateway_requests_total", 'outcome!~"rejected_.*"')
    refused = _rejected(ctx)
    return (
        f"{_rejected(ctx, 'layer')}\n/ {op} group_left ()\n(\n{refused}\n+ {op}\n(\n"
        f"sum {ctx.by_target} (rate({served}[{rate}]))\nor\n"
        f"sum {ctx.by_target} (rate({passed}[{rate}]))\nor\n0 * {refused}\n)\n)"
    )


REJECTED_SHARE = Signal(
    "inference:requests_rejected:ratio{rate}",
    "ratio",
    TARGET_GROUP,
    Rule(
        _rejected_share,
        "share of the target's arrivals refused at admission, per layer (engine, gateway): "
        "refused / (refused + served), served the requests an engine finished or a gateway "
        "did not refuse",
    ),
    "refused",
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
    usage = ctx.latest("inference_kv_cache_usage_ratio")
    return f"max {ctx.by_target} ({usage})"


#: KV-cache usage now (the roofline's KV bytes are in :mod:`.roofline`).
KV_CACHE = Signal(
    "inference:kv_cache_usage:max",
    "ratio",
    TARGET_GROUP,
    Rule(_kv_cache, "KV-cache usage (0-1) where the engine reports it"),
    "KV cache",
)


def stall(ctx: SignalContext) -> str:
    """The engine has stopped: requests wait in its own queue, none has run and no token was
    generated for a whole rate window, and its KV cache is nearly empty (nothing holds its
    memory). The value is the number waiting."""
    depth = ctx.cfg.ratio(STALLED, "queue_depth_at_least")
    kv = ctx.cfg.ratio(STALLED, "kv_cache_below")
    op = on(ctx.join)
    return (
        f"{engine_queue(ctx)} >= {num(depth)}\n"
        f"and {op}\n{ctx.name(REQUESTS_RUNNING)} == 0\n"
        f"and {op}\n{ctx.name(GENERATION_TOKENS)} == 0\n"
        f"and {op}\n{ctx.name(KV_CACHE)} < {num(kv)}"
    )


#: 1 while the target's engine has stopped (:func:`stall`); absent otherwise. What the
#: starved-GPU signature leaves out: a stalled engine's GPU idles because it admits nothing.
ENGINE_STALLED = Signal(
    "inference:engine_stalled:active",
    "flag",
    TARGET_GROUP,
    Rule(
        lambda ctx: f"clamp(\n{stall(ctx)}\n, 1, 1)",
        "1 while requests wait in the engine's own queue, none has run and no token was "
        "generated in the rate window, and the KV cache is nearly empty; absent otherwise",
    ),
    "engine stalled",
)
