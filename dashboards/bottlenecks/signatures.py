"""Row "Active signatures": one stat per signature family, and the alerts behind them.

The families and their alerts come from the signature catalogue (``exporter.signatures``),
the same source as ``alert_rules/alerts.yaml``, whose alerts carry the family as the
``signature`` label.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.common import (
    AnyPanel,
    Query,
    Unit,
    column_labels,
    series,
    site,
    stat_panel,
    table_panel,
)
from exporter.signatures import all_signatures
from exporter.signatures.definitions import FAMILIES, Family

TITLE = "Active signatures"

FAMILY_TITLES: dict[Family, str] = {
    "cpu": "CPU side: GPU not fed",
    "queue": "Queue",
    "network": "Network / softirq",
    "memory": "Memory: HBM, KV cache",
    "gpu": "GPU health",
    "roofline": "Roofline: far from the limit",
    "meta": "Exporter blind spots",
}


def _alerts_by_family() -> dict[Family, list[str]]:
    families: dict[Family, list[str]] = {family: [] for family in FAMILIES}
    for signature in all_signatures(site()):
        families[signature.family].append(f"{signature.alert} ({signature.title})")
    return families


def family_spans(count: int, width: int = 24) -> list[int]:
    """Widths of ``count`` stats side by side filling one grid row (the first ones wider)."""
    base, wider = divmod(width, count)
    return [base + 1 if index < wider else base for index in range(count)]


def family_stat(family: Family, alerts: Sequence[str], span: int = 4) -> AnyPanel:
    firing = series("ALERTS", 'alertstate="firing"', f'signature="{family}"')
    expr = f"count({firing}) or vector(0)"
    return stat_panel(
        FAMILY_TITLES[family],
        f"Alerts of the `{family}` signature family firing now for the selected pods: "
        + "; ".join(alerts)
        + ". Bad: anything above 0 - open the alert's runbook from the table below.",
        [Query(expr, instant=True)],
        unit=Unit.COUNT,
        span=span,
        thresholds=[(1, "red")],
    )


def alerts_table() -> AnyPanel:
    # The alerts carry the rules' join labels (job left out, as in every table).
    columns = ("alertname", "alertstate", "severity", "signature", *column_labels(), "gpu")
    alerts = series("ALERTS", 'signature!=""')
    expr = f"max by ({', '.join(columns)}) ({alerts})"
    runbook = site().runbook_url.replace("{alertname}", "${__data.fields.alertname}")
    return table_panel(
        "Signature alerts now (pending and firing)",
        "Every signature alert that is pending (its condition holds, waiting out `for`) or "
        "firing for the selected pods, with its family and severity; the alert name links to "
        "its runbook. Bad: any firing row; a pending row is the early warning.",
        [Query(expr, instant=True, format="table")],
        columns=columns,
        height=6,
        links={"alertname": ("Runbook", runbook)},
    )


def panels() -> Sequence[AnyPanel]:
    families = _alerts_by_family()
    spans = family_spans(len(FAMILIES))
    stats = [
        family_stat(family, families[family], span)
        for family, span in zip(FAMILIES, spans, strict=True)
    ]
    return [*stats, alerts_table()]
