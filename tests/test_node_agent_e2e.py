"""The node layout end to end: the real node agent, two real sidecars, a real Prometheus
evaluating the ``node`` rule profile.

The node agent is the real CLI (``support.node_agent``: only the NVML library is the stand-in,
with a live utilisation buffer) with the ``nvml``, ``cpu`` and ``podresources`` collectors,
asking the fake kubelet (:mod:`support.kubelet`, the real PodResources v1 protocol on a unix
socket) which pod holds each GPU. Two sidecars, without NVML, poll fake vLLM engines whose
queues grow: ``serving/vllm-0`` holds GPU 0 (10 % busy: starved), ``serving/vllm-7`` GPU 7
(80 %: busy). Prometheus scrapes the sidecars with their pod's ``namespace`` and ``pod`` as
target labels (as a PodMonitor gives them) and the agent with ``honor_labels``, and evaluates the
node profile generated with windows of seconds (``for`` 5 s) every second.
``InferenceGPUStarvedQueueGrowing`` must fire for vllm-0 and never for vllm-7.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.fakeengine import FakeEngine
from support.kubelet import FakeKubelet, device_plugin_node, device_plugin_offer, serve
from support.paths import ROOT
from support.process import ExporterProcess
from support.promstack import PROC, SIDECAR_FLAGS, Feeder, Load, Stack, address, wait_until

from exporter.lab import processes
from exporter.signatures.__main__ import profile_files
from exporter.signatures.site import parse_config

STARVED = "InferenceGPUStarvedQueueGrowing"
SITE = {
    "windows": {
        "rate": "10s",
        "latency": "10s",
        "queue_trend": "20s",
        "pulsing": "20s",
        "xid": "20s",
        "baseline": "60s",
    },
    "signatures": {STARVED: {"for": "5s"}},
}
SIDECARS = {"vllm-0": "starved", "vllm-7": "busy"}


def node_rules(tmp: Path) -> list[Path]:
    """The node profile with windows of seconds, as a site would generate its own."""
    files = profile_files(parse_config(SITE, "node"), tmp / "rules")
    (tmp / "rules").mkdir()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return sorted(files)


def prometheus_config(
    sidecars: dict[str, str], agent: str, rule_files: list[Path]
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "inference-bottleneck-exporter",
                "static_configs": [
                    {"targets": [target], "labels": {"namespace": "serving", "pod": pod}}
                    for pod, target in sidecars.items()
                ],
            },
            {
                "job_name": "inference-bottleneck-exporter-node",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [agent],
                        "labels": {"namespace": "monitoring", "pod": "ibe-node-7xk2p"},
                    }
                ],
            },
        ],
    }


def test_starved_pod_fires_in_the_node_layout(
    tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    started = time.monotonic()
    stack = Stack()
    kubelet = FakeKubelet(device_plugin_node(), device_plugin_offer())
    socket = tmp_path / "kubelet.sock"
    with serve(kubelet, socket):
        try:
            agent = ExporterProcess(
                [
                    "--web.listen-address=127.0.0.1:0",
                    "--collector.podresources",
                    f"--podresources.socket={socket}",
                    "--podresources.interval=1s",
                    "--podresources.deadline=500ms",
                    "--no-collector.engine",
                    "--no-collector.tokenizer",
                    "--no-collector.process",
                    "--no-collector.model",
                    "--gpu.poll-interval=1s",
                    f"--path.procfs={PROC}",
                ],
                {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
                module="support.node_agent",
            )
            stack.add(agent.close)
            agent.wait_ready()
            engines = {pod: FakeEngine.run_in_thread() for pod in SIDECARS}
            for engine in engines.values():
                stack.add(engine.stop)
            # Both queues grow alike: only the GPU each pod holds tells them apart.
            feeder = Feeder([(e, Load(queue=1, queue_growth=1.0)) for e in engines.values()])
            stack.add(feeder.stop)
            sidecars = {}
            for pod, engine in engines.items():
                proc = exporter_process(
                    "--engine.url", engine.url + "/metrics", *SIDECAR_FLAGS, "--no-collector.nvml"
                )
                proc.wait_ready()
                sidecars[pod] = address(proc)
            prometheus = processes.start_prometheus(
                tmp_path,
                prometheus_config(sidecars, address(agent), node_rules(tmp_path)),
                args=("--log.level=warn",),
            )
            stack.add(prometheus.stop)

            def alerts() -> dict[str, str]:
                found = prometheus.query(f'ALERTS{{alertname="{STARVED}"}}')
                return {a["metric"]["pod"]: a["metric"]["alertstate"] for a in found}

            seen: list[dict[str, str]] = []

            def fired() -> bool:
                seen.append(alerts())
                return seen[-1].get("vllm-0") == "firing"

            wait_until(fired, 75, "the starved pod's alert firing")
            # Each pod's GPU utilisation is its own GPU's, as the agent reads it.
            util = {
                r["metric"]["pod"]: float(r["value"][1])
                for r in prometheus.query("inference:gpu_utilization:mean10s")
            }
            assert util["vllm-0"] < 0.2 and util["vllm-7"] > 0.7, util
            time.sleep(2)  # a few more evaluations: the busy pod stays quiet
            seen.append(alerts())
            assert all("vllm-7" not in state for state in seen), seen
            assert seen[-1] == {"vllm-0": "firing"}
        finally:
            stack.close()
    assert time.monotonic() - started < 90
