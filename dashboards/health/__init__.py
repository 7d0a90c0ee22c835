"""Dashboard "Exporter health": is the sidecar itself seeing what it should, at what cost."""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.common import build_dashboard
from dashboards.health import collectors, engine, nvml, targets

UID = "ibe-exporter-health"
FILENAME = "exporter-health.json"


def dashboard() -> Dashboard:
    return build_dashboard(
        uid=UID,
        title="Exporter health",
        description=(
            "The inference-bottleneck-exporter sidecar itself: scrape targets, collector "
            "success and duration, the engine poll and tokenizer probe, NVML, and the "
            "sidecar's own memory and CPU. A signature that cannot see its inputs stays silent; "
            "this dashboard shows where."
        ),
        variable_names=("gpu",),
        rows=(targets, collectors, engine, nvml),
    )
