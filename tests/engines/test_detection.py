"""Auto-detection: every fixture against every engine, and the unprefixed names of NIM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.engines import (
    ENGINES,
    SPECS,
    detect,
    detect_names,
    digest,
    parse_exposition,
    process_match,
)
from exporter.engines import poll_keys as keys_of_every_engine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"

#: The engine each fixture comes from; None where the fragment is too small to tell.
EXPECTED: dict[str, str | None] = {
    "custom.txt": "custom",
    "dynamo-frontend-2026-01.txt": "dynamo",
    "dynamo-frontend-kv-router-handwritten.txt": "dynamo",
    "dynamo-worker-sglang-2026-01.txt": "dynamo",
    "dynamo-worker-trtllm-2026-01.txt": "dynamo",
    "dynamo-worker-vllm-2026-01.txt": "dynamo",
    "llamacpp-2025-06-pr13196-excerpt.txt": "llamacpp",
    "llamacpp.txt": "llamacpp",
    "llmd-epp-handwritten.txt": "llmd-epp",
    "llmd-epp-flow-control-handwritten.txt": "llmd-epp",
    "lmdeploy-0.16-handwritten.txt": "lmdeploy",
    "nim-llm-1.0.0-2024-10.txt": "nim",
    "ray-2.32-vllm-v0-2024-12.txt": "ray",
    "ray-2.52-vllm-v1-pr24267-excerpt.txt": "ray",
    "sglang-0.3.5-2024-11-docs.txt": "sglang",
    "sglang-0.4.0.post2-2024-12-docs.txt": "sglang",
    "sglang-0.4.3.post2-2025-03-docs.txt": "sglang",
    "sglang-0.5.1-2025-11-issue13485-excerpt.txt": "sglang",
    "sglang-dp-attention-aibrix1614-excerpt.txt": "sglang",
    "sglang-pd-decode-handwritten.txt": "sglang",
    "sglang-pd-prefill-gauges-handwritten.txt": "sglang",
    "sglang-pd-prefill-handwritten.txt": "sglang",
    "tgi.txt": "tgi",
    "triton-nv_inference-23.11-2023-12-docs.txt": "triton",
    "triton-trtllm-backend-23.11-2023-12-docs.txt": "triton",
    "triton-trtllm-backend-docs-2026-07.txt": "triton",
    "triton-trtllm-ensemble-handwritten.txt": "triton",
    "triton.txt": "triton",
    "trtllm-pytrtllm-pr5560-2025-06-excerpt.txt": "trtllm",
    # one histogram's fragment, no name of its own: could be anything unprefixed
    "trtllm-serve-unprefixed-aibrix2004-2026-03-excerpt.txt": None,
    "trtllm-serve-unprefixed-pr5785-2025-07-excerpt-a.txt": "trtllm",
    "trtllm-serve-unprefixed-pr5785-2025-07-excerpt-b.txt": None,
    "vllm-0.10.0-production-stack617-excerpt.txt": "vllm",
    "vllm-v0-0.5-2024-06.txt": "vllm",
    "vllm-nixl-decode-handwritten.txt": "vllm",
    "vllm-nixl-prefill-handwritten.txt": "vllm",
    "vllm-v1-dp-pr22227-2025-08-excerpt.txt": "vllm",
    "vllm.txt": "vllm",
}


def detected(fixture: str) -> str | None:
    return detect(parse_exposition((FIXTURES / fixture).read_text(encoding="utf-8")))


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in FIXTURES.glob("*.txt"))
    # every engine is recognised on at least one fixture
    assert set(ENGINES) <= set(EXPECTED.values())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_no_fixture_is_taken_for_another_engine(fixture: str, engine: str) -> None:
    """The matrix: engine E is recognised on fixture F exactly when F comes from E."""
    assert (detected(fixture) == engine) == (EXPECTED[fixture] == engine)


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_the_poll_recognises_what_detect_does(fixture: str) -> None:
    """The poll's fast path sees the same names as prometheus_client's families."""
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    if EXPECTED[fixture] is None:
        with pytest.raises(ValueError, match="could not recognise"):
            digest(text, "auto", keys=keys_of_every_engine())
    else:
        assert digest(text, "auto", keys=keys_of_every_engine()).engine == EXPECTED[fixture]


# --- NIM's unprefixed names ------------------------------------------------------------------


@pytest.mark.parametrize(
    "names",
    [
        # an application's own request gauges
        {"num_requests_running", "num_requests_waiting"},
        {"num_requests_running", "request_success_total", "http_requests_total"},
        # another NIM (speech, vision): GPU gauges of its own, no LLM names
        {"gpu_utilization", "gpu_memory_used_bytes", "gpu_power_usage_watts"},
        # the early trtllm-serve's unprefixed histograms are TensorRT-LLM's, not NIM's
        {"time_to_first_token_seconds", "e2e_request_latency_seconds"},
        # only a KV gauge
        {"gpu_cache_usage_perc"},
    ],
)
def test_other_unprefixed_names_are_not_nim(names: set[str]) -> None:
    assert detect_names(set(), names) != "nim"


@pytest.mark.parametrize(
    "names",
    [
        {"num_request_max"},
        {"num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc"},
        {
            "num_requests_running",
            "num_requests_waiting",
            "gpu_cache_usage_perc",
            "time_to_first_token_seconds_bucket",
            "e2e_request_latency_seconds_sum",
        },
    ],
)
def test_nim_signatures(names: set[str]) -> None:
    assert detect_names(set(), names) == "nim"


def test_a_prefixed_engine_wins_over_any_signature() -> None:
    names = {"vllm:num_requests_waiting", "num_request_max", "time_to_first_token_seconds_sum"}
    assert detect_names(set(), names) == "vllm"


def test_engines_that_serve_others_come_first() -> None:
    # a Dynamo worker serves vLLM's, SGLang's or TensorRT-LLM's names next to its own
    for inner in ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "trtllm_e2e"):
        assert detect_names(set(), {inner, "dynamo_component_requests_total"}) == "dynamo"
    # Triton with a vLLM backend
    assert detect_names(set(), {"vllm:num_requests_waiting", "nv_inference_count"}) == "triton"
    wrappers = [s.name for s in SPECS if s.wraps]
    assert wrappers == ["triton", "dynamo"]


# --- processes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "cmdline"),
    [
        ("vllm", "python3 -m vllm.entrypoints.openai.api_server --model m"),
        ("sglang", "python3 -m sglang.launch_server --model-path m --enable-metrics"),
        ("nim", "python3 -m vllm_nvext.entrypoints.openai.api_server --max-model-len 16000"),
        ("nim", "python3 -m nim_llm_sdk.entrypoints.launch"),
        ("trtllm", "trtllm-serve serve Qwen/Qwen3-8B --backend pytorch --port 8000"),
        ("dynamo", "python3 -m dynamo.frontend --http-port 8000"),
        ("dynamo", "python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B"),
        ("lmdeploy", "lmdeploy serve api_server internlm/internlm2_5-7b-chat"),
        ("ray", "ray::ServeReplica:llm:LLMServer:qwen"),
        ("triton", "/opt/tritonserver/bin/tritonserver --model-repository=/m"),
        ("llamacpp", "llama-server -m model.gguf --metrics"),
    ],
)
def test_each_engine_matches_its_processes(engine: str, cmdline: str) -> None:
    spec = next(s for s in SPECS if s.name == engine)
    assert re.search(spec.process, cmdline, re.IGNORECASE)
    assert re.search(process_match(), cmdline)


@pytest.mark.parametrize(
    "cmdline", ["python3 other.py", "sleep infinity", "raylet --node-ip-address=10.0.0.1"]
)
def test_other_processes_are_not_engines(cmdline: str) -> None:
    assert not re.search(process_match(), cmdline)
