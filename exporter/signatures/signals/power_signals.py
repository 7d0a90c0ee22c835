"""What holds a throttled GPU's clocks down: heat, the power brake, its draw at the power limit
it enforces, power smoothing - named, where the clock event reasons are only bits.

Only the GPUs whose clocks are held down (:data:`~.gpu_signals.CLOCK_EVENTS`) get these
records: the sidecar's own series name a GPU as the records would, so its draw and limit are
read as they are; the node agent's and dcgm-exporter's are recorded for the GPUs held down only
(:func:`~.gpu_signals.held_down`). dcgm-exporter reports the enforced limit
(``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``) only when its counters file lists it, and no power
smoothing state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, num, on, regex_alternatives
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import DcgmQuantity, dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_gpu
from exporter.signatures.signals.gpu_signals import THROTTLED, dcgm_reasons, held_down
from exporter.signatures.signals.node_join import agent_gpu, node_per_gpu
from exporter.signatures.signals.signal import ByLayout, Raw, Rule, Signal
from exporter.signatures.signals.signal_groups import GPU_STATE_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

_POWER = "inference_gpu_power_watts"
_LIMIT = "inference_gpu_power_limit_watts"
_DEFAULT = "inference_gpu_power_default_limit_watts"
_SMOOTHING = "inference_gpu_power_smoothing_enabled"

#: The causes a throttled GPU's description names, first match first: heat (a thermal reason,
#: or a hardware slowdown while one holds), the power brake (an external signal: the power
#: supply or the chassis; a hardware slowdown while it holds too), the power cap (the reason
#: itself, or a slowdown while the GPU draws at its enforced limit; "below its default" where that
#: limit is lower than the one the GPU boots with: a cap someone set), power smoothing (Blackwell:
#: it holds the draw between a floor and a ceiling and ramps it gradually), else a hardware
#: slowdown, else the reason's own name.
THERMAL = "thermal"
POWER_BRAKE = "power brake"
POWER_CAP = "power cap"
LOWERED_CAP = "power cap below its default"
SMOOTHING = "power smoothing"
HARDWARE = "hardware slowdown"


def _node_held_down(ctx: SignalContext, metric: str) -> str:
    return held_down(ctx, node_per_gpu(ctx, ctx.sidecar_series(metric)))


def _dcgm_held_down(ctx: SignalContext, quantity: DcgmQuantity) -> str:
    return held_down(ctx, dcgm_per_gpu(ctx, dcgm_quantity(ctx, quantity)))


POWER_DRAW = Signal(
    "inference_gpu:power_watts:max",
    "watts",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Raw(_POWER),
        node=Rule(
            lambda ctx: _node_held_down(ctx, _POWER),
            "board power draw (W) of throttled GPUs: the throttling alert's evidence",
        ),
        dcgm=Rule(
            lambda ctx: _dcgm_held_down(ctx, dcgm_fields.POWER),
            "power draw of the GPUs whose clocks are held down (DCGM_FI_DEV_POWER_USAGE, "
            "DCGM_FI_DEV_BOARD_POWER_WATTS from dcgm-exporter 4.9; W)",
        ),
    ),
    "power draw",
)

POWER_LIMIT = Signal(
    "inference_gpu:power_limit_watts:max",
    "watts",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Raw(_LIMIT),
        node=Rule(
            lambda ctx: _node_held_down(ctx, _LIMIT),
            "the power limit (W) throttled GPUs enforce: the throttling alert's evidence",
        ),
        dcgm=Rule(
            lambda ctx: _dcgm_held_down(ctx, dcgm_fields.POWER_LIMIT),
            "the power limit the GPUs whose clocks are held down enforce "
            "(DCGM_FI_DEV_ENFORCED_POWER_LIMIT, W; not in dcgm-exporter's default counters)",
        ),
    ),
    "power limit",
)


Events = Callable[[tuple[str, ...]], str]

_THERMAL_REASONS = ("sw_thermal", "hw_thermal")


def _cause(
    ctx: SignalContext,
    events: Events,
    gpu_labels: tuple[str, ...],
    *,
    power: str,
    limit: str,
    default: str | None,
    smoothing: str | None,
) -> str:
    """One series per GPU and active counted reason, its ``cause`` named (:data:`THERMAL` ...
    :data:`HARDWARE`, else the reason). ``events(reasons)`` is the layout's series of those
    reasons active (1 per GPU and reason, labelled ``gpu_labels`` and ``reason``); ``power``,
    ``limit``, ``default`` (the limit the GPU boots with) and ``smoothing`` its series of each
    GPU (``None``: none there)."""
    counted = ctx.cfg.names(THROTTLED, "reasons")
    per_gpu = on(gpu_labels)
    capped = num(ctx.cfg.ratio(THROTTLED, "power_cap_draw_at_least"))

    def of(*reasons: str) -> str | None:
        wanted = tuple(r for r in reasons if r in counted)
        return events(wanted) if wanted else None

    arms: list[tuple[str | None, str]] = [(of(*_THERMAL_REASONS), THERMAL)]
    slowdown = of("hw_slowdown")
    if slowdown is not None:
        arms.append((f"{slowdown}\nand {per_gpu}\n{events(_THERMAL_REASONS)}", THERMAL))
    arms.append((of("hw_power_brake"), POWER_BRAKE))
    if slowdown is not None:
        arms.append((f"{slowdown}\nand {per_gpu}\n{events(('hw_power_brake',))}", POWER_BRAKE))
    every = events(counted)
    at_limit = f"({power} / {per_gpu} {limit} >= {capped})"
    if default is not None:
        lowered = f"({limit} < {per_gpu} {default})"
        capped_events = of("power_cap")
        if capped_events is not None:
            arms.append((f"{capped_events}\nand {per_gpu}\n{lowered}", LOWERED_CAP))
        arms.append((f"{every}\nand {per_gpu}\n{at_limit}\nand {per_gpu}\n{lowered}", LOWERED_CAP))
    arms.append((of("power_cap"), POWER_CAP))
    arms.append((f"{every}\nand {per_gpu}\n{at_limit}", POWER_CAP))
    if smoothing is not None:
        arms.append((f"{every}\nand {per_gpu}\n({smoothing} == 1)", SMOOTHING))
    arms.append((slowdown, HARDWARE))
    named = [
        f'label_replace(\n{expr},\n"cause", "{cause}", "", ""\n)'
        for expr, cause in arms
        if expr is not None
    ]
    named.append(f'label_replace(\n{every},\n"cause", "$1", "reason", "(.+)"\n)')
    return f"\nor {on((*gpu_labels, 'reason'))}\n".join(named)


def _raw_events(ctx: SignalContext, labels: tuple[str, ...]) -> Events:
    """The active reasons of the sidecar's (or the node agent's) own series."""

    def events(reasons: tuple[str, ...]) -> str:
        active = ctx.sidecar_series(
            "inference_gpu_clock_event_active", f'reason=~"{regex_alternatives(reasons)}"'
        )
        return f"max {by((*labels, 'reason'))} ({active} > 0)"

    return events


def _cause_sidecar(ctx: SignalContext) -> str:
    series = ctx.sidecar_series
    gpu = (*ctx.join, *GPU_LABELS)
    events = _raw_events(ctx, gpu)
    return _cause(
        ctx,
        events,
        gpu,
        power=series(_POWER),
        limit=series(_LIMIT),
        default=series(_DEFAULT),
        smoothing=series(_SMOOTHING),
    )


def _cause_node(ctx: SignalContext) -> str:
    """The cause on the node agent's own series (one per agent and GPU), then given to the
    GPU's only holder with the reason and the cause (:func:`node_per_gpu`)."""
    series = ctx.sidecar_series
    gpu = agent_gpu(ctx)
    events = _raw_events(ctx, gpu)
    named = _cause(
        ctx,
        events,
        gpu,
        power=series(_POWER),
        limit=series(_LIMIT),
        default=series(_DEFAULT),
        smoothing=series(_SMOOTHING),
    )
    return node_per_gpu(ctx, named, keep=("reason", "cause"))


def _cause_dcgm(ctx: SignalContext) -> str:
    def events(reasons: tuple[str, ...]) -> str:
        return "(\n" + dcgm_reasons(ctx, reasons) + "\n)"

    gpu = (*ctx.join, *GPU_LABELS)
    power, limit = ctx.name(POWER_DRAW), ctx.name(POWER_LIMIT)
    return _cause(ctx, events, gpu, power=power, limit=limit, default=None, smoothing=None)


_CAUSE_HELP = (
    "1 per GPU and active clock event reason, labelled with its cause: thermal, power brake, "
    "power cap (the reason, or the GPU drawing at its enforced limit; below its default where "
    "the limit is lower than the one it boots with), power smoothing, hardware slowdown, else "
    "the reason"
)

#: Why each throttled GPU's clocks are held down: :data:`CLOCK_EVENTS` with a ``cause`` label.
CLOCK_CAUSE = Signal(
    "inference_gpu:clock_event_cause:max",
    "flag",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(_cause_sidecar, _CAUSE_HELP, window=0.0),
        node=Rule(_cause_node, _CAUSE_HELP + " (the GPU's only holder)", window=0.0),
        dcgm=Rule(
            _cause_dcgm,
            _CAUSE_HELP + " (no power smoothing state from dcgm-exporter)",
            window=0.0,
        ),
    ),
    "cause",
)
