"""Pools of disaggregated serving: the engines of one model by role, across pods.

A pool is every engine of one model with one role (``prefill``, ``decode``) that shares the
join labels that do not name a pod (``namespace``, ``job``, ``cluster``); one series per pool
and ``model``, and each role has its own records (a record is never read through a label
selector: :class:`~exporter.signatures.signals.signal.PerRole`). A pool's queue is its engines'
waiting requests (a decode engine's also those waiting for KV room, SGLang's prealloc stage);
the engines it needs are its engines x (waiting + running) / running - what it takes to run its
waiting requests at today's concurrency per engine - and the suggested prefill:decode ratio is
the two pools' needs. Time to first token splits into queue + prefill + transfer, and each
role's end-to-end latency into the shares of the latency budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.promql_text import by, on
from exporter.signatures.signals.signal import PerRole, Role, Rule, Signal
from exporter.signatures.signals.signal_groups import POOL_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext


def _labels(ctx: SignalContext) -> tuple[str, ...]:
    return (*ctx.pool, "model")


def _mine(role: Role) -> str:
    return f'role="{role}"'


# --- each role's pool -------------------------------------------------------------------------


def _engines(ctx: SignalContext, role: Role) -> str:
    info = ctx.latest("inference_engine_info", _mine(role))
    return f"count {by(_labels(ctx))} ({info})"


POOL_ENGINES = PerRole(
    "inference_pool:{role}_engines:count",
    "count",
    POOL_GROUP,
    _engines,
    lambda role: f"{role} engines of the model in the pool",
    "{role} engines",
)


def _queue(ctx: SignalContext, role: Role) -> str:
    bp, on_pool, rate = by(_labels(ctx)), on(_labels(ctx)), ctx.window("rate")
    queue = ctx.sidecar_series("inference_queue_depth", _mine(role))
    waiting = f"sum {bp} (avg_over_time({queue}[{rate}]))"
    if role == "decode":  # requests waiting for KV room to receive the cache count too
        prealloc = ctx.sidecar_series(
            "inference_queue_depth_by_stage", 'stage="prealloc"', _mine(role)
        )
        waiting = (
            f"(\n{waiting}\n+ {on_pool}\nsum {bp} (avg_over_time({prealloc}[{rate}]))\n)"
            f"\nor\n{waiting}"
        )
    return waiting


POOL_QUEUE = PerRole(
    "inference_pool:{role}_queue_depth:mean{rate}",
    "requests",
    POOL_GROUP,
    _queue,
    lambda role: f"requests the {role} pool holds waiting, mean over the window",
    "{role} queue",
)


def _queue_trend(ctx: SignalContext, role: Role) -> str:
    bp, on_pool, trend = by(_labels(ctx)), on(_labels(ctx)), ctx.window("queue_trend")
    queue = ctx.sidecar_series("inference_queue_depth", _mine(role))
    growth = f"sum {bp} (deriv({queue}[{trend}]))"
    if role == "decode":
        prealloc = ctx.sidecar_series(
            "inference_queue_depth_by_stage", 'stage="prealloc"', _mine(role)
        )
        growth = f"(\n{growth}\n+ {on_pool}\nsum {bp} (deriv({prealloc}[{trend}]))\n)\nor\n{growth}"
    return growth


POOL_QUEUE_TREND = PerRole(
    "inference_pool:{role}_queue_depth:deriv{queue_trend}",
    "requests_per_second",
    POOL_GROUP,
    _queue_trend,
    lambda role: f"growth of the {role} pool's queue, requests per second (linear regression)",
    "{role} queue growth",
)


def _running(ctx: SignalContext, role: Role) -> str:
    run = ctx.sidecar_series("inference_requests_running", _mine(role))
    return f"sum {by(_labels(ctx))} (avg_over_time({run}[{ctx.window('rate')}]))"


POOL_RUNNING = PerRole(
    "inference_pool:{role}_requests_running:mean{rate}",
    "requests",
    POOL_GROUP,
    _running,
    lambda role: f"requests the {role} pool runs, mean over the window",
    "{role} running",
)


def _kv_cache(ctx: SignalContext, role: Role) -> str:
    usage = ctx.sidecar_series("inference_kv_cache_usage_ratio", _mine(role))
    return f"avg {by(_labels(ctx))} (avg_over_time({usage}[{ctx.window('rate')}]))"


POOL_KV_CACHE = PerRole(
    "inference_pool:{role}_kv_cache_usage:mean{rate}",
    "ratio",
    POOL_GROUP,
    _kv_cache,
    lambda role: f"KV-cache usage of the {role} pool's engines (0-1), mean over engines and window",
    "{role} KV cache",
)


def _engines_needed(ctx: SignalContext, role: Role) -> str:
    running = ctx.name(POOL_RUNNING.of(role))
    return (
        f"{ctx.name(POOL_ENGINES.of(role))}\n* (\n{ctx.name(POOL_QUEUE.of(role))}\n"
        f"+ {running}\n)\n/ (\n{running} > 1\nor\nclamp({running}, 1, 1)\n)"
    )


POOL_ENGINES_NEEDED = PerRole(
    "inference_pool:{role}_engines_needed:estimate{rate}",
    "count",
    POOL_GROUP,
    _engines_needed,
    lambda role: (
        f"{role} engines the pool needs to run its waiting requests at today's "
        "concurrency per engine: engines x (waiting + running) / running"
    ),
    "{role} engines needed",
)

#: Every per-role signal, in the order each role's records are written.
PER_ROLE = (
    POOL_ENGINES,
    POOL_QUEUE,
    POOL_QUEUE_TREND,
    POOL_RUNNING,
    POOL_KV_CACHE,
    POOL_ENGINES_NEEDED,
)


# --- the two pools together -------------------------------------------------------------------


def _ratio_now(ctx: SignalContext) -> str:
    return (
        f"{ctx.name(POOL_ENGINES.prefill)}\n/ {on(_labels(ctx))}\n{ctx.name(POOL_ENGINES.decode)}"
    )


POOL_RATIO_NOW = Signal(
    "inference_pool:prefill_decode_ratio:current",
    "count",
    POOL_GROUP,
    Rule(_ratio_now, "prefill engines per decode engine of the model now"),
    "prefill:decode now",
)


def _ratio_suggested(ctx: SignalContext) -> str:
    return (
        f"{ctx.name(POOL_ENGINES_NEEDED.prefill)}\n/ {on(_labels(ctx))}\n"
        f"({ctx.name(POOL_ENGINES_NEEDED.decode)} > 0)"
    )


POOL_RATIO_SUGGESTED = Signal(
    "inference_pool:prefill_decode_ratio:suggested{rate}",
    "count",
    POOL_GROUP,
    Rule(_ratio_suggested, "prefill engines per decode engine the two pools' queues suggest"),
    "prefill:decode suggested",
)


def _mean_of(ctx: SignalContext, metric: str, *extra: str) -> str:
    """A histogram's mean per observation over the pool, over the latency window."""
    bp, lat = by(_labels(ctx)), ctx.window("latency")
    return (
        f"sum {bp} (rate({ctx.sidecar_series(metric + '_sum', *extra)}[{lat}]))\n/\n"
        f"(sum {bp} (rate({ctx.sidecar_series(metric + '_count', *extra)}[{lat}])) > 0)"
    )


KV_TRANSFER_MEAN = Signal(
    "inference_pool:kv_transfer_seconds:mean{latency}",
    "seconds",
    POOL_GROUP,
    Rule(
        lambda ctx: _mean_of(ctx, "inference_kv_transfer_seconds"),
        "mean duration of one KV-cache transfer between the pools, seconds",
    ),
    "KV transfer",
)

# Time to first token of the model's disaggregated requests as queue + prefill + transfer,
# means per request over the window, and each part's share of their sum.
#
# A request waits and is prefilled on a prefill-capable engine (``role!="decode"``), its cache
# crosses once (the transfer's mean wherever the engine observes it: vLLM's decode engine,
# SGLang's prefill engine), and the decode engine computes the one position the cache leaves out
# before the first token. A decode engine's own wait counts as queue less the transfer it holds
# (vLLM keeps a request waiting while its cache is read: ``SignalContext.queue_less_transfer``),
# so no second counts twice; parts a pool does not report count 0. The shares add up to 1.
_PREFILL_SIDE, _DECODE_SIDE = 'role!="decode"', 'role="decode"'


def _plus_decode(ctx: SignalContext, prefill_part: str, decode_part: str) -> str:
    op = on(_labels(ctx))
    return f"{prefill_part}\n+ {op}\n(\n{decode_part}\nor\n0 * {prefill_part}\n)"


def _ttft_queue(ctx: SignalContext) -> str:
    labels, lat = _labels(ctx), ctx.window("latency")
    queued = ctx.sidecar_series("inference_queue_time_seconds_count", _DECODE_SIDE)
    decode_requests = f"sum {by(labels)} (rate({queued}[{lat}]))"
    decode_wait = (
        f"{ctx.queue_less_transfer(labels, lat, _DECODE_SIDE)}\n/\n({decode_requests} > 0)"
    )
    return _plus_decode(
        ctx, _mean_of(ctx, "inference_queue_time_seconds", _PREFILL_SIDE), decode_wait
    )


TTFT_QUEUE_MEAN = Signal(
    "inference_pool:ttft_queue_seconds:mean{latency}",
    "seconds",
    POOL_GROUP,
    Rule(
        _ttft_queue,
        "time to first token in queues, seconds: the prefill engines' queue wait plus "
        "the decode engines' wait beyond the KV transfer, means per request",
    ),
    "queue",
)

TTFT_PREFILL_MEAN = Signal(
    "inference_pool:ttft_prefill_seconds:mean{latency}",
    "seconds",
    POOL_GROUP,
    Rule(
        lambda ctx: _plus_decode(
            ctx,
            _mean_of(ctx, "inference_prefill_time_seconds", _PREFILL_SIDE),
            _mean_of(ctx, "inference_prefill_time_seconds", _DECODE_SIDE),
        ),
        "time to first token in prefill, seconds: the prefill engines' prefill plus the "
        "decode engines' step to the first token, means per request",
    ),
    "prefill",
)


def _share(ctx: SignalContext, part: Signal) -> str:
    op = on(_labels(ctx))
    total = (
        f"(\n{ctx.name(TTFT_QUEUE_MEAN)}\n+ {op}\n{ctx.name(TTFT_PREFILL_MEAN)}\n+ {op}\n"
        f"{ctx.name(KV_TRANSFER_MEAN)}\n)"
    )
    return f"{ctx.name(part)}\n/ {op}\n{total}"


TTFT_QUEUE_SHARE = Signal(
    "inference_pool:ttft_queue:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        lambda ctx: _share(ctx, TTFT_QUEUE_MEAN),
        "share of time to first token in queues: queue / (queue + prefill + transfer)",
    ),
    "queue",
)

TTFT_PREFILL_SHARE = Signal(
    "inference_pool:ttft_prefill:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        lambda ctx: _share(ctx, TTFT_PREFILL_MEAN),
        "share of time to first token in prefill: prefill / (queue + prefill + transfer)",
    ),
    "prefill",
)

TTFT_TRANSFER_SHARE = Signal(
    "inference_pool:ttft_transfer:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        lambda ctx: _share(ctx, KV_TRANSFER_MEAN),
        "share of time to first token in the KV transfer: transfer / (queue + prefill + transfer)",
    ),
    "KV transfer",
)


# The latency budget of each pool: the shares of its engines' end-to-end latency in queue (less
# a decode engine's wait for the transfer), prefill, KV transfer and decode, one series per
# pool, model and ``role`` (``both`` for colocated engines).


def _role_rate(ctx: SignalContext, metric: str) -> str:
    labels = (*_labels(ctx), "role")
    return f"sum {by(labels)} (rate({ctx.sidecar_series(metric)}[{ctx.window('latency')}]))"


def _role_e2e(ctx: SignalContext) -> str:
    return f"({_role_rate(ctx, 'inference_e2e_request_latency_seconds_sum')} > 0)"


def _pool_budget_queue(ctx: SignalContext) -> str:
    labels = (*_labels(ctx), "role")
    return f"{ctx.queue_less_transfer(labels, ctx.window('latency'))}\n/\n{_role_e2e(ctx)}"


POOL_BUDGET_QUEUE = Signal(
    "inference_pool:latency_budget_queue:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        _pool_budget_queue,
        "latency budget of each pool (role): share of end-to-end latency waiting in "
        "the engines' queue, a decode engine's wait for the KV transfer left out",
    ),
    "queue",
)

POOL_BUDGET_PREFILL = Signal(
    "inference_pool:latency_budget_prefill:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        lambda ctx: f"{_role_rate(ctx, 'inference_prefill_time_seconds_sum')}\n/\n{_role_e2e(ctx)}",
        "latency budget of each pool (role): share of end-to-end latency in prefill",
    ),
    "prefill",
)

POOL_BUDGET_TRANSFER = Signal(
    "inference_pool:latency_budget_transfer:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        lambda ctx: f"{_role_rate(ctx, 'inference_kv_transfer_seconds_sum')}\n/\n{_role_e2e(ctx)}",
        "latency budget of each pool (role): share of end-to-end latency in the KV "
        "transfer, on the engines that observe it",
    ),
    "KV transfer",
)

POOL_BUDGET_DECODE = Signal(
    "inference_pool:latency_budget_decode:ratio{latency}",
    "ratio",
    POOL_GROUP,
    Rule(
        lambda ctx: f"{_role_rate(ctx, 'inference_decode_time_seconds_sum')}\n/\n{_role_e2e(ctx)}",
        "latency budget of each pool (role): share of end-to-end latency in decode",
    ),
    "decode",
)


def _failure_ratio(ctx: SignalContext) -> str:
    bp, op, lat = by(_labels(ctx)), on(_labels(ctx)), ctx.window("latency")
    failed = ctx.sidecar_series("inference_kv_transfer_failures_total")
    transferred = ctx.sidecar_series("inference_kv_transfer_seconds_count")
    failures = f"sum {bp} (rate({failed}[{lat}]))"
    transfers = f"sum {bp} (rate({transferred}[{lat}]))"
    return f"{failures}\n/\n(\n{failures}\n+ {op}\n({transfers} or 0 * {failures})\n)"


KV_FAILURE_RATIO = Signal(
    "inference_pool:kv_transfer_failures:ratio{rate}",
    "ratio",
    POOL_GROUP,
    Rule(_failure_ratio, "share of KV-cache transfers that failed or expired"),
    "failed transfers",
)
