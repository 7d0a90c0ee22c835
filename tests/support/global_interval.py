"""The pack's rule files with every group at the global interval, for a one-second test Prometheus.

The pack times one group itself (the SLO budget's 28-day read, every 2m30s): a Prometheus of a
test that evaluates every second would first evaluate it up to 2m30s after it starts, past the
test's deadline. The tests that check that a view's queries have data, not when the pack
evaluates, read copies of the rule files without the groups' own ``interval``; the pack's
intervals are tested on their own (``tests/signatures/test_slo_rules.py``, the chart's tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml


def at_global_interval(rule_files: Sequence[Path], out: Path) -> list[Path]:
    """Copies of ``rule_files`` in ``out`` (same names; their directories' names prefixed where
    two files share a name), every group's own ``interval`` removed."""
    out.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in rule_files:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        untimed = [{k: v for k, v in g.items() if k != "interval"} for g in doc["groups"]]
        copy = out / f"{path.parent.name}-{path.name}"
        copy.write_text(yaml.safe_dump({"groups": untimed}, sort_keys=False), encoding="utf-8")
        copies.append(copy)
    return copies
