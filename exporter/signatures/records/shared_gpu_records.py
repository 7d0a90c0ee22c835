"""The engine's own share of GPUs it shares with other tenants (time-slicing, MPS).

A GPU counts as shared while other processes hold a compute context on it; the sidecar's NVML
collector tells them apart, and so does the node agent with hostPID (its processes mapped to
pods by cgroup). dcgm-exporter does not, so in the dcgm profile no GPU counts as shared and the
target's own utilisation is the GPUs'.
"""

from __future__ import annotations

from exporter.metrics import GPU_LABELS
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import on
from exporter.signatures.records.dcgm_records import dcgm_per_gpu, dcgm_series
from exporter.signatures.records.node_records import node_shares
from exporter.signatures.records.record_context import RecordContext


def shared_gpu_records(ctx: RecordContext) -> list[RecordingRule]:
    """Each GPU's utilisation, the engine's and the other tenants' shares of it, and the
    target's own utilisation over its GPUs."""
    records = ctx.records
    on_gpu = on((*ctx.join, *GPU_LABELS))
    if ctx.from_dcgm:
        device, engine_share, own = _dcgm_shares(ctx)
    elif ctx.from_node:
        device, engine_share, own = node_shares(ctx)
    else:
        device, engine_share, own = _nvml_shares(ctx)
    others_share = RecordingRule(
        records.gpu_other_tenants,
        f"clamp(\n{records.gpu_device_utilization}\n- {on_gpu}\n"
        f"{records.gpu_engine_share},\n0, 1\n)",
        "other tenants' mean share (0-1) of each shared GPU: its utilisation less the engine's",
    )
    return [device, engine_share, others_share, own]


def _dcgm_shares(ctx: RecordContext) -> tuple[RecordingRule, RecordingRule, RecordingRule]:
    """Each GPU's utilisation from dcgm-exporter; no engine share; the target's own
    utilisation is its GPUs'."""
    records = ctx.records
    util = dcgm_series(ctx, "DCGM_FI_DEV_GPU_UTIL")
    device = RecordingRule(
        records.gpu_device_utilization,
        dcgm_per_gpu(ctx, f"avg_over_time({util}[{ctx.window('rate')}]) / 100"),
        "mean utilisation (0-1) of each GPU (DCGM_FI_DEV_GPU_UTIL, %)",
    )
    engine_share = RecordingRule(
        records.gpu_engine_share,
        f"{records.gpu_device_utilization} unless {records.gpu_device_utilization}",
        "none: dcgm-exporter does not tell the engine's processes from other tenants'",
    )
    own = RecordingRule(
        records.gpu_own_utilization,
        records.gpu_utilization,
        "mean GPU utilisation (0-1) over the target's GPUs (no per-process shares here)",
    )
    return device, engine_share, own


def _nvml_shares(ctx: RecordContext) -> tuple[RecordingRule, RecordingRule, RecordingRule]:
    """Each GPU's utilisation, the engine's share where other tenants' processes are on it,
    and the target's own utilisation counting only that share, from the NVML collector."""
    records, by_gpu = ctx.records, ctx.by_gpu
    rate = ctx.window("rate")
    on_gpu = on((*ctx.join, *GPU_LABELS))
    engine = ctx.sidecar_series("inference_gpu_engine_utilization_ratio")
    others = ctx.sidecar_series("inference_gpu_processes", 'owner="other"')
    busy = ctx.sidecar_series("inference_gpu_busy_seconds_total")
    device = RecordingRule(
        records.gpu_device_utilization,
        f"max {by_gpu} (rate({busy}[{rate}]))",
        "mean utilisation (0-1) of each GPU, every tenant's work together",
    )
    engine_share = RecordingRule(
        records.gpu_engine_share,
        f"max {by_gpu} (avg_over_time({engine}[{rate}]))\n"
        f"and {on_gpu}\n"
        f"(max {by_gpu} (max_over_time({others}[{rate}])) > 0)",
        "the engine's own mean share (0-1) of each GPU that other tenants' processes "
        "share; absent on a GPU the engine has to itself",
    )
    own = RecordingRule(
        records.gpu_own_utilization,
        f"avg {ctx.by_target} (\n{records.gpu_engine_share}\nor\n"
        f"{records.gpu_device_utilization}\n)",
        "mean GPU utilisation (0-1) over the target's GPUs, counting only the "
        "engine's own share of a GPU shared with other tenants",
    )
    return device, engine_share, own
