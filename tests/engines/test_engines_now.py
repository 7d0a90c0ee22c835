"""What today's engines add, where no captured scrape shows it yet.

The texts below are written here, from the engines' sources (named in each test), with
values chosen so every sum is checked by hand: vLLM's waiting-by-reason, cached prompt tokens,
KV capacity and MFU counters, data-parallel engines and several API servers; SGLang's
tensor-parallel copies and per-stage latencies; TensorRT-LLM's iteration gauges; Ray's
replicas; Dynamo's frontend and worker polled together.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

from exporter.engines import digest, layered, normalise, parse_exposition, poll_keys
from exporter.engines.snapshot import EngineSnapshot, Series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
INF = math.inf
QWEN = "Qwen/Qwen3-0.6B"


def run(text: str, engine: str) -> EngineSnapshot:
    snapshot = normalise(parse_exposition(text), engine)
    # the poll's fast path reads the same
    assert digest(text, engine, keys=poll_keys()).series == snapshot.series
    return snapshot


def one(snap: EngineSnapshot, name: str, model: str = "", **labels: str) -> Series:
    found = [
        s for s in snap.series if s.name == name and s.model == model and dict(s.labels) == labels
    ]
    assert len(found) == 1, f"{name}{{model={model!r},{labels}}}: {snap.series}"
    return found[0]


def names(snap: EngineSnapshot) -> set[str]:
    return {s.name for s in snap.series}


# --- vLLM ----------------------------------------------------------------------------------------

# vllm/v1/metrics/loggers.py: labels engine (data-parallel index) and model_name.
VLLM_DP = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="deferred"} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 600.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 700.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 250.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 50.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="local_compute"} 600.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="local_cache_hit"} 0.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 0.0
# TYPE vllm:estimated_flops_per_gpu_total counter
vllm:estimated_flops_per_gpu_total{engine="0",model_name="m"} 3.0e+15
vllm:estimated_flops_per_gpu_total{engine="1",model_name="m"} 1.0e+15
# TYPE vllm:estimated_read_bytes_per_gpu_total counter
vllm:estimated_read_bytes_per_gpu_total{engine="0",model_name="m"} 8.0e+12
vllm:estimated_read_bytes_per_gpu_total{engine="1",model_name="m"} 4.0e+12
# TYPE vllm:estimated_write_bytes_per_gpu_total counter
vllm:estimated_write_bytes_per_gpu_total{engine="0",model_name="m"} 2.0e+11
vllm:estimated_write_bytes_per_gpu_total{engine="1",model_name="m"} 1.0e+11
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="197283",num_gpu_blocks="12330"} 1.0
vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="197283",num_gpu_blocks="12330"} 1.0
"""


def test_vllm_waiting_by_reason_per_model_over_engines() -> None:
    s = run(VLLM_DP, "vllm")
    assert one(s, "inference_queue_depth", "m").value == 7.0
    assert one(s, "inference_queue_depth_by_reason", "m", reason="capacity").value == 6.0
    assert one(s, "inference_queue_depth_by_reason", "m", reason="deferred").value == 1.0


def test_vllm_cached_prompt_tokens_from_the_split_by_source() -> None:
    s = run(VLLM_DP, "vllm")
    assert one(s, "inference_prompt_tokens_total", "m").value == 1600.0  # not by_source again
    # local_cache_hit + external_kv_transfer of both engines; local_compute is not cached
    assert one(s, "inference_prompt_tokens_cached_total", "m").value == 300.0


def test_vllm_cached_counter_wins_and_the_split_is_then_not_read() -> None:
    text = VLLM_DP + (
        "# TYPE vllm:prompt_tokens_cached_total counter\n"
        'vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 300.0\n'
        'vllm:prompt_tokens_cached_total{engine="1",model_name="m"} 0.0\n'
    )
    s = run(text, "vllm")
    assert one(s, "inference_prompt_tokens_cached_total", "m").value == 300.0  # never 600


def test_vllm_kv_capacity_prefers_kv_cache_size_tokens_and_adds_dp_engines() -> None:
    s = run(VLLM_DP, "vllm")
    # kv_cache_size_tokens (the profiled pool; blocks x size would say 197280)
    assert one(s, "inference_kv_cache_capacity_tokens", "m").value == 2 * 197283.0


def test_vllm_mfu_counters_stay_per_gpu() -> None:
    """Each DP engine's counter is already per GPU: the mean is still one GPU's share, so
    rate() / one GPU's peak is the utilisation whatever the number of engines."""
    s = run(VLLM_DP, "vllm")
    assert one(s, "inference_estimated_flops_total", "m").value == 2.0e15
    assert one(s, "inference_estimated_read_bytes_total", "m").value == 6.0e12
    assert one(s, "inference_estimated_write_bytes_total", "m").value == 1.5e11
    assert one(s, "inference_estimated_flops_total", "m").kind == "counter"


def test_vllm_cache_config_info_without_numbers_gives_no_capacity() -> None:
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert "inference_kv_cache_capacity_tokens" not in names(run(text, "vllm"))


def test_vllm_engine_wide_series_with_two_models_get_no_model() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0\n'
        'vllm:num_requests_waiting{model_name="a"} 1\n'
        'vllm:num_requests_waiting{model_name="b"} 1\n'
    )
    assert one(run(text, "vllm"), "inference_kv_cache_capacity_tokens", "").value == 160.0


def test_vllm_several_api_servers_through_prometheus_multiprocess(tmp_path: Path) -> None:
    """--api-server-count 2: two API server processes share one prometheus_client
    multiprocess directory (vLLM's gauges are mostrecent). Two real processes record with
    vLLM's names and labels; MultiProcessCollector renders them: counters and histograms
    come out summed, each gauge once, and the sidecar reads each request once."""
    script = textwrap.dedent(
        """
        import multiprocessing, os, sys
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client import generate_latest, multiprocess

        LABELS = ["model_name", "engine"]

        def api_server(prompt, waiting, ttft):
            tokens = Counter("vllm:prompt_tokens", "Prefill tokens.", LABELS)
            gauge = Gauge("vllm:num_requests_waiting", "Waiting.", LABELS,
                          multiprocess_mode="mostrecent")
            hist = Histogram("vllm:time_to_first_token_seconds", "TTFT.", LABELS,
                             buckets=[0.1, 1.0])
            tokens.labels("m", "0").inc(prompt)
            gauge.labels("m", "0").set(waiting)
            for value in ttft:
                hist.labels("m", "0").observe(value)

        if __name__ == "__main__":
            for args in ((100, 4, [0.05, 0.5]), (30, 3, [2.0])):
                p = multiprocessing.Process(target=api_server, args=args)
                p.start()
                p.join()
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            sys.stdout.write(generate_latest(registry).decode())
        """
    )
    (tmp_path / "prom").mkdir()
    body = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "prom")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "pid=" not in body
    s = run(body, "vllm")
    assert one(s, "inference_prompt_tokens_total", "m").value == 130.0
    assert one(s, "inference_queue_depth", "m").value == 3.0  # the most recent, once
    ttft = one(s, "inference_time_to_first_token_seconds", "m")
    assert (ttft.buckets, ttft.sum, ttft.count) == (
        ((0.1, 1.0), (1.0, 2.0), (INF, 3.0)),
        2.55,
        3.0,
    )


# --- SGLang --------------------------------------------------------------------------------------

# python/sglang/srt/metrics/collector.py with --enable-metrics-for-all-schedulers, DP
# attention over 2 DP ranks with 2 TP ranks each: the scheduler series of one dp_rank are the
# same numbers once per tp_rank.
SGLANG_TP = """\
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 4.0
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 4.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 3.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 3.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 20.0
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 20.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 18.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 18.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.41
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.41
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 0.57
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 0.57
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 90000.0
sglang:max_total_num_tokens{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 90000.0
sglang:max_total_num_tokens{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 90000.0
sglang:max_total_num_tokens{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 90000.0
# TYPE sglang:estimated_flops_per_gpu_total counter
sglang:estimated_flops_per_gpu_total{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 6.0e+14
sglang:estimated_flops_per_gpu_total{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 6.0e+14
sglang:estimated_flops_per_gpu_total{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 2.0e+14
sglang:estimated_flops_per_gpu_total{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="3"} 2.0e+14
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_sum{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 50.0
sglang:queue_time_seconds_bucket{dp_rank="0",engine_type="unified",le="1.0",model_name="m",pp_rank="0",tp_rank="0"} 400.0
sglang:queue_time_seconds_bucket{dp_rank="0",engine_type="unified",le="+Inf",model_name="m",pp_rank="0",tp_rank="0"} 500.0
sglang:queue_time_seconds_count{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 500.0
sglang:queue_time_seconds_sum{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 50.0
sglang:queue_time_seconds_bucket{dp_rank="0",engine_type="unified",le="1.0",model_name="m",pp_rank="0",tp_rank="1"} 400.0
sglang:queue_time_seconds_bucket{dp_rank="0",engine_type="unified",le="+Inf",model_name="m",pp_rank="0",tp_rank="1"} 500.0
sglang:queue_time_seconds_count{dp_rank="0",engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 500.0
sglang:queue_time_seconds_sum{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 25.0
sglang:queue_time_seconds_bucket{dp_rank="1",engine_type="unified",le="1.0",model_name="m",pp_rank="0",tp_rank="2"} 300.0
sglang:queue_time_seconds_bucket{dp_rank="1",engine_type="unified",le="+Inf",model_name="m",pp_rank="0",tp_rank="2"} 400.0
sglang:queue_time_seconds_count{dp_rank="1",engine_type="unified",model_name="m",pp_rank="0",tp_rank="2"} 400.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 10000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 3000.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 500.0
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{dp_rank="0",engine_type="unified",mode="prefill_cache",model_name="m",pp_rank="0",tp_rank="0"} 9999.0
"""


def test_sglang_tensor_parallel_copies_count_once_dp_ranks_add_up() -> None:
    s = run(SGLANG_TP, "sglang")
    assert one(s, "inference_queue_depth", "m").value == 7.0  # 4 + 3, not 14
    assert one(s, "inference_requests_running", "m").value == 38.0  # 20 + 18, not 76
    assert one(s, "inference_kv_cache_usage_ratio", "m").value == 0.57  # the fullest rank
    assert one(s, "inference_kv_cache_capacity_tokens", "m").value == 180000.0  # two pools
    assert one(s, "inference_estimated_flops_total", "m").value == 4.0e14  # per GPU
    queue = one(s, "inference_queue_time_seconds", "m")
    assert (queue.buckets, queue.sum, queue.count) == (((1.0, 700.0), (INF, 900.0)), 75.0, 900.0)


def test_sglang_cached_tokens_over_cache_sources_never_with_realtime_tokens() -> None:
    assert one(run(SGLANG_TP, "sglang"), "inference_prompt_tokens_cached_total", "m").value == (
        3500.0
    )


def test_sglang_per_stage_latencies_fill_the_latency_budget() -> None:
    stages = {"tokenize": (0.5, 100), "prefill_forward": (8.0, 100), "decode_loop": (90.0, 100)}
    lines = ["# TYPE sglang:per_stage_req_latency_seconds histogram"]
    for stage, (total, count) in stages.items():
        rank = "" if stage == "tokenize" else ',pp_rank="0",tp_rank="0"'
        for tp in ("0", "1") if rank else ("",):
            labels = f'engine_type="unified",model_name="m",stage="{stage}"' + (
                rank.replace('tp_rank="0"', f'tp_rank="{tp}"') if rank else ""
            )
            lines += [
                f"sglang:per_stage_req_latency_seconds_sum{{{labels}}} {total}",
                f'sglang:per_stage_req_latency_seconds_bucket{{{labels},le="+Inf"}} {count}',
                f"sglang:per_stage_req_latency_seconds_count{{{labels}}} {count}",
            ]
    s = run("\n".join(lines) + "\n", "sglang")
    prefill = one(s, "inference_prefill_time_seconds", "m")
    decode = one(s, "inference_decode_time_seconds", "m")
    tokenizer = one(s, "inference_tokenizer_latency_seconds", "m")
    assert (prefill.sum, prefill.count) == (8.0, 100.0)  # once, not per TP rank
    assert (decode.sum, decode.count) == (90.0, 100.0)
    assert (tokenizer.sum, tokenizer.count) == (0.5, 100.0)
    # the queue stage is only a fallback for queue_time_seconds: absent here
    assert "inference_queue_time_seconds" not in names(s)


# --- TensorRT-LLM --------------------------------------------------------------------------------

# tensorrt_llm/metrics/collector.py (metric_prefix "trtllm_", iteration gauges): no capture
# of these is public yet.
TRTLLM = """\
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="trtllm",model_name="m"} 12.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="trtllm",model_name="m"} 3.0
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="m"} 0.375
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{engine_type="trtllm",model_name="m"} 4096.0
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{engine_type="trtllm",model_name="m"} 32.0
# TYPE trtllm_prompt_tokens_total counter
trtllm_prompt_tokens_total{engine_type="trtllm",model_name="m"} 5000.0
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{engine_type="trtllm",model_name="m"} 7000.0
# TYPE trtllm_request_prefill_time_seconds histogram
trtllm_request_prefill_time_seconds_bucket{engine_type="trtllm",le="1.0",model_name="m"} 9.0
trtllm_request_prefill_time_seconds_bucket{engine_type="trtllm",le="+Inf",model_name="m"} 10.0
trtllm_request_prefill_time_seconds_count{engine_type="trtllm",model_name="m"} 10.0
trtllm_request_prefill_time_seconds_sum{engine_type="trtllm",model_name="m"} 2.5
"""


def test_trtllm_iteration_gauges() -> None:
    s = run(TRTLLM, "trtllm")
    assert [(x.name, x.value) for x in s.series if x.kind != "histogram"] == [
        ("inference_queue_depth", 3.0),
        ("inference_requests_running", 12.0),
        ("inference_kv_cache_usage_ratio", 0.375),
        ("inference_kv_cache_capacity_tokens", 4096.0 * 32.0),
        ("inference_prompt_tokens_total", 5000.0),
        ("inference_generation_tokens_total", 7000.0),
    ]
    prefill = one(s, "inference_prefill_time_seconds", "m")
    assert (prefill.buckets, prefill.sum) == (((1.0, 9.0), (INF, 10.0)), 2.5)


def test_trtllm_undefined_model_is_no_model() -> None:
    text = (
        "# TYPE e2e_request_latency_seconds histogram\n"
        'e2e_request_latency_seconds_bucket{engine_type="undefined",le="+Inf",'
        'model_name="undefined"} 2.0\n'
        'e2e_request_latency_seconds_count{engine_type="undefined",model_name="undefined"} 2.0\n'
        'e2e_request_latency_seconds_sum{engine_type="undefined",model_name="undefined"} 3.5\n'
    )
    assert one(run(text, "trtllm"), "inference_e2e_request_latency_seconds", "").sum == 3.5


# --- Ray Serve LLM -------------------------------------------------------------------------------


def test_ray_replicas_add_up_and_leave_no_ray_label() -> None:
    ray = 'Component="core_worker",NodeAddress="10.0.0.{n}",SessionName="s",Version="2.52.0"'
    lines = []
    for n, (replica, waiting, kv) in enumerate((("r1", 2, 0.25), ("r2", 5, 0.75)), start=1):
        labels = f'{ray.format(n=n)},ReplicaId="{replica}",WorkerId="w{n}",engine="0"'
        lines += [
            f'ray_vllm_num_requests_waiting{{{labels},model_name="qwen"}} {waiting}',
            f'ray_vllm_kv_cache_usage_perc{{{labels},model_name="qwen"}} {kv}',
            f'ray_vllm_prompt_tokens_total{{{labels},model_name="qwen"}} {100 * n}',
        ]
    # an older agent's spelling of the same metric is never added on top
    lines.append('ray_vllm:prompt_tokens_total{model_name="qwen"} 99999')
    s = run("\n".join(lines) + "\n", "ray")
    assert [(x.name, x.model, x.labels, x.value) for x in s.series] == [
        ("inference_queue_depth", "qwen", (), 7.0),
        ("inference_kv_cache_usage_ratio", "qwen", (), 0.75),
        ("inference_prompt_tokens_total", "qwen", (), 300.0),
    ]
    assert s.version == "2.52.0"


# --- Dynamo: frontend and worker together --------------------------------------------------------


def captured(fixture: str) -> EngineSnapshot:
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    return digest(text, "auto", keys=poll_keys())


def test_frontend_and_worker_polled_together_count_each_request_once() -> None:
    front = captured("dynamo-frontend-2026-01.txt")
    worker = captured("dynamo-worker-sglang-2026-01.txt")
    kept_front, kept_worker = layered([front, worker])
    request_level = {
        "inference_time_to_first_token_seconds",
        "inference_inter_token_latency_seconds",
        "inference_e2e_request_latency_seconds",
        "inference_prompt_tokens_total",
        "inference_generation_tokens_total",
    }
    assert {s.name for s in kept_front} == request_level
    assert {s.name for s in kept_worker} == {
        "inference_queue_depth",
        "inference_queue_depth_by_stage",
        "inference_requests_running",
        "inference_kv_cache_usage_ratio",
        "inference_kv_cache_capacity_tokens",
        "inference_prompt_tokens_cached_total",
        "inference_queue_time_seconds",
    }
    # every series once: nothing a sum over the pod could count twice
    every = [(s.name, s.labels) for s in kept_front + kept_worker]
    assert len(every) == len(set(every))
    # the user-facing TTFT is the frontend's
    ttft = next(s for s in kept_front if s.name == "inference_time_to_first_token_seconds")
    assert ttft.sum == 1.5625701570000001


def test_engines_of_one_layer_are_all_kept() -> None:
    """Disaggregated prefill and decode servers: two queues, two sets of requests."""
    prefill = normalise(parse_exposition('vllm:num_requests_waiting{model_name="m"} 3\n'), "vllm")
    decode = normalise(parse_exposition('vllm:num_requests_waiting{model_name="m"} 1\n'), "vllm")
    assert layered([prefill, decode]) == [prefill.series, decode.series]


def test_a_lone_frontend_keeps_everything() -> None:
    front = captured("dynamo-frontend-2026-01.txt")
    assert layered([front]) == [front.series]
