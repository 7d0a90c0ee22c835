"""The serving loop's wait for SIGTERM or SIGINT (exporter.server.listen)."""

from __future__ import annotations

import asyncio
import signal

from exporter.server.listen import wait_for_stop_signal


async def test_the_wait_returns_on_sigterm_and_gives_ctrl_c_back() -> None:
    """The wait ends on SIGTERM, and the loop's handlers end with it: Ctrl-C raises
    KeyboardInterrupt again (a caller that goes on, a test worker that runs the next test)."""
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, signal.raise_signal, signal.SIGTERM)
    await asyncio.wait_for(wait_for_stop_signal(tick_s=0.01), 5)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


async def test_a_cancelled_wait_gives_its_signals_back() -> None:
    waiting = asyncio.ensure_future(wait_for_stop_signal(tick_s=0.01))
    await asyncio.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # the loop's
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
