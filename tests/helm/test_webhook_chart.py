"""The chart's admission webhook: its objects, and the rendered webhook answering a review over
the rendered certificate, CA bundle and configuration."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from support.chart import NAMESPACE, SCENARIOS, of_kind, render, render_manifests
from support.paths import ROOT
from support.webhook import Webhook, patched, review

from exporter.inject.patch import ANNOTATION_INJECT
from exporter.inject.webhook import load_values, parser

NAME = "ibe-inference-bottleneck-exporter-webhook"
HOST = f"{NAME}.{NAMESPACE}.svc"


def test_off_by_default() -> None:
    kinds = {o["kind"] for o in render()}
    assert not kinds & {"MutatingWebhookConfiguration", "PodDisruptionBudget", "Secret"}


def test_the_configuration_never_blocks_a_pod() -> None:
    (config,) = of_kind(render(SCENARIOS["webhook"]), "MutatingWebhookConfiguration")
    by_name = {w["name"]: w for w in config["webhooks"]}
    assert set(by_name) == {
        "annotation.inject.inference-bottleneck-exporter.io",
        "namespace.inject.inference-bottleneck-exporter.io",
    }
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert 1 <= hook["timeoutSeconds"] <= 5
        assert hook["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        excluded = hook["namespaceSelector"]["matchExpressions"][0]
        assert excluded["operator"] == "NotIn" and {"kube-system", NAMESPACE} <= set(
            excluded["values"]
        )
    assert (
        by_name["annotation.inject.inference-bottleneck-exporter.io"]["clientConfig"]["service"][
            "path"
        ]
        == "/mutate"
    )
    namespace = by_name["namespace.inject.inference-bottleneck-exporter.io"]
    assert namespace["clientConfig"]["service"]["path"] == "/mutate-namespace"
    assert namespace["namespaceSelector"]["matchExpressions"][1] == {
        "key": "inference-bottleneck-exporter.io/inject",
        "operator": "In",
        "values": ["enabled"],
    }


def test_two_replicas_a_disruption_budget_and_a_service_that_select_them() -> None:
    objects = render(SCENARIOS["webhook"])
    (deployment,) = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == NAME]
    (budget,) = of_kind(objects, "PodDisruptionBudget")
    (service,) = [s for s in of_kind(objects, "Service") if s["metadata"]["name"] == NAME]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["port"] == 443
    # The webhook's own flags are ones its parser takes.
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "webhook"
    parser().parse_args(args[1:])


def test_cert_manager_issues_the_certificate_and_injects_the_ca() -> None:
    objects = render(SCENARIOS["webhook-cert-manager"])
    assert not of_kind(objects, "Secret")
    (certificate,) = of_kind(objects, "Certificate")
    (issuer,) = of_kind(objects, "Issuer")
    (config,) = of_kind(objects, "MutatingWebhookConfiguration")
    assert HOST in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
    }
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{certificate['metadata']['name']}"
    )
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])
    (deployment,) = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == NAME]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in volumes


def _rendered_files(objects: list[dict[str, Any]], tmp: Path) -> tuple[Path, Path, bytes]:
    """The rendered web config, values and CA bundle, written where a test process reads them."""
    (secret,) = of_kind(objects, "Secret")
    (configmap,) = [c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"] == NAME]
    (config,) = of_kind(objects, "MutatingWebhookConfiguration")
    tls = tmp / "tls"
    tls.mkdir()
    for key in ("tls.crt", "tls.key"):
        (tls / key).write_bytes(base64.b64decode(secret["data"][key]))
    web = tmp / "web-config.yml"
    web.write_text(
        configmap["data"]["web-config.yml"].replace("/etc/inference-bottleneck-exporter", str(tmp))
    )
    values = tmp / "values.yaml"
    values.write_text(configmap["data"]["values.yaml"])
    bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
    assert all(
        base64.b64decode(w["clientConfig"]["caBundle"]) == bundle for w in config["webhooks"]
    )
    return web, values, bundle


def test_the_rendered_webhook_answers_over_the_rendered_certificate(tmp_path: Path) -> None:
    objects = render(SCENARIOS["webhook"])
    web, values, bundle = _rendered_files(objects, tmp_path)
    ca = x509.load_pem_x509_certificate(bundle)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    client = ssl.create_default_context(cadata=bundle.decode())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sglang-0", "annotations": {ANNOTATION_INJECT: "true"}},
        "spec": {
            "containers": [
                {
                    "name": "sglang",
                    "image": "lmsysorg/sglang:v0.5.2-cu126",
                    "command": ["python3", "-m", "sglang.launch_server", "--port", "30000"],
                }
            ]
        },
    }
    (tmp_path / "pki").mkdir()
    hook = Webhook(
        tmp_path / "pki",
        f"--values={values}",
        web_config=web,
        client=client,
        server_hostname=HOST,
    )
    try:
        status, answer, _ = hook.post(review(pod, "r-1"))
    finally:
        hook.close()
    assert status == 200
    result = patched(pod, answer["response"])
    # The same pod as inject makes of it with the chart's values.
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "inject", f"--values={values}"],
        input=yaml.safe_dump(pod),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    assert result == yaml.safe_load(done.stdout)
    sidecar = result["spec"]["containers"][1]
    assert sidecar["image"].endswith(
        ":"
        + yaml.safe_load((ROOT / "helm/inference-bottleneck-exporter/Chart.yaml").read_text())[
            "appVersion"
        ]
    )
    assert "--engine.url=http://127.0.0.1:30000/metrics" in sidecar["args"]
    # No GPU access by default: the node agent or dcgm-exporter gives the GPU series, and the
    # landing page says so for the pod's node (its one variable).
    assert "--no-collector.nvml" in sidecar["args"]
    assert "--gpu.read-by=dcgm-exporter or the node agent on $(NODE_NAME)" in sidecar["args"]
    assert [e["name"] for e in sidecar["env"]] == ["NODE_NAME"]
    assert (
        load_values(values).tree["sidecar"]
        == yaml.safe_load((ROOT / "helm/inference-bottleneck-exporter/values.yaml").read_text())[
            "sidecar"
        ]
    )
    assert json.dumps(answer).count("patch") == 2  # patchType and patch


def test_notes_say_how_pods_opt_in() -> None:
    notes = render_manifests(SCENARIOS["webhook"])[
        "inference-bottleneck-exporter/templates/NOTES.txt"
    ]
    assert 'inference-bottleneck-exporter.io/inject: "true"' in notes
    assert "kubectl label namespace NAME inference-bottleneck-exporter.io/inject=enabled" in notes
    assert (
        "webhook.enabled=true"
        in render_manifests()["inference-bottleneck-exporter/templates/NOTES.txt"]
    )
