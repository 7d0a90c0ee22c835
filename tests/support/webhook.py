"""The real ``webhook`` command on a loopback port, and AdmissionReviews as the API server
sends them."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jsonpatch
from prometheus_client.parser import text_string_to_metric_families

from support.paths import ROOT
from support.tls import Pki

_LISTEN = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


class Webhook:
    """The real ``webhook`` command on a free loopback port."""

    def __init__(
        self,
        tmp: Path,
        *args: str,
        web_config: Path | None = None,
        client: ssl.SSLContext | None = None,
        server_hostname: str = "127.0.0.1",
    ) -> None:
        self.pki = Pki(tmp)
        self.client = client or self.pki.client()
        self.server_hostname = server_hostname
        config = web_config or tmp / "web.yml"
        if web_config is None:
            config.write_text(
                f"tls_server_config:\n  cert_file: {tmp}/server.crt\n  key_file: {tmp}/server.key\n"
            )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter.cli",
                "webhook",
                "--web.listen-address=127.0.0.1:0",
                f"--web.config.file={config}",
                "--review.timeout=1s",
                *args,
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self.port = 0
        seen = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                if (m := _LISTEN.search(line)) and not self.port:
                    self.port = int(m.group(1))
                    seen.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        assert seen.wait(30), self.lines

    def connection(self) -> http.client.HTTPSConnection:
        """A connection to 127.0.0.1 that verifies the server as ``server_hostname``."""
        conn = http.client.HTTPSConnection(
            self.server_hostname, self.port, context=self.client, timeout=10
        )
        if self.server_hostname != "127.0.0.1":
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            conn.sock = self.client.wrap_socket(sock, server_hostname=self.server_hostname)
        return conn

    def post(self, body: bytes, path: str = "/mutate") -> tuple[int, dict[str, Any], float]:
        conn = self.connection()
        started = time.monotonic()
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read()), time.monotonic() - started
        finally:
            conn.close()

    def metrics(self) -> dict[tuple[str, str], float]:
        conn = self.connection()
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "inference_webhook_reviews_total":
                    out[(s.labels["webhook"], s.labels["result"])] = s.value
        return out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.reader.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def review(pod: Any, uid: str = "b6c4f0e2-1a2b-4c3d-9e8f-0123456789ab", kind: str = "Pod") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "inference",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": pod,
                "dryRun": False,
            },
        }
    ).encode()


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.JsonPatch(patch).apply(pod)
    return result
