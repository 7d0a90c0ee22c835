"""Row "PCIe and power": the host link, board power and energy."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    GPU,
    RANGE,
    AnyPanel,
    Query,
    Unit,
    by,
    gpu_legend,
    over,
    rate,
    series,
    stat_panel,
    timeseries,
)

TITLE = "PCIe and power"


def pcie() -> AnyPanel:
    return timeseries(
        "PCIe throughput",
        "Bytes per second over PCIe: host to device (weights, inputs, KV blocks swapped in) and "
        "device to host (outputs, KV blocks swapped out). Bad: sustained host-to-device traffic "
        "while utilisation pulses - synchronous copies on the request path (non-pinned memory, "
        "KV swapping); a PCIe Gen5 x16 link tops out near 64 GB/s per direction.",
        [
            Query(
                series("inference_gpu_pcie_rx_bytes_per_second", GPU), f"host→device {gpu_legend()}"
            ),
            Query(
                series("inference_gpu_pcie_tx_bytes_per_second", GPU),
                f"device→host {gpu_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.BYTES_PER_SECOND,
        span=8,
    )


def power() -> AnyPanel:
    return timeseries(
        "Board power",
        "Power draw now (solid) and the mean power from the energy counter over the interval "
        "(dashed). Bad: power far below the board limit while requests run (the GPU waits), "
        "or pinned at the limit with clocks dropping (power capping, see clock events).",
        [
            Query(series("inference_gpu_power_watts", GPU), f"now {gpu_legend()}"),
            Query(
                by("max", rate("inference_gpu_energy_joules_total", GPU), "gpu"),
                f"mean {gpu_legend()}",
                dashed=True,
            ),
        ],
        unit=Unit.WATTS,
        span=8,
    )


def energy() -> AnyPanel:
    used = by(
        "max", f"increase({over('inference_gpu_energy_joules_total', GPU, window=RANGE)})", "gpu"
    )
    return stat_panel(
        "Energy in the time range",
        "Energy each GPU used over the dashboard's time range (Volta and newer). Divide by the "
        "tokens generated in the same range for joules per token. Bad: energy per token rising "
        "at constant load - the GPU burns power while waiting or throttling.",
        [Query(used, gpu_legend(), instant=True)],
        unit=Unit.JOULES,
        span=8,
        height=8,
        base="blue",
    )


def panels() -> Sequence[AnyPanel]:
    return [pcie(), power(), energy()]
