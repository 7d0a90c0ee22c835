"""Dashboard "Inference bottlenecks": the one on-call opens first.

Top to bottom: which signature families fire, the service-level objectives with the scaling
advice and its cause, what the GPU is waiting for, where a request's time goes, how far the
pod is from its hardware limit (and its interconnect), what each token costs, how its prefill
and decode pools fare, and whether the GPU's utilisation pulses.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.bottlenecks import (
    distribution,
    energy,
    latency,
    pools,
    roofline,
    signatures,
    slo,
    waiting,
)
from dashboards.common import build_dashboard, signature_annotation

UID = "ibe-inference-bottlenecks"
FILENAME = "inference-bottlenecks.json"


def dashboard() -> Dashboard:
    return build_dashboard(
        uid=UID,
        title="Inference bottlenecks",
        description=(
            "What a GPU LLM inference server is waiting for: signature alerts, the error budgets "
            "of the service-level objectives with the scaling advice and its cause, the GPU beside "
            "its feeders (queue, tokenizer, softirq, front-end thread, HBM, memory headroom), "
            "the latency of one request by stage, the distance to the hardware's roofline, what "
            "each token costs in energy and money, the prefill and decode pools of disaggregated "
            "serving, and "
            "the distribution of GPU utilisation."
        ),
        variable_names=("model", "gpu"),
        rows=(signatures, slo, waiting, latency, roofline, energy, pools, distribution),
        annotations=(signature_annotation(),),
    )
