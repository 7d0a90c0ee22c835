"""Replay NVML from a JSON-lines trace, so everything runs and is tested without a GPU.

Trace format (version 1), one JSON object per line:

* line 1, the header::

    {"kind": "header", "format": "inference-bottleneck-exporter/nvml-trace", "version": 1,
     "synthetic": true, "description": "...", "driver_version": "550.54.15",
     "duration_s": 120.0,
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
               "pci_bus_id": "00000000:18:00.0", "mig_mode": 0, "gpm": true}, ...]}

  ``mig_mode`` null means unsupported; ``duration_s`` (optional) is the loop period.
  A gpu entry may carry ``facts``, NVML's answers to the once-per-GPU hardware queries behind
  the peak figures::

    "facts": {"memory_bus_width_bits": 5120, "max_clocks_mhz": [1980, 2619],
              "cuda_cores": 16896, "compute_capability": [9, 0]}

  (``max_clocks_mhz`` is ``[sm, memory]``; either may be null). A fact that is missing, or a
  trace written before facts existed, answers ``NOT_SUPPORTED`` as NVML does on a GPU without
  it; the peak figures then come from the product table by the GPU's ``name``
  (:mod:`exporter.hardware.gpus`), or are absent for a GPU the table does not know.

  A GPU in MIG mode (``"mig_mode": 1``) lists its MIG devices by slot (the index of
  ``nvmlDeviceGetMigDeviceHandleByIndex``; slots may be sparse)::

    "max_mig_devices": 7,
    "mig_devices": [{"slot": 0, "uuid": "MIG-...", "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                     "gpu_instance_id": 7, "compute_instance_id": 0,
                     "attributes": [16, 1, 1, 9984]}, ...]

  (``attributes``: SMs, GPU instance slices, compute instance slices, memory MiB, as
  ``nvmlDeviceGetAttributes`` answers; optional. ``max_mig_devices`` defaults to the highest
  slot + 1.)

  A gpu entry may carry ``fields``, what ``nvmlDeviceGetFieldValues`` answers for the GPU
  whatever the record (the link counts, and any field a record does not carry), and
  ``fabric``, ``power_profiles`` and ``enforced_power_limit_mw`` (below) for every record that
  does not carry its own::

    "fields": {"nvlink_link_count": 18, "nvlink_state": [1, 1, ...]}

  ``engine_pids`` (optional, top level) lists the host PIDs that were the engine's processes
  where the trace was recorded: in replay they stand for the engine (the recorded processes do
  not exist on the replaying machine), so per-process shares are attributed as they were.

* then one record per read of one GPU, ``t`` seconds after the trace started::

    {"t": 0.0, "gpu": 0, "samples": [[-166667, 87], [0, 91]], "util": [91, 40],
     "memory": [used_bytes, total_bytes], "power_mw": 512000, "energy_mj": 123456789,
     "temp_c": 63, "clocks_mhz": [1980, 2619], "clock_events": 0,
     "pcie_kibps": [tx, rx], "gpm": {"dram_bw_util": 71.5, "sm_util": 88.0, ...},
     "xids": [79], "error": "GPU_IS_LOST", "hang_s": 30}

  ``samples`` are ``[microseconds relative to the trace start, percent]`` as the driver's
  utilisation buffer returned them (the first record may reach back before 0). A missing
  field answers ``NOT_SUPPORTED``, as on a GPU without it (``samples`` and
  ``process_samples``: missing from every record of the device). ``error`` makes every call
  for that GPU fail with that NVML error while the record is current; ``hang_s`` makes the
  first call during the record block that long (a hung driver call); ``xids`` are delivered
  as Xid events.

  Links and power state: ``"fields"`` holds what ``nvmlDeviceGetFieldValues`` answered, by
  the names of :data:`exporter.backends.nvml_api.FIELD_SPECS` (a per-link field is a list by
  link, null where that link does not answer; a record's ``fields`` shadow the header's)::

    "fields": {"nvlink_state": [1, 1], "nvlink_speed_mbps": [26562, 26562],
               "nvlink_raw_tx_kib": 123456, "power_limit_mw": 700000}

  ``"fabric": {"state": 3, "status": 0, "clique_id": 1, "cluster_uuid": "...",
  "health_mask": 682, "health_summary": 1}`` (``nvmlDeviceGetGpuFabricInfoV``; the last two
  optional, as older drivers answer), ``"power_profiles": [6]`` (the enforced workload power
  profiles) and ``"enforced_power_limit_mw"`` (``nvmlDeviceGetEnforcedPowerLimit``, where the
  power-limit field is missing). Counter fields (``*_kib``) keep growing across loops, as
  energy does. NVLink and C2C rates come with the other GPM values (``nvlink_tx_per_sec``,
  ``nvlink_l0_rx_per_sec``, ``c2c_tx_per_sec``: the names of
  :data:`exporter.backends.nvml_api.GPM_NAMES`).

  Per-process fields: ``"processes": [[pid, used_bytes or null], ...]`` (the compute
  processes, host PIDs) and ``"process_samples": [[microseconds, pid, sm_percent,
  memory_percent], ...]`` (the per-process utilisation buffer, timestamps as for ``samples``).

* a record of a MIG device carries ``"mig": <slot>`` beside ``"gpu"``, and what NVML answers
  for a MIG handle: ``memory``, ``gpm`` (the GPU instance's, as ``nvmlGpmMigSampleGet``
  returns it; ``graphics_util`` included), ``processes``. A MIG device's records follow the
  same rules as a GPU's.

Replay runs in real time from :meth:`ReplayApi.init` and loops; counters (sample timestamps,
energy) keep growing across loops as they would on a GPU.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.backends.nvml_api import (
    ERROR_CODES,
    FIELDS_BY_NAME,
    GPM_NAMES,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    UNINITIALIZED,
    ClockKind,
    FabricInfo,
    FieldKey,
    MigAttributes,
    NvmlError,
    PcieDirection,
    ProcessMemory,
    ProcessSample,
    XidEvent,
)
from exporter.hardware.gpus import GpuFacts

TRACE_FORMAT = "inference-bottleneck-exporter/nvml-trace"
TRACE_VERSION = 1
# The driver's utilisation buffer is finite; a reader that falls far behind loses samples.
MAX_BUFFERED_SAMPLES = 1000


class TraceError(ValueError):
    """The trace file is malformed; the message names the line and the problem."""


@dataclass(frozen=True)
class TraceMig:
    """A MIG device in a trace header."""

    slot: int
    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    attributes: MigAttributes | None = None


@dataclass(frozen=True)
class TraceGpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    mig_mode: int | None
    gpm: bool
    facts: GpuFacts = field(default_factory=GpuFacts)
    mig_devices: tuple[TraceMig, ...] = ()
    max_mig_devices: int = 0
    # What nvmlDeviceGetFieldValues answers where a record does not say (link counts), by
    # field name, and the fabric, power profiles, enforced power limit likewise.
    fields: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MigHandle:
    """A replayed MIG device handle."""

    gpu: int
    slot: int


# A device of the trace: (GPU index, MIG slot or None for the GPU itself).
DeviceKey = tuple[int, int | None]


def mig_to_json(mig: TraceMig) -> dict[str, Any]:
    """A ``mig_devices`` entry."""
    out: dict[str, Any] = {
        "slot": mig.slot,
        "uuid": mig.uuid,
        "name": mig.name,
        "gpu_instance_id": mig.gpu_instance_id,
        "compute_instance_id": mig.compute_instance_id,
    }
    a = mig.attributes
    if a is not None:
        out["attributes"] = [
            a.multiprocessor_count,
            a.gpu_instance_slice_count,
            a.compute_instance_slice_count,
            a.memory_size_mib,
        ]
    return out


def facts_to_json(facts: GpuFacts) -> dict[str, Any]:
    """A gpu entry's ``facts`` object (only what NVML answered)."""
    out: dict[str, Any] = {}
    if facts.memory_bus_width_bits is not None:
        out["memory_bus_width_bits"] = facts.memory_bus_width_bits
    if facts.max_sm_clock_mhz is not None or facts.max_memory_clock_mhz is not None:
        out["max_clocks_mhz"] = [facts.max_sm_clock_mhz, facts.max_memory_clock_mhz]
    if facts.cuda_cores is not None:
        out["cuda_cores"] = facts.cuda_cores
    if facts.compute_capability is not None:
        out["compute_capability"] = list(facts.compute_capability)
    return out


def _positive(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer or null, got {value!r}")
    return value


def _parse_facts(raw: Any) -> GpuFacts:
    if raw is None:
        return GpuFacts()
    if not isinstance(raw, dict):
        raise ValueError("'facts' must be an object")
    unknown = set(raw) - {
        "memory_bus_width_bits",
        "max_clocks_mhz",
        "cuda_cores",
        "compute_capability",
    }
    if unknown:
        raise ValueError(f"unknown facts {sorted(unknown)}")
    clocks = raw.get("max_clocks_mhz", [None, None])
    if not isinstance(clocks, list) or len(clocks) != 2:
        raise ValueError("'max_clocks_mhz' must be [sm, memory]")
    cc = raw.get("compute_capability")
    if cc is not None and (
        not isinstance(cc, list)
        or len(cc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc)
    ):
        raise ValueError("'compute_capability' must be [major, minor]")
    return GpuFacts(
        memory_bus_width_bits=_positive(raw.get("memory_bus_width_bits"), "memory_bus_width_bits"),
        max_sm_clock_mhz=_positive(clocks[0], "max_clocks_mhz[0]"),
        max_memory_clock_mhz=_positive(clocks[1], "max_clocks_mhz[1]"),
        cuda_cores=_positive(raw.get("cuda_cores"), "cuda_cores"),
        compute_capability=None if cc is None else (cc[0], cc[1]),
    )


@dataclass
class TraceRecord:
    t: float
    gpu: int
    samples: list[tuple[int, float]]
    values: dict[str, Any]
    xids: list[int] = field(default_factory=list)
    error: int | None = None
    hang_s: float = 0.0
    mig: int | None = None
    # (timestamp µs relative to the trace start, pid, sm %, memory %)
    process_samples: list[tuple[int, int, int, int]] = field(default_factory=list)
    # The sample buffers the record carries ("samples", "process_samples"): a device whose
    # records never carry one answers NOT_SUPPORTED for it.
    buffers: frozenset[str] = frozenset({"samples"})

    @property
    def key(self) -> DeviceKey:
        return (self.gpu, self.mig)


@dataclass
class Trace:
    header: dict[str, Any]
    gpus: list[TraceGpu]
    records: dict[int, list[TraceRecord]]
    duration_s: float
    mig_records: dict[tuple[int, int], list[TraceRecord]] = field(default_factory=dict)
    engine_pids: frozenset[int] | None = None

    @property
    def driver_version(self) -> str:
        return str(self.header.get("driver_version", "unknown"))

    def series(self) -> dict[DeviceKey, list[TraceRecord]]:
        """Every device's records: GPUs, then MIG devices."""
        out: dict[DeviceKey, list[TraceRecord]] = {(g, None): r for g, r in self.records.items()}
        out.update(self.mig_records.items())
        return out


def _expect(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise TraceError(f"{where}: {problem}")


def _parse_mig(raw: Any) -> TraceMig:
    if not isinstance(raw, dict):
        raise ValueError("each mig_devices entry must be an object")
    attrs = raw.get("attributes")
    attributes = None
    if attrs is not None:
        if not isinstance(attrs, list) or len(attrs) != 4:
            raise ValueError("'attributes' must be [sms, gi slices, ci slices, memory MiB]")
        sms, gi, ci, memory = (int(v) for v in attrs)
        attributes = MigAttributes(sms, gi, ci, memory)
    slot = int(raw["slot"])
    if slot < 0:
        raise ValueError(f"slot must be >= 0, got {slot}")
    return TraceMig(
        slot=slot,
        uuid=str(raw["uuid"]),
        name=str(raw["name"]),
        gpu_instance_id=int(raw["gpu_instance_id"]),
        compute_instance_id=int(raw.get("compute_instance_id", 0)),
        attributes=attributes,
    )


def _parse_gpu(where: str, raw: Any) -> TraceGpu:
    _expect(isinstance(raw, dict), where, "each header gpu must be an object")
    try:
        mig = raw.get("mig_mode")
        migs = tuple(_parse_mig(m) for m in raw.get("mig_devices", []))
        slots = [m.slot for m in migs]
        if len(set(slots)) != len(slots):
            raise ValueError("mig_devices slots must be unique")
        if migs and mig != 1:
            raise ValueError("mig_devices need 'mig_mode': 1")
        most = int(raw.get("max_mig_devices", max(slots, default=-1) + 1))
        if slots and max(slots) >= most:
            raise ValueError("a mig_devices slot is not below max_mig_devices")
        return TraceGpu(
            index=int(raw["index"]),
            uuid=str(raw["uuid"]),
            name=str(raw["name"]),
            pci_bus_id=str(raw.get("pci_bus_id", "")),
            mig_mode=None if mig is None else int(mig),
            gpm=bool(raw.get("gpm", False)),
            facts=_parse_facts(raw.get("facts")),
            fields=_parse_fields(raw.get("fields")),
            constants=_parse_constants(where, raw),
            mig_devices=tuple(sorted(migs, key=lambda m: m.slot)),
            max_mig_devices=most,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(f"{where}: bad gpu entry ({err})") from None


_RECORD_KEYS = {"t", "gpu", "mig", "samples", "process_samples", "xids", "error", "hang_s"}
_FABRIC_KEYS = {"state", "status", "clique_id", "cluster_uuid", "health_mask", "health_summary"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_fields(raw: Any) -> dict[str, Any]:
    """A ``fields`` object: known names, a list by link for per-link fields, else a number
    (null: not answered)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError("'fields' must be an object")
    unknown = set(raw) - set(FIELDS_BY_NAME)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    for name, value in raw.items():
        if FIELDS_BY_NAME[name].per_link:
            ok = isinstance(value, list) and all(v is None or _number(v) for v in value)
            if not ok:
                raise ValueError(f"field {name!r} must be a list of numbers by link")
        elif value is not None and not _number(value):
            raise ValueError(f"field {name!r} must be a number")
    return dict(raw)


# Answers a header gpu entry may give for every record that does not carry its own.
_CONSTANTS = ("fabric", "power_profiles", "enforced_power_limit_mw")


def _parse_constants(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    constants = {k: raw[k] for k in _CONSTANTS if raw.get(k) is not None}
    _parse_link_state(where, constants)
    return constants


def _parse_link_state(where: str, raw: dict[str, Any]) -> None:
    """Check a record's fields, fabric, power profiles and enforced power limit."""
    try:
        _parse_fields(raw.get("fields"))
    except ValueError as err:
        raise TraceError(f"{where}: {err}") from None
    fabric = raw.get("fabric")
    if fabric is not None:
        ok = (
            isinstance(fabric, dict)
            and set(fabric) <= _FABRIC_KEYS
            and {"state", "status", "clique_id", "cluster_uuid"} <= set(fabric)
            and isinstance(fabric["cluster_uuid"], str)
            and all(
                isinstance(v, int) and not isinstance(v, bool)
                for k, v in fabric.items()
                if k != "cluster_uuid" and v is not None
            )
        )
        _expect(ok, where, "'fabric' must be {state, status, clique_id, cluster_uuid, ...}")
    profiles = raw.get("power_profiles")
    _expect(
        profiles is None
        or (isinstance(profiles, list) and all(isinstance(p, int) and p >= 0 for p in profiles)),
        where,
        "'power_profiles' must be a list of profile ids",
    )
    limit = raw.get("enforced_power_limit_mw")
    _expect(limit is None or _number(limit), where, "'enforced_power_limit_mw' must be a number")


def _parse_processes(where: str, raw: dict[str, Any]) -> None:
    procs = raw.get("processes")
    if procs is None:
        return
    ok = isinstance(procs, list) and all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], int)
        and (p[1] is None or isinstance(p[1], int))
        for p in procs
    )
    _expect(ok, where, "'processes' must be [[pid, used_bytes or null], ...]")


def _parse_process_samples(where: str, raw: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    try:
        return [
            (int(ts), int(pid), int(sm), int(mem))
            for ts, pid, sm, mem in raw.get("process_samples", [])
        ]
    except (TypeError, ValueError) as err:
        raise TraceError(
            f"{where}: 'process_samples' must be [[timestamp_us, pid, sm, memory], ...] ({err})"
        ) from None


def _parse_record(where: str, raw: Any, devices: set[DeviceKey]) -> TraceRecord:
    _expect(isinstance(raw, dict), where, "a record must be a JSON object")
    try:
        t = float(raw["t"])
        gpu = int(raw["gpu"])
        mig = None if raw.get("mig") is None else int(raw["mig"])
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(f"{where}: record needs numeric 't' and 'gpu' ({err})") from None
    _expect(math.isfinite(t) and t >= 0, where, f"'t' must be a finite number >= 0, got {t}")
    _expect((gpu, None) in devices, where, f"gpu {gpu} is not in the header")
    _expect((gpu, mig) in devices, where, f"gpu {gpu} has no MIG device in slot {mig}")
    try:
        samples = [(int(ts), float(v)) for ts, v in raw.get("samples", [])]
    except (TypeError, ValueError) as err:
        raise TraceError(
            f"{where}: 'samples' must be [[timestamp_us, percent], ...] ({err})"
        ) from None
    error: int | None = None
    if raw.get("error") is not None:
        name = str(raw["error"])
        _expect(name in ERROR_CODES, where, f"unknown NVML error name {name!r}")
        error = ERROR_CODES[name]
    gpm = raw.get("gpm", {})
    _expect(isinstance(gpm, dict), where, "'gpm' must be an object")
    unknown = set(gpm) - set(GPM_NAMES.values())
    _expect(not unknown, where, f"unknown GPM metrics {sorted(unknown)}")
    _parse_processes(where, raw)
    _parse_link_state(where, raw)
    process_samples = _parse_process_samples(where, raw)
    values = {k: v for k, v in raw.items() if k not in _RECORD_KEYS}
    try:
        xids = [int(x) for x in raw.get("xids", [])]
        hang_s = float(raw.get("hang_s", 0.0))
    except (TypeError, ValueError) as err:
        raise TraceError(
            f"{where}: 'xids' must be a list of integers, 'hang_s' a number ({err})"
        ) from None
    _expect(math.isfinite(hang_s) and hang_s >= 0, where, "'hang_s' must be >= 0")
    _expect(mig is None or not xids, where, "Xids belong to the GPU's records, not a MIG device's")
    return TraceRecord(
        t=t,
        gpu=gpu,
        samples=samples,
        values=values,
        xids=xids,
        error=error,
        hang_s=hang_s,
        mig=mig,
        process_samples=process_samples,
        buffers=frozenset(k for k in ("samples", "process_samples") if k in raw),
    )


def parse_trace(lines: Sequence[str], source: str = "trace") -> Trace:
    """Parse and validate a trace; raises :class:`TraceError` naming the first bad line."""
    rows = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    _expect(bool(rows), source, "empty trace")
    parsed: list[tuple[str, Any]] = []
    for n, line in rows:
        where = f"{source}:{n}"
        try:
            parsed.append((where, json.loads(line)))
        except json.JSONDecodeError as err:
            raise TraceError(f"{where}: not JSON ({err.msg})") from None
    where, header = parsed[0]
    _expect(
        isinstance(header, dict) and header.get("format") == TRACE_FORMAT,
        where,
        f"the first line must be a header with format {TRACE_FORMAT!r}",
    )
    _expect(
        header.get("version") == TRACE_VERSION,
        where,
        f"unsupported version {header.get('version')!r}",
    )
    raw_gpus = header.get("gpus")
    _expect(isinstance(raw_gpus, list) and bool(raw_gpus), where, "header needs a non-empty 'gpus'")
    gpus = [_parse_gpu(where, g) for g in raw_gpus]
    _expect([g.index for g in gpus] == list(range(len(gpus))), where, "gpu indexes must be 0..n-1")
    series: dict[DeviceKey, list[TraceRecord]] = {(g.index, None): [] for g in gpus}
    series.update({(g.index, m.slot): [] for g in gpus for m in g.mig_devices})
    for rec_where, raw in parsed[1:]:
        rec = _parse_record(rec_where, raw, set(series))
        previous = series[rec.key]
        what = f"gpu {rec.gpu}" if rec.mig is None else f"MIG device {rec.gpu}:{rec.mig}"
        _expect(not previous or rec.t > previous[-1].t, rec_where, f"'t' of {what} must increase")
        previous.append(rec)
    for (index, slot), recs in series.items():
        what = f"gpu {index}" if slot is None else f"MIG device {index}:{slot}"
        _expect(bool(recs), source, f"{what} has no records")
    engine_pids = header.get("engine_pids")
    _expect(
        engine_pids is None
        or (isinstance(engine_pids, list) and all(isinstance(p, int) for p in engine_pids)),
        where,
        "'engine_pids' must be a list of PIDs",
    )
    records = {g: recs for (g, slot), recs in series.items() if slot is None}
    mig_records = {(g, slot): recs for (g, slot), recs in series.items() if slot is not None}
    duration = header.get("duration_s")
    if duration is None:
        last = max(recs[-1].t for recs in series.values())
        spacing = [
            (recs[-1].t - recs[0].t) / (len(recs) - 1) for recs in series.values() if len(recs) > 1
        ]
        duration = last + (min(spacing) if spacing else 1.0)
    try:
        duration = float(duration)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: 'duration_s' must be a number") from None
    _expect(
        duration > max(r[-1].t for r in series.values()),
        where,
        "duration_s must be after the last record",
    )
    return Trace(
        header=header,
        gpus=gpus,
        records=records,
        duration_s=duration,
        mig_records=mig_records,
        engine_pids=None if engine_pids is None else frozenset(engine_pids),
    )


def _field_of(fields: dict[str, Any], name: str, link: int | None) -> float | None:
    """A field's value in a ``fields`` object: a per-link field's entry for ``link``."""
    value = fields.get(name)
    if isinstance(value, list):
        if link is None or not 0 <= link < len(value):
            return None
        value = value[link]
    return None if value is None else float(value)


def _field_steps(recs: list[TraceRecord]) -> dict[tuple[str, int | None], float]:
    """How much each counter field grows per loop of the trace (as energy does): its rise over
    the trace and one mean step more."""
    series: dict[tuple[str, int | None], list[float]] = {}
    for rec in recs:
        for name, value in (rec.values.get("fields") or {}).items():
            if not FIELDS_BY_NAME[name].counter:
                continue
            entries = enumerate(value) if isinstance(value, list) else [(None, value)]
            for link, v in entries:
                if v is not None:
                    series.setdefault((name, link), []).append(float(v))
    return {
        key: values[-1] - values[0] + (values[-1] - values[0]) / (len(values) - 1)
        for key, values in series.items()
        if len(values) >= 2
    }


def load_trace(path: Path) -> Trace:
    """Read a trace file; raises :class:`TraceError` (also for unreadable files)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(f"{path}: cannot read ({err})") from None
    return parse_trace(text.splitlines(), str(path))


class ReplayApi:
    """:class:`~exporter.backends.nvml_api.NvmlApi` answering from a :class:`Trace`.

    ``clock`` (monotonic seconds) and ``wall_us`` (epoch microseconds) are injectable so tests
    step time deterministically. GPU handles are the GPU's index, MIG device handles
    :class:`MigHandle`.
    """

    def __init__(
        self,
        trace: Trace,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self.trace = trace
        self._clock = clock
        self._wall_us = wall_us
        self._start = 0.0
        self._base_us = 0
        self._initialised = False
        self._closed = threading.Event()
        self._hung: set[tuple[DeviceKey, int, int]] = set()
        self._xid_cursor = 0.0
        self._series = trace.series()
        self._times = {k: [r.t for r in recs] for k, recs in self._series.items()}
        self._buffers = {
            k: frozenset().union(*(r.buffers for r in recs)) for k, recs in self._series.items()
        }
        self._energy_step = {g: self._energy_per_loop(recs) for g, recs in trace.records.items()}
        self._field_step = {
            (g, name, link): step
            for g, recs in trace.records.items()
            for (name, link), step in _field_steps(recs).items()
        }
        self._xid_times = sorted({r.t for recs in trace.records.values() for r in recs if r.xids})
        self._migs = {(g.index, m.slot): m for g in trace.gpus for m in g.mig_devices}

    def _energy_per_loop(self, recs: list[TraceRecord]) -> int:
        energies = [r.values["energy_mj"] for r in recs if "energy_mj" in r.values]
        if len(energies) < 2:
            return 0
        per_record = (energies[-1] - energies[0]) / (len(energies) - 1)
        return int(energies[-1] - energies[0] + per_record)

    # --- time ----------------------------------------------------------------------------
    def elapsed(self) -> float:
        return max(0.0, self._clock() - self._start)

    def _position(self) -> tuple[int, float]:
        loop, pos = divmod(self.elapsed(), self.trace.duration_s)
        return int(loop), pos

    def _current(
        self, key: DeviceKey, position: tuple[int, float] | None = None
    ) -> tuple[int, int, TraceRecord]:
        loop, pos = position or self._position()
        times = self._times[key]
        i = bisect.bisect_right(times, pos) - 1
        if i < 0:  # before the device's first record in this loop: the previous loop's last
            if loop == 0:
                i = 0
            else:
                loop, i = loop - 1, len(times) - 1
        return loop, i, self._series[key][i]

    # --- API -------------------------------------------------------------------------------
    def init(self) -> None:
        self._start = self._clock()
        self._base_us = self._wall_us()
        self._initialised = True
        self._closed.clear()

    def shutdown(self) -> None:
        self._initialised = False
        self._closed.set()

    def _check(self) -> None:
        if not self._initialised:
            raise NvmlError(UNINITIALIZED)

    def driver_version(self) -> str:
        self._check()
        return self.trace.driver_version

    def device_count(self) -> int:
        self._check()
        return len(self.trace.gpus)

    def handle(self, index: int) -> object:
        self._check()
        if not 0 <= index < len(self.trace.gpus):
            raise NvmlError(INVALID_ARGUMENT)
        return index

    def _key(self, handle: object) -> DeviceKey:
        self._check()
        if isinstance(handle, MigHandle):
            if (handle.gpu, handle.slot) not in self._migs:
                raise NvmlError(INVALID_ARGUMENT)
            return (handle.gpu, handle.slot)
        if not isinstance(handle, int) or not 0 <= handle < len(self.trace.gpus):
            raise NvmlError(INVALID_ARGUMENT)
        return (handle, None)

    def _gpu(self, handle: object) -> TraceGpu:
        """The GPU of a GPU handle; ``NOT_SUPPORTED`` for a MIG handle (GPU-level queries)."""
        gpu, slot = self._key(handle)
        if slot is not None:
            raise NvmlError(NOT_SUPPORTED)
        return self.trace.gpus[gpu]

    def _mig(self, handle: object) -> TraceMig:
        gpu, slot = self._key(handle)
        if slot is None:
            raise NvmlError(NOT_SUPPORTED)  # these answer for MIG device handles only
        return self._migs[(gpu, slot)]

    def _record(self, handle: object, position: tuple[int, float] | None = None) -> TraceRecord:
        key = self._key(handle)
        loop, i, rec = self._current(key, position)
        if rec.hang_s > 0 and (key, loop, i) not in self._hung:
            self._hung.add((key, loop, i))
            self._closed.wait(rec.hang_s)
            self._check()
        if rec.error is not None:
            raise NvmlError(rec.error)
        return rec

    def _value(self, handle: object, key: str, position: tuple[int, float] | None = None) -> Any:
        rec = self._record(handle, position)
        value = rec.values.get(key)
        if value is None and rec.mig is None:
            value = self.trace.gpus[rec.gpu].constants.get(key)
        if value is None:
            raise NvmlError(NOT_SUPPORTED)
        return value

    def uuid(self, handle: object) -> str:
        gpu, slot = self._key(handle)
        return self.trace.gpus[gpu].uuid if slot is None else self._migs[(gpu, slot)].uuid

    def name(self, handle: object) -> str:
        gpu, slot = self._key(handle)
        return self.trace.gpus[gpu].name if slot is None else self._migs[(gpu, slot)].name

    def pci_bus_id(self, handle: object) -> str:
        return self.trace.gpus[self._key(handle)[0]].pci_bus_id

    def mig_mode(self, handle: object) -> int:
        mode = self._gpu(handle).mig_mode
        if mode is None:
            raise NvmlError(NOT_SUPPORTED)
        return mode

    @staticmethod
    def _fact(value: Any) -> Any:
        if value is None:
            raise NvmlError(NOT_SUPPORTED)
        return value

    def memory_bus_width_bits(self, handle: object) -> int:
        return int(self._fact(self._gpu(handle).facts.memory_bus_width_bits))

    def max_clock_mhz(self, handle: object, kind: ClockKind) -> int:
        facts = self._gpu(handle).facts
        return int(
            self._fact(facts.max_sm_clock_mhz if kind == "sm" else facts.max_memory_clock_mhz)
        )

    def cuda_cores(self, handle: object) -> int:
        return int(self._fact(self._gpu(handle).facts.cuda_cores))

    def compute_capability(self, handle: object) -> tuple[int, int]:
        major, minor = self._fact(self._gpu(handle).facts.compute_capability)
        return int(major), int(minor)

    def _buffered(self, handle: object, buffer: str, last_seen_us: int) -> list[tuple[int, Any]]:
        """Entries of a driver sample buffer (``samples`` or ``process_samples``) newer than
        ``last_seen_us``, as ``(epoch µs, payload)``, oldest first."""
        loop, pos = position = self._position()
        key = self._key(handle)
        if buffer not in self._buffers[key]:
            self._record(handle, position)  # errors and hangs first, as NVML would
            raise NvmlError(NOT_SUPPORTED)
        self._record(handle, position)
        records = self._series[key]
        # Samples between the last record and the loop's end live, as on the driver, in the
        # buffer read at t=0: in later loops its newest part stands for that stretch.
        gap_us = int((self.trace.duration_s - self._times[key][-1]) * 1e6)
        now_rel_us = int(pos * 1e6)
        period_us = int(self.trace.duration_s * 1e6)
        out: list[tuple[int, Any]] = []
        first_loop = max(0, (last_seen_us - self._base_us) // period_us) if period_us else 0
        for j in range(max(first_loop, loop - 1), loop + 1):
            offset = self._base_us + j * period_us
            for r in records:
                entries: list[tuple[int, Any]] = (
                    [(rel, value) for rel, value in r.samples]
                    if buffer == "samples"
                    else [(ts, (pid, sm, mem)) for ts, pid, sm, mem in r.process_samples]
                )
                for rel, payload in entries:
                    if j > 0 and rel <= -gap_us:
                        continue  # the rest of the pre-start buffer exists only once
                    if j == loop and rel > now_rel_us:
                        continue
                    ts = offset + rel
                    if ts > last_seen_us:
                        out.append((ts, payload))
        out.sort(key=lambda e: e[0])
        return out[-MAX_BUFFERED_SAMPLES:]

    def utilization_samples(self, handle: object, last_seen_us: int) -> list[tuple[int, float]]:
        return [(ts, float(v)) for ts, v in self._buffered(handle, "samples", last_seen_us)]

    def utilization_rates(self, handle: object) -> tuple[int, int]:
        gpu_pct, mem_pct = self._value(handle, "util")
        return int(gpu_pct), int(mem_pct)

    def memory_info(self, handle: object) -> tuple[int, int]:
        used, total = self._value(handle, "memory")
        return int(used), int(total)

    def power_usage_mw(self, handle: object) -> int:
        return int(self._value(handle, "power_mw"))

    def total_energy_mj(self, handle: object) -> int:
        key = self._key(handle)
        position = self._position()
        loop, _, _ = self._current(key, position)
        value = int(self._value(handle, "energy_mj", position))
        if key[1] is not None:
            return value
        # The loop of the record read, so the counter never steps back at a loop boundary.
        return value + loop * self._energy_step[key[0]]

    def temperature_c(self, handle: object) -> int:
        return int(self._value(handle, "temp_c"))

    def clock_mhz(self, handle: object, kind: ClockKind) -> int:
        sm, mem = self._value(handle, "clocks_mhz")
        return int(sm if kind == "sm" else mem)

    def clock_event_reasons(self, handle: object) -> int:
        return int(self._value(handle, "clock_events"))

    def pcie_throughput_kibps(self, handle: object, direction: PcieDirection) -> int:
        tx, rx = self._value(handle, "pcie_kibps")
        return int(tx if direction == "tx" else rx)

    def field_values(
        self, handle: object, keys: Sequence[FieldKey]
    ) -> dict[FieldKey, float | NvmlError]:
        gpu = self._gpu(handle)
        position = self._position()
        loop, _, _ = self._current((gpu.index, None), position)
        recorded: dict[str, Any] = {}
        if not all(FIELDS_BY_NAME[name].identity for name, _ in keys):
            # Identity fields are the header's: asked while the session opens, before any read.
            recorded = self._record(handle, position).values.get("fields") or {}
        out: dict[FieldKey, float | NvmlError] = {}
        for name, link in keys:
            value = _field_of(recorded, name, link)
            if value is None:
                value = _field_of(gpu.fields, name, link)
            if value is None:
                out[(name, link)] = NvmlError(NOT_SUPPORTED)
                continue
            if FIELDS_BY_NAME[name].counter:
                value += loop * self._field_step.get((gpu.index, name, link), 0.0)
            out[(name, link)] = float(value)
        return out

    def fabric_info(self, handle: object) -> FabricInfo:
        self._gpu(handle)
        raw = self._value(handle, "fabric")
        return FabricInfo(
            state=int(raw["state"]),
            status=int(raw["status"]),
            clique_id=int(raw["clique_id"]),
            cluster_uuid=str(raw["cluster_uuid"]),
            health_mask=raw.get("health_mask"),
            health_summary=raw.get("health_summary"),
        )

    def enforced_power_limit_mw(self, handle: object) -> int:
        self._gpu(handle)
        return int(self._value(handle, "enforced_power_limit_mw"))

    def power_profiles(self, handle: object) -> frozenset[int]:
        self._gpu(handle)
        return frozenset(int(p) for p in self._value(handle, "power_profiles"))

    def gpm_supported(self, handle: object) -> bool:
        return self._gpu(handle).gpm

    def gpm_sample(self, handle: object) -> object:
        gpu = self._gpu(handle)
        if not gpu.gpm:
            raise NvmlError(NOT_SUPPORTED)
        self._record(handle)
        return (gpu.index, self.elapsed())

    def gpm_metrics(
        self, older: object, newer: object, metric_ids: Sequence[int]
    ) -> dict[int, float | None]:
        if not isinstance(newer, tuple):
            raise NvmlError(INVALID_ARGUMENT)
        handle = newer[0] if len(newer) == 2 else MigHandle(newer[0], newer[2])
        rec = self._record(handle)
        gpm = rec.values.get("gpm", {})
        return {
            m: (float(gpm[GPM_NAMES[m]]) if GPM_NAMES.get(m) in gpm else None) for m in metric_ids
        }

    def gpm_free(self, sample: object) -> None:
        return None

    # --- MIG -------------------------------------------------------------------------------
    def mig_device_count(self, handle: object) -> int:
        gpu = self._gpu(handle)
        return gpu.max_mig_devices if gpu.mig_mode == 1 else 0

    def mig_device_handle(self, handle: object, index: int) -> object:
        gpu = self._gpu(handle)
        if gpu.mig_mode != 1 or not 0 <= index < gpu.max_mig_devices:
            raise NvmlError(INVALID_ARGUMENT)
        if (gpu.index, index) not in self._migs:
            raise NvmlError(NOT_FOUND)  # an empty slot
        return MigHandle(gpu.index, index)

    def gpu_instance_id(self, mig: object) -> int:
        return self._mig(mig).gpu_instance_id

    def compute_instance_id(self, mig: object) -> int:
        return self._mig(mig).compute_instance_id

    def mig_attributes(self, mig: object) -> MigAttributes:
        attributes = self._mig(mig).attributes
        if attributes is None:
            raise NvmlError(NOT_SUPPORTED)
        return attributes

    def gpm_mig_sample(self, handle: object, gpu_instance_id: int) -> object:
        gpu = self._gpu(handle)
        if not gpu.gpm:
            raise NvmlError(NOT_SUPPORTED)
        # GPU-instance level: every MIG device of the instance carries the same values; the
        # first one's records answer.
        slots = [m.slot for m in gpu.mig_devices if m.gpu_instance_id == gpu_instance_id]
        if not slots:
            raise NvmlError(NOT_FOUND)
        self._record(MigHandle(gpu.index, slots[0]))
        return (gpu.index, self.elapsed(), slots[0])

    # --- processes -------------------------------------------------------------------------
    def compute_processes(self, handle: object) -> list[ProcessMemory]:
        return [
            ProcessMemory(pid=int(pid), used_bytes=None if used is None else int(used))
            for pid, used in self._value(handle, "processes")
        ]

    def process_utilization(self, handle: object, last_seen_us: int) -> list[ProcessSample]:
        return [
            ProcessSample(pid=pid, timestamp_us=ts, sm_pct=sm, mem_pct=mem)
            for ts, (pid, sm, mem) in self._buffered(handle, "process_samples", last_seen_us)
        ]

    def register_xid_events(self, handles: Sequence[object]) -> None:
        self._check()
        # Registered during the first loop: deliver the trace's Xids from its very start.
        now = self.elapsed()
        self._xid_cursor = -1.0 if now < self.trace.duration_s else now

    def wait_xid_events(self, timeout_ms: int) -> list[XidEvent]:
        self._check()
        # The wait itself is real time, whatever clock drives the trace.
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            events = self._due_xids()
            if events or self._closed.is_set():
                return events
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._closed.wait(min(remaining, self._until_next_xid()))

    def _until_next_xid(self) -> float:
        """Seconds until the next Xid in the trace; with an injected clock, poll at 0.1 s."""
        if not self._xid_times:
            return float("inf")
        if self._clock is not time.monotonic:
            return 0.1
        _, pos = self._position()
        i = bisect.bisect_right(self._xid_times, pos)
        due = (
            self._xid_times[i]
            if i < len(self._xid_times)
            else self._xid_times[0] + (self.trace.duration_s)
        )
        return max(0.001, due - pos)

    def _due_xids(self) -> list[XidEvent]:
        now = self.elapsed()
        since, self._xid_cursor = self._xid_cursor, now
        period = self.trace.duration_s
        events: list[XidEvent] = []
        for loop in range(int(since // period), int(now // period) + 1):
            for recs in self.trace.records.values():
                for rec in recs:
                    at = loop * period + rec.t
                    if since < at <= now:
                        events.extend(XidEvent(rec.gpu, xid) for xid in rec.xids)
        return events
