"""parse_exposition and normalise on hostile or sloppy input: errors are ValueError, never a
crash, and bad series are dropped rather than passed on."""

from __future__ import annotations

import math

import pytest
from prometheus_client.metrics_core import Metric

from exporter.engines import normalise, parse_exposition
from exporter.engines.snapshot import EngineSnapshot, Series

INF = math.inf


def one(snap: EngineSnapshot, name: str, model: str = "") -> Series:
    found = [s for s in snap.series if s.name == name and s.model == model]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    "text",
    [
        "garbage line without value\n",
        'vllm:num_requests_waiting{model_name="m} 1\n',
        'x{a="1",a="2"} 3\n',
        "x 0x10\n",
        "x 1 abc\n",
        "<html><body>502 Bad Gateway</body></html>\n",
        '{"object": "error", "message": "not found"}\n',
        "\x00\xff\x01\n",
        "x " + "9" * 5000 + "x\n",
    ],
)
def test_malformed_input_is_a_short_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=r"^malformed exposition: ") as info:
        parse_exposition(text)
    assert "\n" not in str(info.value)
    assert len(str(info.value)) <= 150


def test_empty_body_is_no_families() -> None:
    assert parse_exposition("") == []
    assert normalise(parse_exposition("\n# just a comment\n"), "vllm").series == []


def test_non_finite_gauge_and_counter_values_are_dropped() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} NaN\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} +Inf\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{model_name="m"} -Inf\n'
    )
    families = parse_exposition(text)
    values = [s.value for f in families for s in f.samples]
    assert values == [2.0]
    snap = normalise(families, "vllm")
    assert [(s.name, s.value) for s in snap.series] == [("inference_queue_depth", 2.0)]


def test_histogram_with_a_non_finite_sum_is_dropped_whole() -> None:
    text = (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="bad"} 1\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="bad"} 1\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="bad"} NaN\n'
        'vllm:e2e_request_latency_seconds_count{model_name="bad"} 1\n'
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="inf"} +Inf\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="inf"} 1\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="inf"} 1\n'
        'vllm:e2e_request_latency_seconds_count{model_name="inf"} 1\n'
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="ok"} 1\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="ok"} 2\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="ok"} 3\n'
        'vllm:e2e_request_latency_seconds_count{model_name="ok"} 2\n'
    )
    (family,) = parse_exposition(text)
    assert {s.labels["model_name"] for s in family.samples} == {"ok"}
    snap = normalise([family], "vllm")
    assert [s.model for s in snap.series] == ["ok"]
    assert one(snap, "inference_e2e_request_latency_seconds", "ok").buckets == (
        (1.0, 1.0),
        (INF, 2.0),
    )


def test_normalise_never_trusts_its_input_either() -> None:
    """Families built by hand (not through parse_exposition) with NaN, a decreasing histogram,
    an unparsable bound and a histogram without _sum: all skipped, nothing raised."""
    gauge = Metric("vllm:num_requests_waiting", "", "gauge")
    gauge.add_sample("vllm:num_requests_waiting", {"model_name": "m"}, math.nan)
    gauge.add_sample("vllm:num_requests_running", {"model_name": "m"}, 3.0)
    hist = Metric("vllm:e2e_request_latency_seconds", "", "histogram")
    series = {
        "decreasing": [("1.0", 5.0), ("+Inf", 4.0)],
        "badbound": [("one", 1.0), ("+Inf", 1.0)],
        "nosum": [("+Inf", 1.0)],
        "good": [("2.5", 1.0)],  # no +Inf bucket: taken from _count
    }
    for model, buckets in series.items():
        for le, count in buckets:
            hist.add_sample(
                "vllm:e2e_request_latency_seconds_bucket", {"model_name": model, "le": le}, count
            )
        if model != "nosum":
            hist.add_sample("vllm:e2e_request_latency_seconds_sum", {"model_name": model}, 1.0)
        hist.add_sample("vllm:e2e_request_latency_seconds_count", {"model_name": model}, 1.0)
    snap = normalise([gauge, hist], "vllm")
    assert [(s.name, s.model) for s in snap.series] == [
        ("inference_requests_running", "m"),
        ("inference_e2e_request_latency_seconds", "good"),
    ]
    assert one(snap, "inference_e2e_request_latency_seconds", "good").buckets == (
        (2.5, 1.0),
        (INF, 1.0),
    )


def test_duplicated_families_are_merged_and_a_repeated_series_counted_once() -> None:
    text = (
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{dp_rank="0",model_name="m"} 4.0\n'
        "# HELP sglang:token_usage The token usage.\n"
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{dp_rank="0",model_name="m"} 0.5\n'
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{dp_rank="0",model_name="m"} 4.0\n'
        'sglang:num_queue_reqs{dp_rank="1",model_name="m"} 3.0\n'
        'sglang:num_queue_reqs{model_name="m",dp_rank="1"} 99.0\n'
    )
    families = parse_exposition(text)
    assert [f.name for f in families] == ["sglang:num_queue_reqs", "sglang:token_usage"]
    assert [s.value for s in families[0].samples] == [4.0, 3.0]
    snap = normalise(families, "sglang")
    assert one(snap, "inference_queue_depth", "m").value == 7.0


def test_untyped_block_of_a_family_takes_the_type_of_a_typed_one() -> None:
    families = parse_exposition('x 1\n# TYPE x gauge\nx{a="b"} 2\n')
    assert [(f.name, f.type, len(f.samples)) for f in families] == [("x", "gauge", 2)]


def test_created_samples_are_never_read_as_values() -> None:
    text = (
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{model_name="m"} 5.0\n'
        "# HELP vllm:generation_tokens_created Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_created gauge\n"
        'vllm:generation_tokens_created{model_name="m"} 1.7645814e+09\n'
        "# TYPE vllm:request_queue_time_seconds histogram\n"
        'vllm:request_queue_time_seconds_bucket{le="+Inf",model_name="m"} 1.0\n'
        'vllm:request_queue_time_seconds_count{model_name="m"} 1.0\n'
        'vllm:request_queue_time_seconds_sum{model_name="m"} 0.5\n'
        'vllm:request_queue_time_seconds_created{model_name="m"} 1.7645814e+09\n'
    )
    snap = normalise(parse_exposition(text), "vllm")
    assert one(snap, "inference_generation_tokens_total", "m").value == 5.0
    queue = one(snap, "inference_queue_time_seconds", "m")
    assert (queue.buckets, queue.sum, queue.count) == (((INF, 1.0),), 0.5, 1.0)


@pytest.mark.parametrize(
    "text",
    [
        # prometheus_client style: TYPE with _total
        "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 7\n",
        # TYPE without _total, sample with it: the parser makes an untyped family of it
        "# TYPE llamacpp:prompt_tokens counter\nllamacpp:prompt_tokens_total 7\n",
        # no TYPE line at all
        "llamacpp:prompt_tokens_total 7\n",
    ],
)
def test_counters_are_found_however_the_engine_types_them(text: str) -> None:
    snap = normalise(parse_exposition(text), "llamacpp")
    assert one(snap, "inference_prompt_tokens_total").value == 7.0


def test_counter_without_total_suffix_in_its_name() -> None:
    text = (
        "# TYPE nv_inference_request_success counter\n"
        'nv_inference_request_success{model="m",version="1"} 4\n'
        "# TYPE nv_inference_queue_duration_us counter\n"
        'nv_inference_queue_duration_us{model="m",version="1"} 2000000\n'
    )
    queue = one(normalise(parse_exposition(text), "triton"), "inference_queue_time_seconds", "m")
    assert (queue.sum, queue.count) == (2.0, 4.0)


def test_histogram_without_type_line_is_still_read() -> None:
    text = (
        'tgi_request_queue_duration_bucket{le="0.5"} 3\n'
        'tgi_request_queue_duration_bucket{le="+Inf"} 4\n'
        "tgi_request_queue_duration_sum 1.25\n"
        "tgi_request_queue_duration_count 4\n"
    )
    queue = one(normalise(parse_exposition(text), "tgi"), "inference_queue_time_seconds")
    assert (queue.buckets, queue.sum) == (((0.5, 3.0), (INF, 4.0)), 1.25)
