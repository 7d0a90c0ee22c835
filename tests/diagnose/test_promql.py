"""The small PromQL behind ``diagnose --target``: syntax, functions, matching, and the rule
pack's own recording rules over a handful of scrapes."""

from __future__ import annotations

import math

import pytest

from exporter.diagnose.promql_eval import (
    Evaluator,
    Labels,
    NeedsHistoryError,
    Sample,
    Scrape,
    bucket_quantile,
)
from exporter.diagnose.promql_syntax import Binary, PromQLError, Selector, parse, source, unparen
from exporter.signatures import all_signatures, parse_config, recording_rules
from exporter.signatures.promql_text import matchers


def lab(name: str, **labels: str) -> Labels:
    return tuple(sorted({"__name__": name, **labels}.items()))


def scrapes(*points: tuple[float, dict[Labels, float]]) -> list[Scrape]:
    return [Scrape(t, dict(samples)) for t, samples in points]


def values(result: object) -> dict[Labels, float]:
    assert isinstance(result, list)
    return {s.labels: s.value for s in result}


def one(result: object) -> float:
    assert isinstance(result, list) and len(result) == 1, result
    value: float = result[0].value
    return value


def test_every_expression_of_the_pack_parses() -> None:
    for profile in ("sidecar", "dcgm", "fast"):
        cfg = parse_config({}, profile)
        for rule in recording_rules(cfg):
            parse(rule.expr)
        for sig in all_signatures(cfg):
            for alert in sig.rules:
                parse(alert.expr)
                for item in alert.evidence:
                    if item.expr is not None:
                        parse(item.query(matchers({"instance": "a:1", "gpu": "0"})))


def test_spans_give_back_the_source() -> None:
    text = 'inference:a:mean5m < 0.6\nand\nsum by (pod) (rate(x_total{mode="s"}[5m])) > 2 * b'
    tree = parse(text)
    assert isinstance(tree, Binary) and tree.op == "and"
    assert source(text, tree.lhs) == "inference:a:mean5m < 0.6"
    rhs = tree.rhs
    assert isinstance(rhs, Binary) and rhs.op == ">"
    assert source(text, rhs.lhs) == 'sum by (pod) (rate(x_total{mode="s"}[5m]))'
    assert source(text, rhs.rhs) == "2 * b"
    offset = unparen(parse("(m{a='x'} offset 10m)"))
    assert isinstance(offset, Selector) and offset.offset == 600 and offset.matchers[0].value == "x"


@pytest.mark.parametrize(
    "text",
    ["sum(", "a +", "a{b}", "a{b=c}", "rate(a[5m] offset)", "a[5m:1m]", "a ? b", "a b"],
)
def test_syntax_errors(text: str) -> None:
    with pytest.raises(PromQLError):
        parse(text)


def test_precedence() -> None:
    ev = Evaluator(scrapes((0, {})))
    assert ev.eval(parse("1 + 2 * 3")) == 7
    assert ev.eval(parse("2 ^ 3 ^ 2")) == 512  # right-associative
    assert ev.eval(parse("1 - (2 - 3)")) == 2
    assert ev.eval(parse("10 / 4 > bool 2")) == 1
    assert ev.eval(parse("-2 * 3")) == -6
    assert math.isinf(ev.eval(parse("1 / 0")))  # type: ignore[arg-type]
    assert math.isnan(ev.eval(parse("0 / 0")))  # type: ignore[arg-type]


def test_range_functions_over_the_samples() -> None:
    c = lab("c_total")
    g = lab("g")
    ev = Evaluator(
        scrapes(
            (100, {c: 10, g: 1}),
            (110, {c: 30, g: 3}),
            (120, {c: 5, g: 5}),  # counter reset: 30 were reached, then 5 more
            (130, {c: 25, g: 7}),
        )
    )
    assert one(ev.eval(parse("increase(c_total[5m])"))) == 45
    assert one(ev.eval(parse("rate(c_total[1m])"))) == pytest.approx(45 / 30)
    assert one(ev.eval(parse("deriv(g[10m])"))) == pytest.approx(0.2)
    assert one(ev.eval(parse("avg_over_time(g[5m])"))) == 4
    assert one(ev.eval(parse("changes(g[5m])"))) == 3
    assert ev.span == 30
    # the result of a function has no metric name
    assert values(ev.eval(parse("rate(c_total[1m])"))) == {(): pytest.approx(1.5)}


def test_one_sample_gives_no_rate() -> None:
    ev = Evaluator(scrapes((0, {lab("c_total"): 1})))
    assert ev.eval(parse("rate(c_total[5m])")) == []
    assert ev.eval(parse("deriv(c_total[5m])")) == []


def test_offset_reads_the_first_sample_or_needs_history() -> None:
    x = lab("x", xid="79")
    ev = Evaluator(
        scrapes((0, {}), (10, {x: 1})),
        needs_history=lambda seconds: seconds >= 3600,
    )
    assert values(ev.eval(parse("x unless x offset 10m"))) == {x: 1}
    with pytest.raises(NeedsHistoryError, match="offset 1h"):
        ev.eval(parse("x offset 1h"))


def test_bucket_quantile_is_prometheus() -> None:
    inf = math.inf
    assert bucket_quantile(0.5, [(0.1, 0), (0.2, 10), (inf, 10)]) == pytest.approx(0.15)
    assert bucket_quantile(0.45, [(0.1, 4), (0.2, 6), (inf, 10)]) == pytest.approx(0.125)
    # in the +Inf bucket: the largest finite bound
    assert bucket_quantile(0.9, [(0.1, 1), (0.2, 2), (inf, 10)]) == 0.2
    # first bucket interpolates from 0
    assert bucket_quantile(0.5, [(1.0, 10), (inf, 10)]) == pytest.approx(0.5)
    assert math.isnan(bucket_quantile(0.5, [(0.1, 0), (inf, 0)]))
    assert math.isnan(bucket_quantile(0.5, [(0.1, 1), (0.2, 2)]))  # no +Inf
    # counts falling with the bound are taken as flat
    assert bucket_quantile(0.6, [(0.1, 5), (0.2, 4), (0.3, 10), (inf, 10)]) == pytest.approx(0.22)


def test_histogram_quantile_over_rates() -> None:
    def buckets(n: float) -> dict[Labels, float]:
        return {
            lab("h_bucket", le="0.01", engine="e"): 0,
            lab("h_bucket", le="0.025", engine="e"): n,
            lab("h_bucket", le="+Inf", engine="e"): n,
        }

    ev = Evaluator(scrapes((0, buckets(100)), (10, buckets(300))))
    result = ev.eval(parse("histogram_quantile(0.5, sum by (le) (rate(h_bucket[5m])))"))
    assert values(result) == {(): pytest.approx(0.0175)}


def test_matching_and_set_operations() -> None:
    a0, a1 = lab("a", pod="p", gpu="0"), lab("a", pod="p", gpu="1")
    b = lab("b", pod="p")
    c = lab("c", pod="q")
    ev = Evaluator(scrapes((0, {a0: 2, a1: 4, b: 10, c: 1})))
    assert values(ev.eval(parse("a * on (pod) group_left () b"))) == {
        (("gpu", "0"), ("pod", "p")): 20,
        (("gpu", "1"), ("pod", "p")): 40,
    }
    assert values(ev.eval(parse("sum by (pod) (a) / b"))) == {(("pod", "p"),): 0.6}
    assert values(ev.eval(parse("a > 3"))) == {a1: 4}  # a filter keeps the name
    assert values(ev.eval(parse("a > bool 3"))) == {
        (("gpu", "0"), ("pod", "p")): 0,
        (("gpu", "1"), ("pod", "p")): 1,
    }
    assert values(ev.eval(parse("b and on (pod) a"))) == {b: 10}
    assert values(ev.eval(parse("c unless on (pod) a"))) == {c: 1}
    assert set(values(ev.eval(parse("b or c")))) == {b, c}
    assert values(ev.eval(parse("max by (pod) (a)"))) == {(("pod", "p"),): 4}
    assert values(ev.eval(parse("group by (pod) (a)"))) == {(("pod", "p"),): 1}
    assert values(ev.eval(parse("count(a)"))) == {(): 2}
    with pytest.raises(PromQLError, match="many-to-many"):
        ev.eval(parse("b * on (pod) a"))


def test_target_labels_do_not_filter_and_up_is_one() -> None:
    ev = Evaluator(
        scrapes((0, {lab("m", engine="vllm"): 1})),
        ignored_labels=frozenset({"namespace", "pod", "instance", "job"}),
    )
    assert one(ev.eval(parse('m{pod="",instance="10.0.0.1:10960",engine="vllm"}'))) == 1
    assert ev.eval(parse('m{engine="tgi"}')) == []
    assert ev.eval(parse('min by (instance) (up{job=~".*exporter.*"}) == 0')) == []
    assert ev.eval(parse('absent(up{job=~".*exporter.*"})')) == []
    assert values(ev.eval(parse('absent(nothing{engine="x"})'))) == {(("engine", "x"),): 1}


def test_functions_outside_the_subset_are_errors() -> None:
    ev = Evaluator(scrapes((0, {lab("a"): 1})))
    with pytest.raises(PromQLError, match="predict_linear"):
        ev.eval(parse("predict_linear(a[5m], 60)"))
    with pytest.raises(PromQLError, match="range selector"):
        ev.eval(parse("rate(a)"))


def _sidecar_scrape(t: float, k: float) -> dict[Labels, float]:
    """Two GPUs at 40 % and 60 % busy; ``k`` advances every counter."""
    gpu = [{"gpu": "0", "uuid": "GPU-a"}, {"gpu": "1", "uuid": "GPU-b"}]
    out = {
        lab("inference_exporter_build_info", version="0.1.0"): 1,
        lab("inference_gpu_busy_seconds_total", **gpu[0]): 0.4 * t,
        lab("inference_gpu_busy_seconds_total", **gpu[1]): 0.6 * t,
        lab("inference_cpu_seconds_total", mode="softirq"): 2 * t,
        lab("inference_cpu_seconds_total", mode="idle"): 38 * t,
        lab("inference_cpu_all_modes_seconds_total"): 40 * t,
        lab("inference_queue_depth", engine="vllm", model="m"): 2 + 0.5 * k,
        lab("inference_requests_running", engine="vllm", model="m"): 4,
        lab("inference_generation_tokens_total", engine="vllm", model="m"): 100 * t,
        lab("inference_kv_cache_usage_ratio", engine="vllm", model="m"): 0.5,
    }
    if k >= 2:
        out[lab("inference_gpu_xid_errors_total", xid="13", **gpu[1])] = 1
    return out


def test_the_sidecar_recording_rules_over_samples() -> None:
    cfg = parse_config({})
    ev = Evaluator(
        scrapes(*((1000 + 10 * k, _sidecar_scrape(1000 + 10 * k, k)) for k in range(4))),
        ignored_labels=frozenset(cfg.join_labels),
        needs_history=lambda seconds: seconds == cfg.window_seconds("baseline"),
    )
    for rule in recording_rules(cfg):
        ev.record(rule.record, rule.expr)
    r = ev.records
    assert one(r["inference:gpu_utilization:mean5m"]) == pytest.approx(0.5)
    assert one(r["inference:cpu_softirq:ratio5m"]) == pytest.approx(0.05)
    assert one(r["inference:queue_depth:deriv10m"]) == pytest.approx(0.05)
    assert one(r["inference:queue_depth:sum"]) == 3.5
    assert one(r["inference:generation_tokens_per_request:rate5m"]) == pytest.approx(25)
    assert one(r["inference:traffic:active"]) == 1
    assert one(r["inference:kv_cache_usage:max"]) == 0.5
    # an Xid counter that appeared while sampling counts whole
    assert values(r["inference_gpu:xid_errors:increase10m"]) == {
        (
            ("__name__", "inference_gpu:xid_errors:increase10m"),
            ("gpu", "1"),
            ("uuid", "GPU-b"),
            ("xid", "13"),
        ): 1
    }
    # absent inputs give empty records, not errors
    assert r["inference:tokenizer_latency_seconds:median5m"] == []
    # the HBM comparison with an hour ago cannot be made from samples
    hbm = next(s for s in all_signatures(cfg) if s.alert == "InferenceHBMBandwidthSaturated")
    with pytest.raises(NeedsHistoryError):
        ev.eval(parse(hbm.rules[0].expr))
    # and the starved-queue condition holds: util 50 % < 60 %, queue growing, 3.5 waiting
    starved = next(s for s in all_signatures(cfg) if s.alert == "InferenceGPUStarvedQueueGrowing")
    # (on GPUs of its own, the engine's own utilisation is the GPUs')
    assert values(ev.eval(parse(starved.rules[0].expr))) == {
        (("__name__", "inference:gpu_own_utilization:mean5m"),): 0.5
    }


def _triton_scrape(t: float, requests: float) -> dict[Labels, float]:
    """Triton as the sidecar normalises it: request latencies, a queue, no running gauge and
    no token counter (Triton knows nothing of tokens)."""
    m = {"engine": "triton", "model": "tiny"}
    return {
        lab("inference_queue_depth", **m): 3,
        lab("inference_e2e_request_latency_seconds_count", **m): requests,
        lab("inference_e2e_request_latency_seconds_sum", **m): 0.5 * requests,
        lab("inference_queue_time_seconds_sum", **m): 0.4 * requests,
        lab("inference_cpu_seconds_total", mode="idle"): 38 * t,
    }


@pytest.mark.parametrize(("per_scrape", "active"), [(5.0, [1.0]), (0.0, [])])
def test_traffic_counts_finished_requests_where_an_engine_has_no_tokens(
    per_scrape: float, active: list[float]
) -> None:
    """Without traffic the queue-wait signature could never hold on Triton."""
    cfg = parse_config({})
    ev = Evaluator(
        scrapes(
            *((1000 + 10 * k, _triton_scrape(1000 + 10 * k, 50 + per_scrape * k)) for k in range(4))
        )
    )
    for rule in recording_rules(cfg):
        ev.record(rule.record, rule.expr)
    assert [s.value for s in ev.records["inference:traffic:active"]] == active


def test_record_keeps_the_record_name() -> None:
    ev = Evaluator(scrapes((0, {lab("x", pod="p"): 2})))
    ev.record("level:x:sum", "sum by (pod) (x)")
    assert ev.records["level:x:sum"] == [Sample((("__name__", "level:x:sum"), ("pod", "p")), 2.0)]
    assert values(ev.eval(parse('level:x:sum{pod="p"} * 2'))) == {(("pod", "p"),): 4}


# --- what the comparison with Prometheus (test_promql_vs_prometheus.py) found -----------------


def test_rate_extrapolates_series_that_appear_or_vanish_while_sampling() -> None:
    """Prometheus extrapolates a series whose first or last sample is more than 1.1 average
    intervals from the window's edge by half an interval; the window is the sampling span."""
    new, gone = lab("new_total"), lab("gone_total")
    ev = Evaluator(
        scrapes(
            (0, {gone: 50}),
            (10, {gone: 60}),
            (20, {new: 100, gone: 70}),
            (30, {new: 110}),
            (40, {new: 120}),
        )
    )
    # new: 20 over 20 s, starts 20 s after the window: + 5 s (half of 10 s) -> 25 over 40 s
    assert one(ev.eval(parse("increase(new_total[40s])"))) == pytest.approx(25)
    assert one(ev.eval(parse("rate(new_total[40s])"))) == pytest.approx(25 / 40)
    # gone: 20 over 20 s, ends 20 s before the window does: + 5 s
    assert one(ev.eval(parse("increase(gone_total[40s])"))) == pytest.approx(25)


def test_rate_stops_extrapolating_at_the_counters_zero() -> None:
    x = lab("x_total")
    ev = Evaluator(scrapes((0, {}), (10, {}), (20, {x: 1}), (30, {x: 5}), (40, {x: 9})))
    # 8 over 20 s from 1: the zero lies 2.5 s before the first sample, closer than 5 s
    assert one(ev.eval(parse("increase(x_total[40s])"))) == pytest.approx(8 * 22.5 / 20)


def test_times_are_whole_milliseconds() -> None:
    """Differences of float Unix times are off by up to 2.4e-7 s; Prometheus' are exact."""
    t0 = 1_704_067_200.0
    g = lab("g")
    offsets = (0, 4_731, 10_112, 15_998, 21_407, 28_003)
    ev = Evaluator([Scrape(t0 + ms / 1000, {g: 2 + 0.05 * ms / 1000}) for ms in offsets])
    assert ev.span == 28.003
    assert one(ev.eval(parse("deriv(g[1m])"))) == pytest.approx(0.05, rel=1e-12)


def test_deriv_of_a_constant_is_zero() -> None:
    g = lab("g")
    ev = Evaluator(scrapes(*((t, {g: 0.1}) for t in (0, 3, 7, 12))))
    assert one(ev.eval(parse("deriv(g[1m])"))) == 0.0


def test_nan_through_functions_and_aggregations() -> None:
    g0, g1 = lab("g", gpu="0"), lab("g", gpu="1")
    nan = math.nan
    ev = Evaluator(scrapes((0, {g0: nan, g1: 3}), (10, {g0: 2, g1: nan}), (20, {g0: nan, g1: 1})))
    # clamp: NaN stays NaN (Go's math.Max and math.Min)
    assert math.isnan(values(ev.eval(parse("clamp(g, 0, 1)")))[(("gpu", "0"),)])
    assert ev.eval(parse("clamp(g, 1, 0)")) == []
    assert math.isnan(values(ev.eval(parse("clamp_min(g, 0)")))[(("gpu", "0"),)])
    assert values(ev.eval(parse("clamp_min(g, 2)")))[(("gpu", "1"),)] == 2
    assert values(ev.eval(parse("clamp_max(g, 0.5)")))[(("gpu", "1"),)] == 0.5
    # max_over_time: a NaN gives way to any number, wherever it stands
    over = values(ev.eval(parse("max_over_time(g[1m])")))
    assert over == {(("gpu", "0"),): 2, (("gpu", "1"),): 3}
    assert values(ev.eval(parse("max(g)"))) == {(): 1}
    assert math.isnan(one(ev.eval(parse("avg(g)"))))


def test_bucket_quantile_keeps_nan_counts_and_adds_equal_bounds() -> None:
    inf = math.inf
    # Prometheus keeps a NaN count (no monotonic fix-up across it): NaN
    assert math.isnan(bucket_quantile(0.25, [(0.1, math.nan), (0.2, 3), (inf, 4)]))
    # "0.1" and "0.10" are one bucket
    assert bucket_quantile(0.5, [(0.1, 1), (0.1, 1), (0.2, 4), (inf, 4)]) == pytest.approx(0.1)


def test_vector_matching_result_labels_are_prometheus() -> None:
    a = lab("a", gpu="0", uuid="x")
    b = lab("b", gpu="0", uuid="y")
    ev = Evaluator(scrapes((0, {a: 6, b: 3})))
    # one-to-one: ignoring() drops its labels, on() keeps only its own, also when filtering
    assert values(ev.eval(parse("a / ignoring (uuid) b"))) == {(("gpu", "0"),): 2}
    assert values(ev.eval(parse("a > on (gpu) b"))) == {(("gpu", "0"),): 6}
    assert values(ev.eval(parse("a > bool ignoring (uuid) b"))) == {(("gpu", "0"),): 1}


def test_scalar_comparison_needs_bool() -> None:
    ev = Evaluator(scrapes((0, {})))
    with pytest.raises(PromQLError, match="bool"):
        ev.eval(parse("1 > 0"))
    assert ev.eval(parse("1 > bool 0")) == 1


def test_power_and_modulo_are_go_float_arithmetic() -> None:
    ev = Evaluator(scrapes((0, {lab("x"): -8.0})))
    assert math.isnan(one(ev.eval(parse("x ^ 0.5"))))  # no complex numbers
    assert one(ev.eval(parse("-x ^ 400"))) == math.inf  # overflow is infinite
    assert math.isnan(one(ev.eval(parse("x % 0"))))
    assert one(ev.eval(parse("x % 3"))) == -2  # the sign of the dividend
