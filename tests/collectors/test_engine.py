"""The engine collector against the fake engine: normalisation, staleness, hostile endpoints."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry
from support.clock import FakeClock
from support.fakeengine import DEFAULT_METRICS, FakeEngine, gzip_bomb, unused_port
from support.metrics import registry_of
from support.paths import FIXTURES as ALL_FIXTURES

from exporter.backends.http import make_session
from exporter.collectors.base import Collection
from exporter.collectors.engine import (
    EngineCollector,
    api_url,
    default_api,
    endpoint_labels,
    version_of,
)
from exporter.collectors.shared_state import EngineHub

FIXTURES = ALL_FIXTURES / "engines"

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V = {"engine": "vllm", "model": MODEL, "role": "both"}


def scrape(collector: EngineCollector) -> tuple[CollectorRegistry, Collection]:
    collection = collector.collect()
    return registry_of(collection), collection


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    async with FakeEngine() as fake:
        yield fake


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session() as s:
        yield s


def make(url: str, clock: FakeClock | None = None, **kw: object) -> EngineCollector:
    return EngineCollector(
        EngineHub(configured=str(kw.pop("engine_type", "auto"))),
        url,
        poll_interval=5.0,
        timeout=0.5,
        clock=clock or FakeClock(100.0),
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
    clock = FakeClock(100.0)
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
        reg.get_sample_value(
            "inference_queue_depth", {"engine": "vllm", "model": f"m{i}", "role": "both"}
        )
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


# --- every reason from 0, engine info and version ----------------------------------------------

REASONS = ("connect", "timeout", "status", "too_large", "protocol", "parse", "unrecognised")


def test_every_failure_reason_is_there_from_the_start() -> None:
    reg, collection = scrape(make("http://127.0.0.1:1/metrics"))
    assert not collection.success
    assert reg.get_sample_value("inference_engine_up", {"engine": "unknown"}) == 0
    for reason in REASONS:
        labels = {"engine": "unknown", "reason": reason}
        assert reg.get_sample_value("inference_engine_poll_failures_total", labels) == 0


async def test_engine_info_with_the_version_the_engine_tells(
    session: aiohttp.ClientSession,
) -> None:
    asked: list[str] = []
    version = {"body": json.dumps({"version": "0.11.2", "other": 1})}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=DEFAULT_METRICS, content_type="text/plain")

    async def version_route(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(text=version["body"], content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/version", version_route)
    async with TestServer(app, host="127.0.0.1") as server:
        collector = make(f"http://127.0.0.1:{server.port}/metrics")
        await collector.tick(session)
        await collector.tick(session)
        reg, _ = scrape(collector)
        info = {"engine": "vllm", "version": "0.11.2", "model": MODEL, "role": "both"}
        assert reg.get_sample_value("inference_engine_info", info) == 1
        assert asked == ["/version"]  # once per time the engine comes up, not per poll
        # the engine goes away and comes back upgraded: asked again
        collector.endpoints[0].url = f"http://127.0.0.1:{unused_port()}/metrics"
        await collector.tick(session)
        collector.endpoints[0].url = f"http://127.0.0.1:{server.port}/metrics"
        version["body"] = json.dumps({"version": "0.12.0"})
        await collector.tick(session)
        reg, _ = scrape(collector)
        assert reg.get_sample_value("inference_engine_info", {**info, "version": "0.12.0"}) == 1
        assert reg.get_sample_value("inference_engine_info", info) is None
        assert asked == ["/version", "/version"]


async def test_engine_info_without_a_version_endpoint(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    collector = make(engine.url + "/metrics")
    await collector.tick(session)  # the fake answers /version with 404
    reg, _ = scrape(collector)
    info = {"engine": "vllm", "version": "", "model": MODEL, "role": "both"}
    assert reg.get_sample_value("inference_engine_info", info) == 1


def test_version_of_reads_the_engines_shapes() -> None:
    assert version_of(b'{"version": "0.11.2"}', ("version",)) == "0.11.2"
    assert version_of(b'{"release": "1.0.0", "api": "1.0.0"}', ("release",)) == "1.0.0"
    assert version_of(b'{"build_info": "b5490-a1b2c3"}', ("build_info",)) == "b5490-a1b2c3"
    assert version_of(b'{"version": 3}', ("version",)) == "3"
    for bad in (b"<html>", b'["0.1"]', b'{"version": true}', b'{"v": "1"}', b"\xff"):
        assert version_of(bad, ("version",)) == ""


# --- several endpoints ---------------------------------------------------------------------------


def test_endpoint_labels() -> None:
    assert endpoint_labels(["http://127.0.0.1:8000/metrics"]) == ["127.0.0.1:8000"]
    assert endpoint_labels(
        ["http://user:secret@10.0.0.1/metrics", "https://[::1]/prometheus/metrics"]
    ) == ["10.0.0.1:80", "[::1]:443"]
    # two endpoints on one port (a proxy): the path tells them apart
    assert endpoint_labels(["http://h:9/prefill/metrics", "http://h:9/decode/metrics"]) == [
        "h:9/prefill/metrics",
        "h:9/decode/metrics",
    ]
    with pytest.raises(ValueError, match="given twice"):
        endpoint_labels(["http://h:9/metrics", "http://h:9/metrics"])


def endpoint_of(engine: FakeEngine) -> str:
    return engine.url.removeprefix("http://")


async def test_each_endpoint_is_polled_on_its_own(session: aiohttp.ClientSession) -> None:
    prefill_body = DEFAULT_METRICS
    decode_body = (FIXTURES / "dynamo-worker-sglang-2026-01.txt").read_text()
    async with (
        FakeEngine(metrics_body=prefill_body) as one,
        FakeEngine(metrics_body=decode_body) as two,
    ):
        collector = make(one.url + "/metrics", more_urls=[two.url + "/metrics"])
        await collector.tick(session)
        reg, collection = scrape(collector)
        assert collection.success
        a = {"engine": "vllm", "endpoint": endpoint_of(one)}
        b = {"engine": "dynamo", "endpoint": endpoint_of(two)}
        g = reg.get_sample_value
        assert g("inference_engine_up", a) == 1
        assert g("inference_engine_up", b) == 1
        assert g("inference_queue_depth", {**a, "model": MODEL, "role": "both"}) == 1
        assert (
            g(
                "inference_kv_cache_capacity_tokens",
                {**b, "model": "Qwen/Qwen3-0.6B", "role": "both"},
            )
            == 92962
        )
        assert g("inference_engine_poll_failures_total", {**b, "reason": "connect"}) == 0
        # one endpoint goes away: its series go stale on their own, the other's stay
        two.set_mode("500", route="metrics")
        await collector.tick(session)
        reg, collection = scrape(collector)
        assert not collection.success
        assert two.url in collection.error
        g = reg.get_sample_value
        assert g("inference_engine_up", b) == 0
        assert g("inference_engine_up", a) == 1
        assert g("inference_engine_poll_failures_total", {**b, "reason": "status"}) == 1
        assert g("inference_engine_poll_failures_total", {**a, "reason": "status"}) == 0
        assert g("inference_queue_depth", {**a, "model": MODEL, "role": "both"}) == 1


async def test_a_frontend_and_its_worker_never_count_a_request_twice(
    session: aiohttp.ClientSession,
) -> None:
    front_body = (FIXTURES / "dynamo-frontend-2026-01.txt").read_text()
    worker_body = (FIXTURES / "dynamo-worker-sglang-2026-01.txt").read_text()
    async with (
        FakeEngine(metrics_body=front_body) as front,
        FakeEngine(metrics_body=worker_body) as worker,
    ):
        collector = make(front.url + "/metrics", more_urls=[worker.url + "/metrics"])
        await collector.tick(session)
        reg, _ = scrape(collector)
        model = "Qwen/Qwen3-0.6B"
        f = {"engine": "dynamo", "endpoint": endpoint_of(front), "model": model, "role": "both"}
        w = {"engine": "dynamo", "endpoint": endpoint_of(worker), "model": model, "role": "both"}
        g = reg.get_sample_value
        # request-level: the frontend's only
        assert g("inference_generation_tokens_total", f) == 300
        assert g("inference_generation_tokens_total", w) is None
        assert g("inference_time_to_first_token_seconds_count", f) == 1
        assert g("inference_time_to_first_token_seconds_count", w) is None
        # the engine's own numbers: the worker's only
        assert g("inference_kv_cache_usage_ratio", w) == 0
        assert g("inference_queue_depth", w) == 0
        assert g("inference_queue_depth", f) is None
        assert g("inference_kv_cache_capacity_tokens", f) is None


async def test_role_from_the_flag_where_the_engine_does_not_say_it(
    session: aiohttp.ClientSession,
) -> None:
    body = (FIXTURES / "vllm-nixl-decode-handwritten.txt").read_text()
    async with FakeEngine(metrics_body=body) as fake:
        collector = make(fake.url + "/metrics", role="decode")
        await collector.tick(session)
        reg, _ = scrape(collector)
        d = {"engine": "vllm", "model": "Qwen/Qwen3-0.6B", "role": "decode"}
        g = reg.get_sample_value
        assert g("inference_kv_transfer_seconds_count", d) == 4
        assert g("inference_kv_transfer_bytes_total", d) == 4 * 1835008
        assert g("inference_kv_transfer_failures_total", {**d, "reason": "transfer"}) == 1
        assert g("inference_engine_info", {**d, "version": ""}) == 1
        assert g("inference_queue_depth", {**d, "role": "both"}) is None


async def test_the_engine_s_own_role_wins_over_the_flag(session: aiohttp.ClientSession) -> None:
    body = (FIXTURES / "sglang-pd-prefill-handwritten.txt").read_text()
    async with FakeEngine(metrics_body=body) as fake:
        collector = make(fake.url + "/metrics", role="decode")
        await collector.tick(session)
        reg, _ = scrape(collector)
        p = {"engine": "sglang", "model": "Qwen/Qwen3-0.6B", "role": "prefill"}
        g = reg.get_sample_value
        assert g("inference_queue_depth_by_stage", {**p, "stage": "transfer"}) == 4
        assert g("inference_queue_depth", p) == 9
        assert g("inference_queue_depth", {**p, "role": "decode"}) is None


async def test_sglang_transfer_families_are_exposed_in_base_units(
    session: aiohttp.ClientSession,
) -> None:
    body = (FIXTURES / "sglang-pd-prefill-handwritten.txt").read_text()
    async with FakeEngine(metrics_body=body) as fake:
        collector = make(fake.url + "/metrics")
        await collector.tick(session)
        reg, _ = scrape(collector)
        p = {"engine": "sglang", "model": "Qwen/Qwen3-0.6B", "role": "prefill"}
        g = reg.get_sample_value
        assert g("inference_kv_transfer_bytes_total", p) == 8 * 1048576
        assert g("inference_kv_transfer_bootstrap_seconds_bucket", {**p, "le": "0.005"}) == 3
        assert g("inference_kv_transfer_bootstrap_seconds_sum", p) == pytest.approx(0.04)
        assert g("inference_kv_transfer_alloc_wait_seconds_count", p) == 4
        assert g("inference_kv_transfer_last_seconds", p) is None


async def test_older_sglang_latency_gauge_is_a_gauge(session: aiohttp.ClientSession) -> None:
    body = (FIXTURES / "sglang-pd-prefill-gauges-handwritten.txt").read_text()
    async with FakeEngine(metrics_body=body) as fake:
        collector = make(fake.url + "/metrics")
        await collector.tick(session)
        reg, collection = scrape(collector)
        kinds = {m.name: m.type for m in collection.metrics if m.samples}
        assert kinds["inference_kv_transfer_last_seconds"] == "gauge"
        assert "inference_kv_transfer_seconds" not in kinds
        p = {"engine": "sglang", "model": "Qwen/Qwen3-0.6B", "role": "prefill"}
        assert reg.get_sample_value("inference_kv_transfer_last_seconds", p) == 0.0125


async def test_llmd_picker_decisions_as_a_counter(session: aiohttp.ClientSession) -> None:
    body = (FIXTURES / "llmd-epp-handwritten.txt").read_text()
    async with FakeEngine(metrics_body=body) as fake:
        collector = make(fake.url + "/metrics")
        await collector.tick(session)
        reg, _ = scrape(collector)
        d = {"engine": "llmd-epp", "model": "Qwen/Qwen3-0.6B", "role": "both"}
        g = reg.get_sample_value
        assert g("inference_engine_up", {"engine": "llmd-epp"}) == 1
        assert g("inference_pd_decisions_total", {**d, "decision": "prefill_decode"}) == 70
        assert g("inference_pd_decisions_total", {**d, "decision": "decode_only"}) == 30


# --- the model: from the metrics, else the engine's API ----------------------------------------


async def test_an_engine_without_a_model_label_is_named_by_its_api(
    session: aiohttp.ClientSession,
) -> None:
    asked: list[str] = []
    served = {"id": "/models/tinyllama-1.1b-chat.Q4_K_M.gguf"}
    body = (FIXTURES / "llamacpp.txt").read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    async def models(request: web.Request) -> web.Response:
        asked.append(request.path)
        answer = {"object": "list", "data": [{"id": served["id"], "object": "model"}]}
        return web.Response(text=json.dumps(answer), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    async with TestServer(app, host="127.0.0.1") as server:
        collector = make(f"http://127.0.0.1:{server.port}/metrics")
        await collector.tick(session)
        await collector.tick(session)
        reg, collection = scrape(collector)
        name = "tinyllama-1.1b-chat.Q4_K_M"
        d = {"engine": "llamacpp", "model": name, "role": "both"}
        g = reg.get_sample_value
        assert g("inference_requests_running", d) is not None
        assert g("inference_engine_info", {**d, "version": ""}) == 1
        raw = {"raw_model": served["id"], "origin": "/v1/models"}
        assert g("inference_engine_model_info", {"engine": "llamacpp", "model": name, **raw}) == 1
        # no series of any engine family is left without a model
        models = {
            s.labels.get("model")
            for m in collection.metrics
            for s in m.samples
            if "model" in s.labels and m.name != "inference_tokenizer_latency_seconds"
        }
        assert models == {name}
        assert asked == ["/v1/models"]  # once per time the engine comes up
        assert collector.hub.served_names() == [served["id"]]
        # it comes back with another model: asked again
        collector.endpoints[0].url = f"http://127.0.0.1:{unused_port()}/metrics"
        await collector.tick(session)
        collector.endpoints[0].url = f"http://127.0.0.1:{server.port}/metrics"
        served["id"] = "qwen-small"
        await collector.tick(session)
        reg, _ = scrape(collector)
        assert reg.get_sample_value("inference_requests_running", {**d, "model": "qwen-small"})
        assert asked == ["/v1/models", "/v1/models"]


async def test_an_engine_that_names_its_model_is_not_asked(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    collector = make(engine.url + "/metrics")
    await collector.tick(session)
    reg, _ = scrape(collector)
    assert "/v1/models" not in engine.requests
    raw = {"raw_model": MODEL, "origin": "metrics"}
    labels = {"engine": "vllm", "model": MODEL, **raw}
    assert reg.get_sample_value("inference_engine_model_info", labels) == 1


async def test_the_gateway_s_queue_has_no_role(session: aiohttp.ClientSession) -> None:
    body = (FIXTURES / "llmd-epp-flow-control-handwritten.txt").read_text()
    async with FakeEngine(metrics_body=body) as fake:
        collector = make(fake.url + "/metrics", role="decode")
        await collector.tick(session)
        reg, _ = scrape(collector)
        g = reg.get_sample_value
        gw = {"engine": "llmd-epp", "model": "Qwen/Qwen3-0.6B", "pool": "qwen-pool"}
        assert g("inference_gateway_queue_depth", {**gw, "priority": "0"}) == 32
        assert g("inference_gateway_pool_saturation", {**gw, "stage": "effective"}) == 1
        assert g("inference_gateway_queue_time_seconds_count", gw) == 1500
        assert g("inference_gateway_stale_endpoints", {"engine": "llmd-epp", "model": gw["model"]})
        rejected = {"engine": "llmd-epp", "model": gw["model"], "layer": "gateway"}
        assert g("inference_requests_rejected_total", {**rejected, "reason": "capacity"}) == 48
        # the picker itself is still of the role the flag gives
        info = {"engine": "llmd-epp", "model": gw["model"], "role": "decode", "version": ""}
        assert g("inference_engine_info", info) == 1


# --- Triton's ensembles: request time at the entry points -------------------------------------

TRITON_SCRAPE = FIXTURES / "triton-trtllm-ensemble-handwritten.txt"
TRITON_CONFIGS = FIXTURES / "triton-trtllm-ensemble-configs-handwritten.json"
ENTRY = ("ensemble", "tensorrt_llm_bls")
STEPS = ("preprocessing", "tensorrt_llm", "postprocessing")


def triton_configs() -> dict[str, object]:
    configs: dict[str, object] = json.loads(TRITON_CONFIGS.read_text())
    configs.pop("_source")
    return configs


def e2e_models(reg: CollectorRegistry) -> dict[str, float]:
    return {
        s.labels["model"]: s.value
        for m in reg.collect()
        for s in m.samples
        if s.name == "inference_e2e_request_latency_seconds_sum"
    }


async def test_triton_counts_request_time_at_the_models_clients_call(
    session: aiohttp.ClientSession,
) -> None:
    """The metrics on one port, the model configurations on another (Triton's 8002 and
    8000): each configuration asked once, the steps' request time left out, their queue kept;
    a silent API keeps every model's request time and says so, and is asked again later."""
    clock = FakeClock(100.0)
    async with (
        FakeEngine(metrics_body=TRITON_SCRAPE.read_text()) as metrics,
        FakeEngine(metrics_body="") as api,
    ):
        api.model_configs = triton_configs()
        collector = make(metrics.url + "/metrics", clock, api_urls=[api.url])
        await collector.tick(session)
        await collector.tick(session)
        reg, collection = scrape(collector)
        assert collection.success
        g = reg.get_sample_value
        assert g("inference_engine_model_config_up", {"engine": "triton"}) == 1
        assert e2e_models(reg) == pytest.approx({"ensemble": 3208.0, "tensorrt_llm_bls": 802.0})
        queue = {"engine": "triton", "model": "tensorrt_llm", "role": "both"}
        assert g("inference_queue_time_seconds_sum", queue) == pytest.approx(3000.0)
        for step in STEPS:
            labels = {"engine": "triton", "ensemble": "ensemble", "model": step}
            assert g("inference_engine_ensemble_step_info", labels) == 1
        asked = {path: n for path, n in api.requests.items() if path.startswith("/v2/models/")}
        assert asked == {f"/v2/models/{m}/config": 1 for m in (*ENTRY, *STEPS)}
        assert not [p for p in metrics.requests if p.startswith("/v2/models/")]

        # a model loaded later: the configurations are asked again, once each
        body = TRITON_SCRAPE.read_text()
        for family, value in (("request_success", 1), ("pending_request_count", 0)):
            last = f'nv_inference_{family}{{model="tensorrt_llm_bls",version="1"}}'
            extra = f'nv_inference_{family}{{model="extra",version="1"}} {value}\n'
            body = body.replace(last, extra + last)
        metrics.metrics_body = body
        await collector.tick(session)
        assert api.requests["/v2/models/extra/config"] == 1  # answered 400: composes nothing
        assert api.requests["/v2/models/ensemble/config"] == 2


async def test_triton_without_its_api_counts_every_model_and_says_so(
    session: aiohttp.ClientSession,
) -> None:
    clock = FakeClock(100.0)
    async with FakeEngine(metrics_body=TRITON_SCRAPE.read_text()) as metrics:
        silent = f"http://127.0.0.1:{unused_port()}"
        collector = make(metrics.url + "/metrics", clock, api_urls=[silent])
        await collector.tick(session)
        reg, collection = scrape(collector)
        assert collection.success  # the engine's series are there: only the split is unknown
        assert reg.get_sample_value("inference_engine_model_config_up", {"engine": "triton"}) == 0
        assert set(e2e_models(reg)) == {*ENTRY, *STEPS}
        # the API comes up (here: the metrics server learns to answer): asked after a minute
        metrics.model_configs = triton_configs()
        collector.endpoints[0].api = metrics.url
        await collector.tick(session)
        assert not [p for p in metrics.requests if p.startswith("/v2/models/")]
        clock.advance(61.0)
        await collector.tick(session)
        reg, _ = scrape(collector)
        assert reg.get_sample_value("inference_engine_model_config_up", {"engine": "triton"}) == 1
        assert set(e2e_models(reg)) == set(ENTRY)


async def test_a_url_that_is_not_triton_s_api_is_no_answer(
    session: aiohttp.ClientSession,
) -> None:
    """Every configuration missing (a server that answers 400 to them all) is not 'no
    ensembles': the split stays unknown."""
    async with FakeEngine(metrics_body=TRITON_SCRAPE.read_text()) as metrics:
        collector = make(metrics.url + "/metrics")
        await collector.tick(session)
        reg, _ = scrape(collector)
        assert reg.get_sample_value("inference_engine_model_config_up", {"engine": "triton"}) == 0
        assert set(e2e_models(reg)) == {*ENTRY, *STEPS}


def test_the_api_url_defaults_to_triton_s_http_port() -> None:
    assert default_api("http://10.0.0.5:8002/metrics") == "http://10.0.0.5:8000"
    assert default_api("http://[::1]:8002/metrics") == "http://[::1]:8000"
    assert default_api("http://127.0.0.1:8000/metrics") == "http://127.0.0.1:8000"
    assert default_api("https://vllm.svc/metrics") == "https://vllm.svc"
    assert api_url("http://h:8000/triton/", "/v2/models/a%2Fb/config") == (
        "http://h:8000/triton/v2/models/a%2Fb/config"
    )
    hub = EngineHub(configured="auto")
    with pytest.raises(ValueError, match="2 API URLs for 1 engine URLs"):
        EngineCollector(hub, "http://h:8002/metrics", api_urls=["http://h:1", "http://h:2"])
