"""``inject`` as a user runs it: the real CLI process over manifests (hand-written here; the
stacks' own manifests are in test_stacks.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.chart import KUBE_LATEST
from support.paths import ROOT

from exporter.inject.endpoint import find_engine

SIDECAR = "inference-bottleneck-exporter"

DEPLOYMENT = """\
# hand-written: a Deployment of vLLM next to its Service
apiVersion: v1
kind: Service
metadata: {name: vllm}
spec:
  ports: [{port: 8000, name: http}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm
  annotations: {zeta: "1", alpha: "2"}
spec:
  replicas: 2
  selector:
    matchLabels: {app: vllm}
  template:
    metadata:
      labels: {app: vllm}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.10.1
          command: ["/bin/sh", "-c"]
          args: ["vllm serve Qwen/Qwen2.5-0.5B-Instruct --port 8001 --max-model-len 4096"]
          ports: [{containerPort: 8001, name: http}]
"""


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "inject", *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def _template_spec(docs: list[Any]) -> dict[str, Any]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def test_stdin_to_stdout_adds_the_sidecar_and_keeps_everything_else() -> None:
    result = run(stdin=DEPLOYMENT)
    assert result.returncode == 0, result.stderr
    before = list(yaml.safe_load_all(DEPLOYMENT))
    after = list(yaml.safe_load_all(result.stdout))
    assert after[0] == before[0]
    # Key order of the input is kept.
    assert list(after[1]["metadata"]["annotations"]) == ["zeta", "alpha"]
    assert list(after[1]) == list(before[1])
    spec = _template_spec(after)
    vllm, sidecar = spec["containers"]
    assert vllm == before[1]["spec"]["template"]["spec"]["containers"][0]
    assert sidecar["name"] == SIDECAR
    assert "--engine.url=http://127.0.0.1:8001/metrics" in sidecar["args"]
    assert "--no-collector.nvml" in sidecar["args"]
    assert spec["shareProcessNamespace"] is True
    labels = after[1]["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "vllm", "inference-bottleneck-exporter/sidecar": "true"}


def test_a_second_run_changes_nothing() -> None:
    once = run(stdin=DEPLOYMENT).stdout
    twice = run(stdin=once)
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout == once
    diff = run("--dry-run", stdin=once)
    assert diff.returncode == 0 and diff.stdout == ""


def test_dry_run_prints_a_unified_diff_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "vllm.yaml"
    path.write_text(DEPLOYMENT)
    result = run("--dry-run", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"--- a{path}\n+++ b{path}\n@@ ")
    assert re.search(r"^\+ +- name: inference-bottleneck-exporter$", result.stdout, re.M)
    assert path.read_text() == DEPLOYMENT


def test_native_sidecar_from_the_clusters_version() -> None:
    for args, native in (
        ((), False),
        (("--kube-version", "1.29"), True),
        (("--native-sidecar",), True),
        (("--kube-version", "v1.31.2", "--no-native-sidecar"), False),
    ):
        result = run(*args, stdin=DEPLOYMENT)
        assert result.returncode == 0, result.stderr
        spec = _template_spec(list(yaml.safe_load_all(result.stdout)))
        names = [c["name"] for c in spec.get("initContainers", [])]
        assert (names == [SIDECAR]) == native, args
        if native:
            assert spec["initContainers"][0]["restartPolicy"] == "Always"
            assert [c["name"] for c in spec["containers"]] == ["vllm"]


def test_switching_to_a_native_sidecar_moves_the_container() -> None:
    once = run(stdin=DEPLOYMENT).stdout
    moved = run("--native-sidecar", stdin=once)
    spec = _template_spec(list(yaml.safe_load_all(moved.stdout)))
    assert [c["name"] for c in spec["containers"]] == ["vllm"]
    assert [c["name"] for c in spec["initContainers"]] == [SIDECAR]
    assert run("--native-sidecar", stdin=moved.stdout).stdout == moved.stdout


def test_in_place_writes_every_file_or_none(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(DEPLOYMENT)
    clash = DEPLOYMENT.replace("name: http}]\n", "name: metrics}]\n").replace(
        "[{containerPort: 8001, name: http}]", "[{containerPort: 8001, name: metrics}]"
    )
    bad.write_text(clash)
    result = run("--in-place", str(good), str(bad))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "port named 'metrics'" in result.stderr
    assert good.read_text() == DEPLOYMENT and bad.read_text() == clash
    assert run("--in-place", str(good)).returncode == 0
    assert SIDECAR in good.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("kind: Service\nmetadata: {name: x}\n", "no pod template found in Service/x"),
        ("a: [unclosed\n", "not YAML"),
        ("- just\n- a list\n", "not a Kubernetes object"),
        (
            DEPLOYMENT.replace(
                "containers:\n        - name: vllm", "containers: 3\n        # - name: vllm"
            ).split("          image")[0],
            "/spec/template/spec/containers is not a list of containers",
        ),
    ],
)
def test_input_it_cannot_place_a_sidecar_in_is_one_line_and_exit_2(
    stdin: str, message: str
) -> None:
    result = run(stdin=stdin)
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_bad_flags_are_one_line() -> None:
    for args in (
        ("--gpu", "some"),
        ("--kube-version", "1.28", "--native-sidecar"),
        ("--in-place",),
    ):
        result = run(*args, stdin=DEPLOYMENT)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") <= 2


def test_an_explicit_engine_url_places_a_sidecar_without_a_known_engine() -> None:
    custom = DEPLOYMENT.replace("vllm/vllm-openai:v0.10.1", "example/own-server:1").replace(
        "vllm serve Qwen/Qwen2.5-0.5B-Instruct", "own-server"
    )
    assert run(stdin=custom).returncode == 2
    result = run("--engine-url", "http://127.0.0.1:9000/metrics", stdin=custom)
    assert result.returncode == 0, result.stderr
    sidecar = _template_spec(list(yaml.safe_load_all(result.stdout)))["containers"][1]
    assert "--engine.url=http://127.0.0.1:9000/metrics" in sidecar["args"]


def test_gpu_all_gives_the_sidecar_nvml() -> None:
    result = run("--gpu", "all", stdin=DEPLOYMENT)
    sidecar = _template_spec(list(yaml.safe_load_all(result.stdout)))["containers"][1]
    assert "--no-collector.nvml" not in sidecar["args"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in sidecar["env"]


@pytest.mark.parametrize(
    ("container", "engine", "url"),
    [
        ({"image": "vllm/vllm-openai:v0.10.1"}, "vllm", "http://127.0.0.1:8000/metrics"),
        (
            {
                "image": "lmsysorg/sglang:v0.5.2",
                "command": ["python3", "-m", "sglang.launch_server", "--port=30001"],
            },
            "sglang",
            "http://127.0.0.1:30001/metrics",
        ),
        (
            {"image": "ghcr.io/huggingface/text-generation-inference:3.3.4"},
            "tgi",
            "http://127.0.0.1:80/metrics",
        ),
        (
            {
                "image": "ghcr.io/huggingface/text-generation-inference:3.3.4",
                "args": ["--port", "8080"],
            },
            "tgi",
            "http://127.0.0.1:8080/metrics",
        ),
        (
            {
                "image": "nvcr.io/nvidia/tritonserver:25.08-vllm-python-py3",
                "command": ["tritonserver", "--model-repository=/models"],
            },
            "triton",
            "http://127.0.0.1:8002/metrics",
        ),
        (
            {"image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.4"},
            "nim",
            "http://127.0.0.1:8000/v1/metrics",
        ),
        (
            {
                "image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.4",
                "env": [{"name": "NIM_SERVER_PORT", "value": "8080"}],
            },
            "nim",
            "http://127.0.0.1:8080/v1/metrics",
        ),
        (
            {
                "image": "nvcr.io/nvidia/tensorrt-llm/release:1.0.0",
                "command": ["trtllm-serve", "Qwen/Qwen3-8B"],
            },
            "trtllm",
            "http://127.0.0.1:8000/prometheus/metrics",
        ),
        (
            {
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.5.0",
                "command": ["python3", "-m", "dynamo.frontend", "--http-port", "8787"],
            },
            "dynamo",
            "http://127.0.0.1:8787/metrics",
        ),
        (
            {
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.5.0",
                "command": ["python3", "-m", "dynamo.vllm", "--model", "Qwen/Qwen3-0.6B"],
            },
            "dynamo",
            "http://127.0.0.1:9090/metrics",
        ),
        (
            {
                "image": "openmmlab/lmdeploy:v0.10.0-cu12",
                "args": ["lmdeploy", "serve", "api_server", "m"],
            },
            "lmdeploy",
            "http://127.0.0.1:23333/metrics",
        ),
        (
            {
                "image": "ghcr.io/ggml-org/llama.cpp:server-cuda",
                "args": ["-m", "/models/m.gguf", "--metrics"],
            },
            "llamacpp",
            "http://127.0.0.1:8080/metrics",
        ),
        (
            {
                "image": "ghcr.io/llm-d/llm-d-cuda:v0.3.0",
                "command": ["vllm", "serve", "m", "--port", "8200"],
            },
            "vllm",
            "http://127.0.0.1:8200/metrics",
        ),
        # Shell-wrapped: a script whose lines end in a backslash, the port quoted.
        (
            {
                "image": "example.com/aibrix/vllm-openai:v0.10.0",
                "command": ["sh", "-c"],
                "args": ['vllm serve \\\n--host "0.0.0.0" \\\n--port "8100" \\\n--model /m'],
            },
            "vllm",
            "http://127.0.0.1:8100/metrics",
        ),
        # ... its port a variable of the container's environment, the engine behind exec.
        (
            {
                "image": "lmsysorg/sglang:v0.5.9",
                "command": ["/bin/bash", "-lc"],
                "args": ["cd /w && exec python3 -m sglang.launch_server --port ${PORT:-30000}"],
                "env": [{"name": "PORT", "value": "30001"}],
            },
            "sglang",
            "http://127.0.0.1:30001/metrics",
        ),
        (
            {
                "image": "example.com/own",
                "command": ["sh", "-c", "nice -n 5 llama-server -m /m.gguf --port $(LLAMA_PORT)"],
                "env": [{"name": "LLAMA_PORT", "value": "8081"}],
            },
            "llamacpp",
            "http://127.0.0.1:8081/metrics",
        ),
    ],
)
def test_the_engine_is_found_from_image_command_env_and_ports(
    container: dict[str, Any], engine: str, url: str
) -> None:
    found = find_engine(
        [{"name": "side", "image": "busybox"}, {"name": "engine", **container}], skip=SIDECAR
    )
    assert found is not None
    assert (found.container, found.engine, found.url) == ("engine", engine, url)


def test_another_program_in_an_engines_image_is_no_engine() -> None:
    planner = {
        "name": "planner",
        "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1",
        "command": ["python3", "-m", "dynamo.planner.planner_sla"],
        "ports": [{"name": "metrics", "containerPort": 9085}],
    }
    assert find_engine([planner], skip=SIDECAR) is None
    frontend = {"name": "main", "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1"}
    found = find_engine([planner, frontend], skip=SIDECAR)
    assert found is not None and found.container == "main"


def test_no_engine_in_a_router_or_the_sidecar_itself() -> None:
    router = {
        "name": "router",
        "image": "lmcache/lmstack-router:latest",
        "args": ["--port", "8000"],
    }
    assert find_engine([router], skip=SIDECAR) is None
    assert find_engine([{"name": SIDECAR, "image": "vllm/vllm-openai"}], skip=SIDECAR) is None
    # An engine's name in a router's arguments (the servers it routes to) is no engine.
    sglang_router = {
        "name": "router",
        "image": "lmsysorg/sglang-router:v0.2.4",
        "command": ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"],
        "args": ["--prefill", "http://sglang-pd-prefill-0.s-sglang-pd-prefill:8000"],
    }
    assert find_engine([sglang_router], skip=SIDECAR) is None
    script = {"name": "r", "command": ["sh", "-c", "echo vllm serve; exec my-router --to vllm"]}
    assert find_engine([script], skip=SIDECAR) is None


ENGINE = {"name": "sglang", "image": "lmsysorg/sglang:v0.5.2-cu126", "args": ["--port=30000"]}


@pytest.mark.parametrize(
    ("doc", "template"),
    [
        (
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {"containers": [ENGINE]},
            },
            (),
        ),
        (
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "s"},
                "spec": {
                    "serviceName": "s",
                    "selector": {"matchLabels": {"a": "b"}},
                    "template": {
                        "metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [ENGINE]},
                    },
                },
            },
            ("spec", "template"),
        ),
        (
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "d"},
                "spec": {
                    "selector": {"matchLabels": {"a": "b"}},
                    "template": {"spec": {"containers": [ENGINE]}},
                },
            },
            ("spec", "template"),
        ),
        (
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "j"},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [ENGINE]}}},
            },
            ("spec", "template"),
        ),
        (
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "metadata": {"name": "c"},
                "spec": {
                    "schedule": "@daily",
                    "jobTemplate": {
                        "spec": {
                            "template": {"spec": {"restartPolicy": "Never", "containers": [ENGINE]}}
                        }
                    },
                },
            },
            ("spec", "jobTemplate", "spec", "template"),
        ),
    ],
)
def test_every_workload_kind_gets_the_sidecar_in_its_pod_template(
    doc: dict[str, Any], template: tuple[str, ...]
) -> None:
    result = run(stdin=yaml.safe_dump(doc, sort_keys=False))
    assert result.returncode == 0, result.stderr
    out = yaml.safe_load(result.stdout)
    kubernetes_validate.validate(out, KUBE_LATEST, strict=True)
    node = out
    for step in template:
        node = node[step]
    sidecar = node["spec"]["containers"][1]
    assert "--engine.url=http://127.0.0.1:30000/metrics" in sidecar["args"]
    assert node["metadata"]["labels"]["inference-bottleneck-exporter/sidecar"] == "true"


def test_bad_values_are_one_line(tmp_path: Path) -> None:
    for text, message in (
        ("sidecar: {port: 70000}\n", "sidecar.port"),
        ("mode: agent\n", "mode"),
        ("gpu: {hostProcfs: true}\n", "gpu.hostProcfs"),
        ("[1, 2]\n", "not a mapping"),
    ):
        values = tmp_path / "values.yaml"
        values.write_text(text)
        result = run("--values", str(values), stdin=DEPLOYMENT)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_a_list_of_objects_gets_the_sidecar_in_each_item() -> None:
    docs = list(yaml.safe_load_all(DEPLOYMENT))
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": docs}
    result = run(stdin=yaml.safe_dump(listed, sort_keys=False))
    assert result.returncode == 0, result.stderr
    out = yaml.safe_load(result.stdout)
    assert out["items"][0] == docs[0]
    assert [c["name"] for c in out["items"][1]["spec"]["template"]["spec"]["containers"]] == [
        "vllm",
        SIDECAR,
    ]
