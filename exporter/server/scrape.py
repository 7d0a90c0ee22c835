"""Run every collector of a scrape under one deadline, and report each one's success.

Each collector runs in its own single worker thread with at most one run in flight: a
collector still stuck from an earlier scrape is reported as failed at once instead of
piling up another run. A collector that raises or times out costs its own metrics only
(node_exporter's ``execute()`` pattern).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PromCollector

from exporter import metrics as m
from exporter.collectors.base import Collection, Collector

log = logging.getLogger(__name__)


@dataclass
class CollectorStatus:
    """What the landing page shows for a collector."""

    success: bool | None = None
    duration: float = 0.0
    error: str = ""
    at: float = 0.0


class _Slot:
    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"collect-{collector.name}"
        )
        self.inflight: Future[tuple[Collection, float]] | None = None
        self.status = CollectorStatus()
        self.last_error_logged = ""


class ScrapeCoordinator(PromCollector):
    """A prometheus_client collector that fans out to the exporter's collectors."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
        watch: Callable[[Metric], None] | None = None,
    ) -> None:
        self.deadline = deadline
        self._watch = watch  # sees every family collected (the landing page's history)
        self._clock = clock
        self._slots = [_Slot(c) for c in collectors]
        self._lock = threading.Lock()

    @property
    def statuses(self) -> dict[str, CollectorStatus]:
        return {s.collector.name: s.status for s in self._slots}

    def notices(self) -> list[tuple[str, str]]:
        """Each collector's notices for the landing page, as (collector, text)."""
        return [(s.collector.name, text) for s in self._slots for text in s.collector.notices()]

    def collect(self) -> Iterator[Metric]:
        started = self._clock()
        success = m.gauge("inference_scrape_collector_success")
        duration = m.gauge("inference_scrape_collector_duration_seconds")
        with self._lock:
            pending: dict[_Slot, Future[tuple[Collection, float]]] = {}
            for slot in self._slots:
                if not slot.collector.blocking:
                    continue
                if slot.inflight is not None and not slot.inflight.done():
                    continue  # still stuck since an earlier scrape
                slot.inflight = slot.executor.submit(_timed, slot.collector, self._clock)
                pending[slot] = slot.inflight
            wait_futures(list(pending.values()), timeout=self.deadline)
            for slot in self._slots:
                result, took, error = self._outcome(slot, pending.get(slot), started)
                ok = result is not None and result.success
                self._record(slot, ok, took, error)
                success.add_metric([slot.collector.name], 1.0 if ok else 0.0)
                duration.add_metric([slot.collector.name], took)
                if result is not None:
                    for family in result.metrics:
                        if self._watch is not None:
                            self._watch(family)
                        yield family
        yield success
        yield duration

    def _outcome(
        self, slot: _Slot, fut: Future[tuple[Collection, float]] | None, started: float
    ) -> tuple[Collection | None, float, str]:
        """(collection or None, seconds taken, error) of one collector in this scrape."""
        if not slot.collector.blocking:
            # Reads state kept by background threads: cheap, run inline.
            try:
                result, took = _timed(slot.collector, self._clock)
            except Exception as exc:
                return None, self._clock() - started, f"{type(exc).__name__}: {exc}"
            return result, took, result.error
        if fut is None:
            return None, self.deadline, "previous run still in flight"
        if not fut.done():
            return None, self.deadline, f"still running after {self.deadline:g}s deadline"
        failure = fut.exception()
        if failure is not None:
            return None, self._clock() - started, f"{type(failure).__name__}: {failure}"
        result, took = fut.result()
        return result, took, result.error

    def _record(self, slot: _Slot, ok: bool, took: float, error: str) -> None:
        slot.status = CollectorStatus(success=ok, duration=took, error=error, at=time.time())
        if error and error != slot.last_error_logged:
            if ok:
                log.info("collector %s: %s", slot.collector.name, error)
            else:
                log.warning("collector %s failed: %s", slot.collector.name, error)
        elif ok and not error and slot.last_error_logged:
            # Only when the message is gone: a collector that works with a standing note (a
            # probe with no endpoint to probe) logs it once, not a "recovered" every scrape.
            log.info("collector %s recovered", slot.collector.name)
        slot.last_error_logged = error

    def close(self) -> None:
        for slot in self._slots:
            slot.executor.shutdown(wait=False, cancel_futures=True)


def _timed(collector: Collector, clock: Callable[[], float]) -> tuple[Collection, float]:
    start = clock()
    result = collector.collect()
    return result, clock() - start
