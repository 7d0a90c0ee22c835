"""Time every NVML call the sidecar makes, on every GPU of this machine (bench/gpu/run.sh).

Writes JSON: per call, the median, p99 and maximum in microseconds over ``--calls`` calls,
and the calls per second the sidecar makes at its defaults (docs/nvml.md). Needs a driver.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.backends.nvml_api import NvmlError
from exporter.backends.nvml_library import PynvmlApi


def timed(fn: Callable[[], Any], calls: int) -> dict[str, Any]:
    times: list[float] = []
    error = ""
    for _ in range(calls):
        start = time.perf_counter()
        try:
            fn()
        except NvmlError as err:
            error = err.name
        times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    return {
        "median_us": round(statistics.median(times), 1),
        "p99_us": round(times[int(0.99 * (len(times) - 1))], 1),
        "max_us": round(times[-1], 1),
        "error": error,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    api = PynvmlApi()
    start = time.perf_counter()
    api.init()
    result: dict[str, Any] = {"init_ms": round((time.perf_counter() - start) * 1e3, 1)}
    result["driver"] = api.driver_version()
    gpus: list[dict[str, Any]] = []
    for index in range(api.device_count()):
        h = api.handle(index)
        calls: dict[str, Callable[[], Any]] = {
            "utilization_samples": lambda h=h: api.utilization_samples(h, 0),
            "utilization_rates": lambda h=h: api.utilization_rates(h),
            "memory_info": lambda h=h: api.memory_info(h),
            "power_usage": lambda h=h: api.power_usage_mw(h),
            "total_energy": lambda h=h: api.total_energy_mj(h),
            "temperature": lambda h=h: api.temperature_c(h),
            "clock_sm": lambda h=h: api.clock_mhz(h, "sm"),
            "clock_events": lambda h=h: api.clock_event_reasons(h),
            "pcie_rx": lambda h=h: api.pcie_throughput_kibps(h, "rx"),
        }
        timings = {name: timed(fn, args.calls) for name, fn in calls.items()}
        if api.gpm_supported(h):

            def gpm(h: object = h) -> None:
                api.gpm_free(api.gpm_sample(h))

            timings["gpm_sample"] = timed(gpm, max(10, args.calls // 10))
        gpus.append({"index": index, "name": api.name(h), "calls": timings})
    api.shutdown()
    result["gpus"] = gpus
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    for gpu in gpus:
        line = ", ".join(f"{k} {v['median_us']:.0f}us" for k, v in gpu["calls"].items())
        print(f"GPU {gpu['index']} {gpu['name']}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
