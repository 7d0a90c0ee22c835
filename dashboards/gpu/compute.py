"""Row "SM and tensor activity": how much of the GPU the running kernels use (GPM)."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    AnyPanel,
    Query,
    Unit,
    gpu_gauge,
    gpu_legend,
    timeseries,
)

TITLE = "SM and tensor activity"


def sm() -> AnyPanel:
    return timeseries(
        "SM active and occupancy",
        "SM active: share of time at least one warp was resident on an SM, averaged over all "
        "SMs. Occupancy: resident warps as a share of the maximum. GPM metrics, Hopper and "
        "newer only (dcgm-exporter: its profiling fields). Bad: high GPU utilisation with low "
        "SM activity - small kernels or launch "
        "overhead keep the GPU 'busy' while most SMs idle (decode at small batch, no CUDA "
        "graphs).",
        [
            Query(
                gpu_gauge("inference_gpu_sm_active_ratio", "DCGM_FI_PROF_SM_ACTIVE"),
                f"SM active {gpu_legend()}",
            ),
            Query(
                gpu_gauge("inference_gpu_sm_occupancy_ratio", "DCGM_FI_PROF_SM_OCCUPANCY"),
                f"occupancy {gpu_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.RATIO,
        maximum=1.0,
    )


def tensor() -> AnyPanel:
    return timeseries(
        "Tensor core activity",
        "Share of time any tensor core pipe was active (GPM, Hopper and newer; dcgm-exporter's "
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE). Prefill is "
        "compute-bound and should drive it high; decode is memory-bound and leaves it low. "
        "Bad: low tensor activity during prefill-heavy load (the GPU waits for input, or "
        "the model runs in a precision without tensor-core kernels).",
        [
            Query(
                gpu_gauge("inference_gpu_tensor_active_ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                gpu_legend(),
            )
        ],
        unit=Unit.RATIO,
        maximum=1.0,
    )


def panels() -> Sequence[AnyPanel]:
    return [sm(), tensor()]
