"""Host-to-device copy timing for a PyTorch inference server (optional; needs torch).

Exposes::

    inference_h2d_copy_seconds{model}    histogram   time of each timed host-to-device copy

    from exporter.instrument.torch_h2d import H2DTimer

    h2d = H2DTimer("llama-3-8b")
    batch = h2d.copy(pinned_batch, "cuda", non_blocking=True)
    with h2d.measure():
        kv_blocks.copy_(swapped_in, non_blocking=True)

On CUDA each copy is bracketed by two CUDA events (``enable_timing=True``) recorded on the
current stream, so the histogram holds the GPU-side duration of the copy, not the host's launch
time. Timing never stalls the stream or the host: a copy is observed once its end event has
completed, checked without blocking at the next copy or at :meth:`H2DTimer.flush`; at most
:data:`MAX_PENDING` copies wait, beyond that the oldest is waited for. Copies issued on another
stream must be timed inside that stream's context (``with torch.cuda.stream(s):``).

Without CUDA (``torch.cuda.is_available()`` false) the timer falls back to
``time.perf_counter()`` around the copy: host wall time of a synchronous copy, which on a CPU
build is a memory copy, not a transfer over PCIe.

torch is imported lazily, on the first copy or measurement, never when this module is imported:
the sidecar imports the ``exporter`` package and must not load torch. Like the other metrics of
:mod:`exporter.instrument`, the ``engine`` label is added by the sidecar when it polls.
"""

from __future__ import annotations

import importlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from exporter.metrics import BY_NAME

NAME = "inference_h2d_copy_seconds"
HELP = BY_NAME[NAME].help
# From a few KiB of token IDs (~10 us) to weights or swapped KV blocks (~1 s).
H2D_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
MAX_PENDING = 1024

_HISTOGRAMS: weakref.WeakKeyDictionary[CollectorRegistry, Histogram] = weakref.WeakKeyDictionary()
_HISTOGRAMS_LOCK = threading.Lock()


def _histogram_of(registry: CollectorRegistry) -> Histogram:
    with _HISTOGRAMS_LOCK:
        histogram = _HISTOGRAMS.get(registry)
        if histogram is None:
            histogram = Histogram(NAME, HELP, ["model"], registry=registry, buckets=H2D_BUCKETS)
            _HISTOGRAMS[registry] = histogram
        return histogram


def _torch() -> Any:
    return importlib.import_module("torch")


class H2DTimer:
    """Times host-to-device copies of one model into ``inference_h2d_copy_seconds``."""

    def __init__(
        self,
        model: str,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.histogram: Histogram = _histogram_of(registry).labels(model=model)
        self._clock = clock
        self._cuda: bool | None = None
        # (start event, end event) of copies whose end has not been seen complete yet.
        self._pending: deque[tuple[Any, Any]] = deque()
        self._lock = threading.Lock()

    def copy(self, tensor: Any, device: Any = "cuda", *, non_blocking: bool = False) -> Any:
        """``tensor.to(device, non_blocking=non_blocking)``, timed; returns the copy."""
        with self.measure():
            return tensor.to(device, non_blocking=non_blocking)

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Time the copies the block issues on the current stream (whatever the block does)."""
        torch = _torch()
        if not self._uses_cuda(torch):
            start = self._clock()
            try:
                yield
            finally:
                self.histogram.observe(self._clock() - start)
            return
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            yield
        finally:
            end.record()
            with self._lock:
                self._pending.append((begin, end))
            self.flush()

    def flush(self, *, wait: bool = False) -> int:
        """Observe the copies that have completed; with ``wait``, wait for all of them first.

        Returns how many copies were observed.
        """
        observed = 0
        with self._lock:
            while self._pending:
                begin, end = self._pending[0]
                if wait or len(self._pending) > MAX_PENDING:
                    end.synchronize()
                elif not end.query():
                    break
                self._pending.popleft()
                # elapsed_time is in milliseconds.
                self.histogram.observe(begin.elapsed_time(end) / 1000.0)
                observed += 1
        return observed

    @property
    def pending(self) -> int:
        """Copies recorded on CUDA whose duration is not observed yet."""
        with self._lock:
            return len(self._pending)

    def _uses_cuda(self, torch: Any) -> bool:
        if self._cuda is None:
            self._cuda = bool(torch.cuda.is_available())
        return self._cuda
