"""ScrapeCoordinator: one deadline per scrape, one run in flight per collector, per-collector success."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from support.clock import FakeClock

from exporter.collectors.base import Collection, Collector
from exporter.server.scrape import ScrapeCoordinator

DEADLINE = 0.2
# Thread start-up and scheduling on a loaded CI machine; far below any deadline we test.
SLACK = 0.15


def value_family(name: str, value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, f"{name} of a fake collector")
    fam.add_metric([], value)
    return fam


class Healthy(Collector):
    """Emits ``fake_healthy_value 42``; advances the clock by ``takes`` while collecting."""

    name = "healthy"

    def __init__(self, clock: FakeClock | None = None, takes: float = 0.0) -> None:
        self.clock = clock
        self.takes = takes
        self.calls = 0

    def collect(self) -> Collection:
        self.calls += 1
        if self.clock is not None:
            self.clock.advance(self.takes)
        return Collection(metrics=[value_family("fake_healthy_value", 42.0)])


class Raising(Collector):
    name = "raising"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Collection:
        self.calls += 1
        raise RuntimeError("procfs vanished")


class PartlyFailing(Collector):
    """Lost part of its source: unsuccessful, yet still reports what it has."""

    name = "partial"

    def collect(self) -> Collection:
        return Collection(
            metrics=[value_family("fake_partial_value", 7.0)],
            success=False,
            error="gpu 1 lost",
        )


class Blocking(Collector):
    """Blocks in ``collect`` until released (at most ``limit`` seconds, so tests cannot hang)."""

    name = "blocking"

    def __init__(self, limit: float = 10.0) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()
        self.limit = limit
        self.calls = 0
        self._lock = threading.Lock()

    def collect(self) -> Collection:
        with self._lock:
            self.calls += 1
        self.entered.set()
        try:
            self.release.wait(self.limit)
            return Collection(metrics=[value_family("fake_blocking_value", 1.0)])
        finally:
            self.returned.set()


def scrape(coordinator: ScrapeCoordinator) -> tuple[CollectorRegistry, float]:
    """Run one scrape; returns a registry holding its output, and how long it took."""
    start = time.monotonic()
    metrics = list(coordinator.collect())
    took = time.monotonic() - start

    class Frozen:
        def collect(self) -> Iterator[Metric]:
            yield from metrics

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Frozen())
    return registry, took


def success(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value("inference_scrape_collector_success", {"collector": name})


def duration(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(
        "inference_scrape_collector_duration_seconds", {"collector": name}
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@pytest.fixture
def blocking() -> Iterator[Blocking]:
    collector = Blocking()
    yield collector
    collector.release.set()  # never leave a worker thread waiting after the test


def test_healthy_collector_reports_success_and_exact_duration(clock: FakeClock) -> None:
    healthy = Healthy(clock, takes=0.125)
    coordinator = ScrapeCoordinator([healthy], deadline=DEADLINE, clock=clock)
    try:
        assert coordinator.statuses["healthy"].success is None  # not run yet
        reg, _ = scrape(coordinator)
        assert success(reg, "healthy") == 1
        assert duration(reg, "healthy") == pytest.approx(0.125)
        assert reg.get_sample_value("fake_healthy_value") == 42
        status = coordinator.statuses["healthy"]
        assert status.success is True
        assert status.duration == pytest.approx(0.125)
        assert status.error == ""
        assert healthy.calls == 1
    finally:
        coordinator.close()


def test_raising_collector_costs_only_its_own_metrics(clock: FakeClock) -> None:
    healthy, raising = Healthy(clock, takes=0.01), Raising()
    coordinator = ScrapeCoordinator([raising, healthy], deadline=DEADLINE, clock=clock)
    try:
        reg, took = scrape(coordinator)
        assert took < DEADLINE  # nothing waited for the deadline
        assert success(reg, "raising") == 0
        assert success(reg, "healthy") == 1
        assert reg.get_sample_value("fake_healthy_value") == 42
        assert duration(reg, "healthy") == pytest.approx(0.01)
        # the scrape's clock moved only by the healthy collector's 0.01 s
        assert duration(reg, "raising") == pytest.approx(0.01)
        names = {s.name for fam in reg.collect() for s in fam.samples}
        assert names == {
            "fake_healthy_value",
            "inference_scrape_collector_success",
            "inference_scrape_collector_duration_seconds",
        }
        assert coordinator.statuses["raising"].success is False
        assert coordinator.statuses["raising"].error == "RuntimeError: procfs vanished"
        assert coordinator.statuses["healthy"].success is True
        # it is tried again on the next scrape, not given up on
        scrape(coordinator)
        assert raising.calls == 2
    finally:
        coordinator.close()


def test_unsuccessful_collection_keeps_its_metrics(clock: FakeClock) -> None:
    coordinator = ScrapeCoordinator([PartlyFailing()], deadline=DEADLINE, clock=clock)
    try:
        reg, _ = scrape(coordinator)
        assert success(reg, "partial") == 0
        assert reg.get_sample_value("fake_partial_value") == 7
        assert coordinator.statuses["partial"].error == "gpu 1 lost"
    finally:
        coordinator.close()


def test_blocked_collector_hits_the_deadline_and_is_not_called_twice(
    blocking: Blocking,
) -> None:
    healthy = Healthy()
    coordinator = ScrapeCoordinator([blocking, healthy], deadline=DEADLINE)
    try:
        reg, took = scrape(coordinator)
        assert blocking.entered.is_set()
        assert DEADLINE - 0.01 <= took < DEADLINE + SLACK
        assert success(reg, "blocking") == 0
        assert duration(reg, "blocking") == DEADLINE
        assert reg.get_sample_value("fake_blocking_value") is None
        assert success(reg, "healthy") == 1
        assert reg.get_sample_value("fake_healthy_value") == 42
        status = coordinator.statuses["blocking"]
        assert status.success is False
        assert status.duration == DEADLINE
        assert status.error == "still running after 0.2s deadline"

        # Still blocked: no second run is started, and the scrape does not wait for it.
        reg, took = scrape(coordinator)
        assert took < SLACK
        assert blocking.calls == 1
        assert healthy.calls == 2
        assert success(reg, "blocking") == 0
        assert duration(reg, "blocking") == DEADLINE
        assert reg.get_sample_value("fake_blocking_value") is None
        assert success(reg, "healthy") == 1
        assert coordinator.statuses["blocking"].error == "previous run still in flight"

        # Released: the stuck run ends, and the next scrape runs it afresh and succeeds.
        blocking.release.set()
        assert blocking.returned.wait(2)
        time.sleep(0.05)  # the worker marks its future done right after collect() returns
        reg, took = scrape(coordinator)
        assert took < SLACK
        assert blocking.calls == 2
        assert success(reg, "blocking") == 1
        took_blocking = duration(reg, "blocking")
        assert took_blocking is not None and took_blocking < DEADLINE
        assert reg.get_sample_value("fake_blocking_value") == 1
        status = coordinator.statuses["blocking"]
        assert status.success is True
        assert status.error == ""
    finally:
        blocking.release.set()
        coordinator.close()


def test_statuses_follow_the_last_result(clock: FakeClock) -> None:
    class Flaky(Collector):
        name = "flaky"
        fail = True

        def collect(self) -> Collection:
            if self.fail:
                raise OSError("stat: no such file")
            return Collection(metrics=[value_family("fake_flaky_value", 3.0)])

    flaky = Flaky()
    coordinator = ScrapeCoordinator([flaky], deadline=DEADLINE, clock=clock)
    try:
        scrape(coordinator)
        assert coordinator.statuses["flaky"].success is False
        assert coordinator.statuses["flaky"].error == "OSError: stat: no such file"
        flaky.fail = False
        reg, _ = scrape(coordinator)
        assert success(reg, "flaky") == 1
        assert coordinator.statuses["flaky"].success is True
        assert coordinator.statuses["flaky"].error == ""
        assert list(coordinator.statuses) == ["flaky"]
    finally:
        coordinator.close()


def test_non_blocking_collectors_run_inline_with_the_same_reporting(clock: FakeClock) -> None:
    class InlineHealthy(Healthy):
        blocking = False

    class InlineRaising(Raising):
        blocking = False

    healthy, raising = InlineHealthy(clock, takes=0.25), InlineRaising()
    coordinator = ScrapeCoordinator([raising, healthy], deadline=DEADLINE, clock=clock)
    try:
        reg, _ = scrape(coordinator)
        assert success(reg, "healthy") == 1
        assert duration(reg, "healthy") == pytest.approx(0.25)
        assert reg.get_sample_value("fake_healthy_value") == 42
        assert success(reg, "raising") == 0
        assert coordinator.statuses["raising"].error == "RuntimeError: procfs vanished"
        # inline: no worker thread was ever started for them
        assert all(s.inflight is None for s in coordinator._slots)
    finally:
        coordinator.close()


class Noting(Collector):
    """Works, with a standing note (a probe with nothing to probe: Triton has no tokenizer)."""

    name = "noting"

    def __init__(self) -> None:
        self.note = "triton has no tokenize endpoint: set --tokenizer.url"

    def collect(self) -> Collection:
        return Collection(metrics=[value_family("fake_noting_value", 1.0)], error=self.note)


def test_a_standing_note_is_logged_once_and_recovery_only_when_it_goes(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    collector = Noting()
    coordinator = ScrapeCoordinator([collector], deadline=DEADLINE, clock=clock)
    try:
        with caplog.at_level("INFO", logger="exporter.server.scrape"):
            for _ in range(4):
                scrape(coordinator)
            collector.note = ""
            scrape(coordinator)
            scrape(coordinator)
        messages = [r.getMessage() for r in caplog.records]
        assert messages == [
            "collector noting: triton has no tokenize endpoint: set --tokenizer.url",
            "collector noting recovered",
        ]
    finally:
        coordinator.close()
