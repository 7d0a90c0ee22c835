"""Each engine mapping is written once: the rule tables the sidecar runs.

``docs/engines.md`` and the source column of ``docs/metrics.md`` are rendered from them
(``build-tools/docgen.py --check`` in lint); these tests keep the other places from growing a
second copy, and the rendering honest about what the rules do.
"""

from __future__ import annotations

from exporter.engines import BY_ENGINE, NORMALISED, SPECS, describe
from exporter.engines.rules import LabelMatcher, Source, merge_tables, rule, source_names
from exporter.metrics import BY_NAME


def test_the_catalogue_names_no_engine_metric_the_rules_read() -> None:
    """The catalogue's source words for a normalised name may say what the sidecar itself
    does (the tokenizer probe), never which engine metric feeds it: that is the rules'."""
    read = {name for spec in SPECS for name in source_names(spec.rules)}
    for name in NORMALISED:
        words = BY_NAME[name].source
        assert not [metric for metric in read if metric in words], name


def test_an_engine_that_reads_others_runs_their_tables_then_its_own() -> None:
    for spec in SPECS:
        if not spec.reads_as:
            assert spec.own_rules is None, spec.name
            continue
        tables = [BY_ENGINE[name].rules for name in spec.reads_as]
        assert spec.own_rules is not None
        assert spec.rules == merge_tables(*tables, spec.own_rules), spec.name


def test_a_rule_reads_as_the_docs_say() -> None:
    r = rule(
        "inference_kv_transfer_failures_total",
        (
            Source("a_total", model_label="m", fixed=(("reason", "transfer"),)),
            Source("b_total", (LabelMatcher("x", "!=", "y"),), divisor=1000.0, note="since 2"),
        ),
        Source("c", scale=1048576.0, blank_models=("undefined",)),
    )
    assert describe.rule_text(r) == (
        '`a_total` as `reason="transfer"` + `b_total{x!="y"}` / 1000 (since 2); '
        'else `c` x 1048576 (model "undefined": none)'
    )


def test_every_engine_and_every_source_it_reads_is_in_the_rendered_tables() -> None:
    tables = describe.mapping_tables()
    for spec in SPECS:
        assert f"### {spec.title} (`{spec.name}`)" in tables
        for name in source_names(spec.written):
            assert f"`{name}" in tables, (spec.name, name)


def test_the_source_column_names_each_engine_that_fills_a_name() -> None:
    column = describe.source_column("inference_queue_depth")
    for spec in SPECS:
        filled = {r.target for r in spec.written}
        assert (f"{spec.title} `" in column) == ("inference_queue_depth" in filled), spec.name
    assert describe.source_column("inference_h2d_copy_seconds") == ""
