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
    inference_gpu_pod_utilization_ratio{pod_uid,container_id}   a container's own SM share
    inference_gpu_pod_memory_used_bytes{pod_uid,container_id}   its framebuffer memory
    inference_gpu_pod_unattributed_processes{reason}   processes of no pod: host, gone, unreadable
    inference_gpu_engine_busy_seconds_total, inference_gpu_pod_busy_seconds_total{...}
                                                       those shares integrated, poll by poll
    inference_gpu_idle_energy_joules_total             energy of polls with every sample at 0 %
    inference_gpu_power_limit_watts                    the enforced power limit
    inference_gpu_power_smoothing_enabled, _power_smoothing_floor_watts (Blackwell)
    inference_gpu_power_profile_info{profile}          enforced workload power profiles
    inference_gpu_nvlink_{transmit,receive}_bytes_total, _nvlink_links{state},
    inference_gpu_nvlink_peak_bytes_per_second         NVLink; per link with
                                                       --gpu.nvlink-per-link ({link})
    inference_gpu_c2c_{transmit,receive}_bytes_total, _c2c_links{state}, _c2c_peak_...  Grace
    inference_gpu_fabric_state{state}, _fabric_health{status},
    inference_gpu_fabric_condition_active{condition}, _fabric_info{cluster_uuid,clique_id}

How it reads: one thread per GPU polls every ``poll_interval`` (default 3 s, about 3.7 NVML
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

Per-pod shares (the node agent): with the ``podresources`` collector on and the host's ``/proc``
visible (hostPID, or ``--gpu.host-procfs``), every compute process NVML lists is mapped to its
pod and container by its cgroup (:mod:`exporter.backends.pod_cgroups`), and each container's
share is the sum of its processes' newest SM samples, as the engine's is. A process of no pod,
one that ended before its cgroup was read, or one whose cgroup cannot be read is counted by
reason, never given to a pod.

The peak figures are computed once per NVML session from the identity-time facts
(:func:`exporter.hardware.gpus.peaks_of`; a MIG device's share: ``slice_peaks``) and cost no
call per poll.

Where it lives: this module runs the NVML sessions and the pollers; which devices to watch is
:mod:`~exporter.collectors.nvml_devices`, what a GPU's readings fold into is
:mod:`~exporter.collectors.nvml_state`, and what becomes which metric is the table in
:mod:`~exporter.collectors.nvml_fields`, written out scrape by scrape by
:mod:`~exporter.collectors.nvml_families`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from exporter import metrics as m
from exporter.backends.gpu_reader import GpuIdentity, GpuReader, GpuReading
from exporter.backends.nvml_api import (
    FIELD_ERRORS,
    INVALID_ARGUMENT,
    NOT_FOUND,
    SESSION_ERRORS,
    NvmlApi,
    NvmlError,
)
from exporter.backends.pidns import EngineProcesses, FixedPids, HostPids, is_host_procfs
from exporter.backends.pod_cgroups import Lookup, PodProcesses
from exporter.collectors.base import Collection, Collector
from exporter.collectors.nvml_attribution import (
    ATTRIBUTION_CHOICES,
    AttributionWatch,
    attribution_method,
)
from exporter.collectors.nvml_devices import (
    DeviceFilter,
    device_peaks,
    devices_to_watch,
    visible_device_uuids,
)
from exporter.collectors.nvml_families import GpuFamilies
from exporter.collectors.nvml_state import GpuState
from exporter.collectors.shared_state import GpuDevices, Shared
from exporter.config import ConfigError, ServerOptions, Settings, flag, section
from exporter.hardware.gpus import Peaks
from exporter.priority import SCRAPES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlOptions:
    """The flags of the ``nvml`` collector (``record`` takes some of them too)."""

    replay_file: Path | None = flag(
        "gpu.replay-file",
        None,
        "Replay this NVML trace (JSON lines) instead of reading NVML.",
        kind="path",
        metavar="PATH",
    )
    devices: str = flag(
        "gpu.devices",
        "",
        "Comma-separated GPUs and MIG devices to watch: indexes, GPU or MIG UUIDs, "
        "<gpu>:<slot> for a MIG device (default: the UUIDs in NVIDIA_VISIBLE_DEVICES, else "
        "every device the sidecar sees; give it the engine's devices there or here).",
        kind="str",
        metavar="LIST",
    )
    attribution: str = flag(
        "gpu.attribution",
        "auto",
        "How the pod was given the GPUs the exporter sees, where the exporter cannot tell: "
        "dra (it shares the engine's resource claims), whole-node (the engine holds every GPU "
        "of its node); auto: from --gpu.devices or NVIDIA_VISIBLE_DEVICES, else all-visible.",
        kind="choice",
        choices=ATTRIBUTION_CHOICES,
        metavar="METHOD",
    )
    host_procfs: Path | None = flag(
        "gpu.host-procfs",
        None,
        "The host's /proc mounted read-only: matches the host PIDs NVML reports to the "
        "engine's processes for the engine's own share of a shared GPU (sidecar), or maps "
        "them to pods by cgroup with the podresources collector on (node agent); not needed "
        "with hostPID.",
        kind="path",
        metavar="PATH",
    )
    poll_interval: float = flag(
        "gpu.poll-interval",
        3.0,
        "How often each GPU is read (about 11 NVML calls per read).",
        kind="duration",
        bounds=(0.5, 300.0),
        metavar="DURATION",
    )
    nvlink_per_link: bool = flag(
        "gpu.nvlink-per-link",
        False,
        "Also export each NVLink link's throughput and peak (a link label: three series per "
        "link, 18 links on an H100); the GPU's totals are always exported.",
        kind="bool",
    )

    @property
    def device_set(self) -> frozenset[str]:
        return frozenset(d.strip() for d in self.devices.split(",") if d.strip())


# A MIG device that answers NOT_FOUND or INVALID_ARGUMENT was reconfigured away: the devices
# are enumerated again, at most this often.
REENUMERATE_AFTER_S = 60.0


class NvmlCollector(Collector):
    """See the module docstring."""

    name = "nvml"
    blocking = False

    def __init__(
        self,
        api_factory: Callable[[], NvmlApi],
        *,
        poll_interval: float = NvmlOptions.poll_interval,
        deadline: float = ServerOptions.scrape_timeout,
        clock: Callable[[], float] = time.monotonic,
        max_backoff: float = 60.0,
        devices: Iterable[str] = (),
        engine: EngineProcesses | None = None,
        published: GpuDevices | None = None,
        attribution: str = "all-visible",
        pods: PodProcesses | None = None,
        per_link: bool = False,
    ) -> None:
        self._api_factory = api_factory
        # Where each session's devices are published for other collectors (podresources).
        self._published = published
        # How the watched GPUs were chosen (inference_gpu_attribution_info{method}).
        self.attribution = AttributionWatch(attribution)
        self.poll_interval = poll_interval
        self.deadline = deadline
        self._clock = clock
        self._max_backoff = max_backoff
        # GPUs and MIG devices to watch; empty: every one NVML shows.
        self.devices = DeviceFilter(devices)
        # Tells the engine's processes among NVML's (None: no per-process reads).
        self._engine = engine
        # Maps NVML's processes to pods by cgroup (the node agent; None: not mapped).
        self._pods = pods
        # Each NVLink link's series too (--gpu.nvlink-per-link).
        self._per_link = per_link
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
        per_process = (self._engine is not None and self._engine.available) or (
            self._pods is not None
        )
        try:
            driver = api.driver_version()
            handles = [api.handle(i) for i in range(api.device_count())]
            states: dict[str, GpuState] = {}
            watched: list[object] = []
            for index, handle in enumerate(handles):
                devices = devices_to_watch(api, index, handle, self.devices)
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
        if self._published is not None:
            self._published.publish(tuple(s.identity for s in states.values()))
        self._last_init_error = ""
        log.info(
            "NVML initialised: driver %s, %d device(s): %s",
            driver,
            len(states),
            ", ".join(f"{label}={s.identity.name}" for label, s in states.items()),
        )
        self._say_processes(per_process)
        return watched

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
        state.peaks = _said_peaks(identity, device_peaks(identity))
        state.poll_interval_s = self.poll_interval
        state.reader = GpuReader(
            api,
            identity,
            device,
            clock=self._clock,
            parent=parent if identity.mig is not None else None,
            processes=processes,
            per_link=self._per_link,
        )
        state.inflight_since = None
        return state

    def _say_processes(self, per_process: bool) -> None:
        if self._said_processes or (self._engine is None and self._pods is None):
            return
        self._said_processes = True
        if self._pods is not None:
            log.info(
                "per-pod GPU shares on: NVML's processes are mapped to pods by their cgroup "
                "under %s",
                self._pods.root,
            )
        elif per_process:
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
            pods = self._pod_owners(reading)
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
                state.apply(reading, self._clock(), engine, pods)
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

    def _pod_owners(self, reading: GpuReading) -> dict[int, Lookup] | None:
        if self._pods is None or reading.processes is None:
            return None
        pids = {p.pid for p in reading.processes}
        pids.update(s.pid for s in reading.process_samples or ())
        return self._pods.owners(pids)

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
    def notices(self) -> list[str]:
        return self.attribution.notices()

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
        fam_attribution = m.gauge("inference_gpu_attribution_info")
        fam_attribution.add_metric([self.attribution.method], 1.0)
        out.metrics += [fam_driver, fam_attribution]
        self.attribution.check(states)
        families = GpuFamilies()
        stuck: list[str] = []
        blind: list[str] = []
        stale_after = max(3 * self.poll_interval, self.deadline)
        for state in states:
            with state.lock:
                since = state.inflight_since
                hung = since is not None and now - since > self.deadline
                fresh = state.latest is not None and now - state.latest_at <= stale_after
                healthy = not hung and not state.error and fresh
                if hung:
                    stuck.append(state.identity.label)
                if healthy and _cgroups_unreadable(state):
                    blind.append(state.identity.label)
                families.add_gpu(state, healthy)
        out.metrics.extend(families.families())
        if stuck:
            out.success = False
            out.error = f"NVML call hanging for GPU {', '.join(stuck)}"
        elif blind and self._pods is not None:
            # Per-pod shares were asked for and none can be given: say so, not just count it.
            out.success = False
            out.error = (
                f"no GPU process's cgroup readable under {self._pods.root} (GPU "
                f"{', '.join(blind)}): per-pod shares absent there"
            )
        return out


def _cgroups_unreadable(state: GpuState) -> bool:
    """Whether the GPU had processes and none of their cgroups could be read (the host's
    /proc unmounted or refused). Call with ``state.lock``."""
    counts = state.unattributed
    if not counts or not counts.get("unreadable"):
        return False
    others = sum(n for reason, n in counts.items() if reason != "unreadable")
    return others == 0 and not state.pod_util and not state.pod_memory


def _said_peaks(identity: GpuIdentity, peaks: Peaks) -> Peaks:
    """``peaks``, logged once per NVML session."""
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


# --- construction -----------------------------------------------------------------------------


def check(settings: Settings) -> None:
    """Cross-field checks at start-up: the device list, the replay trace."""
    opts = section(NvmlOptions, settings)
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
    opts = section(NvmlOptions, settings)
    api_factory: Callable[[], NvmlApi]
    engine: EngineProcesses | None = None
    devices: Iterable[str] = opts.device_set
    # A replayed trace's PIDs are another machine's: never mapped to this one's pods.
    pods: PodProcesses | None = None
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
        pods = pod_processes(settings, opts.host_procfs)
    method = attribution_method(
        opts.attribution,
        replay=opts.replay_file is not None,
        devices_flag=bool(opts.device_set),
        devices=devices,
    )
    return NvmlCollector(
        api_factory,
        poll_interval=opts.poll_interval,
        deadline=settings.scrape_timeout,
        devices=devices,
        engine=engine,
        published=shared.gpu_devices,
        attribution=method,
        pods=pods,
        per_link=opts.nvlink_per_link,
    )


def pod_processes(settings: Settings, host_procfs: Path | None) -> PodProcesses | None:
    """The node agent's mapping of NVML's processes to pods: on with the ``podresources``
    collector where the host's ``/proc`` is visible (``--gpu.host-procfs``, else hostPID);
    None elsewhere."""
    if not settings.collectors.get("podresources", False):
        return None
    if host_procfs is not None:
        return PodProcesses(host_procfs)
    own = Path("/proc")
    if is_host_procfs(own):
        return PodProcesses(own)
    log.info(
        "per-pod GPU shares off: the node agent sees neither the host's PID namespace "
        "(hostPID) nor the host's /proc (--gpu.host-procfs)"
    )
    return None
