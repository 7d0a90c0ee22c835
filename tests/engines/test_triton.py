"""Triton's ensembles: which models are steps (their configurations say it, the metrics do
not), and the request-level series counted once per client request, at its entry point."""

from __future__ import annotations

import json
import math
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
TTFT = "inference_time_to_first_token_seconds"


def first_responses(*models: tuple[str, int, int]) -> str:
    """Hand-written: ``nv_inference_first_response_histogram_ms`` for the ensemble scrape's
    models, as Triton renders it with ``--metrics-config histogram_latencies=true`` (model,
    requests, each answered first after that many ms). A decoupled ensemble and its decoupled
    step each report the family (Triton's own qa/L0_metrics ensemble test checks both)."""
    lines = [
        "# HELP nv_inference_first_response_histogram_ms Duration from request to first "
        "response in milliseconds",
        "# TYPE nv_inference_first_response_histogram_ms histogram",
    ]
    for model, count, ms in models:
        labels = f'model="{model}",version="1"'
        for le in ("100", "250", "500", "+Inf"):
            inside = count if le == "+Inf" or ms <= float(le) else 0
            lines.append(
                f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="{le}"}} {inside}'
            )
        lines.append(f"nv_inference_first_response_histogram_ms_count{{{labels}}} {count}")
        lines.append(f"nv_inference_first_response_histogram_ms_sum{{{labels}}} {count * ms}")
    return "\n".join(lines) + "\n"


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


def _steps() -> frozenset[str]:
    return frozenset(s for c in configs().values() for s in ensemble_steps(answer(c)))


def test_time_to_first_token_counts_each_client_request_once() -> None:
    """The 800 ensemble requests first answered after 250 ms, tensorrt_llm's own 1,000 (the
    ensemble's 800 nested in them) after 200 ms: the clients' first token is the ensemble's
    250 ms, not the 222 ms of both summed, and 800 requests, not 1,800."""
    text = SCRAPE.read_text(encoding="utf-8") + first_responses(
        ("ensemble", 800, 250), ("tensorrt_llm", 1000, 200)
    )
    snapshot = digest(text, "auto", keys=poll_keys())
    time, count, models = _sums(snapshot, TTFT)
    assert models == {"ensemble", "tensorrt_llm"}  # the defect: both, 1,800 requests
    assert (time, count) == pytest.approx((400.0, 1800.0))

    time, count, models = _sums(entry_points(snapshot, _steps(), ENTRY_ONLY), TTFT)

    assert models == {"ensemble"}
    assert (time, count) == pytest.approx((200.0, 800.0))
    buckets = next(s.buckets for s in snapshot.series if s.name == TTFT and s.model == "ensemble")
    assert buckets == ((0.1, 0.0), (0.25, 800.0), (0.5, 800.0), (math.inf, 800.0))


def test_a_step_s_first_responses_count_where_no_entry_point_has_them() -> None:
    """An ensemble that is not decoupled reports no first response; its decoupled step's are
    then the only ones there are, so they stay (dropping them would leave no TTFT at all)."""
    text = SCRAPE.read_text(encoding="utf-8") + first_responses(("tensorrt_llm", 1000, 200))
    snapshot = digest(text, "auto", keys=poll_keys())

    counted = entry_points(snapshot, _steps(), ENTRY_ONLY)

    time, count, models = _sums(counted, TTFT)
    assert models == {"tensorrt_llm"}
    assert (time, count) == pytest.approx((200.0, 1000.0))
    # the end-to-end latency still counts the entry points alone
    assert _sums(counted, E2E)[2] == {"ensemble", "tensorrt_llm_bls"}


def test_without_steps_nothing_changes() -> None:
    snapshot = _snapshot()
    assert entry_points(snapshot, frozenset(), ENTRY_ONLY) is snapshot
    assert entry_points(snapshot, frozenset({"not-served"}), ENTRY_ONLY) is snapshot


def test_the_mapping_says_how_ensembles_are_counted() -> None:
    assert SPEC.composition is not None
    doc = SPEC.composition.doc
    for words in ("entry points", "upper bound", "BLS", "inference_engine_model_config_up"):
        assert words in doc
