"""Pools of disaggregated serving: the engines of one model by role, across pods.

One series per pool (the join labels that do not name a pod: ``namespace``, ``job``,
``cluster``) and ``model``; the per-role records are named by role (a record is never read
through a label selector).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from exporter.config import format_duration
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import by, on
from exporter.signatures.records.record_context import RecordContext
from exporter.signatures.records.record_groups import POOL_GROUP

#: Join labels that name one pod: a pool is what the other join labels and the model share.
POD_LABELS = ("pod", "instance")
ROLES = ("prefill", "decode")


def pool_labels(join: Sequence[str]) -> tuple[str, ...]:
    """The labels of one pool of disaggregated serving, besides ``model``: the join labels
    that do not name one pod (``namespace``, ``job``, ``cluster``)."""
    return tuple(label for label in join if label not in POD_LABELS)


def pool_records(ctx: RecordContext) -> list[RecordingRule]:
    """Pools of disaggregated serving: the engines of one model by role, across pods.

    A pool is every engine of one model with one role (``prefill``, ``decode``) that
    shares the join labels that do not name a pod; each role has its own records (a
    record is never read through a label selector). A pool's queue is its engines' waiting
    requests (a decode engine's also those waiting for KV room, SGLang's prealloc stage);
    the engines it needs are its engines x (waiting + running) / running - what it takes
    to run its waiting requests at today's concurrency per engine - and the suggested
    prefill:decode ratio is the two pools' needs. Time to first token splits into queue +
    prefill + transfer (:func:`_ttft_split`), and each role's end-to-end latency into the
    shares of the latency budget (:func:`_budget_by_role`).
    """
    r = ctx.records
    pool = pool_labels(ctx.join)
    bp = by((*pool, "model"))
    op = on((*pool, "model"))
    rate = ctx.window("rate")
    lat = ctx.window("latency")
    trend = ctx.window("queue_trend")
    info = ctx.sidecar_series("inference_engine_info")

    def mean_of(metric: str, *extra: str) -> str:
        return (
            f"sum {bp} (rate({ctx.sidecar_series(metric + '_sum', *extra)}[{lat}]))\n/\n"
            f"(sum {bp} (rate({ctx.sidecar_series(metric + '_count', *extra)}[{lat}])) > 0)"
        )

    failures = (
        f"sum {bp} (rate({ctx.sidecar_series('inference_kv_transfer_failures_total')}[{lat}]))"
    )
    transfers = (
        f"sum {bp} (rate({ctx.sidecar_series('inference_kv_transfer_seconds_count')}[{lat}]))"
    )
    out = [
        RecordingRule(
            r.pool_history(seconds),
            f"group {bp} (max_over_time({info}[{format_duration(seconds)}] "
            f"offset {format_duration(seconds)}))",
            f"1 per pool and model whose engines have {format_duration(seconds)} of history: the "
            f"cold-start guard of the pool signatures over {format_duration(seconds)} windows",
            window=0.0,
        )
        for seconds in sorted(
            {ctx.cfg.window_seconds(n) for n in ("rate", "latency", "queue_trend")}
        )
    ]
    for role in ROLES:
        out += _pool_role(ctx, role, (*pool, "model"), rate, trend)
    needed = {role: r.of_role(r.pool_engines_needed, role) for role in ROLES}
    engines = {role: r.of_role(r.pool_engines, role) for role in ROLES}
    return [
        *out,
        RecordingRule(
            r.pool_ratio_now,
            f"{engines['prefill']}\n/ {op}\n{engines['decode']}",
            "prefill engines per decode engine of the model now",
        ),
        RecordingRule(
            r.pool_ratio_suggested,
            f"{needed['prefill']}\n/ {op}\n({needed['decode']} > 0)",
            "prefill engines per decode engine the two pools' queues suggest",
        ),
        RecordingRule(
            r.kv_transfer_mean,
            mean_of("inference_kv_transfer_seconds"),
            "mean duration of one KV-cache transfer between the pools, seconds",
        ),
        *_ttft_split(ctx, pool, mean_of),
        *_budget_by_role(ctx, pool),
        RecordingRule(
            r.kv_failure_ratio,
            f"{failures}\n/\n(\n{failures}\n+ {op}\n({transfers} or 0 * {failures})\n)",
            "share of KV-cache transfers that failed or expired",
        ),
    ]


def _ttft_split(
    ctx: RecordContext, pool: tuple[str, ...], mean_of: Callable[..., str]
) -> list[RecordingRule]:
    """Time to first token of the model's disaggregated requests as queue + prefill +
    transfer, means per request over the window, and each part's share of their sum.

    A request waits and is prefilled on a prefill-capable engine (``role!="decode"``), its
    cache crosses once (the transfer's mean wherever the engine observes it: vLLM's decode
    engine, SGLang's prefill engine), and the decode engine computes the one position the
    cache leaves out before the first token. A decode engine's own wait counts as queue less
    the transfer it holds (vLLM keeps a request waiting while its cache is read:
    :meth:`RecordContext.queue_less_transfer`), so no second counts twice; parts a pool does
    not report count 0. The shares add up to 1.
    """
    r = ctx.records
    labels = (*pool, "model")
    bp, op = by(labels), on(labels)
    lat = ctx.window("latency")
    prefill_side, decode_side = 'role!="decode"', 'role="decode"'
    queued = ctx.sidecar_series("inference_queue_time_seconds_count", decode_side)
    decode_requests = f"sum {bp} (rate({queued}[{lat}]))"
    decode_wait = f"{ctx.queue_less_transfer(labels, lat, decode_side)}\n/\n({decode_requests} > 0)"

    def plus_decode(prefill_part: str, decode_part: str) -> str:
        return f"{prefill_part}\n+ {op}\n(\n{decode_part}\nor\n0 * {prefill_part}\n)"

    total = (
        f"(\n{r.ttft_queue_mean}\n+ {op}\n{r.ttft_prefill_mean}\n+ {op}\n{r.kv_transfer_mean}\n)"
    )
    return [
        RecordingRule(
            r.ttft_queue_mean,
            plus_decode(mean_of("inference_queue_time_seconds", prefill_side), decode_wait),
            "time to first token in queues, seconds: the prefill engines' queue wait plus "
            "the decode engines' wait beyond the KV transfer, means per request",
        ),
        RecordingRule(
            r.ttft_prefill_mean,
            plus_decode(
                mean_of("inference_prefill_time_seconds", prefill_side),
                mean_of("inference_prefill_time_seconds", decode_side),
            ),
            "time to first token in prefill, seconds: the prefill engines' prefill plus the "
            "decode engines' step to the first token, means per request",
        ),
        RecordingRule(
            r.ttft_queue_share,
            f"{r.ttft_queue_mean}\n/ {op}\n{total}",
            "share of time to first token in queues: queue / (queue + prefill + transfer)",
        ),
        RecordingRule(
            r.ttft_prefill_share,
            f"{r.ttft_prefill_mean}\n/ {op}\n{total}",
            "share of time to first token in prefill: prefill / (queue + prefill + transfer)",
        ),
        RecordingRule(
            r.ttft_transfer_share,
            f"{r.kv_transfer_mean}\n/ {op}\n{total}",
            "share of time to first token in the KV transfer: transfer / (queue + prefill "
            "+ transfer)",
        ),
    ]


def _budget_by_role(ctx: RecordContext, pool: tuple[str, ...]) -> list[RecordingRule]:
    """The latency budget of each pool: the shares of its engines' end-to-end latency in
    queue (less a decode engine's wait for the transfer), prefill, KV transfer and decode,
    one series per pool, model and ``role`` (``both`` for colocated engines)."""
    r = ctx.records
    labels = (*pool, "model", "role")
    bp = by(labels)
    lat = ctx.window("latency")

    def rate(metric: str) -> str:
        return f"sum {bp} (rate({ctx.sidecar_series(metric)}[{lat}]))"

    e2e = f"({rate('inference_e2e_request_latency_seconds_sum')} > 0)"
    return [
        RecordingRule(
            r.pool_budget_queue,
            f"{ctx.queue_less_transfer(labels, lat)}\n/\n{e2e}",
            "latency budget of each pool (role): share of end-to-end latency waiting in "
            "the engines' queue, a decode engine's wait for the KV transfer left out",
        ),
        RecordingRule(
            r.pool_budget_prefill,
            f"{rate('inference_prefill_time_seconds_sum')}\n/\n{e2e}",
            "latency budget of each pool (role): share of end-to-end latency in prefill",
        ),
        RecordingRule(
            r.pool_budget_transfer,
            f"{rate('inference_kv_transfer_seconds_sum')}\n/\n{e2e}",
            "latency budget of each pool (role): share of end-to-end latency in the KV "
            "transfer, on the engines that observe it",
        ),
        RecordingRule(
            r.pool_budget_decode,
            f"{rate('inference_decode_time_seconds_sum')}\n/\n{e2e}",
            "latency budget of each pool (role): share of end-to-end latency in decode",
        ),
    ]


def _pool_role(
    ctx: RecordContext, role: str, labels: tuple[str, ...], rate: str, trend: str
) -> list[RecordingRule]:
    """The records of one role's pool (see :func:`pool_records`), grouped by ``labels``."""
    r = ctx.records
    bp, on_pool = by(labels), on(labels)
    mine = f'role="{role}"'
    queue = ctx.sidecar_series("inference_queue_depth", mine)
    waiting = f"sum {bp} (avg_over_time({queue}[{rate}]))"
    growth = f"sum {bp} (deriv({queue}[{trend}]))"
    prealloc = ctx.sidecar_series("inference_queue_depth_by_stage", 'stage="prealloc"', mine)
    running = r.of_role(r.pool_running, role)
    run = ctx.sidecar_series("inference_requests_running", mine)
    depth = r.of_role(r.pool_queue, role)
    if role == "decode":  # requests waiting for KV room to receive the cache count too
        waiting = (
            f"(\n{waiting}\n+ {on_pool}\nsum {bp} (avg_over_time({prealloc}[{rate}]))\n)"
            f"\nor\n{waiting}"
        )
        growth = f"(\n{growth}\n+ {on_pool}\nsum {bp} (deriv({prealloc}[{trend}]))\n)\nor\n{growth}"
    return [
        RecordingRule(
            r.of_role(r.pool_engines, role),
            f"count {bp} ({ctx.sidecar_series('inference_engine_info', mine)})",
            f"{role} engines of the model in the pool",
        ),
        RecordingRule(
            depth,
            waiting,
            f"requests the {role} pool holds waiting, mean over the window",
        ),
        RecordingRule(
            r.of_role(r.pool_queue_trend, role),
            growth,
            f"growth of the {role} pool's queue, requests per second (linear regression)",
        ),
        RecordingRule(
            running,
            f"sum {bp} (avg_over_time({run}[{rate}]))",
            f"requests the {role} pool runs, mean over the window",
        ),
        RecordingRule(
            r.of_role(r.pool_kv_cache, role),
            f"avg {bp} (avg_over_time({ctx.sidecar_series('inference_kv_cache_usage_ratio', mine)}"
            f"[{rate}]))",
            f"KV-cache usage of the {role} pool's engines (0-1), mean over engines and window",
        ),
        RecordingRule(
            r.of_role(r.pool_engines_needed, role),
            f"{r.of_role(r.pool_engines, role)}\n* (\n{depth}\n+ {running}\n)\n"
            f"/ (\n{running} > 1\nor\nclamp({running}, 1, 1)\n)",
            f"{role} engines the pool needs to run its waiting requests at today's "
            "concurrency per engine: engines x (waiting + running) / running",
        ),
    ]


def pooled_records(ctx: RecordContext) -> list[RecordingRule]:
    """:func:`pool_records` in their rule group."""
    return [replace(rule, group=POOL_GROUP) for rule in pool_records(ctx)]
