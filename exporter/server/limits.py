"""Connection limits and timeouts, on every listener the project runs (the sidecar, the node
agent, the admission webhook).

aiohttp's server has no header-read timeout, no body-read timeout and no cap on connections:
a client that sends half a request header and then nothing holds its connection, and a file
descriptor, for good. :class:`HttpGuard` is the missing part. The listening side
(:mod:`exporter.server.acceptor`) hands it every accepted socket; it gives the connection a
protocol, :class:`GuardedProtocol`, that wraps aiohttp's and keeps one deadline per phase:

=================  ==========================================================  ===========
phase              deadline                                                    on expiry
=================  ==========================================================  ===========
request headers    ``--web.read-header-timeout`` from the accept (TLS          408, closed
                   handshake included), or from the first byte of the next
                   request on a kept-alive connection
request body       ``--web.read-body-timeout`` from the end of the headers     closed
handler            none here (the scrape deadline, the review timeout)         -
response           ``--web.write-timeout`` while the client reads none of it   closed
idle keep-alive    ``--web.idle-timeout`` from the end of the request          closed
=================  ==========================================================  ===========

At ``--web.max-connections`` a new connection takes the place of the oldest one that is not
in a handler (idle, still sending its request, or stalled on its response), which is closed:
a flood of slow or idle connections holds at most that many, and a scraper that sends its
request at once gets in. Requests in handlers are capped by ``--web.max-requests``, below the
connection cap so that there is always a connection to evict; the health probes are not
counted (they cost nothing and must answer during a flood), and a request past the cap gets
503 with its connection closed. Each close and refusal is counted by reason
(``inference_exporter_http_connections_{closed,refused}_total``) and logged through the
limiting log handler, so a flood costs a line a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import ssl
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PromCollector

from exporter import logs
from exporter import metrics as m
from exporter.config import HttpOptions

log = logging.getLogger(__name__)

#: Why the exporter closed a connection (``..._connections_closed_total{reason}``).
CLOSE_REASONS = ("header_timeout", "body_timeout", "write_timeout", "idle_timeout", "evicted")
#: Why it turned one away (``..._connections_refused_total{reason}``).
REFUSE_REASONS = ("max_connections", "max_requests", "out_of_files")
#: Accepts per readable event of a listening socket, and the most that may run ahead of the
#: descriptors of evicted connections (freed on the loop's next turn) where files allow.
BATCH = 64
#: Connections closed, at least, each time an accept finds no file descriptor.
SHED_ON_EXHAUSTION = 8
#: What :meth:`HttpGuard.room` says of one more connection.
Room = Literal["yes", "wait", "full"]
#: Answered whatever the load: they cost nothing, and a kubelet must see them.
PROBES = frozenset({"/-/healthy", "/-/ready"})
# Share of the file descriptors left at start that connections may take; the rest stays for
# the collectors (NVML's device files, engine and kubelet sockets, /proc reads).
_FILE_SHARE = 0.75
_TLS_SHUTDOWN_S = 2.0
# Longest a closed connection's descriptor is waited for before it is counted free anyway.
_CLOSING_GRACE_S = 2.0
_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_FULL_BODY = b"Too many connections.\n"
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(_FULL_BODY), _FULL_BODY)
)


def file_limit() -> int | None:
    """The process's soft limit on open files, None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def open_files() -> int:
    """File descriptors open now (0 where ``/proc/self/fd`` cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


@dataclass(frozen=True)
class Caps:
    """The caps in force: connections, requests in handlers, and the slack: how many accepts
    may run ahead of the descriptors of connections closed to make room (freed on the loop's
    next turn)."""

    connections: int
    requests: int
    slack: int


def fit_to_files(max_connections: int, max_requests: int, room: int | None) -> Caps:
    """The caps for ``room`` file descriptors left to connections (None: no limit): the
    connections take at most :data:`_FILE_SHARE` of them, the slack at most the rest, requests
    stay below the connections."""
    slack = BATCH
    if room is not None:
        max_connections = max(2, min(max_connections, int(room * _FILE_SHARE)))
        slack = max(1, min(BATCH, room - max_connections))
    return Caps(max_connections, min(max_requests, max_connections - 1), slack)


class _Occasional:
    """A warning that can come thousands of times a second under a flood: made into a log
    record at most once per :data:`exporter.logs.INTERVAL_S` (a record costs more than the
    connection it is about), with how many times it happened since the last."""

    def __init__(self) -> None:
        self._next = 0.0
        self._count = 0

    def due(self) -> int:
        """0 while not due; when due, how many times it happened since the last line."""
        self._count += 1
        now = time.monotonic()
        if now < self._next:
            return 0
        self._next = now + logs.INTERVAL_S
        count, self._count = self._count, 0
        return count


class GuardedProtocol(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the deadline of the phase it is in, and its
    place in the eviction order. Made at the accept; with TLS it runs the handshake itself
    (``loop.start_tls``), so that a handshake that never ends is cut like a slow header."""

    def __init__(
        self,
        guard: HttpGuard,
        inner: asyncio.Protocol,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self._guard = guard
        self._inner = inner
        self._ssl_context = ssl_context
        self._loop = asyncio.get_running_loop()
        self._raw: asyncio.Transport | None = None  # the TCP transport, until it is closed
        self.transport: asyncio.Transport | None = None  # what aiohttp writes to
        self.closing = False
        self._lost = False
        self._made = False  # the inner protocol has its transport
        self._busy = False  # a request is in a handler
        self._idle = False  # between requests, nothing of the next one received
        self._early = False  # bytes arrived while a request was in its handler
        self._had_body = False
        # What TLS decrypted between the end of the handshake and start_tls returning.
        self._before_made: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._arm(guard.options.read_header_timeout, "header_timeout")

    # --- deadlines ---------------------------------------------------------------------------
    def _arm(self, seconds: float, reason: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self.shut, reason)

    def _cancel_timers(self) -> None:
        for timer in (self._timer, self._body_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._body_timer = self._write_timer = None

    def shut(self, reason: str) -> None:
        """Close the connection for ``reason`` (one of :data:`CLOSE_REASONS`) and count it."""
        if self.closing:
            return
        self._guard.release(self, reason)
        self._cancel_timers()
        transport = self.transport if self.transport is not None else self._raw
        if transport is None:  # not wrapped yet: connection_made closes it
            return
        plain = self._ssl_context is None
        if reason == "header_timeout" and plain:
            transport.write(_REQUEST_TIMEOUT)
        # A graceful close waits for the write buffer to drain (and a TLS one for the peer's
        # close_notify): a client that reads nothing would hold the descriptor; it is cut.
        graceful = plain and reason in ("header_timeout", "idle_timeout", "evicted")
        if graceful and transport.get_write_buffer_size() == 0:
            transport.close()
        else:
            transport.abort()

    # --- asyncio.Protocol --------------------------------------------------------------------
    @property
    def wrapped_once(self) -> bool:
        """Whether asyncio made a transport for the socket (which then owns it)."""
        return self._raw is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._raw = transport
        if self.closing:
            transport.abort()
        elif self._ssl_context is None:
            self._wrapped(transport)
        else:
            # Nothing may reach this protocol before start_tls puts TLS in front of it.
            transport.pause_reading()
            handshake = self._loop.create_task(
                self._loop.start_tls(
                    transport,
                    self,
                    self._ssl_context,
                    server_side=True,
                    ssl_handshake_timeout=self._guard.options.read_header_timeout,
                    ssl_shutdown_timeout=_TLS_SHUTDOWN_S,
                )
            )
            handshake.add_done_callback(self._handshake_done)

    def _handshake_done(self, handshake: asyncio.Task[asyncio.Transport | None]) -> None:
        failed = handshake.cancelled() or handshake.exception() is not None
        tls_transport = None if failed else handshake.result()
        if tls_transport is None:
            # Closed in the handshake: asyncio tells the protocol only through start_tls.
            self.connection_lost(None)
            return
        if self.closing:
            tls_transport.abort()
        else:
            self._wrapped(tls_transport)

    def _wrapped(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._made = True
        self._guard.bind(transport, self)
        self._inner.connection_made(transport)
        early, self._before_made = self._before_made, []
        for data in early:
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._guard.release(self, None)
        self._guard.gone(self)
        self._cancel_timers()
        if self.transport is not None:
            self._guard.unbind(self.transport)
        if self._made:
            self._made = False
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._busy:
            self._early = True
        elif self._idle and not self.closing:
            self._idle = False
            self._arm(self._guard.options.read_header_timeout, "header_timeout")
            self._guard.queue(self)
        if self._made:
            self._inner.data_received(data)
        elif not self.closing:
            self._before_made.append(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._made else None

    def pause_writing(self) -> None:
        if self._write_timer is None and not self.closing:
            self._write_timer = self._loop.call_later(
                self._guard.options.write_timeout, self.shut, "write_timeout"
            )
        if self._made:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self._made:
            self._inner.resume_writing()

    # --- from the middleware -----------------------------------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        self._busy, self._idle, self._early = True, False, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard.hold(self)
        self._had_body = request.body_exists
        if self._had_body and not request.content.is_eof():
            self._body_timer = self._loop.call_later(
                self._guard.options.read_body_timeout, self._body_due, request
            )

    def _body_due(self, request: web.BaseRequest) -> None:
        self._body_timer = None
        if not request.content.is_eof():
            self.shut("body_timeout")

    def request_finished(self) -> None:
        self._busy = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self.closing:
            return
        if self._early and not self._had_body:  # the next request is already on its way
            self._arm(self._guard.options.read_header_timeout, "header_timeout")
        else:
            self._idle = True
            self._arm_idle()
        self._guard.queue(self)

    def _arm_idle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(self._guard.options.idle_timeout, self._idle_due)

    def _idle_due(self) -> None:
        """Idle from the end of the response on: while it is still being written (the write
        timeout watches that), the idle time has not begun."""
        self._timer = None
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size() > 0:
            self._arm_idle()
        else:
            self.shut("idle_timeout")


class HttpGuard(PromCollector):
    """The limits of one server (:mod:`module docs <exporter.server.limits>`), its middleware
    and its metrics. Lives on the event loop's thread; :meth:`collect` only reads."""

    def __init__(
        self,
        options: HttpOptions,
        *,
        files: tuple[int | None, int] | None = None,
    ) -> None:
        """``files``: the file limit (None: none) and the descriptors open; by default the
        process's."""
        self.options = options
        limit, used = (file_limit(), open_files()) if files is None else files
        caps = fit_to_files(
            options.max_connections,
            options.max_requests,
            None if limit is None else limit - used,
        )
        self.max_connections, self.max_requests, self.slack = (
            caps.connections,
            caps.requests,
            caps.slack,
        )
        if self.max_connections < options.max_connections:
            log.warning(
                "--web.max-connections %d lowered to %d: the process may open %d files "
                "(ulimit -n) and has %d open",
                options.max_connections,
                self.max_connections,
                limit,
                used,
            )
        self._open: set[GuardedProtocol] = set()
        # Closed by the guard, descriptor not yet free (until the loop's next turn): when.
        self._closing: dict[GuardedProtocol, float] = {}
        # Connections not in a handler, the one that has waited longest first: who is evicted.
        self._waiting: OrderedDict[GuardedProtocol, None] = OrderedDict()
        self._by_transport: dict[asyncio.BaseTransport, GuardedProtocol] = {}
        self.in_flight = 0
        self._said_evicting = _Occasional()
        self._said_full = _Occasional()
        self._said_busy = _Occasional()
        self.closed: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    @property
    def open(self) -> int:
        return len(self._open)

    # --- connections -------------------------------------------------------------------------
    def room(self) -> Room:
        """Whether a connection just accepted fits, closing the connections waiting the
        longest to make room for it at the cap: ``yes``; ``wait``: yes, but accept no more
        until the descriptors of the ones closed let go (on the loop's next turn; up to
        :attr:`slack` accepts may run ahead of them); ``full``: every connection is in a
        handler (refuse it)."""
        excess = len(self._open) + 1 - self.max_connections
        if excess > 0 and self.shed(excess) < excess:
            return "full"
        if len(self._open) + len(self._closing) < self.max_connections + self.slack:
            return "yes"
        # A close asyncio never reports back must not hold the accepts up for good.
        stale = time.monotonic() - _CLOSING_GRACE_S
        while self._closing and next(iter(self._closing.values())) < stale:
            del self._closing[next(iter(self._closing))]
        return "wait" if self._closing else "yes"

    def admit(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        """Take an accepted socket that :meth:`room` said fits: wrap it (TLS handshake
        included) in a guarded protocol."""
        loop = asyncio.get_running_loop()
        protocol = GuardedProtocol(self, factory(), ssl_context)
        self._open.add(protocol)
        self._waiting[protocol] = None
        task = loop.create_task(loop.connect_accepted_socket(lambda: protocol, sock))
        task.add_done_callback(lambda done: self._connected(protocol, sock, done))

    def refuse(self, sock: socket.socket, ssl_context: ssl.SSLContext | None) -> None:
        """Turn away an accepted socket that does not fit: 503 (in clear text only) and closed."""
        self.refused["max_connections"] += 1
        if count := self._said_full.due():
            log.warning(
                "every one of the %d connections (--web.max-connections) is in a request: "
                "refused %d new ones with 503 since the last line",
                self.max_connections,
                count,
            )
        if ssl_context is None:
            with contextlib.suppress(OSError):
                sock.send(_FULL)
        sock.close()

    def _connected(
        self, protocol: GuardedProtocol, sock: socket.socket, task: asyncio.Task[Any]
    ) -> None:
        if task.cancelled() or task.exception() is not None:  # the loop is closing
            # After the transport's own callbacks, if one was made (it then owns the socket).
            asyncio.get_running_loop().call_soon(self._reap, protocol, sock)

    def _reap(self, protocol: GuardedProtocol, sock: socket.socket) -> None:
        if not protocol.wrapped_once:
            self.release(protocol, None)
            self.gone(protocol)
            sock.close()

    def shed(self, count: int, *, quiet: bool = False) -> int:
        """Close up to ``count`` of the connections that have waited longest outside a handler
        (reason ``evicted``); how many were closed. Logged unless ``quiet``."""
        done = 0
        while done < count and self._waiting:
            if not quiet and (times := self._said_evicting.due()):
                log.warning(
                    "at the connection limit (%d): closed %d connections idle or slow the "
                    "longest to make room, since the last line",
                    self.max_connections,
                    times,
                )
            next(iter(self._waiting)).shut("evicted")
            done += 1
        return done

    def out_of_files(self) -> int:
        """An accept found no file descriptor: the connections and closes in flight now are
        all the room there is (the file limit was lowered, or something else holds
        descriptors), so the caps are fitted to it, and the connections waiting the longest
        are closed down to the new cap (at least :data:`SHED_ON_EXHAUSTION`, to let the
        accepts go on). How many were closed."""
        caps = fit_to_files(
            self.max_connections, self.max_requests, len(self._open) + len(self._closing)
        )
        self.max_connections, self.max_requests, self.slack = (
            caps.connections,
            caps.requests,
            caps.slack,
        )
        excess = len(self._open) - self.max_connections
        return self.shed(max(SHED_ON_EXHAUSTION, excess), quiet=True)

    def refit(self) -> int:
        """After a shortage: the caps again from the configuration, the file limit and the
        descriptors in use now (the connections' own not counted). The new connection cap."""
        limit = file_limit()
        used = max(0, open_files() - len(self._open) - len(self._closing))
        caps = fit_to_files(
            self.options.max_connections,
            self.options.max_requests,
            None if limit is None else limit - used,
        )
        self.max_connections, self.max_requests, self.slack = (
            caps.connections,
            caps.requests,
            caps.slack,
        )
        return self.max_connections

    def release(self, protocol: GuardedProtocol, reason: str | None) -> None:
        """``protocol`` no longer counts: it is closing (``reason``) or gone (None)."""
        if protocol.closing:
            return
        protocol.closing = True
        self._open.discard(protocol)
        self._waiting.pop(protocol, None)
        if reason is not None:
            self._closing[protocol] = time.monotonic()
            self.closed[reason] += 1
            log.debug("connection closed: %s", reason)

    def gone(self, protocol: GuardedProtocol) -> None:
        """``protocol``'s connection is closed: its descriptor is free."""
        self._closing.pop(protocol, None)

    def queue(self, protocol: GuardedProtocol) -> None:
        """``protocol`` waits outside a handler from now on (the end of the eviction order)."""
        if not protocol.closing:
            self._waiting[protocol] = None
            self._waiting.move_to_end(protocol)

    def hold(self, protocol: GuardedProtocol) -> None:
        """``protocol`` is in a handler: it cannot be evicted."""
        self._waiting.pop(protocol, None)

    def bind(self, transport: asyncio.BaseTransport, protocol: GuardedProtocol) -> None:
        self._by_transport[transport] = protocol

    def unbind(self, transport: asyncio.BaseTransport) -> None:
        self._by_transport.pop(transport, None)

    def drop_all(self) -> None:
        """On shutdown: close the connections aiohttp does not know of yet (handshakes)."""
        for protocol in list(self._open):
            if protocol.transport is None:
                protocol.shut("evicted")

    # --- requests ----------------------------------------------------------------------------
    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """The outermost middleware: marks the connection busy, caps requests in handlers."""
        transport = request.transport
        protocol = self._by_transport.get(transport) if transport is not None else None
        if protocol is not None:
            protocol.request_started(request)
        counted = request.path not in PROBES
        try:
            if counted and self.in_flight >= self.max_requests:
                self.refused["max_requests"] += 1
                if times := self._said_busy.due():
                    log.warning(
                        "%d requests in progress (--web.max-requests): answered 503 to %d "
                        "more since the last line",
                        self.in_flight,
                        times,
                    )
                response = web.Response(
                    status=503,
                    text="Too many requests in progress.\n",
                    headers={"Retry-After": "1"},
                )
                response.force_close()
                return response
            if counted:
                self.in_flight += 1
            try:
                return await handler(request)
            finally:
                if counted:
                    self.in_flight -= 1
        finally:
            if protocol is not None:
                protocol.request_finished()

    # --- metrics -----------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        connections = m.gauge("inference_exporter_http_connections")
        connections.add_metric([], float(len(self._open)))
        yield connections
        limit = m.gauge("inference_exporter_http_connections_limit")
        limit.add_metric([], float(self.max_connections))
        yield limit
        in_flight = m.gauge("inference_exporter_http_requests_in_flight")
        in_flight.add_metric([], float(self.in_flight))
        yield in_flight
        closed = m.counter("inference_exporter_http_connections_closed_total")
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], float(self.closed[reason]))
        yield closed
        refused = m.counter("inference_exporter_http_connections_refused_total")
        for reason in REFUSE_REASONS:
            refused.add_metric([reason], float(self.refused[reason]))
        yield refused
