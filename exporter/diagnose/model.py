"""What a diagnosis finds: conditions, instances, evidence, findings, the report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from exporter.diagnose.promql import Labels
from exporter.signatures.config import SiteConfig
from exporter.signatures.model import AlertRule, Signature

SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
# Among signatures that hold, an alert already firing (it held for its whole `for`) ranks
# before a pending one, before none.
_STATE_RANK = {"firing": 0, "pending": 1}


class DiagnoseError(Exception):
    """Something the user can fix; ``str()`` is the one line printed."""


def json_number(value: float | None) -> float | str | None:
    """A float for JSON: NaN and infinities as strings (JSON has no such numbers)."""
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return value


def format_value(fmt: str, value: float | None) -> str:
    """``fmt % value``; ``?`` for no value, Prometheus' spelling of NaN and infinities."""
    if value is None:
        return "?"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return fmt % value


@dataclass
class Condition:
    """One comparison (or presence test) of an alert expression, for one instance."""

    expr: str
    op: str | None
    value: float | None
    threshold: float | None = None
    threshold_expr: str | None = None
    holds: bool = False
    nearly: bool = False
    gap: float | None = None  # |value - threshold| / |threshold|

    def as_json(self) -> dict[str, Any]:
        return {
            "expr": self.expr,
            "op": self.op,
            "value": json_number(self.value),
            "threshold": json_number(self.threshold),
            "threshold_expr": self.threshold_expr,
            "holds": self.holds,
            "nearly": self.nearly,
            "relative_gap": json_number(self.gap),
        }


@dataclass
class Instance:
    """One label set an alert expression returns (or nearly returns), with its conditions."""

    labels: Labels
    holds: bool
    nearly: bool
    value: float | None
    conditions: list[Condition]

    def get(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass
class EvidenceValue:
    key: str
    label: str
    value: float | None
    unit: str
    text: str


@dataclass
class Finding:
    """A signature that holds or nearly holds for one instance."""

    sig: Signature
    rule: AlertRule
    instance: Instance
    target: str
    evidence: list[EvidenceValue]
    state: str | None = None

    @property
    def status(self) -> str:
        return "holds" if self.instance.holds else "nearly"

    def sort_key(self) -> tuple[float, ...]:
        severity = float(SEVERITY_RANK[self.rule.severity])
        conditions = self.instance.conditions
        if self.instance.holds:
            # Among signatures that hold: by severity, then an alert already firing before a
            # pending one before none, then by margin.
            persisted = float(_STATE_RANK.get(self.state or "", len(_STATE_RANK)))
            margins = [c.gap for c in conditions if c.holds and c.gap is not None]
            return (0.0, severity, persisted, -min(margins, default=math.inf))
        gaps = [c.gap for c in conditions if c.nearly and c.gap is not None]
        return (1.0, max(gaps, default=0.0), severity)


@dataclass
class Report:
    """Everything one run found, in rank order once :func:`evaluate` has sorted it."""

    mode: str
    source: str
    cfg: SiteConfig
    margin: float
    evaluated_at: float
    findings: list[Finding] = field(default_factory=list)
    not_evaluated: dict[str, str] = field(default_factory=dict)
    no_data: list[str] = field(default_factory=list)
    checked: int = 0
    samples: int = 0
    span: float = 0.0

    @property
    def found(self) -> bool:
        return any(f.instance.holds for f in self.findings)
