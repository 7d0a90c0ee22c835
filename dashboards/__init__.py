"""Grafana dashboards of inference-bottleneck-exporter, as code.

Built with grafana-foundation-sdk (the Grafana 11.6 line); ``python -m dashboards`` writes
one JSON file per dashboard and rule profile: next to this package for the ``sidecar`` profile,
under ``<profile>/`` for the others (the panels read the profile's signals, and per-GPU detail
from its source), as ``alert_rules/`` holds the rules. ``--check`` fails when they differ from
a fresh generation, ``--config site.yaml`` builds them for the rule pack's site config (its
selectors, join labels and thresholds). See ``dashboards/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import bottlenecks, gpu, health
from dashboards.common import render, using
from exporter.signatures.site import PROFILES, SiteConfig

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


def profile_directory(profile: str) -> str:
    """Where a profile's dashboards go, relative to ``dashboards/``: ``""`` for ``sidecar``,
    else the profile's name (the layout of ``alert_rules/``)."""
    return "" if profile == "sidecar" else profile


def generate_all(cfg: SiteConfig | None = None) -> dict[str, str]:
    """Relative path -> JSON text of every dashboard of every rule profile, for ``cfg``'s site
    settings (the shipped defaults if None)."""
    site = cfg or SiteConfig()
    out: dict[str, str] = {}
    for profile in PROFILES:
        directory = profile_directory(profile)
        for name, text in generate(site.with_profile(profile)).items():
            out[f"{directory}/{name}" if directory else name] = text
    return out
