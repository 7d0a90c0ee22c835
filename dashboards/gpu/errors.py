"""Row "Errors": GPUs that stopped answering and Xid errors."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    GPU,
    UP_DOWN,
    AnyPanel,
    Query,
    Unit,
    alert_ints,
    by,
    gpu_gauge,
    gpu_legend,
    signal,
    state_timeline,
    timeseries,
)
from exporter.signatures.signals.gpu_signals import XID_NEW

TITLE = "Errors"


def gpu_up() -> AnyPanel:
    return state_timeline(
        "GPU answering NVML",
        "Whether each GPU's last NVML read succeeded in time. Bad: down - the GPU errors or "
        "hangs (Xid 79, fallen off the bus, is the usual cause) and requests on it stall or "
        "fail (the InferenceGPULost alert). dcgm-exporter has no such reading: empty in the "
        "dcgm layout.",
        [Query(gpu_gauge("inference_gpu_up"), gpu_legend())],
        mappings=UP_DOWN,
    )


def xid() -> AnyPanel:
    critical = ", ".join(str(code) for code in alert_ints("InferenceGPUXidErrors", "critical_xids"))
    return timeseries(
        "Xid errors",
        "New Xid errors per GPU and Xid code within the rule pack's window, what "
        "InferenceGPUXidErrors reads (dcgm-exporter keeps only the last Xid of a GPU); no data "
        f"means none. Bad: any of {critical} (the GPU's state cannot be trusted "
        "until it is reset: ECC errors, fallen off the bus) - drain the node; repeated "
        "13/31/43 on one GPU point at the application or the hardware.",
        [
            Query(
                by("max", signal(XID_NEW, GPU), "gpu", "xid"),
                "Xid {{xid}} " + gpu_legend(),
            )
        ],
        unit=Unit.COUNT,
        bars=True,
    )


def panels() -> Sequence[AnyPanel]:
    return [gpu_up(), xid()]
