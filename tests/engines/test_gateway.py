"""The gateway's queue (llm-d's endpoint picker with flow control) and refusals at admission.

The fixture is hand-written from llm-d-router's metric declarations (no public scrape of a
picker with flow control exists) and writes each deprecated name next to its successor, as the
picker does: read once, newest first, never twice.
"""

from __future__ import annotations

import math
from pathlib import Path

from exporter.engines import digest, poll_keys
from exporter.engines.snapshot import EngineSnapshot

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
FLOW = (FIXTURE / "llmd-epp-flow-control-handwritten.txt").read_text(encoding="utf-8")
KEYS = poll_keys()
QWEN = "Qwen/Qwen3-0.6B"
POOL = ("pool", "qwen-pool")


def _snap(text: str) -> EngineSnapshot:
    return digest(text, "auto", keys=KEYS)


def _values(snap: EngineSnapshot) -> dict[tuple[str, ...], float]:
    return {
        (s.name, s.model, *(f"{k}={v}" for k, v in s.labels)): s.value
        for s in snap.series
        if s.kind != "histogram"
    }


def _without(text: str, prefix: str) -> str:
    """The exposition as a picker that does not write ``prefix`` yet would serve it."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not line.startswith((prefix, f"# HELP {prefix}", f"# TYPE {prefix}"))
    )


def test_the_gateway_queue_is_read_once_whatever_the_picker_writes_twice() -> None:
    snap = _snap(FLOW)
    assert (snap.engine, snap.layer) == ("llmd-epp", "frontend")
    assert _values(snap) == {
        # 20 + 12 of priority 0 over two tenants, 5 of priority -10: not 74, no twin counted
        ("inference_gateway_queue_depth", QWEN, "pool=qwen-pool", "priority=-10"): 5.0,
        ("inference_gateway_queue_depth", QWEN, "pool=qwen-pool", "priority=0"): 32.0,
        ("inference_gateway_pool_saturation", QWEN, "pool=qwen-pool", "stage=decode"): 1.0,
        ("inference_gateway_pool_saturation", QWEN, "pool=qwen-pool", "stage=effective"): 1.0,
        ("inference_gateway_pool_saturation", QWEN, "pool=qwen-pool", "stage=prefill"): 0.4,
        ("inference_gateway_requests_total", QWEN, "pool=qwen-pool", "outcome=dispatched"): 1500.0,
        ("inference_gateway_requests_total", QWEN, "pool=qwen-pool", "outcome=evicted_ttl"): 7.0,
        (
            "inference_gateway_requests_total",
            QWEN,
            "pool=qwen-pool",
            "outcome=rejected_capacity",
        ): 48.0,
        ("inference_gateway_stale_endpoints", QWEN): 3.0,
        ("inference_gateway_ready_endpoints", QWEN, "pool=qwen-pool"): 4.0,
        ("inference_requests_rejected_total", QWEN, "layer=gateway", "reason=capacity"): 48.0,
    }
    (queued,) = [s for s in snap.series if s.name == "inference_gateway_queue_time_seconds"]
    # dispatched requests only (830 + 370 + 300), the evicted ones' wait is not a queueing time
    assert (queued.model, queued.labels, queued.count) == (QWEN, (POOL,), 1500.0)
    assert math.isclose(queued.sum, 480.25 + 190.5 + 420.75)
    assert dict(queued.buckets)[0.1] == 250 + 150 + 10
    assert queued.buckets[-1] == (math.inf, 1500.0)


def test_a_picker_of_the_older_names_reads_the_same() -> None:
    """Before August 2026 llm-d's picker (and the Gateway API inference extension's) wrote the
    flow-control families as ``inference_extension_*`` and ready pods as ``inference_pool_*``;
    a picker before stage-aware gating wrote one saturation without ``stage``."""
    older = _snap(_without(FLOW, "llm_d_epp_"))
    assert older.engine == "llmd-epp"
    new = _values(_snap(FLOW))
    shared = {
        key: value
        for key, value in new.items()
        if key[0] in ("inference_gateway_queue_depth", "inference_gateway_pool_saturation")
        or key[0] == "inference_gateway_ready_endpoints"
    }
    assert {k: v for k, v in _values(older).items() if k in shared} == shared
    unstaged = "\n".join(
        line.replace(',stage="effective"', "")
        for line in _without(FLOW, "llm_d_epp_").splitlines()
        if 'stage="decode"' not in line and 'stage="prefill"' not in line
    )
    saturation = [
        s for s in _snap(unstaged).series if s.name == "inference_gateway_pool_saturation"
    ]
    assert [(s.labels, s.value) for s in saturation] == [((POOL, ("stage", "effective")), 1.0)]


def test_an_outcome_this_table_does_not_know_is_counted_as_unknown() -> None:
    text = (
        "# TYPE llm_d_epp_flow_control_requests_total counter\n"
        'llm_d_epp_flow_control_requests_total{inference_pool="p",outcome="Dispatched",'
        'priority="0"} 9\n'
        'llm_d_epp_flow_control_requests_total{inference_pool="p",outcome="EvictedPreempted",'
        'priority="0"} 2\n'
        'llm_d_epp_flow_control_requests_total{inference_pool="p",outcome="RejectedNoEndpoints",'
        'priority="0"} 1\n'
    )
    values = _values(_snap(text))
    assert values == {
        ("inference_gateway_requests_total", "", "pool=p", "outcome=dispatched"): 9.0,
        ("inference_gateway_requests_total", "", "pool=p", "outcome=unknown"): 2.0,
        ("inference_gateway_requests_total", "", "pool=p", "outcome=rejected_no_endpoints"): 1.0,
        ("inference_requests_rejected_total", "", "layer=gateway", "reason=no_endpoints"): 1.0,
    }


def test_engines_refusing_at_admission() -> None:
    vllm = (
        "# TYPE vllm:admission_rejections_total counter\n"
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 4\n'
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 1\n'
    )
    assert _values(_snap(vllm)) == {
        (
            "inference_requests_rejected_total",
            "m",
            "layer=engine",
            "reason=max_num_queued_reqs",
        ): 4.0,
        (
            "inference_requests_rejected_total",
            "m",
            "layer=engine",
            "reason=max_num_queued_tokens",
        ): 1.0,
    }
    # SGLang: each tensor-parallel rank of one scheduler reports the same refusals
    sglang = (
        "# TYPE sglang:num_queue_rejected_requests_total counter\n"
        'sglang:num_queue_rejected_requests_total{dp_rank="0",model_name="m",reason="queue_full",'
        'tp_rank="0"} 3\n'
        'sglang:num_queue_rejected_requests_total{dp_rank="0",model_name="m",reason="queue_full",'
        'tp_rank="1"} 3\n'
        'sglang:num_queue_rejected_requests_total{dp_rank="1",model_name="m",reason="queue_full",'
        'tp_rank="0"} 2\n'
    )
    assert _values(_snap(sglang)) == {
        ("inference_requests_rejected_total", "m", "layer=engine", "reason=queue_full"): 5.0
    }
