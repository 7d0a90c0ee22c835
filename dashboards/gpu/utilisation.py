"""Row "Utilisation": which GPUs these are, and how busy each one is."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    GPU,
    AnyPanel,
    Query,
    Select,
    Unit,
    by,
    column_labels,
    gpu_legend,
    gpu_reading,
    signal,
    table_panel,
    target_labels,
    timeseries,
)
from exporter.signatures.signals.shared_gpu_signals import (
    GPU_DEVICE_UTILIZATION,
    GPU_ENGINE_SHARE,
)

TITLE = "Utilisation"

IDENTITY = ("gpu", "uuid", "name", "driver_version", "pci_bus_id", "mig_mode")


def identity() -> AnyPanel:
    """One row per GPU: its identity, its MIG mode and the node's driver, three info series
    (each within the label budget) joined on the target and the GPU; dcgm-exporter's labels
    where it reads the GPUs."""

    def nvml(select: Select) -> str:
        target = ", ".join(target_labels())
        return (
            f"{select('inference_gpu_info')}\n"
            f"* on ({target}, gpu, uuid) group_left (mig_mode)\n"
            f"{select('inference_gpu_mig_mode_info')}\n"
            f"* on ({target}) group_left (driver_version)\n"
            f"{select('inference_nvml_driver_info', per_gpu=False)}"
        )

    def dcgm(select: Select) -> str:
        util = select("DCGM_FI_DEV_GPU_UTIL")
        named = f'label_replace({util}, "name", "$1", "modelName", "(.*)")'
        return f'label_replace({named}, "driver_version", "$1", "DCGM_FI_DRIVER_VERSION", "(.*)")'

    columns = (*column_labels(), *IDENTITY)
    return table_panel(
        "GPUs",
        "Each GPU of the pod: index, UUID, model, driver, PCI bus id and MIG mode, as its "
        "source reads it (the sidecar's NVML, the node agent's, dcgm-exporter's labels). "
        "Bad: a GPU missing here that the engine uses (the sidecar does not get the same GPUs "
        "as the engine), or mixed driver versions across pods of one deployment.",
        [Query(gpu_reading(nvml, dcgm, keep=IDENTITY), instant=True, format="table")],
        columns=columns,
        height=5,
    )


def utilisation() -> AnyPanel:
    return timeseries(
        "GPU utilisation per GPU: the device and the engine's own share",
        "Share of time a kernel ran on each GPU of the pod, every tenant's work together (the "
        "device's utilisation, solid), and the engine's own share of a GPU other tenants' "
        "processes share (dashed; absent on a GPU the engine has to itself): the rule pack's "
        "per-GPU signals, means over its window. It says a kernel was running, not how much of "
        "the GPU it used (see SM activity). The utilisation alerts read the engine's own share "
        "averaged over the pod's GPUs (the bottlenecks dashboard). Bad: a GPU near 0 while "
        "requests run, or a wide gap between device and engine (other tenants take the GPU).",
        [
            Query(by("max", signal(GPU_DEVICE_UTILIZATION, GPU), "gpu"), f"device {gpu_legend()}"),
            Query(
                by("max", signal(GPU_ENGINE_SHARE, GPU), "gpu"),
                f"engine's own {gpu_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
        span=24,
    )


def panels() -> Sequence[AnyPanel]:
    return [identity(), utilisation()]
