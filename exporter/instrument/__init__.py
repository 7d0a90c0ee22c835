"""Instrumentation for a custom Python inference server, under the exporter's own names.

A server that is none of the engines the sidecar knows imports this package, records what it
does, and serves its registry on ``/metrics`` as usual (``prometheus_client.start_http_server``
or ``make_asgi_app``); the sidecar then polls it with ``--engine.type custom``, whose mapping is
the identity::

    from exporter.instrument import InferenceMetrics

    metrics = InferenceMetrics("llama-3-8b")
    metrics.queue_depth.set(len(queue))
    metrics.observe_ttft(first_token_at - arrived_at)

    @metrics.tokenizer_timer()
    async def tokenize(text: str) -> list[int]: ...

Everything here runs inside the engine process and imports only prometheus_client and the
metric catalogue; torch is imported by :mod:`exporter.instrument.torch_h2d` only when one of
its timers is used.
"""

from __future__ import annotations

from exporter.instrument.inference import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    PHASE_BUCKETS,
    QUEUE_BUCKETS,
    TOKENIZER_BUCKETS,
    TTFT_BUCKETS,
    InferenceMetrics,
    Timer,
)

__all__ = [
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "PHASE_BUCKETS",
    "QUEUE_BUCKETS",
    "TOKENIZER_BUCKETS",
    "TTFT_BUCKETS",
    "InferenceMetrics",
    "Timer",
]
