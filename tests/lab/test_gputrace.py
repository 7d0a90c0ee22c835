"""Drill traces replay, and look as documented: steady, never pulsing."""

from __future__ import annotations

import json

import pytest

from exporter.backends.replay import parse_trace
from exporter.lab.engine.gputrace import LOOKS, SCENARIO_LOOK, mean_utilization, trace_lines


@pytest.mark.parametrize("look", sorted(LOOKS))
def test_trace_replays_with_the_documented_mean(look: str) -> None:
    lines = trace_lines(look)
    trace = parse_trace(lines, look)
    assert len(trace.gpus) == 1
    assert mean_utilization(lines) == pytest.approx(LOOKS[look], abs=2.0)
    samples = [v for line in lines[1:] for _, v in json.loads(line)["samples"]]
    # Not pulsing: the pulsing signature counts samples at or below 5 % and above 90 %.
    assert not [v for v in samples if v <= 5 or v > 90]
    assert trace_lines(look) == lines  # deterministic


def test_every_cpu_scenario_has_a_look() -> None:
    assert set(SCENARIO_LOOK.values()) <= set(LOOKS)
    assert SCENARIO_LOOK["queue-flood"] == "busy"
