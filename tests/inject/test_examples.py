"""The recipes (docs/stacks.md, examples/<stack>/) do what they say: a manifest with the
sidecar is what inject writes (a second run changes nothing), an opt-in gets the sidecar from
the webhook, a post-renderer adds it to a chart's render, and the README points at each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from support.paths import FIXTURES, ROOT
from support.stacks import SIDECAR, operator_pod

from exporter.inject.patch import Options
from exporter.inject.places import get, places
from exporter.inject.sidecar import Values
from exporter.inject.webhook import Settings, decide

EXAMPLES = ROOT / "examples"
STACKS = ("kserve", "llm-d", "production-stack", "nim-operator", "dynamo", "lws")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _inject(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "inject", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
        env=env,
    )
    return done.stdout


def test_every_stack_has_a_recipe_and_the_readme_points_at_it() -> None:
    guide = (ROOT / "docs" / "stacks.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for stack in STACKS:
        assert any((EXAMPLES / stack).iterdir()), stack
        assert f"examples/{stack}/" in guide, stack
        assert f"docs/stacks.md#{stack}" in readme, stack
        assert f'<a id="{stack}"></a>' in guide, stack


@pytest.mark.parametrize("path", ["kserve/inferenceservice.yaml", "lws/leaderworkerset.yaml"])
def test_a_recipe_with_the_sidecar_is_what_inject_writes(path: str) -> None:
    text = (EXAMPLES / path).read_text()
    assert _inject(stdin=text) == text
    assert SIDECAR in text


@pytest.mark.parametrize(
    ("path", "webhook", "urls"),
    [
        ("nim-operator/nimservice.yaml", "annotation", ["http://127.0.0.1:8000/v1/metrics"]),
        (
            "dynamo/dynamographdeployment.yaml",
            "annotation",
            [
                "http://127.0.0.1:8000/metrics",
                "http://127.0.0.1:9090/metrics",
                "http://127.0.0.1:9090/metrics",
            ],
        ),
        ("kserve/llminferenceservice.yaml", "namespace", ["http://127.0.0.1:8000/metrics"]),
    ],
)
def test_an_opt_in_recipe_gets_the_sidecar_from_the_webhook(
    path: str, webhook: str, urls: list[str]
) -> None:
    settings = Settings(Values.of({"mode": "dcgm"}), Options(), 2.0, 1 << 20)
    found = []
    for doc in _docs(EXAMPLES / path):
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["labels"] == {
                "inference-bottleneck-exporter.io/inject": "enabled"
            }
        for place in places(doc) or []:
            pod = operator_pod(doc, place, opt_in=False)
            _, result, patch, _ = decide(
                {"request": {"uid": "u", "kind": {"kind": "Pod"}, "object": pod}}, webhook, settings
            )
            assert result == "injected", place.name
            out = jsonpatch.JsonPatch(patch).apply(pod)
            (sidecar,) = [c for c in out["spec"]["containers"] if c["name"] == SIDECAR]
            found += [a.split("=", 1)[1] for a in sidecar["args"] if a.startswith("--engine.url=")]
            assert out["metadata"]["labels"]["inference-bottleneck-exporter/sidecar"] == "true"
    assert found == urls


@pytest.mark.parametrize(
    ("script", "render", "values", "port"),
    [
        ("production-stack/post-renderer.sh", "vllm-production-stack.yaml", None, "metrics"),
        (
            "llm-d/post-renderer.sh",
            "llm-d-modelservice-pd.yaml",
            "llm-d/ibe-values.yaml",
            "ibe-metrics",
        ),
    ],
)
def test_a_post_renderer_adds_the_sidecar_to_the_charts_render(
    tmp_path: Path, script: str, render: str, values: str | None, port: str
) -> None:
    shim = tmp_path / "inference-bottleneck-exporter"
    shim.write_text(f'#!/bin/sh\ncd {ROOT} && exec {sys.executable} -m exporter.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    if values:
        env["IBE_VALUES"] = str(EXAMPLES / values)
    text = (FIXTURES / "stacks" / render).read_text()
    done = subprocess.run(
        [str(EXAMPLES / script)],
        input=text,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    args = [f"--values={EXAMPLES / values}"] if values else []
    assert done.stdout == _inject(*args, stdin=text)
    sidecars = [
        c
        for doc in yaml.safe_load_all(done.stdout)
        if doc
        for place in places(doc) or []
        for c in get(doc, (*place.spec, "containers")) or []
        if c["name"] == SIDECAR
    ]
    assert sidecars and all(c["ports"][0]["name"] == port for c in sidecars)
    assert all(c["readinessProbe"]["httpGet"]["port"] == port for c in sidecars)
