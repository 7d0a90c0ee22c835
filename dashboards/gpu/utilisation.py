"""Row "Utilisation": which GPUs these are, and how busy each one is."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    GPU,
    AnyPanel,
    Query,
    Unit,
    alert_threshold,
    by,
    column_labels,
    gpu_legend,
    pct,
    rate,
    series,
    table_panel,
    target_labels,
    timeseries,
)

TITLE = "Utilisation"

IDENTITY = ("gpu", "uuid", "name", "driver_version", "pci_bus_id", "mig_mode")


def identity() -> AnyPanel:
    """One row per GPU: its identity, its MIG mode and the node's driver, three info series
    (each within the label budget) joined on the target and the GPU."""
    target = ", ".join(target_labels())
    joined = (
        f"{series('inference_gpu_info', GPU)}\n"
        f"* on ({target}, gpu, uuid) group_left (mig_mode)\n"
        f"{series('inference_gpu_mig_mode_info', GPU)}\n"
        f"* on ({target}) group_left (driver_version)\n"
        f"{series('inference_nvml_driver_info')}"
    )
    columns = (*column_labels(), *IDENTITY)
    return table_panel(
        "GPUs",
        "Each GPU the sidecar sees: index, UUID, model, driver, PCI bus id and MIG mode. "
        "Bad: a GPU missing here that the engine uses (the sidecar does not get the same GPUs "
        "as the engine), or mixed driver versions across pods of one deployment.",
        [Query(by("max", joined, *IDENTITY), instant=True, format="table")],
        columns=columns,
        height=5,
    )


def utilisation() -> AnyPanel:
    low = alert_threshold("InferenceGPUUnderutilized", "utilization_below")
    starved = alert_threshold("InferenceGPUStarvedQueueGrowing", "utilization_below")
    return timeseries(
        "GPU utilisation",
        "Share of time a kernel ran on each GPU: the exact mean of every driver sample over the "
        "interval (not one sample per scrape). It says a kernel was running, not how much of "
        "the GPU it used (see SM activity). Bad: below "
        f"{pct(low)} for long while requests run (the GPU waits most of the time), or below "
        f"{pct(starved)} with a growing queue (the CPU side starves it).",
        [Query(by("max", rate("inference_gpu_busy_seconds_total", GPU), "gpu"), gpu_legend())],
        unit=Unit.RATIO,
        maximum=1.0,
        thresholds=[(low, "red"), (starved, "orange")],
        span=24,
    )


def panels() -> Sequence[AnyPanel]:
    return [identity(), utilisation()]
