"""The SLO rule groups of a generated pack, alone, for the burn-rate window tests.

The window pairs of the burn-rate alerts need days of series; the rest of the pack has nothing
to do with them and costs every evaluation (promtool and vmalert evaluate every group each
step). :func:`write_slo_pack` copies the groups ``inference.records.slo`` and ``inference.slo``
of a profile's rule files verbatim into ``records.yaml`` and ``alerts.yaml`` of a directory,
where ``tests/fixtures/slo/*.yaml`` expect them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SLO_RECORDS = "inference.records.slo"
SLO_ALERTS = "inference.slo"


def _groups(path: Path, name: str) -> dict[str, object]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups = [group for group in data["groups"] if group["name"] == name]
    assert len(groups) == 1, f"{path} has no group {name}"
    return {"groups": groups}


def write_slo_pack(pack: Path, out: Path) -> tuple[Path, Path]:
    """``records.yaml`` and ``alerts.yaml`` in ``out``: the SLO groups of ``pack``'s files."""
    out.mkdir(parents=True, exist_ok=True)
    records, alerts = out / "records.yaml", out / "alerts.yaml"
    for target, source, name in (
        (records, pack / "recording_rules.yaml", SLO_RECORDS),
        (alerts, pack / "alerts.yaml", SLO_ALERTS),
    ):
        text = yaml.safe_dump(_groups(source, name), sort_keys=False, width=1 << 20)
        target.write_text(text, encoding="utf-8")
    return records, alerts
