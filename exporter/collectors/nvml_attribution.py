"""How the ``nvml`` collector chose the GPUs it reads, and its doubt where they are plainly not
all the engine's.

``inference_gpu_attribution_info{method}`` says which of these it is: ``visible-devices`` (the
UUIDs of ``NVIDIA_VISIBLE_DEVICES``), ``devices-flag`` (``--gpu.devices``), ``dra`` or
``whole-node`` (declared with ``--gpu.attribution``), ``replay``, or ``all-visible`` (every GPU
NVML shows: the engine's only when it holds them all). With ``all-visible``, a GPU where other
processes compute and none of the engine's do (per-process reads) is another workload's: the
collector says so once in the log and on the landing page, and the
``InferenceGPUAttributionUncertain`` alert reads the same series.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from exporter.collectors.nvml_state import GpuState

log = logging.getLogger("exporter.collectors.nvml")

ATTRIBUTION_CHOICES = ("auto", "dra", "whole-node")


def attribution_method(
    declared: str, *, replay: bool, devices_flag: bool, devices: Iterable[str]
) -> str:
    """The ``method`` label: ``declared`` (``--gpu.attribution``) unless ``auto``."""
    if replay:
        return "replay"
    if declared != "auto":
        return declared
    if devices_flag:
        return "devices-flag"
    return "visible-devices" if any(True for _ in devices) else "all-visible"


def foreign_gpus(states: Iterable[GpuState]) -> tuple[str, ...]:
    """GPUs where other processes compute and none of the engine's do (per-process reads)."""
    out = []
    for state in states:
        with state.lock:
            engine, other = state.engine_processes, state.other_processes
        if engine == 0 and other:
            out.append(state.identity.label)
    return tuple(out)


class AttributionWatch:
    """The method, and the GPUs doubted at the last scrape (said once per change)."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.foreign: tuple[str, ...] = ()

    def check(self, states: Iterable[GpuState]) -> None:
        foreign = foreign_gpus(states) if self.method == "all-visible" else ()
        if foreign and foreign != self.foreign:
            log.warning(
                "GPU %s: other processes compute there and none of the engine's; the exporter "
                "sees every GPU of the node (all-visible) and cannot tell the engine's: use the "
                "node agent (chart mode node), DRA, or --gpu.devices",
                ", ".join(foreign),
            )
        self.foreign = foreign

    def notices(self) -> list[str]:
        if not self.foreign:
            return []
        return [
            f"GPU {', '.join(self.foreign)} run other workloads' processes and none of the "
            "engine's: the GPUs read here (every GPU the container sees, all-visible) are not "
            "all the engine's, and GPU verdicts average them in. Use the node agent (chart "
            "mode node), DRA, or --gpu.devices."
        ]
