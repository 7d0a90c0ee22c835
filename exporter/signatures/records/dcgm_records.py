"""GPU records from dcgm-exporter (the ``dcgm`` profile), and how its series meet the
sidecar's targets.

dcgm-exporter series belong to the GPU's pod (``namespace``, ``pod``) but not to the
sidecar's scrape target (their ``instance`` and ``job`` are dcgm-exporter's). They are
aggregated by the dcgm join labels and then given the target's remaining join labels from
``inference:exporter_build_info:group``, one series per sidecar target.
"""

from __future__ import annotations

from exporter.metrics import CLOCK_EVENT_BITS, GPU_LABELS
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import by, num, on, selector
from exporter.signatures.records.record_context import RecordContext

# The join labels a dcgm-exporter series must carry to count: a GPU no pod holds is no
# target's.
DCGM_REQUIRED = ("namespace", "pod")
PULSING = "InferenceGPUUtilizationPulsing"


def dcgm_series(ctx: RecordContext, metric: str, *matchers: str) -> str:
    """A dcgm-exporter series selector: only series attributed to a pod."""
    attributed = [
        f'{dcgm_label}!=""'
        for join_label, dcgm_label in ctx.cfg.dcgm.labels
        if join_label in DCGM_REQUIRED
    ]
    return selector(metric, *matchers, ctx.cfg.selectors.dcgm, attributed)


def _renamed(ctx: RecordContext, expr: str, *, gpu: bool) -> str:
    """dcgm-exporter labels renamed to the join labels (and UUID to uuid)."""
    for join_label, dcgm_label in ctx.cfg.dcgm.labels:
        if join_label != dcgm_label:
            expr = f'label_replace({expr}, "{join_label}", "$1", "{dcgm_label}", "(.*)")'
    if gpu:
        expr = f'label_replace({expr}, "uuid", "$1", "UUID", "(.*)")'
    return expr


def dcgm_per_target(ctx: RecordContext, inner: str, aggregation: str = "avg") -> str:
    """Per-target value from dcgm series ``inner`` (a range function over one metric)."""
    dcgm_join = ctx.cfg.dcgm.target_labels
    grouped = f"{aggregation} {by(dcgm_join)} ({_renamed(ctx, inner, gpu=False)})"
    return f"{grouped}\n* {on(dcgm_join)} group_right ()\n{ctx.records.target_info}"


def dcgm_per_gpu(ctx: RecordContext, inner: str, keep: tuple[str, ...] = ()) -> str:
    """Per-GPU value from dcgm series ``inner``, with the target's join labels."""
    dcgm_join = ctx.cfg.dcgm.target_labels
    rest = [label for label in ctx.join if label not in dcgm_join]
    grouped = f"max {by((*dcgm_join, *GPU_LABELS, *keep))} ({_renamed(ctx, inner, gpu=True)})"
    return f"{grouped}\n* {on(dcgm_join)} group_left ({', '.join(rest)})\n{ctx.records.target_info}"


def held_down(ctx: RecordContext, per_gpu: str) -> str:
    """``per_gpu`` only for the GPUs with a clock event reason active: the throttling
    alert's evidence, one series per throttled GPU instead of one per GPU (filtered before
    any aggregation, so a healthy fleet costs one set lookup per GPU)."""
    return f"{per_gpu}\nand {on((*ctx.join, *GPU_LABELS))}\n{ctx.records.clock_events}"


def _xid_rules(ctx: RecordContext) -> str:
    """One series per GPU and Xid out of the last Xid of each GPU: the critical Xids by
    code, any other as ``xid="other"`` with its code in ``err_code``."""
    changed = ctx.records.dcgm_xid_changed
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


def _reason_rules(ctx: RecordContext) -> str:
    """One series per GPU and active clock event reason, out of the reasons bitmask."""
    reasons = ctx.cfg.names("InferenceGPUThrottled", "reasons")
    return "\nor\n".join(
        f"label_replace(floor({ctx.records.dcgm_clock_reasons} / {CLOCK_EVENT_BITS[name]}) "
        f'% 2 == 1, "reason", "{name}", "", "")'
        for name in reasons
    )


def dcgm_gpu_records(ctx: RecordContext) -> list[RecordingRule]:
    """GPU records from dcgm-exporter."""
    cfg, records, by_target = ctx.cfg, ctx.records, ctx.by_target
    rate = ctx.window("rate")
    pulse = ctx.window("pulsing")
    xid = ctx.window("xid")
    idle = num(100 * cfg.ratio(PULSING, "idle_sample_at_most"))
    busy = num(100 * cfg.ratio(PULSING, "busy_sample_above"))
    util = dcgm_series(ctx, "DCGM_FI_DEV_GPU_UTIL")
    dram_active = dcgm_series(ctx, "DCGM_FI_PROF_DRAM_ACTIVE")
    sm_active = dcgm_series(ctx, "DCGM_FI_PROF_SM_ACTIVE")
    used, free = dcgm_series(ctx, "DCGM_FI_DEV_FB_USED"), dcgm_series(ctx, "DCGM_FI_DEV_FB_FREE")
    last = dcgm_series(ctx, "DCGM_FI_DEV_XID_ERRORS")
    any_last = selector("DCGM_FI_DEV_XID_ERRORS", cfg.selectors.dcgm)
    # DCGM 3.3 renamed the field; accept either name.
    reasons_bitmask = dcgm_series(
        ctx, "", '__name__=~"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS|DCGM_FI_DEV_CLOCKS_EVENT_REASONS"'
    )
    temperature = dcgm_series(ctx, "DCGM_FI_DEV_GPU_TEMP")
    sm_clock_mhz = dcgm_series(ctx, "DCGM_FI_DEV_SM_CLOCK")
    return [
        RecordingRule(
            records.gpu_utilization,
            dcgm_per_target(ctx, f"avg_over_time({util}[{rate}]) / 100"),
            "mean GPU utilisation (0-1) over the pod's GPUs (DCGM_FI_DEV_GPU_UTIL, %)",
        ),
        RecordingRule(
            records.dcgm_idle_sample,
            dcgm_per_gpu(ctx, f"{util} <= bool {idle}"),
            f"1 when a GPU's latest utilisation reading is at or below {idle} %",
        ),
        RecordingRule(
            records.dcgm_busy_sample,
            dcgm_per_gpu(ctx, f"{util} > bool {busy}"),
            f"1 when a GPU's latest utilisation reading is above {busy} %",
        ),
        RecordingRule(
            records.idle_samples,
            f"avg {by_target} (avg_over_time({records.dcgm_idle_sample}[{pulse}]))",
            f"share of utilisation readings at or below {idle} % (one per evaluation)",
        ),
        RecordingRule(
            records.busy_samples,
            f"avg {by_target} (avg_over_time({records.dcgm_busy_sample}[{pulse}]))",
            f"share of utilisation readings above {busy} % (one per evaluation)",
        ),
        RecordingRule(
            records.hbm_bandwidth,
            dcgm_per_target(ctx, f"avg_over_time({dram_active}[{rate}])"),
            "mean DRAM-interface activity (0-1) over the pod's GPUs "
            "(DCGM_FI_PROF_DRAM_ACTIVE, a profiling field)",
        ),
        RecordingRule(
            records.sm_active,
            dcgm_per_target(ctx, f"avg_over_time({sm_active}[{rate}])"),
            "mean share of time the SMs had a warp resident (0-1) over the pod's GPUs "
            "(DCGM_FI_PROF_SM_ACTIVE, a profiling field)",
        ),
        RecordingRule(
            records.memory_used,
            dcgm_per_gpu(ctx, f"{used} / ({used} + {free})"),
            "framebuffer used / (used + free) per GPU (DCGM_FI_DEV_FB_USED, _FB_FREE, MiB)",
        ),
        RecordingRule(
            records.dcgm_xid_changed,
            dcgm_per_gpu(
                ctx,
                f"({last} != 0)\nand\n(\nchanges({last}[{xid}]) > 0\nor\n"
                f"({last} unless {last} offset {xid})\nand on (UUID)\n"
                f"group by (UUID) ({any_last} offset {xid})\n)",
                keep=("err_code",),
            ),
            "the last Xid of a GPU (DCGM_FI_DEV_XID_ERRORS) where it changed, or appeared "
            "in the window while the GPU was already reported a window ago (before, every "
            "old Xid would look new)",
            window=0.0,
        ),
        RecordingRule(
            records.xid_new,
            _xid_rules(ctx),
            "1 per GPU and Xid with a new Xid in the window (DCGM keeps only the last "
            "Xid, so repeats of the same Xid are not counted)",
        ),
        RecordingRule(
            records.dcgm_clock_reasons,
            dcgm_per_gpu(ctx, reasons_bitmask),
            "clock event reason bitmask per GPU (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, "
            "formerly _CLOCK_THROTTLE_REASONS; not in dcgm-exporter's default counters)",
        ),
        RecordingRule(
            records.clock_events,
            _reason_rules(ctx),
            "1 per GPU and reason while a hardware or thermal clock event reason holds "
            "the clocks down",
        ),
        RecordingRule(
            records.temperature,
            held_down(ctx, dcgm_per_gpu(ctx, temperature)),
            "GPU die temperature of the GPUs whose clocks are held down (DCGM_FI_DEV_GPU_TEMP)",
        ),
        RecordingRule(
            records.sm_clock,
            held_down(ctx, dcgm_per_gpu(ctx, f"{sm_clock_mhz} * 1000000")),
            "current SM clock of the GPUs whose clocks are held down (DCGM_FI_DEV_SM_CLOCK, MHz)",
        ),
    ]
