"""HTTP fetch with hard limits: the sidecar's only HTTP client.

Everything the sidecar asks of the engine (``/metrics``, the tokenize endpoint) goes through
:func:`fetch`, which treats the endpoint as hostile:

- one deadline covers connecting, the headers and the whole body, so a server that hangs or
  sends one byte at a time costs at most ``timeout`` seconds;
- at most ``max_bytes`` are accepted, counted on the wire *and* after decompression: a
  ``Content-Length`` above the limit fails before reading, a longer stream fails as soon as
  it passes the limit, and a gzip bomb is inflated only up to the limit;
- redirects are not followed, cookies are not kept, proxies are not taken from the
  environment (:func:`make_session`).

Every failure is a :class:`FetchError` with a ``reason`` that can be a label value:

``connect``   no connection, or it was refused, reset or closed before a response
``timeout``   no complete response before the deadline
``status``    a response other than 2xx (3xx included); ``FetchError.status`` holds the code
``too_large`` more than ``max_bytes`` announced, sent, or inflated
``protocol``  not valid HTTP, a body cut short, or an encoding that does not decode

Nothing here knows Prometheus.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import aiohttp
from aiohttp import hdrs
from aiohttp.http_exceptions import HttpProcessingError

from exporter import __version__

FetchReason = Literal["connect", "timeout", "status", "too_large", "protocol"]

USER_AGENT: Final = f"inference-bottleneck-exporter/{__version__}"

# The encodings _Inflater decodes; aiohttp's own decoding is off so the size limit applies
# while inflating, not after.
_ACCEPT_ENCODING: Final = "gzip, deflate"
_MESSAGE_MAX: Final = 160
# Output of one zlib call: bounds the temporary copy next to the body.
_INFLATE_STEP: Final = 256 * 1024


class FetchError(Exception):
    """A fetch that did not produce a complete 2xx body within the limits."""

    def __init__(self, reason: FetchReason, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.reason: FetchReason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True)
class FetchResult:
    """A complete 2xx response: decoded body, raw ``Content-Type`` header ("" if none)."""

    status: int
    body: bytes
    content_type: str
    elapsed: float


def make_session(*, limit: int = 4, user_agent: str = USER_AGENT) -> aiohttp.ClientSession:
    """A client session for :func:`fetch`; create it inside the running event loop.

    No cookie persistence, at most ``limit`` connections, no proxy settings from the
    environment, status codes left to :func:`fetch`, and no timeout of its own (each fetch
    carries its deadline).
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={hdrs.USER_AGENT: user_agent},
        raise_for_status=False,
        trust_env=False,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
    )


async def fetch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    method: str = "GET",
    json_body: object | None = None,
    headers: Mapping[str, str] | None = None,
) -> FetchResult:
    """Send one request and read the whole 2xx body, within ``timeout`` seconds and
    ``max_bytes`` bytes; raise :class:`FetchError` otherwise.

    ``json_body``, when given, is sent as JSON. ``elapsed`` runs from the start of the call to
    the last byte of the body.
    """
    request_headers = {
        name: value for name, value in (headers or {}).items() if name.lower() != "accept-encoding"
    }
    request_headers[hdrs.ACCEPT_ENCODING] = _ACCEPT_ENCODING
    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            status, content_type, body = await _exchange(
                session,
                method,
                url,
                max_bytes=max_bytes,
                json_body=json_body,
                headers=request_headers,
            )
    except FetchError:
        raise
    except TimeoutError:
        # Also aiohttp's own ServerTimeoutError, should the session carry a shorter timeout.
        raise FetchError("timeout", f"no complete response within {timeout:g}s") from None
    except aiohttp.InvalidURL:
        raise FetchError("connect", "invalid URL") from None
    except aiohttp.ClientConnectionError as err:
        raise FetchError("connect", _describe(err)) from None
    except aiohttp.ClientResponseError as err:
        raise FetchError("protocol", f"invalid HTTP response: {_first_line(err.message)}") from None
    except (aiohttp.ClientError, HttpProcessingError) as err:
        raise FetchError("protocol", _describe(err)) from None
    except OSError as err:
        raise FetchError("connect", _describe(err)) from None
    return FetchResult(status, body, content_type, time.perf_counter() - start)


async def _exchange(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    max_bytes: int,
    json_body: object | None,
    headers: dict[str, str],
) -> tuple[int, str, bytes]:
    async with session.request(
        method,
        url,
        json=json_body,
        headers=headers,
        allow_redirects=False,
        auto_decompress=False,
    ) as response:
        if not 200 <= response.status < 300:
            response.close()
            message = _first_line(f"HTTP {response.status} {response.reason or ''}")
            raise FetchError("status", message, status=response.status)
        announced = response.content_length
        if announced is not None and announced > max_bytes:
            response.close()
            raise FetchError(
                "too_large", f"Content-Length {announced} exceeds the limit of {max_bytes} bytes"
            )
        encoding = response.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
        try:
            inflater = _Inflater(encoding) if encoding not in ("", "identity") else None
            body = await _read_limited(response.content, inflater, max_bytes)
        except FetchError:
            response.close()
            raise
        return response.status, response.headers.get(hdrs.CONTENT_TYPE, ""), body


async def _read_limited(
    stream: aiohttp.StreamReader, inflater: _Inflater | None, max_bytes: int
) -> bytes:
    """The body, decoded; fails as soon as more than ``max_bytes`` arrived or inflated."""
    body = bytearray()
    received = 0
    while chunk := await stream.readany():
        received += len(chunk)
        if received > max_bytes:
            raise FetchError("too_large", f"body exceeds the limit of {max_bytes} bytes")
        if inflater is None:
            body += chunk
        else:
            inflater.feed(chunk, body, max_bytes)
            _check_inflated(body, max_bytes)
    if inflater is not None:
        inflater.feed(b"", body, max_bytes)
        _check_inflated(body, max_bytes)
        if not inflater.complete:
            raise FetchError("protocol", f"{inflater.encoding} body ends mid-stream")
    return bytes(body)


def _check_inflated(body: bytearray, max_bytes: int) -> None:
    if len(body) > max_bytes:
        raise FetchError("too_large", f"body inflates beyond the limit of {max_bytes} bytes")


class _Inflater:
    """Incremental gzip/deflate decoding that never produces more than asked for.

    ``zlib``'s ``max_length`` keeps undecoded input in ``unconsumed_tail`` instead of
    expanding it, so a bomb is inflated only to one byte past the limit, a step at a time.
    """

    def __init__(self, encoding: str) -> None:
        if encoding not in ("gzip", "x-gzip", "deflate"):
            raise FetchError("protocol", f"unsupported Content-Encoding {encoding!r}")
        self.encoding = encoding
        self._decoder: zlib._Decompress | None = None

    @property
    def complete(self) -> bool:
        """True when no compressed member is left half-decoded."""
        return self._decoder is None

    def feed(self, data: bytes, out: bytearray, limit: int) -> None:
        """Decode ``data`` onto ``out``, stopping once ``out`` holds more than ``limit`` bytes."""
        pending = data
        while len(out) <= limit:
            if self._decoder is None:
                if not pending:
                    break
                self._decoder = zlib.decompressobj(self._wbits(pending))
            decoder = self._decoder
            before = (len(out), len(pending))
            try:
                out += decoder.decompress(pending, min(limit + 1 - len(out), _INFLATE_STEP))
            except zlib.error as err:
                raise FetchError(
                    "protocol", f"{self.encoding} body does not decode: {err}"
                ) from None
            if decoder.eof:
                # gzip allows several members back to back (RFC 1952 section 2.2).
                pending = decoder.unused_data
                self._decoder = None
            else:
                pending = decoder.unconsumed_tail
                if (len(out), len(pending)) == before:
                    break  # needs more input

    def _wbits(self, first: bytes) -> int:
        if self.encoding != "deflate":
            return 16 + zlib.MAX_WBITS
        # "deflate" should be zlib-wrapped (RFC 9110), but some servers send raw deflate;
        # a zlib stream starts with compression method 8 in the low nibble.
        return zlib.MAX_WBITS if first[0] & 0x0F == 8 else -zlib.MAX_WBITS


def _describe(err: BaseException) -> str:
    text = _first_line(str(err))
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = line.rstrip(":")
    return line if len(line) <= _MESSAGE_MAX else line[: _MESSAGE_MAX - 3] + "..."
