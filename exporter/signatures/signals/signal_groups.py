"""The rule groups the records are evaluated in.

Record groups by what their cost grows with: a target's engine gauges and counters, CPU and
history; the engine's and the probe's latency histograms (tens of buckets per target); the
per-GPU series, as rates over windows (utilisation, its samples, HBM) and as their state now
(framebuffer, Xids, clock events); the roofline, per target and model, from the GPUs'
peaks, the model's facts and the engine's counters; energy and cost per token, from the GPUs'
energy counters and the engine's token counters; the pools of disaggregated serving and a
gateway's pool. Each stays a small share of its interval at fleet scale (docs/scale.md), and
Prometheus evaluates them side by side.
"""

from __future__ import annotations

TARGET_GROUP = "inference.records"
LATENCY_GROUP = "inference.records.latency"
GPU_GROUP = "inference.records.gpu"
GPU_STATE_GROUP = "inference.records.gpu_state"
ROOFLINE_GROUP = "inference.records.roofline"
# Energy and cost per token, per target and model: the pod's power and cost (GPU records) over
# the engine's token counters (the pools' figures are in the pool group).
ENERGY_GROUP = "inference.records.energy"
# Pools of disaggregated serving: per pool and model, across the pool's targets.
POOL_GROUP = "inference.records.pool"
# A gateway's pool (llm-d's endpoint picker): per pool and model, from the per-target records
# of the GPU groups.
GATEWAY_GROUP = "inference.records.gateway"
# The order of the groups in the rule files: a record reads records above it in its group or
# in an earlier group.
RECORD_GROUPS = (
    TARGET_GROUP,
    LATENCY_GROUP,
    GPU_GROUP,
    GPU_STATE_GROUP,
    ROOFLINE_GROUP,
    ENERGY_GROUP,
    POOL_GROUP,
    GATEWAY_GROUP,
)
