"""Row "NVML": is the GPU library there, and what the sidecar costs the GPU it watches."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    RATE_INTERVAL,
    UP_DOWN,
    AnyPanel,
    Query,
    Select,
    Unit,
    by,
    gpu_gauge,
    gpu_legend,
    gpu_reading,
    series,
    state_timeline,
    target_labels,
    target_legend,
    timeseries,
    warn,
)

TITLE = "NVML"

# docs/nvml.md: the sidecar keeps under 5 NVML calls per GPU per second at its defaults.
CALL_BUDGET = 5.0


def nvml_up() -> AnyPanel:
    return state_timeline(
        "NVML and GPUs answering",
        "Whether NVML initialised in the sidecar, and whether each GPU's last read succeeded. "
        "Bad: NVML down - the driver library is not visible in the container (NVIDIA runtime, "
        "device plugin), so every GPU signal is missing (InferenceNVMLUnavailable); one GPU "
        "down - that GPU errors or hangs (InferenceGPULost).",
        [
            Query(by("min", series("inference_nvml_up")), "NVML " + target_legend()),
            Query(gpu_gauge("inference_gpu_up"), gpu_legend()),
        ],
        mappings=UP_DOWN,
    )


def calls() -> AnyPanel:
    def per_gpu(select: Select) -> str:
        # The call counter names the GPU by index only: its UUID from the GPU's info series.
        target = ", ".join(target_labels())
        return (
            f"rate({select('inference_nvml_calls_total')}[{RATE_INTERVAL}])\n"
            f"* on ({target}, gpu) group_left (uuid)\n"
            f"max by ({target}, gpu, uuid) ({select('inference_gpu_info')})"
        )

    return timeseries(
        "NVML calls per GPU per second",
        "Driver calls made per GPU of the pod by whoever reads it through NVML: the sidecar, or "
        "in the node layout the node agent. NVML calls take the driver's lock; polling "
        f"too fast can stall the engine's own calls. Bad: above {CALL_BUDGET:g}/s per GPU "
        "(about 3.3 at the default 3 s poll interval; a 0.5 s interval is for short "
        "investigations only). dcgm-exporter counts none: empty in the dcgm layout.",
        [Query(gpu_reading(per_gpu), gpu_legend())],
        unit=Unit.CALLS_PER_SECOND,
        thresholds=[warn(CALL_BUDGET)],
    )


def panels() -> Sequence[AnyPanel]:
    return [nvml_up(), calls()]
