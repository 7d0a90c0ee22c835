"""The engine mappings in words: the tables people read, rendered from the executed rules.

Each engine's mapping is written once, as the :class:`~exporter.engines.rules.Rule` table of
its module (with a ``note`` where a reader needs one); ``build-tools/docgen.py`` renders the
engine tables of ``docs/engines.md`` and the source column of ``docs/metrics.md`` from them
with these functions, and CI fails when a rendered table differs from the committed one.
Nothing here is read while the sidecar runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from exporter.engines import BY_ENGINE, NORMALISED, SPECS
from exporter.engines.rules import (
    AnySource,
    CounterPair,
    LabelMatcher,
    Product,
    Rule,
    Source,
)
from exporter.engines.spec import EngineSpec, ModelName

#: What a reader first asks of an engine: the names below that it cannot fill are listed in
#: the engine table (the disaggregation and estimate names are shown in each engine's table).
CORE: tuple[str, ...] = (
    "inference_queue_depth",
    "inference_requests_running",
    "inference_kv_cache_usage_ratio",
    "inference_kv_cache_capacity_tokens",
    "inference_prompt_tokens_total",
    "inference_prompt_tokens_cached_total",
    "inference_generation_tokens_total",
    "inference_time_to_first_token_seconds",
    "inference_inter_token_latency_seconds",
    "inference_e2e_request_latency_seconds",
    "inference_queue_time_seconds",
    "inference_prefill_time_seconds",
    "inference_decode_time_seconds",
)

_AGGREGATE = {
    "max": "the fullest of a model's engines",
    "mean": "the mean over a model's engines: one GPU's share",
}


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _matchers(matchers: Sequence[LabelMatcher]) -> str:
    if not matchers:
        return ""
    return "{" + ",".join(f'{m.label}{m.op}"{m.value}"' for m in matchers) + "}"


def _source(source: Source) -> str:
    text = f"`{source.metric}{_matchers(source.matchers)}`"
    if source.value_labels:
        labels = " x ".join(f"`{label}`" for label in source.value_labels)
        text += f" (its label{'s' if len(source.value_labels) > 1 else ''} {labels})"
    if source.scale != 1.0:
        text += f" x {_number(source.scale)}"
    if source.divisor != 1.0:
        text += f" / {_number(source.divisor)}"
    if source.fixed:
        text += " as " + ", ".join(f'`{label}="{value}"`' for label, value in source.fixed)
    if source.blank_models:
        blanks = ", ".join(f'"{value}"' for value in source.blank_models)
        text += f" (model {blanks}: none)"
    if source.note:
        text += f" ({source.note})"
    return text


def source_text(source: AnySource) -> str:
    """One source as the docs write it: its name with matchers, conversion and note."""
    if isinstance(source, Product):
        text = f"{_source(source.left)} x {_source(source.right)}"
    elif isinstance(source, CounterPair):
        text = f"{_source(source.total)} / {_source(source.count)} (`+Inf` bucket only)"
    else:
        return _source(source)
    return f"{text} ({source.note})" if source.note else text


def rule_text(r: Rule) -> str:
    """A rule as the docs write it: alternatives newest first, each a sum of its sources."""
    alternatives = [" + ".join(source_text(s) for s in alt) for alt in r.alternatives]
    text = "; else ".join(alternatives)
    notes = [n for n in (_AGGREGATE.get(r.aggregate, ""), r.note) if n]
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _name(source: Source) -> str:
    fixed = "".join(f' as `{label}="{value}"`' for label, value in source.fixed)
    return f"`{source.metric}{_matchers(source.matchers)}`{fixed}"


def _names(source: AnySource) -> str:
    if isinstance(source, Product):
        return f"{_name(source.left)} x {_name(source.right)}"
    if isinstance(source, CounterPair):
        return f"{_name(source.total)} / {_name(source.count)}"
    return _name(source)


def _current(r: Rule) -> str:
    """The names of a rule's first alternative, without conversions or notes."""
    return " + ".join(_names(s) for s in r.alternatives[0])


def _rules_of(spec: EngineSpec) -> dict[str, Rule]:
    return {r.target: r for r in spec.written}


def source_column(metric: str) -> str:
    """The source column of ``docs/metrics.md`` for a normalised name: each engine's current
    source (older names and the details are in ``docs/engines.md``), or ``""``."""
    parts = [
        f"{spec.title} {_current(r)}"
        for spec in SPECS
        if (r := _rules_of(spec).get(metric)) is not None
    ]
    if not parts:
        return ""
    return "; ".join(parts) + " (older names and conversions: docs/engines.md)"


def _model_labels(spec: EngineSpec) -> list[str]:
    labels: list[str] = []
    for r in spec.rules:
        for alternative in r.alternatives:
            for source in alternative:
                inner: Iterable[Source] = (
                    (source.left, source.right)
                    if isinstance(source, Product)
                    else (source.total, source.count)
                    if isinstance(source, CounterPair)
                    else (source,)
                )
                for one in inner:
                    names = one.model_label
                    for name in (names,) if isinstance(names, str) else names or ():
                        if name not in labels:
                            labels.append(name)
    return labels


def _place(name: ModelName) -> str:
    places = " or ".join(
        "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in place)
        for place in name.keys
    )
    return f"`{name.path}` `{places}`"


def model_from(spec: EngineSpec) -> str:
    """Where the engine's model name comes from, in words."""
    labels = _model_labels(spec)
    parts = [f"label {', '.join(f'`{label}`' for label in labels)}"] if labels else []
    if spec.model is not None:
        parts.append(("else " if parts else "") + _place(spec.model))
    return "; ".join(parts) or "none"


def version_from(spec: EngineSpec) -> str:
    """Where the engine's version comes from, in words."""
    version = spec.version
    if version.label:
        return f"label `{version.label}`"
    if version.path:
        keys = " or ".join(f"`{key}`" for key in version.keys)
        return f"`{version.path}` {keys}"
    return "none"


def _endpoint(spec: EngineSpec) -> str:
    port = f":{spec.serving.port}" if spec.serving is not None else ""
    return f"`{port}{spec.metrics_path}`"


def engine_table() -> str:
    """One row per engine: what it is, where the sidecar reads it, what it cannot fill."""
    out = [
        "| engine (`engine` label) | metrics | model from | version from | tokenize probe "
        "| cannot fill |",
        "|---|---|---|---|---|---|",
    ]
    for spec in SPECS:
        filled = {r.target for r in spec.rules}
        missing = ", ".join(f"`{name}`" for name in CORE if name not in filled) or "-"
        probe = f"`{spec.tokenize.path}`" if spec.tokenize else "none"
        out.append(
            f"| {spec.title} (`{spec.name}`) | {_endpoint(spec)} | {model_from(spec)} "
            f"| {version_from(spec)} | {probe} | {missing} |"
        )
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def mapping_tables() -> str:
    """One table per engine: each normalised name it fills and from what, in the order of
    the metric catalogue; then what it reads as other engines and what it leaves out."""
    out: list[str] = []
    for spec in SPECS:
        rules = _rules_of(spec)
        out += [f"### {spec.title} (`{spec.name}`)", ""]
        if spec.reads_as:
            others = ", ".join(f"{BY_ENGINE[name].title}'s" for name in spec.reads_as)
            out += [
                f"Read first with {others} tables (the families it serves unchanged); then:",
                "",
            ]
        out += ["| normalised | source (older names after the first) |", "|---|---|"]
        for name in NORMALISED:
            if name in rules:
                out.append(f"| `{name}` | {_cell(rule_text(rules[name]))} |")
        if spec.composition is not None and spec.composition.doc:
            out += ["", spec.composition.doc]
        if spec.left_out:
            by_reason: dict[str, list[str]] = {}
            for metric, reason in spec.left_out:
                by_reason.setdefault(reason, []).append(metric)
            out += ["", "Not read (checked against the engine's own list of its metrics):", ""]
            out += [
                f"- {reason}: {', '.join(f'`{m}`' for m in metrics)}"
                for reason, metrics in by_reason.items()
            ]
        out.append("")
    return "\n".join(out)


def info_source() -> str:
    """The source column of ``inference_engine_info``: where each engine's version and
    model come from."""
    versions = "; ".join(f"{spec.title} {version_from(spec)}" for spec in SPECS)
    return f"engine type as configured or recognised; version from: {versions}"


def model_info_source() -> str:
    """The source column of ``inference_engine_model_info``."""
    models = "; ".join(f"{spec.title} {model_from(spec)}" for spec in SPECS)
    return f"the model as the engine names it: {models}"
