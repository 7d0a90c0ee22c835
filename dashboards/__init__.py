"""Grafana dashboards of inference-bottleneck-exporter, as code.

Built with grafana-foundation-sdk (the Grafana 11.6 line); ``python -m dashboards`` writes
one JSON file per dashboard next to this package, ``--check`` fails when they differ from a
fresh generation, ``--config site.yaml`` builds them for the rule pack's site config (its
selectors, join labels and thresholds). See ``dashboards/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import bottlenecks, gpu, health
from dashboards.common import render, using
from exporter.signatures.site import SiteConfig

# file name -> builder; the order is the order of the README and of the dashboards' links.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    bottlenecks.FILENAME: bottlenecks.dashboard,
    gpu.FILENAME: gpu.dashboard,
    health.FILENAME: health.dashboard,
}


def generate(cfg: SiteConfig | None = None) -> dict[str, str]:
    """File name -> JSON text of every dashboard, for ``cfg`` (the shipped defaults if None).

    Raises :class:`~exporter.signatures.site.SignatureConfigError` for a config the
    dashboards cannot follow.
    """
    with using(cfg or SiteConfig()):
        return {name: render(build()) for name, build in DASHBOARDS.items()}
