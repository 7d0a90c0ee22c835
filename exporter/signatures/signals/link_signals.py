"""The links between a pod's GPUs: how many GPUs the pod holds, and how close their NVLink
links run to their peak.

In a tensor-parallel (or expert-parallel) model every layer ends in an all-reduce (or
all-to-all) over the links; where it does not overlap compute, the GPUs wait for their peers.
The bytes a GPU moves over its links per second, over the links' peak, is the share of time the
links would be busy at their peak rate: a lower bound on the share of each step spent
communicating (``docs/roofline.md``). A GPU without NVLink (PCIe only) has no such series, so
the signal is absent there.

Each layout reads them from its own source: ``sidecar`` from the sidecar's NVML collector
(GPM's NVLink rates on Hopper and later, the driver's throughput counters before), ``node``
from the node agent by pod (:mod:`.node_join`), ``dcgm`` from dcgm-exporter's profiling fields
``DCGM_FI_PROF_NVLINK_TX_BYTES`` and ``_RX_BYTES`` (bytes per second; dcgm-exporter collects
them only when its counters file lists them) over the sidecar's own peak where its nvml
collector runs, else the product table's (:data:`exporter.hardware.gpus.PRODUCTS`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.promql_text import on
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_target
from exporter.signatures.signals.node_join import node_per_target
from exporter.signatures.signals.roofline_signals import product_peak
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_groups import GPU_GROUP, GPU_STATE_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

_TRANSMIT = "inference_gpu_nvlink_transmit_bytes_total"
_RECEIVE = "inference_gpu_nvlink_receive_bytes_total"
_PEAK = "inference_gpu_nvlink_peak_bytes_per_second"


# --- the GPUs a pod holds ---------------------------------------------------------------------


def _gpus_sidecar(ctx: SignalContext) -> str:
    return f"count {ctx.by_target} ({ctx.latest('inference_gpu_up')})"


def _gpus_node(ctx: SignalContext) -> str:
    return node_per_target(ctx, "count", ctx.latest("inference_gpu_up"))


def _gpus_dcgm(ctx: SignalContext) -> str:
    gpus = dcgm_quantity(ctx, dcgm_fields.UTILIZATION, ctx.last, scale=False)
    return dcgm_per_target(ctx, gpus, "count")


#: The GPUs (MIG devices counted as GPUs) the target's engine runs on: a tensor-parallel pod's
#: degree, and the number an interconnect verdict needs to be more than one.
GPUS = Signal(
    "inference:gpus:count",
    "count",
    GPU_STATE_GROUP,
    ByLayout(
        sidecar=Rule(_gpus_sidecar, "GPUs the target's sidecar reads", window=0.0),
        node=Rule(_gpus_node, "GPUs the target's pod holds (the node agent's, by pod)", window=0.0),
        dcgm=Rule(
            _gpus_dcgm,
            "GPUs dcgm-exporter attributes to the target's pod (its utilisation series)",
            window=0.0,
        ),
    ),
    "GPUs",
)


# --- NVLink against its peak ------------------------------------------------------------------


def busier(transmit: str, receive: str) -> str:
    """Per GPU, the larger of two per-direction rates (the all-reduce of tensor parallelism is
    symmetric; a pipeline or an all-to-all need not be, and the busier direction saturates
    first)."""
    return (
        "max without (direction) (\n"
        f'label_replace({transmit}, "direction", "transmit", "", "")\nor\n'
        f'label_replace({receive}, "direction", "receive", "", "")\n)'
    )


def _per_gpu(ctx: SignalContext) -> str:
    """Each GPU's busier direction over its links' peak (a GPU whose links are all down has
    a peak of 0 and no value)."""
    rate = ctx.window("rate")
    moved = busier(
        f"rate({ctx.sidecar_series(_TRANSMIT)}[{rate}])",
        f"rate({ctx.sidecar_series(_RECEIVE)}[{rate}])",
    )
    return f"{moved}\n/\n({ctx.latest(_PEAK)} > 0)"


def _nvlink_dcgm(ctx: SignalContext) -> str:
    rate = ctx.window("rate")
    moved = busier(
        *(
            dcgm_quantity(ctx, quantity, lambda s: f"avg_over_time({s}[{rate}])")
            for quantity in (dcgm_fields.NVLINK_TX, dcgm_fields.NVLINK_RX)
        )
    )
    own = f"min {ctx.by_target} ({ctx.latest(_PEAK)} > 0)"
    peak = f"(\n{own}\nor\n{product_peak(ctx, lambda peaks: peaks.nvlink_bandwidth)}\n)"
    return f"{dcgm_per_target(ctx, moved)}\n/ {on(ctx.join)}\n{peak}"


#: Mean NVLink use of the target's GPUs against the links' peak (0-1): the share of time the
#: links would be busy at their peak rate, a lower bound on the share of a step communicating.
NVLINK_UTILIZATION = Signal(
    "inference:gpu_nvlink_bandwidth_utilization:mean{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: f"avg {ctx.by_target} (\n{_per_gpu(ctx)}\n)",
            "mean NVLink use (0-1) of the target's GPUs: bytes per second in each GPU's busier "
            "direction over its usable links' peak, the share of time the links would be busy "
            "at their peak rate; absent without NVLink",
        ),
        node=Rule(
            lambda ctx: node_per_target(ctx, "avg", _per_gpu(ctx)),
            "mean NVLink use (0-1) of the GPUs the target's pod holds (the node agent's): "
            "bytes per second in each GPU's busier direction over its usable links' peak; "
            "absent without NVLink",
        ),
        dcgm=Rule(
            _nvlink_dcgm,
            "mean NVLink use (0-1) of the pod's GPUs: DCGM_FI_PROF_NVLINK_TX_BYTES / _RX_BYTES "
            "(_BYTES_PER_SECOND from dcgm-exporter 4.10; bytes per second, the busier "
            "direction; profiling fields dcgm-exporter collects only when listed) over the "
            "sidecar's NVLink peak, else the product table's",
        ),
    ),
    "NVLink use",
)
