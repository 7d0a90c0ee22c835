"""The fake engine itself: answer shapes, latency, modes, and stopping while requests hang."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fakeengine import (
    BOMB_BYTES,
    DEFAULT_METRICS,
    DUPLICATE_FAMILIES,
    FLAVOURS,
    MAX_MODEL_LEN,
    MODES,
    NAN_INF,
    FakeEngine,
    gzip_bomb,
    token_id,
    unused_port,
)

PROMPT_KEYS = {"vllm": "prompt", "sglang": "prompt", "tgi": "inputs", "llamacpp": "content"}
TEXT = "Hello  world,\tthis is\na test"
WORDS = ["Hello", "world,", "this", "is", "a", "test"]


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def tokenize(
    client: aiohttp.ClientSession, url: str, payload: object
) -> tuple[int, Any, float]:
    start = time.perf_counter()
    async with client.post(url, json=payload) as response:
        body = await response.read()
        return response.status, json.loads(body), time.perf_counter() - start


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_tokenize_shape(client: aiohttp.ClientSession, flavour: str, path: str) -> None:
    ids = [token_id(word) for word in WORDS]
    async with FakeEngine(flavour=flavour) as engine:
        payload = {"model": "m", PROMPT_KEYS[flavour]: TEXT}
        status, answer, _ = await tokenize(client, engine.url + path, payload)
        assert engine.requests[path] == 1
        assert engine.last_tokenize_request == payload
    assert status == 200
    if flavour == "vllm":
        assert answer == {"count": 6, "max_model_len": MAX_MODEL_LEN, "tokens": ids}
    elif flavour == "sglang":
        assert answer == {"tokens": ids, "count": 6}
    elif flavour == "llamacpp":
        assert answer == {"tokens": ids}
    else:
        assert [item["text"] for item in answer] == WORDS
        assert [item["id"] for item in answer] == ids
        for item in answer:
            assert TEXT[item["start"] : item["stop"]] == item["text"]


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_tokenize_rejects_the_wrong_request(
    client: aiohttp.ClientSession, flavour: str
) -> None:
    wrong = "content" if flavour != "llamacpp" else "prompt"
    async with FakeEngine(flavour=flavour) as engine:
        status, answer, _ = await tokenize(client, engine.url + "/tokenize", {wrong: "a b"})
        assert status == 400
        assert PROMPT_KEYS[flavour] in answer["error"]
        async with client.post(engine.url + "/tokenize", data=b"{not json") as response:
            assert response.status == 400


async def test_per_token_and_added_latency(client: aiohttp.ClientSession) -> None:
    async with FakeEngine(per_token_latency=0.02, added_latency=0.05) as engine:
        url = engine.url + "/tokenize"
        _, _, one = await tokenize(client, url, {"prompt": "word"})
        _, answer, twenty = await tokenize(client, url, {"prompt": " ".join(["w"] * 20)})
    assert answer["count"] == 20
    assert 0.07 <= one < 0.07 + 0.2
    assert 0.45 <= twenty < 0.45 + 0.2


async def test_metrics_bodies_are_valid_text_format(client: aiohttp.ClientSession) -> None:
    families = {family.name: family for family in text_string_to_metric_families(DEFAULT_METRICS)}
    assert families["vllm:num_requests_running"].samples[0].value == 3.0
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"

    async with FakeEngine(metrics_body="up 1\n") as engine:
        async with client.get(engine.url + "/metrics") as response:
            assert await response.text() == "up 1\n"
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        engine.set_mode("duplicate_families", route="metrics")
        async with client.get(engine.url + "/metrics") as response:
            assert await response.text() == DUPLICATE_FAMILIES
        engine.set_mode("nan_inf", route="metrics")
        async with client.get(engine.url + "/metrics") as response:
            assert await response.text() == NAN_INF
        assert engine.requests == {"/metrics": 3}

    assert DUPLICATE_FAMILIES.count("# TYPE vllm:num_requests_running gauge") == 2
    values = [
        sample.value
        for family in text_string_to_metric_families(NAN_INF)
        for sample in family.samples
    ]
    assert any(math.isnan(v) for v in values)
    assert math.inf in values
    assert -math.inf in values


async def test_tokenize_content_modes(client: aiohttp.ClientSession) -> None:
    async with FakeEngine(tokenize_mode="nan_inf") as engine:
        url = engine.url + "/tokenize"
        _, answer, _ = await tokenize(client, url, {"prompt": "a b"})
        assert math.isnan(answer["count"])
        assert answer["max_model_len"] == math.inf
        assert len(answer["tokens"]) == 2
        assert not any(math.isfinite(token) for token in answer["tokens"])
        engine.set_mode("duplicate_families", route="tokenize")
        async with client.post(url, json={"prompt": "a b"}) as response:
            text = await response.text()
        one = json.dumps(
            {"count": 2, "max_model_len": MAX_MODEL_LEN, "tokens": [token_id("a"), token_id("b")]}
        )
        assert text == one + one
        assert engine.metrics_mode == "ok"


async def test_mode_and_flavour_are_checked() -> None:
    engine = FakeEngine()
    with pytest.raises(ValueError, match="unknown mode"):
        engine.set_mode("on_fire")
    with pytest.raises(ValueError, match="unknown flavour"):
        FakeEngine(flavour="triton")
    with pytest.raises(RuntimeError, match="not started"):
        _ = engine.url
    assert set(MODES) >= {"ok", "500", "hang", "slow_drip", "huge", "gzip_bomb", "close"}


def test_gzip_bomb_is_small_and_inflates_past_100_mb() -> None:
    bomb = gzip_bomb()
    assert len(bomb) < 1024 * 1024
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total, pending = 0, bomb
    for _ in range(10_000):
        out = decoder.decompress(pending, 1024 * 1024)
        total += len(out)
        pending = decoder.unconsumed_tail
        if decoder.eof:
            break
    assert decoder.eof
    assert total == BOMB_BYTES > 100_000_000


def test_unused_port_is_refused() -> None:
    port = unused_port()
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", port))


async def test_stop_is_prompt_with_requests_in_flight(client: aiohttp.ClientSession) -> None:
    engine = FakeEngine()
    await engine.start()
    url = engine.url

    async def request(mode: str) -> str:
        path = "/metrics" if mode != "hang" else "/tokenize"
        try:
            async with client.request("GET" if path == "/metrics" else "POST", url + path) as r:
                await r.read()
                return f"{r.status}"
        except aiohttp.ClientError as err:
            return type(err).__name__

    engine.set_mode("hang")
    hanging = asyncio.create_task(request("hang"))
    await asyncio.sleep(0.1)
    engine.set_mode("slow_drip", route="metrics")
    dripping = asyncio.create_task(request("slow_drip"))
    await asyncio.sleep(0.3)
    assert engine.requests == {"/tokenize": 1, "/metrics": 1}

    start = time.perf_counter()
    await engine.stop()
    stopped = time.perf_counter() - start
    outcomes = await asyncio.wait_for(asyncio.gather(hanging, dripping), 2.0)
    assert stopped < 1.0, f"stop took {stopped:.2f}s"
    assert outcomes[0] == "503"  # the hung request is let go, not left open
    assert outcomes[1] == "ClientPayloadError"  # the drip is cut short
    await engine.stop()  # twice is fine


def test_run_in_thread_stops_promptly_while_a_request_hangs() -> None:
    threaded = FakeEngine.run_in_thread(metrics_body="up 1\n")
    try:
        with urllib.request.urlopen(threaded.url + "/metrics", timeout=5) as response:
            assert response.read() == b"up 1\n"
        threaded.set_mode("hang")
        outcome: list[object] = []

        def hang() -> None:
            try:
                with urllib.request.urlopen(threaded.url + "/metrics", timeout=30) as response:
                    outcome.append(response.status)
            except urllib.error.HTTPError as err:
                outcome.append(err.code)
            except OSError as err:
                outcome.append(err)

        waiter = threading.Thread(target=hang, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 5
        while threaded.requests["/metrics"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threaded.requests["/metrics"] == 2
        assert not outcome  # still hanging
    finally:
        start = time.perf_counter()
        threaded.stop()
        stopped = time.perf_counter() - start
    waiter.join(2)
    assert stopped < 1.5, f"stop took {stopped:.2f}s"
    assert not waiter.is_alive()
    assert outcome == [503]
    threaded.stop()  # twice is fine
    with pytest.raises(OSError):
        urllib.request.urlopen(threaded.url + "/metrics", timeout=2)


def test_run_in_thread_as_context_manager() -> None:
    with FakeEngine.run_in_thread(flavour="tgi") as threaded:
        request = urllib.request.Request(
            threaded.url + "/tokenize",
            data=json.dumps({"inputs": "a b c"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert len(json.loads(response.read())) == 3
        assert threaded.engine.flavour == "tgi"
