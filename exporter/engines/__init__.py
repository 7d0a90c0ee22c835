"""Engine adapters: from an engine's own ``/metrics`` to the normalised ``inference_*`` series.

Pure functions over parsed families (no I/O except :func:`load_mapping`, no registry)::

    families = parse_exposition(body)          # ValueError when the body is not an exposition
    engine = detect(families)                  # "vllm", "sglang", ... or None
    snapshot = normalise(families, engine, mapping=None, max_series=1000)

One module per engine holds its :class:`~exporter.engines.model.EngineSpec` (metric prefixes,
the declarative mapping table with current and deprecated names, model label and unit
conversion, tokenize endpoint, process regex) and documents what it maps and why; :mod:`.rules`
applies the tables the same way for every engine. Adding an engine is one module and one entry
in :data:`SPECS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.metrics_core import Metric

from exporter.engines import custom, llamacpp, sglang, tgi, triton, vllm
from exporter.engines.custom import CustomMapping, load_mapping
from exporter.engines.model import EngineSnapshot, EngineSpec
from exporter.engines.parse import parse_exposition
from exporter.engines.rules import NORMALISED, CounterPair, apply_rules
from exporter.priority import no_pause

__all__ = [
    "ENGINES",
    "NORMALISED",
    "SPECS",
    "CustomMapping",
    "detect",
    "detect_names",
    "load_mapping",
    "normalise",
    "parse_exposition",
    "select_families",
    "source_keys",
]

#: Every engine the sidecar reads, in the order of ``--engine.type``'s choices.
SPECS: tuple[EngineSpec, ...] = (vllm.SPEC, sglang.SPEC, tgi.SPEC, triton.SPEC, llamacpp.SPEC)
BY_ENGINE: dict[str, EngineSpec] = {spec.name: spec for spec in SPECS}

#: Engine types, as given to ``--engine.type`` (besides ``auto``) and used as label ``engine``:
#: the specs' and ``custom`` (a YAML mapping, or a server instrumented with the normalised names).
ENGINES: tuple[str, ...] = (*BY_ENGINE, "custom")

# An engine that serves another's metrics next to its own is recognised first.
_DETECTION_ORDER: tuple[EngineSpec, ...] = tuple(
    sorted(SPECS, key=lambda spec: not any(w in BY_ENGINE for w in spec.wraps))
)


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
    """:func:`detect` from the family names and sample names alone."""
    every = names | samples
    for spec in _DETECTION_ORDER:
        if any(name.startswith(spec.prefixes) for name in every):
            return spec.name
    if any(_is_normalised_sample(name) for name in samples):
        return "custom"
    return None


_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")


def _key(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def source_keys(engine: str, mapping: CustomMapping | None = None) -> frozenset[str]:
    """Family keys (names without ``_total``, ``_bucket``, ...) the engine's rules read."""
    rules = custom.rules(mapping) if engine == "custom" else BY_ENGINE[engine].rules
    keys: set[str] = set()
    for r in rules:
        for alternative in r.alternatives:
            for source in alternative:
                parts = (
                    (source.total, source.count) if isinstance(source, CounterPair) else (source,)
                )
                for part in parts:
                    keys |= {part.metric, _key(part.metric)}
    return frozenset(keys)


def _line_name(line: str) -> str:
    """The metric name a line is about: the family of a HELP/TYPE line, a sample's name."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE", "UNIT") else ""
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop)
        if 0 <= at < end:
            end = at
    return line[:end]


def select_families(
    text: str, keys: frozenset[str], pause: Callable[[], None] = no_pause
) -> tuple[str, set[str], set[str]]:
    """The lines of ``text`` whose family is in ``keys`` (whole families: every part of a
    histogram or counter), and the family and sample names seen, for :func:`detect_names`.
    ``pause`` is called every 256 lines (see :func:`exporter.engines.parse.parse_exposition`)."""
    kept: list[str] = []
    families: set[str] = set()
    samples: set[str] = set()
    for number, line in enumerate(text.splitlines()):
        if not number & 255:
            pause()
        stripped = line.strip()
        if not stripped:
            continue
        name = _line_name(stripped)
        if not name:
            continue
        (families if stripped.startswith("#") else samples).add(name)
        if name in keys or _key(name) in keys:
            kept.append(stripped)
    return "\n".join(kept) + "\n", families, samples


def _is_normalised_sample(name: str) -> bool:
    return any(
        name == n or (name.startswith(n) and name[len(n) :] in ("_bucket", "_sum", "_count"))
        for n in NORMALISED
    )


def normalise(
    families: Sequence[Metric],
    engine: str,
    *,
    mapping: CustomMapping | None = None,
    max_series: int = 1000,
) -> EngineSnapshot:
    """The normalised series of ``families`` read as engine type ``engine``.

    ``mapping`` is used by ``custom`` only (None: the identity mapping alone). At most
    ``max_series`` series per normalised name are kept; the others are counted in
    ``EngineSnapshot.dropped[name]``. Raises :class:`ValueError` for an unknown engine type."""
    if engine == "custom":
        rules = custom.rules(mapping)
    elif engine in BY_ENGINE:
        rules = BY_ENGINE[engine].rules
    else:
        raise ValueError(f"unknown engine type {engine!r} (one of: {', '.join(ENGINES)})")
    return apply_rules(families, engine, rules, max_series=max_series)
