"""Disaggregated prefill and decode servers normalise to the KV-transfer contract.

The fixtures are written from the engines' metric code (no public scrape of these exists;
their first lines say so): a vLLM NixlConnector pair, an SGLang PD pair (2026, histograms) and
an older SGLang prefill server (gauges), a Dynamo frontend with the KV router, an llm-d
endpoint picker; values chosen so each number below can be checked by hand against the file.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from exporter.engines import digest, poll_keys
from exporter.engines.snapshot import EngineSnapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
QWEN = "Qwen/Qwen3-0.6B"
INF = math.inf


def snap(fixture: str, engine: str = "auto") -> EngineSnapshot:
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    return digest(text, engine, keys=poll_keys())


def scalars(s: EngineSnapshot, name: str) -> dict[tuple[str, ...], float]:
    return {
        (x.model, *(v for _, v in x.labels)): x.value
        for x in s.series
        if x.name == name and x.kind != "histogram"
    }


def test_vllm_nixl_decode_server_observes_the_transfers() -> None:
    s = snap("vllm-nixl-decode-handwritten.txt")
    assert s.engine == "vllm"
    assert s.role is None  # vLLM's metrics do not say: --engine.role does
    xfer = next(x for x in s.series if x.name == "inference_kv_transfer_seconds")
    # vllm:nixl_xfer_time_seconds: 3 x 1/64 s and one 1/4 s, bounds from 0.005 s
    assert (xfer.sum, xfer.count) == (0.296875, 4.0)
    assert xfer.buckets[:2] == ((0.005, 0.0), (0.01, 0.0))
    assert dict(xfer.buckets)[0.025] == 3.0
    assert dict(xfer.buckets)[0.3] == 4.0
    assert xfer.buckets[-1] == (INF, 4.0)
    # vllm:nixl_bytes_transferred_sum: 4 transfers of 1.75 MiB
    assert scalars(s, "inference_kv_transfer_bytes_total") == {(QWEN,): 4 * 1835008.0}
    assert scalars(s, "inference_kv_transfer_failures_total") == {
        (QWEN, "transfer"): 1.0,
        (QWEN, "notification"): 0.0,
        (QWEN, "expired"): 0.0,
    }
    assert scalars(s, "inference_queue_depth") == {(QWEN,): 0.0}
    assert scalars(s, "inference_requests_running") == {(QWEN,): 3.0}


def test_vllm_nixl_prefill_server_counts_the_expired_kv() -> None:
    s = snap("vllm-nixl-prefill-handwritten.txt")
    xfer = next(x for x in s.series if x.name == "inference_kv_transfer_seconds")
    assert (xfer.sum, xfer.count) == (0.0, 0.0)  # the decode server reads: none here
    assert scalars(s, "inference_kv_transfer_failures_total") == {
        (QWEN, "transfer"): 0.0,
        (QWEN, "notification"): 1.0,
        (QWEN, "expired"): 2.0,
    }
    assert scalars(s, "inference_queue_depth") == {(QWEN,): 5.0}


def test_sglang_prefill_server_says_its_role_and_its_stages() -> None:
    s = snap("sglang-pd-prefill-handwritten.txt")
    assert (s.engine, s.role) == ("sglang", "prefill")
    assert scalars(s, "inference_queue_depth_by_stage") == {
        (QWEN, "prefill"): 9.0,  # num_queue_reqs: waiting for the prefill forward
        (QWEN, "prealloc"): 3.0,  # num_prefill_prealloc_queue_reqs (bootstrap)
        (QWEN, "transfer"): 4.0,  # num_prefill_inflight_queue_reqs: KV being sent
    }
    lat = next(x for x in s.series if x.name == "inference_kv_transfer_seconds")
    # sglang:kv_transfer_latency_ms 4, 8, 8, 20 ms -> seconds, bounds too
    assert lat.count == 4.0
    assert lat.sum == pytest.approx(0.040)
    assert lat.buckets[:3] == ((0.001, 0.0), (0.002, 0.0), (0.005, 1.0))
    assert dict(lat.buckets)[0.025] == 4.0
    assert scalars(s, "inference_kv_transfer_failures_total") == {
        (QWEN, "transfer"): 1.0,
        (QWEN, "bootstrap"): 0.0,
    }


def test_sglang_decode_server_waiting_queue_is_the_decode_stage() -> None:
    s = snap("sglang-pd-decode-handwritten.txt")
    assert s.role == "decode"
    assert scalars(s, "inference_queue_depth_by_stage") == {
        (QWEN, "decode"): 0.0,  # num_queue_reqs on a decode server: KV here, waiting to run
        (QWEN, "prealloc"): 1.0,  # num_decode_prealloc_queue_reqs
        (QWEN, "transfer"): 6.0,  # num_decode_transfer_queue_reqs
    }
    assert scalars(s, "inference_kv_transfer_failures_total") == {
        (QWEN, "transfer"): 0.0,
        (QWEN, "bootstrap"): 2.0,
    }


def test_a_dynamo_worker_with_sglang_takes_the_role_from_sglang() -> None:
    s = snap("sglang-pd-decode-handwritten.txt", "dynamo")
    assert s.role == "decode"


def hist(s: EngineSnapshot, name: str) -> dict[str, object]:
    found = [x for x in s.series if x.name == name]
    assert len(found) == 1, (name, found)
    x = found[0]
    return {"model": x.model, "sum": x.sum, "count": x.count, "buckets": dict(x.buckets)}


def names(s: EngineSnapshot) -> set[str]:
    return {x.name for x in s.series}


def test_sglang_histograms_of_2026_give_bytes_bootstrap_and_allocation() -> None:
    s = snap("sglang-pd-prefill-handwritten.txt")
    # sglang:kv_transfer_total_mb_sum 8 MB, SGLang's MB being bytes / 2^20
    assert scalars(s, "inference_kv_transfer_bytes_total") == {(QWEN,): 8 * 1048576.0}
    boot = hist(s, "inference_kv_transfer_bootstrap_seconds")
    # 2, 3, 5, 30 ms: bounds and sum in seconds, counts unchanged
    assert boot["count"] == 4.0
    assert boot["sum"] == pytest.approx(0.040)
    assert boot["buckets"] == pytest.approx(
        {
            0.001: 0.0,
            0.002: 1.0,
            0.005: 3.0,
            0.01: 3.0,
            0.025: 3.0,
            0.05: 4.0,
            0.1: 4.0,
            0.25: 4.0,
            0.5: 4.0,
            1.0: 4.0,
            2.5: 4.0,
            INF: 4.0,
        }
    )
    alloc = hist(s, "inference_kv_transfer_alloc_wait_seconds")
    assert (alloc["count"], alloc["sum"]) == (4.0, pytest.approx(0.0085))
    # the histogram form feeds no last-transfer gauge, and speed is not read at all
    assert "inference_kv_transfer_last_seconds" not in names(s)


def test_older_sglang_gauges_are_not_taken_for_histograms() -> None:
    s = snap("sglang-pd-prefill-gauges-handwritten.txt")
    assert (s.engine, s.role) == ("sglang", "prefill")
    # the latency gauge is the last transfer's, in seconds, as a gauge ...
    last = [x for x in s.series if x.name == "inference_kv_transfer_last_seconds"]
    assert [(x.model, x.kind, x.value) for x in last] == [(QWEN, "gauge", 0.0125)]
    # ... never a histogram, a byte counter, or bootstrap/allocation distributions
    assert not names(s) & {
        "inference_kv_transfer_seconds",
        "inference_kv_transfer_bytes_total",
        "inference_kv_transfer_bootstrap_seconds",
        "inference_kv_transfer_alloc_wait_seconds",
    }
    # the queue gauges and failure counters are the same names in both forms
    assert scalars(s, "inference_queue_depth_by_stage") == {
        (QWEN, "prefill"): 2.0,
        (QWEN, "prealloc"): 1.0,
        (QWEN, "transfer"): 3.0,
    }
    assert scalars(s, "inference_kv_transfer_failures_total") == {
        (QWEN, "transfer"): 0.0,
        (QWEN, "bootstrap"): 1.0,
    }


def test_the_captured_colocated_sglang_reports_no_transfer() -> None:
    """The real capture: a unified server, its transfer gauges at 0, which SGLang sets only
    on a prefill server: no latency of 0 s is made of them."""
    s = snap("dynamo-worker-sglang-2026-01.txt")
    assert s.role == "both"
    assert not names(s) & {"inference_kv_transfer_last_seconds", "inference_kv_transfer_seconds"}


def test_dynamo_router_estimate_is_an_upper_bound_not_a_measured_transfer() -> None:
    s = snap("dynamo-frontend-kv-router-handwritten.txt")
    assert (s.engine, s.layer) == ("dynamo", "frontend")  # the router's families route too
    bound = hist(s, "inference_kv_transfer_upper_bound_seconds")
    # no model label: the exposition's only model (the frontend's model gauges)
    assert bound["model"] == QWEN
    assert (bound["count"], bound["sum"]) == (4.0, pytest.approx(0.19))
    assert bound["buckets"][0.025] == 1.0
    assert "inference_kv_transfer_seconds" not in names(s)
    # the frontend's queue: requests without their first response yet
    assert scalars(s, "inference_queue_depth") == {(QWEN,): 2.0}
    assert scalars(s, "inference_requests_running") == {(QWEN,): 6.0}
    assert "inference_queue_depth_by_stage" not in names(s)


def test_llmd_picker_counts_each_decision_once() -> None:
    """Dual emission (deprecated and current names) and two counters (disagg and the
    deprecated pd): the newest name of the newest counter alone."""
    s = snap("llmd-epp-handwritten.txt")
    assert (s.engine, s.layer, s.role) == ("llmd-epp", "frontend", None)
    assert scalars(s, "inference_pd_decisions_total") == {
        (QWEN, "decode_only"): 30.0,
        (QWEN, "prefill_decode"): 70.0,
        ("", "prefill_decode"): 2.0,  # model_name="unknown": the request named none
    }


@pytest.mark.parametrize(
    "name",
    [
        "llm_d_inference_scheduler_pd_decision_total",
        "llm_d_router_epp_pd_decision_total",
        "llm_d_epp_pd_decision_total",
        "llm_d_router_epp_disagg_decision_total",
    ],
)
def test_llmd_older_names_are_read(name: str) -> None:
    # the first release's counter had decision_type only (llm-d-inference-scheduler
    # pkg/metrics metrics_test.go); later ones add model_name
    text = (
        f"# TYPE {name} counter\n"
        f'{name}{{decision_type="decode-only"}} 1\n'
        f'{name}{{decision_type="prefill-decode"}} 2\n'
        f'{name}{{decision_type="encode-prefill-decode",model_name="m"}} 3\n'
    )
    s = digest(text, "auto", keys=poll_keys())
    assert s.engine == "llmd-epp"
    assert scalars(s, "inference_pd_decisions_total") == {
        ("", "decode_only"): 1.0,
        ("", "prefill_decode"): 2.0,
        ("m", "encode_prefill_decode"): 3.0,
    }


def test_llmd_new_counter_wins_over_the_deprecated_one() -> None:
    text = (
        "# TYPE llm_d_inference_scheduler_pd_decision_total counter\n"
        'llm_d_inference_scheduler_pd_decision_total{decision_type="prefill-decode"} 9\n'
        "# TYPE llm_d_router_epp_disagg_decision_total counter\n"
        'llm_d_router_epp_disagg_decision_total{decision_type="prefill-decode"} 4\n'
    )
    s = digest(text, "llmd-epp", keys=poll_keys())
    assert scalars(s, "inference_pd_decisions_total") == {("", "prefill_decode"): 4.0}
