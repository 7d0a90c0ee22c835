"""The gateway in front of the engines (llm-d's endpoint picker with flow control): its queue,
the requests it sheds, and the engines and GPUs of the pool it feeds.

A gateway holds requests in its own queue while it finds its pool saturated, so they wait
before any engine and the engines' own queues stay short. Its series come from a sidecar of its
own (``--engine.type llmd-epp``) and carry that target's join labels, ``pool`` and ``model``.
The engines of its pool are the engine targets that share the gateway's pool labels
(``gateway.join`` in the site config: ``namespace``, and ``cluster`` where it is a join label)
and ``model``: an ``InferencePool`` selects model-server pods of its own namespace, and the
model a request is sent with is the name the engine serves (:class:`~exporter.signatures.site.
GatewayJoin`). An engine target is a target with engine info of an engine that is no gateway
(:data:`GATEWAYS`), so a sidecar that polls a gateway next to its engine counts as both.

Each engine of the pool gets an equal share of the gateway's queue and of its growth
(:data:`QUEUE_SHARE`, :data:`QUEUE_TREND_SHARE`), which the engine's queue signals add to its
own queue: a pool starved behind a queueing gateway shows its queue where the starved-GPU
signature reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.engines import SPECS
from exporter.signatures.promql_text import by, on, regex_alternatives
from exporter.signatures.signals.gpu_signals import GPU_UTILIZATION
from exporter.signatures.signals.signal import Rule, Signal
from exporter.signatures.signals.signal_groups import GATEWAY_GROUP, TARGET_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

GATEWAY_QUEUE_METRIC = "inference_gateway_queue_depth"
#: The engines that are gateways (they write a gateway's queue): they route, they run no model.
GATEWAYS = tuple(
    spec.name for spec in SPECS if any(r.target == GATEWAY_QUEUE_METRIC for r in spec.rules)
)
#: Outcomes by which the gateway sheds a request: refused at admission or evicted from its
#: queue (a client that gives up, ``evicted_context_cancelled``, is not shed by the gateway).
SHED_OUTCOMES = "rejected_.*|evicted_ttl|evicted_no_endpoints|evicted_other"


def pool_of(ctx: SignalContext) -> tuple[str, ...]:
    """The labels that name a gateway's pool across targets: ``gateway.join`` and ``model``."""
    return (*ctx.cfg.gateway.labels, "model")


def _per_gateway(ctx: SignalContext) -> tuple[str, ...]:
    return (*ctx.join, "pool", "model")


def engine_targets(ctx: SignalContext) -> str:
    """1 per engine target and model: the targets' engine info but a gateway's own (a sidecar
    may poll a gateway next to its engine: that target is an engine target too)."""
    gateways = regex_alternatives(GATEWAYS)
    info = ctx.latest("inference_engine_info", f'engine!~"{gateways}"')
    return f"group {by((*ctx.join, 'model'))} ({info})"


def _queue(ctx: SignalContext) -> str:
    queue = ctx.latest(GATEWAY_QUEUE_METRIC)
    return f"sum {by(_per_gateway(ctx))} ({queue})"


GATEWAY_QUEUE = Signal(
    "inference_gateway:queue_depth:sum",
    "requests",
    TARGET_GROUP,
    Rule(_queue, "requests the gateway holds in its own queue now, per gateway, pool and model"),
    "gateway queue",
)


def _queue_trend(ctx: SignalContext) -> str:
    queue = ctx.sidecar_series(GATEWAY_QUEUE_METRIC)
    return f"sum {by(_per_gateway(ctx))} (deriv({queue}[{ctx.window('queue_trend')}]))"


GATEWAY_QUEUE_TREND = Signal(
    "inference_gateway:queue_depth:deriv{queue_trend}",
    "requests_per_second",
    TARGET_GROUP,
    Rule(
        _queue_trend,
        "growth of the gateway's queue in requests per second (linear regression), per "
        "gateway, pool and model",
    ),
    "gateway queue growth",
)


def _shed(ctx: SignalContext) -> str:
    shed = ctx.sidecar_series("inference_gateway_requests_total", f'outcome=~"{SHED_OUTCOMES}"')
    return f"sum {by(_per_gateway(ctx))} (rate({shed}[{ctx.window('rate')}]))"


GATEWAY_SHED = Signal(
    "inference_gateway:requests_shed:rate{rate}",
    "requests_per_second",
    TARGET_GROUP,
    Rule(
        _shed,
        "requests per second the gateway refuses at admission or evicts from its queue "
        "(clients that give up not counted), per gateway, pool and model",
    ),
    "requests shed",
)


def _pool_engines(ctx: SignalContext) -> str:
    pool = by(pool_of(ctx))
    return (
        f"count {pool} (\n{engine_targets(ctx)}\n)\n"
        f"and {on(pool_of(ctx))}\ngroup {pool} ({ctx.name(GATEWAY_QUEUE)})"
    )


POOL_ENGINES = Signal(
    "inference_gateway:pool_engines:count",
    "count",
    TARGET_GROUP,
    Rule(
        _pool_engines,
        "engine targets of each gateway's pool (the gateway's pool labels and model), where a "
        "gateway queues",
    ),
    "pool engines",
)


def _share(ctx: SignalContext, per_gateway: Signal) -> str:
    pool, op = by(pool_of(ctx)), on(pool_of(ctx))
    return (
        f"sum {ctx.by_target} (\n{engine_targets(ctx)}\n* {op} group_left ()\n"
        f"(\nsum {pool} ({ctx.name(per_gateway)})\n/ {op}\n{ctx.name(POOL_ENGINES)}\n)\n)"
    )


QUEUE_SHARE = Signal(
    "inference:gateway_queue_depth_share:sum",
    "requests",
    TARGET_GROUP,
    Rule(
        lambda ctx: _share(ctx, GATEWAY_QUEUE),
        "each engine target's equal share of the requests its pool's gateway holds waiting",
    ),
    "gateway queue share",
)

QUEUE_TREND_SHARE = Signal(
    "inference:gateway_queue_depth_share:deriv{queue_trend}",
    "requests_per_second",
    TARGET_GROUP,
    Rule(
        lambda ctx: _share(ctx, GATEWAY_QUEUE_TREND),
        "each engine target's equal share of the growth of its pool's gateway queue",
    ),
    "gateway queue share growth",
)


def _pool_utilization(ctx: SignalContext) -> str:
    pool = pool_of(ctx)
    return (
        f"avg {by(pool)} (\n{ctx.name(GPU_UTILIZATION)}\n* {on(ctx.join)} group_right ()\n"
        f"{engine_targets(ctx)}\n)\nand {on(pool)}\n{ctx.name(POOL_ENGINES)}"
    )


POOL_GPU_UTILIZATION = Signal(
    "inference_gateway:pool_gpu_utilization:mean{rate}",
    "ratio",
    GATEWAY_GROUP,
    Rule(
        _pool_utilization,
        "mean GPU utilisation (0-1) of the engine targets of each gateway's pool",
    ),
    "pool GPU utilisation",
)
