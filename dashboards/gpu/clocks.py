"""Row "Clocks and thermals": clocks, temperature and why the clocks are held down."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    OFF_ACTIVE,
    AnyPanel,
    Query,
    Unit,
    alert_names,
    gpu_gauge,
    gpu_legend,
    gpu_reading,
    state_timeline,
    target_legend,
    timeseries,
)

TITLE = "Clocks and thermals"

THROTTLED = "InferenceGPUThrottled"
EVENTS = "inference_gpu_clock_event_active"
MHZ = " * 1000000"


def clocks() -> AnyPanel:
    return timeseries(
        "SM and memory clocks",
        "Current SM clock (solid) and memory clock (dashed). Bad: the SM clock dropping under "
        "load while a hardware, thermal or power reason is active (see clock events) - every "
        "kernel runs slower. Low clocks while idle are normal.",
        [
            Query(
                gpu_gauge("inference_gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK", MHZ),
                f"SM {gpu_legend()}",
            ),
            Query(
                gpu_gauge("inference_gpu_memory_clock_hertz", "DCGM_FI_DEV_MEM_CLOCK", MHZ),
                f"memory {gpu_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.HERTZ,
    )


def temperature() -> AnyPanel:
    return timeseries(
        "Temperature",
        "GPU die temperature. Bad: approaching the GPU's slowdown temperature (about 85-90 °C "
        "on data-centre GPUs), after which the driver lowers the clocks (sw_thermal, "
        "hw_thermal); check cooling and airflow.",
        [
            Query(
                gpu_gauge("inference_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP"),
                gpu_legend(),
            )
        ],
        unit=Unit.CELSIUS,
        thresholds=[(85.0, "red")],
        minimum=None,
    )


def clock_events() -> AnyPanel:
    reasons = ", ".join(alert_names(THROTTLED, "reasons"))
    return state_timeline(
        "Clock events (throttle reasons)",
        "Which clock event reasons are active per GPU over time. gpu_idle, "
        "applications_clocks_setting and sync_boost are normal. Bad: "
        f"{reasons} held for minutes - the hardware slows every kernel down until cooling or "
        "power delivery is fixed (the InferenceGPUThrottled alert); power_cap under load "
        "means the board limit, not the work, sets the speed. dcgm-exporter's default counters "
        "have no clock event reasons: empty in the dcgm layout.",
        [
            Query(
                gpu_reading(lambda select: select(EVENTS), keep=("reason",)),
                "GPU {{gpu}} {{reason}} " + target_legend(short=True),
            )
        ],
        mappings=OFF_ACTIVE,
        span=24,
        height=10,
    )


def panels() -> Sequence[AnyPanel]:
    return [clocks(), temperature(), clock_events()]
