"""What every collector is: a name, an optional background life, and ``collect()``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import aiohttp
from prometheus_client.metrics_core import Metric

T = TypeVar("T")


@dataclass
class Collection:
    """One collector's output for one scrape.

    ``success`` false with metrics is allowed: a collector that lost one GPU still reports
    the others (and says which is missing through its own ``_up`` metrics).
    """

    metrics: list[Metric] = field(default_factory=list)
    success: bool = True
    error: str = ""


class Collector:
    """Base class. Subclasses set ``name`` and implement :meth:`collect`.

    ``collect`` must be cheap (it runs on every scrape, under a deadline): anything that can
    block belongs in a background thread started by :meth:`start`.
    """

    name = ""
    # False for collectors whose collect() only reads state that background threads keep
    # (short locks, no I/O): the scrape then runs them inline instead of in a worker thread.
    blocking = True

    def start(self) -> None:
        """Start background work (pollers). Default: none."""

    def stop(self, timeout: float) -> None:
        """Stop background work within ``timeout`` seconds. Default: none."""

    def wait_ready(self, timeout: float) -> bool:
        """Block until the first reading exists or ``timeout`` passes; True when ready."""
        return True

    def collect(self) -> Collection:
        raise NotImplementedError

    def notices(self) -> list[str]:
        """What the landing page should tell a reader about this collector's readings (a doubt
        about what they mean, not an error). Default: nothing."""
        return []


class BackgroundThread:
    """One daemon thread of a collector, started by :meth:`start_thread` and stopped by
    :meth:`stop_thread` (the target ends when ``self.stopping`` is set)."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start_thread(self, target: Callable[[], None], name: str) -> None:
        self.stopping.clear()
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def stop_thread(self, timeout: float) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)


class HttpPollingCollector(Collector):
    """A collector whose source is polled over HTTP from a thread with its own event loop.

    A hostile or hung endpoint then stalls only this thread, never the exporter's HTTP server
    or another collector. Subclasses set ``interval`` and implement :meth:`tick`; ``collect``
    serves what the ticks left behind.
    """

    interval = 5.0
    blocking = False

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self._first_tick = threading.Event()

    async def tick(self, session: aiohttp.ClientSession) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._stop_requested.clear()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop_requested.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_ready(self, timeout: float) -> bool:
        return self._first_tick.wait(timeout)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from exporter.backends.http import make_session  # noqa: PLC0415

        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested.is_set():
            return
        async with make_session() as session:
            while not self._stopping.is_set():
                started = time.monotonic()
                await self.tick(session)
                self._first_tick.set()
                wait = max(0.0, self.interval - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=wait)


class WindowHistory(Generic[T]):
    """Past reads, so each read can be compared with the newest one ``min_window`` older.

    A read is kept only when at least ``min_window / slots`` after the last kept one, and reads
    older than the chosen baseline are dropped: however often scrapes come (two Prometheus
    replicas, a curl loop), the history holds a handful of entries. Thread-safe.
    """

    def __init__(self, min_window: float, slots: int = 4) -> None:
        self.min_window = min_window
        self._spacing = min_window / slots
        self._reads: deque[tuple[float, T]] = deque(maxlen=slots + 2)
        self._lock = threading.Lock()

    def push(self, at: float, value: T) -> tuple[float, T] | None:
        """Remember ``value`` read at ``at``; return the baseline ``(at, value)`` or None."""
        with self._lock:
            baseline: tuple[float, T] | None = None
            for earlier in reversed(self._reads):
                if at - earlier[0] >= self.min_window:
                    baseline = earlier
                    break
            if baseline is not None:
                # Reads older than the baseline can never be the newest old-enough one again.
                while self._reads[0] is not baseline:
                    self._reads.popleft()
            if not self._reads or at - self._reads[-1][0] >= self._spacing:
                self._reads.append((at, value))
            return baseline
