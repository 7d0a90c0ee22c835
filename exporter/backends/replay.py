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

* then one record per read of one GPU, ``t`` seconds after the trace started::

    {"t": 0.0, "gpu": 0, "samples": [[-166667, 87], [0, 91]], "util": [91, 40],
     "memory": [used_bytes, total_bytes], "power_mw": 512000, "energy_mj": 123456789,
     "temp_c": 63, "clocks_mhz": [1980, 2619], "clock_events": 0,
     "pcie_kibps": [tx, rx], "gpm": {"dram_bw_util": 71.5, "sm_util": 88.0, ...},
     "xids": [79], "error": "GPU_IS_LOST", "hang_s": 30}

  ``samples`` are ``[microseconds relative to the trace start, percent]`` as the driver's
  utilisation buffer returned them (the first record may reach back before 0). A missing
  field answers ``NOT_SUPPORTED``, as on a GPU without it. ``error`` makes every call for that
  GPU fail with that NVML error while the record is current; ``hang_s`` makes the first call
  during the record block that long (a hung driver call); ``xids`` are delivered as Xid events.

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
    GPM_NAMES,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    UNINITIALIZED,
    ClockKind,
    NvmlError,
    PcieDirection,
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
class TraceGpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    mig_mode: int | None
    gpm: bool
    facts: GpuFacts = field(default_factory=GpuFacts)


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


@dataclass
class Trace:
    header: dict[str, Any]
    gpus: list[TraceGpu]
    records: dict[int, list[TraceRecord]]
    duration_s: float

    @property
    def driver_version(self) -> str:
        return str(self.header.get("driver_version", "unknown"))


def _expect(cond: bool, where: str, problem: str) -> None:
    if not cond:
        raise TraceError(f"{where}: {problem}")


def _parse_gpu(where: str, raw: Any) -> TraceGpu:
    _expect(isinstance(raw, dict), where, "each header gpu must be an object")
    try:
        mig = raw.get("mig_mode")
        return TraceGpu(
            index=int(raw["index"]),
            uuid=str(raw["uuid"]),
            name=str(raw["name"]),
            pci_bus_id=str(raw.get("pci_bus_id", "")),
            mig_mode=None if mig is None else int(mig),
            gpm=bool(raw.get("gpm", False)),
            facts=_parse_facts(raw.get("facts")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(f"{where}: bad gpu entry ({err})") from None


def _parse_record(where: str, raw: Any, gpus: set[int]) -> TraceRecord:
    _expect(isinstance(raw, dict), where, "a record must be a JSON object")
    try:
        t = float(raw["t"])
        gpu = int(raw["gpu"])
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(f"{where}: record needs numeric 't' and 'gpu' ({err})") from None
    _expect(math.isfinite(t) and t >= 0, where, f"'t' must be a finite number >= 0, got {t}")
    _expect(gpu in gpus, where, f"gpu {gpu} is not in the header")
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
    values = {
        k: v for k, v in raw.items() if k not in {"t", "gpu", "samples", "xids", "error", "hang_s"}
    }
    try:
        xids = [int(x) for x in raw.get("xids", [])]
        hang_s = float(raw.get("hang_s", 0.0))
    except (TypeError, ValueError) as err:
        raise TraceError(
            f"{where}: 'xids' must be a list of integers, 'hang_s' a number ({err})"
        ) from None
    _expect(math.isfinite(hang_s) and hang_s >= 0, where, "'hang_s' must be >= 0")
    return TraceRecord(
        t=t, gpu=gpu, samples=samples, values=values, xids=xids, error=error, hang_s=hang_s
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
    records: dict[int, list[TraceRecord]] = {g.index: [] for g in gpus}
    for rec_where, raw in parsed[1:]:
        rec = _parse_record(rec_where, raw, set(records))
        previous = records[rec.gpu]
        _expect(
            not previous or rec.t > previous[-1].t,
            rec_where,
            f"'t' of gpu {rec.gpu} must increase",
        )
        previous.append(rec)
    for index, recs in records.items():
        _expect(bool(recs), source, f"gpu {index} has no records")
    duration = header.get("duration_s")
    if duration is None:
        last = max(recs[-1].t for recs in records.values())
        spacing = [
            (recs[-1].t - recs[0].t) / (len(recs) - 1) for recs in records.values() if len(recs) > 1
        ]
        duration = last + (min(spacing) if spacing else 1.0)
    try:
        duration = float(duration)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: 'duration_s' must be a number") from None
    _expect(
        duration > max(r[-1].t for r in records.values()),
        where,
        "duration_s must be after the last record",
    )
    return Trace(header=header, gpus=gpus, records=records, duration_s=duration)


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
    step time deterministically.
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
        self._hung: set[tuple[int, int, int]] = set()
        self._xid_cursor = 0.0
        self._times = {g: [r.t for r in recs] for g, recs in trace.records.items()}
        self._energy_step = {g: self._energy_per_loop(recs) for g, recs in trace.records.items()}
        self._xid_times = sorted({r.t for recs in trace.records.values() for r in recs if r.xids})

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
        self, gpu: int, position: tuple[int, float] | None = None
    ) -> tuple[int, int, TraceRecord]:
        loop, pos = position or self._position()
        i = bisect.bisect_right(self._times[gpu], pos) - 1
        if i < 0:  # before the GPU's first record in this loop: the previous loop's last
            if loop == 0:
                i = 0
            else:
                loop, i = loop - 1, len(self._times[gpu]) - 1
        return loop, i, self.trace.records[gpu][i]

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

    def _gpu(self, handle: object) -> TraceGpu:
        self._check()
        if not isinstance(handle, int) or not 0 <= handle < len(self.trace.gpus):
            raise NvmlError(INVALID_ARGUMENT)
        return self.trace.gpus[handle]

    def _record(self, handle: object, position: tuple[int, float] | None = None) -> TraceRecord:
        gpu = self._gpu(handle).index
        loop, i, rec = self._current(gpu, position)
        if rec.hang_s > 0 and (gpu, loop, i) not in self._hung:
            self._hung.add((gpu, loop, i))
            self._closed.wait(rec.hang_s)
            self._check()
        if rec.error is not None:
            raise NvmlError(rec.error)
        return rec

    def _value(self, handle: object, key: str, position: tuple[int, float] | None = None) -> Any:
        rec = self._record(handle, position)
        if key not in rec.values or rec.values[key] is None:
            raise NvmlError(NOT_SUPPORTED)
        return rec.values[key]

    def uuid(self, handle: object) -> str:
        return self._gpu(handle).uuid

    def name(self, handle: object) -> str:
        return self._gpu(handle).name

    def pci_bus_id(self, handle: object) -> str:
        return self._gpu(handle).pci_bus_id

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

    def utilization_samples(self, handle: object, last_seen_us: int) -> list[tuple[int, float]]:
        loop, pos = position = self._position()
        rec = self._record(handle, position)
        gpu = rec.gpu
        # Samples between the last record and the loop's end live, as on the driver, in the
        # buffer read at t=0: in later loops its newest part stands for that stretch.
        gap_us = int((self.trace.duration_s - self._times[gpu][-1]) * 1e6)
        now_rel_us = int(pos * 1e6)
        period_us = int(self.trace.duration_s * 1e6)
        out: list[tuple[int, float]] = []
        first_loop = max(0, (last_seen_us - self._base_us) // period_us) if period_us else 0
        for j in range(max(first_loop, loop - 1), loop + 1):
            offset = self._base_us + j * period_us
            for r in self.trace.records[gpu]:
                for rel, value in r.samples:
                    if j > 0 and rel <= -gap_us:
                        continue  # the rest of the pre-start buffer exists only once
                    if j == loop and rel > now_rel_us:
                        continue
                    ts = offset + rel
                    if ts > last_seen_us:
                        out.append((ts, value))
        out.sort()
        return out[-MAX_BUFFERED_SAMPLES:]

    def utilization_rates(self, handle: object) -> tuple[int, int]:
        gpu_pct, mem_pct = self._value(handle, "util")
        return int(gpu_pct), int(mem_pct)

    def memory_info(self, handle: object) -> tuple[int, int]:
        used, total = self._value(handle, "memory")
        return int(used), int(total)

    def power_usage_mw(self, handle: object) -> int:
        return int(self._value(handle, "power_mw"))

    def total_energy_mj(self, handle: object) -> int:
        gpu = self._gpu(handle).index
        position = self._position()
        loop, _, _ = self._current(gpu, position)
        value = int(self._value(handle, "energy_mj", position))
        # The loop of the record read, so the counter never steps back at a loop boundary.
        return value + loop * self._energy_step[gpu]

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
        rec = self._record(newer[0])
        gpm = rec.values.get("gpm", {})
        return {
            m: (float(gpm[GPM_NAMES[m]]) if GPM_NAMES.get(m) in gpm else None) for m in metric_ids
        }

    def gpm_free(self, sample: object) -> None:
        return None

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
