"""Model names: from what an engine calls its model to the ``model`` label people read.

Engines name their model in several ways: the served name (``--served-model-name``,
``--alias``), a Hugging Face id (``meta-llama/Llama-3.1-8B-Instruct``), or, by default for
several engines, the path they loaded it from: SGLang's and vLLM's ``--model-path`` or
``--model`` (``/models/Qwen/Qwen3-0.6B``, a Hugging Face cache snapshot
``.../models--Qwen--Qwen3-0.6B/snapshots/<hash>``), llama.cpp's GGUF file
(``/models/tinyllama-1.1b-chat.Q4_K_M.gguf``). :func:`readable` turns a path into the name
it stands for and leaves every other name as the engine wrote it; :func:`name_models` applies
it to a snapshot, keeping each raw name (the tokenize probe sends it back to the engine, and
``inference_engine_model_info`` shows it).
"""

from __future__ import annotations

import re
from dataclasses import replace

from exporter.engines.snapshot import EngineSnapshot, Series

#: Files a model is loaded from, whose extension is no part of the model's name.
_FILE_SUFFIXES = (".gguf", ".ggml", ".bin", ".safetensors", ".engine", ".plan", ".onnx", ".pt")
#: A Hugging Face hub cache folder: ``models--<org>--<name>``.
_HF_CACHE = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)(?:/|$)")
#: Where the raw name came from when the engine's metrics carry it.
FROM_METRICS = "metrics"


def _is_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or "\\" in name
        or name.lower().endswith(_FILE_SUFFIXES)
        or name.count("/") > 1
    )


def readable(raw: str) -> str:
    """The name people read for what an engine calls its model: a path becomes the model it
    holds (a Hugging Face cache snapshot its ``org/name``, any other path its last part
    without a file extension); anything else stays as it is (a served name, a Hugging Face
    id). Never ``""`` for a non-blank name."""
    name = raw.strip()
    if not name or not _is_path(name):
        return name
    cache = _HF_CACHE.search(name.replace("\\", "/"))
    if cache is not None:
        return f"{cache.group(1)}/{cache.group(2)}"
    parts = [part for part in re.split(r"[/\\]", name) if part not in ("", ".", "..", "~")]
    if not parts:
        return name
    last = parts[-1]
    for suffix in _FILE_SUFFIXES:
        if last.lower().endswith(suffix) and len(last) > len(suffix):
            last = last[: -len(suffix)]
            break
    return last


def name_models(snapshot: EngineSnapshot, default: str = "", origin: str = "") -> EngineSnapshot:
    """``snapshot`` with readable model names: each series' model through :func:`readable`
    (two raw names that would read alike keep their raw names), and the series the engine's
    metrics left without a model given ``default`` (the name the engine's API gives, from
    ``origin``) when there is one. ``snapshot.models`` maps each name to its raw name and
    where that came from."""
    raws = {s.model for s in snapshot.series if s.model}
    names = {raw: readable(raw) for raw in raws}
    clashes = {name for name in names.values() if list(names.values()).count(name) > 1}
    names = {raw: raw if name in clashes else name for raw, name in names.items()}
    models = {name: (raw, FROM_METRICS) for raw, name in names.items()}
    default = default.strip()
    if default and any(not s.model for s in snapshot.series):
        name = readable(default)
        if name in models and models[name][0] != default:
            name = default
        names[""] = name
        models.setdefault(name, (default, origin))
    if all(raw == name for raw, name in names.items()) and not models.keys() - raws:
        return replace(snapshot, models=models)
    series = [
        s if names.get(s.model, s.model) == s.model else _named(s, names[s.model])
        for s in snapshot.series
    ]
    return replace(snapshot, series=series, models=models)


def _named(series: Series, model: str) -> Series:
    return replace(series, model=model)


def metric_models(snapshot: EngineSnapshot) -> frozenset[str]:
    """The engine's own names of the models its metrics name (not those its API gave)."""
    return frozenset(raw for raw, origin in snapshot.models.values() if origin == FROM_METRICS)


def entry_points(
    snapshot: EngineSnapshot, steps: frozenset[str], entry_only: frozenset[str]
) -> EngineSnapshot:
    """``snapshot`` without the ``entry_only`` series of the models that are steps of another
    (``steps``: the engine's own names, as :func:`metric_models` gives them): the request
    time of a step is nested in its caller's, so the request-level names count each client
    request once, at the model it entered. A name that no entry point has still comes from
    the steps (a Triton ensemble that is not decoupled has no first-response histogram while
    its decoupled step does: that step's is then the only one there is). Every other series
    stays."""
    nested = {name for name, (raw, _) in snapshot.models.items() if raw in steps}
    if not nested:
        return snapshot
    at_entry = {s.name for s in snapshot.series if s.name in entry_only and s.model not in nested}
    kept = [s for s in snapshot.series if not (s.name in at_entry and s.model in nested)]
    return replace(snapshot, series=kept)
