"""Scrapes first: background work steps aside while a ``/metrics`` request is being served.

CPython runs one thread at a time and hands the interpreter over every 5 ms. A scrape (about
5 ms of Python with 8 GPUs) that meets the engine poll's parse (about 5 ms for a vLLM
exposition, far more for a large Triton one) or the process scan shares the interpreter with
it and takes twice as long: these overlaps made the p99 of ``/metrics``. The scrape path wraps
each request in :meth:`ScrapeGate.serving`; background loops call :meth:`ScrapeGate.step_aside`
between items (one metric family, one process, one GPU read). While a request is in flight the
call waits, without holding the interpreter, until it is done or ``max_wait`` has passed, so
scrapes back to back slow background work down but can never stop it.

With no request in flight ``step_aside`` is one attribute read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_WAIT_S = 0.05


def no_pause() -> None:
    """The ``pause`` of code that is not on a background thread (tests, ``diagnose``)."""


class ScrapeGate:
    """Counts requests in flight; lets background threads wait for none."""

    def __init__(self, max_wait: float = MAX_WAIT_S) -> None:
        self.max_wait = max_wait
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Event()
        self._idle.set()
        self.waits = 0  # calls that found a request in flight (tests, profiling)

    @contextmanager
    def serving(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

    def step_aside(self) -> None:
        if self._idle.is_set():
            return
        self.waits += 1
        self._idle.wait(self.max_wait)


SCRAPES = ScrapeGate()
"""The process's gate: the HTTP app serves through it, collectors step aside through it."""
