"""``record``: write an NVML replay trace from real GPUs (format: :mod:`exporter.backends.replay`).

The recorder uses the same :class:`GpuReader` as the exporter, so a trace holds exactly what
the exporter would have seen, and replaying it reproduces the exporter's output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from exporter.backends.gpu import GpuReader, GpuReading, read_identity
from exporter.backends.nvml_api import NvmlApi, NvmlError
from exporter.backends.replay import TRACE_FORMAT, TRACE_VERSION, facts_to_json

log = logging.getLogger(__name__)


def _record_line(t: float, gpu: int, reading: GpuReading, t0_us: int) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "t": round(t, 3),
        "gpu": gpu,
        "samples": [[ts - t0_us, round(v, 3)] for ts, v in reading.samples],
    }
    if reading.util_gpu_pct is not None and reading.mem_busy_pct is not None:
        rec["util"] = [reading.util_gpu_pct, reading.mem_busy_pct]
    if reading.memory_used_bytes is not None and reading.memory_total_bytes is not None:
        rec["memory"] = [reading.memory_used_bytes, reading.memory_total_bytes]
    for key, value in (
        ("power_mw", reading.power_mw),
        ("energy_mj", reading.energy_mj),
        ("temp_c", reading.temperature_c),
        ("clock_events", reading.clock_events),
    ):
        if value is not None:
            rec[key] = value
    if reading.sm_clock_mhz is not None and reading.mem_clock_mhz is not None:
        rec["clocks_mhz"] = [reading.sm_clock_mhz, reading.mem_clock_mhz]
    if reading.pcie_tx_kibps is not None and reading.pcie_rx_kibps is not None:
        rec["pcie_kibps"] = [reading.pcie_tx_kibps, reading.pcie_rx_kibps]
    if reading.gpm:
        rec["gpm"] = {k: round(v, 4) for k, v in sorted(reading.gpm.items())}
    return rec


def record_with(api: NvmlApi, out: Path, *, duration: float, interval: float) -> dict[str, Any]:
    """Record from ``api`` into ``out``; returns a summary (reads, calls, call times)."""
    api.init()
    try:
        handles = [api.handle(i) for i in range(api.device_count())]
        identities = [read_identity(api, i, h) for i, h in enumerate(handles)]
        driver = api.driver_version()
        readers = [
            GpuReader(api, ident, h, clock=time.monotonic)
            for ident, h in zip(identities, handles, strict=True)
        ]
        header = {
            "kind": "header",
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "synthetic": False,
            "description": f"Recorded by inference-bottleneck-exporter record on "
            f"{', '.join(sorted({i.name for i in identities}))}",
            "driver_version": driver,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "gpus": [
                {
                    "index": i.index,
                    "uuid": i.uuid,
                    "name": i.name,
                    "pci_bus_id": i.pci_bus_id,
                    "mig_mode": {"enabled": 1, "disabled": 0}.get(i.mig_mode),
                    "gpm": i.gpm_supported,
                    "facts": facts_to_json(i.facts),
                }
                for i in identities
            ],
        }
        xids: dict[int, list[int]] = {}
        stop = threading.Event()

        def watch() -> None:
            try:
                api.register_xid_events(handles)
                while not stop.is_set():
                    for event in api.wait_xid_events(500):
                        xids.setdefault(event.gpu, []).append(event.xid)
            except NvmlError as err:
                log.info("Xid events not recorded: %s", err.name)

        watcher = threading.Thread(target=watch, name="record-xid", daemon=True)
        watcher.start()
        start = time.monotonic()
        t0_us = time.time_ns() // 1000
        call_times: list[float] = []
        reads = 0
        lines = [json.dumps(header, sort_keys=True, separators=(",", ":"))]
        while time.monotonic() - start < duration:
            tick = time.monotonic()
            for reader in readers:
                t = time.monotonic() - start
                calls_before = reader.calls
                before = time.perf_counter()
                try:
                    reading = reader.read()
                except NvmlError as err:
                    rec: dict[str, Any] = {"t": round(t, 3), "gpu": reader.identity.index}
                    rec["error"] = err.name
                else:
                    rec = _record_line(t, reader.identity.index, reading, t0_us)
                made = reader.calls - calls_before
                if made:
                    call_times.append((time.perf_counter() - before) / made)
                pending = xids.pop(reader.identity.index, [])
                if pending:
                    rec["xids"] = pending
                lines.append(json.dumps(rec, sort_keys=True, separators=(",", ":")))
                reads += 1
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
        stop.set()
        watcher.join(2.0)
        elapsed = time.monotonic() - start
        header["duration_s"] = round(max(elapsed, float(json.loads(lines[-1])["t"]) + 0.001), 3)
        lines[0] = json.dumps(header, sort_keys=True, separators=(",", ":"))
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        call_times.sort()
        calls = sum(r.calls for r in readers)
        return {
            "gpus": len(readers),
            "reads": reads,
            "calls": calls,
            "calls_per_gpu_per_second": calls / max(elapsed, 1e-9) / max(len(readers), 1),
            "median_call_seconds": call_times[len(call_times) // 2] if call_times else None,
            "p99_call_seconds": call_times[int(len(call_times) * 0.99)] if call_times else None,
            "unsupported": {r.identity.index: sorted(r.unsupported) for r in readers},
        }
    finally:
        with contextlib.suppress(NvmlError):
            api.shutdown()


def record_trace(out: Path, *, duration: float, interval: float, replay: Path | None) -> int:
    """CLI entry: record from NVML (or a replay trace), print a summary; exit code."""
    api: NvmlApi
    if replay is not None:
        from exporter.backends.replay import ReplayApi, load_trace  # noqa: PLC0415

        api = ReplayApi(load_trace(replay))
    else:
        from exporter.backends.nvml import PynvmlApi  # noqa: PLC0415

        api = PynvmlApi()
    try:
        summary = record_with(api, out, duration=duration, interval=interval)
    except NvmlError as err:
        log.error("cannot record: NVML %s (%s)", err.name, err)
        return 1
    except OSError as err:
        log.error("cannot write %s: %s", out, err.strerror or err)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0
