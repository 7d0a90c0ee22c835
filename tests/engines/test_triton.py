"""Triton's ensembles: which models are steps (their configurations say it, the metrics do
not), and the request-level series counted once per client request, at its entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter.engines import digest, poll_keys
from exporter.engines.models import entry_points, metric_models
from exporter.engines.snapshot import EngineSnapshot
from exporter.engines.triton import ENTRY_ONLY, SPEC, ensemble_steps

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SCRAPE = FIXTURES / "triton-trtllm-ensemble-handwritten.txt"
CONFIGS = FIXTURES / "triton-trtllm-ensemble-configs-handwritten.json"
E2E, QUEUE = "inference_e2e_request_latency_seconds", "inference_queue_time_seconds"


def configs() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(CONFIGS.read_text(encoding="utf-8"))
    loaded.pop("_source")
    return loaded


def answer(config: Any) -> bytes:
    return json.dumps(config).encode()


def test_an_ensemble_s_configuration_names_its_steps() -> None:
    every = {name: ensemble_steps(answer(config)) for name, config in configs().items()}
    assert every == {
        "ensemble": ("preprocessing", "tensorrt_llm", "postprocessing"),
        "preprocessing": (),
        "tensorrt_llm": (),
        "postprocessing": (),
        "tensorrt_llm_bls": (),  # its calls are Python code: no configuration shows them
    }


def test_steps_once_each_in_order_and_without_a_platform() -> None:
    # an ensemble with a step run twice, and one whose platform field an older server omits
    config = {
        "name": "twice",
        "ensemble_scheduling": {
            "step": [{"model_name": "a"}, {"model_name": " b "}, {"model_name": "a"}, {"x": 1}]
        },
    }
    assert ensemble_steps(answer(config)) == ("a", "b")


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"error": "Request for unknown model"}',
        b'{"name": "e", "platform": "ensemble"}',
        b'{"name": "e", "platform": "ensemble", "ensemble_scheduling": {"step": {}}}',
    ],
)
def test_what_is_not_a_model_configuration_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"."):
        ensemble_steps(body)


def _snapshot() -> EngineSnapshot:
    return digest(SCRAPE.read_text(encoding="utf-8"), "auto", keys=poll_keys())


def _sums(snapshot: EngineSnapshot, name: str) -> tuple[float, float, set[str]]:
    series = [s for s in snapshot.series if s.name == name]
    return sum(s.sum for s in series), sum(s.count for s in series), {s.model for s in series}


def test_request_time_counts_each_client_request_once() -> None:
    """800 requests through the ensemble and 200 through the BLS model, 4 s each, 3 s of it in
    tensorrt_llm's queue: the clients wait 75 % of their time, not the 37 % that summing the
    nested steps' request time into the ensemble's says."""
    snapshot = _snapshot()
    assert snapshot.engine == "triton"
    before_time, before_count, _ = _sums(snapshot, E2E)
    assert (before_time, before_count) == pytest.approx((8016.0, 4000.0))  # the defect
    steps = frozenset(s for c in configs().values() for s in ensemble_steps(answer(c)))
    assert metric_models(snapshot) >= steps

    counted = entry_points(snapshot, steps, ENTRY_ONLY)

    time, count, models = _sums(counted, E2E)
    assert models == {"ensemble", "tensorrt_llm_bls"}
    assert (time, count) == pytest.approx((3208.0 + 802.0, 1000.0))
    queue, queued, waiting = _sums(counted, QUEUE)
    assert waiting == metric_models(snapshot)  # every model's queue still counts
    assert queue == pytest.approx(3000.17)
    assert queued == pytest.approx(4000.0)  # each model's own requests: a per-model mean
    assert queue / time == pytest.approx(0.748, abs=0.001)
    assert queue / before_time == pytest.approx(0.374, abs=0.001)
    # nothing but the request-level names changed
    kept = {s for s in snapshot.series if s.name not in ENTRY_ONLY}
    assert kept == {s for s in counted.series if s.name not in ENTRY_ONLY}


def test_without_steps_nothing_changes() -> None:
    snapshot = _snapshot()
    assert entry_points(snapshot, frozenset(), ENTRY_ONLY) is snapshot
    assert entry_points(snapshot, frozenset({"not-served"}), ENTRY_ONLY) is snapshot


def test_the_mapping_says_how_ensembles_are_counted() -> None:
    assert SPEC.composition is not None
    doc = SPEC.composition.doc
    for words in ("entry points", "upper bound", "BLS", "inference_engine_model_config_up"):
        assert words in doc
