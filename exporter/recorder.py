"""``record``: write an NVML replay trace from real GPUs (format: :mod:`exporter.backends.replay`).

The recorder uses the same :class:`GpuReader` as the exporter, so a trace holds exactly what
the exporter would have seen, and replaying it reproduces the exporter's output: MIG devices
(each read as the exporter reads it), the per-process reads (compute processes and the
per-process utilisation buffer) of every GPU not in MIG mode and every MIG device, and the
links and power state (field values, fabric, workload power profiles), each NVLink link's
throughput included (the reader as ``--gpu.nvlink-per-link`` has it), so a trace serves either
setting. The
engine's processes, where they can be told among NVML's host PIDs
(:mod:`exporter.backends.pidns`), go into the header's ``engine_pids``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from exporter.backends.gpu_reader import (
    GpuIdentity,
    GpuReader,
    GpuReading,
    read_identity,
    read_mig_slices,
)
from exporter.backends.nvml_api import FIELD_ERRORS, FieldKey, NvmlApi, NvmlError
from exporter.backends.pidns import EngineProcesses, HostPids
from exporter.backends.replay import (
    TRACE_FORMAT,
    TRACE_VERSION,
    TraceMig,
    facts_to_json,
    mig_to_json,
)

log = logging.getLogger(__name__)


def _record_line(at: float, ident: GpuIdentity, reading: GpuReading, t0_us: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"t": round(at, 3), "gpu": ident.index}
    if ident.mig is not None:
        rec["mig"] = ident.mig.slot
    if reading.has_samples:
        rec["samples"] = [[ts - t0_us, round(v, 3)] for ts, v in reading.samples]
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
    if reading.processes is not None:
        rec["processes"] = [[p.pid, p.used_bytes] for p in reading.processes]
    if reading.process_samples is not None:
        rec["process_samples"] = [
            [s.timestamp_us - t0_us, s.pid, s.sm_pct, s.mem_pct] for s in reading.process_samples
        ]
    _link_state(rec, reading)
    return rec


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def fields_to_json(fields: dict[FieldKey, float]) -> dict[str, Any]:
    """A ``fields`` object: per-link fields as lists by link (null where a link did not
    answer), the others as numbers."""
    out: dict[str, Any] = {}
    for (name, link), value in sorted(fields.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if link is None:
            out[name] = _number(value)
            continue
        links: list[Any] = out.setdefault(name, [])
        links.extend([None] * (link + 1 - len(links)))
        links[link] = _number(value)
    return out


def _link_state(rec: dict[str, Any], reading: GpuReading) -> None:
    """What the links and the power state answered: field values, fabric, power profiles and
    the enforced power limit where it came from its own call."""
    if reading.fields:
        rec["fields"] = fields_to_json(reading.fields)
    limit = reading.power_limit_mw
    if limit is not None and ("power_limit_mw", None) not in reading.fields:
        rec["enforced_power_limit_mw"] = _number(limit)
    fabric = reading.fabric
    if fabric is not None:
        rec["fabric"] = {
            "state": fabric.state,
            "status": fabric.status,
            "clique_id": fabric.clique_id,
            "cluster_uuid": fabric.cluster_uuid,
            **({} if fabric.health_mask is None else {"health_mask": fabric.health_mask}),
            **({} if fabric.health_summary is None else {"health_summary": fabric.health_summary}),
        }
    if reading.power_profiles is not None:
        rec["power_profiles"] = sorted(reading.power_profiles)


def _mig_entries(api: NvmlApi, handle: object, slices: list[GpuIdentity]) -> dict[str, Any]:
    """The header's MIG fields of a GPU in MIG mode."""
    try:
        most = api.mig_device_count(handle)
    except NvmlError as err:
        if err.code not in FIELD_ERRORS:
            raise
        most = 0
    migs = [
        TraceMig(
            slot=i.mig.slot,
            uuid=i.uuid,
            name=i.name,
            gpu_instance_id=i.mig.gpu_instance_id,
            compute_instance_id=i.mig.compute_instance_id,
            attributes=i.mig.attributes,
        )
        for i in slices
        if i.mig is not None
    ]
    slots = [m.slot for m in migs]
    return {
        "max_mig_devices": max(most, max(slots, default=-1) + 1),
        "mig_devices": [mig_to_json(m) for m in migs],
    }


def _links_to_json(ident: GpuIdentity) -> dict[str, Any]:
    """The header's ``fields`` of a GPU: its link counts, as NVML answered them."""
    counts = {"nvlink_link_count": ident.links.nvlink, "c2c_link_count": ident.links.c2c}
    known = {name: n for name, n in counts.items() if n is not None}
    return {"fields": known} if known else {}


def _readers(
    api: NvmlApi, handles: list[object], identities: list[GpuIdentity]
) -> tuple[list[GpuReader], dict[int, list[GpuIdentity]]]:
    """A reader for every GPU and MIG device, as the exporter reads them."""
    readers: list[GpuReader] = []
    slices_of: dict[int, list[GpuIdentity]] = {}
    for ident, handle in zip(identities, handles, strict=True):
        mig_mode = ident.mig_mode == "enabled"
        readers.append(
            GpuReader(
                api, ident, handle, clock=time.monotonic, processes=not mig_mode, per_link=True
            )
        )
        if not mig_mode:
            continue
        slices = read_mig_slices(api, ident, handle)
        slices_of[ident.index] = [i for i, _ in slices]
        readers.extend(
            GpuReader(api, i, h, clock=time.monotonic, parent=handle, processes=True)
            for i, h in slices
        )
    return readers, slices_of


def record_with(
    api: NvmlApi,
    out: Path,
    *,
    duration: float,
    interval: float,
    engine: EngineProcesses | None = None,
) -> dict[str, Any]:
    """Record from ``api`` into ``out``; returns a summary (reads, calls, call times).

    ``engine`` tells the engine's processes among the processes read (``engine_pids``)."""
    api.init()
    try:
        handles = [api.handle(i) for i in range(api.device_count())]
        identities = [read_identity(api, i, h) for i, h in enumerate(handles)]
        driver = api.driver_version()
        readers, slices_of = _readers(api, handles, identities)
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
                    **_links_to_json(i),
                    **(
                        _mig_entries(api, handles[i.index], slices_of[i.index])
                        if i.index in slices_of
                        else {}
                    ),
                }
                for i in identities
            ],
        }
        engine_pids: set[int] = set()
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
                at = time.monotonic() - start
                calls_before = reader.calls
                before = time.perf_counter()
                ident = reader.identity
                try:
                    reading = reader.read()
                except NvmlError as err:
                    rec: dict[str, Any] = {"t": round(at, 3), "gpu": ident.index}
                    if ident.mig is not None:
                        rec["mig"] = ident.mig.slot
                    rec["error"] = err.name
                else:
                    rec = _record_line(at, ident, reading, t0_us)
                    engine_pids |= _engine_of(engine, reading)
                made = reader.calls - calls_before
                if made:
                    call_times.append((time.perf_counter() - before) / made)
                pending = [] if ident.mig is not None else xids.pop(ident.index, [])
                if pending:
                    rec["xids"] = pending
                lines.append(json.dumps(rec, sort_keys=True, separators=(",", ":")))
                reads += 1
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
        stop.set()
        watcher.join(2.0)
        elapsed = time.monotonic() - start
        header["duration_s"] = round(max(elapsed, float(json.loads(lines[-1])["t"]) + 0.001), 3)
        if engine is not None and engine.available:
            header["engine_pids"] = sorted(engine_pids)
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
            "unsupported": {r.identity.label: sorted(r.unsupported) for r in readers},
            "engine_pids": sorted(engine_pids),
        }
    finally:
        with contextlib.suppress(NvmlError):
            api.shutdown()


def _engine_of(engine: EngineProcesses | None, reading: GpuReading) -> set[int]:
    if engine is None or reading.processes is None:
        return set()
    pids = {p.pid for p in reading.processes}
    pids.update(s.pid for s in reading.process_samples or ())
    return set(engine.engine(pids) or ())


class LocalPids:
    """The PIDs of this machine's processes whose command line matches ``pattern`` (the
    recorder itself excluded), listed at most every ``ttl`` seconds."""

    def __init__(self, pattern: str, *, ttl: float = 5.0) -> None:
        self._pattern = re.compile(pattern)
        self._ttl = ttl
        self._at = -float("inf")
        self._pids: frozenset[int] = frozenset()

    def __call__(self) -> frozenset[int]:
        now = time.monotonic()
        if now - self._at >= self._ttl:
            import psutil  # noqa: PLC0415 - only the recorder lists processes here

            found = set()
            for proc in psutil.process_iter(["pid", "cmdline", "name"]):
                if proc.info["pid"] == os.getpid():
                    continue
                text = " ".join(proc.info["cmdline"] or []) or (proc.info["name"] or "")
                if self._pattern.search(text):
                    found.add(proc.info["pid"])
            self._pids, self._at = frozenset(found), now
        return self._pids


def record_trace(
    out: Path,
    *,
    duration: float,
    interval: float,
    replay: Path | None,
    match: str | None = None,
    host_procfs: Path | None = None,
) -> int:
    """CLI entry: record from NVML (or a replay trace), print a summary; exit code.

    ``match`` finds the engine's processes on this machine for ``engine_pids``."""
    api: NvmlApi
    engine: EngineProcesses | None = None
    if replay is not None:
        from exporter.backends.replay import ReplayApi, load_trace  # noqa: PLC0415

        trace = load_trace(replay)
        api = ReplayApi(trace)
        if trace.engine_pids is not None:
            from exporter.backends.pidns import FixedPids  # noqa: PLC0415

            engine = FixedPids(trace.engine_pids)
    else:
        from exporter.backends.nvml_library import PynvmlApi  # noqa: PLC0415

        api = PynvmlApi()
        if match is not None:
            engine = HostPids(LocalPids(match), host_procfs=host_procfs)
            if not engine.available:
                log.warning(
                    "engine processes cannot be told among NVML's host PIDs here (no host "
                    "/proc: pass --gpu.host-procfs); the trace gets no engine_pids"
                )
    try:
        summary = record_with(api, out, duration=duration, interval=interval, engine=engine)
    except NvmlError as err:
        log.error("cannot record: NVML %s (%s)", err.name, err)
        return 1
    except OSError as err:
        log.error("cannot write %s: %s", out, err.strerror or err)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0
