"""Collector ``podresources``: which pod holds each GPU, MIG device and time-sliced replica.

The node agent's view (off by default; the chart's ``node`` mode turns it on). Emits::

    inference_gpu_pod_info{gpu,uuid,namespace,pod,container}   1 per device and container
    inference_gpu_pods{gpu,uuid}                                distinct pods holding it
    inference_podresources_devices{state}                       devices by attribution state

How it reads: a thread asks the kubelet's PodResources API (``List`` and
``GetAllocatableResources``, each under ``--podresources.deadline``) every
``--podresources.interval`` (default 10 s: two unary calls on a local socket, a few
milliseconds) and matches every device ID of an ``nvidia.com/`` resource to a device the
``nvml`` collector enumerated: ``GPU-<uuid>`` (the device plugin's default IDs), the index
(``deviceIDStrategy: index``), ``MIG-<uuid>`` or ``MIG-GPU-<uuid>/<gi>/<ci>`` (MIG devices,
mixed or single strategy), each with an optional ``::<n>`` replica suffix (time-slicing, MPS).
``collect()`` only renders the last match.

Never wrong: an ID NVML does not show is counted (``state="unknown_to_nvml"``), never guessed;
a device NVML shows but the kubelet does not offer is ``unknown_to_kubelet``, one offered but
held by no pod ``unallocated``. When the kubelet does not answer (socket missing, permission
denied, deadline, a gRPC error) the collector is unsuccessful with that reason, and keeps the
last attribution for at most ``3 x interval``: long enough to ride over one lost answer, short
enough that a pod that ended meanwhile is not reported for long.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter import metrics as m
from exporter.backends.gpu_reader import GpuIdentity
from exporter.backends.podresources_client import (
    DEFAULT_SOCKET,
    Assignment,
    Device,
    PodResourcesClient,
    PodResourcesError,
)
from exporter.collectors.base import BackgroundThread, Collection, Collector
from exporter.collectors.shared_state import GpuDevices, Shared
from exporter.config import ConfigError, Settings, flag, section

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10.0
DEFAULT_DEADLINE = 2.0
GPU_RESOURCE_PREFIX = "nvidia.com/"
# How many refresh intervals an attribution outlives a kubelet that stopped answering.
STALE_INTERVALS = 3
STATES = ("attributed", "unallocated", "unknown_to_kubelet", "unknown_to_nvml")

_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    container: str


@dataclass
class Attribution:
    """One match of the kubelet's assignments to NVML's devices."""

    holders: dict[str, set[Holder]] = field(default_factory=dict)  # by device label
    devices: dict[str, GpuIdentity] = field(default_factory=dict)  # by device label
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    unknown_ids: tuple[str, ...] = ()


def device_of(device_id: str, devices: Iterable[GpuIdentity]) -> GpuIdentity | None:
    """The NVML device a device plugin ID names (replica suffix ignored); None when none."""
    base = device_id.split("::", 1)[0].strip()
    legacy = _LEGACY_MIG.match(base)
    for identity in devices:
        piece = identity.mig
        if piece is None:
            if base in (identity.uuid, str(identity.index)):
                return identity
        elif base in (identity.uuid, identity.label) or (
            legacy is not None
            and legacy.group(1) == piece.parent_uuid
            and int(legacy.group(2)) == piece.gpu_instance_id
            and int(legacy.group(3)) == piece.compute_instance_id
        ):
            return identity
    return None


def attribute(
    assignments: Iterable[Assignment],
    allocatable: Iterable[Device] | None,
    devices: tuple[GpuIdentity, ...],
) -> Attribution:
    """Match the kubelet's GPU assignments (and offer, where known) to NVML's devices."""
    out = Attribution()
    unknown: set[str] = set()
    for a in assignments:
        if not a.resource.startswith(GPU_RESOURCE_PREFIX):
            continue
        identity = device_of(a.device_id, devices)
        if identity is None:
            unknown.add(a.device_id.split("::", 1)[0])
            continue
        out.devices[identity.label] = identity
        out.holders.setdefault(identity.label, set()).add(Holder(a.namespace, a.pod, a.container))
    offered: set[str] | None = None
    if allocatable is not None:
        offered = set()
        for d in allocatable:
            if not d.resource.startswith(GPU_RESOURCE_PREFIX):
                continue
            identity = device_of(d.device_id, devices)
            if identity is None:
                unknown.add(d.device_id.split("::", 1)[0])
            else:
                offered.add(identity.label)
    for identity in devices:
        if identity.label in out.holders:
            state = "attributed"
        elif offered is not None and identity.label not in offered:
            state = "unknown_to_kubelet"
        else:
            state = "unallocated"
        out.counts[state] += 1
    out.counts["unknown_to_nvml"] = len(unknown)
    out.unknown_ids = tuple(sorted(unknown))
    return out


class PodResourcesCollector(Collector, BackgroundThread):
    """See the module docstring."""

    name = "podresources"
    blocking = False

    def __init__(
        self,
        client: PodResourcesClient,
        devices: GpuDevices,
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        Collector.__init__(self)
        BackgroundThread.__init__(self)
        self._client = client
        self._devices = devices
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._attribution: Attribution | None = None
        self._attributed_at = 0.0
        self._error = ""
        self._said = ""
        self._said_unknown: tuple[str, ...] = ()
        self.refreshes = 0
        self.refresh_seconds = 0.0  # spent in refresh() in all, for the cost it reports

    def start(self) -> None:
        self.start_thread(self._run, "podresources")

    def stop(self, timeout: float) -> None:
        self.stop_thread(timeout)
        self._client.close()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.refresh()
            except Exception as err:  # e.g. out of file descriptors: costs this collector only
                self._fail(f"asking the kubelet failed: {err!r}")
            self._ready.set()
            self.stopping.wait(self.interval)

    def refresh(self) -> None:
        """Ask the kubelet once and match its answer to NVML's devices."""
        started = time.perf_counter()
        try:
            self._refresh()
        finally:
            self.refreshes += 1
            self.refresh_seconds += time.perf_counter() - started

    def _refresh(self) -> None:
        devices = self._devices.get()
        if devices is None:
            self._fail("NVML has not enumerated the GPUs yet (the nvml collector must be on)")
            return
        try:
            assignments = self._client.list_devices()
        except PodResourcesError as err:
            self._fail(f"kubelet PodResources {err.kind}: {err}")
            return
        allocatable: list[Device] | None
        try:
            allocatable = self._client.allocatable()
        except PodResourcesError as err:
            # Older kubelets lack it: the attribution stands, only the offer is unknown.
            log.debug("GetAllocatableResources: %s", err)
            allocatable = None
        result = attribute(assignments, allocatable, devices)
        with self._lock:
            self._attribution = result
            self._attributed_at = self._clock()
            self._error = ""
        if self._said:
            log.info("kubelet PodResources answers again")
            self._said = ""
        if result.unknown_ids != self._said_unknown:
            self._said_unknown = result.unknown_ids
            if result.unknown_ids:
                log.warning(
                    "the kubelet names GPU devices NVML does not show (left unattributed): %s",
                    ", ".join(result.unknown_ids),
                )

    def _fail(self, message: str) -> None:
        with self._lock:
            self._error = message
        if message != self._said:
            log.warning(
                "%s; the last GPU-to-pod attribution is kept for at most %d refreshes",
                message,
                STALE_INTERVALS,
            )
            self._said = message

    def collect(self) -> Collection:
        with self._lock:
            attribution, at, error = self._attribution, self._attributed_at, self._error
        out = Collection(success=not error, error=error)
        if attribution is not None and self._clock() - at > STALE_INTERVALS * self.interval:
            attribution = None  # too old to trust: a pod may have ended meanwhile
        if attribution is None:
            if not error:
                out.success, out.error = False, "no answer from the kubelet yet"
            return out
        info = m.gauge("inference_gpu_pod_info")
        pods = m.gauge("inference_gpu_pods")
        for label in sorted(attribution.holders):
            identity = attribution.devices[label]
            holders = attribution.holders[label]
            for h in sorted(holders, key=lambda h: (h.namespace, h.pod, h.container)):
                info.add_metric([label, identity.uuid, h.namespace, h.pod, h.container], 1.0)
            distinct = {(h.namespace, h.pod) for h in holders}
            pods.add_metric([label, identity.uuid], float(len(distinct)))
        states = m.gauge("inference_podresources_devices")
        for state in STATES:
            states.add_metric([state], float(attribution.counts[state]))
        out.metrics = [f for f in (info, pods, states) if f.samples]
        return out


# --- flags and construction -------------------------------------------------------------------


@dataclass(frozen=True)
class PodResourcesOptions:
    """The flags of the ``podresources`` collector."""

    socket: Path = flag(
        "podresources.socket",
        DEFAULT_SOCKET,
        "The kubelet's PodResources socket (mount the host's /var/lib/kubelet/pod-resources).",
        kind="path",
        metavar="PATH",
    )
    interval: float = flag(
        "podresources.interval",
        DEFAULT_INTERVAL,
        "How often the kubelet is asked which pod holds which GPU (List and "
        "GetAllocatableResources, one call each).",
        kind="duration",
        bounds=(1.0, 600.0),
        metavar="DURATION",
    )
    deadline: float = flag(
        "podresources.deadline",
        DEFAULT_DEADLINE,
        "Deadline of each call to the kubelet.",
        kind="duration",
        bounds=(0.05, 60.0),
        metavar="DURATION",
    )


def check(settings: Settings) -> None:
    """The deadline must fit in the interval (one call in flight at a time)."""
    opts = section(PodResourcesOptions, settings)
    if opts.deadline >= opts.interval:
        raise ConfigError(
            "--podresources.deadline",
            f"{opts.deadline:g}s must be shorter than --podresources.interval ({opts.interval:g}s)",
        )


def build(settings: Settings, shared: Shared) -> PodResourcesCollector:
    opts = section(PodResourcesOptions, settings)
    client = PodResourcesClient(opts.socket, deadline=opts.deadline)
    return PodResourcesCollector(client, shared.gpu_devices, interval=opts.interval)
