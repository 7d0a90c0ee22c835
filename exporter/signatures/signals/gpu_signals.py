"""The GPUs: utilisation and its driver samples, HBM and SM activity (rates over windows), and
their state now (framebuffer, Xids, clock events, and the temperature and SM clock of the GPUs
held down).

Each layout reads them from its own source: ``sidecar`` from the sidecar's NVML collector,
``node`` from the node agent, each GPU given to the pod holding it (:mod:`.node_join`),
``dcgm`` from dcgm-exporter, joined by pod (:mod:`.dcgm_join`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.metrics import CLOCK_EVENT_BITS, GPU_LABELS, THROTTLE_REASONS
from exporter.signatures.promql_text import by, num, on, regex_alternatives, selector
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_gpu, dcgm_per_target, dcgm_series
from exporter.signatures.signals.node_join import (
    agent_gpu,
    node_per_gpu,
    node_per_target,
)
from exporter.signatures.signals.signal import ByLayout, Raw, Rule, Signal
from exporter.signatures.signals.signal_context import pod_labels
from exporter.signatures.signals.signal_groups import GPU_GROUP, GPU_STATE_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

SAMPLES = "inference_gpu_utilization_samples"
PULSING = "InferenceGPUUtilizationPulsing"
THROTTLED = "InferenceGPUThrottled"


def _busy(ctx: SignalContext) -> str:
    return ctx.sidecar_series("inference_gpu_busy_seconds_total")


def _dcgm_util(ctx: SignalContext) -> str:
    """dcgm-exporter's latest utilisation reading of each GPU, 0-1 (either generation)."""
    return dcgm_quantity(ctx, dcgm_fields.UTILIZATION)


def _dcgm_names(quantity: dcgm_fields.DcgmQuantity) -> str:
    """A quantity's names for a rule's help text."""
    return " or ".join(quantity.metrics)


# --- utilisation ------------------------------------------------------------------------------


def _utilization_sidecar(ctx: SignalContext) -> str:
    return f"avg {ctx.by_target} (rate({_busy(ctx)}[{ctx.window('rate')}]))"


def _utilization_node(ctx: SignalContext) -> str:
    return node_per_target(ctx, "avg", f"rate({_busy(ctx)}[{ctx.window('rate')}])")


def _utilization_dcgm(ctx: SignalContext) -> str:
    rate = ctx.window("rate")
    mean = dcgm_quantity(ctx, dcgm_fields.UTILIZATION, lambda s: f"avg_over_time({s}[{rate}])")
    return dcgm_per_target(ctx, mean)


#: Mean utilisation of the target's GPUs, the device's: every tenant's work on a shared GPU.
GPU_UTILIZATION = Signal(
    "inference:gpu_utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            _utilization_sidecar,
            "mean GPU utilisation (0-1) over the target's GPUs, from every driver sample",
        ),
        node=Rule(
            _utilization_node,
            "mean GPU utilisation (0-1) over the GPUs the target's pod holds (the node "
            "agent's, from every driver sample)",
        ),
        dcgm=Rule(
            _utilization_dcgm,
            "mean GPU utilisation (0-1) over the pod's GPUs (DCGM_FI_DEV_GPU_UTIL_RATIO, or "
            "DCGM_FI_DEV_GPU_UTIL in % before dcgm-exporter 4.9)",
        ),
    ),
    "device utilisation",
)


# --- driver samples: idle and saturated shares ------------------------------------------------


def _bound(ctx: SignalContext, param: str) -> str:
    """A bucket bound of the pulsing alert as the sidecar writes ``le``."""
    return num(ctx.cfg.ratio(PULSING, param))


def _bucket(ctx: SignalContext, param: str) -> str:
    le = f'le="{_bound(ctx, param)}"'
    return ctx.sidecar_series(f"{SAMPLES}_bucket", le)


def _sample_count_sidecar(ctx: SignalContext) -> str:
    count = ctx.sidecar_series(f"{SAMPLES}_count")
    return f"sum {ctx.by_target} (increase({count}[{ctx.window('pulsing')}]))"


def _sample_count_node(ctx: SignalContext) -> str:
    count = ctx.sidecar_series(f"{SAMPLES}_count")
    return node_per_target(ctx, "sum", f"increase({count}[{ctx.window('pulsing')}])")


_SAMPLES_HELP = "driver utilisation samples in the window, the two shares' denominator"

#: Driver utilisation samples in the window (dcgm-exporter has none: one reading a scrape).
UTILIZATION_SAMPLES = Signal(
    "inference:gpu_utilization_samples:increase{pulsing}",
    "count",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(_sample_count_sidecar, _SAMPLES_HELP),
        node=Rule(_sample_count_node, _SAMPLES_HELP),
        dcgm=None,
    ),
    "driver samples",
)


def _dcgm_idle_sample(ctx: SignalContext) -> str:
    return dcgm_per_gpu(ctx, f"{_dcgm_util(ctx)} <= bool {_bound(ctx, 'idle_sample_at_most')}")


def _dcgm_busy_sample(ctx: SignalContext) -> str:
    return dcgm_per_gpu(ctx, f"{_dcgm_util(ctx)} > bool {_bound(ctx, 'busy_sample_above')}")


#: dcgm-exporter's latest reading of a GPU at or below the idle bound (1) or not (0).
DCGM_IDLE_SAMPLE = Signal(
    "inference_gpu:gpu_utilization_idle_sample:bool",
    "flag",
    GPU_GROUP,
    ByLayout(
        sidecar=None,
        node=None,
        dcgm=Rule(
            _dcgm_idle_sample,
            lambda ctx: (
                "1 when a GPU's latest utilisation reading is at or below "
                f"{_bound(ctx, 'idle_sample_at_most')}"
            ),
        ),
    ),
)

#: dcgm-exporter's latest reading of a GPU above the busy bound (1) or not (0).
DCGM_BUSY_SAMPLE = Signal(
    "inference_gpu:gpu_utilization_busy_sample:bool",
    "flag",
    GPU_GROUP,
    ByLayout(
        sidecar=None,
        node=None,
        dcgm=Rule(
            _dcgm_busy_sample,
            lambda ctx: (
                "1 when a GPU's latest utilisation reading is above "
                f"{_bound(ctx, 'busy_sample_above')}"
            ),
        ),
    ),
)


def _idle_sidecar(ctx: SignalContext) -> str:
    bucket = _bucket(ctx, "idle_sample_at_most")
    return (
        f"sum {ctx.by_target} (increase({bucket}[{ctx.window('pulsing')}]))\n/\n"
        f"{ctx.name(UTILIZATION_SAMPLES)}"
    )


def _idle_node(ctx: SignalContext) -> str:
    bucket = _bucket(ctx, "idle_sample_at_most")
    idle = node_per_target(ctx, "sum", f"increase({bucket}[{ctx.window('pulsing')}])")
    return f"{idle}\n/\n{ctx.name(UTILIZATION_SAMPLES)}"


def _idle_dcgm(ctx: SignalContext) -> str:
    return (
        f"avg {ctx.by_target} "
        f"(avg_over_time({ctx.name(DCGM_IDLE_SAMPLE)}[{ctx.window('pulsing')}]))"
    )


def _idle_help(ctx: SignalContext) -> str:
    return f"share of driver utilisation samples at or below {_bound(ctx, 'idle_sample_at_most')}"


IDLE_SAMPLES = Signal(
    "inference:gpu_utilization_idle_samples:ratio{pulsing}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(_idle_sidecar, _idle_help),
        node=Rule(_idle_node, _idle_help),
        dcgm=Rule(
            _idle_dcgm,
            lambda ctx: (
                "share of utilisation readings at or below "
                f"{_bound(ctx, 'idle_sample_at_most')} (one per evaluation)"
            ),
        ),
    ),
    "idle samples",
)


def _busy_sidecar(ctx: SignalContext) -> str:
    bucket = _bucket(ctx, "busy_sample_above")
    return (
        f"1 - (\nsum {ctx.by_target} (increase({bucket}[{ctx.window('pulsing')}]))\n/\n"
        f"{ctx.name(UTILIZATION_SAMPLES)}\n)"
    )


def _busy_node(ctx: SignalContext) -> str:
    bucket = _bucket(ctx, "busy_sample_above")
    busy = node_per_target(ctx, "sum", f"increase({bucket}[{ctx.window('pulsing')}])")
    return f"1 - (\n{busy}\n/\n{ctx.name(UTILIZATION_SAMPLES)}\n)"


def _busy_dcgm(ctx: SignalContext) -> str:
    return (
        f"avg {ctx.by_target} "
        f"(avg_over_time({ctx.name(DCGM_BUSY_SAMPLE)}[{ctx.window('pulsing')}]))"
    )


def _busy_help(ctx: SignalContext) -> str:
    return f"share of driver utilisation samples above {_bound(ctx, 'busy_sample_above')}"


BUSY_SAMPLES = Signal(
    "inference:gpu_utilization_busy_samples:ratio{pulsing}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(_busy_sidecar, _busy_help),
        node=Rule(_busy_node, _busy_help),
        dcgm=Rule(
            _busy_dcgm,
            lambda ctx: (
                "share of utilisation readings above "
                f"{_bound(ctx, 'busy_sample_above')} (one per evaluation)"
            ),
        ),
    ),
    "busy samples",
)


# --- HBM and SMs ------------------------------------------------------------------------------


def _dram(ctx: SignalContext) -> str:
    return ctx.sidecar_series("inference_gpu_dram_active_seconds_total")


def _sm(ctx: SignalContext) -> str:
    return ctx.sidecar_series("inference_gpu_sm_active_ratio")


HBM_BANDWIDTH = Signal(
    "inference:gpu_memory_bandwidth_utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: f"avg {ctx.by_target} (rate({_dram(ctx)}[{ctx.window('rate')}]))",
            "mean HBM bandwidth utilisation (0-1) over the target's GPUs (GPM, Hopper+)",
        ),
        node=Rule(
            lambda ctx: node_per_target(ctx, "avg", f"rate({_dram(ctx)}[{ctx.window('rate')}])"),
            "mean HBM bandwidth utilisation (0-1) over the pod's GPUs (GPM, Hopper+)",
        ),
        dcgm=Rule(
            lambda ctx: dcgm_per_target(
                ctx,
                dcgm_quantity(
                    ctx,
                    dcgm_fields.DRAM_ACTIVE,
                    lambda s: f"avg_over_time({s}[{ctx.window('rate')}])",
                ),
            ),
            "mean DRAM-interface activity (0-1) over the pod's GPUs "
            f"({_dcgm_names(dcgm_fields.DRAM_ACTIVE)}, a profiling field)",
        ),
    ),
    "HBM bandwidth",
)

SM_ACTIVE = Signal(
    "inference:gpu_sm_active:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: f"avg {ctx.by_target} (avg_over_time({_sm(ctx)}[{ctx.window('rate')}]))",
            "mean share of time the SMs had a warp resident (0-1) over the target's GPUs "
            "(GPM, Hopper+)",
        ),
        node=Rule(
            lambda ctx: node_per_target(
                ctx, "avg", f"avg_over_time({_sm(ctx)}[{ctx.window('rate')}])"
            ),
            "mean share of time the SMs had a warp resident (0-1) over the pod's GPUs "
            "(GPM, Hopper+)",
        ),
        dcgm=Rule(
            lambda ctx: dcgm_per_target(
                ctx,
                dcgm_quantity(
                    ctx,
                    dcgm_fields.SM_ACTIVE,
                    lambda s: f"avg_over_time({s}[{ctx.window('rate')}])",
                ),
            ),
            "mean share of time the SMs had a warp resident (0-1) over the pod's GPUs "
            f"({_dcgm_names(dcgm_fields.SM_ACTIVE)}, a profiling field)",
        ),
    ),
    "SM activity",
)


# --- state now: framebuffer, Xids, clock events -----------------------------------------------


def _memory_used_sidecar(ctx: SignalContext) -> str:
    used = ctx.latest("inference_gpu_memory_used_bytes")
    total = ctx.latest("inference_gpu_memory_total_bytes")
    return f"max {ctx.by_gpu} (\n{used}\n/\n{total}\n)"


def _memory_used_node(ctx: SignalContext) -> str:
    used = ctx.latest("inference_gpu_memory_used_bytes")
    total = ctx.latest("inference_gpu_memory_total_bytes")
    return node_per_gpu(ctx, f"{used}\n/\n{total}")


def _memory_used_dcgm(ctx: SignalContext) -> str:
    used = dcgm_quantity(ctx, dcgm_fields.FB_USED, ctx.last)
    free = dcgm_quantity(ctx, dcgm_fields.FB_FREE, ctx.last)
    return dcgm_per_gpu(ctx, f"{used}\n/\n(\n{used}\n+\n{free}\n)")


#: Framebuffer used per GPU (0-1).
MEMORY_USED = Signal(
    "inference_gpu:memory_used:ratio",
    "ratio",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(_memory_used_sidecar, "framebuffer used / total per GPU"),
        node=Rule(_memory_used_node, "framebuffer used / total per GPU the pod holds"),
        dcgm=Rule(
            _memory_used_dcgm,
            "framebuffer used / (used + free) per GPU (DCGM_FI_DEV_FB_USED_BYTES and "
            "_FB_FREE_BYTES, or DCGM_FI_DEV_FB_USED and _FB_FREE in MiB before dcgm-exporter "
            "4.9)",
        ),
    ),
    "framebuffer",
)


def _dcgm_xid_changed(ctx: SignalContext) -> str:
    xid = ctx.window("xid")

    def changed(metric: str) -> str:
        last = dcgm_series(ctx, metric)
        any_last = selector(metric, ctx.cfg.selectors.dcgm)
        return (
            f"({last} != 0)\nand\n(\nchanges({last}[{xid}]) > 0\nor\n"
            f"({last} unless {last} offset {xid})\nand on (UUID)\n"
            f"group by (UUID) ({any_last} offset {xid})\n)"
        )

    # Either generation's name (newest first); a GPU's Xid under both counts once.
    names = [changed(metric) for metric in dcgm_fields.XID.metrics]
    inner = names[0] if len(names) == 1 else "(\n" + "\n)\nor\n(\n".join(names) + "\n)"
    return dcgm_per_gpu(ctx, inner, keep=("err_code",))


#: dcgm-exporter's last Xid of a GPU where it is new (dcgm-exporter keeps only the last one).
DCGM_XID_CHANGED = Signal(
    "inference_gpu:dcgm_xid_errors_last:changed{xid}",
    "count",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=None,
        node=None,
        dcgm=Rule(
            _dcgm_xid_changed,
            f"the last Xid of a GPU ({_dcgm_names(dcgm_fields.XID)}) where it changed, or "
            "appeared "
            "in the window while the GPU was already reported a window ago (before, every "
            "old Xid would look new)",
            window=0.0,
        ),
    ),
)


def _xid_new_sidecar(ctx: SignalContext) -> str:
    xid = ctx.window("xid")
    xids = ctx.sidecar_series("inference_gpu_xid_errors_total")
    by_xid = by((*ctx.join, *GPU_LABELS, "xid"))
    history = ctx.history(ctx.cfg.window_seconds("xid"))
    return (
        f"sum {by_xid} (increase({xids}[{xid}]) > 0 and {xids} offset {xid})\n"
        f"or\n(\n"
        f"sum {by_xid} ({xids} unless {xids} offset {xid})\n"
        f"and {on(ctx.join)}\n{history}\n)"
    )


def _xid_new_node(ctx: SignalContext) -> str:
    xid = ctx.window("xid")
    xids = ctx.sidecar_series("inference_gpu_xid_errors_total")
    build = ctx.sidecar_series("inference_exporter_build_info")
    agent = agent_gpu(ctx)[: -len(GPU_LABELS)]
    agent_history = f"group {by(agent)} (max_over_time({build}[{xid}] offset {xid}))"
    new_xids = (
        f"(increase({xids}[{xid}]) > 0 and {xids} offset {xid})\n"
        f"or\n(({xids} unless {xids} offset {xid}) and {on(agent)} {agent_history})"
    )
    return node_per_gpu(ctx, new_xids, keep=("xid",))


def _xid_new_dcgm(ctx: SignalContext) -> str:
    """One series per GPU and Xid out of the last Xid of each GPU: the critical Xids by
    code, any other as ``xid="other"`` with its code in ``err_code``."""
    changed = ctx.name(DCGM_XID_CHANGED)
    critical = ctx.cfg.ints("InferenceGPUXidErrors", "critical_xids")
    per_xid = [
        f'label_replace(clamp({changed} == {code}, 1, 1), "xid", "{code}", "", "")'
        for code in critical
    ]
    others = " or ".join(f"{changed} == {code}" for code in critical)
    per_xid.append(
        "label_replace(\nlabel_replace(\n"
        f"clamp({changed}, 1, 1) unless ({others}),\n"
        '"xid", "other", "", ""\n),\n"xid", "$1", "err_code", "(.+)"\n)'
    )
    return "max without (err_code) (\n" + "\nor\n".join(per_xid) + "\n)"


#: New Xid errors in the window, per GPU and Xid.
XID_NEW = Signal(
    "inference_gpu:xid_errors:increase{xid}",
    "count",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(
            _xid_new_sidecar,
            "Xid errors in the window per GPU and Xid: the increase of a counter that "
            "existed a window ago; a counter that appeared within the window counts whole "
            "(its first increment is invisible to Prometheus' increase()), once the target "
            "has a window of history (before, every old counter would look new). "
            "MetricsQL's increase() counts a counter that starts with a small value whole "
            "by itself; the offset keeps both engines to the same rule",
            window=0.0,
        ),
        node=Rule(
            _xid_new_node,
            "Xid errors in the window per GPU and Xid (as in the sidecar profile, each "
            "holding pod's counters on the node agent and the agent's own history)",
            window=0.0,
        ),
        dcgm=Rule(
            _xid_new_dcgm,
            "1 per GPU and Xid with a new Xid in the window (DCGM keeps only the last "
            "Xid, so repeats of the same Xid are not counted)",
        ),
    ),
    "new Xids",
)


def _dcgm_clock_reasons(ctx: SignalContext) -> str:
    # DCGM 3.3 renamed the field; either name, one unit (a bitmask).
    names = "|".join(sorted(dcgm_fields.CLOCK_REASONS.metrics))
    return dcgm_per_gpu(ctx, ctx.last(dcgm_series(ctx, "", f'__name__=~"{names}"')))


#: dcgm-exporter's clock event reason bitmask per GPU.
DCGM_CLOCK_REASONS = Signal(
    "inference_gpu:dcgm_clock_event_reasons:max",
    "count",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=None,
        node=None,
        dcgm=Rule(
            _dcgm_clock_reasons,
            "clock event reason bitmask per GPU (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, "
            "formerly _CLOCK_THROTTLE_REASONS; not in dcgm-exporter's default counters)",
        ),
    ),
)


def _throttled(ctx: SignalContext) -> str:
    reasons = regex_alternatives(ctx.cfg.names(THROTTLED, "reasons"))
    return ctx.latest("inference_gpu_clock_event_active", f'reason=~"{reasons}"')


def _from_mask(ctx: SignalContext) -> bool:
    """Whether the reasons that count are all in ``inference_gpu_clock_throttle_reasons``
    (the default): then the throttled GPUs come from that one series per GPU, not from the
    6 or more ``inference_gpu_clock_event_active`` series of each GPU's reasons."""
    return set(ctx.cfg.names(THROTTLED, "reasons")) <= set(THROTTLE_REASONS)


_MASK = "inference_gpu_clock_throttle_reasons"


def _decoded(ctx: SignalContext, mask: str) -> str:
    """One series per GPU and active counted reason, out of the reasons bitmask ``mask``."""
    reasons = ctx.cfg.names(THROTTLED, "reasons")
    return "\nor\n".join(
        f"label_replace(floor({mask} / {CLOCK_EVENT_BITS[name]}) "
        f'% 2 == 1, "reason", "{name}", "", "")'
        for name in reasons
    )


def _throttle_mask_sidecar(ctx: SignalContext) -> str:
    return f"max {by((*ctx.join, *GPU_LABELS))} ({ctx.latest(_MASK)} > 0)"


#: The throttling reasons' bitmask of each GPU that has one active; absent otherwise. Read
#: once per GPU, so the clock event record decodes the reasons of the few throttled GPUs.
THROTTLE_REASON_MASK = Signal(
    "inference_gpu:clock_throttle_reasons:max",
    "count",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(
            _throttle_mask_sidecar,
            "bitmask of the active throttling clock event reasons per GPU while any is "
            "active (inference_gpu_clock_throttle_reasons); absent otherwise",
        ),
        node=Rule(
            lambda ctx: node_per_gpu(ctx, f"{ctx.latest(_MASK)} > 0"),
            "bitmask of the active throttling clock event reasons per GPU while any is "
            "active (the node agent's inference_gpu_clock_throttle_reasons); absent otherwise",
        ),
        dcgm=None,
    ),
)


def _clock_events_sidecar(ctx: SignalContext) -> str:
    if _from_mask(ctx):
        return _decoded(ctx, ctx.name(THROTTLE_REASON_MASK))
    by_reason = by((*ctx.join, *GPU_LABELS, "reason"))
    return f"max {by_reason} ({_throttled(ctx)} > 0)"


def _clock_events_node(ctx: SignalContext) -> str:
    if _from_mask(ctx):
        return _decoded(ctx, ctx.name(THROTTLE_REASON_MASK))
    return node_per_gpu(ctx, f"{_throttled(ctx)} > 0", keep=("reason",))


def _clock_events_dcgm(ctx: SignalContext) -> str:
    """One series per GPU and active clock event reason, out of the reasons bitmask."""
    return _decoded(ctx, ctx.name(DCGM_CLOCK_REASONS))


#: 1 per GPU and reason while a clock event reason holds its clocks down; absent otherwise.
CLOCK_EVENTS = Signal(
    "inference_gpu:clock_event_active:max",
    "flag",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(
            _clock_events_sidecar,
            "1 per GPU and reason while a hardware or thermal clock event reason holds "
            "the clocks down; absent otherwise (a fleet writes what is throttled, not a "
            "zero per GPU and reason)",
        ),
        node=Rule(
            _clock_events_node,
            "1 per GPU and reason while a hardware or thermal clock event reason holds the "
            "clocks down (the node agent's); absent otherwise",
        ),
        dcgm=Rule(
            _clock_events_dcgm,
            "1 per GPU and reason while a hardware or thermal clock event reason holds "
            "the clocks down",
        ),
    ),
    "clock event",
)


def held_down(ctx: SignalContext, per_gpu: str) -> str:
    """``per_gpu`` only for the GPUs with a clock event reason active: the throttling
    alert's evidence, one series per throttled GPU instead of one per GPU (filtered before
    any aggregation, so a healthy fleet costs one set lookup per GPU)."""
    return f"{per_gpu}\nand {on((*ctx.join, *GPU_LABELS))}\n{ctx.name(CLOCK_EVENTS)}"


def node_held_down(ctx: SignalContext, metric: str) -> str:
    """The node agent's ``metric`` of the GPUs held down, filtered before the join (the agent's
    series name the holding pod, as the clock event record does)."""
    throttled = f"and {on((*pod_labels(ctx), *GPU_LABELS))} {ctx.name(CLOCK_EVENTS)}"
    return node_per_gpu(ctx, f"{ctx.sidecar_series(metric)}\n{throttled}")


# The sidecar's own series name a GPU as the records would: its evidence reads them where an
# alert needs them, instead of a record of every GPU every time.
TEMPERATURE = Signal(
    "inference_gpu:temperature_celsius:max",
    "celsius",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Raw("inference_gpu_temperature_celsius"),
        node=Rule(
            lambda ctx: node_held_down(ctx, "inference_gpu_temperature_celsius"),
            "GPU temperature (°C) of throttled GPUs: the throttling alert's evidence",
        ),
        dcgm=Rule(
            lambda ctx: held_down(
                ctx, dcgm_per_gpu(ctx, dcgm_quantity(ctx, dcgm_fields.GPU_TEMPERATURE))
            ),
            "GPU die temperature of the GPUs whose clocks are held down "
            f"({_dcgm_names(dcgm_fields.GPU_TEMPERATURE)})",
        ),
    ),
    "temperature",
)

SM_CLOCK = Signal(
    "inference_gpu:sm_clock_hertz:max",
    "hertz",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Raw("inference_gpu_sm_clock_hertz"),
        node=Rule(
            lambda ctx: node_held_down(ctx, "inference_gpu_sm_clock_hertz"),
            "SM clock (Hz) of throttled GPUs: the throttling alert's evidence",
        ),
        dcgm=Rule(
            lambda ctx: held_down(ctx, dcgm_per_gpu(ctx, dcgm_quantity(ctx, dcgm_fields.SM_CLOCK))),
            "current SM clock of the GPUs whose clocks are held down (DCGM_FI_DEV_SM_CLOCK_HERTZ, "
            "or DCGM_FI_DEV_SM_CLOCK in MHz before dcgm-exporter 4.9)",
        ),
    ),
    "SM clock",
)
