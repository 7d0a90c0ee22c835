"""Collector ``nvml``: GPU utilisation at driver resolution, HBM bandwidth, power, clocks, Xids.

Emits (labels ``gpu``, ``uuid`` unless noted; see ``docs/metrics.md``)::

    inference_nvml_up                                   1 / 0
    inference_nvml_calls_total{gpu}                     calls made for the GPU
    inference_nvml_driver_info{driver_version}          1
    inference_gpu_info{gpu,uuid,name,pci_bus_id}        1
    inference_gpu_mig_mode_info{gpu,uuid,mig_mode}      1
    inference_gpu_up                                    0 when the GPU errors or hangs
    inference_gpu_utilization_ratio                     latest driver sample
    inference_gpu_busy_seconds_total                    integral of every driver sample
    inference_gpu_utilization_samples_bucket{le}        every driver sample once
    inference_gpu_memory_bandwidth_utilization_ratio    GPM DRAM_BW_UTIL (Hopper+)
    inference_gpu_dram_active_seconds_total             its integral
    inference_gpu_memory_busy_ratio, _sm_active_ratio, _sm_occupancy_ratio, _tensor_active_ratio
    inference_gpu_memory_used_bytes, _memory_total_bytes, _pcie_{tx,rx}_bytes_per_second
    inference_gpu_power_watts, _energy_joules_total, _temperature_celsius
    inference_gpu_sm_clock_hertz, _memory_clock_hertz, _clock_event_active{reason}
    inference_gpu_xid_errors_total{xid}
    inference_gpu_peak_memory_bandwidth_bytes_per_second, inference_gpu_peak_flops{precision}
    inference_gpu_mig_info{parent_uuid,profile}       a MIG device's GPU and profile
    inference_gpu_mig_instance_info{gpu_instance_id,compute_instance_id}   its instances
    inference_gpu_processes{owner}                     compute processes, engine | other
    inference_gpu_engine_utilization_ratio             the engine's own SM share
    inference_gpu_engine_memory_used_bytes             the engine's own framebuffer memory

How it reads: one thread per GPU polls every ``poll_interval`` (default 3 s, about 3.3 NVML
calls per GPU per second), so a hung call stalls only its own GPU and never a scrape. The
driver's utilisation buffer is drained on each poll, so the busy-seconds counter sees every
driver sample whatever the scrape interval. ``collect()`` only reads the latest state.
A poll in flight longer than ``deadline`` marks the GPU down and the collector unsuccessful;
no second call is started for that GPU while one hangs.

MIG: each MIG device of a GPU in MIG mode is a device of its own (``gpu="<gpu>:<slot>"``,
its ``uuid`` the MIG UUID), polled by its own thread: memory from its handle, utilisation,
SM, tensor and DRAM activity from the GPU instance's GPM samples (Hopper and newer; there is
no utilisation buffer on MIG, so busy seconds and the utilisation histogram integrate GPM
graphics activity, one value per poll). The GPU itself keeps its own series (power,
temperature, clocks, PCIe, Xids).

Per-process shares: where the engine's processes can be told among NVML's host PIDs
(:mod:`exporter.backends.pidns`), each poll also lists the compute processes and their
utilisation samples: the engine's share is the sum of its processes' newest SM samples, its
memory the sum of their memory, and the rest are counted as ``other``. On MIG, NVML has no
per-process utilisation; a MIG device whose processes are all the engine's gives it the
device's utilisation.

The peak figures are computed once per NVML session from the identity-time facts
(:func:`exporter.hardware.gpus.peaks_of`; a MIG device's share: ``slice_peaks``) and cost no
call per poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from exporter import metrics as m
from exporter.backends.gpu_reader import (
    GpuIdentity,
    GpuReader,
    GpuReading,
    MigSlice,
    read_identity,
    read_mig_slices,
)
from exporter.backends.nvml_api import (
    FIELD_ERRORS,
    INVALID_ARGUMENT,
    NOT_FOUND,
    SESSION_ERRORS,
    NvmlApi,
    NvmlError,
)
from exporter.backends.pidns import EngineProcesses, FixedPids, HostPids, is_host_procfs
from exporter.collectors.base import Collection, Collector, Shared
from exporter.config import DEFAULT_SCRAPE_TIMEOUT, ConfigError, Option, Settings, section
from exporter.hardware.gpus import Peaks, peaks_of, slice_peaks
from exporter.metrics import CLOCK_EVENT_BITS
from exporter.priority import SCRAPES

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 3.0

# (bit, label value) of every clock event reason, from the metric catalogue's one table.
CLOCK_EVENT_REASONS = tuple((bit, reason) for reason, bit in CLOCK_EVENT_BITS.items())

# A driver sample stands for the period since the one before it. Periods longer than this
# (samples lost while the GPU was unreachable) are not credited beyond it.
MAX_SAMPLE_PERIOD_S = 2.0

MIB = 1024 * 1024
KIB = 1024

# A MIG device that answers NOT_FOUND or INVALID_ARGUMENT was reconfigured away: the devices
# are enumerated again, at most this often.
REENUMERATE_AFTER_S = 60.0


class DeviceFilter:
    """Which GPUs and MIG devices to watch, from ``--gpu.devices`` (or the UUIDs of
    ``NVIDIA_VISIBLE_DEVICES``). Entries: a GPU index (``0``), a GPU UUID, a MIG UUID
    (``MIG-<uuid>``, or the pre-R470 ``MIG-GPU-<uuid>/<gi>/<ci>``), a MIG index
    (``<gpu>:<slot>``). A listed GPU brings all its MIG devices; a listed MIG device brings
    its GPU (power, temperature, clocks are the GPU's). Empty: everything NVML shows."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        # Kubernetes device IDs may carry a "::<replica>" suffix (time-sliced replicas).
        self.entries = frozenset(e.strip().split("::")[0] for e in entries if e.strip())

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def names_mig_devices(self) -> bool:
        return any(e.startswith("MIG-") or ":" in e for e in self.entries)

    def gpu(self, index: int, uuid: str) -> bool:
        return not self.entries or str(index) in self.entries or uuid in self.entries

    def mig(self, piece: MigSlice, uuid: str) -> bool:
        legacy = f"MIG-{piece.parent_uuid}/{piece.gpu_instance_id}/{piece.compute_instance_id}"
        names = {uuid, legacy, f"{piece.parent_index}:{piece.slot}"}
        return self.gpu(piece.parent_index, piece.parent_uuid) or bool(names & self.entries)


def visible_device_uuids(value: str) -> frozenset[str]:
    """The GPU and MIG UUIDs of an ``NVIDIA_VISIBLE_DEVICES`` value. Indices are left out: they
    number the host's GPUs, not the ones NVML shows inside the container; ``all``, ``none``,
    ``void`` name no device."""
    items = (item.strip().split("::")[0] for item in value.split(","))
    return frozenset(i for i in items if i.startswith(("GPU-", "MIG-")))


def integrate_samples(
    previous: tuple[int, float] | None, samples: list[tuple[int, float]]
) -> tuple[float, tuple[int, float] | None]:
    """Busy seconds in ``samples`` (``(timestamp_us, percent)``, sorted).

    Each sample's value covers the time since the sample before it; the very first sample
    ever seen has no known period and adds nothing. Returns (busy seconds, last sample).
    """
    busy = 0.0
    last = previous
    for ts, value in samples:
        if last is not None and ts > last[0]:
            period = min((ts - last[0]) / 1e6, MAX_SAMPLE_PERIOD_S)
            busy += period * min(max(value, 0.0), 100.0) / 100.0
        last = (ts, value)
    return busy, last


@dataclass
class GpuState:
    """Everything the collector knows about one GPU; guarded by ``lock``."""

    identity: GpuIdentity
    peaks: Peaks | None = None
    reader: GpuReader | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    latest: GpuReading | None = None
    latest_at: float = 0.0
    latest_util: float | None = None
    error: str = ""
    inflight_since: float | None = None
    busy_seconds: float = 0.0
    last_sample: tuple[int, float] | None = None
    samples: m.BucketCounts = field(default_factory=lambda: m.BucketCounts(m.UTILIZATION_BUCKETS))
    dram_active_seconds: float = 0.0
    xids: Counter[int] = field(default_factory=Counter)
    calls: int = 0
    attempted: bool = False
    # Per-process shares of the latest reading; None where not known.
    engine_util: float | None = None
    engine_memory: float | None = None
    process_counts: tuple[int, int] | None = None  # (engine, other)
    # The histogram's samples as last rendered, with the counts and count they came from:
    # they change once per poll, scrapes come far more often.
    hist_rendered: tuple[m.BucketCounts, int, list[Sample]] | None = None

    def apply(self, reading: GpuReading, now: float, engine: frozenset[int] | None = None) -> None:
        """Fold one successful reading into the state (counters only grow); ``engine`` is
        the engine's PIDs among the reading's processes (None: not known)."""
        busy, self.last_sample = integrate_samples(self.last_sample, reading.samples)
        self.busy_seconds += busy
        for _, value in reading.samples:
            self.samples.observe(min(max(value, 0.0), 100.0) / 100.0)
        graphics = reading.gpm.get("graphics_util")
        if reading.samples:
            self.latest_util = reading.samples[-1][1] / 100.0
        elif not reading.has_samples and graphics is not None and reading.gpm_interval_s:
            # No sample buffer (MIG): GPM graphics activity over the poll interval stands in,
            # one value per poll.
            share = min(max(graphics, 0.0), 100.0) / 100.0
            self.busy_seconds += reading.gpm_interval_s * share
            self.samples.observe(share)
            self.latest_util = share
        elif reading.util_gpu_pct is not None and self.last_sample is None:
            # No sample buffer on this GPU: the driver's own average is the best we have.
            self.latest_util = reading.util_gpu_pct / 100.0
        dram = reading.gpm.get("dram_bw_util")
        if dram is not None and reading.gpm_interval_s:
            self.dram_active_seconds += reading.gpm_interval_s * dram / 100.0
        self._apply_processes(reading, engine)
        self.latest = reading
        self.latest_at = now
        self.error = ""

    def _apply_processes(self, reading: GpuReading, engine: frozenset[int] | None) -> None:
        procs = reading.processes
        if procs is None or engine is None:
            self.engine_util = self.engine_memory = self.process_counts = None
            return
        mine = [p for p in procs if p.pid in engine]
        others = len(procs) - len(mine)
        self.process_counts = (len(mine), others)
        used = [p.used_bytes for p in mine if p.used_bytes is not None]
        # Memory NVML does not report (NVML_VALUE_NOT_AVAILABLE) leaves the sum unknown.
        self.engine_memory = float(sum(used)) if len(used) == len(mine) else None
        if not mine:
            self.engine_util = 0.0  # the engine runs nothing here
        elif reading.process_samples is not None:
            ordered = sorted(reading.process_samples, key=lambda s: s.timestamp_us)
            newest = {s.pid: s for s in ordered}  # each process's newest sample
            share = sum(min(max(s.sm_pct, 0), 100) for pid, s in newest.items() if pid in engine)
            self.engine_util = min(share, 100) / 100.0
        elif others == 0 and self.latest_util is not None:
            # No per-process utilisation (MIG), but no one else on the device either.
            self.engine_util = self.latest_util
        else:
            self.engine_util = None


class NvmlCollector(Collector):
    """See the module docstring."""

    name = "nvml"
    blocking = False

    def __init__(
        self,
        api_factory: Callable[[], NvmlApi],
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        deadline: float = DEFAULT_SCRAPE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        max_backoff: float = 60.0,
        devices: Iterable[str] = (),
        engine: EngineProcesses | None = None,
    ) -> None:
        self._api_factory = api_factory
        self.poll_interval = poll_interval
        self.deadline = deadline
        self._clock = clock
        self._max_backoff = max_backoff
        # GPUs and MIG devices to watch; empty: every one NVML shows.
        self.devices = DeviceFilter(devices)
        # Tells the engine's processes among NVML's (None: no per-process reads).
        self._engine = engine
        self._said_processes = False
        self._reenumerate_at = 0.0
        self._states: dict[str, GpuState] = {}
        self._by_uuid: dict[str, GpuState] = {}
        self._driver_version = ""
        self._up = False
        self._last_init_error = ""
        self._stop = threading.Event()
        self._session_broken = threading.Event()
        self._ready = threading.Event()
        self._manager: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._manager = threading.Thread(target=self._manage, name="nvml-manager", daemon=True)
        self._manager.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._session_broken.set()
        if self._manager is not None:
            self._manager.join(timeout)

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def _manage(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                api = self._api_factory()
                handles = self._open(api)
            except NvmlError as err:
                self._set_down(f"NVML initialisation failed: {err} ({err.name})")
                self._ready.set()
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self._max_backoff)
                continue
            backoff = 1.0
            self._session_broken.clear()
            self._run_session(api, handles)
            self._close(api)

    def _set_down(self, message: str) -> None:
        with self._lock:
            self._up = False
        if message != self._last_init_error:
            log.warning("%s; retrying with backoff, other collectors unaffected", message)
            self._last_init_error = message
        else:
            log.debug("%s", message)

    def _open(self, api: NvmlApi) -> list[object]:
        api.init()
        per_process = self._engine is not None and self._engine.available
        try:
            driver = api.driver_version()
            handles = [api.handle(i) for i in range(api.device_count())]
            states: dict[str, GpuState] = {}
            watched: list[object] = []
            for index, handle in enumerate(handles):
                devices = self._devices_of(api, index, handle)
                if devices:
                    watched.append(handle)
                for identity, device in devices:
                    # A GPU in MIG mode: its processes are read on its MIG devices.
                    processes = per_process and identity.mig_mode != "enabled"
                    states[identity.label] = self._state(
                        api, identity, device, handle, processes=processes
                    )
        except NvmlError:
            with contextlib.suppress(NvmlError):
                api.shutdown()
            raise
        with self._lock:
            self._driver_version = driver
            self._states = states
            self._by_uuid.update({s.identity.uuid: s for s in states.values()})
            self._up = True
        self._last_init_error = ""
        log.info(
            "NVML initialised: driver %s, %d device(s): %s",
            driver,
            len(states),
            ", ".join(f"{label}={s.identity.name}" for label, s in states.items()),
        )
        self._say_processes(per_process)
        return watched

    def _devices_of(
        self, api: NvmlApi, index: int, handle: object
    ) -> list[tuple[GpuIdentity, object]]:
        """The GPU and its MIG devices to watch, the GPU first; empty to skip it."""
        wanted = self.devices
        if wanted and not wanted.names_mig_devices and not wanted.gpu(index, api.uuid(handle)):
            return []  # not listed, and no MIG device could be
        identity = read_identity(api, index, handle)
        slices = read_mig_slices(api, identity, handle) if identity.mig_mode == "enabled" else []
        kept = [(i, h) for i, h in slices if i.mig is not None and wanted.mig(i.mig, i.uuid)]
        if not kept and not wanted.gpu(index, identity.uuid):
            return []
        return [(identity, handle), *kept]

    def _state(
        self,
        api: NvmlApi,
        identity: GpuIdentity,
        device: object,
        parent: object,
        *,
        processes: bool,
    ) -> GpuState:
        # Keep counters across NVML sessions (driver reload): same device, same series.
        state = self._by_uuid.get(identity.uuid) or GpuState(identity=identity)
        state.identity = identity
        state.peaks = _peaks(identity)
        state.reader = GpuReader(
            api,
            identity,
            device,
            clock=self._clock,
            parent=parent if identity.mig is not None else None,
            processes=processes,
        )
        state.inflight_since = None
        return state

    def _say_processes(self, per_process: bool) -> None:
        if self._said_processes or self._engine is None:
            return
        self._said_processes = True
        if per_process:
            log.info(
                "per-process GPU shares on: the engine's processes are told apart among "
                "NVML's host PIDs"
            )
        else:
            log.info(
                "per-process GPU shares off: NVML reports host PIDs and this sidecar sees "
                "neither the host's PID namespace (hostPID) nor the host's /proc "
                "(--gpu.host-procfs); inference_gpu_engine_* and inference_gpu_processes "
                "stay absent"
            )

    def _run_session(self, api: NvmlApi, handles: list[object]) -> None:
        self._threads = [
            threading.Thread(target=self._poll, args=(state,), name=f"nvml-gpu{i}", daemon=True)
            for i, state in self._states.items()
        ]
        self._threads.append(
            threading.Thread(
                target=self._watch_xids, args=(api, handles), name="nvml-xid", daemon=True
            )
        )
        for thread in self._threads:
            thread.start()
        if not self._states:
            self._ready.set()
        self._session_broken.wait()

    def _close(self, api: NvmlApi) -> None:
        end = self._clock() + self.deadline
        for thread in self._threads:
            thread.join(max(0.0, end - self._clock()))
        with self._lock:
            self._up = False
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            # Shutting NVML down under a hung call can deadlock the driver library.
            log.warning("NVML calls still hanging in %s; skipping nvmlShutdown", ", ".join(stuck))
            return
        for state in self._states.values():
            if state.reader is not None:
                state.reader.close()
        try:
            api.shutdown()
        except NvmlError as err:
            log.debug("nvmlShutdown: %s", err)

    def poll_now(self) -> None:
        """Read every GPU once, synchronously (tests and benchmarks step time with this)."""
        with self._lock:
            states = list(self._states.values())
        for state in states:
            self._poll_once(state)

    def _poll(self, state: GpuState) -> None:
        while not self._session_broken.is_set():
            SCRAPES.step_aside()  # a scrape in flight goes first (exporter.priority)
            started = self._clock()
            if not self._poll_once(state):
                break
            elapsed = self._clock() - started
            if self._session_broken.wait(max(0.0, self.poll_interval - elapsed)):
                break

    def _poll_once(self, state: GpuState) -> bool:
        """One read of one GPU; False when the NVML session is gone."""
        reader = state.reader
        assert reader is not None
        state.inflight_since = self._clock()
        calls_before = reader.calls
        try:
            reading = reader.read()
            engine = self._engine_pids(reading)
        except NvmlError as err:
            if err.code in SESSION_ERRORS:
                log.warning("NVML session lost (%s); re-initialising", err.name)
                self._session_broken.set()
                return False
            with state.lock:
                if state.error != err.name:
                    log.warning(
                        "GPU %s (%s): %s; marked down, still polling",
                        state.identity.label,
                        state.identity.uuid,
                        err.name,
                    )
                state.error = err.name
            if self._reconfigured(state, err):
                return False
        else:
            with state.lock:
                if state.error:
                    log.info("GPU %s recovered", state.identity.label)
                state.apply(reading, self._clock(), engine)
        finally:
            state.inflight_since = None
            with state.lock:
                state.calls += reader.calls - calls_before
                state.attempted = True
            if all(s.attempted for s in self._states.values()):
                self._ready.set()
        return True

    def _engine_pids(self, reading: GpuReading) -> frozenset[int] | None:
        if self._engine is None or reading.processes is None:
            return None
        pids = {p.pid for p in reading.processes}
        pids.update(s.pid for s in reading.process_samples or ())
        return self._engine.engine(pids)

    def _reconfigured(self, state: GpuState, err: NvmlError) -> bool:
        """A MIG device that no longer exists (MIG reconfigured): enumerate again, at most
        once per :data:`REENUMERATE_AFTER_S`. True when the session ends for that."""
        if state.identity.mig is None or err.code not in (NOT_FOUND, INVALID_ARGUMENT):
            return False
        now = self._clock()
        if now < self._reenumerate_at:
            return False
        self._reenumerate_at = now + REENUMERATE_AFTER_S
        log.warning("MIG device %s is gone; enumerating the MIG devices again", state.identity.uuid)
        self._session_broken.set()
        return True

    def _watch_xids(self, api: NvmlApi, handles: list[object]) -> None:
        try:
            api.register_xid_events(handles)
        except NvmlError as err:
            level = logging.INFO if err.code in FIELD_ERRORS else logging.WARNING
            log.log(level, "Xid events unavailable (%s); xid counters stay absent", err.name)
            return
        while not self._session_broken.is_set():
            try:
                events = api.wait_xid_events(1000)
            except NvmlError as err:
                if err.code in SESSION_ERRORS:
                    return
                log.debug("nvmlEventSetWait: %s", err.name)
                self._session_broken.wait(1.0)
                continue
            for event in events:
                state = self._states.get(str(event.gpu))
                if state is None:
                    continue
                log.warning("GPU %d: Xid %d", event.gpu, event.xid)
                with state.lock:
                    state.xids[event.xid] += 1

    # --- scrape ------------------------------------------------------------------------------
    def collect(self) -> Collection:
        now = self._clock()
        with self._lock:
            up, states, driver = self._up, list(self._states.values()), self._driver_version
        fam_up = m.gauge("inference_nvml_up")
        fam_up.add_metric([], 1.0 if up else 0.0)
        out = Collection(metrics=[fam_up])
        if not up:
            out.success = False
            out.error = self._last_init_error or "NVML not initialised"
            return out
        # Identity apart from each GPU's: every series stays within the label budget
        # (exporter.metrics.SERIES_BUDGET) with a PodMonitor's target labels added.
        fam_driver = m.gauge("inference_nvml_driver_info")
        fam_driver.add_metric([driver], 1.0)
        out.metrics.append(fam_driver)
        f = _Families()
        stuck: list[str] = []
        stale_after = max(3 * self.poll_interval, self.deadline)
        for state in states:
            with state.lock:
                since = state.inflight_since
                hung = since is not None and now - since > self.deadline
                fresh = state.latest is not None and now - state.latest_at <= stale_after
                healthy = not hung and not state.error and fresh
                if hung:
                    stuck.append(state.identity.label)
                f.add_state(state, healthy)
        out.metrics.extend(f.all())
        if stuck:
            out.success = False
            out.error = f"NVML call hanging for GPU {', '.join(stuck)}"
        return out


class _Families:
    """The families of one scrape, filled GPU by GPU."""

    def __init__(self) -> None:
        self.calls = m.counter("inference_nvml_calls_total")
        self.info = m.gauge("inference_gpu_info")
        self.mig_mode = m.gauge("inference_gpu_mig_mode_info")
        self.up = m.gauge("inference_gpu_up")
        self.xid = m.counter("inference_gpu_xid_errors_total")
        self.hist = m.histogram("inference_gpu_utilization_samples")
        self.busy = m.counter("inference_gpu_busy_seconds_total")
        self.dram_seconds = m.counter("inference_gpu_dram_active_seconds_total")
        self.energy = m.counter("inference_gpu_energy_joules_total")
        self.events = m.gauge("inference_gpu_clock_event_active")
        self.peak_bandwidth = m.gauge("inference_gpu_peak_memory_bandwidth_bytes_per_second")
        self.peak_flops = m.gauge("inference_gpu_peak_flops")
        self.mig_info = m.gauge("inference_gpu_mig_info")
        self.mig_instance = m.gauge("inference_gpu_mig_instance_info")
        self.processes = m.gauge("inference_gpu_processes")
        self.gauges = {
            name: m.gauge(name)
            for name in (
                "inference_gpu_utilization_ratio",
                "inference_gpu_memory_bandwidth_utilization_ratio",
                "inference_gpu_memory_busy_ratio",
                "inference_gpu_sm_active_ratio",
                "inference_gpu_sm_occupancy_ratio",
                "inference_gpu_tensor_active_ratio",
                "inference_gpu_memory_used_bytes",
                "inference_gpu_memory_total_bytes",
                "inference_gpu_pcie_tx_bytes_per_second",
                "inference_gpu_pcie_rx_bytes_per_second",
                "inference_gpu_power_watts",
                "inference_gpu_temperature_celsius",
                "inference_gpu_sm_clock_hertz",
                "inference_gpu_memory_clock_hertz",
                "inference_gpu_engine_utilization_ratio",
                "inference_gpu_engine_memory_used_bytes",
            )
        }

    def all(self) -> list[Metric]:
        fams: list[Metric] = [self.calls, self.info, self.mig_mode, self.up, self.xid]
        fams += [self.hist, self.busy, self.peak_bandwidth, self.peak_flops, self.mig_info]
        fams.append(self.mig_instance)
        fams += [self.dram_seconds, self.energy, self.events, *self.gauges.values()]
        fams += [self.processes]
        return [f for f in fams if f.samples]

    def _gauge(self, name: str, labels: list[str], value: float | None) -> None:
        if value is not None:
            self.gauges[name].add_metric(labels, value)

    def add_state(self, s: GpuState, healthy: bool) -> None:
        ident = s.identity
        labels = [ident.label, ident.uuid]
        self.calls.add_metric([labels[0]], float(s.calls))
        self.info.add_metric([*labels, ident.name, ident.pci_bus_id], 1.0)
        self.mig_mode.add_metric([*labels, ident.mig_mode], 1.0)
        piece = ident.mig
        if piece is not None:
            self.mig_info.add_metric([*labels, piece.parent_uuid, piece.profile], 1.0)
            instance = [str(piece.gpu_instance_id), str(piece.compute_instance_id)]
            self.mig_instance.add_metric([*labels, *instance], 1.0)
        self.up.add_metric(labels, 1.0 if healthy else 0.0)
        # Facts of the hardware, not readings: present whether or not the GPU answers now.
        if s.peaks is not None:
            if s.peaks.memory_bandwidth is not None:
                self.peak_bandwidth.add_metric(labels, s.peaks.memory_bandwidth)
            for precision, value in sorted(s.peaks.flops.items()):
                self.peak_flops.add_metric([*labels, precision], value)
        for xid, count in sorted(s.xids.items()):
            self.xid.add_metric([*labels, str(xid)], float(count))
        r = s.latest
        if not healthy or r is None:
            return
        if s.samples.n:
            rendered = s.hist_rendered
            if rendered is None or rendered[0] is not s.samples or rendered[1] != s.samples.n:
                one = m.histogram("inference_gpu_utilization_samples")
                one.add_metric(labels, s.samples.buckets(), s.samples.total)
                rendered = s.hist_rendered = (s.samples, s.samples.n, one.samples)
            self.hist.samples.extend(rendered[2])
            self.busy.add_metric(labels, s.busy_seconds)
        self._gauge("inference_gpu_utilization_ratio", labels, s.latest_util)
        gpm = r.gpm
        if "dram_bw_util" in gpm:
            self._gauge(
                "inference_gpu_memory_bandwidth_utilization_ratio",
                labels,
                gpm["dram_bw_util"] / 100,
            )
            self.dram_seconds.add_metric(labels, s.dram_active_seconds)
        for key, name in (
            ("sm_util", "inference_gpu_sm_active_ratio"),
            ("sm_occupancy", "inference_gpu_sm_occupancy_ratio"),
            ("any_tensor_util", "inference_gpu_tensor_active_ratio"),
        ):
            if key in gpm:
                self._gauge(name, labels, gpm[key] / 100)
        if r.mem_busy_pct is not None:
            self._gauge("inference_gpu_memory_busy_ratio", labels, r.mem_busy_pct / 100)
        self._gauge("inference_gpu_memory_used_bytes", labels, _f(r.memory_used_bytes))
        self._gauge("inference_gpu_memory_total_bytes", labels, _f(r.memory_total_bytes))
        for direction, gpm_key, fallback in (
            ("tx", "pcie_tx_per_sec", r.pcie_tx_kibps),
            ("rx", "pcie_rx_per_sec", r.pcie_rx_kibps),
        ):
            name = f"inference_gpu_pcie_{direction}_bytes_per_second"
            if gpm_key in gpm:
                self._gauge(name, labels, gpm[gpm_key] * MIB)
            elif fallback is not None:
                self._gauge(name, labels, float(fallback * KIB))
        if r.power_mw is not None:
            self._gauge("inference_gpu_power_watts", labels, r.power_mw / 1000)
        if r.energy_mj is not None:
            self.energy.add_metric(labels, r.energy_mj / 1000)
        self._gauge("inference_gpu_temperature_celsius", labels, _f(r.temperature_c))
        if r.sm_clock_mhz is not None:
            self._gauge("inference_gpu_sm_clock_hertz", labels, r.sm_clock_mhz * 1e6)
        if r.mem_clock_mhz is not None:
            self._gauge("inference_gpu_memory_clock_hertz", labels, r.mem_clock_mhz * 1e6)
        if r.clock_events is not None:
            for bit, reason in CLOCK_EVENT_REASONS:
                self.events.add_metric([*labels, reason], 1.0 if r.clock_events & bit else 0.0)
        self._add_shares(s, labels)

    def _add_shares(self, s: GpuState, labels: list[str]) -> None:
        if s.process_counts is None:
            return
        engine, other = s.process_counts
        self.processes.add_metric([*labels, "engine"], float(engine))
        self.processes.add_metric([*labels, "other"], float(other))
        self._gauge("inference_gpu_engine_utilization_ratio", labels, s.engine_util)
        self._gauge("inference_gpu_engine_memory_used_bytes", labels, s.engine_memory)


def _peaks(identity: GpuIdentity) -> Peaks:
    piece = identity.mig
    if piece is None:
        peaks = peaks_of(identity.name, identity.facts)
    else:
        attributes = piece.attributes
        peaks = slice_peaks(
            peaks_of(piece.parent_name, identity.facts),
            sms=attributes.multiprocessor_count if attributes is not None else None,
            memory_fraction=piece.memory_fraction,
        )
    bandwidth = peaks.memory_bandwidth
    log.info(
        "GPU %s (%s): peak bandwidth %s, dense bf16 %s (%s)",
        identity.label,
        identity.name,
        "unknown" if bandwidth is None else f"{bandwidth / 1e9:.0f} GB/s",
        f"{peaks.flops['bf16'] / 1e12:.1f} TFLOPS" if "bf16" in peaks.flops else "unknown",
        peaks.basis,
    )
    return peaks


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)


# --- flags and construction -------------------------------------------------------------------

OPTIONS: tuple[Option, ...] = (
    Option(
        "gpu.replay-file",
        "path",
        None,
        "Replay this NVML trace (JSON lines) instead of reading NVML.",
        metavar="PATH",
        attr="replay_file",
    ),
    Option(
        "gpu.devices",
        "str",
        "",
        "Comma-separated GPUs and MIG devices to watch: indexes, GPU or MIG UUIDs, "
        "<gpu>:<slot> for a MIG device (default: the UUIDs in NVIDIA_VISIBLE_DEVICES, else "
        "every device the sidecar sees; give it the engine's devices there or here).",
        metavar="LIST",
        attr="devices",
    ),
    Option(
        "gpu.host-procfs",
        "path",
        None,
        "The host's /proc mounted read-only in the sidecar: matches the host PIDs NVML "
        "reports to the engine's processes for the engine's own share of a shared GPU "
        "(not needed with hostPID).",
        metavar="PATH",
        attr="host_procfs",
    ),
    Option(
        "gpu.poll-interval",
        "duration",
        DEFAULT_POLL_INTERVAL,
        "How often each GPU is read (about 10 NVML calls per read).",
        minimum=0.5,
        maximum=300.0,
        metavar="DURATION",
        attr="poll_interval",
    ),
)


@dataclass(frozen=True)
class NvmlOptions:
    replay_file: Path | None
    devices: str
    host_procfs: Path | None
    poll_interval: float

    @property
    def device_set(self) -> frozenset[str]:
        return frozenset(d.strip() for d in self.devices.split(",") if d.strip())


def check(settings: Settings) -> None:
    """Cross-field checks at start-up: the device list, the replay trace."""
    opts = section(NvmlOptions, OPTIONS, settings)
    if opts.devices and any(not d.strip() for d in opts.devices.split(",")):
        raise ConfigError("--gpu.devices", f"{opts.devices!r} has an empty entry")
    if opts.host_procfs is not None and not is_host_procfs(opts.host_procfs):
        raise ConfigError(
            "--gpu.host-procfs",
            f"{opts.host_procfs} is not the host's /proc (its PID 2 is not a kernel thread): "
            "mount the host's /proc there (hostPath /proc, read-only)",
        )
    if opts.replay_file is not None:
        from exporter.backends.replay import TraceError, load_trace  # noqa: PLC0415

        try:
            load_trace(opts.replay_file)
        except TraceError as err:
            raise ConfigError("--gpu.replay-file", str(err)) from None


def build(settings: Settings, shared: Shared) -> NvmlCollector:
    opts = section(NvmlOptions, OPTIONS, settings)
    api_factory: Callable[[], NvmlApi]
    engine: EngineProcesses | None = None
    devices: Iterable[str] = opts.device_set
    if opts.replay_file is not None:
        from exporter.backends.replay import ReplayApi, load_trace  # noqa: PLC0415

        trace = load_trace(opts.replay_file)
        api_factory = lambda: ReplayApi(trace)  # noqa: E731
        # The trace's processes belong to the machine it was recorded on: its engine PIDs
        # stand for the engine, whatever runs here.
        if trace.engine_pids is not None:
            engine = FixedPids(trace.engine_pids)
    else:
        from exporter.backends.nvml_library import PynvmlApi  # noqa: PLC0415

        api_factory = PynvmlApi
        devices = devices or visible_device_uuids(os.environ.get("NVIDIA_VISIBLE_DEVICES", ""))
        if settings.collectors.get("process", True):
            engine = HostPids(shared.engine_pids.get, host_procfs=opts.host_procfs)
    return NvmlCollector(
        api_factory,
        poll_interval=opts.poll_interval,
        deadline=settings.scrape_timeout,
        devices=devices,
        engine=engine,
    )
