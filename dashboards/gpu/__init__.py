"""Dashboard "GPU detail": every GPU signal the sidecar reads through NVML, per GPU."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.common import build_dashboard
from dashboards.gpu import clocks, compute, errors, memory, power, utilisation

UID = "ibe-gpu-detail"
FILENAME = "gpu-detail.json"


def dashboard() -> Dashboard:
    return build_dashboard(
        uid=UID,
        title="GPU detail",
        description=(
            "Per-GPU utilisation, SM and tensor activity, HBM bandwidth, memory, PCIe, power, "
            "clocks, clock events, temperature and Xid errors, as the inference sidecar reads "
            "them through NVML (GPM metrics on Hopper and newer)."
        ),
        variable_names=("gpu",),
        rows=(utilisation, compute, memory, power, clocks, errors),
    )
