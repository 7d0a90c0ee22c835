"""GPU records from the sidecar's NVML collector (the ``sidecar`` and ``fast`` profiles):
utilisation and its driver samples, HBM and SM activity, framebuffer, Xids, clock events."""

from __future__ import annotations

from exporter.metrics import GPU_LABELS
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import by, num, on, regex_alternatives
from exporter.signatures.records.record_context import RecordContext

SAMPLES = "inference_gpu_utilization_samples"


def nvml_gpu_records(ctx: RecordContext) -> list[RecordingRule]:
    """GPU records from the sidecar's NVML collector."""
    cfg, records, by_target, by_gpu = ctx.cfg, ctx.records, ctx.by_target, ctx.by_gpu
    rate = ctx.window("rate")
    pulse = ctx.window("pulsing")
    xid = ctx.window("xid")
    idle = num(cfg.ratio("InferenceGPUUtilizationPulsing", "idle_sample_at_most"))
    busy = num(cfg.ratio("InferenceGPUUtilizationPulsing", "busy_sample_above"))
    reasons = regex_alternatives(cfg.names("InferenceGPUThrottled", "reasons"))
    busy_seconds = ctx.sidecar_series("inference_gpu_busy_seconds_total")
    sample_count = ctx.sidecar_series(f"{SAMPLES}_count")
    idle_bucket = ctx.sidecar_series(f"{SAMPLES}_bucket", f'le="{idle}"')
    busy_bucket = ctx.sidecar_series(f"{SAMPLES}_bucket", f'le="{busy}"')
    dram_active = ctx.sidecar_series("inference_gpu_dram_active_seconds_total")
    sm_active = ctx.sidecar_series("inference_gpu_sm_active_ratio")
    memory_used = ctx.sidecar_series("inference_gpu_memory_used_bytes")
    memory_total = ctx.sidecar_series("inference_gpu_memory_total_bytes")
    throttled = ctx.sidecar_series("inference_gpu_clock_event_active", f'reason=~"{reasons}"')
    xids = ctx.sidecar_series("inference_gpu_xid_errors_total")
    by_xid = by((*ctx.join, *GPU_LABELS, "xid"))
    by_reason = by((*ctx.join, *GPU_LABELS, "reason"))
    xid_history = ctx.history_record(cfg.window_seconds("xid"))
    return [
        RecordingRule(
            records.gpu_utilization,
            f"avg {by_target} (rate({busy_seconds}[{rate}]))",
            "mean GPU utilisation (0-1) over the target's GPUs, from every driver sample",
        ),
        RecordingRule(
            records.utilization_samples,
            f"sum {by_target} (increase({sample_count}[{pulse}]))",
            "driver utilisation samples in the window, the two shares' denominator",
        ),
        RecordingRule(
            records.idle_samples,
            f"sum {by_target} (increase({idle_bucket}[{pulse}]))\n/\n{records.utilization_samples}",
            f"share of driver utilisation samples at or below {idle}",
        ),
        RecordingRule(
            records.busy_samples,
            f"1 - (\nsum {by_target} (increase({busy_bucket}[{pulse}]))\n/\n"
            f"{records.utilization_samples}\n)",
            f"share of driver utilisation samples above {busy}",
        ),
        RecordingRule(
            records.hbm_bandwidth,
            f"avg {by_target} (rate({dram_active}[{rate}]))",
            "mean HBM bandwidth utilisation (0-1) over the target's GPUs (GPM, Hopper+)",
        ),
        RecordingRule(
            records.sm_active,
            f"avg {by_target} (avg_over_time({sm_active}[{rate}]))",
            "mean share of time the SMs had a warp resident (0-1) over the target's GPUs "
            "(GPM, Hopper+)",
        ),
        RecordingRule(
            records.memory_used,
            f"max {by_gpu} (\n{memory_used}\n/\n{memory_total}\n)",
            "framebuffer used / total per GPU",
        ),
        RecordingRule(
            records.xid_new,
            f"sum {by_xid} (increase({xids}[{xid}]) > 0 and {xids} offset {xid})\n"
            f"or\n(\n"
            f"sum {by_xid} ({xids} unless {xids} offset {xid})\n"
            f"and {on(ctx.join)}\n{xid_history}\n)",
            "Xid errors in the window per GPU and Xid: the increase of a counter that "
            "existed a window ago; a counter that appeared within the window counts whole "
            "(its first increment is invisible to Prometheus' increase()), once the target "
            "has a window of history (before, every old counter would look new). "
            "MetricsQL's increase() counts a counter that starts with a small value whole "
            "by itself; the offset keeps both engines to the same rule",
            window=0.0,
        ),
        RecordingRule(
            records.clock_events,
            f"max {by_reason} ({throttled} > 0)",
            "1 per GPU and reason while a hardware or thermal clock event reason holds "
            "the clocks down; absent otherwise (a fleet writes what is throttled, not a "
            "zero per GPU and reason)",
        ),
    ]
