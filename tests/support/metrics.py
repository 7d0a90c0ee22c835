"""Reading samples: from an exposition's text, or from one collector's output."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from exporter.collectors.base import Collection


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """One sample's value from an exposition, via prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and (labels is None or sample.labels == labels):
                return float(sample.value)
    return None


class _Metrics:
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics


def registry_of(collection: Collection) -> CollectorRegistry:
    """A fresh registry serving one collector's output, for ``get_sample_value``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Metrics(collection.metrics))
    return registry
