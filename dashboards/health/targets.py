"""Row "Scrape targets": is each sidecar scraped, how long it takes, what it costs.

``up``, ``scrape_*`` and ``process_*`` exist for every target Prometheus scrapes; the job
selector of the rule pack (``InferenceExporterDown``) picks the sidecars' targets.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    UP_DOWN,
    AnyPanel,
    Query,
    Unit,
    by,
    exporter_matchers,
    rate,
    series,
    state_timeline,
    target_legend,
    timeseries,
)

TITLE = "Scrape targets"


def up() -> AnyPanel:
    selector = ", ".join(exporter_matchers())
    return state_timeline(
        "Sidecar scraped",
        "Whether Prometheus's last scrape of each sidecar succeeded (targets whose job matches "
        f"{selector}, the selector of the InferenceExporterDown alert). Bad: down - every "
        "signature of that pod is blind; no row at all means Prometheus does not discover the "
        "sidecar (check the PodMonitor and its job name).",
        [Query(by("max", series("up", *exporter_matchers())), target_legend())],
        mappings=UP_DOWN,
    )


def scrape() -> AnyPanel:
    return timeseries(
        "Scrape duration and series",
        "How long Prometheus takes to scrape each sidecar (left) and how many series it gets "
        "(right). A scrape reads cached state and should take milliseconds. Bad: duration near "
        "the scrape timeout (a collector hits its deadline), or the series count jumping (an "
        "engine exporting new label values; see series dropped on the engine row).",
        [
            Query(
                by("max", series("scrape_duration_seconds", *exporter_matchers())),
                f"duration {target_legend()}",
            ),
            Query(
                by("max", series("scrape_samples_scraped", *exporter_matchers())),
                f"series {target_legend()}",
                axis="right",
                unit=Unit.COUNT,
            ),
        ],
        unit=Unit.SECONDS,
        right_label="series",
    )


def memory() -> AnyPanel:
    return timeseries(
        "Sidecar memory (RSS)",
        "Resident memory of the sidecar process. Bad: growing without bound (a leak, or an "
        "engine with ever new label values), or near the container's memory limit (the sidecar "
        "gets OOM-killed and the pod restarts it).",
        [
            Query(
                by("max", series("process_resident_memory_bytes", *exporter_matchers())),
                target_legend(),
            )
        ],
        unit=Unit.BYTES,
    )


def cpu() -> AnyPanel:
    return timeseries(
        "Sidecar CPU",
        "CPU the sidecar process uses, as a share of one core. It runs in the inference pod and "
        "must not compete with the engine's front-end. Bad: more than a few percent of a core "
        "at the defaults (a short --gpu.poll-interval, or a huge engine /metrics response).",
        [
            Query(
                by("max", rate("process_cpu_seconds_total", *exporter_matchers())),
                target_legend(),
            )
        ],
        unit=Unit.RATIO,
    )


def panels() -> Sequence[AnyPanel]:
    return [up(), scrape(), memory(), cpu()]
