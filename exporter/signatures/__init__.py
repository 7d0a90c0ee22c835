"""The bottleneck signature catalogue and the rule pack generated from it.

``all_signatures(cfg)`` returns every :class:`Signature` (alert name, severity, PromQL condition
over the recording rules, evidence queries, runbook) for a :class:`SiteConfig`;
``recording_rules(cfg)`` the records each profile fills from its source, one per signal
(:mod:`exporter.signatures.signals`). The rule files in
``alert_rules/`` and the pages in ``docs/runbooks/`` are rendered from these by
``python -m exporter.signatures``; ``diagnose`` evaluates the same expressions.
"""

from __future__ import annotations

from exporter.signatures.catalogue import all_signatures
from exporter.signatures.definitions import AlertRule, Evidence, RecordingRule, Signature
from exporter.signatures.signals import recording_rules
from exporter.signatures.site import (
    PROFILES,
    SignatureConfigError,
    SiteConfig,
    load_config,
    parse_config,
)

__all__ = [
    "PROFILES",
    "AlertRule",
    "Evidence",
    "RecordingRule",
    "Signature",
    "SignatureConfigError",
    "SiteConfig",
    "all_signatures",
    "load_config",
    "parse_config",
    "recording_rules",
]
