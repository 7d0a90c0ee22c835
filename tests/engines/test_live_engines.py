"""The engine modules against live third-party engines: llama.cpp's llama-server and Triton
(PyTriton), as built and installed by ``make thirdparty`` (exporter/lab/thirdparty.py).

A captured scrape is a still picture; these read the engines while they serve: what exists at
start, what a request adds, the tokenize endpoint's answer, the process the default
``--process.match`` finds, what a restart does to the counters, and what the sidecar reports
when the engine is loading, gone, without a model, or answering something that is not an
exposition. Nothing here skips: without the engines the tests fail (``make thirdparty``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.metrics import metric_value
from support.process import ExporterProcess

from exporter.engines import digest, poll_keys
from exporter.engines.snapshot import EngineSnapshot, Series
from exporter.engines.spec import token_count
from exporter.lab import thirdparty
from exporter.lab.processes import child_pythonpath, free_port, http_get, spawn, wait_until

pytestmark = pytest.mark.timeout(240)


def _post(url: str, body: dict[str, object], timeout: float = 60.0) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def _snapshot(metrics_url: str) -> EngineSnapshot:
    status, body = http_get(metrics_url)
    assert status == 200, body[:200]
    return digest(body.decode(), "auto", keys=poll_keys())


def _series(snapshot: EngineSnapshot, name: str) -> list[Series]:
    return [s for s in snapshot.series if s.name == name]


def _sidecar(metrics_url: str, *extra: str) -> ExporterProcess:
    """The real sidecar on the engine, engine type recognised (no --engine.type)."""
    proc = ExporterProcess(
        [
            "--web.listen-address",
            "127.0.0.1:0",
            "--engine.url",
            metrics_url,
            "--engine.poll-interval",
            "500ms",
            "--tokenizer.probe-interval",
            "1s",
            "--gpu.replay-file",
            "exporter/data/replay-2gpu-synthetic.jsonl",
            *extra,
        ]
    )
    proc.wait_ready()
    return proc


def _value(proc: ExporterProcess, name: str, labels: dict[str, str] | None = None) -> float | None:
    status, _, body = proc.get("/metrics")
    assert status == 200
    return metric_value(body.decode(), name, labels)


# --- Triton -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[thirdparty.Launched]:
    launched = thirdparty.start("triton", tmp_path_factory.mktemp("triton"))
    try:
        yield launched
    finally:
        for child in launched.children:
            child.stop()


def test_triton_live_metrics_normalise_from_the_first_poll(triton: thirdparty.Launched) -> None:
    before = _snapshot(triton.metrics_url)
    assert before.engine == "triton"
    # Every family is there at start, at zero (no series appears with the first request).
    (e2e,) = _series(before, "inference_e2e_request_latency_seconds")
    (queue,) = _series(before, "inference_queue_depth")
    assert queue.value == 0
    assert e2e.model == "tiny"
    start_count = e2e.buckets[-1][1]
    for _ in range(2):
        status, body = _post(
            triton.api_url + "/v2/models/tiny/generate", {"text_input": "hi", "max_tokens": 8}
        )
        assert status == 200, body
        assert json.loads(body)["text_output"]
    after = _snapshot(triton.metrics_url)
    (e2e,) = _series(after, "inference_e2e_request_latency_seconds")
    (queued,) = _series(after, "inference_queue_time_seconds")
    assert e2e.buckets == ((float("inf"), start_count + 2),)  # Triton times whole requests
    # 8 steps of 3 ms device wait each: at least 24 ms a request, in seconds
    assert e2e.sum >= 2 * 0.024
    assert 0 <= queued.sum < e2e.sum
    # Triton knows nothing of tokens, and its Python backend has no running-requests gauge.
    names = {s.name for s in after.series}
    assert not names & {
        "inference_generation_tokens_total",
        "inference_prompt_tokens_total",
        "inference_requests_running",
        "inference_inter_token_latency_seconds",
    }


def test_triton_through_the_sidecar(triton: thirdparty.Launched) -> None:
    # Its API on another port than its metrics, as Triton's 8000 and 8002.
    proc = _sidecar(triton.metrics_url, "--engine.api-url", triton.api_url)
    try:
        up = {"engine": "triton"}
        proc.wait_for(lambda: _value(proc, "inference_engine_up", up) == 1)
        # The default --process.match finds tritonserver (and PyTriton's Python process, whose
        # command line names the server).
        proc.wait_for(lambda: (_value(proc, "inference_engine_processes") or 0) >= 1)

        # No tokenize endpoint: the probe says so once and stays healthy, it does not guess.
        def notes() -> list[str]:
            return [e["msg"] for e in proc.logs if "no tokenize endpoint" in e.get("msg", "")]

        def scraped_notes() -> int:
            proc.get("/metrics")
            return len(notes())

        proc.wait_for(lambda: scraped_notes() >= 2)  # the probe's warning, the scrape's note
        for _ in range(3):  # three more scrapes: nothing more is logged
            proc.get("/metrics")
        assert len(notes()) == 2, notes()
        assert not [e for e in proc.logs if "recovered" in e.get("msg", "")]
        assert _value(proc, "inference_tokenizer_probes_total", up) == 0
        assert _value(proc, "inference_scrape_collector_success", {"collector": "tokenizer"}) == 1
        # The model is Triton's own label: every series and the info carry it.
        tiny = {"engine": "triton", "model": "tiny", "role": "both"}
        assert _value(proc, "inference_queue_depth", tiny) == 0
        named = {"engine": "triton", "model": "tiny", "raw_model": "tiny", "origin": "metrics"}
        assert _value(proc, "inference_engine_model_info", named) == 1
        _, _, body = proc.get("/metrics")
        assert 'model=""' not in body.decode()
        # The API answered: its version (/v2) and the model's configuration (no ensemble, so
        # nothing is a step and its request time stays).
        assert _value(proc, "inference_engine_model_config_up", up) == 1
        assert re.search(r'inference_engine_info\{[^}]*version="2\.\d+', body.decode())
        assert "inference_engine_ensemble_step_info{" not in body.decode()
        assert _value(proc, "inference_e2e_request_latency_seconds_count", tiny) is not None
    finally:
        proc.close()


def test_the_load_generator_speaks_tritons_generate_api(triton: thirdparty.Launched) -> None:
    before = _series(_snapshot(triton.metrics_url), "inference_e2e_request_latency_seconds")
    cmd = [
        sys.executable,
        "-m",
        "exporter.cli",
        "load",
        "--api",
        "triton",
        "--model",
        "tiny",
        "--url",
        triton.api_url,
        "--rate",
        "4",
        "--output-tokens",
        "16",
        "--duration",
        "3s",
        "--output",
        "json",
        "--progress",
        "off",
    ]
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["completed"] >= 3 and summary["failed"] == 0, summary
    assert summary["itl_s"] == {}  # one answer per request: no inter-token gaps
    after = _series(_snapshot(triton.metrics_url), "inference_e2e_request_latency_seconds")
    assert after[0].buckets[-1][1] - before[0].buckets[-1][1] == summary["completed"]


def test_triton_http_port_is_not_an_exposition(triton: thirdparty.Launched) -> None:
    """The sidecar pointed at Triton's inference port instead of its metrics port."""
    proc = _sidecar(triton.api_url + "/v2")
    try:
        failed = {"engine": "unknown", "reason": "parse"}
        proc.wait_for(
            lambda: (_value(proc, "inference_engine_poll_failures_total", failed) or 0) >= 2
        )
        assert _value(proc, "inference_engine_up", {"engine": "unknown"}) == 0
        assert _value(proc, "inference_scrape_collector_success", {"collector": "engine"}) == 0
    finally:
        proc.close()


def test_triton_without_a_model_is_still_triton(tmp_path: Path) -> None:
    """What an unloaded model leaves: a Triton whose metrics hold only its server-wide
    families (no nv_inference_*). The sidecar recognises Triton, is up, and serves no model."""
    launched = thirdparty.start("triton", tmp_path, ["--no-model"])
    try:
        status, body = http_get(launched.metrics_url)
        assert status == 200
        text = body.decode()
        assert "nv_inference_" not in text
        assert re.search(r"^nv_cpu_utilization ", text, re.M), text[:500]
        snapshot = digest(text, "auto", keys=poll_keys())
        assert snapshot.engine == "triton"
        assert snapshot.series == []
        proc = _sidecar(launched.metrics_url)
        try:
            proc.wait_for(lambda: _value(proc, "inference_engine_up", {"engine": "triton"}) == 1)
            assert _value(proc, "inference_queue_depth") is None
        finally:
            proc.close()
    finally:
        for child in launched.children:
            child.stop()


# --- llama.cpp --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[thirdparty.Launched]:
    launched = thirdparty.start("llamacpp", tmp_path_factory.mktemp("llama"))
    try:
        yield launched
    finally:
        for child in launched.children:
            child.stop()


def _complete(url: str, tokens: int = 16) -> dict[str, object]:
    status, body = _post(
        url + "/v1/completions",
        {"prompt": "The river keeper", "max_tokens": tokens, "ignore_eos": True},
    )
    assert status == 200, body
    answer: dict[str, object] = json.loads(body)
    return answer


def test_llamacpp_live_metrics_normalise(llama: thirdparty.Launched) -> None:
    before = _snapshot(llama.metrics_url)
    assert before.engine == "llamacpp"
    names = {s.name for s in before.series}
    assert {"inference_queue_depth", "inference_requests_running"} <= names
    # Recent builds dropped the KV-cache ratio: the series is absent, never a made-up 0.
    assert "inference_kv_cache_usage_ratio" not in names
    generated = _series(before, "inference_generation_tokens_total")[0].value
    _complete(llama.api_url, 16)
    after = _snapshot(llama.metrics_url)
    assert _series(after, "inference_generation_tokens_total")[0].value == generated + 16
    # No latency histogram of any kind (only cumulative seconds).
    assert not [s for s in after.series if s.kind == "histogram"]


def test_llamacpp_tokenize_answers_as_the_probe_reads_it(llama: thirdparty.Launched) -> None:
    prompt = "The lighthouse keeper wrote the evening weather in the ledger."
    status, body = _post(llama.api_url + "/tokenize", {"content": prompt})
    assert status == 200
    tokens = json.loads(body)["tokens"]
    assert all(isinstance(t, int) for t in tokens)
    # LLaMA's SentencePiece vocabulary: about one token per short English word, no BOS added.
    assert 10 <= token_count(body) == len(tokens) <= 20


def test_llamacpp_through_the_sidecar(llama: thirdparty.Launched) -> None:
    proc = _sidecar(llama.metrics_url)
    try:
        engine = {"engine": "llamacpp"}
        proc.wait_for(lambda: _value(proc, "inference_engine_up", engine) == 1)
        proc.wait_for(lambda: (_value(proc, "inference_tokenizer_probes_total", engine) or 0) >= 2)
        assert _value(proc, "inference_tokenizer_probe_failures_total", engine) == 0
        # the bundled ~512-word prompt, in LLaMA's tokens
        tokens = _value(proc, "inference_tokenizer_probe_tokens", engine)
        assert tokens is not None and 400 <= tokens <= 1000, tokens
        # the default --process.match finds llama-server
        proc.wait_for(lambda: (_value(proc, "inference_engine_processes") or 0) >= 1)
        # llama.cpp's metrics name no model: /v1/models does (the model file, no --alias here)
        served = _served(llama)
        assert served.endswith("tiny-llama.gguf"), served
        model = "tiny-llama"
        info = {"engine": "llamacpp", "model": model, "role": "both", "version": _build_info(llama)}
        proc.wait_for(lambda: _value(proc, "inference_engine_info", info) == 1)
        raw = {"engine": "llamacpp", "model": model, "raw_model": served, "origin": "/v1/models"}
        assert _value(proc, "inference_engine_model_info", raw) == 1
        running = {"engine": "llamacpp", "model": model, "role": "both"}
        assert _value(proc, "inference_requests_running", running) is not None
        _, _, body = proc.get("/metrics")
        assert 'model=""' not in body.decode()
    finally:
        proc.close()


def _served(llama: thirdparty.Launched) -> str:
    status, body = http_get(llama.api_url + "/v1/models")
    assert status == 200
    return str(json.loads(body)["data"][0]["id"])


def _build_info(llama: thirdparty.Launched) -> str:
    status, body = http_get(llama.api_url + "/props")
    assert status == 200
    version = str(json.loads(body)["build_info"])
    assert version
    return version


def test_llamacpp_killed_and_restarted(tmp_path: Path) -> None:
    """Killed mid-poll and started again on the same port: the sidecar counts the failed
    polls, keeps answering /metrics, and serves the reset counter as the engine reports it
    (Prometheus's rate() treats the drop as a reset)."""
    first = thirdparty.start("llamacpp", tmp_path / "a")
    port = int(first.api_url.rsplit(":", 1)[1])
    proc = _sidecar(first.metrics_url)
    second: thirdparty.Launched | None = None
    try:
        _complete(first.api_url, 24)
        engine = {"engine": "llamacpp", "model": "tiny-llama", "role": "both"}
        proc.wait_for(lambda: _value(proc, "inference_generation_tokens_total", engine) == 24)
        first.children[0].proc.kill()
        first.children[0].stop()
        connect = {"engine": "llamacpp", "reason": "connect"}
        proc.wait_for(
            lambda: (_value(proc, "inference_engine_poll_failures_total", connect) or 0) >= 2
        )
        assert _value(proc, "inference_engine_up", {"engine": "llamacpp"}) == 0
        # back under an --alias: the sidecar asks its name again when it comes up
        second = thirdparty.start(
            "llamacpp", tmp_path / "b", ["--alias", "river-keeper"], port=port, exact_port=True
        )
        _complete(second.api_url, 4)
        engine["model"] = "river-keeper"
        proc.wait_for(lambda: _value(proc, "inference_generation_tokens_total", engine) == 4)
        assert _value(proc, "inference_engine_up", {"engine": "llamacpp"}) == 1
        raw = {"model": "river-keeper", "raw_model": "river-keeper", "origin": "/v1/models"}
        assert _value(proc, "inference_engine_model_info", {"engine": "llamacpp", **raw}) == 1
    finally:
        proc.close()
        for launched in (first, second):
            for child in launched.children if launched else []:
                child.stop()


def test_gguf_is_written_the_same_every_time(tmp_path: Path) -> None:
    vocab = thirdparty.llama_vocab()
    a = thirdparty.write_tiny_gguf(tmp_path / "a.gguf", vocab)
    b = thirdparty.write_tiny_gguf(tmp_path / "b.gguf", vocab)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() == thirdparty.tiny_model().read_bytes()


def test_llamacpp_still_loading_answers_503(tmp_path: Path) -> None:
    """llama-server answers HTTP while its model loads: 503 on /metrics. Its model here is a
    FIFO that nobody writes yet, so it stays loading for as long as the test needs."""
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    port = free_port()
    child = spawn(
        "loading",
        [
            str(thirdparty.llama_server_binary()),
            "--model",
            str(fifo),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics",
        ],
        tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(url + "/health", 2)[0] == 503, 30, "503", child=child)
        status, body = http_get(url + "/metrics")
        assert status == 503, body[:200]
        assert b"Loading model" in body
        proc = _sidecar(url + "/metrics")
        try:
            loading = {"engine": "unknown", "reason": "status"}
            proc.wait_for(
                lambda: (_value(proc, "inference_engine_poll_failures_total", loading) or 0) >= 2
            )
            assert _value(proc, "inference_engine_up", {"engine": "unknown"}) == 0
            assert _value(proc, "inference_scrape_collector_success", {"collector": "engine"}) == 0
        finally:
            proc.close()
    finally:
        child.stop(5)


def test_llamacpp_without_metrics_flag(tmp_path: Path) -> None:
    """llama-server started without --metrics answers /metrics with an error status: a failed
    poll with reason ``status``, the sidecar's /metrics keeps answering."""
    port = free_port()
    model = thirdparty.tiny_model()
    child = spawn(
        "no-metrics",
        [
            str(thirdparty.llama_server_binary()),
            *("--model", str(model), "--port", str(port), "--host", "127.0.0.1"),
            *("--threads", "1", "--parallel", "1"),
        ],
        tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(url + "/health", 2)[0] == 200, 60, "/health", child=child)
        status, _ = http_get(url + "/metrics")
        assert status >= 400
        proc = _sidecar(url + "/metrics")
        try:
            failed = {"engine": "unknown", "reason": "status"}
            proc.wait_for(
                lambda: (_value(proc, "inference_engine_poll_failures_total", failed) or 0) >= 2
            )
            assert _value(proc, "inference_engine_up", {"engine": "unknown"}) == 0
        finally:
            proc.close()
    finally:
        child.stop(5)


def test_llamacpp_prompt_tokens_count_the_cached_ones_too(llama: thirdparty.Launched) -> None:
    """The same prompt twice: the second reuses the first's cached prefix, which
    llamacpp:prompt_tokens_total leaves out and the normalised prompt count keeps."""
    prompt = "The lighthouse keeper wrote the evening weather in the ledger " * 8

    def counts() -> tuple[float, float]:
        snap = _snapshot(llama.metrics_url)
        total = _series(snap, "inference_prompt_tokens_total")[0].value
        cached = _series(snap, "inference_prompt_tokens_cached_total")[0].value
        return total, cached

    status, body = _post(llama.api_url + "/tokenize", {"content": prompt, "add_special": True})
    assert status == 200
    n = len(json.loads(body)["tokens"])
    total0, cached0 = counts()
    for _ in range(2):
        status, _ = _post(
            llama.api_url + "/v1/completions",
            {"prompt": prompt, "max_tokens": 1, "id_slot": 0, "cache_prompt": True},
        )
        assert status == 200
    total1, cached1 = counts()
    assert cached1 - cached0 > 0.5 * n  # the second request reused most of the first's prompt
    assert total1 - total0 == pytest.approx(2 * n, abs=4)  # both prompts, whole
