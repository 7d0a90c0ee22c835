"""NVML replay traces for drills and the demo on machines without a GPU.

On a CPU-only machine the sidecar's GPU side can only be a replay (:mod:`exporter.backends.
replay`). The bundled ``exporter/data/replay-2gpu-synthetic.jsonl`` is a showcase (GPU 0
pulsing around 67 %, GPU 1 steady near 80 %); for drills we want a GPU whose behaviour is
fixed and plain, so that what differs between two drills is only the real cause on the CPU
side. Two looks, both one H100-like GPU, steady (no pulsing: fewer than 1 % of samples at or
below 5 % or above 90 %), memory pre-allocated to 90 % as vLLM does:

``starved``  mean utilisation 40 %: a GPU waiting for its host (CPU-bound serving shows GPU
             utilisation below 60 % while the queue grows). Used for the healthy
             drill too: every GPU-gated signature is armed, and only CPU-side evidence can
             make one fire.
``busy``     mean utilisation 88 %: a GPU that is kept working. Used where the cause leaves
             the GPU busy - an admission cap below the offered load (``queue-flood``) keeps
             the admitted sequences decoding back to back.

The file is written deterministically (fixed seed) by :func:`write_trace`.

**The host's peaks.** The replayed GPU is honest about what it stands in for: on a CPU the
model worker's torch threads do the GPU's work, so the trace's NVML facts (the answers behind
``inference_gpu_peak_memory_bandwidth_bytes_per_second`` and ``inference_gpu_peak_flops``,
see :mod:`exporter.backends.replay`) are the rate at which this host streams the model's
weights through a decode step's products (on a CPU that, not DRAM, bounds a decode step) and
its float32 matmul rate (:mod:`exporter.lab.refengine.hostpeak`, measured when the trace is
written, with the worker's thread count). The decode floor of the reference model is then what
this host allows a step, and the roofline arithmetic runs on real figures (docs/roofline.md,
"The reference engine on a CPU"). The facts are encoded
in NVML's terms: a 64-bit memory bus at ``bandwidth / 16`` MHz (``bus / 8 x clock x 2``), and
one GA10x-class SM (compute capability 8.6: 128 CUDA cores, 1024 dense FP16/BF16 FLOPs per
clock) at ``matmul rate / 1024`` MHz, so the bf16 (and fp16) peak is the measured float32 rate,
the precision the CPU model runs in; the architecture's int8 figure (twice that) means nothing
on a host. The device name says what it is, so no product table applies.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from exporter.backends.replay import TRACE_FORMAT, TRACE_VERSION, facts_to_json
from exporter.hardware.gpus import GpuFacts

LOOKS: dict[str, float] = {"starved": 40.0, "busy": 88.0}
MEMORY_TOTAL = 85899345920  # 80 GiB
SAMPLE_PERIOD_US = 166_667
DURATION_S = 120

# Which look each drill scenario replays (see the module docstring and docs/drills.md).
SCENARIO_LOOK: dict[str, str] = {
    "healthy": "starved",
    "tokenizer-slow": "starved",
    "frontend-gil": "starved",
    "cpu-contention": "starved",
    "softirq": "starved",
    "queue-flood": "busy",
    "decode-overhead": "starved",
}


# The NVML terms the host's peaks are written in (see the module docstring).
BUS_WIDTH_BITS = 64
COMPUTE_CAPABILITY = (8, 6)
CUDA_CORES = 128  # one SM of compute capability 8.6
FLOPS_PER_CLOCK = 1024  # dense FP16/BF16 per SM per clock at 8.6
DEVICE_NAME = "Reference engine host (measured peaks)"


@dataclass(frozen=True)
class HostPeaks:
    """This host's measured peaks (:mod:`exporter.lab.refengine.hostpeak`)."""

    memory_bandwidth: float  # bytes/s: the replayed GPU's peak (the decode stream rate)
    matmul_flops: float  # FLOP/s, float32
    dram_bandwidth: float = 0.0  # bytes/s, read-only stream (for the record)
    threads: int = 1
    how: str = ""
    sustained_bandwidth: float = 0.0  # bytes/s: the decode stream back to back, now (0: unknown)

    def available(self) -> HostPeaks:
        """The peaks as one thread can have them now: both scaled by the sustained decode
        stream over the fastest pass where neighbours hold part of the CPU (unchanged on a
        quiet host). The drills' model worker stands in for a GPU that nothing else uses; on a
        shared host it gets this share of the hardware, and the replayed GPU says so."""
        if not 0 < self.sustained_bandwidth < self.memory_bandwidth:
            return self
        share = self.sustained_bandwidth / self.memory_bandwidth
        return replace(
            self,
            memory_bandwidth=self.sustained_bandwidth,
            matmul_flops=self.matmul_flops * share,
            how=f"{self.how}; {share:.0%} of the fastest pass, as sustained now",
        )

    def slowed(self, factor: float) -> HostPeaks:
        """The peaks of an accelerator ``factor`` times slower: what the model worker stands in
        for under ``--worker-slowdown factor``, so a slowed model's decode floor is as far from
        its step as the model's at its own speed."""
        if factor <= 1.0:
            return self
        return replace(
            self,
            memory_bandwidth=self.memory_bandwidth / factor,
            matmul_flops=self.matmul_flops / factor,
            how=f"{self.how}; divided by the worker's slowdown {factor:g}",
        )

    def facts(self) -> GpuFacts:
        """The peaks as the NVML facts that give them back (within 0.5 MHz of rounding)."""
        return GpuFacts(
            memory_bus_width_bits=BUS_WIDTH_BITS,
            max_memory_clock_mhz=max(1, round(self.memory_bandwidth / (BUS_WIDTH_BITS / 8 * 2e6))),
            max_sm_clock_mhz=max(1, round(self.matmul_flops / (FLOPS_PER_CLOCK * 1e6))),
            cuda_cores=CUDA_CORES,
            compute_capability=COMPUTE_CAPABILITY,
        )


def measure_host(threads: int | None = None) -> HostPeaks:
    """Measure this host's peaks in a child process with the model worker's torch threads
    (``threads``; default: what the engine picks on this machine). Raises ``RuntimeError``
    when the measurement fails (no torch: the reference extra is missing)."""
    data = _hostpeak(threads)
    return HostPeaks(
        memory_bandwidth=float(data["decode_stream_bandwidth"]),
        matmul_flops=float(data["matmul_flops"]),
        dram_bandwidth=float(data["memory_bandwidth"]),
        threads=int(data["threads"]),
        how=str(data["how"]),
        sustained_bandwidth=float(data.get("decode_stream_sustained", 0.0)),
    )


def _hostpeak(threads: int | None) -> dict[str, Any]:
    from exporter.lab.processes import child_pythonpath  # noqa: PLC0415
    from exporter.lab.refengine.cli import auto_threads  # noqa: PLC0415

    n = auto_threads() if threads is None else threads
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.lab.refengine.hostpeak", "--threads", str(n)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
        # A session of its own, as the engine's (and so its scheduling group, where the
        # kernel groups tasks by session): the sustained rate is what the worker would get.
        start_new_session=True,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"measuring the host's peaks failed: {last}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def trace_lines(look: str, seed: int = 11, host: HostPeaks | None = None) -> list[str]:
    """The trace of ``look`` as JSON lines, header first; with ``host``, the GPU's NVML facts
    are the host's peaks and its clocks the ones they imply."""
    level = LOOKS[look]
    rng = random.Random(seed)
    gpu: dict[str, Any] = {
        "index": 0,
        "uuid": "GPU-d7111100-0000-4000-8000-00000000d711",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0",
        "mig_mode": 0,
        "gpm": True,
    }
    clocks = [1980, 2619]
    what = "one H100-like GPU"
    if host is not None:
        facts = host.facts()
        gpu["name"] = DEVICE_NAME
        gpu["facts"] = facts_to_json(facts)
        clocks = [facts.max_sm_clock_mhz or 0, facts.max_memory_clock_mhz or 0]
        what = (
            f"the reference engine's host ({host.memory_bandwidth / 1e9:.1f} GB/s memory read "
            f"bandwidth, {host.matmul_flops / 1e9:.0f} GFLOP/s float32 matmul on "
            f"{host.threads} thread(s), measured)"
        )
    header = {
        "kind": "header",
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "synthetic": True,
        "description": (
            f"SYNTHETIC drill trace '{look}': {what} at a steady ~{level:.0f} % "
            "utilisation, generated by exporter.lab.refengine.gputrace for CPU-only drills."
        ),
        "driver_version": "550.54.15",
        "duration_s": float(DURATION_S),
        "gpus": [gpu],
    }
    lines = [json.dumps(header, sort_keys=True, separators=(",", ":"))]
    energy = 250_000_000_000
    ts = -2_000_000
    for t in range(DURATION_S):
        # Record t holds the samples since record t-1 (record 0: the driver's 2 s buffer).
        samples: list[list[int]] = []
        while ts <= t * 1_000_000:
            noise = (rng.random() + rng.random() - 1.0) * 12.0
            samples.append([ts, round(min(89.0, max(8.0, level + noise)))])
            ts += SAMPLE_PERIOD_US
        util = sum(v for _, v in samples) / len(samples)
        dram = round(20.0 + 0.5 * util + (rng.random() - 0.5) * 4, 1)
        power = int((120 + 4.5 * util) * 1000)
        energy += power
        record: dict[str, Any] = {
            "t": float(t),
            "gpu": 0,
            "samples": samples,
            "util": [round(util), round(0.8 * dram)],
            "memory": [int(MEMORY_TOTAL * 0.9), MEMORY_TOTAL],
            "power_mw": power,
            "energy_mj": energy,
            "temp_c": round(40 + 0.3 * util),
            "clocks_mhz": clocks,
            "clock_events": 0,
            "pcie_kibps": [round(40_000 + 900 * util), round(90_000 + 1800 * util)],
            "gpm": {
                "dram_bw_util": dram,
                "sm_util": round(0.85 * util, 1),
                "sm_occupancy": round(0.35 * util, 1),
                "any_tensor_util": round(0.3 * util, 1),
                "pcie_tx_per_sec": round(40 + 0.9 * util, 1),
                "pcie_rx_per_sec": round(90 + 1.8 * util, 1),
            },
        }
        lines.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    return lines


def write_trace(look: str, path: Path, host: HostPeaks | None = None) -> Path:
    """Write the trace of ``look`` with the host's peaks (measured now unless given)."""
    peaks = host if host is not None else measure_host()
    path.write_text("\n".join(trace_lines(look, host=peaks)) + "\n", encoding="utf-8")
    return path


def mean_utilization(lines: list[str]) -> float:
    """Mean of every utilisation sample of a trace (for tests)."""
    values = [v for line in lines[1:] for _, v in json.loads(line)["samples"]]
    return sum(values) / len(values) if values else math.nan
