"""Row "Collectors": which collector works, and how long each takes in a scrape."""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    OK_FAILING,
    AnyPanel,
    Query,
    Unit,
    by,
    series,
    state_timeline,
    target_legend,
    timeseries,
    warn,
)
from exporter.config import ServerOptions

TITLE = "Collectors"


def success() -> AnyPanel:
    return state_timeline(
        "Collector success",
        "Whether each collector (nvml, cpu, engine, tokenizer, process) ran within its deadline "
        "and could read its source in the scrape. Bad: failing for long - its metrics are "
        "missing and the signatures that read them stay silent (InferenceCollectorFailing); "
        "the sidecar's log and its landing page say why.",
        [
            Query(
                by("min", series("inference_scrape_collector_success"), "collector"),
                "{{collector}} " + target_legend(),
            )
        ],
        mappings=OK_FAILING,
    )


def duration() -> AnyPanel:
    deadline = ServerOptions.scrape_timeout
    return timeseries(
        "Collector duration",
        "Time each collector took in the scrape. Collectors read state that background "
        f"threads keep, so this is milliseconds. Bad: near the deadline ({deadline:g} s by "
        "default, --scrape.timeout) - the collector timed out and reported nothing.",
        [
            Query(
                by("max", series("inference_scrape_collector_duration_seconds"), "collector"),
                "{{collector}} " + target_legend(),
            )
        ],
        unit=Unit.SECONDS,
        thresholds=[warn(deadline)],
    )


def panels() -> Sequence[AnyPanel]:
    return [success(), duration()]
