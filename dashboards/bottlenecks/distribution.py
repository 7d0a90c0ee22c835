"""Row "GPU utilisation distribution": the driver's utilisation samples, not their mean.

A mean of 50 % can be a GPU half busy all the time or a GPU that alternates between idle and
saturated; only the second one is waiting for its feeder. Every driver sample is counted once
in ``inference_gpu_utilization_samples``, so its buckets show which one it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    RANGE,
    RATE_INTERVAL,
    AnyPanel,
    Query,
    Select,
    Unit,
    alert_threshold,
    bar_gauge,
    gpu_reading,
    heatmap_panel,
    le,
    pct,
    signal,
    target_legend,
    timeseries,
    warn,
)
from exporter.signatures.signals.gpu_signals import BUSY_SAMPLES, IDLE_SAMPLES

TITLE = "GPU utilisation distribution"

PULSING = "InferenceGPUUtilizationPulsing"
SAMPLES = "inference_gpu_utilization_samples"


def _buckets(window: str, *matchers: str) -> str:
    """The driver samples of each GPU in ``window`` per bucket, from the NVML collector (the
    sidecar's, or the node agent's given to the pod holding the GPU)."""

    def increase(select: Select) -> str:
        return f"increase({select(SAMPLES + '_bucket', *matchers)}[{window}])"

    return gpu_reading(increase, keep=("le",))


def heatmap() -> AnyPanel:
    return heatmap_panel(
        "Driver utilisation samples over time",
        "How many driver utilisation samples fell in each utilisation band over time, for the "
        "selected GPUs. Healthy: one band, high and steady. Bad: two bands, one at 0-5 % and "
        "one at 90-100 % - the GPU pulses between idle and saturated because it is fed in "
        "bursts (synchronous host-to-device copies, CPU-side batch assembly). dcgm-exporter "
        "keeps no driver samples: empty in the dcgm layout.",
        [Query(f"sum by (le) (\n{_buckets(RATE_INTERVAL)}\n)", "{{le}}", format="heatmap")],
        y_unit=Unit.RATIO,
        span=12,
    )


def idle_and_saturated() -> AnyPanel:
    idle_at = le(alert_threshold(PULSING, "idle_sample_at_most"))
    busy_at = le(alert_threshold(PULSING, "busy_sample_above"))
    idle_share = alert_threshold(PULSING, "idle_share_above")
    busy_share = alert_threshold(PULSING, "busy_share_above")
    return timeseries(
        "Idle and saturated samples",
        f"Share of driver samples at most {idle_at} (idle) and above {busy_at} (saturated) "
        "over the rule pack's window (dcgm-exporter: of its readings): what "
        f"InferenceGPUUtilizationPulsing reads. Bad: more than {pct(idle_share)} idle together "
        f"with more than {pct(busy_share)} saturated while requests run - utilisation pulses; "
        "the mean hides it.",
        [
            Query(signal(IDLE_SAMPLES), f"idle {target_legend()}", thresholds=(warn(idle_share),)),
            Query(
                signal(BUSY_SAMPLES),
                f"saturated {target_legend()}",
                thresholds=(warn(busy_share),),
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        span=6,
    )


def cumulative() -> AnyPanel:
    finite, every = _buckets(RANGE, 'le!="+Inf"'), _buckets(RANGE, 'le="+Inf"')
    buckets = f"sum by (le) (\n{finite}\n)"
    total = f"sum(\n{every}\n)"
    return bar_gauge(
        "Samples at or below each level (time range)",
        "Share of the driver samples in the dashboard's time range at or below each utilisation "
        "level (a cumulative distribution). Healthy: small bars up to the top levels. Bad: a "
        "tall first bar (many idle samples) that stays flat until a jump at the last levels - "
        "the GPU is either idle or saturated. dcgm-exporter keeps no driver samples: empty in "
        "the dcgm layout.",
        [Query(f"{buckets}\n/ ignoring (le) group_left\n{total}", "≤ {{le}}", instant=True)],
        unit=Unit.RATIO,
        maximum=1.0,
        span=6,
    )


def panels() -> Sequence[AnyPanel]:
    return [heatmap(), idle_and_saturated(), cumulative()]
