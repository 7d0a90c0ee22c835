"""Engine adapters: from an engine's own ``/metrics`` to the normalised ``inference_*`` series.

Pure functions over the exposition (no I/O except :func:`load_mapping`, no registry)::

    snapshot = digest(text, "auto", keys=poll_keys())   # scan, recognise, normalise
    # or, step by step, from prometheus_client's families:
    families = parse_exposition(body)          # ValueError when the body is not an exposition
    engine = detect(families)                  # "vllm", "sglang", ... or None
    snapshot = normalise(families, engine, mapping=None, max_series=1000)

One module per engine holds its :class:`~exporter.engines.spec.EngineSpec` (metric prefixes
or name signatures, the declarative mapping table with current and deprecated names, model
label and unit conversion, tokenize endpoint, process regex, version endpoint) and documents
what it maps and why; :mod:`.rules` applies the tables the same way for every engine. Adding
an engine is one module and one entry in :data:`SPECS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from prometheus_client.metrics_core import Metric

from exporter.engines import (
    custom,
    dynamo,
    llamacpp,
    llmd,
    lmdeploy,
    nim,
    ray,
    sglang,
    tgi,
    triton,
    trtllm,
    vllm,
)
from exporter.engines.custom import CustomMapping, load_mapping
from exporter.engines.models import name_models
from exporter.engines.parse import parse_exposition
from exporter.engines.rules import (
    NORMALISED,
    Rule,
    SampleIndex,
    apply_rules,
    index_samples,
    source_names,
)
from exporter.engines.scan import family_key, line_name, scan
from exporter.engines.snapshot import EngineSnapshot, Layer, Role, Series
from exporter.engines.spec import EngineSpec, RoleLabel
from exporter.priority import no_pause

__all__ = [
    "ENGINES",
    "NORMALISED",
    "SPECS",
    "CustomMapping",
    "UnrecognisedError",
    "detect",
    "detect_names",
    "digest",
    "layered",
    "load_mapping",
    "normalise",
    "parse_exposition",
    "poll_keys",
    "select_families",
    "source_keys",
]

#: Every engine the sidecar reads, in the order of ``--engine.type``'s choices.
SPECS: tuple[EngineSpec, ...] = (
    vllm.SPEC,
    sglang.SPEC,
    tgi.SPEC,
    triton.SPEC,
    llamacpp.SPEC,
    nim.SPEC,
    trtllm.SPEC,
    dynamo.SPEC,
    lmdeploy.SPEC,
    ray.SPEC,
    llmd.SPEC,
)
BY_ENGINE: dict[str, EngineSpec] = {spec.name: spec for spec in SPECS}

#: Engine types, as given to ``--engine.type`` (besides ``auto``) and used as label ``engine``:
#: the specs' and ``custom`` (a YAML mapping, or a server instrumented with the normalised names).
ENGINES: tuple[str, ...] = (*BY_ENGINE, "custom")

# An engine that serves another's metrics next to its own is recognised first.
_DETECTION_ORDER: tuple[EngineSpec, ...] = tuple(
    sorted(SPECS, key=lambda spec: not any(w in BY_ENGINE for w in spec.wraps))
)


class UnrecognisedError(ValueError):
    """An exposition whose metric names belong to no known engine."""


def process_match() -> str:
    """The default ``--process.match``: every engine's processes, case-insensitively."""
    return "(?i)" + "|".join(spec.process for spec in SPECS)


def detect(families: Sequence[Metric]) -> str | None:
    """The engine type whose metric names the families carry, or None.

    ``custom`` when there is no known engine prefix but a normalised name itself (a server
    instrumented with ``exporter.instrument``)."""
    # Every family counts, even one left empty (all its values NaN, or a labelled metric
    # with no series yet): its name alone tells the engine.
    names = {family.name for family in families}
    samples = {s.name for family in families for s in family.samples}
    return detect_names(names, samples)


def detect_names(names: set[str], samples: set[str]) -> str | None:
    """:func:`detect` from the family names and sample names alone: an engine prefix (engines
    that wrap others first), else an engine's name signature (engines without a prefix of
    their own: NIM, early trtllm-serve), else the normalised names (``custom``)."""
    every = names | samples
    for spec in _DETECTION_ORDER:
        if spec.prefixes and any(name.startswith(spec.prefixes) for name in every):
            return spec.name
    keys = every | {family_key(name) for name in every}
    for spec in _DETECTION_ORDER:
        if any(signature <= keys for signature in spec.signatures):
            return spec.name
    if any(_is_normalised_sample(name) for name in samples):
        return "custom"
    return None


def _rules(engine: str, mapping: CustomMapping | None) -> tuple[Rule, ...]:
    if engine == "custom":
        return custom.rules(mapping)
    if engine in BY_ENGINE:
        return BY_ENGINE[engine].rules
    raise ValueError(f"unknown engine type {engine!r} (one of: {', '.join(ENGINES)})")


_KEYS: dict[str, frozenset[str]] = {}


def source_keys(engine: str, mapping: CustomMapping | None = None) -> frozenset[str]:
    """Family keys (names without ``_total``, ``_bucket``, ...) the engine's rules read."""
    cacheable = engine in BY_ENGINE
    if cacheable and engine in _KEYS:
        return _KEYS[engine]
    keys: set[str] = set()
    for name in source_names(_rules(engine, mapping)):
        keys |= {name, family_key(name)}
    found = frozenset(keys)
    if cacheable:
        _KEYS[engine] = found
    return found


def poll_keys(mapping: CustomMapping | None = None) -> frozenset[str]:
    """Every engine's keys: what a poll keeps while the engine may still change."""
    return frozenset().union(*(source_keys(e, mapping) for e in ENGINES))


def select_families(
    text: str, keys: frozenset[str], pause: Callable[[], None] = no_pause
) -> tuple[str, set[str], set[str]]:
    """The lines of ``text`` whose family is in ``keys`` (whole families: every part of a
    histogram or counter), and the family and sample names seen, for :func:`detect_names`.
    ``pause`` is called every 256 lines (see :func:`exporter.engines.parse.parse_exposition`).

    The line filter of :func:`~exporter.engines.scan.scan`, for prometheus_client's parser:
    the reference the fast path is checked against."""
    kept: list[str] = []
    families: set[str] = set()
    samples: set[str] = set()
    for number, line in enumerate(text.splitlines()):
        if not number & 255:
            pause()
        stripped = line.strip()
        if not stripped:
            continue
        name = line_name(stripped)
        if not name:
            continue
        (families if stripped.startswith("#") else samples).add(name)
        if name in keys or family_key(name) in keys:
            kept.append(stripped)
    return "\n".join(kept) + "\n", families, samples


def _is_normalised_sample(name: str) -> bool:
    return any(
        name == n or (name.startswith(n) and name[len(n) :] in ("_bucket", "_sum", "_count"))
        for n in NORMALISED
    )


def _layer(spec: EngineSpec | None, index: SampleIndex, keys: frozenset[str]) -> Layer:
    """``frontend`` when every family the rules read is a front-end's."""
    if spec is None or not spec.frontend_prefixes:
        return "engine"
    read = [name for name in index if name in keys or family_key(name) in keys]
    if read and all(name.startswith(spec.frontend_prefixes) for name in read):
        return "frontend"
    return "engine"


def _label_version(index: SampleIndex, label: str, keys: frozenset[str]) -> str:
    for name in sorted(index):
        if name in keys or family_key(name) in keys:
            for labels in index[name]:
                value = dict(labels).get(label)
                if value:
                    return value
    return ""


def _label_role(index: SampleIndex, role: RoleLabel, keys: frozenset[str]) -> Role | None:
    """The role the first series the rules read says with its role label, or None."""
    meaning = dict(role.values)
    for name in sorted(index):
        if name in keys or family_key(name) in keys:
            for labels in index[name]:
                found = meaning.get(dict(labels).get(role.label, ""))
                if found is not None:
                    return found
    return None


def normalise(
    families: Sequence[Metric] | SampleIndex,
    engine: str,
    *,
    mapping: CustomMapping | None = None,
    max_series: int = 1000,
    default_model: str = "",
    model_origin: str = "",
) -> EngineSnapshot:
    """The normalised series of ``families`` (or of a sample index) read as engine type
    ``engine``.

    ``mapping`` is used by ``custom`` only (None: the identity mapping alone). At most
    ``max_series`` series per normalised name are kept; the others are counted in
    ``EngineSnapshot.dropped[name]``. Model names are made readable, and series whose
    metrics name no model take ``default_model`` (what the engine's API at ``model_origin``
    calls its model; :mod:`exporter.engines.models`). Raises :class:`ValueError` for an
    unknown engine type."""
    rules = _rules(engine, mapping)
    index = families if isinstance(families, Mapping) else index_samples(families)
    spec = BY_ENGINE.get(engine)
    snapshot = apply_rules(
        dict(index),
        engine,
        rules,
        max_series=max_series,
        model_alias=spec.model_alias if spec is not None else None,
    )
    if spec is not None and (spec.frontend_prefixes or spec.version.label or spec.role):
        keys = source_keys(engine)
        snapshot.layer = _layer(spec, index, keys)
        if spec.version.label:
            snapshot.version = _label_version(index, spec.version.label, keys)
        if spec.role is not None:
            snapshot.role = _label_role(index, spec.role, keys)
    return name_models(snapshot, default_model, model_origin)


#: Names a front-end measures for each request as the user sees it; an engine behind it
#: measures the same requests again.
REQUEST_LEVEL = frozenset(
    {
        "inference_time_to_first_token_seconds",
        "inference_inter_token_latency_seconds",
        "inference_e2e_request_latency_seconds",
        "inference_prompt_tokens_total",
        "inference_generation_tokens_total",
    }
)


def layered(snapshots: Sequence[EngineSnapshot]) -> list[list[Series]]:
    """The series of each snapshot to export when several endpoints are polled together, so
    that no request is counted twice: when front-ends (Dynamo's frontend) and engines are
    both there, a request-level name (:data:`REQUEST_LEVEL`) is taken from the front-ends
    only and any other name from the engines only; a name only one layer has stays. Snapshots
    of one layer are all kept (disaggregated prefill and decode servers, several workers:
    distinct queues and requests)."""
    by_layer: dict[Layer, set[str]] = {"engine": set(), "frontend": set()}
    for snap in snapshots:
        by_layer[snap.layer] |= {s.name for s in snap.series}
    out: list[list[Series]] = []
    for snap in snapshots:
        other = by_layer["frontend" if snap.layer == "engine" else "engine"]
        if not other:
            out.append(list(snap.series))
            continue
        if snap.layer == "frontend":
            keep = [s for s in snap.series if s.name in REQUEST_LEVEL or s.name not in other]
        else:
            keep = [s for s in snap.series if s.name not in REQUEST_LEVEL or s.name not in other]
        out.append(keep)
    return out


def digest(
    text: str,
    configured: str,
    *,
    keys: frozenset[str],
    mapping: CustomMapping | None = None,
    max_series: int = 1000,
    pause: Callable[[], None] = no_pause,
    default_model: str = "",
    model_origin: str = "",
) -> EngineSnapshot:
    """One engine poll's work on the body: keep the families in ``keys`` (see
    :func:`poll_keys`), recognise the engine when ``configured`` is ``auto``, normalise
    (``default_model`` and ``model_origin`` as for :func:`normalise`).

    Raises :class:`ValueError` for a malformed exposition and :class:`UnrecognisedError` for one
    whose names belong to no engine."""
    scanned = scan(text, keys, pause)
    engine = configured
    if configured == "auto":
        found = detect_names(scanned.families, scanned.samples)
        if found is None:
            parse_exposition(text)  # not an exposition at all: a parse failure, as before
            raise UnrecognisedError("could not recognise the engine from its metric names")
        engine = found
    return normalise(
        scanned.index,
        engine,
        mapping=mapping,
        max_series=max_series,
        default_model=default_model,
        model_origin=model_origin,
    )
