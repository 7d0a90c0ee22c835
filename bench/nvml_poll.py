"""What one poll of one GPU costs on the stand-in NVML, before and after the links and power
state were read (issue 36): calls per poll, and the time of the poll and of each new call.

The stand-in is nvidia-ml-py's own binding code over a fake C library written in Python
(``tests/support/pynvml_fake.py``), so a poll here runs the exporter's reader, the real
bindings' ctypes work and the fake's answers. The fake's own time is measured (every C function
wrapped) and taken out: what remains is the exporter's and nvidia-ml-py's share of a poll, the
part that is the same on a GPU. The driver's share (its lock, the GPU's answers) is what only a
GPU shows: ``bench/gpu/nvml_timing.py`` times the same calls there (docs/nvml.md).

Boards, each a steady state (the first polls, which try what the GPU lacks, are left out):

* ``h100 (before)``: an HGX H100 on a driver with none of the new calls (each tried once,
  absent after): what every poll cost before;
* ``h100``: the same GPU answering them (18 NVLink links, fabric, power limit; NVLink via GPM);
* ``h100 per-link``: with ``--gpu.nvlink-per-link`` (36 more GPM metrics, computed in the
  library, no more driver calls);
* ``a100 per-link``: no GPM: the NVLink throughput counters by field value, 12 links;
* ``gb200``: C2C, power smoothing, workload power profiles, fabric v3.

    python bench/nvml_poll.py [--polls 400] [--out bench/results/nvml-poll.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import pynvml  # noqa: E402
from common import RESULTS, machine  # noqa: E402
from support.pynvml_fake import FakeGpu, fake_pynvml, gb200, hgx_h100, tp_pod  # noqa: E402

from exporter.backends.gpu_reader import GpuReader, read_identity  # noqa: E402
from exporter.backends.nvml_library import PynvmlApi  # noqa: E402

WARMUP = 3
# What a driver without the new calls lacks (C symbols) and nvidia-ml-py without them (bindings).
OLD_DRIVER = {
    "missing": (
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetGpuFabricInfo",
        "nvmlDeviceGetEnforcedPowerLimit",
    ),
    "drop": ("nvmlDeviceWorkloadPowerProfileGetCurrentProfiles",),
}
# The calls this change added, by the reader's name for them.
NEW_CALLS = {
    "field_values": "nvmlDeviceGetFieldValues",
    "fabric_info": "nvmlDeviceGetGpuFabricInfoV",
    "power_profiles": "nvmlDeviceWorkloadPowerProfileGetCurrentProfiles",
    "enforced_power_limit": "nvmlDeviceGetEnforcedPowerLimit",
}


def _readings(gpu: FakeGpu) -> FakeGpu:
    """The GPU answering every reading of a poll, as a real one does (the presets answer only
    what the link tests need)."""
    return dataclasses.replace(
        gpu,
        utilization=(80, 35),
        samples=[(t * 166_667, 80) for t in range(1, 13)],
        memory=(72 * 2**30, 80 * 2**30),
        power_mw=512_000,
        energy_mj=1_000_000,
        temperature_c=63,
        clocks_mhz={pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619},
        clock_events=0,
        pcie_kibps=(30 * 1024, 60 * 1024),
        # GPM's base metrics, PCIe among them (the PCIe calls then stop after the first poll)
        gpm={**{m: 50.0 for m in (1, 2, 3, 5, 10, 20, 21)}, **gpu.gpm},
    )


def _h100() -> FakeGpu:
    return _readings(tp_pod(link_bound=True)[0])


def _a100() -> FakeGpu:
    return _readings(hgx_h100(0, name="NVIDIA A100-SXM4-80GB", gpm_supported=False, links=12))


def _gb200() -> FakeGpu:
    return _readings(gb200())


BOARDS: dict[str, tuple[Callable[[], FakeGpu], dict[str, Any], bool]] = {
    "h100 (before)": (_h100, {"driver": "550.54.15", **OLD_DRIVER}, False),
    "h100": (_h100, {"driver": "550.54.15"}, False),
    "h100 per-link": (_h100, {"driver": "550.54.15"}, True),
    "a100 per-link": (_a100, {"driver": "550.54.15"}, True),
    "gb200": (_gb200, {"driver": "590.48.01"}, False),
}


class FakeTime:
    """Wraps every C function of the fake library: the time spent in the fake itself."""

    def __init__(self, library: Any) -> None:
        self.seconds = 0.0
        for name in dir(type(library)):
            if name.startswith("nvml"):
                setattr(library, name, self._timed(getattr(library, name)))

    def _timed(self, fn: Callable[..., int]) -> Callable[..., int]:
        def timed(*args: Any) -> int:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(board: str, polls: int) -> dict[str, Any]:
    make, kwargs, per_link = BOARDS[board]
    gpu = make()
    module = fake_pynvml([gpu], **kwargs)
    fake = FakeTime(module.library)  # type: ignore[attr-defined]
    api = PynvmlApi(library=module)
    api.init()
    handle = api.handle(0)
    now = [0.0]
    reader = GpuReader(
        api, read_identity(api, 0, handle), handle, clock=lambda: now[0], per_link=per_link
    )
    for _ in range(WARMUP):
        reader.read()
        now[0] += 3.0
    made_before = len(module.calls)  # type: ignore[attr-defined]
    calls_before = reader.calls
    own_us: list[float] = []
    for _ in range(polls):
        fake.seconds = 0.0
        start = time.perf_counter()
        reader.read()
        own_us.append((time.perf_counter() - start - fake.seconds) * 1e6)
        now[0] += 3.0
    made = Counter(name for name, _ in module.calls[made_before:])  # type: ignore[attr-defined]
    per_call = {
        call: _time_call(api, handle, reader, call, polls)
        for call, symbol in NEW_CALLS.items()
        if made[symbol]
    }
    return {
        "board": board,
        "calls_per_poll": (reader.calls - calls_before) / polls,
        "new_calls_per_poll": {c: made[s] / polls for c, s in NEW_CALLS.items() if made[s]},
        "field_values_per_poll": len(reader.wanted_fields())
        if made[NEW_CALLS["field_values"]]
        else 0,
        "gpm_metrics_per_poll": len(reader.gpm_ids()) if gpu.gpm_supported else 0,
        "poll_us": {
            "median": round(statistics.median(own_us), 1),
            "p99": round(_pct(own_us, 0.99), 1),
        },
        "new_call_us": per_call,
    }


def _time_call(api: PynvmlApi, handle: object, reader: GpuReader, call: str, n: int) -> float:
    """Median microseconds of one new call as the reader makes it (the fake's time included:
    it is a few microseconds of Python, the driver's own is what bench/gpu measures)."""
    fn: Callable[[], object] = {
        "field_values": lambda: api.field_values(handle, reader.wanted_fields()),
        "fabric_info": lambda: api.fabric_info(handle),
        "power_profiles": lambda: api.power_profiles(handle),
        "enforced_power_limit": lambda: api.enforced_power_limit_mw(handle),
    }[call]
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return round(statistics.median(times), 1)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| board | calls / poll | fields / call | GPM metrics | poll, exporter + nvidia-ml-py "
        "(median / p99 µs) | new calls (median µs, stand-in) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        new = ", ".join(f"{k} {v}" for k, v in r["new_call_us"].items()) or "-"
        lines.append(
            f"| {r['board']} | {r['calls_per_poll']:g} | {r['field_values_per_poll']} "
            f"| {r['gpm_metrics_per_poll']} | {r['poll_us']['median']} / {r['poll_us']['p99']} "
            f"| {new} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--polls", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS / "nvml-poll.json")
    args = parser.parse_args()
    results = [measure(board, args.polls) for board in BOARDS]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine(), "polls": args.polls, "boards": results}, indent=2),
        encoding="utf-8",
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
