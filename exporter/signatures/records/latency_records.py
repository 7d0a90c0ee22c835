"""Medians of the latency histograms: the tokenizer probe's and the engine's inter-token
latency. Tens of buckets per target, so they have their own rule group."""

from __future__ import annotations

from exporter.signatures.definitions import RecordingRule
from exporter.signatures.promql_text import by
from exporter.signatures.records.record_context import DECODES, RecordContext
from exporter.signatures.records.record_groups import LATENCY_GROUP

# The tokenizer collector's own probe, not the engine's tokenizer histogram.
PROBE = 'source="probe"'


def latency_records(ctx: RecordContext) -> list[RecordingRule]:
    """The tokenizer probe's and the inter-token latency's medians, seconds."""
    latency = ctx.window("latency")
    by_bucket = by((*ctx.join, "le"))
    tokenizer = ctx.sidecar_series("inference_tokenizer_latency_seconds_bucket", PROBE)
    # Where decode runs: a disaggregated prefill engine's one token per request is no step.
    inter_token = ctx.sidecar_series("inference_inter_token_latency_seconds_bucket", DECODES)
    return [
        RecordingRule(
            ctx.records.tokenizer_median,
            f"histogram_quantile(0.5, sum {by_bucket} (rate({tokenizer}[{latency}])))",
            "median latency of the tokenizer probe (~512-token prompt), seconds",
            group=LATENCY_GROUP,
        ),
        RecordingRule(
            ctx.records.inter_token_median,
            f"histogram_quantile(0.5, sum {by_bucket} (rate({inter_token}[{latency}])))",
            "median inter-token latency (one decode step as a request sees it), seconds; "
            "engines that decode (not a disaggregated prefill engine)",
            group=LATENCY_GROUP,
        ),
    ]
