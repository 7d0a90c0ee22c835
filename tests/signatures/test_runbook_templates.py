"""Runbook prose templates: one per alert, placeholders filled from the site config, strict shape."""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest
from support.paths import ROOT

from exporter.signatures import all_signatures, parse_config, runbook_templates
from exporter.signatures.catalogue import BUILDERS, builder_path
from exporter.signatures.definitions import Check, Fix
from exporter.signatures.runbook_templates import RunbookTemplateError, fill, parse, template_names
from exporter.signatures.slo.burn_alerts import slo_alerts

UNDERUSED = "InferenceGPUUnderutilized"
VALID = """# InferenceGPULost

## What it means

First line of a paragraph
that wraps.

A second paragraph.

## On the node

- `nvidia-smi -q | grep -i 'a\\|b'` - what to
  look for.
- `lspci` - the GPU on the bus.

## Fixes, cheapest first

1. **Drain** (minutes): cordon
   the node.
2. **Reset** (hours): `nvidia-smi -r`.

## Caveats

- One caveat.
"""


def test_every_alert_has_a_template_and_every_template_an_alert() -> None:
    alerts = [sig.alert for sig in all_signatures(parse_config({}))]
    # The burn-rate alerts of every kind of objective, set in the shipped config or not.
    alerts += [burn.alert for burn in slo_alerts(parse_config({}), every_kind=True)]
    assert template_names() == sorted(alerts)


def test_templates_ship_as_package_data() -> None:
    """An installed wheel holds the templates: pyproject's package data covers each file."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["exporter"]
    folder = ROOT / "exporter" / "signatures" / "runbooks"
    files = [p.relative_to(ROOT / "exporter").as_posix() for p in folder.glob("Inference*.md")]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


def test_parse_reads_the_page_shape() -> None:
    runbook = parse("InferenceGPULost", VALID)
    assert runbook.meaning == "First line of a paragraph that wraps.\n\nA second paragraph."
    assert runbook.on_node == (
        Check("nvidia-smi -q | grep -i 'a\\|b'", "what to look for"),
        Check("lspci", "the GPU on the bus"),
    )
    assert runbook.fixes == (
        Fix("minutes", "Drain", "cordon the node."),
        Fix("hours", "Reset", "`nvidia-smi -r`."),
    )
    assert runbook.caveats == ("One caveat.",)
    assert runbook.queries == ()


def test_caveats_are_optional() -> None:
    text = VALID[: VALID.index("## Caveats")]
    assert parse("InferenceGPULost", text).caveats == ()


def test_fill_leaves_promql_braces_and_shell_dollars_alone() -> None:
    text = 'rate(x{job="a"}[5m]) > {{limit}} and `kill $(pgrep vllm)`; {target} ${HOME}'
    filled = fill("InferenceGPULost", text, {"limit": "0.9"})
    assert filled == 'rate(x{job="a"}[5m]) > 0.9 and `kill $(pgrep vllm)`; {target} ${HOME}'
    assert fill("InferenceGPULost", "a {{ limit }} b", {"limit": "1"}) == "a 1 b"


def test_placeholder_without_a_value_fails() -> None:
    with pytest.raises(RunbookTemplateError, match=r"\{\{baseline\}\} has no value") as err:
        fill("InferenceGPULost", "needs {{baseline}} of history", {"window": "1h"})
    assert "exporter/signatures/runbooks/InferenceGPULost.md" in str(err.value)


def test_value_without_a_placeholder_fails() -> None:
    with pytest.raises(RunbookTemplateError, match="never used: baseline"):
        fill("InferenceGPULost", "no placeholder here", {"baseline": "1h"})


@pytest.mark.parametrize("text", ["a {{ 1x }} b", "a {{baseline b", "a baseline}} b", "{{}}"])
def test_malformed_placeholder_fails(text: str) -> None:
    with pytest.raises(RunbookTemplateError, match="malformed placeholder"):
        fill("InferenceGPULost", text, {"baseline": "1h"})


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("# InferenceGPULost\n", "# InferenceGPUTypo\n", "first line must be"),
        ("## On the node\n", "## On the host\n", "unknown heading '## On the host'"),
        ("## Caveats\n", "### Caveats\n", "unknown heading"),
        ("## Caveats\n\n- One caveat.\n", "## What it means\n\nAgain.\n", "appears twice"),
        ("- `lspci` - the GPU on the bus.", "- `lspci` the GPU on the bus.", "is not '- `command`"),
        (
            "- `lspci` - the GPU on the bus.",
            "- `lspci` - the GPU on the bus",
            "is not '- `command`",
        ),
        ("2. **Reset**", "3. **Reset**", "item 2 is numbered 3"),
        ("(hours)", "(months)", "effort 'months' is not one of"),
        ("1. **Drain** (minutes): cordon", "1. Drain (minutes): cordon", "is not 'N. **Action**"),
        ("that wraps.", "that wraps\n- into a list.", "would start a list"),
        ("  look for.", "  - look for.", "would start a list"),
        ("## What it means\n", "Stray text.\n\n## What it means\n", "text before the first"),
        ("- One caveat.", "One caveat.", "unexpected line"),
    ],
)
def test_template_that_strays_from_the_shape_fails(old: str, new: str, message: str) -> None:
    assert old in VALID
    with pytest.raises(RunbookTemplateError, match=re.escape(message)):
        parse("InferenceGPULost", VALID.replace(old, new, 1))


def test_missing_or_misplaced_section_fails() -> None:
    start, end = VALID.index("## On the node"), VALID.index("## Fixes")
    with pytest.raises(RunbookTemplateError, match="sections must be"):
        parse("InferenceGPULost", VALID[:start] + VALID[end:])
    fixes, caveats = VALID.index("## Fixes"), VALID.index("## Caveats")
    swapped = VALID[:fixes] + VALID[caveats:] + "\n" + VALID[fixes:caveats]
    with pytest.raises(RunbookTemplateError, match="in this order"):
        parse("InferenceGPULost", swapped)


def _edited(monkeypatch: pytest.MonkeyPatch, alert: str, old: str, new: str) -> None:
    """Serve the real templates, with one edit in ``alert``'s."""
    texts = {name: runbook_templates.template_text(name) for name in template_names()}
    assert old in texts[alert]
    texts[alert] = texts[alert].replace(old, new)
    monkeypatch.setattr(runbook_templates, "template_text", lambda name: texts[name])


def test_a_template_edit_with_an_unknown_placeholder_stops_the_catalogue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _edited(
        monkeypatch, UNDERUSED, "## On the node", "Below {{utilisation_typo}} %.\n\n## On the node"
    )
    with pytest.raises(RunbookTemplateError, match=r"\{\{utilisation_typo\}\} has no value"):
        all_signatures(parse_config({}))


def test_a_template_that_drops_a_builders_value_stops_the_catalogue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _edited(monkeypatch, UNDERUSED, "{{utilization_below}}", "30")
    with pytest.raises(RunbookTemplateError, match="never used: utilization_below"):
        all_signatures(parse_config({}))


def test_site_config_values_reach_the_prose() -> None:
    cfg = parse_config(
        {
            "windows": {"baseline": "2h"},
            "signatures": {
                UNDERUSED: {"utilization_below": 0.25},
                "InferenceGPUUtilizationPulsing": {"busy_sample_above": 0.75},
                "InferenceGPUXidErrors": {"critical_xids": [79, 48]},
            },
        }
    )
    books = {sig.alert: sig.runbook for sig in all_signatures(cfg)}
    assert "Sustained utilisation below 25 % with requests" in books[UNDERUSED].meaning
    assert "(default 48, 79)." in books["InferenceGPUXidErrors"].meaning
    hbm = " ".join(books["InferenceHBMBandwidthSaturated"].caveats)
    assert "needs 2h of history" in hbm and "the first 2h after" in hbm
    pulsing = " ".join(books["InferenceGPUUtilizationPulsing"].caveats)
    assert "Samples exactly at 75 % count as not saturated" in pulsing


def test_each_family_module_builds_its_own_signature_label() -> None:
    """``builder_path(family)``, quoted on every runbook page, is where the builder lives."""
    signatures = all_signatures(parse_config({}))
    assert len(BUILDERS) == len(signatures)
    for build, sig in zip(BUILDERS, signatures, strict=True):
        assert build.__module__ == f"exporter.signatures.catalogue.{sig.family}_signatures", (
            sig.alert
        )
        assert (ROOT / builder_path(sig.family)).is_file()
        assert (ROOT / runbook_templates.template_path(sig.alert)).is_file()
