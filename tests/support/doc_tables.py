"""The presence tables of docs/nvml.md (``<!-- modes -->``, ``<!-- boards -->``): metric ->
column -> promised present (``✓``; any other cell promises absence)."""

from __future__ import annotations

from support.paths import ROOT


def presence_table(marker: str) -> dict[str, dict[str, bool]]:
    text = (ROOT / "docs" / "nvml.md").read_text(encoding="utf-8")
    table = text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0].strip()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    columns = rows[0][1:]
    out: dict[str, dict[str, bool]] = {}
    for row in rows[2:]:
        name = row[0].strip("`")
        out[name] = {column: cell == "✓" for column, cell in zip(columns, row[1:], strict=True)}
    return out
