"""The normalised engine snapshot: what every engine adapter produces.

Adapters (one module per engine in this package) turn an engine's parsed exposition into
:class:`Series` under the fixed ``inference_*`` names of the metric catalogue, with label
``model`` (empty where the engine has none). Units are already converted to base units.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from exporter.engines.rules import Rule

SeriesKind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
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


@dataclass
class EngineSnapshot:
    """Everything normalised from one successful poll."""

    engine: str
    series: list[Series] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)


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
    """

    name: str
    prefixes: tuple[str, ...]
    rules: tuple[Rule, ...]
    tokenize: Tokenize | None
    process: str
    metrics_path: str = "/metrics"
    wraps: tuple[str, ...] = ()
    preallocates_memory: bool = False


def token_count(body: bytes) -> int:
    """Tokens in a tokenize response of any supported engine; ValueError when unrecognised."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"tokenize response is not JSON ({err})") from None
    if isinstance(data, list):  # TGI: one object per token
        return len(data)
    if isinstance(data, dict):
        if isinstance(data.get("count"), int) and not isinstance(data["count"], bool):
            return int(data["count"])
        tokens = data.get("tokens")
        if isinstance(tokens, list):
            return len(tokens)
    raise ValueError("tokenize response has neither 'count' nor 'tokens'")
