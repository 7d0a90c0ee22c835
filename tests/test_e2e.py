"""End to end: the real CLI process, the replay backend and a fixture procfs, over HTTP.

The golden exposition (``tests/fixtures/e2e-output.txt``) is compared line by line after
removing what depends on the machine (``process_*``, ``python_info``) and masking collector
durations. Regenerate it with ``UPDATE_GOLDEN=1 pytest tests/test_e2e.py``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.metrics import metric_value
from support.paths import FIXTURES, TRACE
from support.process import ExporterProcess

GOLDEN = FIXTURES / "e2e-output.txt"
PROC = FIXTURES / "proc" / "two-cpu"
# One read per GPU, at start, so the output is the trace's first record exactly.
STATIC = [
    "--gpu.poll-interval",
    "300s",
    "--gpu.replay-file",
    str(TRACE),
    "--path.procfs",
    str(PROC),
    # the golden covers nvml and cpu; the engine collectors have their own end-to-end tests
    "--no-collector.engine",
    "--no-collector.tokenizer",
    "--no-collector.process",
    "--no-collector.model",
]

_VOLATILE = re.compile(r"^(process_|python_info)")
_LIVE = re.compile(r"^inference_exporter_http_(connections|connections_limit|requests_in_flight) ")


def normalise(text: str) -> str:
    out = []
    for line in text.splitlines():
        bare = line.removeprefix("# HELP ").removeprefix("# TYPE ")
        if _VOLATILE.match(bare):
            continue
        if line.startswith("inference_scrape_collector_duration_seconds{"):
            out.append(re.sub(r" \S+$", " <duration>", line))
        elif _LIVE.match(line):  # the HTTP server's state now (the limit: the file limit's)
            out.append(re.sub(r" \S+$", " <now>", line))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is required (apt-get install prometheus); .ci/run installs it"
    return path


def test_golden_exposition_and_promtool(exporter_process: Callable[..., ExporterProcess]) -> None:
    proc = exporter_process(*STATIC)
    proc.wait_ready()
    status, headers, body = proc.get("/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(normalise(text))
    assert normalise(text) == GOLDEN.read_text()
    lint = subprocess.run(
        [promtool(), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert lint.stdout == "" and lint.stderr == "", lint.stdout + lint.stderr


def test_http_surface(exporter_process: Callable[..., ExporterProcess]) -> None:
    proc = exporter_process(*STATIC)
    proc.wait_ready()
    assert proc.get("/-/healthy")[0] == 200
    status, headers, body = proc.get(
        "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.decode().rstrip().endswith("# EOF")
    assert "inference_gpu_busy_seconds_total{" in body.decode()
    status, headers, body = proc.get("/metrics", {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert "inference_nvml_up 1.0" in gzip.decompress(body).decode()
    status, _, body = proc.get("/metrics?name[]=inference_nvml_up")
    lines = [line for line in body.decode().splitlines() if not line.startswith("#")]
    assert lines == ["inference_nvml_up 1.0"]
    status, headers, body = proc.get("/")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert 'href="/metrics"' in page and "0.1.0" in page
    assert "<td>nvml</td><td>ok</td>" in page and "<td>cpu</td><td>ok</td>" in page
    assert proc.get("/nope")[0] == 404


def test_graceful_shutdown_within_five_seconds(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    proc = exporter_process(*STATIC)
    proc.wait_ready()
    took = proc.terminate()
    assert proc.proc.returncode == 0
    assert took < 5
    messages = [e["msg"] for e in proc.logs]
    assert "stopped" in messages


def test_start_up_heap_is_frozen_after_the_first_collection(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    """Full garbage collections must not walk the start-up heap (they stalled scrapes ~25 ms)."""
    proc = exporter_process(*STATIC)
    proc.wait_ready()
    frozen = re.compile(r"start-up heap frozen: (\d+) objects")
    proc.wait_for(lambda: any(frozen.search(e.get("msg", "")) for e in proc.logs), timeout=10)
    messages = [e["msg"] for e in proc.logs]
    count = next(int(m.group(1)) for m in map(frozen.search, messages) if m)
    assert count > 10_000  # the imports alone leave tens of thousands of objects
    ready = messages.index("ready: first collection done")
    assert ready < next(i for i, m in enumerate(messages) if frozen.search(m))


def _trace_with(tmp_path: Path, gpu: int, record: int, **fields: object) -> Path:
    lines = TRACE.read_text().splitlines()
    out = []
    seen = -1
    for line in lines:
        entry = json.loads(line)
        if entry.get("gpu") == gpu:
            seen += 1
            if seen == record:
                entry.update(fields)
        out.append(json.dumps(entry))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def test_hanging_nvml_call_does_not_hold_the_scrape(
    tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    trace = _trace_with(tmp_path, gpu=1, record=0, hang_s=60)
    proc = exporter_process(
        "--gpu.replay-file", str(trace), "--path.procfs", str(PROC), "--scrape.timeout", "500ms"
    )
    proc.wait_ready(timeout=10)

    def hung_call_past_its_deadline() -> bool:
        text = proc.get("/metrics")[2].decode()
        return metric_value(text, "inference_scrape_collector_success", {"collector": "nvml"}) == 0

    proc.wait_for(hung_call_past_its_deadline, timeout=10)
    start = time.monotonic()
    status, _, body = proc.get("/metrics")
    took = time.monotonic() - start
    text = body.decode()
    assert status == 200
    assert took < 1.0
    assert metric_value(text, "inference_scrape_collector_success", {"collector": "nvml"}) == 0
    assert metric_value(text, "inference_scrape_collector_success", {"collector": "cpu"}) == 1
    gpu0 = json.loads(TRACE.read_text().splitlines()[0])["gpus"][0]["uuid"]
    gpu1 = json.loads(TRACE.read_text().splitlines()[0])["gpus"][1]["uuid"]
    assert metric_value(text, "inference_gpu_up", {"gpu": "1", "uuid": gpu1}) == 0
    assert metric_value(text, "inference_gpu_power_watts", {"gpu": "1", "uuid": gpu1}) is None
    assert metric_value(text, "inference_gpu_up", {"gpu": "0", "uuid": gpu0}) == 1
    # shutdown stays within budget even with a call hanging in the driver
    assert proc.terminate() < 5


def test_gpu_lost_mid_run(tmp_path: Path, exporter_process: Callable[..., ExporterProcess]) -> None:
    trace = _trace_with(tmp_path, gpu=0, record=2, error="GPU_IS_LOST")
    proc = exporter_process(
        "--gpu.replay-file", str(trace), "--path.procfs", str(PROC), "--gpu.poll-interval", "500ms"
    )
    proc.wait_ready()
    uuid0 = json.loads(TRACE.read_text().splitlines()[0])["gpus"][0]["uuid"]
    uuid1 = json.loads(TRACE.read_text().splitlines()[0])["gpus"][1]["uuid"]

    def lost() -> bool:
        text = proc.get("/metrics")[2].decode()
        return metric_value(text, "inference_gpu_up", {"gpu": "0", "uuid": uuid0}) == 0

    proc.wait_for(lost, timeout=15)
    text = proc.get("/metrics")[2].decode()
    assert metric_value(text, "inference_gpu_up", {"gpu": "1", "uuid": uuid1}) == 1
    assert metric_value(text, "inference_nvml_up") == 1

    def back() -> bool:
        text = proc.get("/metrics")[2].decode()
        return metric_value(text, "inference_gpu_up", {"gpu": "0", "uuid": uuid0}) == 1

    proc.wait_for(back, timeout=15)
    assert any("GPU_IS_LOST" in e["msg"] for e in proc.logs)


@pytest.mark.skipif(
    Path("/dev/nvidiactl").exists(),
    reason="this machine has an NVIDIA driver; the test needs one without (as in CI)",
)
def test_without_nvml_the_rest_still_works(
    exporter_process: Callable[..., ExporterProcess],
) -> None:
    proc = exporter_process("--path.procfs", str(PROC))
    proc.wait_ready(timeout=10)
    status, _, body = proc.get("/metrics")
    text = body.decode()
    assert status == 200
    assert metric_value(text, "inference_nvml_up") == 0
    assert metric_value(text, "inference_scrape_collector_success", {"collector": "nvml"}) == 0
    assert metric_value(text, "inference_scrape_collector_success", {"collector": "cpu"}) == 1
    assert metric_value(text, "inference_cpu_online") == 2
    proc.wait_for(lambda: any("NVML initialisation failed" in e["msg"] for e in proc.logs))
