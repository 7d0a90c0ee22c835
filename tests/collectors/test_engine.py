"""The engine collector against the fake engine: normalisation, staleness, hostile endpoints."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from support.fakeengine import FakeEngine, gzip_bomb, unused_port
from support.metrics import registry_of

from exporter.backends.http import make_session
from exporter.collectors.base import Collection
from exporter.collectors.engine import EngineCollector, EngineHub

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V = {"engine": "vllm", "model": MODEL}


def scrape(collector: EngineCollector) -> tuple[CollectorRegistry, Collection]:
    collection = collector.collect()
    return registry_of(collection), collection


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    async with FakeEngine() as fake:
        yield fake


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session() as s:
        yield s


def make(url: str, clock: Clock | None = None, **kw: object) -> EngineCollector:
    return EngineCollector(
        EngineHub(configured=str(kw.pop("engine_type", "auto"))),
        url,
        poll_interval=5.0,
        timeout=0.5,
        clock=clock or Clock(),
        **kw,  # type: ignore[arg-type]
    )


async def test_normalises_vllm_exactly(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    collector = make(engine.url + "/metrics")
    await collector.tick(session)
    reg, collection = scrape(collector)
    assert collection.success
    g = reg.get_sample_value
    assert g("inference_engine_up", {"engine": "vllm"}) == 1
    assert g("inference_queue_depth", V) == 1
    assert g("inference_requests_running", V) == 3
    assert g("inference_kv_cache_usage_ratio", V) == pytest.approx(0.42)
    assert g("inference_prompt_tokens_total", V) == 12345
    assert g("inference_generation_tokens_total", V) == 6789
    assert g("inference_time_to_first_token_seconds_bucket", {**V, "le": "0.01"}) == 2
    assert g("inference_time_to_first_token_seconds_bucket", {**V, "le": "1.0"}) == 9
    assert g("inference_time_to_first_token_seconds_bucket", {**V, "le": "+Inf"}) == 10
    assert g("inference_time_to_first_token_seconds_count", V) == 10
    assert g("inference_time_to_first_token_seconds_sum", V) == pytest.approx(2.5)
    assert g("inference_engine_last_success_timestamp_seconds", {"engine": "vllm"}) == (
        pytest.approx(time.time(), abs=30)
    )
    assert engine.last_headers.get("Accept", "").startswith("text/plain")


async def test_configured_type_wins_over_detection(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    collector = make(engine.url + "/metrics", engine_type="vllm")
    await collector.tick(session)
    reg, _ = scrape(collector)
    assert reg.get_sample_value("inference_queue_depth", V) == 1


async def test_series_go_stale_after_three_intervals(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    clock = Clock()
    collector = make(engine.url + "/metrics", clock)
    await collector.tick(session)
    engine.set_mode("500", route="metrics")
    clock.now += 5
    await collector.tick(session)
    reg, collection = scrape(collector)
    # one failed poll: up says so at once, the last good values stay for now
    assert reg.get_sample_value("inference_engine_up", {"engine": "vllm"}) == 0
    assert not collection.success
    assert "status" in collection.error
    assert reg.get_sample_value("inference_queue_depth", V) == 1
    clock.now += 10.1  # last success now more than 3 x 5 s old
    reg, _ = scrape(collector)
    assert reg.get_sample_value("inference_queue_depth", V) is None
    assert (
        reg.get_sample_value(
            "inference_engine_poll_failures_total", {"engine": "vllm", "reason": "status"}
        )
        == 1
    )
    engine.set_mode("ok", route="metrics")
    await collector.tick(session)
    reg, collection = scrape(collector)
    assert collection.success
    assert reg.get_sample_value("inference_queue_depth", V) == 1


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("500", "status"),
        ("hang", "timeout"),
        ("slow_drip", "timeout"),
        ("huge", "too_large"),
        ("gzip_bomb", "too_large"),
        ("garbage", "parse"),
        ("close", "connect"),
    ],
)
async def test_hostile_endpoint_is_a_counted_failure(
    engine: FakeEngine, session: aiohttp.ClientSession, mode: str, reason: str
) -> None:
    collector = make(engine.url + "/metrics", max_body=1024 * 1024)
    gzip_bomb()  # built once and cached: keep its construction out of the timed poll
    engine.set_mode(mode, route="metrics")
    start = time.monotonic()
    await collector.tick(session)
    assert time.monotonic() - start < 0.5 + 0.5
    reg, collection = scrape(collector)
    assert not collection.success
    assert reg.get_sample_value("inference_engine_up", {"engine": "unknown"}) == 0
    assert (
        reg.get_sample_value(
            "inference_engine_poll_failures_total", {"engine": "unknown", "reason": reason}
        )
        == 1
    )


async def test_connection_refused(session: aiohttp.ClientSession) -> None:
    collector = make(f"http://127.0.0.1:{unused_port()}/metrics")
    await collector.tick(session)
    reg, collection = scrape(collector)
    assert not collection.success
    assert (
        reg.get_sample_value(
            "inference_engine_poll_failures_total", {"engine": "unknown", "reason": "connect"}
        )
        == 1
    )


async def test_unrecognised_engine(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    engine.metrics_body = "# TYPE something_else gauge\nsomething_else 1\n"
    collector = make(engine.url + "/metrics")
    await collector.tick(session)
    reg, collection = scrape(collector)
    assert not collection.success
    assert "recognise" in collection.error
    assert (
        reg.get_sample_value(
            "inference_engine_poll_failures_total", {"engine": "unknown", "reason": "unrecognised"}
        )
        == 1
    )


async def test_nan_inf_and_duplicates_do_not_break_it(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    collector = make(engine.url + "/metrics")
    engine.set_mode("nan_inf", route="metrics")
    await collector.tick(session)
    reg, collection = scrape(collector)
    # the poll parsed: the engine is up, but no non-finite value is re-exported
    assert collection.success
    for name in ("inference_requests_running", "inference_queue_depth"):
        assert reg.get_sample_value(name, V) is None
    assert reg.get_sample_value("inference_kv_cache_usage_ratio", V) is None
    assert reg.get_sample_value("inference_prompt_tokens_total", V) is None
    engine.set_mode("duplicate_families", route="metrics")
    await collector.tick(session)
    reg, collection = scrape(collector)
    assert collection.success
    assert reg.get_sample_value("inference_requests_running", V) == 3  # the first one wins
    assert reg.get_sample_value("inference_queue_depth", V) == 1


async def test_max_series_drops_and_counts(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    lines = ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [f'vllm:num_requests_waiting{{model_name="m{i}"}} {i}' for i in range(5)]
    engine.metrics_body = "\n".join(lines) + "\n"
    collector = make(engine.url + "/metrics", max_series=3)
    await collector.tick(session)
    reg, _ = scrape(collector)
    kept = [
        reg.get_sample_value("inference_queue_depth", {"engine": "vllm", "model": f"m{i}"})
        for i in range(5)
    ]
    assert sum(v is not None for v in kept) == 3
    assert (
        reg.get_sample_value(
            "inference_engine_series_dropped_total",
            {"engine": "vllm", "metric": "inference_queue_depth"},
        )
        == 2
    )


def test_background_thread_polls_and_stops_promptly() -> None:
    with FakeEngine.run_in_thread() as fake:
        collector = EngineCollector(
            EngineHub(configured="auto"), fake.url + "/metrics", poll_interval=0.5, timeout=0.5
        )
        collector.start()
        try:
            assert collector.wait_ready(5)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and fake.requests["/metrics"] < 2:
                time.sleep(0.05)
            assert fake.requests["/metrics"] >= 2
            reg, _ = scrape(collector)
            assert reg.get_sample_value("inference_queue_depth", V) == 1
            polls = fake.requests["/metrics"]
            fake.set_mode("hang", route="metrics")
            # stop while a poll hangs in flight
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and fake.requests["/metrics"] <= polls:
                time.sleep(0.02)
            assert fake.requests["/metrics"] > polls
        finally:
            start = time.monotonic()
            collector.stop(3)
            assert time.monotonic() - start < 2
