"""``custom``: the YAML mapping (matchers, scale, model label), the identity mapping and the
mapping file's error messages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from exporter.engines import CustomMapping, load_mapping, normalise, parse_exposition
from exporter.engines.snapshot import EngineSnapshot, Series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
INF = math.inf


def one(snap: EngineSnapshot, name: str, model: str = "") -> Series:
    found = [s for s in snap.series if s.name == name and s.model == model]
    assert len(found) == 1, found
    return found[0]


def mapping_from(tmp_path: Path, text: str) -> CustomMapping:
    path = tmp_path / "mapping.yaml"
    path.write_text(text, encoding="utf-8")
    return load_mapping(path)


def run(text: str, mapping: CustomMapping | None) -> EngineSnapshot:
    return normalise(parse_exposition(text), "custom", mapping=mapping)


# --- the fixture ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acme() -> EngineSnapshot:
    mapping = load_mapping(FIXTURES / "custom-mapping.yaml")
    text = (FIXTURES / "custom.txt").read_text(encoding="utf-8")
    return normalise(parse_exposition(text), "custom", mapping=mapping)


def test_fixture_mapping_with_matchers_scale_and_model_label(acme: EngineSnapshot) -> None:
    assert acme.engine == "custom"
    assert one(acme, "inference_queue_depth", "chat-70b").value == 5.0  # interactive only
    assert one(acme, "inference_queue_depth", "code-8b").value == 1.0
    assert one(acme, "inference_requests_running", "chat-70b").value == 31.0
    assert one(acme, "inference_kv_cache_usage_ratio", "chat-70b").value == 83 * 0.01
    assert one(acme, "inference_kv_cache_usage_ratio", "code-8b").value == 0.25
    assert one(acme, "inference_prompt_tokens_total", "chat-70b").value == 905216.0
    ttft = one(acme, "inference_time_to_first_token_seconds", "chat-70b")
    ms = (50, 100, 250, 500, 1000, 2500, 5000)
    assert tuple(b for b, _ in ttft.buckets) == (*(b * 0.001 for b in ms), INF)
    assert tuple(c for _, c in ttft.buckets) == (
        0.0,
        0.0,
        300.0,
        800.0,
        1000.0,
        1000.0,
        1000.0,
        1000.0,
    )
    assert (ttft.sum, ttft.count) == (420.0, 1000.0)
    assert one(acme, "inference_time_to_first_token_seconds", "code-8b").sum == 10.0


def test_fixture_identity_names_are_read_as_is(acme: EngineSnapshot) -> None:
    assert one(acme, "inference_generation_tokens_total", "chat-70b").value == 262144.0
    assert one(acme, "inference_generation_tokens_total", "code-8b").value == 32768.0
    tok = one(acme, "inference_tokenizer_latency_seconds", "")
    assert (tok.sum, tok.count) == (1.26953125, 1000.0)
    assert dict(tok.buckets)[0.001] == 700.0
    assert {s.name for s in acme.series if s.name.startswith("acme")} == set()


# --- identity ------------------------------------------------------------------------------------


def instrumented_server() -> str:
    """What a server instrumented with the normalised names exposes (prometheus_client)."""
    reg = CollectorRegistry()
    Gauge("inference_queue_depth", "", ["model"], registry=reg).labels("a").set(3)
    Gauge("inference_kv_cache_usage_ratio", "", ["model"], registry=reg).labels("a").set(0.5)
    Counter("inference_prompt_tokens", "", ["model"], registry=reg).labels("a").inc(10)
    itl = Histogram(
        "inference_inter_token_latency_seconds", "", ["model"], buckets=[0.01, 0.1], registry=reg
    )
    itl.labels("a").observe(0.0078125)
    itl.labels("b").observe(0.0625)
    tok = Histogram(
        "inference_tokenizer_latency_seconds", "", ["source"], buckets=[0.001], registry=reg
    )
    tok.labels("engine").observe(0.0009765625)
    Gauge("inference_engine_up", "", ["engine"], registry=reg).labels("x").set(1)
    return generate_latest(reg).decode()


def test_identity_mapping_without_a_file() -> None:
    snap = run(instrumented_server(), None)
    assert [(s.name, s.model) for s in snap.series] == [
        ("inference_queue_depth", "a"),
        ("inference_kv_cache_usage_ratio", "a"),
        ("inference_prompt_tokens_total", "a"),
        ("inference_inter_token_latency_seconds", "a"),
        ("inference_inter_token_latency_seconds", "b"),
        ("inference_tokenizer_latency_seconds", ""),
    ]
    assert one(snap, "inference_prompt_tokens_total", "a").value == 10.0
    itl = one(snap, "inference_inter_token_latency_seconds", "b")
    assert (itl.buckets, itl.sum, itl.count) == (((0.01, 0.0), (0.1, 1.0), (INF, 1.0)), 0.0625, 1.0)


def test_mapped_source_comes_before_the_identity(tmp_path: Path) -> None:
    mapping = mapping_from(
        tmp_path,
        "metrics:\n  - target: inference_queue_depth\n    source: my_queue\n"
        "    model_label: model\n",
    )
    both = instrumented_server() + 'my_queue{model="a"} 11\n'
    assert one(run(both, mapping), "inference_queue_depth", "a").value == 11.0
    # the mapped source absent: the identity name still counts
    assert one(run(instrumented_server(), mapping), "inference_queue_depth", "a").value == 3.0


# --- mapping features ----------------------------------------------------------------------------


MATCHERS = """\
model_label: svc
metrics:
  - target: inference_queue_depth
    source: q
    labels:
      kind: {regex: "chat|code"}
      state: {not: paused}
      pool: {not_regex: "batch-.*"}
  - target: inference_requests_running
    source: running
    labels: {shard: 0}
  - target: inference_requests_running
    source: running_extra
"""

MATCHED_TEXT = """\
q{svc="s",kind="chat",state="ok",pool="main"} 1
q{svc="s",kind="code",state="ok",pool="main"} 2
q{svc="s",kind="embed",state="ok",pool="main"} 100
q{svc="s",kind="chat",state="paused",pool="main"} 100
q{svc="s",kind="chat",state="ok",pool="batch-1"} 100
q{svc="s",kind="chat",pool="main"} 4
running{svc="s",shard="0"} 5
running{svc="s",shard="1"} 100
running_extra{svc="s"} 6
"""


def test_label_matchers_and_entries_with_one_target_added(tmp_path: Path) -> None:
    snap = run(MATCHED_TEXT, mapping_from(tmp_path, MATCHERS))
    assert one(snap, "inference_queue_depth", "s").value == 7.0  # 1 + 2 + 4 (state "" != paused)
    assert one(snap, "inference_requests_running", "s").value == 11.0  # shard 0 + the extra


def test_entry_model_label_overrides_the_default_and_empty_means_none(tmp_path: Path) -> None:
    mapping = mapping_from(
        tmp_path,
        "model_label: svc\nmetrics:\n"
        "  - {target: inference_queue_depth, source: q, model_label: deployment}\n"
        "  - {target: inference_requests_running, source: r, model_label: ''}\n",
    )
    snap = run('q{svc="x",deployment="d"} 1\nr{svc="x"} 2\n', mapping)
    assert one(snap, "inference_queue_depth", "d").value == 1.0
    assert one(snap, "inference_requests_running", "").value == 2.0


def test_counter_source_with_or_without_total_and_histogram_sum_as_counter(
    tmp_path: Path,
) -> None:
    mapping = mapping_from(
        tmp_path,
        "metrics:\n"
        "  - {target: inference_prompt_tokens_total, source: my_prompt_tokens}\n"
        "  - {target: inference_generation_tokens_total, source: my_out_tokens_sum}\n",
    )
    text = (
        "# TYPE my_prompt_tokens_total counter\nmy_prompt_tokens_total 9\n"
        "# TYPE my_out_tokens histogram\n"
        'my_out_tokens_bucket{le="+Inf"} 2\nmy_out_tokens_sum 64\nmy_out_tokens_count 2\n'
    )
    snap = run(text, mapping)
    assert one(snap, "inference_prompt_tokens_total").value == 9.0
    assert one(snap, "inference_generation_tokens_total").value == 64.0


def test_summary_source_becomes_an_inf_only_histogram(tmp_path: Path) -> None:
    mapping = mapping_from(
        tmp_path,
        "metrics:\n  - {target: inference_e2e_request_latency_seconds, source: lat_ms, "
        "scale: 0.001}\n",
    )
    text = '# TYPE lat_ms summary\nlat_ms{quantile="0.5"} 40\nlat_ms_sum 2500\nlat_ms_count 50\n'
    e2e = one(run(text, mapping), "inference_e2e_request_latency_seconds")
    assert (e2e.buckets, e2e.sum, e2e.count) == (((INF, 50.0),), 2.5, 50.0)


# --- mapping file errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("metrics: [\n", "invalid YAML: "),
        ("- a\n- b\n", "expected a mapping with a 'metrics' list at the top"),
        ("metrics: []\n", "metrics: expected a non-empty list of mappings"),
        ("metrix: []\n", "unknown key 'metrix' (expected model_label, metrics)"),
        ("metrics:\n  - just a string\n", "metrics[0]: expected a mapping with target and source"),
        (
            "metrics:\n  - {target: inference_queue_size, source: q}\n",
            "metrics[0].target: unknown normalised metric 'inference_queue_size' (one of: ",
        ),
        (
            "metrics:\n  - {target: inference_engine_up, source: q}\n",
            "metrics[0].target: unknown normalised metric 'inference_engine_up'",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: 'my-queue'}\n",
            "metrics[0].source: not a metric name: 'my-queue'",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth}\n",
            "metrics[0].source: not a metric name: None",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, labels: {a: {regex: '('}}}\n",
            "metrics[0].labels.a: invalid regex '(': ",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, labels: {a: {like: x}}}\n",
            "metrics[0].labels.a: expected one of equal, not, not_regex, regex as the only key",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, labels: {a: [x]}}\n",
            "metrics[0].labels.a: expected a string value, got ['x']",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, labels: [a]}\n",
            "metrics[0].labels: expected a mapping of label name to matcher",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, labels: {a-b: x}}\n",
            "metrics[0].labels.a-b: not a label name: 'a-b'",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, scale: 0}\n",
            "metrics[0].scale: must be a positive finite number, got 0",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, scale: fast}\n",
            "metrics[0].scale: expected a number, got 'fast'",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q, model_label: 'a b'}\n",
            "metrics[0].model_label: not a label name: 'a b'",
        ),
        (
            "metrics:\n  - {target: inference_queue_depth, source: q}\n"
            "  - {target: inference_queue_depth, source: q, unit: ms}\n",
            "metrics[1]: unknown key 'unit' (expected labels, model_label, scale, source, target)",
        ),
    ],
)
def test_mapping_file_errors_name_the_file_and_the_place(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_mapping(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {problem}"), message
    assert "\n" not in message


def test_yaml_error_carries_the_line(tmp_path: Path) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text("metrics:\n  - target: x\n   source: y\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"invalid YAML: .*\(line 3\)"):
        load_mapping(path)


def test_missing_mapping_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ValueError) as info:
        load_mapping(path)
    assert str(info.value) == f"{path}: cannot read: No such file or directory"


def test_fixture_mapping_loads() -> None:
    mapping = load_mapping(FIXTURES / "custom-mapping.yaml")
    assert [e.target for e in mapping.entries] == [
        "inference_queue_depth",
        "inference_requests_running",
        "inference_kv_cache_usage_ratio",
        "inference_prompt_tokens_total",
        "inference_time_to_first_token_seconds",
    ]
    assert {e.source.model_label for e in mapping.entries} == {"deployment"}
    assert mapping.origin.endswith("custom-mapping.yaml")
