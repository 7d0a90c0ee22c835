"""The engines' latency bucket bounds the SLO thresholds are checked against.

Each set of :data:`~exporter.signatures.slo_buckets.ENGINE_BUCKETS` is what the sidecar
exposes for the engine's captured scrape it names: the scrape is normalised by the engines'
own code (``digest``, units converted as the sidecar does) and its histograms' bounds compared,
so a release that changes its buckets is a new capture and a failing test.
"""

from __future__ import annotations

import math

import pytest
from support.paths import FIXTURES

from exporter.engines import ENGINES, digest, poll_keys
from exporter.server.exposition import go_float
from exporter.signatures.slo_buckets import (
    ENGINE_BUCKETS,
    HISTOGRAM,
    NOT_KNOWN,
    EngineBuckets,
    engines_with,
    le_label,
    neighbours,
)

ENGINE_FIXTURES = FIXTURES / "engines"


def _bounds(entry: EngineBuckets) -> dict[str, set[tuple[float, ...]]]:
    text = (ENGINE_FIXTURES / entry.fixture).read_text(encoding="utf-8")
    snapshot = digest(text, entry.engine, keys=poll_keys())
    found: dict[str, set[tuple[float, ...]]] = {}
    for sli, name in HISTOGRAM.items():
        for series in snapshot.series:
            if series.name == name:
                bounds = tuple(b for b, _ in series.buckets if not math.isinf(b))
                found.setdefault(sli, set()).add(bounds)
    return found


@pytest.mark.parametrize("entry", ENGINE_BUCKETS, ids=lambda e: e.engine)
def test_bounds_are_the_captured_scrapes(entry: EngineBuckets) -> None:
    first = (ENGINE_FIXTURES / entry.fixture).read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# source:") and "HAND-WRITTEN" not in first, entry.fixture
    found = _bounds(entry)
    assert set(found) == set(entry.bounds), entry.engine
    for sli, bounds in entry.bounds.items():
        assert found[sli] == {bounds}, (entry.engine, sli)


def test_every_engine_is_known_or_says_why_not() -> None:
    known = {entry.engine for entry in ENGINE_BUCKETS}
    assert len(known) == len(ENGINE_BUCKETS)
    assert known | set(NOT_KNOWN) == set(ENGINES)
    assert not known & set(NOT_KNOWN)


def test_ten_seconds_is_a_time_to_first_token_bound_of_every_engine_known() -> None:
    """The shipped objective's threshold (slo_config.DEFAULT_OBJECTIVES)."""
    for engine in engines_with(("ttft",)):
        bounds = next(e for e in ENGINE_BUCKETS if e.engine == engine).bounds["ttft"]
        assert 10.0 in bounds, engine
    assert engines_with(("ttft", "itl", "e2e")) == ("vllm", "sglang", "trtllm", "nim", "dynamo")


def test_le_is_written_as_the_sidecar_writes_it() -> None:
    every = {b for entry in ENGINE_BUCKETS for bounds in entry.bounds.values() for b in bounds}
    for bound in sorted(every | {1e6, 2.5e7, 0.0001}):
        assert le_label(bound) == go_float(bound), bound
    assert le_label(10.0) == "10.0" and le_label(0.5) == "0.5"


def test_neighbours() -> None:
    assert neighbours(0.45, (0.25, 0.5, 0.75)) == (0.25, 0.5)
    assert neighbours(1.0, (0.25, 0.5)) == (0.5, None)
    assert neighbours(0.1, (0.25, 0.5)) == (None, 0.25)
