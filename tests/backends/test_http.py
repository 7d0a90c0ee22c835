"""fetch() against a hostile engine: every failure mode of the fake, the limits, the session."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support.fakeengine import (
    DEFAULT_METRICS,
    DUPLICATE_FAMILIES,
    GARBAGE,
    JSON_CONTENT_TYPE,
    METRICS_CONTENT_TYPE,
    MODES,
    NAN_INF,
    FakeEngine,
    gzip_bomb,
    unused_port,
)

from exporter import __version__
from exporter.backends.http import FetchError, FetchResult, fetch, make_session

TIMEOUT = 1.0
# Every call must be over by the deadline plus this much.
SLACK = 0.5
MAX_BYTES = 1024 * 1024
MEMORY_CEILING = 64 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    gzip_bomb()  # built once, outside any timing
    async with FakeEngine() as fake:
        yield fake


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session() as client:
        yield client


@asynccontextmanager
async def serve(routes: dict[str, Handler]) -> AsyncIterator[str]:
    """A one-off loopback server for responses the fake engine has no mode for."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def raw(body: bytes, *, chunked: bool = False, encoding: str = "") -> Handler:
    """A handler answering 200 with ``body`` as given, labelled with ``encoding``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        if encoding:
            response.headers["Content-Encoding"] = encoding
        if chunked:
            response.enable_chunked_encoding()
        else:
            response.content_length = len(body)
        await response.prepare(request)
        for start in range(0, len(body), 1000):
            await response.write(body[start : start + 1000])
        await response.write_eof()
        return response

    return handler


async def timed_fetch(
    session: aiohttp.ClientSession, url: str, **kwargs: Any
) -> tuple[FetchResult | FetchError, float]:
    kwargs.setdefault("timeout", TIMEOUT)
    kwargs.setdefault("max_bytes", MAX_BYTES)
    start = time.perf_counter()
    try:
        outcome: FetchResult | FetchError = await fetch(session, url, **kwargs)
    except FetchError as err:
        outcome = err
    elapsed = time.perf_counter() - start
    assert elapsed < kwargs["timeout"] + SLACK, f"{url} took {elapsed:.3f}s"
    return outcome, elapsed


async def expect_error(
    session: aiohttp.ClientSession, url: str, reason: str, **kwargs: Any
) -> tuple[FetchError, float]:
    outcome, elapsed = await timed_fetch(session, url, **kwargs)
    assert isinstance(outcome, FetchError), f"expected {reason}, got {outcome!r}"
    assert outcome.reason == reason, outcome.message
    assert outcome.message
    assert "\n" not in outcome.message
    assert len(outcome.message) < 200
    return outcome, elapsed


async def expect_body(
    session: aiohttp.ClientSession, url: str, **kwargs: Any
) -> tuple[FetchResult, float]:
    outcome, elapsed = await timed_fetch(session, url, **kwargs)
    assert isinstance(outcome, FetchResult), f"expected a body, got {outcome!r}"
    return outcome, elapsed


# --- every mode of the fake engine ------------------------------------------------------------

# mode -> the error reason, or the exact /metrics body fetch must hand back.
EXPECTED: dict[str, str | bytes] = {
    "ok": DEFAULT_METRICS.encode(),
    "500": "status",
    "hang": "timeout",
    "slow_drip": "timeout",
    "huge": "too_large",
    "garbage": GARBAGE,
    "duplicate_families": DUPLICATE_FAMILIES.encode(),
    "nan_inf": NAN_INF.encode(),
    "close": "connect",
    "not_http": "protocol",
    "gzip_bomb": "too_large",
}


def test_every_mode_has_an_expectation() -> None:
    assert set(EXPECTED) == set(MODES)


@pytest.mark.parametrize("mode", MODES)
async def test_metrics_mode(engine: FakeEngine, session: aiohttp.ClientSession, mode: str) -> None:
    engine.set_mode(mode)
    expected = EXPECTED[mode]
    url = engine.url + "/metrics"
    if isinstance(expected, bytes):
        result, _ = await expect_body(session, url)
        assert result.status == 200
        assert result.body == expected
        assert result.content_type == METRICS_CONTENT_TYPE
    else:
        _, elapsed = await expect_error(session, url, expected)
        if expected == "timeout":
            assert elapsed >= TIMEOUT - 0.05
    assert engine.requests["/metrics"] >= 1


@pytest.mark.parametrize("mode", MODES)
async def test_tokenize_mode(engine: FakeEngine, session: aiohttp.ClientSession, mode: str) -> None:
    engine.set_mode(mode, route="tokenize")
    expected = EXPECTED[mode]
    url = engine.url + "/tokenize"
    outcome, _ = await timed_fetch(
        session, url, method="POST", json_body={"model": "m", "prompt": "one two three"}
    )
    if isinstance(expected, str):
        assert isinstance(outcome, FetchError), outcome
        assert outcome.reason == expected, outcome.message
    else:
        assert isinstance(outcome, FetchResult), outcome
        assert outcome.content_type == JSON_CONTENT_TYPE
    assert engine.requests["/tokenize"] >= 1
    assert engine.requests["/metrics"] == 0


async def test_ok_returns_the_exact_body_and_timing(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    engine.metrics_body = "# a body with unicode: é ✓\nup 1\n"
    result, elapsed = await expect_body(session, engine.url + "/metrics")
    assert result == FetchResult(
        status=200,
        body=engine.metrics_body.encode(),
        content_type=METRICS_CONTENT_TYPE,
        elapsed=result.elapsed,
    )
    assert 0 < result.elapsed <= elapsed


async def test_post_sends_json(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    request = {"model": "llama", "prompt": "the quick brown fox"}
    result, _ = await expect_body(
        session, engine.url + "/tokenize", method="POST", json_body=request
    )
    assert engine.last_tokenize_request == request
    answer = json.loads(result.body)
    assert answer["count"] == 4


async def test_500_carries_the_status(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    engine.set_mode("500")
    err, _ = await expect_error(session, engine.url + "/metrics", "status")
    assert err.status == 500
    assert "500" in err.message


async def test_404_is_a_status_failure(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    err, _ = await expect_error(session, engine.url + "/nowhere", "status")
    assert err.status == 404


async def test_connection_refused(session: aiohttp.ClientSession) -> None:
    _, elapsed = await expect_error(session, f"http://127.0.0.1:{unused_port()}/metrics", "connect")
    assert elapsed < TIMEOUT


async def test_stopped_engine_is_refused(session: aiohttp.ClientSession) -> None:
    async with FakeEngine() as fake:
        url = fake.url + "/metrics"
        await expect_body(session, url)
    await expect_error(session, url, "connect")


async def test_invalid_url(session: aiohttp.ClientSession) -> None:
    await expect_error(session, "http://[::1/metrics", "connect")
    await expect_error(session, "not a url", "connect")


async def test_deadline_covers_a_dripping_body(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    # Bytes keep arriving every 100 ms, so only an overall deadline can stop this.
    engine.set_mode("slow_drip")
    err, elapsed = await expect_error(session, engine.url + "/metrics", "timeout", timeout=0.7)
    assert 0.65 <= elapsed < 0.7 + SLACK
    assert "0.7s" in err.message


async def test_announced_length_fails_before_reading(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    # The dripping body would take minutes; Content-Length alone must settle it.
    engine.set_mode("slow_drip")
    err, elapsed = await expect_error(
        session, engine.url + "/metrics", "too_large", max_bytes=100, timeout=5.0
    )
    assert elapsed < 0.5
    assert "Content-Length" in err.message


async def test_cancellation_propagates(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    engine.set_mode("hang")
    task = asyncio.create_task(
        fetch(session, engine.url + "/metrics", timeout=30.0, max_bytes=MAX_BYTES)
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- the size limit ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True])
async def test_limit_is_inclusive(session: aiohttp.ClientSession, chunked: bool) -> None:
    body = b"x" * 5000
    async with serve({"/": raw(body, chunked=chunked)}) as url:
        result, _ = await expect_body(session, url + "/", max_bytes=5000)
        assert result.body == body
        await expect_error(session, url + "/", "too_large", max_bytes=4999)


@pytest.mark.parametrize("mode", ["huge", "gzip_bomb"])
async def test_memory_stays_bounded(
    engine: FakeEngine, session: aiohttp.ClientSession, mode: str
) -> None:
    engine.set_mode(mode)
    tracemalloc.start()
    try:
        err, _ = await expect_error(
            session, engine.url + "/metrics", "too_large", max_bytes=16 * 1024 * 1024, timeout=10
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_CEILING, f"{mode}: peak {peak / 2**20:.1f} MiB"
    assert "Content-Length" not in err.message  # it was the stream that was cut


async def test_gzip_is_decoded(session: aiohttp.ClientSession) -> None:
    text = DEFAULT_METRICS.encode() * 20
    async with serve({"/": raw(gzip.compress(text), encoding="gzip")}) as url:
        result, _ = await expect_body(session, url + "/")
    assert result.body == text
    assert result.content_type == "text/plain"


async def test_limit_applies_after_inflating(session: aiohttp.ClientSession) -> None:
    text = b"y" * 50_000
    packed = gzip.compress(text)
    assert len(packed) < 1000
    async with serve({"/": raw(packed, encoding="gzip")}) as url:
        result, _ = await expect_body(session, url + "/", max_bytes=50_000)
        assert result.body == text
        err, _ = await expect_error(session, url + "/", "too_large", max_bytes=49_999)
    assert "inflates" in err.message


async def test_concatenated_gzip_members(session: aiohttp.ClientSession) -> None:
    packed = gzip.compress(b"first\n") + gzip.compress(b"second\n")
    async with serve({"/": raw(packed, chunked=True, encoding="gzip")}) as url:
        result, _ = await expect_body(session, url + "/")
    assert result.body == b"first\nsecond\n"


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS], ids=["zlib", "raw"])
async def test_deflate_is_decoded(session: aiohttp.ClientSession, wbits: int) -> None:
    text = DEFAULT_METRICS.encode()
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = compressor.compress(text) + compressor.flush()
    async with serve({"/": raw(packed, encoding="deflate")}) as url:
        result, _ = await expect_body(session, url + "/")
    assert result.body == text


@pytest.mark.parametrize(
    ("body", "encoding", "words"),
    [
        (gzip.compress(b"z" * 10_000)[:-12], "gzip", "ends mid-stream"),
        (b"\x1f\x8b not really gzip", "gzip", "does not decode"),
        (b"whatever", "br", "unsupported Content-Encoding"),
    ],
    ids=["truncated", "corrupt", "unsupported"],
)
async def test_bad_encoding_is_a_protocol_error(
    session: aiohttp.ClientSession, body: bytes, encoding: str, words: str
) -> None:
    async with serve({"/": raw(body, encoding=encoding)}) as url:
        err, _ = await expect_error(session, url + "/", "protocol")
    assert words in err.message


async def test_truncated_body_is_a_protocol_error(session: aiohttp.ClientSession) -> None:
    async def short(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b"only this much")
        assert request.transport is not None
        request.transport.close()
        return response

    async with serve({"/": short}) as url:
        await expect_error(session, url + "/", "protocol")


# --- redirects, headers and the session -------------------------------------------------------


async def test_redirect_is_not_followed(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(engine.url + "/metrics")

    async with serve({"/": moved}) as url:
        err, _ = await expect_error(session, url + "/", "status")
    assert err.status == 302
    assert engine.requests["/metrics"] == 0


async def test_session_headers(engine: FakeEngine, session: aiohttp.ClientSession) -> None:
    await expect_body(
        session, engine.url + "/metrics", headers={"Accept-Encoding": "br", "X-Probe": "1"}
    )
    sent = {name.lower(): value for name, value in engine.last_headers.items()}
    assert sent["user-agent"] == f"inference-bottleneck-exporter/{__version__}"
    assert sent["accept-encoding"] == "gzip, deflate"  # only what fetch can decode
    assert sent["x-probe"] == "1"


async def test_cookies_are_not_kept(session: aiohttp.ClientSession) -> None:
    seen: list[str | None] = []

    async def sets_cookie(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Cookie"))
        response = web.Response(text="ok")
        response.set_cookie("session", "secret")
        return response

    async with serve({"/": sets_cookie}) as url:
        await expect_body(session, url + "/")
        await expect_body(session, url + "/")
    assert seen == [None, None]


async def test_make_session_defaults(session: aiohttp.ClientSession) -> None:
    assert isinstance(session.cookie_jar, aiohttp.DummyCookieJar)
    assert session.trust_env is False
    assert session.connector is not None
    assert session.connector.limit == 4
    assert session.headers["User-Agent"] == f"inference-bottleneck-exporter/{__version__}"


async def test_connection_is_reused_after_success(session: aiohttp.ClientSession) -> None:
    peers: set[object] = set()

    async def who(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    async with serve({"/": who}) as url:
        for _ in range(3):
            await expect_body(session, url + "/")
    assert len(peers) == 1


async def test_session_recovers_after_each_failure(
    engine: FakeEngine, session: aiohttp.ClientSession
) -> None:
    # A failed fetch must not leave a half-read connection in the pool.
    for mode in ("huge", "gzip_bomb", "slow_drip", "not_http", "close", "500"):
        engine.set_mode(mode)
        await timed_fetch(session, engine.url + "/metrics", timeout=0.3)
        engine.set_mode("ok")
        result, _ = await expect_body(session, engine.url + "/metrics")
        assert result.body == DEFAULT_METRICS.encode(), mode
