"""The tokenizer probe against the fake engine, per engine flavour."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from support.fakeengine import FakeEngine
from support.metrics import registry_of

from exporter.backends.http import make_session
from exporter.collectors.base import Collection
from exporter.collectors.shared_state import EngineHub
from exporter.collectors.tokenizer import (
    TokenizerCollector,
    default_prompt,
    request_body,
    token_count,
)
from exporter.engines.snapshot import EngineSnapshot, Series


def scrape(collector: TokenizerCollector) -> tuple[CollectorRegistry, Collection]:
    collection = collector.collect()
    return registry_of(collection), collection


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session() as s:
        yield s


def test_bundled_prompt_is_about_512_tokens() -> None:
    words = default_prompt().split()
    assert 350 <= len(words) <= 450  # ~1.3 BPE tokens per English word


@pytest.mark.parametrize(
    ("engine", "body"),
    [
        ("vllm", {"prompt": "x", "model": "m"}),
        ("sglang", {"prompt": "x", "model": "m"}),
        ("tgi", {"inputs": "x"}),
        ("llamacpp", {"content": "x"}),
        ("lmdeploy", {"input": "x", "do_preprocess": False, "add_bos": True}),
    ],
)
def test_request_bodies(engine: str, body: dict[str, str]) -> None:
    assert request_body(engine, "x", "m") == body


def test_token_count_shapes() -> None:
    assert token_count(b'{"count": 5, "max_model_len": 8192, "tokens": [1, 2, 3, 4, 5]}') == 5
    assert token_count(b'{"tokens": [1, 2, 3]}') == 3
    assert token_count(b'[{"id": 1}, {"id": 2}]') == 2
    # LMDeploy's /v1/encode
    assert token_count(b'{"input_ids": [1, 2, 3, 4], "length": 4}') == 4
    assert token_count(b'{"input_ids": [1, 2]}') == 2
    for bad in (b"not json", b'{"x": 1}', b'"text"', b'{"count": true}'):
        with pytest.raises(ValueError):
            token_count(bad)


@pytest.mark.parametrize("flavour", ["vllm", "sglang", "tgi", "llamacpp"])
async def test_probe_measures_each_flavour(flavour: str, session: aiohttp.ClientSession) -> None:
    async with FakeEngine(flavour=flavour, per_token_latency=0.001) as fake:
        hub = EngineHub(configured=flavour)
        collector = TokenizerCollector(hub, fake.url + "/metrics", timeout=2.0, model="m")
        labels = {"engine": flavour, "source": "probe"}
        # Each probe is the long RTT less the faster short one: a stall of the machine during
        # the long request (or both short ones) still moves one difference, so three probes
        # and their median.
        latencies: list[float] = []
        total = 0.0
        for _ in range(3):
            await collector.tick(session)
            reg, collection = scrape(collector)
            assert collection.success, collection.error
            now = reg.get_sample_value("inference_tokenizer_latency_seconds_sum", labels)
            assert now is not None
            latencies.append(now - total)
            total = now
        words = len(default_prompt().split())
        g = reg.get_sample_value
        assert g("inference_tokenizer_probe_tokens", {"engine": flavour}) == words
        assert g("inference_tokenizer_probes_total", {"engine": flavour}) == 3
        assert g("inference_tokenizer_probe_failures_total", {"engine": flavour}) == 0
        assert g("inference_tokenizer_latency_seconds_count", labels) == 3
        # the fake spends 1 ms per token: the long prompt costs ~words x 1 ms more (385 ms),
        # large next to the scheduling noise of a busy 2-core machine
        median = sorted(latencies)[1]
        assert words * 0.001 * 0.8 <= median <= words * 0.001 * 3, latencies
        assert g("inference_tokenizer_probe_rtt_seconds_count", {"engine": flavour}) == 3
        path = "/tokenize"
        assert fake.requests[path] == 9  # short, long, short each probe
        # the long prompt was tokenized (the token count above), then the short one again
        assert fake.last_tokenize_request == request_body(flavour, "Hi", "m")


async def test_a_slow_short_round_trip_does_not_make_the_tokenizer_read_low(
    session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long round trip less the faster of the two short ones taken around it: a short one
    held up by a busy host (its scheduler, a collection) no longer halves the reading (a
    38.5 ms tokenizer read 20 ms in a CI check, a first short round trip 18 ms slow)."""
    collector = TokenizerCollector(EngineHub(configured="vllm"), "http://127.0.0.1:9/metrics")
    # (round trip, tokens) of each request, in the order the probe sends them
    answers = iter([(0.0205, 1), (0.0405, 385), (0.002, 1), (0.002, 1), (0.0405, 385), (0.0205, 1)])
    sent: list[str] = []

    async def call(_s: aiohttp.ClientSession, _u: str, body: dict[str, str]) -> tuple[float, int]:
        sent.append(body["prompt"])
        return next(answers)

    monkeypatch.setattr(collector, "_call", call)
    await collector.tick(session)  # the first short one slow
    await collector.tick(session)  # the second
    reg, collection = scrape(collector)
    assert collection.success, collection.error
    assert [len(p.split()) for p in sent] == [1, len(default_prompt().split()), 1] * 2
    labels = {"engine": "vllm", "source": "probe"}
    g = reg.get_sample_value
    assert g("inference_tokenizer_latency_seconds_count", labels) == 2
    assert g("inference_tokenizer_latency_seconds_sum", labels) == pytest.approx(2 * 0.0385)
    # the round trip observed is the first short one, as before
    assert g("inference_tokenizer_probe_rtt_seconds_sum", {"engine": "vllm"}) == pytest.approx(
        0.0225
    )


async def test_probe_failure_is_counted(session: aiohttp.ClientSession) -> None:
    async with FakeEngine(tokenize_mode="500") as fake:
        collector = TokenizerCollector(EngineHub(configured="vllm"), fake.url + "/metrics")
        await collector.tick(session)
        reg, collection = scrape(collector)
        assert not collection.success
        assert "500" in collection.error
        assert (
            reg.get_sample_value("inference_tokenizer_probe_failures_total", {"engine": "vllm"})
            == 1
        )
        assert (
            reg.get_sample_value(
                "inference_tokenizer_latency_seconds_count", {"engine": "vllm", "source": "probe"}
            )
            is None
        )


async def test_waits_for_engine_type_and_uses_model_from_metrics(
    session: aiohttp.ClientSession,
) -> None:
    async with FakeEngine() as fake:
        hub = EngineHub(configured="auto")
        collector = TokenizerCollector(hub, fake.url + "/metrics")
        await collector.tick(session)
        reg, collection = scrape(collector)
        assert collection.success  # nothing to probe yet is not a failure
        assert reg.get_sample_value("inference_tokenizer_probes_total", {"engine": "unknown"}) == 0
        assert "not recognised" in collection.error
        assert fake.requests["/tokenize"] == 0
        hub.detected = "vllm"
        hub.snapshot = EngineSnapshot(
            "vllm", [Series("inference_queue_depth", "llama-3", "gauge", 1.0)]
        )
        await collector.tick(session)
        assert fake.requests["/tokenize"] == 3
        assert fake.last_tokenize_request["model"] == "llama-3"


@pytest.mark.parametrize("engine", ["triton", "nim", "trtllm", "dynamo", "ray"])
async def test_engines_without_a_tokenize_endpoint_need_an_explicit_url(
    session: aiohttp.ClientSession, engine: str
) -> None:
    collector = TokenizerCollector(EngineHub(configured=engine), "http://127.0.0.1:1/metrics")
    await collector.tick(session)
    collection = collector.collect()
    assert "--tokenizer.url" in collection.error
    assert collection.success  # idle, not failing
    reg = registry_of(collection)
    assert reg.get_sample_value("inference_tokenizer_probe_failures_total", {"engine": engine}) == 0


def test_lmdeploy_probe_goes_to_its_encode_endpoint() -> None:
    collector = TokenizerCollector(
        EngineHub(configured="lmdeploy"), "http://10.0.0.1:23333/metrics"
    )
    assert collector.target() == ("lmdeploy", "http://10.0.0.1:23333/v1/encode")


async def test_engine_reported_latency_is_merged(session: aiohttp.ClientSession) -> None:
    hub = EngineHub(configured="tgi")
    hub.snapshot = EngineSnapshot(
        "tgi",
        [
            Series(
                "inference_tokenizer_latency_seconds",
                "",
                "histogram",
                buckets=((0.001, 3.0), (0.01, 5.0), (float("inf"), 6.0)),
                sum=0.02,
                count=6.0,
            )
        ],
    )
    hub.snapshot_at = 0.0
    collector = TokenizerCollector(hub, "http://127.0.0.1:1/metrics", clock=lambda: 1.0)
    reg, _ = scrape(collector)
    labels = {"engine": "tgi", "source": "engine"}
    assert (
        reg.get_sample_value(
            "inference_tokenizer_latency_seconds_bucket", {**labels, "le": "0.001"}
        )
        == 3
    )
    assert reg.get_sample_value("inference_tokenizer_latency_seconds_count", labels) == 6
    assert reg.get_sample_value("inference_tokenizer_latency_seconds_sum", labels) == 0.02
    # stale engine snapshot: the engine-reported series disappears
    stale = TokenizerCollector(hub, "http://127.0.0.1:1/metrics", clock=lambda: 1000.0)
    reg, _ = scrape(stale)
    assert reg.get_sample_value("inference_tokenizer_latency_seconds_count", labels) is None
