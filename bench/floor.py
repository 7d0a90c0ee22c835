"""A floor for CPU per scrape: encoding the exporter's own series with nothing else around.

The exporter's ``/metrics`` text is parsed back into families and served from a plain
``CollectorRegistry`` whose collector yields those families; in this process (no HTTP, no
collection) each encoder renders it ``calls`` times and the median CPU per render is kept:

* ``generate_latest`` (prometheus_client's text format): the floor the targets compare with;
* prometheus_client's OpenMetrics ``generate_latest``: what a Prometheus scrape gets;
* the exporter's cached ``TextEncoder`` on the same registry;
* gzip of the text body at levels 6 (what the exporter uses) and 1.
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import cpu_ms  # noqa: E402

from exporter.server.exposition import TextEncoder  # noqa: E402


class Static(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def registry_of(text: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Static(list(text_string_to_metric_families(text))))
    return registry


def measure(text: str, calls: int = 200) -> dict[str, Any]:
    registry = registry_of(text)
    body = generate_latest(registry)
    encoder = TextEncoder()
    return {
        "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
        "generate_latest_ms": cpu_ms(lambda: generate_latest(registry), calls),
        "openmetrics_generate_latest_ms": cpu_ms(lambda: om_generate_latest(registry), calls),
        "exporter_text_encoder_ms": cpu_ms(lambda: encoder.encode(registry), calls),
        "gzip6_ms": cpu_ms(lambda: gzip.compress(body, compresslevel=6), calls),
        "gzip1_ms": cpu_ms(lambda: gzip.compress(body, compresslevel=1), calls),
        "text_bytes": len(body),
        "gzip6_bytes": len(gzip.compress(body, compresslevel=6)),
        "gzip1_bytes": len(gzip.compress(body, compresslevel=1)),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(measure(Path(sys.argv[1]).read_text()), indent=2))
