"""The pods a serving stack's operator makes of its custom resources, as the admission webhook
sees them."""

from __future__ import annotations

from typing import Any

from exporter.inject.patch import ANNOTATION_INJECT
from exporter.inject.places import LWS_WORKER_INDEX, Place, get

SIDECAR = "inference-bottleneck-exporter"


def operator_pod(doc: dict[str, Any], place: Place, *, opt_in: bool = True) -> dict[str, Any]:
    """The pod the stack's operator makes of a place (its engine containers, its labels), as the
    webhook would see it at admission (``opt_in``: annotated to opt in, whatever the
    resource says)."""
    spec = {
        k: v
        for k, v in (get(doc, place.spec) or {}).items()
        if k
        in ("containers", "initContainers", "shareProcessNamespace", "securityContext", "volumes")
    }
    # Operators name the containers they make (Dynamo's main container is "main").
    engines = [{"name": "main", **c} for c in place.engines(doc)]
    spec["containers"] = [c for c in engines if c["name"] != SIDECAR]
    labels = dict(get(doc, place.labels) or {}) if place.labels else {}
    annotations = dict(get(doc, place.annotations) or {}) if place.annotations else {}
    if opt_in:
        annotations[ANNOTATION_INJECT] = "true"
    if place.declared_port:  # a worker of a LeaderWorkerSet group, as LWS labels it
        labels[LWS_WORKER_INDEX] = "1"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "engine-0",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }
