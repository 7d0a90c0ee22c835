"""An engine's spec: everything the sidecar knows of one engine besides what it reads now.

One :class:`EngineSpec` per engine, in the engine's own module: how to recognise it, the table
of rules that maps its metrics (:mod:`~exporter.engines.rules`), where it says its version and
its model, its tokenize endpoint, its processes, how it runs in a container, and which of its
own metrics are left out and why. What one poll of it produced is the snapshot
(:mod:`~exporter.engines.snapshot`), a different thing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.engines.rules import Rule, SampleIndex
from exporter.engines.snapshot import Role


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
class RoleLabel:
    """Where an engine's metrics say the server's role: a label of its series (``label``) and
    what each of its values means (``values``: the engine's word, the role). A value not in
    ``values`` says nothing."""

    label: str
    values: tuple[tuple[str, Role], ...]


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
class ModelName:
    """Where an engine names the model it serves when its metrics do not (llama.cpp and TGI
    carry no model label, the first ``trtllm-serve`` metrics say ``undefined``): a JSON
    document at ``path`` on the engine's host and the places in it to read, the first that
    holds a non-empty string winning. A place is a path of keys and list indexes:
    ``("data", 0, "id")`` is the first model of an OpenAI-style ``/v1/models`` answer."""

    path: str = "/v1/models"
    keys: tuple[tuple[str | int, ...], ...] = (("data", 0, "id"),)

    def read(self, body: bytes) -> str:
        """The model the answer names, or ``""`` (not JSON, or no place holds a name)."""
        try:
            data: Any = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return ""
        for place in self.keys:
            found = data
            for step in place:
                if (
                    isinstance(step, int)
                    and isinstance(found, list)
                    and -len(found) <= step < len(found)
                ):
                    found = found[step]
                elif isinstance(step, str) and isinstance(found, dict):
                    found = found.get(step)
                else:
                    found = None
                    break
            if isinstance(found, str) and found.strip():
                return found.strip()[:200]
        return ""


#: The OpenAI-compatible servers' list of models.
OPENAI_MODELS = ModelName()


@dataclass(frozen=True)
class Composition:
    """Where an engine says which of its models are steps of another (Triton's ensembles),
    which its metrics do not: a JSON document per model at ``path`` (``{model}`` is the model's
    own name, quoted) on the engine's HTTP API, and ``read``, which gives the models that
    document's model composes (``()`` for one that composes none; ValueError when the answer
    is not such a document).

    A model some other model composes is not where clients' requests enter: its request time
    is nested in its caller's. The request-level names of ``entry_only`` then come from the
    entry points alone (the models nothing composes) wherever an entry point has them, every
    other name from every model (each step's queue is a wait of its own). ``doc`` says so in
    the engine's mapping.
    """

    path: str
    read: Callable[[bytes], tuple[str, ...]]
    entry_only: frozenset[str]
    doc: str = ""


@dataclass(frozen=True)
class EngineSpec:
    """Everything the sidecar knows of one engine, in the engine's own module.

    ``name`` is the ``--engine.type`` value and the ``engine`` label, ``title`` the engine's
    name as people write it; ``prefixes`` recognise the engine from its metric names
    (auto-detection); ``rules`` map its metrics to the normalised names; ``tokenize`` is its
    tokenize endpoint (None: it has none, the probe needs ``--tokenizer.url``); ``process`` is
    a regular expression matching its processes' command lines; ``metrics_path`` is where it
    serves its metrics; ``wraps`` names engines whose metrics it may serve next to its own, so
    that it is recognised before them; ``preallocates_memory`` says it reserves most of the
    GPU memory at start-up by design (its framebuffer usage says nothing about headroom).

    Engines without a prefix of their own (NVIDIA NIM, early ``trtllm-serve``) are recognised
    by ``signatures`` instead: sets of family names (without ``_total``, ``_bucket``, ...) that
    must all be present, checked after every prefix. ``frontend_prefixes`` mark an endpoint
    that only routes requests (its layer is ``frontend`` when no other name of the engine is
    present); ``model_alias`` maps model names as some series spell them to the spelling the
    others use; ``model`` is where the engine names its model when its metrics do not (None:
    it does not); ``version`` says where the engine tells its version; ``serving`` how it runs
    in a container (None: ``inject`` cannot recognise it); ``role`` where its metrics tell the
    server's role in disaggregated serving (None: they do not, and ``--engine.role`` says it);
    ``composition`` where its API says which models are steps of others (None: it does not).

    ``own_rules`` are the rules written in the engine's module when ``rules`` also holds the
    tables of the engines it ``reads_as`` (Dynamo's workers serve vLLM's, SGLang's and
    TensorRT-LLM's metrics unchanged; Ray serves vLLM's renamed): what the documentation
    shows for this engine (None: ``rules`` itself). ``left_out`` names the engine's own
    metrics that no rule reads, each with the reason (its upstream catalogue is checked
    against the rules and this list in the tests).
    """

    name: str
    title: str
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
    model: ModelName | None = None
    version: Version = field(default_factory=Version)
    serving: Serving | None = None
    role: RoleLabel | None = None
    composition: Composition | None = None
    own_rules: tuple[Rule, ...] | None = None
    reads_as: tuple[str, ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()

    @property
    def written(self) -> tuple[Rule, ...]:
        """The rules written in the engine's own module (see ``own_rules``)."""
        return self.rules if self.own_rules is None else self.own_rules


def left_out(reason: str, *names: str) -> tuple[tuple[str, str], ...]:
    """Entries of :attr:`EngineSpec.left_out`: each name with the reason no rule reads it."""
    return tuple((name, reason) for name in names)


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
