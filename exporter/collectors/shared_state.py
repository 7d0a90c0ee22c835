"""State the collectors of one exporter share, built once by the collector table
(:func:`exporter.collectors.build_shared`) and handed to each collector's ``build``.

* :class:`EngineHub`: what the engine collector learned of the engine (its type, last
  snapshot, version); the tokenizer probe follows its engine type, the model collector its
  served models.
* :class:`EnginePids`: the engine's PIDs as the process collector last found them; the nvml
  collector tells them among the host PIDs NVML reports.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from exporter.engines.snapshot import EngineSnapshot


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
        with self.lock:
            snap = self.snapshot
        return sorted({s.model for s in snap.series if s.model}) if snap else []

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


@dataclass(frozen=True)
class Shared:
    """The state the collectors of one exporter share (built once per build)."""

    engine_hub: EngineHub
    engine_pids: EnginePids = field(default_factory=EnginePids)
