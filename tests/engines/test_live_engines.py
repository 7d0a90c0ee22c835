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
from exporter.lab import thirdparty
from exporter.lab.processes import child_pythonpath, http_get

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
    proc = _sidecar(triton.metrics_url)
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
