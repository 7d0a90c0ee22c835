"""The gateway signature end to end: llm-d's endpoint picker (its flow-control exposition served
on loopback), the real sidecar reading it (``--engine.type llmd-epp``), a vLLM of the pool's
model behind a second sidecar with an idle GPU (the replay trace at a fifth of its utilisation),
and a real Prometheus with the pack.

The pack is the ``fast`` profile of a site config whose windows are one minute (six seconds
once scaled) and whose gateway alert fires without a ``for``: the picker's 37 queued requests
become the engine's queue, and ``InferenceGatewayStaleEndpoints`` fires for the picker's target
while the pool's GPUs idle. Static targets carry no ``namespace``: the pool is its model alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from support.fakeengine import FakeEngine, FakeEngineThread
from support.paths import FIXTURES
from support.process import ExporterProcess
from support.promstack import SIDECAR_FLAGS, Stack, address, start_prometheus, trace, wait_until

from exporter.signatures.__main__ import main as generate

EPP = (FIXTURES / "engines" / "llmd-epp-flow-control-handwritten.txt").read_text(encoding="utf-8")
QWEN = "Qwen/Qwen3-0.6B"
SITE = {
    "windows": {name: "1m" for name in ("rate", "latency", "queue_trend", "pulsing", "xid")},
    "signatures": {"InferenceGatewayStaleEndpoints": {"for": "0s"}},
}
# A vLLM serving the pool's model: four requests running, nothing waiting of its own.
VLLM = f"""\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{QWEN}"}} 4
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{QWEN}"}} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{QWEN}"}} 0.1
"""


@pytest.fixture
def stack() -> Iterator[Stack]:
    started = Stack()
    try:
        yield started
    finally:
        started.close()


def engine(stack: Stack, body: str) -> FakeEngineThread:
    server = FakeEngine.run_in_thread()
    stack.add(server.stop)
    server.engine.metrics_body = body
    return server


def test_a_gateway_gating_on_stale_endpoints_fires(
    tmp_path: Path, stack: Stack, exporter_process: Callable[..., ExporterProcess]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE), encoding="utf-8")
    rules = tmp_path / "rules"
    assert generate(["--config", str(site), "--profile", "fast", "--out", str(rules)]) == 0

    picker = engine(stack, EPP)
    gateway = exporter_process(
        "--engine.url",
        picker.url + "/metrics",
        "--engine.type",
        "llmd-epp",
        "--no-collector.nvml",
        *SIDECAR_FLAGS,
    )
    vllm = engine(stack, VLLM)
    idle = trace(tmp_path, utilization=0.2)
    model_server = exporter_process(
        "--engine.url", vllm.url + "/metrics", "--gpu.replay-file", str(idle), *SIDECAR_FLAGS
    )
    gateway.wait_ready()
    model_server.wait_ready()
    prometheus = start_prometheus(
        tmp_path,
        [address(gateway), address(model_server)],
        [rules / "recording_rules.yaml", rules / "alerts.yaml"],
    )
    stack.add(prometheus.stop)

    # The picker's queue is the pool's: its one engine counts all 37 requests as its own.
    def engine_queue() -> bool:
        found = prometheus.query("inference:queue_depth:sum")
        return [(r["metric"]["instance"], r["value"][1]) for r in found] == [
            (address(model_server), "37")
        ]

    wait_until(engine_queue, 30, "the engine's share of the gateway's queue")
    firing = 'ALERTS{alertname="InferenceGatewayStaleEndpoints",alertstate="firing"}'
    wait_until(lambda: bool(prometheus.query(firing)), 40, "InferenceGatewayStaleEndpoints")
    (alert,) = prometheus.query(firing)
    labels = alert["metric"]
    assert labels["instance"] == address(gateway) and labels["model"] == QWEN
    assert labels["severity"] == "critical" and labels["signature"] == "queue"
    (util,) = prometheus.query("inference_gateway:pool_gpu_utilization:mean6s")
    assert float(util["value"][1]) < 0.5
