"""The sidecar inject writes, run as the container would run it: the real exporter with the
injected arguments reads the engine it found (a fake vLLM on a loopback port)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import yaml
from support.fakeengine import FakeEngine, FakeEngineThread
from support.paths import FIXTURES, ROOT
from support.process import ExporterProcess

SIDECAR = "inference-bottleneck-exporter"


@pytest.fixture
def engine() -> Iterator[FakeEngineThread]:
    body = (FIXTURES / "engines" / "vllm.txt").read_text(encoding="utf-8")
    with FakeEngine.run_in_thread(metrics_body=body, flavour="vllm") as running:
        yield running


def test_the_injected_sidecar_reads_the_engine(
    engine: FakeEngineThread, exporter_process: Callable[..., ExporterProcess]
) -> None:
    port = urlsplit(engine.url).port
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.10.1",
                            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"],
                            "args": ["--port", str(port)],
                        }
                    ]
                },
            },
        },
    }
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "inject"],
        input=yaml.safe_dump(deployment),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    pod = yaml.safe_load(done.stdout)["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["containers"] if c["name"] == SIDECAR]
    # The pod's port is the container's; here the test's loopback port takes its place.
    args = [a for a in sidecar["args"] if not a.startswith("--web.listen-address")]
    proc = exporter_process(
        *args, "--no-collector.process", "--path.procfs", str(FIXTURES / "proc" / "two-cpu")
    )
    proc.wait_ready()

    def engine_up() -> bool:
        text = proc.get("/metrics")[2].decode()
        return 'inference_engine_up{engine="vllm"} 1.0' in text

    proc.wait_for(engine_up, timeout=30)
    assert proc.get(sidecar["readinessProbe"]["httpGet"]["path"])[0] == 200
    assert proc.get(sidecar["livenessProbe"]["httpGet"]["path"])[0] == 200
