"""Synthetic NVML traces of shared GPUs: a GPU in MIG mode, and a GPU time-sliced between pods.

They stand in for recordings (``inference-bottleneck-exporter record``) until ones made on
real hardware exist, and say so in their header. Values are in NVML's units, as the trace
format (:mod:`exporter.backends.replay`) wants them, and output is byte-for-byte deterministic
for the same arguments (:class:`random.Random` seeded from ``seed`` only).

**MIG** (:func:`mig_trace_lines`): one GPU in MIG mode split into seven ``1g`` MIG devices,
each used by one inference pod. What the trace answers is what NVML answers an unprivileged
sidecar in MIG mode: for the GPU, power, energy, the enforced power limit, temperature, clocks
and PCIe, but no
utilisation, no sample buffer and no memory (``NO_PERMISSION`` without privileges: absent);
for each MIG device, its GPU instance's memory, its GPM values (graphics, SM, occupancy,
tensor, DRAM) and its compute processes, but no per-process utilisation. ``engine_pids`` are
the pod on MIG device 0's. The profile sizes are NVIDIA's ``nvidia-smi mig -lgip`` figures as
remembered, not read from a device here ([?]): H100 80GB ``1g.10gb`` 16 SMs, 9984 MiB (9.75
GiB); A100 80GB ``1g.10gb`` 14 SMs, 9728 MiB (9.5 GiB). An A100 has no GPM: its MIG devices
answer memory and processes only.

**Time-sliced** (:func:`timesliced_trace_lines`): one H100 shared by two pods through
time-slicing (the device plugin's replicas): a busy tenant (two processes, the API server and
the engine core, about 70 % of the GPU's time) and a starved one (one process, a few per cent)
whose requests queue up. Device utilisation is the sum of the tenants' shares. The per-process
utilisation buffer holds one sample per process and second, its share of that second, as
``nvmlDeviceGetProcessUtilization`` answers. ``engine_pids`` are the starved tenant's (the
sidecar that should see the problem); the busy tenant's are in the header's ``generator``
block, to replay the same GPU from its side. ``tenants=1`` leaves only the busy tenant: the
single-tenant counterpart.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

from exporter.backends.replay import TRACE_FORMAT, TRACE_VERSION
from support.synthetic import (
    DRIVER_VERSION,
    HARDWARE_FACTS,
    MEM_CLOCK_MHZ,
    MIB,
    POWER_LIMIT_MW,
    PRESTART_BUFFER_S,
    SM_CLOCK_MAX_MHZ,
)

GIB = 1024 * MIB


@dataclass(frozen=True)
class MigProduct:
    """A GPU model in MIG mode with seven ``1g`` MIG devices."""

    name: str
    profile: str
    sms: int
    memory_mib: int
    gpm: bool
    facts: dict[str, Any]
    power_limit_mw: int
    # GPU instance ids NVIDIA's tools show for seven 1g instances.
    gpu_instance_ids: tuple[int, ...] = (7, 8, 9, 10, 11, 12, 13)


MIG_PRODUCTS = {
    "h100": MigProduct(
        name="NVIDIA H100 80GB HBM3",
        profile="1g.10gb",
        sms=16,
        memory_mib=9984,
        gpm=True,
        # NVML answers no CUDA core count in MIG mode; the other facts as outside it.
        facts={k: v for k, v in HARDWARE_FACTS.items() if k != "cuda_cores"},
        power_limit_mw=POWER_LIMIT_MW,
    ),
    "a100": MigProduct(
        name="NVIDIA A100-SXM4-80GB",
        profile="1g.10gb",
        sms=14,
        memory_mib=9728,
        gpm=False,
        facts={
            "memory_bus_width_bits": 5120,
            "max_clocks_mhz": [1410, 1593],
            "compute_capability": [8, 0],
        },
        power_limit_mw=400_000,  # the A100 SXM4's TDP
    ),
}

# The load of each MIG device's tenant (mean graphics activity, percent): the engine on
# device 0 is busy, the others between busy and idle.
MIG_LOADS = (82.0, 64.0, 45.0, 30.0, 12.0, 3.0, 55.0)
MIG_ENGINE_PID = 31337
MIG_PIDS = (MIG_ENGINE_PID, 31512, 31788, 32040, 32233, 32517, 32890)

# Time-sliced tenants: host PIDs and mean share of the GPU's time (percent).
BUSY_PIDS = (41000, 41001)  # vLLM API server, engine core
STARVED_PIDS = (52000,)
BUSY_SHARE = 70.0
STARVED_SHARE = 5.0


def _dumps(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def _noise(rng: random.Random, amplitude: float) -> float:
    return (rng.random() + rng.random() - 1.0) * amplitude


def _uuid(rng: random.Random, prefix: str) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _times(duration_s: float, interval_s: float) -> list[float]:
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a positive number, got {duration_s}")
    if not (math.isfinite(interval_s) and interval_s >= 1e-3):
        raise ValueError(f"record_interval_s must be at least 1 ms, got {interval_s}")
    count = math.ceil(duration_s / interval_s - 1e-9)
    return [round(k * interval_s, 6) for k in range(count)]


def _header(
    description: str, generator: dict[str, Any], duration_s: float, gpus: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "kind": "header",
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "synthetic": True,
        "description": description,
        "generator": generator,
        "driver_version": DRIVER_VERSION,
        "duration_s": float(duration_s),
        "gpus": gpus,
    }


def _gpu_fields(
    rng: random.Random, util: float, interval_s: float, energy: int, temperature: float
) -> tuple[dict[str, Any], int, float]:
    """The physical GPU's own fields for a mean utilisation ``util`` (percent)."""
    power_w = _clamp(150.0 + 4.5 * util + _noise(rng, 10.0), 80.0, 690.0)
    power = int(power_w * 1000) + int(rng.random() * 1000)
    energy += round(power * interval_s)
    temperature += (33.0 + 0.06 * power_w - temperature) * (1.0 - math.exp(-interval_s / 20.0))
    temp_c = round(_clamp(temperature + _noise(rng, 0.6), 30.0, 80.0))
    fields = {
        "power_mw": power,
        "energy_mj": energy,
        "temp_c": temp_c,
        "clocks_mhz": [SM_CLOCK_MAX_MHZ - 15 * max(0, temp_c - 67), MEM_CLOCK_MHZ],
        "clock_events": 0,
    }
    return fields, energy, temperature


def mig_trace_lines(
    product: str = "h100",
    duration_s: float = 120.0,
    record_interval_s: float = 1.0,
    seed: int = 17,
) -> list[str]:
    """A GPU in MIG mode with seven MIG devices, header first (see the module docstring)."""
    if product not in MIG_PRODUCTS:
        raise ValueError(f"product must be one of {sorted(MIG_PRODUCTS)}, got {product!r}")
    spec = MIG_PRODUCTS[product]
    times = _times(duration_s, record_interval_s)
    identity = random.Random(seed)
    gpu_uuid = _uuid(identity, "GPU")
    migs = [
        {
            "slot": slot,
            "uuid": _uuid(identity, "MIG"),
            "name": f"{spec.name} MIG {spec.profile}",
            "gpu_instance_id": gi,
            "compute_instance_id": 0,
            "attributes": [spec.sms, 1, 1, spec.memory_mib],
        }
        for slot, gi in enumerate(spec.gpu_instance_ids)
    ]
    gpu = {
        "index": 0,
        "uuid": gpu_uuid,
        "name": spec.name,
        "pci_bus_id": "00000000:18:00.0",
        "mig_mode": 1,
        "gpm": spec.gpm,
        "facts": spec.facts,
        # the enforced power limit, the same for every record
        "fields": {
            "power_limit_mw": spec.power_limit_mw,
            "power_default_limit_mw": spec.power_limit_mw,
        },
        "max_mig_devices": len(migs),
        "mig_devices": migs,
    }
    description = (
        f"SYNTHETIC trace, not a recording: generated by support.synthetic_shared, "
        f"modelled on an {spec.name} in MIG mode with seven {spec.profile} MIG devices, one "
        "inference pod on each (engine_pids: the pod on MIG device 0). NVML as an unprivileged "
        "sidecar sees it: no GPU utilisation or memory in MIG mode, GPM per GPU instance"
        + ("" if spec.gpm else " (none on this GPU: no GPM before Hopper)")
        + "."
    )
    generator = {
        "module": "support.synthetic_shared",
        "kind": "mig",
        "product": product,
        "seed": seed,
        "record_interval_s": record_interval_s,
    }
    header = _header(description, generator, duration_s, [gpu])
    header["engine_pids"] = [MIG_ENGINE_PID]

    rng = random.Random(seed * 7919 + 1)
    streams = [random.Random(seed * 7919 + 11 * (slot + 2)) for slot in range(len(migs))]
    used = [
        int(spec.memory_mib * MIB * (0.88 + 0.04 * streams[slot].random()))
        for slot in range(len(migs))
    ]
    energy = 200_000_000_000 + int(rng.random() * 100_000_000_000)
    temperature = 50.0
    lines = [_dumps(header)]
    for t in times:
        loads = [
            _clamp(load + _noise(streams[slot], 8.0 if load > 20 else 2.0), 0.0, 100.0)
            for slot, load in enumerate(MIG_LOADS)
        ]
        # the GPU's power follows the mean activity of its seven instances
        fields, energy, temperature = _gpu_fields(
            rng, sum(loads) / len(loads), record_interval_s, energy, temperature
        )
        mean = sum(loads) / len(loads)
        fields["pcie_kibps"] = [round((25 + 1.1 * mean) * 1024), round((60 + 2.6 * mean) * 1024)]
        lines.append(_dumps({"t": t, "gpu": 0, **fields}))
        for slot, load in enumerate(loads):
            s = streams[slot]
            record: dict[str, Any] = {
                "t": t,
                "gpu": 0,
                "mig": slot,
                "memory": [used[slot], spec.memory_mib * MIB],
                "processes": [[MIG_PIDS[slot], used[slot] - 300 * MIB]],
            }
            if spec.gpm:
                sm = _clamp(0.9 * load + _noise(s, 2.0), 0.0, 100.0)
                record["gpm"] = {
                    "graphics_util": round(load, 1),
                    "sm_util": round(sm, 1),
                    "sm_occupancy": round(_clamp(0.4 * sm + _noise(s, 2.0), 0.0, 100.0), 1),
                    "any_tensor_util": round(_clamp(0.45 * sm + _noise(s, 2.0), 0.0, 100.0), 1),
                    "dram_bw_util": round(_clamp(10.0 + 0.6 * load + _noise(s, 3.0), 0, 100), 1),
                }
            lines.append(_dumps(record))
    return lines


def timesliced_trace_lines(
    tenants: int = 2,
    duration_s: float = 120.0,
    record_interval_s: float = 1.0,
    sample_period_s: float = 1 / 6,
    seed: int = 23,
) -> list[str]:
    """An H100 time-sliced between ``tenants`` pods (1 or 2), header first."""
    if tenants not in (1, 2):
        raise ValueError(f"tenants must be 1 or 2, got {tenants}")
    if not (math.isfinite(sample_period_s) and sample_period_s >= 1e-3):
        raise ValueError(f"sample_period_s must be at least 1 ms, got {sample_period_s}")
    times = _times(duration_s, record_interval_s)
    identity = random.Random(seed)
    gpu = {
        "index": 0,
        "uuid": _uuid(identity, "GPU"),
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0",
        "mig_mode": 0,
        "gpm": True,
        "facts": HARDWARE_FACTS,
        "fields": {"power_limit_mw": POWER_LIMIT_MW, "power_default_limit_mw": POWER_LIMIT_MW},
    }
    two = tenants == 2
    description = (
        "SYNTHETIC trace, not a recording: generated by support.synthetic_shared, "
        "modelled on an H100 SXM 80GB "
        + (
            "time-sliced between two inference pods: a busy tenant (PIDs 41000, 41001, ~70 % of "
            "the GPU) and a starved one (PID 52000, ~5 %). engine_pids are the starved "
            "tenant's; replay the busy tenant's side with generator.tenants.busy."
            if two
            else "with a single inference pod (PIDs 41000, 41001, ~70 % of the GPU)."
        )
    )
    generator: dict[str, Any] = {
        "module": "support.synthetic_shared",
        "kind": "timesliced",
        "seed": seed,
        "record_interval_s": record_interval_s,
        "sample_period_s": sample_period_s,
        "tenants": {"busy": list(BUSY_PIDS)} | ({"starved": list(STARVED_PIDS)} if two else {}),
    }
    header = _header(description, generator, duration_s, [gpu])
    header["engine_pids"] = list(STARVED_PIDS if two else BUSY_PIDS)

    rng = random.Random(seed * 104729 + 3)
    period_us = max(1, round(sample_period_s * 1e6))
    interval_us = round(record_interval_s * 1e6)
    phase = int(rng.random() * period_us)
    processes = [[41000, 1200 * MIB], [41001, 48 * GIB]]
    if two:
        processes.append([52000, 22 * GIB])
    used = sum(p[1] for p in processes) + 1500 * MIB
    energy = 300_000_000_000 + int(rng.random() * 100_000_000_000)
    temperature = 60.0
    next_sample = -round(PRESTART_BUFFER_S * 1e6)
    next_sample += (phase - next_sample) % period_us
    lines = [_dumps(header)]
    for t in times:
        now_us = round(t * 1e6)
        busy = _clamp(BUSY_SHARE + _noise(rng, 6.0), 0.0, 100.0)
        starved = _clamp(STARVED_SHARE + _noise(rng, 2.0), 0.5, 100.0) if two else 0.0
        device = _clamp(busy + starved, 0.0, 100.0)
        samples = []
        while next_sample <= now_us:
            samples.append([next_sample, round(_clamp(device + _noise(rng, 4.0), 0.0, 100.0))])
            next_sample += period_us
        # one per-process sample per second and process: its share of the second just gone
        process_samples = [
            [now_us - interval_us // 2, 41000, 1, 0],
            [now_us - interval_us // 3, 41001, round(busy - 1), round(0.45 * busy)],
        ]
        if two:
            process_samples.append([now_us - interval_us // 4, 52000, round(starved), 2])
        fields, energy, temperature = _gpu_fields(
            rng, device, record_interval_s, energy, temperature
        )
        sm = _clamp(0.85 * device + _noise(rng, 2.0), 0.0, 100.0)
        dram = _clamp(25.0 + 0.5 * device + _noise(rng, 3.0), 0.0, 100.0)
        pcie_tx, pcie_rx = 25.0 + 1.1 * device, 60.0 + 2.6 * device
        record = {
            "t": t,
            "gpu": 0,
            "samples": samples,
            "util": [round(device), round(0.8 * dram)],
            "memory": [used, 80 * GIB],
            **fields,
            "pcie_kibps": [round(pcie_tx * 1024), round(pcie_rx * 1024)],
            "gpm": {
                "graphics_util": round(device, 1),
                "sm_util": round(sm, 1),
                "sm_occupancy": round(_clamp(0.4 * sm + _noise(rng, 2.0), 0.0, 100.0), 1),
                "any_tensor_util": round(_clamp(0.45 * sm + _noise(rng, 2.0), 0.0, 100.0), 1),
                "dram_bw_util": round(dram, 1),
                "pcie_tx_per_sec": round(pcie_tx, 1),
                "pcie_rx_per_sec": round(pcie_rx, 1),
            },
            "processes": processes,
            "process_samples": process_samples,
        }
        lines.append(_dumps(record))
    return lines
