"""Every engine names its model: from its metrics, else from its API; readable, raw kept.

A normalised series with an empty ``model`` is a defect: the model is the join key of the
model facts, the roofline, the pools of a disaggregated fleet and the dashboards' Model
variable, and two models on one server must never merge into one series.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.engines import BY_ENGINE, digest, poll_keys
from exporter.engines.models import FROM_METRICS, name_models, readable
from exporter.engines.snapshot import EngineSnapshot, Series
from exporter.engines.spec import OPENAI_MODELS, ModelName
from exporter.metrics import BY_NAME

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
KEYS = poll_keys()
# Fragments too small to say which engine wrote them (see test_detection.py).
UNRECOGNISED = {
    "trtllm-serve-unprefixed-aibrix2004-2026-03-excerpt.txt",
    "trtllm-serve-unprefixed-pr5785-2025-07-excerpt-b.txt",
}
#: What an engine's API would answer where its metrics name no model (a served path, as
#: llama.cpp's /v1/models gives without --alias).
API_NAME = "/models/Llama-3.2-1B-Instruct-Q4_K_M.gguf"
#: Series that name no model because the engine says so: the llm-d picker counts requests
#: that named no model as model_name="unknown", and it has no API to ask.
NO_MODEL_BY_DESIGN = {("llmd-epp", "inference_pd_decisions_total")}


def _snapshot(fixture: str) -> EngineSnapshot:
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    first = digest(text, "auto", keys=KEYS)
    spec = BY_ENGINE.get(first.engine)
    if spec is None or spec.model is None:
        return first
    return digest(text, "auto", keys=KEYS, default_model=API_NAME, model_origin=spec.model.path)


@pytest.mark.parametrize(
    "fixture", sorted(p.name for p in FIXTURES.glob("*.txt") if p.name not in UNRECOGNISED)
)
def test_no_normalised_series_is_left_without_a_model(fixture: str) -> None:
    snap = _snapshot(fixture)
    blank = [
        s.name
        for s in snap.series
        if not s.model
        and "model" in BY_NAME[s.name].labels
        and (snap.engine, s.name) not in NO_MODEL_BY_DESIGN
    ]
    assert not blank, f"{fixture} ({snap.engine}): no model on {sorted(set(blank))}"
    for model in {s.model for s in snap.series if s.model}:
        assert model in snap.models, (fixture, model)


def test_an_engine_without_a_model_label_takes_its_api_s_name() -> None:
    snap = _snapshot("llamacpp.txt")
    assert {s.model for s in snap.series} == {"Llama-3.2-1B-Instruct-Q4_K_M"}
    assert snap.models == {"Llama-3.2-1B-Instruct-Q4_K_M": (API_NAME, "/v1/models")}
    tgi = _snapshot("tgi.txt")
    assert tgi.models == {"Llama-3.2-1B-Instruct-Q4_K_M": (API_NAME, "/info")}


def test_two_models_on_one_triton_stay_apart() -> None:
    snap = _snapshot("triton.txt")
    depth = {s.model: s.value for s in snap.series if s.name == "inference_queue_depth"}
    assert set(depth) == {"resnet50", "tensorrt_llm"}
    assert snap.models == {
        "resnet50": ("resnet50", FROM_METRICS),
        "tensorrt_llm": ("tensorrt_llm", FROM_METRICS),
    }


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("my-chat", "my-chat"),
        ("/models/Qwen/Qwen3-0.6B", "Qwen3-0.6B"),
        ("/models/Qwen/Qwen3-0.6B/", "Qwen3-0.6B"),
        ("./tinyllama-1.1b-chat.Q4_K_M.gguf", "tinyllama-1.1b-chat.Q4_K_M"),
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct-Q4_K_M"),
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a09a3545",
            "Qwen/Qwen2.5-7B-Instruct",
        ),
        ("C:\\models\\phi-3-mini.gguf", "phi-3-mini"),
        ("  spaced  ", "spaced"),
        ("", ""),
        ("/", "/"),
    ],
)
def test_readable_names(raw: str, name: str) -> None:
    assert readable(raw) == name


def _gauge(model: str, value: float = 1.0) -> Series:
    return Series("inference_queue_depth", model, "gauge", value)


def test_paths_that_would_read_alike_keep_their_raw_names() -> None:
    snap = EngineSnapshot("sglang", [_gauge("/a/llama"), _gauge("/b/llama"), _gauge("/c/qwen")])
    named = name_models(snap)
    assert sorted(s.model for s in named.series) == ["/a/llama", "/b/llama", "qwen"]
    assert named.models["qwen"] == ("/c/qwen", FROM_METRICS)


def test_the_api_s_name_fills_only_the_series_without_one() -> None:
    snap = EngineSnapshot("vllm", [_gauge("served"), _gauge("")])
    named = name_models(snap, "/m/other.gguf", "/v1/models")
    assert sorted(s.model for s in named.series) == ["other", "served"]
    assert named.models == {
        "served": ("served", FROM_METRICS),
        "other": ("/m/other.gguf", "/v1/models"),
    }
    # Nothing to fill: the API's answer adds no model.
    assert name_models(EngineSnapshot("vllm", [_gauge("served")]), "x").models == {
        "served": ("served", FROM_METRICS)
    }


@pytest.mark.parametrize(
    ("where", "body", "name"),
    [
        (OPENAI_MODELS, b'{"object":"list","data":[{"id":"tiny","object":"model"}]}', "tiny"),
        (OPENAI_MODELS, b'{"data":[]}', ""),
        (OPENAI_MODELS, b'{"data":[{"id":""}]}', ""),
        (OPENAI_MODELS, b"<html>", ""),
        (OPENAI_MODELS, b'[{"id":"x"}]', ""),
        (
            ModelName("/info", (("model_id",),)),
            b'{"model_id":"bigscience/bloom"}',
            "bigscience/bloom",
        ),
        (
            ModelName("/props", (("alias",), ("model_path",))),
            b'{"model_path":"/m/a.gguf"}',
            "/m/a.gguf",
        ),
    ],
)
def test_model_endpoints_are_read_as_the_engines_answer(
    where: ModelName, body: bytes, name: str
) -> None:
    assert where.read(body) == name


def test_every_engine_without_a_model_label_can_be_asked() -> None:
    """An engine whose rules read no model label must have an API to name its model."""
    for spec in BY_ENGINE.values():
        labelled = any(
            getattr(source, "model_label", None)
            for r in spec.rules
            for alternative in r.alternatives
            for source in alternative
        )
        assert labelled or spec.model is not None, spec.name
