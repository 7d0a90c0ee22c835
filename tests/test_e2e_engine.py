"""End to end: the real CLI process against the fake engine, over loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.fakeengine import FakeEngine, FakeEngineThread
from support.metrics import metric_value
from support.paths import FIXTURES
from support.process import ExporterProcess

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V = {"engine": "vllm", "model": MODEL, "role": "both"}
FAST = [
    "--no-collector.nvml",
    "--path.procfs",
    str(FIXTURES / "proc" / "two-cpu"),
    "--engine.poll-interval",
    "500ms",
    "--engine.timeout",
    "500ms",
    "--tokenizer.probe-interval",
    "1s",
    "--scrape.timeout",
    "500ms",
]


@pytest.fixture
def fake() -> Iterator[FakeEngineThread]:
    with FakeEngine.run_in_thread(per_token_latency=0.00002) as engine:
        yield engine


def scrape(proc: ExporterProcess) -> tuple[str, float]:
    start = time.monotonic()
    status, _, body = proc.get("/metrics")
    assert status == 200
    return body.decode(), time.monotonic() - start


def test_normalised_values_exactly(
    fake: FakeEngineThread, exporter_process: Callable[..., ExporterProcess]
) -> None:
    proc = exporter_process("--engine.url", fake.url + "/metrics", *FAST)
    proc.wait_ready()
    proc.wait_for(
        lambda: (
            metric_value(scrape(proc)[0], "inference_tokenizer_probe_tokens", {"engine": "vllm"})
            is not None
        )
    )
    # A probe that runs before the engine collector's first poll has no model to name; the
    # next one (a second later) names the model the engine's metrics carry.
    proc.wait_for(lambda: (fake.engine.last_tokenize_request or {}).get("model") == MODEL)
    text, _ = scrape(proc)
    assert metric_value(text, "inference_engine_up", {"engine": "vllm"}) == 1
    assert metric_value(text, "inference_queue_depth", V) == 1
    assert metric_value(text, "inference_requests_running", V) == 3
    assert metric_value(text, "inference_kv_cache_usage_ratio", V) == 0.42
    assert metric_value(text, "inference_prompt_tokens_total", V) == 12345
    assert metric_value(text, "inference_generation_tokens_total", V) == 6789
    assert (
        metric_value(text, "inference_time_to_first_token_seconds_bucket", {**V, "le": "0.1"}) == 7
    )
    assert metric_value(text, "inference_time_to_first_token_seconds_sum", V) == 2.5
    assert metric_value(text, "inference_tokenizer_probe_tokens", {"engine": "vllm"}) > 300
    assert metric_value(text, "inference_scrape_collector_success", {"collector": "engine"}) == 1
    assert metric_value(text, "inference_scrape_collector_success", {"collector": "tokenizer"}) == 1


@pytest.mark.parametrize(
    "mode",
    [
        "500",
        "hang",
        "slow_drip",
        "huge",
        "garbage",
        "duplicate_families",
        "nan_inf",
        "close",
        "gzip_bomb",
    ],
)
def test_exporter_stays_healthy_whatever_the_engine_does(
    mode: str, fake: FakeEngineThread, exporter_process: Callable[..., ExporterProcess]
) -> None:
    fake.set_mode(mode)
    proc = exporter_process("--engine.url", fake.url + "/metrics", *FAST)
    proc.wait_ready(timeout=10)
    polls = fake.engine.requests["/metrics"]
    # a few polls against the hostile engine (a hanging one counts when it starts)
    proc.wait_for(lambda: fake.engine.requests["/metrics"] >= polls + 2, timeout=10)
    for _ in range(3):
        text, took = scrape(proc)
        assert took < 1.0
        assert metric_value(text, "inference_scrape_collector_success", {"collector": "cpu"}) == 1
    assert proc.get("/-/healthy")[0] == 200
    assert proc.get("/-/ready")[0] == 200
    if mode not in ("duplicate_families", "nan_inf"):
        assert (
            metric_value(text, "inference_scrape_collector_success", {"collector": "engine"}) == 0
        )
    assert proc.proc.poll() is None
    # recovery once the engine behaves again
    fake.set_mode("ok")
    proc.wait_for(
        lambda: metric_value(scrape(proc)[0], "inference_queue_depth", V) == 1, timeout=10
    )
    assert proc.terminate() < 5


def test_triton_two_models_through_the_cli(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    body = (FIXTURES / "engines" / "triton.txt").read_text()
    with FakeEngine.run_in_thread(metrics_body=body) as fake:
        proc = exporter_process("--engine.url", fake.url + "/metrics", *FAST)
        proc.wait_ready()
        triton = {"engine": "triton"}

        def polled() -> bool:
            return metric_value(scrape(proc)[0], "inference_engine_up", triton) == 1

        proc.wait_for(polled)
        text, _ = scrape(proc)
        assert (
            metric_value(
                text, "inference_queue_depth", {**triton, "model": "resnet50", "role": "both"}
            )
            == 5
        )
        assert (
            metric_value(
                text, "inference_queue_depth", {**triton, "model": "tensorrt_llm", "role": "both"}
            )
            == 4
        )
        assert (
            metric_value(
                text,
                "inference_requests_running",
                {**triton, "model": "tensorrt_llm", "role": "both"},
            )
            == 16
        )
        labels = {**triton, "model": "resnet50", "role": "both"}
        assert metric_value(text, "inference_e2e_request_latency_seconds_sum", labels) == 14.4
        assert metric_value(text, "inference_e2e_request_latency_seconds_count", labels) == 2000
        # Triton has no tokenize endpoint: the probe says so instead of failing
        assert (
            metric_value(text, "inference_scrape_collector_success", {"collector": "tokenizer"})
            == 1
        )


def test_custom_mapping_file_through_the_cli(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    body = (FIXTURES / "engines" / "custom.txt").read_text()
    with FakeEngine.run_in_thread(metrics_body=body) as fake:
        proc = exporter_process(
            "--engine.url",
            fake.url + "/metrics",
            "--engine.type",
            "custom",
            "--engine.mapping-file",
            str(FIXTURES / "engines" / "custom-mapping.yaml"),
            *FAST,
        )
        proc.wait_ready()
        custom = {"engine": "custom"}
        proc.wait_for(lambda: metric_value(scrape(proc)[0], "inference_engine_up", custom) == 1)
        text, _ = scrape(proc)
        assert (
            metric_value(
                text, "inference_queue_depth", {**custom, "model": "chat-70b", "role": "both"}
            )
            == 5
        )
        assert metric_value(
            text, "inference_kv_cache_usage_ratio", {**custom, "model": "chat-70b", "role": "both"}
        ) == pytest.approx(0.83)
        assert (
            metric_value(
                text,
                "inference_prompt_tokens_total",
                {**custom, "model": "chat-70b", "role": "both"},
            )
            == 905216
        )


def test_bad_mapping_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("metrics:\n  - target: inference_nope\n    source: x\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "--engine.type",
            "custom",
            "--engine.mapping-file",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--engine.mapping-file:" in result.stderr and "m.yaml" in result.stderr


def test_two_engine_urls_through_the_cli(
    fake: FakeEngineThread, exporter_process: Callable[..., ExporterProcess]
) -> None:
    """A vLLM server and a NIM in one pod: each polled, each with its endpoint label."""
    body = (FIXTURES / "engines" / "nim-llm-1.0.0-2024-10.txt").read_text()
    with FakeEngine.run_in_thread(metrics_body=body) as nim:
        proc = exporter_process(
            "--engine.url", fake.url + "/metrics", "--engine.url", nim.url + "/metrics", *FAST
        )
        proc.wait_ready()
        first = {"engine": "vllm", "endpoint": fake.url.removeprefix("http://")}
        second = {"engine": "nim", "endpoint": nim.url.removeprefix("http://")}

        def both_up() -> bool:
            text = scrape(proc)[0]
            return all(metric_value(text, "inference_engine_up", x) == 1 for x in (first, second))

        proc.wait_for(both_up)
        text, _ = scrape(proc)
        assert (
            metric_value(text, "inference_queue_depth", {**first, "model": MODEL, "role": "both"})
            == 1
        )
        nim_model = {**second, "model": "meta/llama-3.1-8b-instruct", "role": "both"}
        assert metric_value(text, "inference_requests_running", nim_model) == 1
        assert metric_value(text, "inference_generation_tokens_total", nim_model) == 174
        info = {**second, "version": "", "model": "meta/llama-3.1-8b-instruct", "role": "both"}
        assert metric_value(text, "inference_engine_info", info) == 1
        # the tokenizer probe follows the first URL's engine
        proc.wait_for(
            lambda: (
                metric_value(
                    scrape(proc)[0], "inference_tokenizer_probe_tokens", {"engine": "vllm"}
                )
                is not None
            )
        )
