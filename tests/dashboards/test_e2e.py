"""End to end: every dashboard query against a real Prometheus scraping the real exporter.

The exporter replays the bundled 2-GPU NVML trace, polls a fake vLLM whose counters and
histograms grow while the test runs, probes its tokenizer, follows a stand-in engine process on
the real ``/proc`` and reads a model directory (Llama-3.1-8B's ``config.json``) for the
roofline panels. Prometheus (``make tools``; never skipped) scrapes it every
second twice - once as a PodMonitor would (with ``namespace`` and ``pod``) and once as a
static target (without them) - evaluates the rule pack every second, and answers every panel
query for three settings of the template variables.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fakeengine import FakeEngine, FakeEngineThread
from support.global_interval import at_global_interval
from support.paths import FIXTURES, TRACE
from support.process import ExporterProcess

from exporter.lab import processes
from exporter.lab.processes import Server

ROOT = Path(__file__).resolve().parent.parent.parent
RULES = ROOT / "alert_rules"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_DIR = FIXTURES / "models" / "meta-llama__Llama-3.1-8B"
JOB = "inference-bottleneck-exporter"
POD_LABELS = {"namespace": "inference", "pod": "vllm-0"}
DEADLINE_S = 60.0

# Targets that legitimately return nothing in this setup, with the reason.
NO_DATA = {
    ("ibe-inference-bottlenecks", "Pool queue by stage", "A"): (
        "the engine is vLLM, whose queue has no stages (SGLang's prealloc and transfer queues)"
    ),
    ("ibe-inference-bottlenecks", "KV-cache transfer time", "C"): (
        "the engine is vLLM; the upper bound is a router's (Dynamo's KV router)"
    ),
    ("ibe-inference-bottlenecks", "P/D routing decisions", "A"): (
        "the engine is vLLM; the decisions are a router's (llm-d's endpoint picker)"
    ),
    ("ibe-exporter-health", "Poll and probe failures", "C"): (
        "no engine metric exceeds --engine.max-series, so no series is dropped"
    ),
    ("ibe-gpu-detail", "Xid errors", "A"): (
        "the replay trace has no Xid event; the new-Xid signal appears with the first one"
    ),
    ("ibe-gpu-detail", "GPU utilisation per GPU: the device and the engine's own share", "B"): (
        "no other tenant's process shares the replay trace's GPUs; the engine's own share "
        "exists on a shared GPU only"
    ),
    ("ibe-inference-bottlenecks", "Tokenizer latency vs inter-token latency", "C"): (
        "the engine is vLLM, which reports no tokenizer histogram (SGLang and TGI do); the "
        "probe's is line A"
    ),
    ("ibe-inference-bottlenecks", "Pool queues: prefill and decode", "A"): (
        "the engine runs colocated (no role): no prefill pool"
    ),
    ("ibe-inference-bottlenecks", "Pool queues: prefill and decode", "B"): (
        "the engine runs colocated (no role): no decode pool"
    ),
}

# A test-only alert with a signature label, firing at once for each exporter target, so that
# the ALERTS panels have something to show (the pack's own alerts wait out their `for`).
TEST_ALERT = {
    "groups": [
        {
            "name": "dashboards-e2e",
            "rules": [
                {
                    "alert": "DashboardsE2EQueue",
                    "expr": f'max by (namespace, pod, instance, job) (up{{job=~".*{JOB}.*"}}) == 1',
                    "labels": {"severity": "info", "signature": "queue"},
                }
            ],
        }
    ]
}

_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _histogram(name: str, count: float, mean: float) -> str:
    """A vLLM histogram whose observations all equal ``mean`` (one bucket jump)."""
    labels = f'engine="0",model_name="{MODEL}"'
    lines = [f"# HELP {name} test", f"# TYPE {name} histogram"]
    for bound in _BUCKETS:
        inside = count if mean <= bound else 0.0
        lines.append(f'{name}_bucket{{engine="0",le="{bound}",model_name="{MODEL}"}} {inside}')
    lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} {count}')
    lines.append(f"{name}_count{{{labels}}} {count}")
    lines.append(f"{name}_sum{{{labels}}} {count * mean}")
    return "\n".join(lines)


def vllm_metrics(elapsed: float) -> str:
    """What a busy vLLM exports ``elapsed`` seconds into the test (two requests a second)."""
    labels = f'engine="0",model_name="{MODEL}"'
    finished = 10 + 2 * elapsed
    gauges = {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 1.0 + int(elapsed) % 3,
        "vllm:kv_cache_usage_perc": 0.42,
    }
    # the KV pool (the roofline's live KV bytes): 12500 blocks of 16 tokens
    info = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="12500"} 1.0'

    counters = {
        "vllm:prompt_tokens_total": 5000 + 1000 * elapsed,
        "vllm:generation_tokens_total": 2000 + 100 * elapsed,
        # a disaggregated vLLM's NixlConnector: one failed KV transfer every ten seconds
        "vllm:nixl_num_failed_transfers_total": 1 + elapsed / 10,
    }
    parts = [f"# HELP vllm:cache_config_info test\n# TYPE vllm:cache_config_info gauge\n{info}"]
    for name, value in gauges.items():
        parts.append(f"# HELP {name} test\n# TYPE {name} gauge\n{name}{{{labels}}} {value}")
    for name, value in counters.items():
        parts.append(f"# HELP {name} test\n# TYPE {name} counter\n{name}{{{labels}}} {value}")
    parts += [
        _histogram("vllm:e2e_request_latency_seconds", finished, 4.0),
        _histogram("vllm:request_queue_time_seconds", finished, 0.5),
        _histogram("vllm:request_prefill_time_seconds", finished, 0.3),
        _histogram("vllm:request_decode_time_seconds", finished, 2.5),
        _histogram("vllm:time_to_first_token_seconds", finished, 0.8),
        _histogram("vllm:inter_token_latency_seconds", 100 * elapsed, 0.025),
        # one KV-cache transfer per request, 64 MiB in 50 ms
        _histogram("vllm:nixl_xfer_time_seconds", finished, 0.05),
        _histogram("vllm:nixl_bytes_transferred", finished, 64 * 2**20),
    ]
    return "\n".join(parts) + "\n"


@pytest.fixture(scope="module")
def busy_engine() -> Iterator[FakeEngineThread]:
    """The fake vLLM, its counters advancing every 200 ms; tokenizing takes ~10 ms."""
    with FakeEngine.run_in_thread(metrics_body=vllm_metrics(0), per_token_latency=0.00002) as fake:
        stop = threading.Event()
        start = time.monotonic()

        def advance() -> None:
            while not stop.wait(0.2):
                fake.engine.metrics_body = vllm_metrics(time.monotonic() - start)

        ticker = threading.Thread(target=advance, daemon=True)
        ticker.start()
        try:
            yield fake
        finally:
            stop.set()
            ticker.join(5)


@pytest.fixture(scope="module")
def engine_process() -> Iterator[str]:
    """A process standing in for the engine's front-end; yields a regex matching only it."""
    marker = f"ibe-dashboards-e2e-engine-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)", marker],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield marker
    finally:
        processes.stop_process(proc, sig=signal.SIGKILL)


def start_prometheus(workdir: Path, exporter: str) -> Server:
    """A real Prometheus on loopback, with the rule pack, scraping one exporter twice."""
    (workdir / "e2e-alert.yaml").write_text(yaml.safe_dump(TEST_ALERT))
    config = {
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        },
        "rule_files": [
            *map(
                str,
                at_global_interval(
                    [RULES / "recording_rules.yaml", RULES / "alerts.yaml"], workdir / "rules"
                ),
            ),
            str(workdir / "e2e-alert.yaml"),
        ],
        "scrape_configs": [
            # as a PodMonitor's target: job "<namespace>/<podmonitor>", namespace and pod
            {
                "job_name": f"{POD_LABELS['namespace']}/{JOB}",
                "static_configs": [{"targets": [exporter], "labels": POD_LABELS}],
            },
            # as a static target: no namespace, no pod
            {"job_name": JOB, "static_configs": [{"targets": [exporter]}]},
        ],
    }
    return processes.start_prometheus(workdir, config)


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    busy_engine: FakeEngineThread,
    engine_process: str,
) -> Iterator[Server]:
    """The exporter and Prometheus, started once for the module's tests."""
    exporter = ExporterProcess(
        [
            "--web.listen-address",
            "127.0.0.1:0",
            "--gpu.replay-file",
            str(TRACE),
            "--gpu.poll-interval",
            "500ms",
            "--engine.url",
            busy_engine.url + "/metrics",
            "--engine.poll-interval",
            "500ms",
            "--tokenizer.probe-interval",
            "1s",
            "--process.match",
            engine_process,
            # the served model's facts for the roofline panels
            "--model.path",
            str(MODEL_DIR),
        ]
    )
    prometheus: Server | None = None
    try:
        exporter.wait_ready()
        workdir = tmp_path_factory.mktemp("prometheus")
        prometheus = start_prometheus(workdir, exporter.base.removeprefix("http://"))
        yield prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.close()


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def _problems(
    prometheus: Server, panel_queries: list[Any], variants: dict[str, dict[str, str]]
) -> list[str]:
    """Queries that should have data and have none (or only NaN/Inf), per variable setting."""
    problems = []
    for variant, values in variants.items():
        for query in panel_queries:
            if query.key in NO_DATA:
                continue
            result = prometheus.query(query.render(values))
            if not _finite(result):
                problems.append(f"[{variant}] {query}: {result or 'no data'}")
    # The "Queue" family stat counts the test alert: one per scrape target under "All".
    queue = next(q for q in panel_queries if q.panel == "Queue")
    counted = prometheus.query(queue.render(variants["all"]))
    if [float(sample["value"][1]) for sample in counted] != [2.0]:
        problems.append(f"{queue}: {counted}, expected 2 firing test alerts")
    return problems


def test_every_panel_query_returns_data(
    stack: Server, panel_queries: list[Any], variants: dict[str, dict[str, str]]
) -> None:
    keys = {query.key for query in panel_queries}
    assert set(NO_DATA) <= keys, f"stale NO_DATA entries: {set(NO_DATA) - keys}"

    deadline = time.monotonic() + DEADLINE_S
    problems = _problems(stack, panel_queries, variants)
    while problems and time.monotonic() < deadline:
        time.sleep(1.0)
        problems = _problems(stack, panel_queries, variants)
    assert not problems, "panels without data:\n" + "\n".join(problems)

    # The listed exceptions are really empty (otherwise the list is out of date).
    for query in panel_queries:
        if query.key in NO_DATA:
            assert not stack.query(query.render(variants["all"])), f"{query} has data now"


def test_variables_find_their_values(stack: Server, variable_queries: list[Any]) -> None:
    expected = {
        "namespace": {POD_LABELS["namespace"]},
        "pod": {POD_LABELS["pod"]},
        "model": {MODEL},
        "gpu": {"0", "1"},
    }
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = {}
        for variable in variable_queries:
            selector = variable.selector.replace("$namespace", ".*").replace("$pod", ".*")
            answer = stack.get_json("/api/v1/series", **{"match[]": selector})
            values = {s[variable.label] for s in answer["data"] if variable.label in s}
            found[(variable.uid, variable.name)] = values
        wrong = {key: v for key, v in found.items() if v != expected[key[1]]}
        if not wrong or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert not wrong, f"variables with unexpected values: {wrong}"
