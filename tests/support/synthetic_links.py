"""Synthetic NVML traces of GPUs and their links: a tensor-parallel pod bound by its
interconnect and one that is not, a Grace-Blackwell GPU, a GPU without NVLink.

They stand in for recordings (``inference-bottleneck-exporter record``) until ones made on such
hardware exist, and say so in their header. Values are in NVML's units (the trace format:
:mod:`exporter.backends.replay`); the link figures are NVIDIA's published ones, written by hand,
not read from a device. Output is byte-for-byte deterministic for the same arguments.

**Tensor-parallel pod** (:func:`tp_trace_lines`): two H100 SXM on an HGX board (18 NVLink 4
links each, 26562 MBps each way per link, fabric registered) serving one model split across
both. ``bound=True``: the all-reduces do not overlap compute, so the GPUs spend most of each
step in NCCL kernels that wait on the links: the links run at about 90 % of their peak each way
while the SMs are about 8 % active (the device's utilisation stays high: a kernel is running,
NCCL's). ``bound=False``: the same pod with communication overlapped: links about 60 % busy, SMs
about 85 % active. Both carry each link's GPM rates, so ``--gpu.nvlink-per-link`` has them
(so does the GB200 trace).

**Grace-Blackwell** (:func:`gb200_trace_lines`): one GB200 GPU (NVLink 5, 18 links at 50000
MBps; ten C2C links to its Grace CPU at 40000 MBps each; driver 590) with power smoothing on at
a 600 W floor and the ``llm_inference`` workload power profile, serving for the first half of
the trace and idle for the second: the smoothing floor keeps its draw at 600 W while nothing
runs, which is where idle energy goes.

**PCIe only** (:func:`pcie_trace_lines`): one H100 PCIe without NVLink bridges: NVML counts 0
links, and there is no fabric; an administrator capped it at 300 W, below its 350 W default.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from exporter.backends.replay import TRACE_FORMAT, TRACE_VERSION
from support.synthetic import (
    HARDWARE_FACTS,
    HGX_FABRIC,
    HGX_FIELDS,
    MEM_CLOCK_MHZ,
    MIB,
    NVLINK_LINK_MBPS,
    NVLINK_LINKS,
    PRESTART_BUFFER_S,
    SM_CLOCK_MAX_MHZ,
)

GIB = 1024 * MIB
MEMORY_TOTAL = 80 * GIB
LINK_MIB_S = NVLINK_LINK_MBPS * 1e6 / MIB  # one link's peak each way, MiB/s
# Each look of a tensor-parallel GPU: (device utilisation %, SM active %, link share of peak,
# board power W).
TP_LOOKS = {True: (96.0, 8.0, 0.90, 390.0), False: (98.0, 85.0, 0.60, 640.0)}
GB200_LINKS = 18
GB200_LINK_MBPS = 50000
GB200_C2C_LINKS = 10
GB200_C2C_MBPS = 40000
GB200_SMOOTHING_FLOOR_W = 600.0
GB200_POWER_LIMIT_MW = 1_200_000
GB200_DRIVER = "590.48.01"
NVML_POWER_PROFILE_LLM_INFERENCE = 6


def _dumps(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def _noise(rng: random.Random, amplitude: float) -> float:
    return (rng.random() + rng.random() - 1.0) * amplitude


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _times(duration_s: float, interval_s: float) -> list[float]:
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a positive number, got {duration_s}")
    if not (math.isfinite(interval_s) and interval_s >= 1e-3):
        raise ValueError(f"record_interval_s must be at least 1 ms, got {interval_s}")
    return [round(k * interval_s, 6) for k in range(math.ceil(duration_s / interval_s - 1e-9))]


def _header(
    description: str,
    generator: dict[str, Any],
    duration_s: float,
    gpus: list[dict[str, Any]],
    driver: str = "550.54.15",
) -> dict[str, Any]:
    return {
        "kind": "header",
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "synthetic": True,
        "description": description,
        "generator": {"module": "support.synthetic_links", **generator},
        "driver_version": driver,
        "duration_s": float(duration_s),
        "gpus": gpus,
    }


class _Gpu:
    """One GPU's running state: its sample clock, energy and temperature."""

    def __init__(self, rng: random.Random, period_us: int, energy: int) -> None:
        self.rng = rng
        self.period_us = period_us
        phase = int(rng.random() * period_us)
        start = -round(PRESTART_BUFFER_S * 1e6)
        self.next_us = start + (phase - start) % period_us
        self.energy = energy
        self.temperature = 55.0

    def samples(self, now_us: int, level: float, amplitude: float) -> list[list[int]]:
        out = []
        while self.next_us <= now_us:
            value = round(_clamp(level + _noise(self.rng, amplitude), 0.0, 100.0))
            out.append([self.next_us, value if level > 0 else 0])
            self.next_us += self.period_us
        return out

    def power(self, watts: float, interval_s: float) -> dict[str, Any]:
        """Power, energy, temperature and clocks for a board drawing about ``watts``."""
        power = int(watts * 1000) + int(self.rng.random() * 1000)
        self.energy += round(power * interval_s)
        target = 33.0 + 0.06 * watts
        self.temperature += (target - self.temperature) * (1.0 - math.exp(-interval_s / 20.0))
        temp_c = round(_clamp(self.temperature + _noise(self.rng, 0.5), 30.0, 80.0))
        return {
            "power_mw": power,
            "energy_mj": self.energy,
            "temp_c": temp_c,
            "clocks_mhz": [SM_CLOCK_MAX_MHZ - 15 * max(0, temp_c - 67), MEM_CLOCK_MHZ],
            "clock_events": 0,
        }


def _nvlink_gpm(rng: random.Random, share: float, links: int, link_mib_s: float) -> dict[str, Any]:
    """Each link's receive and transmit rate at about ``share`` of its peak, and the totals."""
    gpm: dict[str, Any] = {}
    tx_total = rx_total = 0.0
    for link in range(links):
        tx = round(_clamp(share + _noise(rng, 0.02), 0.0, 1.0) * link_mib_s, 1)
        rx = round(_clamp(share + _noise(rng, 0.02), 0.0, 1.0) * link_mib_s, 1)
        gpm[f"nvlink_l{link}_tx_per_sec"], gpm[f"nvlink_l{link}_rx_per_sec"] = tx, rx
        tx_total, rx_total = tx_total + tx, rx_total + rx
    gpm["nvlink_tx_per_sec"], gpm["nvlink_rx_per_sec"] = round(tx_total, 1), round(rx_total, 1)
    return gpm


def tp_trace_lines(
    bound: bool = True,
    duration_s: float = 20.0,
    record_interval_s: float = 1.0,
    sample_period_s: float = 1 / 6,
    seed: int = 29,
) -> list[str]:
    """A two-GPU tensor-parallel pod on an HGX H100 board, header first (module docstring)."""
    times = _times(duration_s, record_interval_s)
    identity = random.Random(seed)
    util, sm, share, watts = TP_LOOKS[bound]
    what = (
        "bound by its interconnect: NVLink at ~90% of its peak each way, SMs ~8% active "
        "(the all-reduces do not overlap compute; NCCL kernels keep the device busy)"
        if bound
        else "not bound by its interconnect: NVLink ~60% busy, SMs ~85% active (communication "
        "overlapped with compute)"
    )
    gpus = [
        {
            "index": i,
            "uuid": _uuid(identity),
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": f"00000000:{0x18 + 0x12 * i:02X}:00.0",
            "mig_mode": 0,
            "gpm": True,
            "facts": HARDWARE_FACTS,
            "fields": HGX_FIELDS,
            "fabric": HGX_FABRIC,
        }
        for i in range(2)
    ]
    header = _header(
        "SYNTHETIC trace, not a recording: generated by support.synthetic_links, modelled on "
        f"two H100 SXM on an HGX board serving one model with tensor parallelism 2, {what}.",
        {"kind": "tp", "bound": bound, "seed": seed, "record_interval_s": record_interval_s},
        duration_s,
        gpus,
    )
    period_us = max(1, round(sample_period_s * 1e6))
    states = [
        _Gpu(random.Random(seed * 7001 + i), period_us, 400_000_000_000 + i * 1_000_000)
        for i in range(2)
    ]
    lines = [_dumps(header)]
    for t in times:
        now_us = round(t * 1e6)
        for i, gpu in enumerate(states):
            rng = gpu.rng
            sm_now = _clamp(sm + _noise(rng, 2.0), 0.0, 100.0)
            record = {
                "t": t,
                "gpu": i,
                "samples": gpu.samples(now_us, util, 3.0),
                "util": [round(util), round(_clamp(0.6 * sm_now + 5.0, 0.0, 100.0))],
                "memory": [int(0.9 * MEMORY_TOTAL), MEMORY_TOTAL],
                **gpu.power(watts + _noise(rng, 10.0), record_interval_s),
                "pcie_kibps": [30 * 1024, 60 * 1024],
                "gpm": {
                    "graphics_util": round(util, 1),
                    "sm_util": round(sm_now, 1),
                    "sm_occupancy": round(0.4 * sm_now, 1),
                    "any_tensor_util": round(0.55 * sm_now, 1),
                    "dram_bw_util": round(_clamp(5.0 + 0.6 * sm_now, 0.0, 100.0), 1),
                    "pcie_tx_per_sec": 30.0,
                    "pcie_rx_per_sec": 60.0,
                    **_nvlink_gpm(rng, share, NVLINK_LINKS, LINK_MIB_S),
                },
            }
            lines.append(_dumps(record))
    return lines


def gb200_trace_lines(
    duration_s: float = 20.0,
    record_interval_s: float = 1.0,
    sample_period_s: float = 1 / 6,
    seed: int = 31,
) -> list[str]:
    """One GB200 GPU, serving then idle at its power-smoothing floor (module docstring)."""
    times = _times(duration_s, record_interval_s)
    identity = random.Random(seed)
    gpu_entry = {
        "index": 0,
        "uuid": _uuid(identity),
        "name": "NVIDIA GB200",
        "pci_bus_id": "00000008:01:00.0",
        "mig_mode": 0,
        "gpm": True,
        "fields": {
            "nvlink_link_count": GB200_LINKS,
            "c2c_link_count": GB200_C2C_LINKS,
            "nvlink_state": [1] * GB200_LINKS,
            "nvlink_speed_mbps": [GB200_LINK_MBPS] * GB200_LINKS,
            "c2c_link_status": [1] * GB200_C2C_LINKS,
            "c2c_link_max_bw_mbps": [GB200_C2C_MBPS] * GB200_C2C_LINKS,
            "power_limit_mw": GB200_POWER_LIMIT_MW,
            "power_default_limit_mw": GB200_POWER_LIMIT_MW,
            "power_smoothing_enabled": 1,
            "power_smoothing_floor_w": GB200_SMOOTHING_FLOOR_W,
        },
        "fabric": {**HGX_FABRIC, "clique_id": 4, "health_summary": 1},
        "power_profiles": [NVML_POWER_PROFILE_LLM_INFERENCE],
    }
    header = _header(
        "SYNTHETIC trace, not a recording: generated by support.synthetic_links, modelled on "
        "one GB200 GPU (NVLink 5, C2C to its Grace CPU) with power smoothing on at a 600 W floor "
        "and the llm_inference workload power profile: serving for the first half of the "
        "trace, idle for the second, its draw held at the floor.",
        {"kind": "gb200", "seed": seed, "record_interval_s": record_interval_s},
        duration_s,
        [gpu_entry],
        driver=GB200_DRIVER,
    )
    gpu = _Gpu(random.Random(seed * 7001), max(1, round(sample_period_s * 1e6)), 90_000_000_000)
    rng = gpu.rng
    lines = [_dumps(header)]
    for t in times:
        serving = t < duration_s / 2
        util, sm = (80.0, 70.0) if serving else (0.0, 0.0)
        watts = 950.0 if serving else GB200_SMOOTHING_FLOOR_W
        link_mib_s = GB200_LINK_MBPS * 1e6 / MIB
        nvlink = _nvlink_gpm(rng, 0.3 if serving else 0.0, GB200_LINKS, link_mib_s)
        gpm = {
            "graphics_util": util,
            "sm_util": sm,
            "sm_occupancy": round(0.4 * sm, 1),
            "any_tensor_util": round(0.55 * sm, 1),
            "dram_bw_util": round(0.7 * sm, 1),
            "pcie_tx_per_sec": 20.0,
            "pcie_rx_per_sec": 40.0,
            **nvlink,
            # KV blocks to and from the Grace CPU's memory while serving.
            "c2c_tx_per_sec": 20000.0 if serving else 0.0,
            "c2c_rx_per_sec": 60000.0 if serving else 0.0,
        }
        record = {
            "t": t,
            "gpu": 0,
            "samples": gpu.samples(round(t * 1e6), util, 3.0),
            "util": [round(util), round(0.6 * sm)],
            "memory": [int(0.9 * 186 * GIB), 186 * GIB],
            **gpu.power(watts + (_noise(rng, 10.0) if serving else 0.0), record_interval_s),
            "gpm": gpm,
        }
        lines.append(_dumps(record))
    return lines


def pcie_trace_lines(
    duration_s: float = 10.0,
    record_interval_s: float = 1.0,
    sample_period_s: float = 1 / 6,
    seed: int = 37,
) -> list[str]:
    """One H100 PCIe without NVLink bridges (module docstring)."""
    times = _times(duration_s, record_interval_s)
    identity = random.Random(seed)
    gpu_entry = {
        "index": 0,
        "uuid": _uuid(identity),
        "name": "NVIDIA H100 PCIe",
        "pci_bus_id": "00000000:41:00.0",
        "mig_mode": 0,
        "gpm": True,
        # capped at 300 W below its 350 W default: a limit someone set
        "fields": {
            "nvlink_link_count": 0,
            "power_limit_mw": 300_000,
            "power_default_limit_mw": 350_000,
        },
    }
    header = _header(
        "SYNTHETIC trace, not a recording: generated by support.synthetic_links, modelled on "
        "one H100 PCIe without NVLink bridges (NVML counts 0 links; no fabric), capped at 300 W "
        "below its 350 W default limit.",
        {"kind": "pcie", "seed": seed, "record_interval_s": record_interval_s},
        duration_s,
        [gpu_entry],
    )
    gpu = _Gpu(random.Random(seed * 7001), max(1, round(sample_period_s * 1e6)), 50_000_000_000)
    lines = [_dumps(header)]
    for t in times:
        sm = _clamp(70.0 + _noise(gpu.rng, 3.0), 0.0, 100.0)
        record = {
            "t": t,
            "gpu": 0,
            "samples": gpu.samples(round(t * 1e6), 85.0, 4.0),
            "util": [85, round(0.6 * sm)],
            "memory": [int(0.9 * MEMORY_TOTAL), MEMORY_TOTAL],
            **gpu.power(290.0 + _noise(gpu.rng, 5.0), record_interval_s),
            "clock_events": 0x4,  # SW power cap: it draws against its 300 W
            "gpm": {
                "graphics_util": 85.0,
                "sm_util": round(sm, 1),
                "sm_occupancy": round(0.4 * sm, 1),
                "any_tensor_util": round(0.5 * sm, 1),
                "dram_bw_util": round(0.8 * sm, 1),
                "pcie_tx_per_sec": 400.0,
                "pcie_rx_per_sec": 900.0,
            },
        }
        lines.append(_dumps(record))
    return lines


# The shipped traces (tests/fixtures/traces/) and the calls that write them.
SHIPPED = {
    "replay-tp2-linkbound-synthetic.jsonl": lambda: tp_trace_lines(bound=True),
    "replay-tp2-overlapped-synthetic.jsonl": lambda: tp_trace_lines(bound=False),
    "replay-gb200-synthetic.jsonl": gb200_trace_lines,
    "replay-pcie-nolink-synthetic.jsonl": pcie_trace_lines,
}
