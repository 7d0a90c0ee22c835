"""The normalised engine snapshot: what every engine adapter produces.

Adapters (one module per engine in this package) turn an engine's parsed exposition into
:class:`Series` under the fixed ``inference_*`` names of the metric catalogue, with label
``model`` (empty where the engine has none) and the metric's own labels, if any (``reason``).
Units are already converted to base units.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from exporter.engines.rules import Rule, SampleIndex

SeriesKind = Literal["gauge", "counter", "histogram"]
#: What an endpoint is: an engine (or a server of one) or a front-end that routes to engines
#: (Dynamo's frontend), whose request metrics count the same requests again.
Layer = Literal["engine", "frontend"]


@dataclass(frozen=True, slots=True)
class Series:
    """One normalised series. Histograms carry cumulative ``buckets`` (upper bound, count),
    ending with ``+Inf``, plus ``sum`` and ``count``; gauges and counters carry ``value``."""

    name: str
    model: str
    kind: SeriesKind
    value: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()
    sum: float = 0.0
    count: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()


@dataclass
class EngineSnapshot:
    """Everything normalised from one successful poll: the series, the series dropped over
    the limit, what the endpoint is (``layer``) and the engine's version where its metrics
    carry it (``""`` otherwise)."""

    engine: str
    series: list[Series] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    layer: Layer = "engine"
    version: str = ""


def _openai_tokenize_body(text: str, model: str) -> dict[str, Any]:
    """vLLM's and SGLang's ``/tokenize`` body (OpenAI-style: a prompt and the model)."""
    body: dict[str, Any] = {"prompt": text}
    if model:
        body["model"] = model
    return body


@dataclass(frozen=True)
class Tokenize:
    """An engine's tokenize endpoint: its path on the engine's host and the request body.

    Every supported engine answers with a JSON ``count`` (vLLM), a ``tokens`` list (vLLM,
    SGLang, llama.cpp) or a list of token objects (TGI); :func:`token_count` reads all three.
    """

    path: str = "/tokenize"
    body: Callable[[str, str], dict[str, Any]] = _openai_tokenize_body


@dataclass(frozen=True)
class Version:
    """Where an engine says its version: a JSON document at ``path`` on the engine's host (the
    first of ``keys`` that holds a string), and/or a label of its metrics (``label``)."""

    path: str | None = None
    keys: tuple[str, ...] = ("version",)
    label: str | None = None


@dataclass(frozen=True)
class Serving:
    """How the engine runs in a container, for ``inject`` and the admission webhook: which
    images are it (regular expressions searched in the image reference; its command line is
    recognised by the spec's ``process``) and where its metrics listen.

    The port is the first of: a flag of ``port_flags`` on the command line, a variable of
    ``port_env`` in the container's environment, the port of the first ``defaults`` entry
    whose pattern the command line matches, ``port``.
    """

    images: tuple[str, ...]
    port: int
    port_flags: tuple[str, ...] = ("--port",)
    port_env: tuple[str, ...] = ()
    defaults: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class EngineSpec:
    """Everything the sidecar knows of one engine, in the engine's own module.

    ``name`` is the ``--engine.type`` value and the ``engine`` label; ``prefixes`` recognise
    the engine from its metric names (auto-detection); ``rules`` map its metrics to the
    normalised names; ``tokenize`` is its tokenize endpoint (None: it has none, the probe needs
    ``--tokenizer.url``); ``process`` is a regular expression matching its processes' command
    lines; ``metrics_path`` is where it serves its metrics; ``wraps`` names engines whose
    metrics it may serve next to its own, so that it is recognised before them;
    ``preallocates_memory`` says it reserves most of the GPU memory at start-up by design (its
    framebuffer usage says nothing about headroom).

    Engines without a prefix of their own (NVIDIA NIM, early ``trtllm-serve``) are recognised
    by ``signatures`` instead: sets of family names (without ``_total``, ``_bucket``, ...) that
    must all be present, checked after every prefix. ``frontend_prefixes`` mark an endpoint
    that only routes requests (its layer is ``frontend`` when no other name of the engine is
    present); ``model_alias`` maps model names as some series spell them to the spelling the
    others use; ``version`` says where the engine tells its version; ``serving`` how it runs in
    a container (None: ``inject`` cannot recognise it).
    """

    name: str
    prefixes: tuple[str, ...]
    rules: tuple[Rule, ...]
    tokenize: Tokenize | None
    process: str
    metrics_path: str = "/metrics"
    wraps: tuple[str, ...] = ()
    preallocates_memory: bool = False
    signatures: tuple[frozenset[str], ...] = ()
    frontend_prefixes: tuple[str, ...] = ()
    model_alias: Callable[[SampleIndex], dict[str, str]] | None = None
    version: Version = field(default_factory=Version)
    serving: Serving | None = None


def token_count(body: bytes) -> int:
    """Tokens in a tokenize response of any supported engine; ValueError when unrecognised.

    vLLM ``count``, SGLang and llama.cpp ``tokens``, TGI a list, LMDeploy ``length`` (and
    ``input_ids``)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"tokenize response is not JSON ({err})") from None
    if isinstance(data, list):  # TGI: one object per token
        return len(data)
    if isinstance(data, dict):
        for key in ("count", "length"):
            if isinstance(data.get(key), int) and not isinstance(data[key], bool):
                return int(data[key])
        for key in ("tokens", "input_ids"):
            tokens = data.get(key)
            if isinstance(tokens, list):
                return len(tokens)
    raise ValueError("tokenize response has neither 'count' nor 'tokens'")
