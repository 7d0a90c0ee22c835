"""Row "Engine poll and tokenizer probe": can the sidecar read the engine."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    UP_DOWN,
    AnyPanel,
    Query,
    Unit,
    by,
    rate,
    series,
    state_timeline,
    target_legend,
    timeseries,
)

TITLE = "Engine poll and tokenizer probe"


def engine_up() -> AnyPanel:
    return state_timeline(
        "Engine metrics readable",
        "Whether the sidecar's last poll of the engine's /metrics succeeded and parsed. Bad: "
        "down - queue, latency and KV-cache signals are missing (InferenceEngineMetricsDown); "
        "the failures panel says why (connect, timeout, status, too_large, parse).",
        [
            Query(
                by("min", series("inference_engine_up"), "engine"),
                "{{engine}} " + target_legend(),
            )
        ],
        mappings=UP_DOWN,
        span=8,
    )


def last_success() -> AnyPanel:
    return timeseries(
        "Age of the engine's metrics",
        "Seconds since the last successful poll of the engine's /metrics. It stays below the "
        "poll interval (5 s by default) while polls succeed. Bad: climbing - polls fail; "
        "after three intervals the engine's series disappear.",
        [
            Query(
                "time() - "
                + by("max", series("inference_engine_last_success_timestamp_seconds"), "engine"),
                "{{engine}} " + target_legend(),
            )
        ],
        unit=Unit.SECONDS,
        span=8,
    )


def failures() -> AnyPanel:
    return timeseries(
        "Poll and probe failures",
        "Failed polls of the engine's /metrics per second by reason, failed tokenizer probes "
        "per second, and engine series dropped because a metric exceeded --engine.max-series. "
        "Bad: any sustained failure rate - the signals that depend on it go stale; dropped "
        "series mean an engine metric's labels explode.",
        [
            Query(
                by("sum", rate("inference_engine_poll_failures_total"), "reason"),
                "poll {{reason}} " + target_legend(),
            ),
            Query(
                by("sum", rate("inference_tokenizer_probe_failures_total")),
                "tokenizer probe " + target_legend(),
            ),
            Query(
                by("sum", rate("inference_engine_series_dropped_total"), "metric"),
                "dropped {{metric}} " + target_legend(),
            ),
        ],
        unit=Unit.PER_SECOND,
        span=8,
    )


def panels() -> Sequence[AnyPanel]:
    return [engine_up(), last_success(), failures()]
