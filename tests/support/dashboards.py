"""Reading dashboards as Grafana would: the JSON files, every query in them, template values.

The dashboard tests read ``dashboards/*.json`` (what Grafana imports and the Helm chart
packages), or the JSON generated for a site config, not the Python that generates them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.paths import ROOT

DASHBOARDS = ROOT / "dashboards"

# What Grafana puts in for its interval macros: any valid duration parses, and 1m holds enough
# 1 s scrapes for rate() in the end-to-end test.
MACROS = {"$__rate_interval": "1m", "$__range": "5m"}

# Template variable values, the way Grafana formats them into a regex matcher: "All" is the
# variables' allValue ``.*``; several values are an escaped alternation. The end-to-end test
# scrapes one exporter twice: as a PodMonitor would (namespace, pod) and as a static target
# (neither label); the empty regex selects only series without the label.
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def grafana_regex(*values: str) -> str:
    """Values of a multi-value variable as Grafana writes them into ``=~"$var"``."""
    escaped = [re.sub(r"[\\$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


VARIANTS: dict[str, dict[str, str]] = {
    "all": {"namespace": ".*", "pod": ".*", "model": ".*", "gpu": ".*"},
    "podmonitor-target": {
        "namespace": grafana_regex("inference"),
        "pod": grafana_regex("vllm-0"),
        "model": grafana_regex(MODEL),
        "gpu": grafana_regex("0", "1"),
    },
    "static-target": {"namespace": "", "pod": "", "model": grafana_regex(MODEL), "gpu": "1"},
}


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL expression of a dashboard: a panel target or an annotation."""

    uid: str
    panel: str
    ref: str
    expr: str
    instant: bool

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.uid, self.panel, self.ref)

    def render(self, variables: dict[str, str]) -> str:
        """The expression with macros and ``$var`` replaced as Grafana would."""
        text = self.expr
        for macro, value in MACROS.items():
            text = text.replace(macro, value)
        for name in sorted(variables, key=len, reverse=True):
            text = text.replace("${" + name + "}", variables[name]).replace(
                "$" + name, variables[name]
            )
        return text

    def __str__(self) -> str:
        return f"{self.uid} / {self.panel} / {self.ref}"


@dataclass(frozen=True)
class VariableQuery:
    uid: str
    name: str
    metric: str
    selector: str
    label: str


_LABEL_VALUES = re.compile(
    r"^label_values\((?P<selector>(?P<metric>[a-zA-Z_:][\w:]*)(?:\{[^}]*\})?),\s*(?P<label>\w+)\)$"
)


def load_boards(directory: Path = DASHBOARDS) -> dict[str, dict[str, Any]]:
    """File name -> dashboard of the JSON files in ``directory`` (the committed ones)."""
    return {
        path.name: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob("*.json"))
    }


def all_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels of a dashboard, also those inside collapsed rows; rows themselves excluded."""
    found: list[dict[str, Any]] = []
    for panel in board.get("panels", []):
        if panel.get("type") == "row":
            found += all_panels(panel)
        else:
            found.append(panel)
    return found


def collect_queries(boards: dict[str, dict[str, Any]]) -> list[PanelQuery]:
    queries: list[PanelQuery] = []
    for board in boards.values():
        uid = board["uid"]
        for panel in all_panels(board):
            for target in panel.get("targets", []):
                queries.append(
                    PanelQuery(
                        uid,
                        panel["title"],
                        target["refId"],
                        target["expr"],
                        bool(target.get("instant")),
                    )
                )
        for annotation in board.get("annotations", {}).get("list", []):
            if "expr" in annotation:
                queries.append(
                    PanelQuery(
                        uid, "annotation: " + annotation["name"], "", annotation["expr"], False
                    )
                )
    return queries


def collect_variables(boards: dict[str, dict[str, Any]]) -> list[VariableQuery]:
    found: list[VariableQuery] = []
    for board in boards.values():
        for variable in board.get("templating", {}).get("list", []):
            if variable["type"] != "query":
                continue
            match = _LABEL_VALUES.match(variable["query"])
            assert match, f"{board['uid']}: variable {variable['name']} is not label_values(...)"
            found.append(
                VariableQuery(
                    board["uid"],
                    variable["name"],
                    match["metric"],
                    match["selector"],
                    match["label"],
                )
            )
    return found
