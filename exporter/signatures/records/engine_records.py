"""Records from the engine's gauges and counters as the sidecar normalises them: the running
batch, the tokens it generates, the queue, the KV cache. One series per target."""

from __future__ import annotations

from exporter.signatures.definitions import RecordingRule
from exporter.signatures.records.record_context import RecordContext


def engine_records(ctx: RecordContext) -> list[RecordingRule]:
    """The running batch, its tokens, traffic and the queue."""
    records, by_target = ctx.records, ctx.by_target
    rate = ctx.window("rate")
    latency = ctx.window("latency")
    trend = ctx.window("queue_trend")
    running = ctx.sidecar_series("inference_requests_running")
    generated = ctx.sidecar_series("inference_generation_tokens_total")
    queue = ctx.sidecar_series("inference_queue_depth")
    e2e_time = ctx.sidecar_series("inference_e2e_request_latency_seconds_sum")
    finished = ctx.sidecar_series("inference_e2e_request_latency_seconds_count")
    return [
        RecordingRule(
            records.requests_running,
            f"sum {by_target} (avg_over_time({running}[{rate}]))",
            "requests in the running batch, mean over the window",
        ),
        RecordingRule(
            records.generation_tokens,
            f"sum {by_target} (rate({generated}[{rate}]))",
            "tokens generated per second",
        ),
        RecordingRule(
            records.tokens_per_request,
            f"{records.generation_tokens}\n/\n({records.requests_running} > 0)",
            "decode speed one running request sees, tokens per second",
        ),
        RecordingRule(
            records.traffic,
            f"clamp({records.requests_running} > 0, 1, 1)\n"
            f"or\nclamp({records.generation_tokens} > 0, 1, 1)\n"
            # Engines that count neither running requests nor tokens (Triton) still count the
            # requests they finish.
            f"or\nclamp(sum {by_target} (rate({finished}[{rate}])) > 0, 1, 1)",
            "1 while the target has traffic (requests running, tokens generated or requests "
            "finished); absent when idle",
        ),
        RecordingRule(
            records.queue_depth,
            f"sum {by_target} ({queue})",
            "requests waiting in the engine's queue now",
        ),
        RecordingRule(
            records.queue_trend,
            f"sum {by_target} (deriv({queue}[{trend}]))",
            "queue growth in requests per second (linear regression over the window)",
        ),
        RecordingRule(
            records.queue_wait_share,
            f"{ctx.queue_less_transfer(ctx.join, latency)}\n"
            f"/\n"
            f"sum {by_target} (rate({e2e_time}[{latency}]))",
            "share of end-to-end request latency spent waiting in the queue (a decode "
            "engine's wait for the KV transfer left out: it has its own share)",
        ),
    ]


def kv_cache_records(ctx: RecordContext) -> list[RecordingRule]:
    """KV-cache usage now (the roofline's KV bytes are in :mod:`.roofline_records`)."""
    usage = ctx.sidecar_series("inference_kv_cache_usage_ratio")
    return [
        RecordingRule(
            ctx.records.kv_cache,
            f"max {ctx.by_target} ({usage})",
            "KV-cache usage (0-1) where the engine reports it",
        )
    ]
