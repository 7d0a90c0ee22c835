"""Every captured scrape in ``tests/fixtures/engines`` normalises to exactly its own numbers.

Each fixture's first line names where it was captured (see the fixtures' README). The
expected values below are the scrape's own lines, read by hand: a gauge's value, a counter's
total, a histogram's ``_sum``, ``_count`` and cumulative buckets, after the documented
aggregation. The fast path (``digest``) and prometheus_client's parser give the same snapshot
for each of them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from exporter.engines import digest, normalise, parse_exposition, poll_keys
from exporter.engines.snapshot import EngineSnapshot, Series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
INF = math.inf
KEYS = poll_keys()

QWEN = "Qwen/Qwen3-0.6B"
NIM_MODEL = "meta/llama-3.1-8b-instruct"
OPT = "facebook/opt-125m"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
RAY_MODEL = "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8"
CAPTURED = sorted(
    p.name
    for p in FIXTURES.glob("*.txt")
    if not p.read_text(encoding="utf-8").startswith("# source: HAND-WRITTEN")
)


def text(fixture: str) -> str:
    return (FIXTURES / fixture).read_text(encoding="utf-8")


def snap(fixture: str, engine: str = "auto") -> EngineSnapshot:
    return digest(text(fixture), engine, keys=KEYS)


def one(snapshot: EngineSnapshot, name: str, model: str = "") -> Series:
    found = [s for s in snapshot.series if s.name == name and s.model == model]
    assert len(found) == 1, f"{name}{{model={model!r}}}: {found}"
    return found[0]


def values(snapshot: EngineSnapshot) -> dict[tuple[str, ...], float]:
    """Gauges and counters as {(name, model, *own label values): value}."""
    return {
        (s.name, s.model, *(v for _, v in s.labels)): s.value
        for s in snapshot.series
        if s.kind != "histogram"
    }


def hist(snapshot: EngineSnapshot, name: str, model: str) -> tuple[float, float]:
    h = one(snapshot, name, model)
    assert h.buckets[-1] == (INF, h.count)
    return h.sum, h.count


def test_every_captured_fixture_names_its_source() -> None:
    assert len(CAPTURED) >= 20
    for fixture in CAPTURED:
        first = text(fixture).splitlines()[0]
        assert first.startswith("# source: "), fixture
        assert "version" in first and "cut" in first, fixture


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.txt")))
def test_fast_path_and_prometheus_client_give_the_same_snapshot(fixture: str) -> None:
    families = parse_exposition(text(fixture))
    fast = snap(fixture) if fixture not in UNRECOGNISED else None
    if fast is None:
        return
    slow = normalise(families, fast.engine)
    assert (fast.series, fast.dropped, fast.layer, fast.version) == (
        slow.series,
        slow.dropped,
        slow.layer,
        slow.version,
    )


# Fragments too small to say which engine wrote them (see test_detection.py).
UNRECOGNISED = {
    "trtllm-serve-unprefixed-aibrix2004-2026-03-excerpt.txt",
    "trtllm-serve-unprefixed-pr5785-2025-07-excerpt-b.txt",
}


# --- NVIDIA NIM ----------------------------------------------------------------------------------


def test_nim_1_0() -> None:
    s = snap("nim-llm-1.0.0-2024-10.txt")
    assert (s.engine, s.layer, s.version) == ("nim", "engine", "")
    assert values(s) == {
        ("inference_queue_depth", NIM_MODEL): 0.0,
        ("inference_requests_running", NIM_MODEL): 1.0,
        ("inference_kv_cache_usage_ratio", NIM_MODEL): 0.0002848191398461977,
        ("inference_prompt_tokens_total", NIM_MODEL): 109.0,
        ("inference_generation_tokens_total", NIM_MODEL): 174.0,
    }
    ttft = one(s, "inference_time_to_first_token_seconds", NIM_MODEL)
    assert ttft.buckets == (
        (0.001, 0.0),
        (0.005, 0.0),
        (0.01, 0.0),
        (0.02, 2.0),
        (0.04, 4.0),
        (0.06, 4.0),
        (0.08, 4.0),
        (0.1, 4.0),
        (0.25, 4.0),
        (0.5, 4.0),
        (0.75, 5.0),
        (1.0, 5.0),
        (2.5, 5.0),
        (5.0, 5.0),
        (7.5, 5.0),
        (10.0, 5.0),
        (INF, 5.0),
    )
    assert (ttft.sum, ttft.count) == (0.6119842529296875, 5.0)
    # time_per_output_token_seconds: one observation per generated token (169 of 174)
    assert hist(s, "inference_inter_token_latency_seconds", NIM_MODEL) == (
        1.856855869293213,
        169.0,
    )
    assert hist(s, "inference_e2e_request_latency_seconds", NIM_MODEL) == (
        2.4688401222229004,
        5.0,
    )
    assert {x.name for x in s.series} == {
        "inference_queue_depth",
        "inference_requests_running",
        "inference_kv_cache_usage_ratio",
        "inference_prompt_tokens_total",
        "inference_generation_tokens_total",
        "inference_time_to_first_token_seconds",
        "inference_inter_token_latency_seconds",
        "inference_e2e_request_latency_seconds",
    }


# --- vLLM ----------------------------------------------------------------------------------------


def test_vllm_v0_reads_the_deprecated_names() -> None:
    s = snap("vllm-v0-0.5-2024-06.txt")
    assert s.engine == "vllm"
    assert values(s) == {
        ("inference_queue_depth", OPT): 0.0,
        ("inference_requests_running", OPT): 0.0,
        ("inference_kv_cache_usage_ratio", OPT): 0.0,  # vllm:gpu_cache_usage_perc
        # cache_config_info (no model label): num_gpu_blocks 7281 x block_size 16
        ("inference_kv_cache_capacity_tokens", OPT): 7281 * 16,
        ("inference_prompt_tokens_total", OPT): 5.0,
        ("inference_generation_tokens_total", OPT): 7.0,
    }
    itl = one(s, "inference_inter_token_latency_seconds", OPT)  # time_per_output_token
    assert itl.buckets == (
        (0.01, 0.0),
        (0.025, 0.0),
        (0.05, 6.0),
        (0.075, 6.0),
        (0.1, 6.0),
        (0.15, 6.0),
        (0.2, 6.0),
        (0.3, 6.0),
        (0.4, 6.0),
        (0.5, 6.0),
        (0.75, 6.0),
        (1.0, 6.0),
        (2.5, 6.0),
        (INF, 6.0),
    )
    assert (itl.sum, itl.count) == (0.19016313552856445, 6.0)
    assert hist(s, "inference_time_to_first_token_seconds", OPT) == (0.31326723098754883, 1.0)
    assert hist(s, "inference_e2e_request_latency_seconds", OPT) == (0.5034303665161133, 1.0)
    assert "inference_queue_time_seconds" not in {x.name for x in s.series}


def test_vllm_v1_names_through_a_dynamo_worker_read_as_vllm() -> None:
    """The worker passes vLLM's lines through unchanged: read as vllm, they give vLLM V1's
    current names (and the dynamo_component_* lines are not read)."""
    s = snap("dynamo-worker-vllm-2026-01.txt", "vllm")
    assert values(s) == {
        ("inference_queue_depth", QWEN): 0.0,
        ("inference_requests_running", QWEN): 0.0,
        ("inference_kv_cache_usage_ratio", QWEN): 0.0,
        ("inference_kv_cache_capacity_tokens", QWEN): 5943 * 16,
        ("inference_prompt_tokens_total", QWEN): 66.0,
        ("inference_generation_tokens_total", QWEN): 600.0,
    }
    assert hist(s, "inference_time_to_first_token_seconds", QWEN) == (0.4143967628479004, 2.0)
    assert hist(s, "inference_inter_token_latency_seconds", QWEN) == (3.1598554495722055, 598.0)
    assert hist(s, "inference_e2e_request_latency_seconds", QWEN) == (3.5736520290374756, 2.0)
    assert hist(s, "inference_queue_time_seconds", QWEN) == (1.883227378129959e-05, 2.0)
    assert hist(s, "inference_prefill_time_seconds", QWEN) == (0.41180944442749023, 2.0)
    assert hist(s, "inference_decode_time_seconds", QWEN) == (3.1598554495722055, 2.0)
    itl = one(s, "inference_inter_token_latency_seconds", QWEN)
    assert [b for b, _ in itl.buckets] == [
        0.01,
        0.025,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        INF,
    ]


def test_vllm_0_10_with_deprecated_names_next_to_the_new() -> None:
    s = snap("vllm-0.10.0-production-stack617-excerpt.txt")
    assert s.engine == "vllm"
    assert values(s) == {
        ("inference_kv_cache_usage_ratio", "zai-org/GLM-4.5"): 9.75010481363281e-06
    }


def test_vllm_data_parallel_excerpt() -> None:
    """The excerpt holds only the buckets of engine 1's decode time (its _sum and _count were
    cut): recognised as vLLM, and a histogram without _sum is never made up."""
    s = snap("vllm-v1-dp-pr22227-2025-08-excerpt.txt")
    assert (s.engine, s.series) == ("vllm", [])


# --- SGLang --------------------------------------------------------------------------------------


def test_sglang_0_3_5_model_label_name_and_old_queue_names() -> None:
    gemma = "google/gemma-2-9b-it"
    s = snap("sglang-0.3.5-2024-11-docs.txt")
    assert s.engine == "sglang"
    assert values(s) == {
        ("inference_queue_depth", gemma): 0.0,  # sglang:num_requests_waiting
        ("inference_requests_running", gemma): 0.0,  # sglang:num_requests_running
        ("inference_kv_cache_usage_ratio", gemma): 0.01,
        ("inference_kv_cache_capacity_tokens", gemma): 161721.0,
        ("inference_prompt_tokens_total", gemma): 506780.0,
        ("inference_generation_tokens_total", gemma): 424549.0,
    }
    assert hist(s, "inference_time_to_first_token_seconds", gemma) == (656.0780844688416, 2124.0)
    assert hist(s, "inference_inter_token_latency_seconds", gemma) == (29846.5393948555, 422425.0)
    assert hist(s, "inference_e2e_request_latency_seconds", gemma) == (70517.99934530258, 2104.0)
    # sglang:waiting_request_latency_seconds
    assert hist(s, "inference_queue_time_seconds", gemma) == (24885.007263183594, 2104.0)


def test_sglang_0_4_0_func_latency_name_label_is_not_a_model() -> None:
    s = snap("sglang-0.4.0.post2-2024-12-docs.txt")
    assert {x.model for x in s.series} == {LLAMA}  # not "generate_request"
    assert values(s) == {
        ("inference_queue_depth", LLAMA): 0.0,
        ("inference_queue_depth_by_stage", LLAMA, "prefill"): 0.0,  # num_queue_reqs
        ("inference_requests_running", LLAMA): 0.0,
        ("inference_kv_cache_usage_ratio", LLAMA): 0.0,
        ("inference_prompt_tokens_total", LLAMA): 7.0,
        ("inference_generation_tokens_total", LLAMA): 8.0,
    }
    assert hist(s, "inference_time_to_first_token_seconds", LLAMA) == (0.30457592010498047, 1.0)
    assert hist(s, "inference_inter_token_latency_seconds", LLAMA) == (0.0381757915019989, 1.0)


def test_sglang_0_4_3() -> None:
    s = snap("sglang-0.4.3.post2-2025-03-docs.txt")
    assert values(s) == {
        ("inference_queue_depth", LLAMA): 2826.0,
        ("inference_queue_depth_by_stage", LLAMA, "prefill"): 2826.0,
        ("inference_requests_running", LLAMA): 162.0,
        ("inference_kv_cache_usage_ratio", LLAMA): 0.28,
        ("inference_prompt_tokens_total", LLAMA): 8128902.0,
        ("inference_generation_tokens_total", LLAMA): 7557572.0,
    }
    ttft = one(s, "inference_time_to_first_token_seconds", LLAMA)
    assert [c for _, c in ttft.buckets] == [
        0.0,
        0.0,
        0.0,
        0.0,
        1.0,
        3.0,
        6.0,
        6.0,
        6.0,
        6.0,
        6.0,
        27.0,
        140.0,
        314.0,
        941.0,
        1330.0,
        1970.0,
        2326.0,
        2417.0,
        2513.0,
        11008.0,
    ]
    assert (ttft.sum, ttft.count) == (2351897.9474117756, 11008.0)
    assert hist(s, "inference_e2e_request_latency_seconds", LLAMA) == (3116093.850019932, 11228.0)


def test_sglang_0_5_through_a_dynamo_worker_read_as_sglang() -> None:
    s = snap("dynamo-worker-sglang-2026-01.txt", "sglang")
    assert values(s) == {
        ("inference_queue_depth", QWEN): 0.0,
        # a colocated server (engine_type="unified") with the disaggregation gauges at 0
        ("inference_queue_depth_by_stage", QWEN, "prefill"): 0.0,
        ("inference_queue_depth_by_stage", QWEN, "prealloc"): 0.0,
        ("inference_queue_depth_by_stage", QWEN, "transfer"): 0.0,
        ("inference_requests_running", QWEN): 0.0,
        ("inference_kv_cache_usage_ratio", QWEN): 0.0,
        ("inference_kv_cache_capacity_tokens", QWEN): 92962.0,
        ("inference_prompt_tokens_total", QWEN): 33.0,
        # realtime_tokens_total{mode="prefill_cache"}
        ("inference_prompt_tokens_cached_total", QWEN): 0.0,
        ("inference_generation_tokens_total", QWEN): 300.0,
    }
    assert s.role == "both"  # engine_type="unified"
    assert hist(s, "inference_time_to_first_token_seconds", QWEN) == (1.5573770999908447, 1.0)
    assert hist(s, "inference_inter_token_latency_seconds", QWEN) == (0.6138594150543213, 299.0)
    assert hist(s, "inference_e2e_request_latency_seconds", QWEN) == (2.171226978302002, 1.0)
    queue = one(s, "inference_queue_time_seconds", QWEN)  # sglang:queue_time_seconds
    assert (queue.sum, queue.count, len(queue.buckets)) == (0.0018392642959952354, 1.0, 37)
    assert queue.buckets[:3] == ((0.0, 0.0), (0.1, 1.0), (0.2, 1.0))
    # per_stage_req_latency_seconds has only stage="prefill_waiting" here: no prefill or
    # decode stage, and prefill_waiting is not read while queue_time_seconds exists
    assert not {"inference_prefill_time_seconds", "inference_decode_time_seconds"} & {
        x.name for x in s.series
    }


def test_sglang_0_5_1_excerpt() -> None:
    s = snap("sglang-0.5.1-2025-11-issue13485-excerpt.txt")
    assert values(s) == {
        ("inference_requests_running", "Qwen-32B"): 1.0,
        ("inference_kv_cache_usage_ratio", "Qwen-32B"): 0.0,
    }


def test_sglang_dp_attention_excerpt_is_recognised() -> None:
    s = snap("sglang-dp-attention-aibrix1614-excerpt.txt")
    assert (s.engine, s.series) == ("sglang", [])  # only retracted/paused gauges


# --- TensorRT-LLM --------------------------------------------------------------------------------


def test_trtllm_pytrtllm_prefix() -> None:
    ds = "deepseek-ai/DeepSeek-V3-0324"
    s = snap("trtllm-pytrtllm-pr5560-2025-06-excerpt.txt")
    assert s.engine == "trtllm"
    assert values(s) == {
        ("inference_queue_depth", ds): 0.0,
        ("inference_requests_running", ds): 1.0,
        ("inference_prompt_tokens_total", ds): 201121.0,
        ("inference_generation_tokens_total", ds): 81896.0,
    }


def test_trtllm_via_dynamo_read_as_trtllm() -> None:
    s = snap("dynamo-worker-trtllm-2026-01.txt", "trtllm")
    assert values(s) == {}  # TensorRT-LLM 1.1 exported no gauge or token counter yet
    ttft = one(s, "inference_time_to_first_token_seconds", QWEN)
    assert [c for _, c in ttft.buckets][:7] == [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 2.0]
    assert (ttft.sum, ttft.count) == (0.06795299984514713, 2.0)
    # time_per_output_token_seconds: one observation per request
    assert hist(s, "inference_inter_token_latency_seconds", QWEN) == (0.005558789299682629, 2.0)
    assert hist(s, "inference_e2e_request_latency_seconds", QWEN) == (1.7300310004502535, 2.0)
    assert hist(s, "inference_queue_time_seconds", QWEN) == (0.01181500032544136, 2.0)


def test_trtllm_unprefixed_excerpt_with_undefined_model() -> None:
    """Two unprefixed histograms: recognised as trtllm-serve; the excerpt has no complete
    histogram (its _sum lines were cut), so nothing is normalised."""
    s = snap("trtllm-serve-unprefixed-pr5785-2025-07-excerpt-a.txt")
    assert (s.engine, s.series) == ("trtllm", [])


def test_trtllm_unprefixed_fragments_read_as_trtllm() -> None:
    s = snap("trtllm-serve-unprefixed-pr5785-2025-07-excerpt-b.txt", "trtllm")
    assert s.series == []  # only _count of the queue time survived the cut
    s = snap("trtllm-serve-unprefixed-aibrix2004-2026-03-excerpt.txt", "trtllm")
    assert s.series == []  # buckets and _sum, no +Inf or _count: not a histogram to trust


# --- Dynamo --------------------------------------------------------------------------------------


def test_dynamo_frontend() -> None:
    s = snap("dynamo-frontend-2026-01.txt")
    assert (s.engine, s.layer) == ("dynamo", "frontend")
    # lower-cased request metrics mapped back to the configured spelling
    assert {x.model for x in s.series} == {QWEN}
    assert values(s) == {
        ("inference_queue_depth", QWEN): 0.0,
        ("inference_requests_running", QWEN): 0.0,
        # total_kv_blocks 92962 x kv_cache_block_size 1 (SGLang's pool behind it)
        ("inference_kv_cache_capacity_tokens", QWEN): 92962.0,
        ("inference_prompt_tokens_total", QWEN): 33.0,  # input_sequence_tokens_sum
        ("inference_generation_tokens_total", QWEN): 300.0,
    }
    ttft = one(s, "inference_time_to_first_token_seconds", QWEN)
    assert ttft.buckets[9:12] == ((1.0, 0.0), (2.2, 1.0), (4.7, 1.0))
    assert (ttft.sum, ttft.count) == (1.5625701570000001, 1.0)
    itl = one(s, "inference_inter_token_latency_seconds", QWEN)
    assert itl.buckets[:4] == ((0.0, 0.0), (0.0019, 21.0), (0.0035, 298.0), (0.0067, 299.0))
    assert (itl.sum, itl.count) == (0.6126917290000005, 299.0)
    assert hist(s, "inference_e2e_request_latency_seconds", QWEN) == (2.177646729, 1.0)


@pytest.mark.parametrize(
    ("fixture", "engine"),
    [
        ("dynamo-worker-vllm-2026-01.txt", "vllm"),
        ("dynamo-worker-sglang-2026-01.txt", "sglang"),
        ("dynamo-worker-trtllm-2026-01.txt", "trtllm"),
    ],
)
def test_dynamo_worker_is_its_engine_without_the_components_twice(
    fixture: str, engine: str
) -> None:
    """A worker recognised as dynamo reads the engine's families with the engine's rules:
    the same series as the engine alone, plus the KV usage of dynamo_component_kvstats_*
    only where the engine has none (TensorRT-LLM 1.1)."""
    as_dynamo, as_engine = snap(fixture), snap(fixture, engine)
    assert (as_dynamo.engine, as_dynamo.layer) == ("dynamo", "engine")
    extra = [s for s in as_dynamo.series if s not in as_engine.series]
    assert [s for s in as_engine.series if s not in as_dynamo.series] == []
    if engine == "trtllm":
        assert [(s.name, s.model, s.value) for s in extra] == [
            ("inference_kv_cache_usage_ratio", QWEN, 0.0)
        ]
    else:
        assert extra == []


def test_frontend_and_worker_describe_the_same_request() -> None:
    """The frontend and the SGLang worker captures are one request seen twice: the reason
    neither is summed with the other (docs/engines.md)."""
    front = snap("dynamo-frontend-2026-01.txt")
    worker = snap("dynamo-worker-sglang-2026-01.txt")
    for name in ("inference_generation_tokens_total", "inference_prompt_tokens_total"):
        assert one(front, name, QWEN).value == one(worker, name, QWEN).value
    assert one(front, "inference_inter_token_latency_seconds", QWEN).count == 299.0
    assert one(worker, "inference_inter_token_latency_seconds", QWEN).count == 299.0


# --- Ray Serve LLM -------------------------------------------------------------------------------


def test_ray_2_32_colon_names() -> None:
    s = snap("ray-2.32-vllm-v0-2024-12.txt")
    assert (s.engine, s.version) == ("ray", "2.32.0")
    assert values(s) == {
        ("inference_queue_depth", RAY_MODEL): 0.0,
        ("inference_requests_running", RAY_MODEL): 0.0,
        ("inference_kv_cache_usage_ratio", RAY_MODEL): 5.882698982295764e-05,
        ("inference_prompt_tokens_total", RAY_MODEL): 58.0,
        ("inference_generation_tokens_total", RAY_MODEL): 300.0,
    }
    ttft = one(s, "inference_time_to_first_token_seconds", RAY_MODEL)
    assert [c for _, c in ttft.buckets] == [0.0] * 9 + [1.0] * 8
    assert (ttft.sum, ttft.count) == (0.271012544631958, 1.0)
    assert hist(s, "inference_inter_token_latency_seconds", RAY_MODEL) == (
        16.178537607192993,
        299.0,
    )


def test_ray_2_52_underscore_names() -> None:
    s = snap("ray-2.52-vllm-v1-pr24267-excerpt.txt")
    assert (s.engine, s.version, s.series) == ("ray", "2.52.0", [])  # one _count line


# --- Triton and llama.cpp ------------------------------------------------------------------------


def test_triton_trtllm_backend_docs_2026() -> None:
    s = snap("triton-trtllm-backend-docs-2026-07.txt")
    assert s.engine == "triton"
    assert values(s) == {
        ("inference_queue_depth", "tensorrt_llm"): 1.0,
        ("inference_requests_running", "tensorrt_llm"): 0.0,
        ("inference_kv_cache_usage_ratio", "tensorrt_llm"): 0.4875,
        ("inference_kv_cache_capacity_tokens", "tensorrt_llm"): 6239 * 64,
    }


def test_triton_trtllm_backend_docs_2023() -> None:
    s = snap("triton-trtllm-backend-23.11-2023-12-docs.txt")
    assert values(s) == {
        ("inference_requests_running", "tensorrt_llm"): 0.0,
        ("inference_kv_cache_capacity_tokens", "tensorrt_llm"): 6239 * 64,
    }


def test_triton_core_docs_all_zero() -> None:
    s = snap("triton-nv_inference-23.11-2023-12-docs.txt")
    assert values(s) == {("inference_queue_depth", "tensorrt_llm"): 0.0}
    e2e = one(s, "inference_e2e_request_latency_seconds", "tensorrt_llm")
    assert (e2e.buckets, e2e.sum, e2e.count) == (((INF, 0.0),), 0.0, 0.0)


def test_llamacpp_2025_excerpt_has_no_kv_gauge() -> None:
    s = snap("llamacpp-2025-06-pr13196-excerpt.txt")
    assert [(x.name, x.model, x.value) for x in s.series] == [
        ("inference_prompt_tokens_total", "", 143.0),
        ("inference_generation_tokens_total", "", 673.0),
    ]


# --- LMDeploy (hand-written: no scrape exists) ---------------------------------------------------


def test_lmdeploy_from_its_declarations() -> None:
    model = "internlm/internlm2_5-7b-chat"
    s = snap("lmdeploy-0.16-handwritten.txt")
    assert s.engine == "lmdeploy"
    assert values(s) == {
        ("inference_queue_depth", model): 9.0,  # not num_api_requests_waiting
        ("inference_requests_running", model): 24.0,
        ("inference_kv_cache_usage_ratio", model): 0.75,
        ("inference_prompt_tokens_total", model): 1048576.0,
        ("inference_prompt_tokens_cached_total", model): 262144.0,
        ("inference_generation_tokens_total", model): 524288.0,
    }
    itl = one(s, "inference_inter_token_latency_seconds", model)  # iter_token_latency
    assert (itl.buckets, itl.sum, itl.count) == (
        ((0.01, 100000.0), (0.025, 450000.0), (0.05, 520000.0), (INF, 522288.0)),
        10240.0,
        522288.0,
    )
    assert hist(s, "inference_time_to_first_token_seconds", model) == (500.0, 2000.0)
    assert hist(s, "inference_queue_time_seconds", model) == (250.0, 2000.0)
    assert hist(s, "inference_prefill_time_seconds", model) == (256.0, 2000.0)
    assert hist(s, "inference_decode_time_seconds", model) == (10240.0, 2000.0)
    assert hist(s, "inference_e2e_request_latency_seconds", model) == (11000.0, 2000.0)
