"""Which container of a pod is the engine, and the URL of its metrics from the sidecar.

Read from the containers alone (their command line, image, environment and ports), with each
engine's :class:`~exporter.engines.spec.Serving`: an engine's command line (its spec's
``process`` expression) is the strongest sign; its image counts only for a container that runs
the image's own entrypoint (no ``command``). Engines that wrap others (Dynamo, Triton) are
tried first, as when reading their metrics.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.engines import SPECS
from exporter.engines.spec import EngineSpec, Serving

_SERVED: tuple[EngineSpec, ...] = tuple(
    sorted(
        (spec for spec in SPECS if spec.serving is not None),
        key=lambda spec: not spec.wraps,
    )
)


@dataclass(frozen=True)
class Endpoint:
    """The engine found: its container's name, the engine type, where its metrics are."""

    container: str
    engine: str
    url: str


def tokens(container: Mapping[str, Any]) -> list[str]:
    """The container's command and arguments, split as a shell would (``sh -c "vllm serve"``)."""
    out: list[str] = []
    for part in [*(container.get("command") or []), *(container.get("args") or [])]:
        text = str(part)
        try:
            out += shlex.split(text)
        except ValueError:
            out += text.split()
    return out


def _image_path(image: str) -> str:
    """The image reference without its registry host (``nvcr.io/nim/x:1`` -> ``nim/x:1``)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return image


def from_annotations(annotations: Mapping[str, Any]) -> str | None:
    """The metrics URL KServe's annotations give (``prometheus.kserve.io/port`` and ``/path``:
    its serving runtimes name their engine's metrics so)."""
    port = str(annotations.get("prometheus.kserve.io/port", ""))
    if not port.isdigit():
        return None
    path = str(annotations.get("prometheus.kserve.io/path") or "/metrics")
    return f"http://127.0.0.1:{port}{path if path.startswith('/') else '/' + path}"


def _engine_of(container: Mapping[str, Any]) -> EngineSpec | None:
    command = " ".join(tokens(container))
    for spec in _SERVED:
        if command and re.search(spec.process, command, re.IGNORECASE):
            return spec
    if container.get("command"):
        # A command of its own that runs no engine: another program in an engine's image (a
        # Dynamo planner, a router, a model downloader).
        return None
    path = _image_path(str(container.get("image") or ""))
    for spec in _SERVED:
        assert spec.serving is not None
        if any(re.search(pattern, path) for pattern in spec.serving.images):
            return spec
    return None


def _flag_value(words: Sequence[str], flags: Iterable[str]) -> str | None:
    found = None
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag and i + 1 < len(words):
                found = words[i + 1]
            elif word.startswith(flag + "="):
                found = word[len(flag) + 1 :]
    return found


def _env_value(container: Mapping[str, Any], names: Iterable[str]) -> str | None:
    env = {
        str(e.get("name")): e.get("value")
        for e in container.get("env") or []
        if isinstance(e, Mapping)
    }
    for name in names:
        if isinstance(env.get(name), str | int):
            return str(env[name])
    return None


def _port(serving: Serving, container: Mapping[str, Any]) -> int:
    words = tokens(container)
    text = _flag_value(words, serving.port_flags) or _env_value(container, serving.port_env)
    if text is not None and text.isdigit():
        return int(text)
    command = " ".join(words)
    for pattern, port in serving.defaults:
        if re.search(pattern, command):
            return port
    return serving.port


def _declares(container: Mapping[str, Any], port: int) -> bool:
    return any(
        isinstance(p, Mapping) and p.get("containerPort") == port
        for p in container.get("ports") or []
    )


def find_engine(
    containers: Sequence[Mapping[str, Any]], *, skip: str, declared_port: bool = False
) -> Endpoint | None:
    """The first container (other than ``skip``, the sidecar) that runs a known engine; with
    ``declared_port``, only one that declares the port it serves on."""
    for container in containers:
        if not isinstance(container, Mapping) or container.get("name") == skip:
            continue
        spec = _engine_of(container)
        if spec is None or spec.serving is None:
            continue
        port = _port(spec.serving, container)
        if declared_port and not _declares(container, port):
            continue
        url = f"http://127.0.0.1:{port}{spec.metrics_path}"
        return Endpoint(str(container.get("name") or ""), spec.name, url)
    return None
