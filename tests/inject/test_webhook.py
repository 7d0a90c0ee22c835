"""The admission webhook as the API server calls it: HTTPS on 127.0.0.1 verified against a CA
bundle, AdmissionReview v1 in and out; the patch applied by an RFC 6902 library of its own."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import ROOT
from support.webhook import Webhook, patched, review

from exporter.inject.patch import ANNOTATION_ENGINE_URL, ANNOTATION_INJECT

SIDECAR = "inference-bottleneck-exporter"
_LISTEN = re.compile(r"listening on 127\.0\.0\.1:(\d+)")

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "generateName": "vllm-7d9f-",
        "namespace": "inference",
        "labels": {"app": "vllm"},
        "annotations": {ANNOTATION_INJECT: "true"},
    },
    "spec": {
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.10.1",
                "args": ["--model=Qwen/Qwen2.5-0.5B-Instruct", "--port=8000"],
                "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
            }
        ]
    },
}


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    hook = Webhook(tmp_path)
    yield hook
    hook.close()


def _valid(answer: dict[str, Any], uid: str) -> dict[str, Any]:
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == uid and response["allowed"] is True
    return response


def inject_cli(pod: dict[str, Any], *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "inject", *args],
        input=yaml.safe_dump(pod),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    out: dict[str, Any] = yaml.safe_load(done.stdout)
    return out


def test_an_opted_in_pod_gets_the_same_sidecar_as_inject_gives_it(webhook: Webhook) -> None:
    uid = "b6c4f0e2-1a2b-4c3d-9e8f-0123456789ab"
    status, answer, _ = webhook.post(review(POD, uid))
    assert status == 200
    pod = patched(POD, _valid(answer, uid))
    assert pod == inject_cli(POD)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["vllm", SIDECAR]
    assert "--engine.url=http://127.0.0.1:8000/metrics" in pod["spec"]["containers"][1]["args"]
    assert pod["metadata"]["labels"]["inference-bottleneck-exporter/sidecar"] == "true"
    # Reinvoked on its own result (reinvocationPolicy: IfNeeded): nothing more.
    _, again, _ = webhook.post(review(pod, uid))
    assert "patch" not in _valid(again, uid)


def test_pods_without_the_annotation_pass_untouched_unless_their_namespace_opts_in(
    webhook: Webhook,
) -> None:
    plain = json.loads(json.dumps(POD))
    del plain["metadata"]["annotations"]
    _, answer, _ = webhook.post(review(plain, "u1"))
    assert "patch" not in _valid(answer, "u1")
    _, answer, _ = webhook.post(review(plain, "u2"), "/mutate-namespace")
    assert patched(plain, _valid(answer, "u2"))["spec"]["containers"][1]["name"] == SIDECAR
    out = json.loads(json.dumps(plain))
    out["metadata"]["annotations"] = {ANNOTATION_INJECT: "false"}
    _, answer, _ = webhook.post(review(out, "u3"), "/mutate-namespace")
    assert "patch" not in _valid(answer, "u3")


def test_a_pod_without_an_engine_is_allowed_with_a_warning_or_an_engine_url(
    webhook: Webhook,
) -> None:
    pod = json.loads(json.dumps(POD))
    pod["spec"]["containers"][0].update(image="example/own:1", args=["serve"])
    _, answer, _ = webhook.post(review(pod, "u4"))
    response = _valid(answer, "u4")
    assert "patch" not in response and ANNOTATION_ENGINE_URL in response["warnings"][0]
    pod["metadata"]["annotations"][ANNOTATION_ENGINE_URL] = "http://127.0.0.1:9000/metrics"
    _, answer, _ = webhook.post(review(pod, "u5"))
    sidecar = patched(pod, _valid(answer, "u5"))["spec"]["containers"][1]
    assert "--engine.url=http://127.0.0.1:9000/metrics" in sidecar["args"]


@pytest.mark.parametrize(
    ("body", "uid"),
    [
        (b"{not json", ""),
        (b'{"request": {"uid": "abc-123", "object": 5', "abc-123"),
        (b"[]", ""),
        (
            json.dumps(
                {
                    "request": {
                        "uid": "u6",
                        "kind": {"kind": "Pod"},
                        "object": {
                            "spec": {"containers": 7},
                            "metadata": {"annotations": {ANNOTATION_INJECT: "true"}},
                        },
                    }
                }
            ).encode(),
            "u6",
        ),
        (
            json.dumps(
                {
                    "request": {
                        "uid": "u7",
                        "kind": {"kind": "Pod"},
                        "object": {"metadata": {"annotations": {ANNOTATION_INJECT: "true"}}},
                    }
                }
            ).encode(),
            "u7",
        ),
        (review({"metadata": {}}, "u8", kind="Deployment"), "u8"),
        (b"\xff\xfe\x00", ""),
    ],
)
def test_malformed_reviews_get_a_valid_allowing_answer(
    webhook: Webhook, body: bytes, uid: str
) -> None:
    status, answer, _ = webhook.post(body)
    assert status == 200
    assert "patch" not in _valid(answer, uid)


def test_an_oversized_review_is_allowed_with_its_uid(tmp_path: Path) -> None:
    hook = Webhook(tmp_path, "--review.max-bytes=65536")
    try:
        pod = json.loads(json.dumps(POD))
        pod["metadata"]["annotations"]["filler"] = "x" * 200_000
        status, answer, elapsed = hook.post(review(pod, "big-1"))
        assert elapsed < 5.0
        assert status == 200 and "patch" not in _valid(answer, "big-1")
        assert hook.metrics()[("annotation", "oversized")] == 1
    finally:
        hook.close()


def test_a_client_that_never_finishes_gets_an_answer_in_time_and_others_are_served(
    webhook: Webhook,
) -> None:
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=10)
    tls = webhook.pki.client().wrap_socket(raw, server_hostname="127.0.0.1")
    body = review(POD, "slow-1")
    head = f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    started = time.monotonic()
    tls.sendall(head.encode() + body[: len(body) // 2])
    # Meanwhile another client is answered at once.
    _, answer, elapsed = webhook.post(review(POD, "fast-1"))
    assert "patch" in _valid(answer, "fast-1") and elapsed < 1.0
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = tls.recv(65536)
        if not chunk:
            break
        reply += chunk
    waited = time.monotonic() - started
    tls.close()
    assert reply.startswith(b"HTTP/1.1 200")
    answer = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert "patch" not in _valid(answer, "slow-1")
    assert 0.9 <= waited < 5.0  # --review.timeout=1s; the chart's timeoutSeconds is 5
    counts = webhook.metrics()
    assert counts[("annotation", "timeout")] == 1 and counts[("annotation", "injected")] == 1


def test_metrics_count_each_result(webhook: Webhook) -> None:
    webhook.post(review(POD, "m1"))
    webhook.post(b"{", "/mutate-namespace")
    plain = json.loads(json.dumps(POD))
    del plain["metadata"]["annotations"]
    webhook.post(review(plain, "m2"))
    counts = webhook.metrics()
    assert counts[("annotation", "injected")] == 1
    assert counts[("namespace", "malformed")] == 1
    assert counts[("annotation", "not_requested")] == 1
    assert sum(counts.values()) == 3


def test_the_ca_bundle_is_what_makes_it_trusted(webhook: Webhook) -> None:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", webhook.port, context=webhook.pki.client(ca="other-ca"), timeout=10
    )
    with pytest.raises(ssl.SSLError):
        conn.request("POST", "/mutate", body=review(POD))
    conn.close()


def test_without_tls_it_refuses_to_start(tmp_path: Path) -> None:
    plain = tmp_path / "web.yml"
    plain.write_text("http_server_config: {}\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "webhook",
            "--web.listen-address=127.0.0.1:0",
            f"--web.config.file={plain}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "HTTPS" in done.stderr
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "webhook",
            f"--web.config.file={plain}",
            "--review.timeout=forever",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--review.timeout" in bad.stderr


def test_a_partial_sidecar_is_completed(webhook: Webhook) -> None:
    """A NIMService's sidecarContainers keep only name, image, args and env: the webhook
    replaces such a container with the whole sidecar (ports, probes, securityContext)."""
    pod = json.loads(json.dumps(POD))
    pod["spec"]["containers"][0]["image"] = "nvcr.io/nim/meta/llama-3.2-1b-instruct:1.12.0"
    pod["spec"]["containers"][0]["args"] = []
    partial = {
        "name": SIDECAR,
        "image": "inference-bottleneck-exporter/inference-bottleneck-exporter:0.1.0",
        "args": ["--web.listen-address=:10960", "--engine.url=http://127.0.0.1:8000/v1/metrics"],
    }
    pod["spec"]["containers"].append(partial)
    _, answer, _ = webhook.post(review(pod, "nim-1"))
    out = patched(pod, _valid(answer, "nim-1"))
    (sidecar,) = [c for c in out["spec"]["containers"] if c["name"] == SIDECAR]
    assert out["spec"]["containers"].index(sidecar) == 1
    assert sidecar["ports"][0]["name"] == "metrics" and sidecar["securityContext"]["runAsNonRoot"]
    assert "--engine.url=http://127.0.0.1:8000/v1/metrics" in sidecar["args"]
