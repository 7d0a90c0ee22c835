"""Time every NVML call the sidecar makes, on every GPU of this machine (bench/gpu/run.sh).

Writes JSON: per call, the median, p99 and maximum in microseconds over ``--calls`` calls,
and the calls per second the sidecar makes at its defaults (docs/nvml.md). With
``--probe-seconds`` (run while an engine computes) it then polls the two sample buffers the
sidecar reads, the device's utilisation samples and the per-process ones, once a second as the
sidecar does, and keeps what each poll returned: how many samples, how far apart, which PIDs,
what values. That is the per-process sampling behaviour of the driver, which no stand-in shows.
The links and power state (issue 36) are timed as the reader makes them (the poll's one
``nvmlDeviceGetFieldValues`` with every field it asks, fabric, power profiles, the enforced
power limit, GPM metrics with the NVLink ids) and what they answered is kept under ``links``:
link count, states, speeds, fabric, power limit and smoothing, which docs/nvml.md records.
Needs a driver.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.backends.gpu_reader import GpuReader, read_identity
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


def _gaps_ms(stamps: list[int]) -> dict[str, float]:
    gaps = [(b - a) / 1e3 for a, b in itertools.pairwise(stamps)]
    if not gaps:
        return {}
    return {"median": round(statistics.median(gaps), 2), "max": round(max(gaps), 2)}


def probe(api: PynvmlApi, index: int, seconds: float) -> dict[str, Any]:
    """Poll both sample buffers once a second, each from its own last timestamp."""
    handle = api.handle(index)
    last_device = last_process = 0
    polls: list[dict[str, Any]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        poll: dict[str, Any] = {"t": round(time.time(), 2)}
        try:
            device = api.utilization_samples(handle, last_device)
            stamps = sorted(t for t, _ in device)
            if stamps:
                last_device = stamps[-1]
            values = [v for _, v in device]
            poll["device"] = {
                "samples": len(device),
                "gap_ms": _gaps_ms(stamps),
                "mean": round(statistics.fmean(values), 1) if values else None,
                "busy": sum(1 for v in values if v > 0),
            }
        except NvmlError as err:
            poll["device"] = {"error": err.name}
        try:
            procs = api.process_utilization(handle, last_process)
            if procs:
                last_process = max(s.timestamp_us for s in procs)
            by_pid: dict[int, list[int]] = {}
            for sample in procs:
                by_pid.setdefault(sample.pid, []).append(sample.timestamp_us)
            poll["process"] = {
                "samples": len(procs),
                "pids": {
                    str(pid): {
                        "samples": len(stamps),
                        "gap_ms": _gaps_ms(sorted(stamps)),
                        "sm_pct": [s.sm_pct for s in procs if s.pid == pid][:8],
                    }
                    for pid, stamps in by_pid.items()
                },
            }
        except NvmlError as err:
            poll["process"] = {"error": err.name}
        try:
            poll["running"] = [
                {"pid": p.pid, "used_bytes": p.used_bytes} for p in api.compute_processes(handle)
            ]
        except NvmlError as err:
            poll["running"] = {"error": err.name}
        polls.append(poll)
        time.sleep(1.0)
    return {"index": index, "polls": polls}


def _answer(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except NvmlError as err:
        return {"error": err.name}


def links(api: PynvmlApi, index: int, calls: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The new calls timed as a poll makes them, and what they answered."""
    handle = api.handle(index)
    identity = read_identity(api, index, handle)
    reader = GpuReader(api, identity, handle, clock=time.monotonic, per_link=True)
    keys = reader.wanted_fields()
    timings = {
        f"field_values_{len(keys)}": timed(lambda: api.field_values(handle, keys), calls),
        "fabric_info": timed(lambda: api.fabric_info(handle), calls),
        "power_profiles": timed(lambda: api.power_profiles(handle), calls),
        "enforced_power_limit": timed(lambda: api.enforced_power_limit_mw(handle), calls),
    }
    if identity.gpm_supported:
        # The metrics between two samples 100 ms apart, NVLink's per link included: computed
        # in the library, timed here to show it costs no driver time.
        ids = reader.gpm_ids()
        older = api.gpm_sample(handle)
        time.sleep(0.1)
        newer = api.gpm_sample(handle)
        try:
            timings[f"gpm_metrics_{len(ids)}"] = timed(
                lambda: api.gpm_metrics(older, newer, ids), calls
            )
        finally:
            api.gpm_free(older)
            api.gpm_free(newer)
    answered = _answer(lambda: api.field_values(handle, keys))
    values = {
        "links": {"nvlink": identity.links.nvlink, "c2c": identity.links.c2c},
        "fields": {
            f"{name}[{link}]" if link is not None else name: (
                value.name if isinstance(value, NvmlError) else value
            )
            for (name, link), value in answered.items()
        }
        if isinstance(answered, dict)
        else answered,
        "fabric": _answer(lambda: vars(api.fabric_info(handle))),
        "power_profiles": _answer(lambda: sorted(api.power_profiles(handle))),
        "enforced_power_limit_mw": _answer(lambda: api.enforced_power_limit_mw(handle)),
    }
    return timings, values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--probe-seconds", type=float, default=0.0)
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
            "compute_processes": lambda h=h: api.compute_processes(h),
            "process_utilization": lambda h=h: api.process_utilization(h, 0),
        }
        timings = {name: timed(fn, args.calls) for name, fn in calls.items()}
        if api.gpm_supported(h):

            def gpm(h: object = h) -> None:
                api.gpm_free(api.gpm_sample(h))

            timings["gpm_sample"] = timed(gpm, max(10, args.calls // 10))
        link_timings, answered = links(api, index, args.calls)
        timings.update(link_timings)
        gpus.append({"index": index, "name": api.name(h), "calls": timings, "links": answered})
    if args.probe_seconds > 0:
        result["probe"] = [probe(api, i, args.probe_seconds) for i in range(api.device_count())]
    api.shutdown()
    result["gpus"] = gpus
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    for gpu in gpus:
        line = ", ".join(f"{k} {v['median_us']:.0f}us" for k, v in gpu["calls"].items())
        print(f"GPU {gpu['index']} {gpu['name']}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
