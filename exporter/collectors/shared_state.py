"""State the collectors of one exporter share, built once by the collector table
(:func:`exporter.collectors.build_shared`) and handed to each collector's ``build``; the
collectors never import each other.

* :class:`EngineOptions`: the engine's flags, which the engine collector polls with and the
  tokenizer probe follows.
* :class:`EngineHub`: what the engine collector learned of the engine (its type, last
  snapshot, version); the tokenizer probe follows its engine type and its engine-reported
  tokenizer latency, the model collector its served models.
* :class:`EnginePids`: the engine's PIDs as the process collector last found them; the nvml
  collector tells them among the host PIDs NVML reports.
* :class:`GpuDevices`: the devices the nvml collector enumerated; the podresources collector
  matches the kubelet's device IDs to them.
* :class:`GpuHolders`: the pods the podresources collector found holding each device; the
  nvml collector labels each device's series with them (the node agent).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.backends.gpu_reader import GpuIdentity
from exporter.config import flag
from exporter.engines import ENGINES
from exporter.engines.snapshot import ROLES, EngineSnapshot, Role

#: An engine snapshot older than this many engine polls is stale: its series disappear.
STALE_INTERVALS = 3


@dataclass(frozen=True)
class EngineOptions:
    """The flags of the engine: the ``engine`` collector polls it with them, the tokenizer
    probe follows its first URL, timeout and poll interval, and the hub starts from its
    type."""

    url: tuple[str, ...] = flag(
        "engine.url",
        ("http://127.0.0.1:8000/metrics",),
        "The engine's own Prometheus endpoint (configuration only, never taken from a request); "
        "give it several times (or comma-separated) to poll several endpoints, e.g. a Dynamo "
        "frontend and its worker or disaggregated prefill and decode servers (docs/engines.md).",
        kind="url",
        metavar="URL",
        multiple=True,
    )
    api_url: tuple[str, ...] = flag(
        "engine.api-url",
        (),
        "The engine's HTTP API, where its version, model names and model configurations are "
        "asked (scheme, host and port, e.g. http://127.0.0.1:8000): one per --engine.url, in "
        "the same order. Default: the metrics URL's host, port 8000 where the metrics are on "
        "8002 (Triton), else the metrics URL's own port. Triton's model configurations say "
        "which models are ensemble steps, so each client request counts once "
        "(docs/engines.md).",
        kind="url",
        metavar="URL",
        multiple=True,
    )
    type: str = flag(
        "engine.type",
        "auto",
        "Engine whose metric names to read; auto recognises it from the names (each endpoint "
        "on its own).",
        kind="choice",
        choices=("auto", *ENGINES),
    )
    role: Role = flag(
        "engine.role",
        "both",
        "This server's part in disaggregated serving, carried as label role by every engine "
        "series: prefill, decode, or both (colocated). An engine whose metrics say it (SGLang's "
        "engine_type) is believed over this flag; vLLM's do not (docs/engines.md).",
        kind="choice",
        choices=ROLES,
    )
    mapping_file: Path | None = flag(
        "engine.mapping-file",
        None,
        "YAML mapping of an in-house server's metrics to the normalised names (engine.type "
        "custom; docs/engines.md).",
        kind="path",
        metavar="PATH",
    )
    poll_interval: float = flag(
        "engine.poll-interval",
        5.0,
        "How often the engine's metrics are polled (off the scrape path).",
        kind="duration",
        bounds=(0.5, 300.0),
        metavar="DURATION",
    )
    timeout: float = flag(
        "engine.timeout",
        2.0,
        "Deadline of one engine poll, body included (slow-drip bodies are cut).",
        kind="duration",
        bounds=(0.1, 60.0),
        metavar="DURATION",
    )
    max_body: int = flag(
        "engine.max-body",
        16 * 1024**2,
        "Largest engine response read; a larger one is a failed poll.",
        kind="bytes",
        bounds=(1024, 1024**3),
        metavar="SIZE",
    )
    max_series: int = flag(
        "engine.max-series",
        1000,
        "Most normalised series kept per metric; the rest are dropped and counted.",
        kind="int",
        bounds=(1, 1_000_000),
        metavar="N",
    )


@dataclass
class EngineHub:
    """What the engine collector learned of one endpoint; the first endpoint's is shared with
    the tokenizer and model collectors."""

    configured: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    detected: str | None = None
    snapshot: EngineSnapshot | None = None
    snapshot_at: float = 0.0
    last_success_wall: float | None = None
    up: bool = False
    version: str = ""

    @property
    def engine(self) -> str:
        """The engine label: the configured type, else the detected one, else ``unknown``."""
        if self.configured != "auto":
            return self.configured
        return self.detected or "unknown"

    def models(self) -> list[str]:
        """The models of the last snapshot, as the ``model`` label names them."""
        with self.lock:
            snap = self.snapshot
        return sorted({s.model for s in snap.series if s.model}) if snap else []

    def served_names(self) -> list[str]:
        """The same models as the engine itself calls them (what its API expects back)."""
        with self.lock:
            snap = self.snapshot
        if snap is None:
            return []
        models = sorted({s.model for s in snap.series if s.model})
        return [snap.models.get(model, (model, ""))[0] for model in models]

    def fresh(self, now: float, max_age: float) -> EngineSnapshot | None:
        with self.lock:
            if self.snapshot is not None and now - self.snapshot_at <= max_age:
                return self.snapshot
        return None


class EnginePids:
    """The engine's PIDs as the ``process`` collector last found them, in the sidecar's PID
    namespace; the ``nvml`` collector matches them to the host PIDs NVML reports."""

    def __init__(self) -> None:
        self._pids: frozenset[int] | None = None
        self._lock = threading.Lock()

    def publish(self, pids: frozenset[int]) -> None:
        with self._lock:
            self._pids = pids

    def get(self) -> frozenset[int] | None:
        """None until the first scan."""
        with self._lock:
            return self._pids


class GpuDevices:
    """The GPUs and MIG devices the ``nvml`` collector watches, as its last NVML session
    enumerated them; the ``podresources`` collector matches the kubelet's device IDs to them."""

    def __init__(self) -> None:
        self._devices: tuple[GpuIdentity, ...] | None = None
        self._lock = threading.Lock()

    def publish(self, devices: tuple[GpuIdentity, ...]) -> None:
        with self._lock:
            self._devices = devices

    def get(self) -> tuple[GpuIdentity, ...] | None:
        """None until NVML has been initialised once."""
        with self._lock:
            return self._devices


@dataclass(frozen=True, order=True)
class Holder:
    """A container the kubelet gave a device to."""

    namespace: str
    pod: str
    container: str


#: Each device's holders by device label (``gpu``), sorted; None while unknown.
Holders = Mapping[str, tuple[Holder, ...]]


class GpuHolders:
    """Which containers hold each GPU and MIG device, as the ``podresources`` collector last
    matched the kubelet's answer (its staleness rule applied); the ``nvml`` collector gives each
    device's series its holders' labels. Attached once the podresources collector is built:
    without it (a sidecar) nothing is attached and no series is relabelled."""

    def __init__(self) -> None:
        self._source: Callable[[], Holders | None] | None = None

    def attach(self, source: Callable[[], Holders | None]) -> None:
        self._source = source

    @property
    def attached(self) -> bool:
        return self._source is not None

    def get(self) -> Holders | None:
        """The holders now; None when not attached or the attribution is unknown (no answer
        from the kubelet yet, or one too old to trust)."""
        return self._source() if self._source is not None else None


@dataclass(frozen=True)
class Shared:
    """The state the collectors of one exporter share (built once per build)."""

    engine_hub: EngineHub
    engine_pids: EnginePids = field(default_factory=EnginePids)
    gpu_devices: GpuDevices = field(default_factory=GpuDevices)
    gpu_holders: GpuHolders = field(default_factory=GpuHolders)
