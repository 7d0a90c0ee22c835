"""Every engine fixture normalises to the numbers written in it (see the fixtures' README)."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest

from exporter.engines import (
    ENGINES,
    NORMALISED,
    detect,
    dynamo,
    llamacpp,
    lmdeploy,
    nim,
    normalise,
    parse_exposition,
    ray,
    sglang,
    tgi,
    triton,
    trtllm,
    vllm,
)
from exporter.engines.snapshot import EngineSnapshot, Series
from exporter.metrics import BY_NAME

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
INF = math.inf

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def snapshot(fixture: str, *, max_series: int = 1000) -> EngineSnapshot:
    families = parse_exposition((FIXTURES / fixture).read_text(encoding="utf-8"))
    engine = detect(families)
    assert engine is not None
    return normalise(families, engine, max_series=max_series)


def text_snapshot(text: str, engine: str, *, max_series: int = 1000) -> EngineSnapshot:
    return normalise(parse_exposition(text), engine, max_series=max_series)


def one(snap: EngineSnapshot, name: str, model: str = "") -> Series:
    found = [s for s in snap.series if s.name == name and s.model == model]
    assert len(found) == 1, f"{name}{{model={model!r}}}: {found}"
    return found[0]


def names(snap: EngineSnapshot) -> set[str]:
    return {s.name for s in snap.series}


# --- detection -----------------------------------------------------------------------------------


def test_detect_gives_none_for_unrelated_metrics() -> None:
    families = parse_exposition("# TYPE node_load1 gauge\nnode_load1 0.5\nup 1\n")
    assert detect(families) is None


def test_detect_prefers_triton_when_a_backend_exports_its_own_families() -> None:
    text = 'nv_inference_count{model="m",version="1"} 1\nvllm:num_requests_waiting{model="m"} 1\n'
    assert detect(parse_exposition(text)) == "triton"


def test_engine_types() -> None:
    assert ENGINES == (
        "vllm",
        "sglang",
        "tgi",
        "triton",
        "llamacpp",
        "nim",
        "trtllm",
        "dynamo",
        "lmdeploy",
        "ray",
        "llmd-epp",
        "custom",
    )


def test_unknown_engine_type_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown engine type 'auto'"):
        normalise([], "auto")


@pytest.mark.parametrize(
    "module", [vllm, sglang, tgi, triton, llamacpp, nim, trtllm, dynamo, lmdeploy, ray]
)
def test_tables_only_fill_normalised_names_once(module: ModuleType) -> None:
    targets = [r.target for r in module.SPEC.rules]
    assert len(targets) == len(set(targets))
    assert set(targets) <= set(NORMALISED)


def test_normalised_names_are_the_catalogue_engine_metrics_with_a_model_and_the_tokenizer() -> None:
    assert "inference_queue_depth" in NORMALISED
    assert "inference_tokenizer_latency_seconds" in NORMALISED
    assert "inference_engine_up" not in NORMALISED
    assert "inference_tokenizer_probe_rtt_seconds" not in NORMALISED
    for name in NORMALISED:
        assert BY_NAME[name].type in ("gauge", "counter", "histogram")


# --- vLLM ----------------------------------------------------------------------------------------

VLLM_ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
VLLM_ITL_BOUNDS_CURRENT = (*VLLM_ITL_BOUNDS, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, INF)
VLLM_ITL_HEAD = (0.0, 300000.0, 380000.0, 383000.0, 383000.0, 383000.0, 383000.0)


def test_vllm_gauges_and_counters() -> None:
    snap = snapshot("vllm.txt")
    assert snap.engine == "vllm"
    assert one(snap, "inference_queue_depth", VLLM_MODEL).value == 7.0
    assert one(snap, "inference_requests_running", VLLM_MODEL).value == 12.0
    assert one(snap, "inference_kv_cache_usage_ratio", VLLM_MODEL).value == 0.63
    prompt = one(snap, "inference_prompt_tokens_total", VLLM_MODEL)
    assert (prompt.kind, prompt.value) == ("counter", 1249280.0)  # not the _created stamp
    assert one(snap, "inference_generation_tokens_total", VLLM_MODEL).value == 384512.0
    assert snap.dropped == {}


def test_vllm_current_names_give_every_normalised_metric_vllm_has() -> None:
    assert names(snapshot("vllm.txt")) == {
        "inference_queue_depth",
        "inference_requests_running",
        "inference_kv_cache_usage_ratio",
        "inference_kv_cache_capacity_tokens",
        "inference_prompt_tokens_total",
        "inference_generation_tokens_total",
        "inference_time_to_first_token_seconds",
        "inference_inter_token_latency_seconds",
        "inference_e2e_request_latency_seconds",
        "inference_queue_time_seconds",
        "inference_prefill_time_seconds",
        "inference_decode_time_seconds",
    }
    assert {s.model for s in snapshot("vllm.txt").series} == {VLLM_MODEL}
    # cache_config_info carries no model_name: the server's only model is meant
    capacity = one(snapshot("vllm.txt"), "inference_kv_cache_capacity_tokens", VLLM_MODEL)
    assert capacity.value == 29127 * 16


def test_vllm_inter_token_latency_keeps_the_engines_buckets() -> None:
    itl = one(snapshot("vllm.txt"), "inference_inter_token_latency_seconds", VLLM_MODEL)
    assert itl.kind == "histogram"
    assert tuple(b for b, _ in itl.buckets) == VLLM_ITL_BOUNDS_CURRENT
    assert tuple(c for _, c in itl.buckets) == VLLM_ITL_HEAD + (383512.0,) * 13
    assert (itl.sum, itl.count) == (7503.0, 383512.0)


@pytest.mark.parametrize(
    ("name", "total", "count"),
    [
        ("inference_time_to_first_token_seconds", 175.0, 1000.0),
        ("inference_e2e_request_latency_seconds", 5000.0, 1000.0),
        ("inference_queue_time_seconds", 131.25, 1000.0),
        ("inference_prefill_time_seconds", 200.0, 1000.0),
        ("inference_decode_time_seconds", 7500.0, 1000.0),
    ],
)
def test_vllm_latency_histograms(name: str, total: float, count: float) -> None:
    h = one(snapshot("vllm.txt"), name, VLLM_MODEL)
    assert (h.sum, h.count, h.buckets[-1]) == (total, count, (INF, count))


def test_vllm_ttft_buckets() -> None:
    ttft = one(snapshot("vllm.txt"), "inference_time_to_first_token_seconds", VLLM_MODEL)
    assert dict(ttft.buckets)[0.04] == 200.0
    assert dict(ttft.buckets)[0.08] == 600.0
    assert dict(ttft.buckets)[0.25] == 850.0
    assert dict(ttft.buckets)[2560.0] == 1000.0
    assert len(ttft.buckets) == 23


def test_vllm_exporting_both_names_counts_the_current_one_only() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 9\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 9\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 9\n'
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        'vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:inter_token_latency_seconds_sum{model_name="m"} 1\n'
        'vllm:inter_token_latency_seconds_count{model_name="m"} 4\n'
    )
    snap = text_snapshot(text, "vllm")
    assert one(snap, "inference_kv_cache_usage_ratio", "m").value == 0.5
    assert one(snap, "inference_inter_token_latency_seconds", "m").count == 4.0


def test_vllm_data_parallel_engines_are_summed_and_kv_is_the_fullest() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 4.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75',
            "# TYPE vllm:prompt_tokens_total counter",
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0',
            'vllm:prompt_tokens_total{engine="1",model_name="m"} 32.0',
            "# TYPE vllm:e2e_request_latency_seconds histogram",
            'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 1.0',
            'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0',
            'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.5',
            'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0',
            'vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m"} 3.0',
            'vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0',
            'vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 1.5',
            'vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 3.0',
            "",
        ]
    )
    snap = text_snapshot(text, "vllm")
    assert one(snap, "inference_queue_depth", "m").value == 7.0
    assert one(snap, "inference_kv_cache_usage_ratio", "m").value == 0.75
    assert one(snap, "inference_prompt_tokens_total", "m").value == 42.0
    e2e = one(snap, "inference_e2e_request_latency_seconds", "m")
    assert (e2e.buckets, e2e.sum, e2e.count) == (((1.0, 4.0), (INF, 5.0)), 4.0, 5.0)


def test_histograms_with_different_buckets_merge_on_the_shared_bounds() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:request_queue_time_seconds histogram",
            'vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 1',
            'vllm:request_queue_time_seconds_bucket{engine="0",le="1.0",model_name="m"} 2',
            'vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2',
            'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1',
            'vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 2',
            'vllm:request_queue_time_seconds_bucket{engine="1",le="1.0",model_name="m"} 5',
            'vllm:request_queue_time_seconds_bucket{engine="1",le="2.0",model_name="m"} 6',
            'vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf",model_name="m"} 6',
            'vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 4',
            'vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 6',
            "",
        ]
    )
    q = one(text_snapshot(text, "vllm"), "inference_queue_time_seconds", "m")
    assert q.buckets == ((1.0, 7.0), (INF, 8.0))
    assert (q.sum, q.count) == (5.0, 8.0)


def test_model_label_value_is_kept_as_the_engine_gives_it() -> None:
    text = 'vllm:num_requests_waiting{model_name="org/Model v2 (fp8)",engine="0"} 1\n'
    snap = text_snapshot(text, "vllm")
    assert one(snap, "inference_queue_depth", "org/Model v2 (fp8)").value == 1.0


def test_missing_model_label_gives_the_empty_model() -> None:
    snap = text_snapshot("vllm:num_requests_waiting 2\n", "vllm")
    assert one(snap, "inference_queue_depth", "").value == 2.0


# --- SGLang --------------------------------------------------------------------------------------


def test_sglang_older_releases_read_time_per_output_token() -> None:
    text = (
        "# TYPE sglang:time_per_output_token_seconds histogram\n"
        'sglang:time_per_output_token_seconds_sum{model_name="m"} 3.0\n'
        'sglang:time_per_output_token_seconds_bucket{le="0.05",model_name="m"} 40.0\n'
        'sglang:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 50.0\n'
        'sglang:time_per_output_token_seconds_count{model_name="m"} 50.0\n'
    )
    itl = one(text_snapshot(text, "sglang"), "inference_inter_token_latency_seconds", "m")
    assert (itl.buckets, itl.sum, itl.count) == (((0.05, 40.0), (INF, 50.0)), 3.0, 50.0)


# --- TGI -----------------------------------------------------------------------------------------


def tgi_duration_bounds() -> tuple[float, ...]:
    """router/src/server.rs: 35 buckets, 0.0001 multiplied by 1.5 once per bucket."""
    bounds, value = [], 0.0001
    for _ in range(35):
        value *= 1.5
        bounds.append(value)
    return (*bounds, INF)


def test_tgi_has_no_model_label() -> None:
    snap = snapshot("tgi.txt")
    assert snap.engine == "tgi"
    assert {s.model for s in snap.series} == {""}
    assert one(snap, "inference_queue_depth").value == 9.0
    assert one(snap, "inference_requests_running").value == 24.0
    assert one(snap, "inference_prompt_tokens_total").value == 3114000.0
    assert one(snap, "inference_generation_tokens_total").value == 1327104.0
    assert "inference_kv_cache_usage_ratio" not in names(snap)
    assert "inference_time_to_first_token_seconds" not in names(snap)


def test_tgi_mean_time_per_token_is_the_inter_token_latency() -> None:
    itl = one(snapshot("tgi.txt"), "inference_inter_token_latency_seconds")
    assert tuple(b for b, _ in itl.buckets) == tgi_duration_bounds()
    assert (
        tuple(c for _, c in itl.buckets)
        == (0.0,) * 12
        + (
            1200.0,
            4300.0,
            5050.0,
            5150.0,
        )
        + (5184.0,) * 20
    )
    assert (itl.sum, itl.count) == (129.6, 5184.0)


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("inference_e2e_request_latency_seconds", 18403.2),
        ("inference_queue_time_seconds", 1451.52),
        ("inference_tokenizer_latency_seconds", 4.6656),  # validation duration, a proxy
    ],
)
def test_tgi_latency_histograms(name: str, total: float) -> None:
    h = one(snapshot("tgi.txt"), name)
    assert (h.sum, h.count) == (total, 5184.0)
    assert tuple(b for b, _ in h.buckets) == tgi_duration_bounds()


# --- Triton --------------------------------------------------------------------------------------


def test_triton_models_are_separate_and_versions_summed() -> None:
    snap = snapshot("triton.txt")
    assert snap.engine == "triton"
    assert one(snap, "inference_queue_depth", "resnet50").value == 5.0  # v1 3 + v2 2
    # Triton's pending count 0 + TensorRT-LLM's own queue 4
    assert one(snap, "inference_queue_depth", "tensorrt_llm").value == 4.0
    assert one(snap, "inference_requests_running", "tensorrt_llm").value == 16.0
    assert one(snap, "inference_kv_cache_usage_ratio", "tensorrt_llm").value == 0.4875
    assert [s.model for s in snap.series if s.name == "inference_requests_running"] == [
        "tensorrt_llm"
    ]


def test_triton_microsecond_counters_become_inf_only_histograms_in_seconds() -> None:
    snap = snapshot("triton.txt")
    e2e = one(snap, "inference_e2e_request_latency_seconds", "resnet50")
    assert (e2e.kind, e2e.buckets, e2e.sum, e2e.count) == (
        "histogram",
        ((INF, 2000.0),),
        14.4,  # (9600000 + 4800000) us
        2000.0,  # nv_inference_request_success of both versions
    )
    queue = one(snap, "inference_queue_time_seconds", "resnet50")
    assert (queue.buckets, queue.sum, queue.count) == (((INF, 2000.0),), 1.6, 2000.0)
    llm = one(snap, "inference_e2e_request_latency_seconds", "tensorrt_llm")
    assert (llm.sum, llm.count) == (1250.0, 500.0)
    assert one(snap, "inference_queue_time_seconds", "tensorrt_llm").sum == 5.0


def test_triton_first_response_histogram_is_ttft_in_seconds() -> None:
    ttft = one(snapshot("triton.txt"), "inference_time_to_first_token_seconds", "tensorrt_llm")
    assert ttft.buckets == ((0.1, 120.0), (0.5, 430.0), (2.0, 495.0), (5.0, 500.0), (INF, 500.0))
    assert (ttft.sum, ttft.count) == (120.5, 500.0)


def test_triton_compute_time_is_not_called_prefill() -> None:
    assert "inference_prefill_time_seconds" not in names(snapshot("triton.txt"))


def test_triton_summary_latencies_when_counters_are_off() -> None:
    text = (
        "# TYPE nv_inference_request_summary_us summary\n"
        'nv_inference_request_summary_us_count{model="m",version="1"} 161\n'
        'nv_inference_request_summary_us_sum{model="m",version="1"} 11110\n'
        'nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 55\n'
    )
    e2e = one(text_snapshot(text, "triton"), "inference_e2e_request_latency_seconds", "m")
    assert (e2e.buckets, e2e.sum, e2e.count) == (((INF, 161.0),), 0.01111, 161.0)


# --- llama.cpp -----------------------------------------------------------------------------------


def test_llamacpp() -> None:
    snap = snapshot("llamacpp.txt")
    assert snap.engine == "llamacpp"
    assert [(s.name, s.model, s.value) for s in snap.series] == [
        ("inference_queue_depth", "", 2.0),
        ("inference_requests_running", "", 4.0),
        ("inference_kv_cache_usage_ratio", "", 0.71),
        ("inference_prompt_tokens_total", "", 182736.0),
        ("inference_generation_tokens_total", "", 429118.0),
    ]


def test_llamacpp_builds_without_kv_gauges_have_no_kv_series() -> None:
    text = (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 1.23457e+06\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        "llamacpp:requests_deferred 0\n"
    )
    snap = text_snapshot(text, "llamacpp")
    assert names(snap) == {"inference_queue_depth", "inference_prompt_tokens_total"}
    assert one(snap, "inference_prompt_tokens_total").value == 1234570.0


# --- limits --------------------------------------------------------------------------------------


def test_max_series_keeps_the_first_models_and_counts_the_rest() -> None:
    lines = ["# TYPE nv_inference_pending_request_count gauge"]
    lines += [
        f'nv_inference_pending_request_count{{model="m{i}",version="1"}} {i}' for i in range(5)
    ]
    lines += ["# TYPE nv_inference_request_success counter"]
    lines += [f'nv_inference_request_success{{model="m{i}",version="1"}} 1' for i in range(5)]
    lines += ["# TYPE nv_inference_request_duration_us counter"]
    lines += [f'nv_inference_request_duration_us{{model="m{i}",version="1"}} 7' for i in range(5)]
    snap = text_snapshot("\n".join(lines) + "\n", "triton", max_series=2)
    assert [(s.name, s.model) for s in snap.series] == [
        ("inference_queue_depth", "m0"),
        ("inference_queue_depth", "m1"),
        ("inference_e2e_request_latency_seconds", "m0"),
        ("inference_e2e_request_latency_seconds", "m1"),
    ]
    assert snap.dropped == {
        "inference_queue_depth": 3,
        "inference_e2e_request_latency_seconds": 3,
    }


def test_series_at_the_limit_are_not_dropped() -> None:
    snap = snapshot("triton.txt", max_series=2)
    assert snap.dropped == {}
    assert len([s for s in snap.series if s.name == "inference_queue_depth"]) == 2


def test_detect_recognises_an_engine_whose_values_are_all_dropped() -> None:
    families = parse_exposition(
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} NaN\n'
        "# TYPE vllm:lora_requests_info gauge\n"
    )
    assert detect(families) == "vllm"
    assert normalise(families, "vllm").series == []
