"""The HTTP server's timeouts and caps (exporter.server.limits, exporter.server.acceptor), in
process on loopback with deadlines of a few tenths of a second; the flood against the real
processes is tests/server/test_flood.py."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from support.tls import Pki, refused_at_start

from exporter.cli import load_settings
from exporter.config import ConfigError, HttpOptions
from exporter.inject import webhook
from exporter.server.limits import BATCH, Caps, HttpGuard, fit_to_files
from exporter.server.listen import start_site

SHORT = HttpOptions(
    read_header_timeout=0.3,
    read_body_timeout=0.3,
    idle_timeout=0.3,
    write_timeout=0.3,
    max_connections=8,
    max_requests=2,
)
# A deadline must hit well before this, and never much before its own value.
LATE = 2.0

Serve = Callable[..., Awaitable[tuple[HttpGuard, int]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []
    release = asyncio.Event()

    async def start(
        options: HttpOptions = SHORT, ssl_context: ssl.SSLContext | None = None
    ) -> tuple[HttpGuard, int]:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def slow(request: web.Request) -> web.Response:
            await release.wait()
            return web.Response(text="done\n")

        async def big(request: web.Request) -> web.Response:
            return web.Response(body=b"x" * (16 * 2**20))

        async def upload(request: web.Request) -> web.Response:
            return web.Response(text=f"{len(await request.read())}\n")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/-/healthy", metrics)
        app.router.add_get("/slow", slow)
        app.router.add_get("/big", big)
        app.router.add_post("/upload", upload)
        guard = HttpGuard(options, files=(None, 0))
        runner = await start_site(app, "127.0.0.1", 0, ssl_context, guard)
        runners.append(runner)
        return guard, runner.addresses[0][1]

    yield start
    release.set()
    for runner in runners:
        await runner.cleanup()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_after(reader: asyncio.StreamReader, started: float) -> tuple[float, bytes]:
    """Seconds from ``started`` until the server closed the connection, and what it sent."""
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), LATE * 2):
            received += chunk
    except ConnectionResetError:
        pass
    return time.monotonic() - started, received


async def get(port: int, path: str) -> bytes:
    reader, writer = await connect(port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), LATE)
    writer.close()
    return data


async def test_half_a_header_gets_408_and_is_closed(serve: Serve) -> None:
    guard, port = await serve()
    started = time.monotonic()  # before the connect: the header deadline runs from the accept
    reader, writer = await connect(port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Ag")
    took, received = await closed_after(reader, started)
    assert SHORT.read_header_timeout <= took < LATE
    assert received.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert guard.closed["header_timeout"] == 1
    writer.close()


async def test_a_silent_connection_meets_the_header_timeout_too(serve: Serve) -> None:
    guard, port = await serve()
    started = time.monotonic()  # before the connect: the header deadline runs from the accept
    reader, writer = await connect(port)
    took, _ = await closed_after(reader, started)
    assert SHORT.read_header_timeout <= took < LATE
    assert guard.closed["header_timeout"] == 1
    writer.close()


async def test_a_header_sent_slowly_in_time_is_served(serve: Serve) -> None:
    _, port = await serve(replace(SHORT, read_header_timeout=1.0))
    reader, writer = await connect(port)
    for part in (b"GET /metrics HT", b"TP/1.1\r\nHost: x\r\n", b"\r\n"):
        writer.write(part)
        await asyncio.sleep(0.2)
    assert (await asyncio.wait_for(reader.readline(), LATE)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_idle_keep_alive_is_closed_and_the_next_request_gets_its_own_header_time(
    serve: Serve,
) -> None:
    guard, port = await serve(replace(SHORT, idle_timeout=0.6))
    reader, writer = await connect(port)
    for _ in range(3):  # requests inside the idle timeout keep the connection
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"ok\n"), LATE)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.3)
    # the start of a next request: from its first byte, the header timeout (shorter) runs
    writer.write(b"GET /met")
    started = time.monotonic()
    took, received = await closed_after(reader, started)
    assert SHORT.read_header_timeout <= took < 0.6, took
    assert received.startswith(b"HTTP/1.1 408")
    writer.close()
    reader, writer = await connect(port)
    started = time.monotonic()  # the idle deadline runs from the answer, sent before it is read
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"ok\n"), LATE)
    took, received = await closed_after(reader, started)
    assert 0.6 <= took < LATE and received == b""
    assert guard.closed["idle_timeout"] == 1 and guard.closed["header_timeout"] == 1
    writer.close()


async def test_a_body_sent_too_slowly_is_cut(serve: Serve) -> None:
    guard, port = await serve()
    reader, writer = await connect(port)
    writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    started = time.monotonic()
    took, received = await closed_after(reader, started)
    assert SHORT.read_body_timeout <= took < LATE
    assert not received.startswith(b"HTTP/1.1 200")
    assert guard.closed["body_timeout"] == 1
    writer.close()
    # a body in time is read
    reader, writer = await connect(port)
    writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
    assert (await asyncio.wait_for(reader.readuntil(b"10\n"), LATE)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_client_that_reads_nothing_is_cut(serve: Serve) -> None:
    guard, port = await serve()
    _, writer = await connect(port)
    writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(SHORT.write_timeout + 1.0)  # reads nothing meanwhile
    assert guard.closed["write_timeout"] == 1
    assert guard.open == 0
    writer.close()


async def test_requests_past_the_cap_get_503_and_probes_still_answer(serve: Serve) -> None:
    guard, port = await serve()
    held = [await connect(port) for _ in range(SHORT.max_requests)]
    for _, writer in held:
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(50):
        if guard.in_flight == SHORT.max_requests:
            break
        await asyncio.sleep(0.01)
    assert guard.in_flight == SHORT.max_requests
    refused = await get(port, "/metrics")
    assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused
    assert (await get(port, "/-/healthy")).startswith(b"HTTP/1.1 200")
    assert guard.refused["max_requests"] == 1
    for _, writer in held:
        writer.close()


async def test_at_the_connection_cap_the_oldest_waiting_connection_makes_room(
    serve: Serve,
) -> None:
    options = replace(SHORT, read_header_timeout=30.0, idle_timeout=30.0)
    guard, port = await serve(options)
    idle = [await connect(port) for _ in range(options.max_connections)]
    for _ in range(50):
        if guard.open == options.max_connections:
            break
        await asyncio.sleep(0.01)
    assert guard.open == options.max_connections
    # a scraper still gets in, at once, and the connection idle the longest is closed for it
    started = time.monotonic()
    assert (await get(port, "/metrics")).startswith(b"HTTP/1.1 200")
    assert time.monotonic() - started < 0.5
    took, _ = await closed_after(idle[0][0], started)
    assert took < 0.5
    assert guard.closed["evicted"] >= 1
    for _, writer in idle:
        writer.close()


async def test_with_every_connection_in_a_handler_a_new_one_gets_503(serve: Serve) -> None:
    options = replace(SHORT, max_connections=3, max_requests=2)
    guard, port = await serve(options)
    guard.max_requests = 3  # as if the probes or a bug held every connection
    held = [await connect(port) for _ in range(3)]
    for _, writer in held:
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(50):
        if guard.in_flight == 3:
            break
        await asyncio.sleep(0.01)
    reader, writer = await connect(port)
    answer = await asyncio.wait_for(reader.read(), LATE)
    assert answer.startswith(b"HTTP/1.1 503") and answer.endswith(b"Too many connections.\n")
    assert guard.refused["max_connections"] == 1
    writer.close()
    for _, w in held:
        w.close()


async def test_a_tls_handshake_that_never_ends_is_cut(serve: Serve, tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    guard, port = await serve(ssl_context=context)
    started = time.monotonic()  # before the connect: the header deadline runs from the accept
    reader, writer = await connect(port)
    writer.write(b"\x16\x03\x01\x00\x05\x01\x00")  # the start of a ClientHello, then nothing
    took, _ = await closed_after(reader, started)
    assert SHORT.read_header_timeout <= took < LATE
    assert guard.closed["header_timeout"] == 1 and guard.open == 0
    # a real client meanwhile
    tls_reader, tls_writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=pki.client(), server_hostname="127.0.0.1"
    )
    tls_writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await asyncio.wait_for(tls_reader.read(), LATE)).startswith(b"HTTP/1.1 200")
    tls_writer.close()
    writer.close()


def test_the_caps_fit_the_file_limit() -> None:
    assert fit_to_files(128, 40, None) == Caps(128, 40, BATCH)
    assert fit_to_files(128, 40, 1024 - 30) == Caps(128, 40, BATCH)
    # 3/4 of the 240 descriptors left; the slack from the rest
    assert fit_to_files(512, 40, 256 - 16) == Caps(180, 40, 60)
    assert fit_to_files(128, 40, 40 - 20) == Caps(15, 14, 5)  # requests stay below connections
    assert fit_to_files(128, 40, 10 - 20) == Caps(2, 1, 1)
    guard = HttpGuard(HttpOptions(max_connections=512), files=(256, 16))
    assert (guard.max_connections, guard.max_requests, guard.slack) == (180, 40, 60)


def test_limit_flags_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--web\.max-requests: 200 must be below"):
        load_settings(["--web.max-requests", "200", "--web.max-connections", "100"], {})
    with pytest.raises(ConfigError, match=r"--web\.read-header-timeout: 10ms is below"):
        load_settings(["--web.read-header-timeout", "10ms"], {})
    settings, _ = load_settings(
        ["--web.idle-timeout", "90s"], {"INFERENCE_EXPORTER_WEB_MAX_REQUESTS": "7"}
    )
    assert settings.values["web.idle-timeout"] == 90 and settings.values["web.max-requests"] == 7
    # the webhook takes the same flags, and its review must fit in the body timeout
    args = webhook.parser().parse_args(
        ["--web.config.file", "w.yml", "--web.idle-timeout", "2m", "--web.max-connections", "64"]
    )
    assert webhook.settings_from(args).http == replace(
        HttpOptions(), idle_timeout=120.0, max_connections=64
    )
    args = webhook.parser().parse_args(
        ["--web.config.file", "w.yml", "--review.timeout", "5s", "--web.read-body-timeout", "2s"]
    )
    with pytest.raises(ConfigError, match=r"shorter than --review\.timeout"):
        webhook.settings_from(args)


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("read_header_timeout", "--web.read-header-timeout"),
        ("idle_timeout", "--web.idle-timeout"),
        ("max_connections", "--web.max-connections"),
    ],
)
def test_web_config_refuses_limits_the_toolkit_does_not_have(
    tmp_path: Path, field: str, flag: str
) -> None:
    line = refused_at_start(tmp_path, f"http_server_config:\n  {field}: 10s\n")
    assert f"http_server_config.{field}: exporter-toolkit's web config has no such field" in line
    assert flag in line
