"""The one fake clock of the tests: seconds that move only when a test (or ``step``) moves them."""

from __future__ import annotations

import threading


class FakeClock:
    """Reads ``now``; ``advance(seconds)`` moves it, and a ``step`` moves it on every read.

    Thread-safe, so collectors on worker threads and the test can share one. With ``step`` the
    clock advances *before* answering (the first read is ``now + step``), as a clock that ticks
    between two reads would.
    """

    def __init__(self, now: float = 1000.0, *, step: float = 0.0) -> None:
        self.now = now
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
