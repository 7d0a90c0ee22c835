"""Serve an aiohttp app on one address until SIGTERM or SIGINT: the exporter's and the webhook's."""

from __future__ import annotations

import asyncio
import signal
import ssl

from aiohttp import web


async def start_site(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> web.AppRunner:
    """``app`` listening on ``host:port`` (all addresses when ``host`` is empty), over TLS when
    ``ssl_context`` is given. OSError, with the runner cleaned up, when the address cannot be
    had; the caller says so in its own words."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host or None, port, shutdown_timeout=1.0, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


async def wait_for_stop_signal() -> None:
    """Return on the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
