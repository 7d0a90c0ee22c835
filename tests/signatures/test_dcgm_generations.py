"""The ``dcgm`` profile reads dcgm-exporter 4.8 and 4.9/4.10 alike.

dcgm-exporter 4.9.0 renamed the fields DCGM 4.7 deprecates (eleven of them to base units) and the
driver-version label, 4.10.0 four profiling fields. The rename table
(``tests/fixtures/upstream/dcgm-exporter-renames-4.9-4.10.csv``, written from the release notes)
turns the ``dcgm`` profile's promtool tests, written in 4.8's names and units, into 4.10's: the
same alerts fire with the same labels and annotations, and the same stay quiet. Each quantity
the profile reads (``exporter/signatures/signals/dcgm_fields.py``) has one name in each
generation's default counters; a release that renames one again fails here by name.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import ROOT

from exporter.signatures.signals.dcgm_fields import QUANTITIES, DcgmQuantity

UPSTREAM = ROOT / "tests" / "fixtures" / "upstream"
RENAMES = UPSTREAM / "dcgm-exporter-renames-4.9-4.10.csv"
GENERATIONS = {
    "4.8": UPSTREAM / "dcgm-exporter-4.8-default-counters.csv",
    "4.10": UPSTREAM / "dcgm-exporter-4.10-default-counters-handwritten.csv",
}
PROMTOOL_DCGM = ROOT / "tests" / "promtool" / "dcgm"
RULES = ROOT / "alert_rules" / "dcgm"
# DCGM 3.3 renamed the clock event reasons long before either generation: both names are read.
OLDER = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")
_VALUE = re.compile(r"^(-?[0-9.]+(?:e[+-]?[0-9]+)?)(?:([+-])([0-9.]+(?:e[+-]?[0-9]+)?))?(x\d+)?$")


def renames() -> tuple[dict[str, tuple[str, float]], dict[str, str]]:
    """(metric renames: old -> (new, factor from the old unit to the new), label renames)."""
    lines = RENAMES.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source: HAND-WRITTEN from the release notes of NVIDIA/")
    metrics: dict[str, tuple[str, float]] = {}
    labels: dict[str, str] = {}
    for line in lines[1:]:
        if line.startswith("#") or not line.strip():
            continue
        kind, old, new, factor, _ = line.split(",")
        if kind == "metric":
            metrics[old] = (new, float(factor))
        else:
            labels[old] = new
    return metrics, labels


def default_counters(path: Path) -> set[str]:
    """The fields a counters file collects (its active rows)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source: ")
    return {line.split(",")[0].strip() for line in lines[1:] if line.startswith("DCGM")}


def test_each_quantity_has_one_name_in_each_generations_default_counters() -> None:
    for generation, path in GENERATIONS.items():
        collected = default_counters(path)
        assert len(collected) >= 20, generation
        for quantity in QUANTITIES:
            found = [name for name in quantity.metrics if name in collected]
            if quantity.default:
                assert len(found) == 1, (generation, quantity.title, found)
            else:  # a counters file of one's own adds it
                assert found == [], (generation, quantity.title, found)


def test_the_names_and_units_follow_the_release_notes() -> None:
    """Each quantity: its newest name is the rename table's for its 4.8 name, and the factors
    turn both units into one."""
    metrics, _ = renames()

    def pair(quantity: DcgmQuantity) -> tuple[str, ...]:
        return tuple(name.metric for name in quantity.names)

    for quantity in QUANTITIES:
        if len(quantity.names) == 1:  # a field no release renamed
            (only,) = quantity.names
            assert only.metric not in metrics and only.factor == 1, quantity.title
            continue
        new, old = quantity.names
        if old.metric in OLDER:
            assert OLDER[old.metric] == new.metric and new.factor == old.factor
            continue
        renamed, factor = metrics[old.metric]
        assert renamed == new.metric, quantity.title
        assert old.factor == pytest.approx(factor * new.factor), quantity.title
    assert {pair(q) for q in QUANTITIES} >= {
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_GPU_UTIL"),
        ("DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_USED"),
    }


def test_the_rules_read_every_name_of_every_quantity() -> None:
    rules = "".join(p.read_text(encoding="utf-8") for p in sorted(RULES.glob("*.yaml")))
    read = set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+\b", rules))
    assert read == {name for quantity in QUANTITIES for name in quantity.metrics}


# --- the dcgm profile's promtool tests in 4.10's names ----------------------------------------


def _scaled(values: str, factor: float) -> str:
    """A promtool values string with every number times ``factor``."""
    if factor == 1:
        return values
    out = []
    for token in str(values).split():
        match = _VALUE.match(token)
        if token.startswith("_") or token == "stale" or match is None:
            assert token.startswith("_") or token == "stale", token
            out.append(token)
            continue
        start, sign, step, times = match.groups()
        text = f"{float(start) * factor:.12g}"
        if sign:
            text += f"{sign}{float(step) * factor:.12g}"
        out.append(text + (times or ""))
    return " ".join(out)


def to_new_generation(document: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The test document with every dcgm-exporter series in 4.9/4.10's names, units and labels;
    and how many series it renamed."""
    metrics, labels = renames()
    renamed = 0
    for group in document["tests"]:
        for item in group["input_series"]:
            match = _SERIES.match(item["series"])
            assert match, item["series"]
            name, body = match[1], match[2]
            if name not in metrics:
                continue
            new, factor = metrics[name]
            for old_label, new_label in labels.items():
                body = re.sub(rf"\b{old_label}=", f"{new_label}=", body)
            item["series"] = f"{new}{{{body}}}"
            item["values"] = _scaled(item["values"], factor)
            renamed += 1
    document["rule_files"] = [str(RULES / Path(p).name) for p in document["rule_files"]]
    return document, renamed


def test_values_scale_in_promtool_notation() -> None:
    assert _scaled("30x40", 0.01) == "0.3x40"
    assert _scaled("_x20 0+18x40 stale", 2) == "_x20 0+36x40 stale"
    assert _scaled("80-2x10 5", 1048576) == "83886080-2097152x10 5242880"


@pytest.mark.parametrize("name", ["signatures.yaml", "baseline.yaml"])
def test_dcgm_exporter_4_10_fires_as_4_8(name: str, tmp_path: Path) -> None:
    """The same expectations hold over 4.10's names and units: the same alerts fire with the
    same labels and annotations (the units normalised), the same stay quiet."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run `make tools`"
    document = yaml.safe_load((PROMTOOL_DCGM / name).read_text(encoding="utf-8"))
    translated, renamed = to_new_generation(document)
    assert renamed >= 20
    text = yaml.safe_dump(translated, sort_keys=False)
    assert "DCGM_FI_DEV_GPU_UTIL{" not in text and "DCGM_FI_DEV_GPU_UTIL_RATIO{" in text
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
