"""Row "PCIe and power": the host link, board power and energy."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    RANGE,
    RATE_INTERVAL,
    AnyPanel,
    Query,
    Select,
    Unit,
    gpu_gauge,
    gpu_legend,
    gpu_reading,
    stat_panel,
    timeseries,
)

TITLE = "PCIe and power"


def _energy(window: str, how: str) -> str:
    """The energy counter per GPU over ``window``: ``rate`` (watts) or ``increase`` (joules);
    dcgm-exporter counts millijoules."""

    def own(select: Select) -> str:
        return f"{how}({select('inference_gpu_energy_joules_total')}[{window}])"

    def exporter(select: Select) -> str:
        return f"{how}({select('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION')}[{window}]) / 1000"

    return gpu_reading(own, exporter)


def pcie() -> AnyPanel:
    return timeseries(
        "PCIe throughput",
        "Bytes per second over PCIe: host to device (weights, inputs, KV blocks swapped in) and "
        "device to host (outputs, KV blocks swapped out); dcgm-exporter's profiling counters. "
        "Bad: sustained host-to-device traffic "
        "while utilisation pulses - synchronous copies on the request path (non-pinned memory, "
        "KV swapping); a PCIe Gen5 x16 link tops out near 64 GB/s per direction.",
        [
            Query(
                gpu_gauge("inference_gpu_pcie_rx_bytes_per_second", "DCGM_FI_PROF_PCIE_RX_BYTES"),
                f"host→device {gpu_legend()}",
            ),
            Query(
                gpu_gauge("inference_gpu_pcie_tx_bytes_per_second", "DCGM_FI_PROF_PCIE_TX_BYTES"),
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
            Query(
                gpu_gauge("inference_gpu_power_watts", "DCGM_FI_DEV_POWER_USAGE"),
                f"now {gpu_legend()}",
            ),
            Query(_energy(RATE_INTERVAL, "rate"), f"mean {gpu_legend()}", dashed=True),
        ],
        unit=Unit.WATTS,
        span=8,
    )


def energy() -> AnyPanel:
    return stat_panel(
        "Energy in the time range",
        "Energy each GPU used over the dashboard's time range (Volta and newer). Divide by the "
        "tokens generated in the same range for joules per token. Bad: energy per token rising "
        "at constant load - the GPU burns power while waiting or throttling.",
        [Query(_energy(RANGE, "increase"), gpu_legend(), instant=True)],
        unit=Unit.JOULES,
        span=8,
        height=8,
        base="blue",
    )


def panels() -> Sequence[AnyPanel]:
    return [pcie(), power(), energy()]
