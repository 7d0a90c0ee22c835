"""The reference engine over HTTP: OpenAI completions, vLLM tokenize and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from support.refengine import Engine

from exporter.backends.hfmodel import load_model
from exporter.collectors.tokenizer import request_body, token_count
from exporter.engines import detect, normalise, parse_exposition
from exporter.lab.processes import child_pythonpath
from exporter.lab.refengine.torch_model import ModelConfig
from exporter.lab.refengine.worker import decode_work, prefill_work


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    workdir = tmp_path_factory.mktemp("engine")
    eng = Engine(
        workdir / "engine.log", "--served-model-name", "ref", "--model-dir", str(workdir / "model")
    )
    yield eng
    eng.stop()


def samples(engine: Engine) -> dict[str, Sample]:
    status, body = engine.request("GET", "/metrics")
    assert status == 200
    return {
        s.name: s
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_health_and_models(engine: Engine) -> None:
    assert engine.request("GET", "/health")[0] == 200
    status, body = engine.request("GET", "/v1/models")
    assert status == 200
    assert json.loads(body)["data"][0]["id"] == "ref"


def test_tokenize_answers_the_sidecar_probe_as_vllm(engine: Engine) -> None:
    status, body = engine.request("POST", "/tokenize", request_body("vllm", "Hello world", "ref"))
    assert status == 200
    data = json.loads(body)
    assert set(data) == {"count", "max_model_len", "tokens", "token_strs"}
    assert data["count"] == len(data["tokens"]) == token_count(body) > 0
    assert data["max_model_len"] == 1024
    status, body = engine.request("POST", "/detokenize", {"tokens": data["tokens"]})
    assert json.loads(body)["prompt"] == "Hello world"


def test_completion(engine: Engine) -> None:
    status, body = engine.request(
        "POST", "/v1/completions", {"model": "ref", "prompt": "The river", "max_tokens": 7}
    )
    assert status == 200
    data = json.loads(body)
    assert data["object"] == "text_completion"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 7
    assert data["usage"]["total_tokens"] == 7 + data["usage"]["prompt_tokens"]


def test_streamed_completion_is_server_sent_events(engine: Engine) -> None:
    body = {
        "prompt": [5, 6, 7, 8],
        "max_tokens": 9,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    status, raw = engine.request("POST", "/v1/completions", body)
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    # Greedy decoding of the same prompt is deterministic.
    again = engine.request("POST", "/v1/completions", {**body, "stream": False})[1]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert json.loads(again)["choices"][0]["text"] == text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json", 400),
        ({"prompt": "x", "model": "other"}, 404),
        ({"prompt": "x", "max_tokens": 0}, 400),
        ({"prompt": 5}, 400),
        ({"prompt": "word " * 2000, "max_tokens": 1}, 400),
        ({"prompt": [999999]}, 400),
    ],
)
def test_bad_requests(engine: Engine, body: object, status: int) -> None:
    got, raw = engine.request("POST", "/v1/completions", body)
    assert got == status
    assert json.loads(raw)["code"] == status


def test_metrics_read_by_the_sidecars_vllm_adapter(engine: Engine) -> None:
    engine.request("POST", "/v1/completions", {"prompt": "a b c", "max_tokens": 3})
    status, body = engine.request("GET", "/metrics")
    assert status == 200
    families = parse_exposition(body.decode())
    assert detect(families) == "vllm"
    series = {(s.name, s.model): s for s in normalise(families, "vllm").series}
    names = {name for name, _ in series}
    assert {
        "inference_queue_depth",
        "inference_requests_running",
        "inference_kv_cache_usage_ratio",
        "inference_prompt_tokens_total",
        "inference_generation_tokens_total",
        "inference_time_to_first_token_seconds",
        "inference_inter_token_latency_seconds",
        "inference_e2e_request_latency_seconds",
        "inference_queue_time_seconds",
        "inference_prefill_time_seconds",
        "inference_decode_time_seconds",
    } <= names
    assert series[("inference_generation_tokens_total", "ref")].value >= 3
    # Colocated (--role both, the default): no KV connector, no NIXL metrics.
    assert b"nixl" not in body
    assert series[("inference_e2e_request_latency_seconds", "ref")].count >= 1


def test_cache_config_info_as_vllm_reports_it(engine: Engine) -> None:
    info = samples(engine)["vllm:cache_config_info"]
    assert info.value == 1
    # 16 sequences x 1024 positions in blocks of 16
    assert info.labels == {
        "block_size": "16",
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "engine": "0",
        "num_gpu_blocks": "1024",
    }


def test_mfu_counters_add_up_the_work_of_each_step(engine: Engine) -> None:
    names = [
        "vllm:estimated_flops_per_gpu_total",
        "vllm:estimated_read_bytes_per_gpu_total",
        "vllm:estimated_write_bytes_per_gpu_total",
    ]
    before = samples(engine)
    for name in names:
        assert before[name].labels == {"model_name": "ref", "engine": "0"}
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0}
    assert engine.request("POST", "/v1/completions", body)[0] == 200
    after = samples(engine)
    got = [after[n].value - before[n].value for n in names]
    # The same work from the model's own description: a prefill of 4 tokens, then 8 decode
    # steps of one sequence at positions 4..11 (attending to 5..12 keys).
    assert engine.model_dir is not None
    config = json.loads((engine.model_dir / "config.json").read_text())
    shape = ModelConfig(
        vocab_size=config["vocab_size"],
        layers=config["n_layer"],
        d_model=config["n_embd"],
        heads=config["n_head"],
        max_len=config["n_positions"],
    )
    work = prefill_work(shape, 4, 4)
    for position in range(4, 12):
        work.add(decode_work(shape, 1, position + 1, 4))
    assert got == [work.flops, work.read_bytes, work.write_bytes]
    # Plausible: each of the 9 passes streams the weights (15 MB, tiny), 2 FLOPs per weight
    weights = load_model(engine.model_dir).weight_bytes
    assert weights is not None and got[1] > 9 * weights
    assert got[0] > 9 * 2 * weights / 4
    assert got[2] == 12 * 2 * 4 * 256 * 4  # keys and values of 12 positions


def test_injections_are_resized_while_the_engine_runs(tmp_path: Path) -> None:
    """POST /lab/injection: the decode overhead, zero at start-up, reaches the model worker
    (every inter-token gap then holds its 40 ms of host work); bad sizes change nothing."""
    eng = Engine(
        tmp_path / "engine.log", "--inject", "decode-overhead", "--decode-overhead-ms", "0"
    )
    try:
        status, body = eng.request("GET", "/lab/injection")
        assert status == 200
        assert json.loads(body) == {
            "injections": ["decode-overhead"],
            "sizes": {"decode_overhead_ms": 0.0},
            "worker_slowdown": 1.0,
        }
        for bad, reason in (
            ({"decode_overhead_ms": -1}, "must be from 0 to 10000"),
            ({"decode_overhead_ms": "40"}, "must be a number"),
            ({"gil_request_ms": 5}, "frontend-gil is not injected"),
            ({"decode_overhead_ms": 40, "warp": 9}, "unknown size 'warp'"),
        ):
            status, body = eng.request("POST", "/lab/injection", bad)
            assert status == 400 and reason in json.loads(body)["message"], body
        assert json.loads(eng.request("GET", "/lab/injection")[1])["sizes"] == {
            "decode_overhead_ms": 0.0
        }
        status, body = eng.request("POST", "/lab/injection", {"decode_overhead_ms": 40})
        assert status == 200 and json.loads(body)["sizes"] == {"decode_overhead_ms": 40.0}
        eng.request("POST", "/v1/completions", {"prompt": "a b c", "max_tokens": 5})
        got = samples(eng)
        gaps = got["vllm:inter_token_latency_seconds_count"].value
        assert gaps == 4 and got["vllm:inter_token_latency_seconds_sum"].value >= 4 * 0.040
    finally:
        eng.stop()


def _floods(pid: int) -> list[str]:
    """The command lines of ``pid``'s softirq flood helpers."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid and "softirq" in cmd[1:4]:
            found.append(" ".join(cmd))
    return found


def _wait_floods(pid: int, count: int) -> list[str]:
    deadline = time.monotonic() + 10
    while len(found := _floods(pid)) != count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_the_softirq_flood_starts_when_sized(tmp_path: Path) -> None:
    """Issue 35: an engine started with the flood at size zero runs none until
    POST /lab/injection sizes it (a drill measures the engine first), a new size restarts it
    at that target, and zero stops it."""
    eng = Engine(tmp_path / "engine.log", "--inject", "softirq", "--softirq-target", "0")
    try:
        got = json.loads(eng.request("GET", "/lab/injection")[1])
        assert got["sizes"] == {"softirq_target": 0.0}
        assert _floods(eng.proc.pid) == []
        for target in (0.05, 0.04):
            status, body = eng.request("POST", "/lab/injection", {"softirq_target": target})
            assert status == 200, body
            floods = _wait_floods(eng.proc.pid, 1)
            assert len(floods) == 1 and f"--target {target:g}" in floods[0], floods
        assert eng.request("POST", "/lab/injection", {"softirq_target": 0})[0] == 200
        assert _wait_floods(eng.proc.pid, 0) == []
    finally:
        eng.stop()


def test_sigterm_stops_engine_and_worker(tmp_path: Path) -> None:
    eng = Engine(tmp_path / "engine.log")
    took = eng.stop()
    assert eng.proc.returncode == 0
    assert took < 10


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--inject", "gpu-melt"], 2, "unknown injection 'gpu-melt'"),
        (["--size", "huge"], 2, "--size: unknown size"),
        (["--max-num-seqs", "0"], 2, "--max-num-seqs: must be at least 1"),
        (["--worker-slowdown", "0.5"], 2, "--worker-slowdown: must be from 1 to 100"),
        (["--kv-link-mib-s", "0"], 2, "--kv-link-mib-s: must be above 0 and at most 100000"),
        (["--softirq-target", "1"], 2, "--softirq-target: must be from 0 to 0.95"),
        (["--inject", "h2d-stall", "--device", "cpu"], 1, "h2d-stall needs a CUDA device"),
        (
            ["--inject", "hbm-saturation,h2d-stall", "--device", "cpu"],
            1,
            "h2d-stall, hbm-saturation needs a CUDA device",
        ),
    ],
)
def test_engine_errors_are_one_line(args: list[str], code: int, message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "exporter.lab.refengine", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": child_pythonpath(), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == code, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert message in last, out.stderr
