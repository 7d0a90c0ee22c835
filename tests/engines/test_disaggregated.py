"""Disaggregated prefill and decode servers normalise to the KV-transfer contract.

The fixtures are written from the engines' metric code (no public scrape of either exists;
their first lines say so): a vLLM NixlConnector pair and an SGLang PD pair, values chosen so
each number below can be checked by hand against the file.
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
    assert "inference_kv_transfer_bytes_total" not in {x.name for x in s.series}


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
