"""What one run of ``diagnose`` found: the ranked findings, what could not be evaluated or had
no data, the roofline and the pools' budgets, and (``--report``) the time series around it.
Rendered by :mod:`exporter.diagnose.report` (text, JSON) and
:mod:`exporter.diagnose.postmortem` (the incident page).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.diagnose.findings import Finding, PoolBudget, Roofline
from exporter.diagnose.timeline import Timeline
from exporter.signatures.site import SiteConfig


@dataclass
class Report:
    """Everything one run found, in rank order once
    :func:`~exporter.diagnose.evaluate.evaluate` has sorted it."""

    mode: str
    source: str
    cfg: SiteConfig
    margin: float
    evaluated_at: float
    findings: list[Finding] = field(default_factory=list)
    not_evaluated: dict[str, str] = field(default_factory=dict)
    no_data: list[str] = field(default_factory=list)
    # Inputs of the profile with no series under any name the pack reads (the dcgm profile's
    # dcgm-exporter fields): what every verdict over them is blind to.
    missing_inputs: list[str] = field(default_factory=list)
    checked: int = 0
    samples: int = 0
    span: float = 0.0
    roofline: list[Roofline] = field(default_factory=list)
    # The latency budget per pool, where the targets include more than one role.
    pools: list[PoolBudget] = field(default_factory=list)
    # The window around the evaluation time (``--report``, Prometheus only).
    timeline: Timeline | None = None

    @property
    def found(self) -> bool:
        return any(f.instance.holds for f in self.findings)
