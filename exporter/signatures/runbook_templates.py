"""Runbook prose: one Markdown template per alert under ``exporter/signatures/runbooks/``.

A template holds what a person needs that the rules cannot say - what the alert means, what to
run on the node, the fixes cheapest first, caveats - in the shape of the generated page
(``docs/runbooks/<Alert>.md``), so it reads as the result does::

    # InferenceGPULost

    ## What it means

    A paragraph (lines may wrap; a blank line starts the next paragraph).

    ## On the node

    - `nvidia-smi` - what to look for in its output.

    ## Fixes, cheapest first

    1. **Drain the node** (minutes): what to do.

    ## Caveats

    - One caveat (this section is optional).

A list item may wrap onto indented continuation lines. Values that come from the site config
(a threshold, a window, the critical Xids) are ``{{name}}`` placeholders, filled by the alert's
builder in :mod:`exporter.signatures.catalogue`; PromQL braces and a shell's ``$(...)`` in the
prose never look like one. A placeholder without a value, a value without a placeholder, a
stray ``{{``, a missing section or a line of an unexpected shape raises
:class:`RunbookTemplateError` naming the file.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from importlib import resources

from exporter.signatures.definitions import EFFORTS, Check, Effort, Fix, Runbook

PACKAGE = "exporter.signatures"
FOLDER = "runbooks"
MEANING = "What it means"
ON_NODE = "On the node"
FIXES = "Fixes, cheapest first"
CAVEATS = "Caveats"
SECTIONS = (MEANING, ON_NODE, FIXES, CAVEATS)
REQUIRED = (MEANING, ON_NODE, FIXES)

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_BULLET = re.compile(r"- ")
_NUMBERED = re.compile(r"\d+\. ")
# A line that Markdown would read as the start of a list, where the page has running text.
_LIST_START = re.compile(r"(?:[-*+]|\d+\.)(?: |$)")
_CHECK = re.compile(r"- `(?P<command>[^`]+)` - (?P<look_for>.+)\.")
_FIX = re.compile(
    r"(?P<number>\d+)\. \*\*(?P<action>[^*]+)\*\* \((?P<effort>[a-z]+)\): (?P<detail>.+)"
)


class RunbookTemplateError(ValueError):
    """A runbook template that cannot be rendered; ``str()`` names the file and the problem."""

    def __init__(self, alert: str, problem: str) -> None:
        super().__init__(f"{template_path(alert)}: {problem}")


def template_path(alert: str) -> str:
    """Where the template of ``alert`` lives in the source tree (for messages)."""
    return f"exporter/signatures/{FOLDER}/{alert}.md"


def template_names() -> list[str]:
    """The alerts that have a template, from the files shipped with the package."""
    folder = resources.files(PACKAGE) / FOLDER
    return sorted(
        entry.name.removesuffix(".md")
        for entry in folder.iterdir()
        if entry.name.startswith("Inference") and entry.name.endswith(".md")
    )


@functools.cache
def template_text(alert: str) -> str:
    """The raw template of ``alert``, read through the package's resources (wheel or tree)."""
    resource = resources.files(PACKAGE) / FOLDER / f"{alert}.md"
    if not resource.is_file():
        raise RunbookTemplateError(alert, "no such runbook template")
    return resource.read_text(encoding="utf-8")


def fill(alert: str, text: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{name}}`` with ``values[name]``; every value must be used."""
    used: set[str] = set()

    def substitute(match: re.Match[str]) -> str:
        name = match[1]
        if name not in values:
            given = ", ".join(sorted(values)) or "none"
            raise RunbookTemplateError(
                alert, f"placeholder {{{{{name}}}}} has no value (the builder gives: {given})"
            )
        used.add(name)
        return values[name]

    stray = _PLACEHOLDER.sub("", text)
    for token in ("{{", "}}"):
        if token in stray:
            line = next(line for line in stray.splitlines() if token in line)
            raise RunbookTemplateError(alert, f"malformed placeholder in {line.strip()!r}")
    filled = _PLACEHOLDER.sub(substitute, text)
    unused = sorted(set(values) - used)
    if unused:
        raise RunbookTemplateError(alert, f"values given but never used: {', '.join(unused)}")
    return filled


def _sections(alert: str, text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    if not lines or lines[0] != f"# {alert}":
        raise RunbookTemplateError(alert, f"the first line must be '# {alert}'")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[1:]:
        if line.startswith("#"):
            name = line.removeprefix("## ")
            if not line.startswith("## ") or name not in SECTIONS:
                raise RunbookTemplateError(
                    alert, f"unknown heading {line!r} (want '## ' + one of {', '.join(SECTIONS)})"
                )
            if name in sections:
                raise RunbookTemplateError(alert, f"section {name!r} appears twice")
            current = sections[name] = []
        elif current is not None:
            current.append(line)
        elif line.strip():
            raise RunbookTemplateError(alert, f"text before the first section: {line!r}")
    order = [name for name in SECTIONS if name in sections]
    if list(sections) != order or any(name not in sections for name in REQUIRED):
        raise RunbookTemplateError(
            alert, f"sections must be {', '.join(REQUIRED)}[, {CAVEATS}] in this order"
        )
    return sections


def _no_list_start(alert: str, section: str, line: str) -> None:
    if _LIST_START.match(line):
        raise RunbookTemplateError(
            alert, f"{section}: {line!r} would start a list in Markdown; wrap the line elsewhere"
        )


def _paragraphs(alert: str, section: str, lines: list[str]) -> str:
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        if not line.strip():
            if paragraphs[-1]:
                paragraphs.append([])
            continue
        _no_list_start(alert, section, line.strip())
        paragraphs[-1].append(line.strip())
    text = "\n\n".join(" ".join(words) for words in paragraphs if words)
    if not text:
        raise RunbookTemplateError(alert, f"{section}: no text")
    return text


def _items(alert: str, section: str, lines: list[str], marker: re.Pattern[str]) -> list[str]:
    """List items with their continuation lines joined by single spaces."""
    items: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        if line[0].isspace():
            if not items:
                raise RunbookTemplateError(
                    alert, f"{section}: indented line {line!r} before an item"
                )
            _no_list_start(alert, section, line.strip())
            items[-1] += " " + line.strip()
        elif marker.match(line):
            items.append(line.rstrip())
        else:
            raise RunbookTemplateError(alert, f"{section}: unexpected line {line!r}")
    if not items:
        raise RunbookTemplateError(alert, f"{section}: no items")
    return items


def _check(alert: str, item: str) -> Check:
    match = _CHECK.fullmatch(item)
    if match is None:
        raise RunbookTemplateError(
            alert, f"{ON_NODE}: {item!r} is not '- `command` - what to look for.'"
        )
    return Check(match["command"], match["look_for"])


def _fix(alert: str, number: int, item: str) -> Fix:
    match = _FIX.fullmatch(item)
    if match is None:
        raise RunbookTemplateError(
            alert, f"{FIXES}: {item!r} is not 'N. **Action** (effort): detail'"
        )
    if int(match["number"]) != number:
        raise RunbookTemplateError(alert, f"{FIXES}: item {number} is numbered {match['number']}")
    effort = match["effort"]
    if effort not in EFFORTS:
        raise RunbookTemplateError(
            alert, f"{FIXES}: effort {effort!r} is not one of {', '.join(EFFORTS)}"
        )
    return Fix(_effort(effort), match["action"], match["detail"])


def _effort(name: str) -> Effort:
    return next(effort for effort in EFFORTS if effort == name)


def parse(alert: str, text: str) -> Runbook:
    """The runbook in a filled template (without queries: those are PromQL, built in code)."""
    sections = _sections(alert, text)
    fixes = _items(alert, FIXES, sections[FIXES], _NUMBERED)
    caveats = _items(alert, CAVEATS, sections[CAVEATS], _BULLET) if CAVEATS in sections else []
    return Runbook(
        meaning=_paragraphs(alert, MEANING, sections[MEANING]),
        on_node=tuple(
            _check(alert, item) for item in _items(alert, ON_NODE, sections[ON_NODE], _BULLET)
        ),
        fixes=tuple(_fix(alert, number, item) for number, item in enumerate(fixes, 1)),
        caveats=tuple(item.removeprefix("- ") for item in caveats),
    )


def runbook(alert: str, queries: tuple[tuple[str, str], ...] = (), **values: str) -> Runbook:
    """The runbook of ``alert``: its template filled with ``values``, plus ``queries``."""
    found = parse(alert, fill(alert, template_text(alert), values))
    return dataclasses.replace(found, queries=queries)
