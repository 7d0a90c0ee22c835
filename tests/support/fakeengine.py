"""A fake inference engine on loopback, for tests: ``/metrics`` and the tokenize endpoints.

Use it in-process (``async with FakeEngine() as engine: ... engine.url``) or, for tests that
start the real CLI in a subprocess, on its own thread (``with FakeEngine.run_in_thread() as
engine: ...``). It binds only ``127.0.0.1`` on a free port.

Routes
    ``GET /metrics``
        :attr:`FakeEngine.metrics_body` (default: a small vLLM-like exposition).
    ``POST /tokenize`` and ``POST /v1/tokenize``
        Count whitespace-separated words as tokens and answer in the shape of
        :attr:`FakeEngine.flavour` (both paths answer for every flavour):

        ==========  ===========  ===================================================
        flavour     request key  response
        ==========  ===========  ===================================================
        vllm        ``prompt``   ``{"count": n, "max_model_len": 8192, "tokens": [...]}``
        sglang      ``prompt``   ``{"tokens": [...], "count": n}``
        tgi         ``inputs``   ``[{"id", "text", "start", "stop"}, ...]``
        llamacpp    ``content``  ``{"tokens": [...]}``
        ==========  ===========  ===================================================

        A request without the flavour's key (or not JSON) gets a 400. The answer comes after
        ``added_latency + per_token_latency * n`` seconds.

Modes, set per route with :meth:`FakeEngine.set_mode` (see :data:`MODES`), emulate a hostile
or broken engine. Every wait in a handler ends when the server stops, so :meth:`FakeEngine.stop`
returns promptly even with hanging or dripping requests in flight.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import socket
import threading
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

Route = Literal["metrics", "tokenize", "all"]

MODES = (
    "ok",  # the normal answer
    "500",  # HTTP 500 with a short text body
    "hang",  # never answers (up to HANG_SECONDS), returns as soon as the server stops
    "slow_drip",  # the normal answer with its Content-Length, one byte every DRIP_INTERVAL
    "huge",  # HUGE_BYTES of text, chunked, streamed from one small buffer
    "garbage",  # 200 with GARBAGE (random binary bytes) as the body
    "duplicate_families",  # /metrics: DUPLICATE_FAMILIES; tokenize: the JSON answer twice
    "nan_inf",  # /metrics: NAN_INF; tokenize: every number in the answer NaN or +-Infinity
    "close",  # closes the connection without sending anything
    "not_http",  # writes GARBAGE instead of an HTTP response, then closes
    "gzip_bomb",  # a small gzip body (Content-Encoding: gzip) inflating to BOMB_BYTES
)
FLAVOURS = ("vllm", "sglang", "tgi", "llamacpp")

HANG_SECONDS = 60.0
DRIP_INTERVAL = 0.1
HUGE_BYTES = 100 * 1024 * 1024
BOMB_BYTES = 110 * 1024 * 1024
MAX_MODEL_LEN = 8192
_CHUNK = 64 * 1024
_PROMPT_KEYS = {"vllm": "prompt", "sglang": "prompt", "tgi": "inputs", "llamacpp": "content"}

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

_MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
_TTFT = "vllm:time_to_first_token_seconds"

DEFAULT_METRICS = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{_MODEL}}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{_MODEL}}} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",{_MODEL}}} 0.42
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",{_MODEL}}} 12345.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",{_MODEL}}} 6789.0
# HELP {_TTFT} Histogram of time to first token in seconds.
# TYPE {_TTFT} histogram
{_TTFT}_bucket{{engine="0",le="0.01",{_MODEL}}} 2.0
{_TTFT}_bucket{{engine="0",le="0.1",{_MODEL}}} 7.0
{_TTFT}_bucket{{engine="0",le="1.0",{_MODEL}}} 9.0
{_TTFT}_bucket{{engine="0",le="+Inf",{_MODEL}}} 10.0
{_TTFT}_count{{engine="0",{_MODEL}}} 10.0
{_TTFT}_sum{{engine="0",{_MODEL}}} 2.5
"""

_RUNNING_HEADER = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
"""
DUPLICATE_FAMILIES = f"""\
{_RUNNING_HEADER}vllm:num_requests_running{{engine="0",{_MODEL}}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{_MODEL}}} 1.0
{_RUNNING_HEADER}vllm:num_requests_running{{engine="0",{_MODEL}}} 5.0
"""

NAN_INF = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{_MODEL}}} NaN
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{_MODEL}}} +Inf
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",{_MODEL}}} -Inf
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",{_MODEL}}} NaN
"""

# Fixed seed: a failing test sees the same bytes when rerun.
GARBAGE = random.Random(20240601).randbytes(4096)

# A comment line repeated: valid text exposition however much of it is read.
_HUGE_CHUNK = (b"# " + b"x" * 125 + b"\n") * (_CHUNK // 128)


def unused_port() -> int:
    """A loopback TCP port nothing listens on (now): connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@functools.cache
def gzip_bomb() -> bytes:
    """gzip of BOMB_BYTES zero bytes (about 110 KiB), built 1 MiB at a time."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1024 * 1024)
    parts = [compressor.compress(zeros) for _ in range(BOMB_BYTES // len(zeros))]
    parts.append(compressor.flush())
    return b"".join(parts)


def tokenize_words(text: str) -> list[tuple[str, int, int]]:
    """The fake tokenizer: each whitespace-separated word, with its start and stop offsets."""
    return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def token_id(word: str) -> int:
    """A stable id for a word (same word, same id, across runs)."""
    return zlib.crc32(word.encode()) % 50_000


def tokenize_answer(flavour: str, text: str) -> Any:
    """What an engine of ``flavour`` answers to a tokenize request for ``text``."""
    words = tokenize_words(text)
    ids = [token_id(word) for word, _, _ in words]
    if flavour == "vllm":
        return {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids}
    if flavour == "sglang":
        return {"tokens": ids, "count": len(ids)}
    if flavour == "tgi":
        return [
            {"id": tid, "text": word, "start": start, "stop": stop}
            for tid, (word, start, stop) in zip(ids, words, strict=True)
        ]
    if flavour == "llamacpp":
        return {"tokens": ids}
    raise ValueError(f"unknown flavour {flavour!r}; expected one of {FLAVOURS}")


def _poison_numbers(value: Any, specials: list[float]) -> Any:
    """``value`` with each number replaced by the next of NaN, +Inf, -Inf in turn."""
    if isinstance(value, dict):
        return {key: _poison_numbers(item, specials) for key, item in value.items()}
    if isinstance(value, list):
        return [_poison_numbers(item, specials) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        specials.append(specials.pop(0))
        return specials[-1]
    return value


class FakeEngine:
    """A fake engine: configure with the attributes below, read :attr:`requests` afterwards.

    Attributes are read on each request, so tests may change them while the server runs
    (also from another thread: each is a single assignment).
    """

    def __init__(
        self,
        *,
        flavour: str = "vllm",
        metrics_body: str = DEFAULT_METRICS,
        metrics_mode: str = "ok",
        tokenize_mode: str = "ok",
        per_token_latency: float = 0.0,
        added_latency: float = 0.0,
    ) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown flavour {flavour!r}; expected one of {FLAVOURS}")
        self.flavour = flavour
        self.metrics_body = metrics_body
        self.metrics_mode = _checked_mode(metrics_mode)
        self.tokenize_mode = _checked_mode(tokenize_mode)
        self.per_token_latency = per_token_latency
        self.added_latency = added_latency
        #: Requests received, keyed by path (``/metrics``, ``/tokenize``, ``/v1/tokenize``).
        self.requests: Counter[str] = Counter()
        #: The JSON body of the last tokenize request (None before the first).
        self.last_tokenize_request: Any = None
        #: The headers of the last request on any route.
        self.last_headers: dict[str, str] = {}
        #: Triton's model configurations by model (``GET /v2/models/<name>/config``); a model
        #: not there is answered as Triton answers an unknown one (400).
        self.model_configs: dict[str, Any] = {}
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._port = 0

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash."""
        if not self._port:
            raise RuntimeError("FakeEngine is not started")
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        """Listen on 127.0.0.1, on a port the kernel picks."""
        if self._runner is not None:
            raise RuntimeError("FakeEngine already started")
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/tokenize", self._tokenize)
        app.router.add_get("/v2/models/{name}/config", self._model_config)
        # Handlers end by themselves once _stopping is set; the short shutdown timeout only
        # cuts a write blocked on a client that stopped reading.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        for address in runner.addresses:
            self._port = int(address[1])
            break

    async def stop(self) -> None:
        """Stop listening and end every request in flight; safe to call twice."""
        if self._runner is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @classmethod
    def run_in_thread(cls, **kwargs: Any) -> FakeEngineThread:
        """Start a FakeEngine (``kwargs`` as for the constructor) on a thread of its own."""
        return FakeEngineThread(cls(**kwargs))

    def set_mode(self, mode: str, *, route: Route = "all") -> None:
        """Switch ``/metrics`` (route="metrics"), both tokenize paths ("tokenize") or all."""
        mode = _checked_mode(mode)
        if route not in ("metrics", "tokenize", "all"):
            raise ValueError(f"unknown route {route!r}")
        if route in ("metrics", "all"):
            self.metrics_mode = mode
        if route in ("tokenize", "all"):
            self.tokenize_mode = mode

    # --- handlers -----------------------------------------------------------------------------

    def _record(self, request: web.Request) -> None:
        self.requests[request.path] += 1
        self.last_headers = dict(request.headers)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        mode = self.metrics_mode
        content = {"duplicate_families": DUPLICATE_FAMILIES, "nan_inf": NAN_INF}
        body = content.get(mode, self.metrics_body).encode()
        return await self._answer(request, mode, body, METRICS_CONTENT_TYPE)

    async def _model_config(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        name = request.match_info["name"]
        config = self.model_configs.get(name)
        if config is None:
            error = {"error": f"Request for unknown model: '{name}' is not found"}
            return web.json_response(error, status=400)
        return web.json_response(config)

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        mode = self.tokenize_mode
        if mode not in ("ok", "slow_drip", "duplicate_families", "nan_inf"):
            # Failures that do not depend on what was asked.
            return await self._answer(request, mode, b"", JSON_CONTENT_TYPE)
        key = _PROMPT_KEYS[self.flavour]
        try:
            payload = await request.json()
        except ValueError:
            return _bad_request("body is not JSON")
        self.last_tokenize_request = payload
        text = payload.get(key) if isinstance(payload, dict) else None
        if not isinstance(text, str):
            return _bad_request(f"{self.flavour} expects a string in {key!r}")
        answer = tokenize_answer(self.flavour, text)
        delay = self.added_latency + self.per_token_latency * len(tokenize_words(text))
        if await self._pause(delay):
            return web.Response(status=503, text="shutting down")
        if mode == "nan_inf":
            answer = _poison_numbers(answer, [float("nan"), float("inf"), float("-inf")])
        body = json.dumps(answer).encode()
        if mode == "duplicate_families":
            body += body
        return await self._answer(request, mode, body, JSON_CONTENT_TYPE)

    async def _answer(
        self, request: web.Request, mode: str, body: bytes, content_type: str
    ) -> web.StreamResponse:
        """Send ``body`` the way ``mode`` says (content modes have already shaped it)."""
        handler = _TRANSPORT_MODES.get(mode)
        if handler is not None:
            return await handler(self, request, content_type)
        if mode == "slow_drip":
            return await self._drip(request, body, content_type)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _error(self, request: web.Request, content_type: str) -> web.StreamResponse:
        return web.Response(status=500, text="fake engine: internal error")

    async def _hang(self, request: web.Request, content_type: str) -> web.StreamResponse:
        await self._pause(HANG_SECONDS)
        return web.Response(status=503, text="fake engine: hung")

    async def _drip(
        self, request: web.Request, body: bytes, content_type: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.content_length = len(body)
        try:
            await response.prepare(request)
            for index in range(len(body)):
                if await self._pause(DRIP_INTERVAL):
                    break
                await response.write(body[index : index + 1])
            else:
                await response.write_eof()
        except ConnectionError:
            pass  # the client gave up, as it should
        return response

    async def _huge(self, request: web.Request, content_type: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.enable_chunked_encoding()
        assert self._stopping is not None
        try:
            await response.prepare(request)
            for _ in range(HUGE_BYTES // len(_HUGE_CHUNK)):
                if self._stopping.is_set():
                    break
                await response.write(_HUGE_CHUNK)
            else:
                await response.write_eof()
        except ConnectionError:
            pass
        return response

    async def _garbage(self, request: web.Request, content_type: str) -> web.StreamResponse:
        return web.Response(body=GARBAGE, headers={"Content-Type": content_type})

    async def _close(self, request: web.Request, content_type: str) -> web.StreamResponse:
        _drop_connection(request, b"")
        return web.Response()  # never sent: aiohttp finds the transport closed

    async def _not_http(self, request: web.Request, content_type: str) -> web.StreamResponse:
        _drop_connection(request, GARBAGE)
        return web.Response()

    async def _gzip_bomb(self, request: web.Request, content_type: str) -> web.StreamResponse:
        return web.Response(
            body=gzip_bomb(),
            headers={"Content-Type": content_type, "Content-Encoding": "gzip"},
        )

    async def _pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when cut short because the server is stopping."""
        assert self._stopping is not None
        if seconds <= 0:
            return self._stopping.is_set()
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True


_ModeHandler = Callable[[FakeEngine, web.Request, str], Awaitable[web.StreamResponse]]
_TRANSPORT_MODES: dict[str, _ModeHandler] = {
    "500": FakeEngine._error,
    "hang": FakeEngine._hang,
    "huge": FakeEngine._huge,
    "garbage": FakeEngine._garbage,
    "close": FakeEngine._close,
    "not_http": FakeEngine._not_http,
    "gzip_bomb": FakeEngine._gzip_bomb,
}


def _checked_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    return mode


def _bad_request(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)


def _drop_connection(request: web.Request, data: bytes) -> None:
    transport = request.transport
    if transport is not None:
        if data:
            transport.write(data)
        transport.close()


class FakeEngineThread:
    """A :class:`FakeEngine` served by an event loop on a daemon thread.

    For tests whose client is another process (the real CLI) or synchronous code.
    """

    def __init__(self, engine: FakeEngine, *, start_timeout: float = 10.0) -> None:
        self.engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            raise RuntimeError(f"fake engine did not start within {start_timeout}s")
        if self._error is not None:
            raise RuntimeError("fake engine failed to start") from self._error

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def requests(self) -> Counter[str]:
        return self.engine.requests

    def set_mode(self, mode: str, *, route: Route = "all") -> None:
        self.engine.set_mode(mode, route=route)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join the thread; safe to call twice."""
        loop, done = self._loop, self._done
        if loop is not None and done is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(done.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"fake engine thread still running after {timeout}s")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported to the starting thread
            self._error = err
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        async with self.engine:
            self._ready.set()
            await self._done.wait()
