"""Background work steps aside while a scrape is served (exporter.priority), and every
background loop is wired to the gate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from support.paths import FIXTURES, TRACE

from exporter.backends.replay import ReplayApi, load_trace
from exporter.collectors import engine as engine_module
from exporter.collectors import nvml as nvml_module
from exporter.collectors import process as process_module
from exporter.collectors.engine import EngineCollector
from exporter.collectors.nvml import NvmlCollector
from exporter.collectors.process import ProcessCollector
from exporter.collectors.shared_state import EngineHub
from exporter.engines import select_families
from exporter.engines.parse import parse_exposition
from exporter.priority import ScrapeGate

VLLM = (FIXTURES / "engines" / "vllm.txt").read_text()


def _step_aside_in_thread(gate: ScrapeGate) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        gate.step_aside()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_without_a_scrape_step_aside_does_not_wait() -> None:
    gate = ScrapeGate(max_wait=60.0)
    gate.step_aside()
    assert gate.waits == 0


def test_background_waits_until_the_scrape_is_served() -> None:
    gate = ScrapeGate(max_wait=60.0)
    with gate.serving():
        thread, done = _step_aside_in_thread(gate)
        assert not done.wait(0.2)  # still held while the request is in flight
    started = time.monotonic()
    thread.join(10)
    assert done.is_set()
    assert time.monotonic() - started < 10  # released by the end of the request, not max_wait
    assert gate.waits == 1


def test_concurrent_scrapes_hold_until_the_last_one_ends() -> None:
    gate = ScrapeGate(max_wait=60.0)
    first, second = gate.serving(), gate.serving()
    first.__enter__()
    second.__enter__()
    thread, done = _step_aside_in_thread(gate)
    first.__exit__(None, None, None)
    assert not done.wait(0.2)
    second.__exit__(None, None, None)
    thread.join(10)
    assert done.is_set()


def test_scrapes_back_to_back_cannot_stop_background_work() -> None:
    gate = ScrapeGate(max_wait=0.05)
    with gate.serving():
        for _ in range(3):
            thread, done = _step_aside_in_thread(gate)
            thread.join(10)
            assert done.is_set()  # gave up waiting after max_wait, request still in flight
    assert gate.waits == 3


def test_an_exception_in_the_request_releases_the_gate() -> None:
    gate = ScrapeGate(max_wait=60.0)
    with pytest.raises(RuntimeError), gate.serving():
        raise RuntimeError("render failed")
    gate.step_aside()
    assert gate.waits == 0


# --- wiring: each background loop asks the gate between items -------------------------------


@pytest.fixture
def busy_gate() -> Iterator[ScrapeGate]:
    """A gate with a request in flight that never waits: counts each step aside."""
    gate = ScrapeGate(max_wait=0.0)
    with gate.serving():
        yield gate


def test_engine_parse_steps_aside_per_family(busy_gate: ScrapeGate) -> None:
    selected, _, _ = select_families(VLLM, frozenset({"vllm:num_requests_waiting"}))
    families = parse_exposition(selected, busy_gate.step_aside)
    assert busy_gate.waits == len(families) == 1
    before = busy_gate.waits
    everything = parse_exposition(VLLM, busy_gate.step_aside)
    assert busy_gate.waits - before >= len(everything) > 10


def test_engine_poll_digest_uses_the_process_gate(
    busy_gate: ScrapeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "SCRAPES", busy_gate)
    collector = EngineCollector(EngineHub(configured="auto"), "http://127.0.0.1:9/metrics")
    snapshot = collector._digest(VLLM.encode())
    assert snapshot.series
    lines = VLLM.count("\n")
    assert busy_gate.waits >= 1 + lines // 256  # select_families every 256 lines, then families


def test_background_process_scan_steps_aside_per_process(
    busy_gate: ScrapeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_module, "SCRAPES", busy_gate)
    listed = list(psutil.process_iter())
    collector = ProcessCollector("python", process_iter=lambda: iter(listed), interval=3600.0)
    collector.start()
    try:
        assert collector.wait_ready(10)
    finally:
        collector.stop(5)
    assert busy_gate.waits >= len(listed)
    # a scan inside a scrape (no background interval) never waits for the scrape itself
    inline = ProcessCollector("python", process_iter=lambda: iter(listed))
    before = busy_gate.waits
    assert inline.collect().success
    assert busy_gate.waits == before


def test_gpu_pollers_step_aside_before_each_read(
    busy_gate: ScrapeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_module, "SCRAPES", busy_gate)
    replay = ReplayApi(load_trace(TRACE))
    collector = NvmlCollector(lambda: replay, poll_interval=0.01, deadline=2.0)
    collector.start()
    try:
        assert collector.wait_ready(10)
        deadline = time.monotonic() + 10
        while busy_gate.waits < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        collector.stop(5)
    assert busy_gate.waits >= 6  # two GPUs, several reads each
