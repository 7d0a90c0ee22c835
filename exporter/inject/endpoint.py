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
    """The container's command and arguments, split as a shell would (``sh -c "vllm serve"``,
    a script's lines joined where they end in a backslash)."""
    out: list[str] = []
    for part in [*(container.get("command") or []), *(container.get("args") or [])]:
        text = str(part).replace("\\\n", " ")
        try:
            out += shlex.split(text)
        except ValueError:
            out += text.split()
    return out


# Words that run the next one: the program is what follows them (and their options).
_WRAPPERS = frozenset(
    {"exec", "env", "nice", "nohup", "time", "numactl", "taskset", "stdbuf", "ionice", "chrt"}
    | {"tini", "dumb-init", "sudo", "--"}
)
_SHELLS = re.compile(r"(.*/)?(sh|bash|dash|ash|zsh)")
_SHELL_C = re.compile(r"-[a-z]*c[a-z]*")
_PYTHON = re.compile(r"(.*/)?python[0-9.]*")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "\n", ";;"})
_ASSIGNMENT = re.compile(r"\w+=.*")


def _commands(script: str) -> list[list[str]]:
    """A shell script's simple commands, each as its words (lines, ``;``, ``&&``, ``|``)."""
    lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=";&|\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    try:
        for word in lexer:
            if word in _SEPARATORS or set(word) <= set(";&|\n"):
                out.append([])
            else:
                out[-1].append(word)
    except ValueError:  # an unclosed quote: the words as whitespace gives them
        return [script.split()]
    return [words for words in out if words]


def _programs_of(words: Sequence[str]) -> list[str]:
    """What one command runs: its program past environment assignments and wrappers (``exec``,
    ``nice -n 5``), the module or script of a Python, each command of a shell's ``-c``."""
    i, wrapped = 0, False
    while i < len(words):
        word = words[i]
        if word in _WRAPPERS:
            wrapped = True
        elif not (
            _ASSIGNMENT.fullmatch(word)
            or (wrapped and (word.startswith("-") or re.fullmatch(r"[0-9][0-9,.-]*", word)))
        ):
            break
        i += 1
    if i >= len(words):
        return []
    program, rest = words[i], list(words[i + 1 :])
    if _SHELLS.fullmatch(program):
        for k, word in enumerate(rest[:-1]):
            if _SHELL_C.fullmatch(word):
                return [
                    found for command in _commands(rest[k + 1]) for found in _programs_of(command)
                ]
        return [program]
    if _PYTHON.fullmatch(program):
        for k, word in enumerate(rest):
            if word == "-m" and k + 1 < len(rest):
                return [program, rest[k + 1]]
            if not word.startswith("-"):
                return [program, word]
    return [program]


def programs(container: Mapping[str, Any]) -> list[str]:
    """The programs a container's command line runs, where they stand in it: a shell's script
    (``sh -c "cd /m && exec vllm serve ..."``) is read command by command, so an engine's name
    in an argument (a router's ``--prefill http://sglang-prefill:8000``) is no engine."""
    parts = [str(p) for p in [*(container.get("command") or []), *(container.get("args") or [])]]
    if len(parts) > 1 and _SHELLS.fullmatch(parts[0].strip()):
        for k, part in enumerate(parts[1:-1], start=1):
            if _SHELL_C.fullmatch(part):
                return [
                    found for command in _commands(parts[k + 1]) for found in _programs_of(command)
                ]
    return _programs_of(tokens(container))


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
    command = " ".join(programs(container))
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


# $PORT, ${PORT}, ${PORT:-8000} (the shell's) and $(PORT) (Kubernetes' own in command and args).
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::?-([^}]*))?\}|\((\w+)\)|(\w+))")


def _expanded(text: str | None, container: Mapping[str, Any]) -> str | None:
    """A flag's value with a variable taken from the container's environment (or the
    default the shell would take)."""
    match = _VARIABLE.fullmatch(text or "")
    if match is None:
        return text
    braced, default, kube, bare = match.groups()
    found = _env_value(container, [braced or kube or bare])
    return found if found is not None else default


def _port(serving: Serving, container: Mapping[str, Any]) -> int:
    words = tokens(container)
    text = _expanded(_flag_value(words, serving.port_flags), container) or _env_value(
        container, serving.port_env
    )
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
