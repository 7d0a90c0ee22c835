"""What holds a throttled GPU's clocks down: heat, the power brake, its draw at the power limit
it enforces, power smoothing - named, where the clock event reasons are only bits.

Only the GPUs whose clocks are held down (:data:`~.gpu_signals.CLOCK_EVENTS`) get these
records (:func:`~.gpu_signals.held_down`): each power reading is selected once per evaluation,
and the cause reads the few series of the GPUs held down as often as it needs. dcgm-exporter
reports the enforced limit (``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``) only when its counters file
lists it, and no default limit or power smoothing state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import num, on
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import DcgmQuantity, dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_gpu
from exporter.signatures.signals.gpu_signals import (
    CLOCK_EVENTS,
    THROTTLED,
    held_down,
    node_held_down,
)
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
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


def _sidecar_held_down(ctx: SignalContext, metric: str) -> str:
    """The sidecar's own reading of the GPUs held down, filtered before it is aggregated."""
    return f"max {ctx.by_gpu} (\n{held_down(ctx, ctx.sidecar_series(metric))}\n)"


def _held_down(metric: str, what: str, dcgm: Rule | None = None) -> ByLayout:
    """A power reading of the GPUs held down, in the sidecar and node layouts; ``dcgm`` is the
    dcgm layout's where dcgm-exporter has the reading."""
    return ByLayout(
        sidecar=Rule(lambda ctx: _sidecar_held_down(ctx, metric), what),
        node=Rule(lambda ctx: node_held_down(ctx, metric), what + " (the node agent's)"),
        dcgm=dcgm,
    )


def _dcgm_held_down(ctx: SignalContext, quantity: DcgmQuantity) -> str:
    return held_down(ctx, dcgm_per_gpu(ctx, dcgm_quantity(ctx, quantity)))


POWER_DRAW = Signal(
    "inference_gpu:power_watts:max",
    "watts",
    GPU_STATE_GROUP,
    _held_down(
        _POWER,
        "board power draw (W) of throttled GPUs",
        Rule(
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
    _held_down(
        _LIMIT,
        "the power limit (W) throttled GPUs enforce",
        Rule(
            lambda ctx: _dcgm_held_down(ctx, dcgm_fields.POWER_LIMIT),
            "the power limit the GPUs whose clocks are held down enforce "
            "(DCGM_FI_DEV_ENFORCED_POWER_LIMIT, W; not in dcgm-exporter's default counters)",
        ),
    ),
    "power limit",
)

POWER_DEFAULT_LIMIT = Signal(
    "inference_gpu:power_default_limit_watts:max",
    "watts",
    GPU_STATE_GROUP,
    _held_down(
        _DEFAULT,
        "the power limit throttled GPUs boot with (W): a lower enforced limit is a cap someone set",
    ),
    "default power limit",
)

POWER_SMOOTHING = Signal(
    "inference_gpu:power_smoothing_enabled:max",
    "flag",
    GPU_STATE_GROUP,
    _held_down(
        _SMOOTHING, "1 where power smoothing is on on a throttled GPU (Blackwell), 0 where off"
    ),
    "power smoothing",
)


#: The reasons whose name is their cause; any other counted reason is named by itself.
_BY_REASON = (
    (THERMAL, "sw_thermal|hw_thermal"),
    (POWER_BRAKE, "hw_power_brake"),
    (POWER_CAP, "power_cap"),
    (HARDWARE, "hw_slowdown"),
)


def _by_reason(ctx: SignalContext) -> str:
    named = f'label_replace({ctx.name(CLOCK_EVENTS)}, "cause", "$1", "reason", "(.+)")'
    for cause, reasons in _BY_REASON:
        named = f'label_replace(\n{named},\n"cause", "{cause}", "reason", "{reasons}"\n)'
    return named


#: Each throttled GPU's active reasons named by the reason alone (the cause record's input).
CAUSE_BY_REASON = Signal(
    "inference_gpu:clock_event_reason_cause:max",
    "flag",
    GPU_STATE_GROUP,
    Rule(
        _by_reason,
        "1 per GPU and active clock event reason, labelled with the cause its name gives: "
        "thermal, power brake, power cap, hardware slowdown, else the reason",
        window=0.0,
    ),
)


def _cause_expr(ctx: SignalContext, *, default: bool, smoothing: bool) -> str:
    """:data:`CAUSE_BY_REASON` with a hardware slowdown refined by what else holds on its GPU
    (a thermal reason, the power brake) and by its power state (at the enforced limit, that
    limit below the GPU's default, power smoothing on).

    Everything is read from the records of the GPUs held down, never a record through a label
    selector: the reasons are told apart by ``and on (cause)`` against a one-series vector of
    the wanted cause."""
    per_gpu = on((*ctx.join, *GPU_LABELS))
    named = ctx.name(CAUSE_BY_REASON)

    def having(cause: str) -> str:
        """The series of the named reasons whose cause is ``cause``."""
        wanted = f'label_replace(group ({named}), "cause", "{cause}", "", "")'
        return f"({named} and on (cause) {wanted})"

    def renamed(expr: str, cause: str) -> str:
        return f'label_replace(\n{expr},\n"cause", "{cause}", "", ""\n)'

    slowdown, capped = having(HARDWARE), having(POWER_CAP)
    ratio = num(ctx.cfg.ratio(THROTTLED, "power_cap_draw_at_least"))
    power, limit = ctx.name(POWER_DRAW), ctx.name(POWER_LIMIT)
    at_limit = f"({power} / {per_gpu} {limit} >= {ratio})"
    arms = [
        renamed(f"{slowdown}\nand {per_gpu}\n{having(THERMAL)}", THERMAL),
        renamed(f"{slowdown}\nand {per_gpu}\n{having(POWER_BRAKE)}", POWER_BRAKE),
    ]
    if default:
        lowered = f"({limit} < {per_gpu} {ctx.name(POWER_DEFAULT_LIMIT)})"
        arms.append(renamed(f"{capped}\nand {per_gpu}\n{lowered}", LOWERED_CAP))
        arms.append(
            renamed(f"{slowdown}\nand {per_gpu}\n{at_limit}\nand {per_gpu}\n{lowered}", LOWERED_CAP)
        )
    arms.append(renamed(f"{slowdown}\nand {per_gpu}\n{at_limit}", POWER_CAP))
    if smoothing:
        enabled = f"({ctx.name(POWER_SMOOTHING)} == 1)"
        arms.append(renamed(f"{slowdown}\nand {per_gpu}\n{enabled}", SMOOTHING))
    arms.append(named)
    return f"\nor {on((*ctx.join, *GPU_LABELS, 'reason'))}\n".join(arms)


_CAUSE_HELP = (
    "1 per GPU and active clock event reason, labelled with its cause: thermal, power brake, "
    "power cap (the reason, or a slowdown while the GPU draws at its enforced limit; below its "
    "default where that limit is lower than the one it boots with), power smoothing, hardware "
    "slowdown, else the reason"
)

#: Why each throttled GPU's clocks are held down: :data:`CLOCK_EVENTS` with a ``cause`` label.
CLOCK_CAUSE = Signal(
    "inference_gpu:clock_event_cause:max",
    "flag",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: _cause_expr(ctx, default=True, smoothing=True), _CAUSE_HELP, window=0.0
        ),
        node=Rule(
            lambda ctx: _cause_expr(ctx, default=True, smoothing=True),
            _CAUSE_HELP + " (the GPU's only holder)",
            window=0.0,
        ),
        dcgm=Rule(
            lambda ctx: _cause_expr(ctx, default=False, smoothing=False),
            _CAUSE_HELP + " (dcgm-exporter reports no default limit and no power smoothing state)",
            window=0.0,
        ),
    ),
    "cause",
)
