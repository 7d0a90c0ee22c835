"""Serve an aiohttp app on one address until SIGTERM or SIGINT: the exporter's and the webhook's.

Every listener is guarded (:mod:`exporter.server.limits`: timeouts, connection and request
caps) and accepts through :mod:`exporter.server.acceptor` (no spinning when out of file
descriptors)."""

from __future__ import annotations

import asyncio
import signal
import ssl

from aiohttp import web

from exporter import logs
from exporter.server.acceptor import GuardedSite
from exporter.server.limits import HttpGuard

# Request headers: a scrape or a review sends fewer than ten; a proxy in front adds a dozen.
# aiohttp's default (128 of up to 8 KiB each) would let one slow client park 1 MiB.
MAX_HEADERS = 64
# The accept queue: as Go's servers (node_exporter, Prometheus) ask for, the system's maximum
# (net.core.somaxconn caps it). Connections waiting there hold no descriptor of ours, and a
# scraper's connection is queued behind a burst instead of its SYN dropped (a 1 s retry).
BACKLOG = 4096
SHUTDOWN_S = 1.0


async def start_site(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    guard: HttpGuard,
) -> web.AppRunner:
    """``app`` listening on ``host:port`` (all addresses when ``host`` is empty), over TLS when
    ``ssl_context`` is given, its connections and requests kept by ``guard`` (whose middleware
    goes first). OSError, with the runner cleaned up, when the address cannot be had; the
    caller says so in its own words."""
    app.middlewares.insert(0, guard.middleware)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=SHUTDOWN_S,
        max_headers=MAX_HEADERS,
    )
    await runner.setup()
    site = GuardedSite(
        runner, host or None, port, guard=guard, ssl_context=ssl_context, backlog=BACKLOG
    )
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


async def wait_for_stop_signal(tick_s: float = 1.0) -> None:
    """Return on the first SIGTERM or SIGINT; meanwhile, every ``tick_s``, write the repeat
    summaries of the log that are due (:func:`exporter.logs.tick`). The loop's handlers go
    with it: afterwards Ctrl-C raises KeyboardInterrupt again, as before the wait."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), tick_s)
            except TimeoutError:
                logs.tick()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
