"""The listening sockets and their accept loop, as an aiohttp site.

asyncio's own accept loop (``loop.create_server``, which aiohttp's ``TCPSite`` uses) meets
"too many open files" badly: for each readable event it tries ``accept()`` as many times as
the backlog is long, and every failure logs a traceback and schedules another retry, so a
process out of file descriptors writes hundreds of thousands of lines a minute and burns a
core until connections go away. Here each listening socket is read by :class:`Acceptor`:

* at most :data:`~exporter.server.limits.BATCH` accepts per readable event, so one flood
  cannot starve the loop's other work (a scraper's request among it);
* every accepted socket goes to :class:`~exporter.server.limits.HttpGuard`, which applies the
  connection cap and the timeouts;
* out of file descriptors (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``), it closes the
  connections idle or slow the longest (usually what took the descriptors), lowers the
  connection cap to the connections left, so that the cap holds off the flood from then on,
  and stops accepting for a back-off (:data:`BACKOFF_S`, doubling up to :data:`BACKOFF_MAX_S`
  while accepts keep failing); clients wait in the kernel's backlog meanwhile. One line says
  that it happened; once no accept has failed for :data:`QUIET_S`, the caps are fitted to the
  file limit again and one line says so, with how many accepts failed and for how long.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable

from aiohttp import web

from exporter.server.limits import BATCH, HttpGuard, file_limit

log = logging.getLogger(__name__)

BACKOFF_S = 0.1
BACKOFF_MAX_S = 1.0
QUIET_S = 5.0
# The wait for evicted connections to let go of their descriptors (a loop turn or two).
WAIT_S = 0.001
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def bind(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` as ``loop.create_server`` makes them: every address
    ``host`` resolves to (all interfaces, IPv4 and IPv6, when None), ``SO_REUSEADDR``, IPv6
    sockets IPv6 only. OSError, with every socket closed, when one cannot be had."""
    infos = socket.getaddrinfo(
        host, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as err:
                raise OSError(
                    err.errno,
                    f"error while attempting to bind on address {address!r}: "
                    f"{(err.strerror or str(err)).lower()}",
                ) from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Acceptor(asyncio.AbstractServer):
    """Accepts on ``sockets`` and hands each connection to ``guard`` (see the module)."""

    def __init__(
        self,
        sockets: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        guard: HttpGuard,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.sockets = sockets
        self._factory = factory
        self._guard = guard
        self._ssl_context = ssl_context
        self._loop = asyncio.get_running_loop()
        self._serving = False
        self._retry: asyncio.TimerHandle | None = None
        self._backoff = BACKOFF_S
        self._shortage_since: float | None = None  # the first failed accept of a shortage
        self._last_failure = 0.0
        self._failed = 0
        self._quiet: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._serving = True
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _pause(self) -> None:
        for sock in self.sockets:
            self._loop.remove_reader(sock.fileno())

    def _resume(self) -> None:
        self._retry = None
        if self._serving:
            self.start()

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as err:
                self._accept_failed(err)
                return
            self._backoff = BACKOFF_S
            conn.setblocking(False)
            room = self._guard.room()
            if room == "full":
                self._guard.refuse(conn, self._ssl_context)
                continue
            self._guard.admit(conn, self._factory, self._ssl_context)
            if room == "wait":
                # Connections are closing to make room: the next accept once their
                # descriptors are free, so that at most one is open past the cap.
                self._pause()
                self._retry = self._loop.call_later(WAIT_S, self._resume)
                return

    def _accept_failed(self, err: OSError) -> None:
        """Stop accepting for a back-off; out of descriptors, make room and lower the cap."""
        self._failed += 1
        self._last_failure = time.monotonic()
        exhausted = err.errno in _OUT_OF_RESOURCES
        shed = 0
        if exhausted:
            self._guard.refused["out_of_files"] += 1
            shed = self._guard.out_of_files()
        if self._shortage_since is None:
            self._shortage_since = self._last_failure
            if exhausted:
                log.error(
                    "out of file descriptors (%s; the limit is %s): closed %d idle or slow "
                    "connections, connection limit lowered to %d, accepting again after a "
                    "back-off",
                    err.strerror,
                    file_limit() or "unlimited",
                    shed,
                    self._guard.max_connections,
                )
            else:
                log.error("accept() failed: %s; accepting again after a back-off", err)
            self._quiet = self._loop.call_later(QUIET_S, self._check_quiet)
        self._pause()
        self._retry = self._loop.call_later(self._backoff, self._resume)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _check_quiet(self) -> None:
        """The end of a shortage: no accept has failed for :data:`QUIET_S`."""
        quiet_for = time.monotonic() - self._last_failure
        if quiet_for < QUIET_S:
            self._quiet = self._loop.call_later(QUIET_S - quiet_for, self._check_quiet)
            return
        assert self._shortage_since is not None
        self._quiet = None
        limit = self._guard.refit()
        log.info(
            "accepts succeed again: %d failed over %.1fs; connection limit %d",
            self._failed,
            self._last_failure - self._shortage_since,
            limit,
        )
        self._shortage_since = None
        self._failed = 0

    # --- asyncio.AbstractServer --------------------------------------------------------------
    def close(self) -> None:
        if self._serving:
            self._serving = False
            self._pause()
        for timer in (self._retry, self._quiet):
            if timer is not None:
                timer.cancel()
        self._retry = self._quiet = None
        for sock in self.sockets:
            sock.close()
        self._guard.drop_all()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        if not self._serving:
            self.start()

    async def serve_forever(self) -> None:
        raise NotImplementedError("run it with an aiohttp runner")

    async def wait_closed(self) -> None:
        return None


class GuardedSite(web.BaseSite):
    """An aiohttp TCP site whose accept loop is :class:`Acceptor` and whose connections are
    kept by ``guard``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        guard: HttpGuard,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        acceptor = Acceptor(
            bind(self._host, self._port, self._backlog), server, self._guard, self._ssl_context
        )
        acceptor.start()
        self._server = acceptor
