"""Medians of the latency histograms: the tokenizer probe's and the engine's inter-token
latency. Tens of buckets per target, so they have their own rule group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.signatures.promql_text import by
from exporter.signatures.signals.signal import Rule, Signal
from exporter.signatures.signals.signal_context import DECODES
from exporter.signatures.signals.signal_groups import LATENCY_GROUP

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

# The tokenizer collector's own probe, not the engine's tokenizer histogram.
PROBE = 'source="probe"'


def _median(ctx: SignalContext, series: str) -> str:
    by_bucket = by((*ctx.join, "le"))
    return f"histogram_quantile(0.5, sum {by_bucket} (rate({series}[{ctx.window('latency')}])))"


def _tokenizer_median(ctx: SignalContext) -> str:
    return _median(ctx, ctx.sidecar_series("inference_tokenizer_latency_seconds_bucket", PROBE))


TOKENIZER_MEDIAN = Signal(
    "inference:tokenizer_latency_seconds:median{latency}",
    "seconds",
    LATENCY_GROUP,
    Rule(_tokenizer_median, "median latency of the tokenizer probe (~512-token prompt), seconds"),
    "tokenizer",
)


def _inter_token_median(ctx: SignalContext) -> str:
    # Where decode runs: a disaggregated prefill engine's one token per request is no step.
    return _median(ctx, ctx.sidecar_series("inference_inter_token_latency_seconds_bucket", DECODES))


INTER_TOKEN_MEDIAN = Signal(
    "inference:inter_token_latency_seconds:median{latency}",
    "seconds",
    LATENCY_GROUP,
    Rule(
        _inter_token_median,
        "median inter-token latency (one decode step as a request sees it), seconds; "
        "engines that decode (not a disaggregated prefill engine)",
    ),
    "decode step",
)
