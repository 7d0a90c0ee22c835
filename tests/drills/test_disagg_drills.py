"""Disaggregated drills: a prefill and a decode reference engine handing the KV cache over.

Each drill runs the pair (the decode engine the front), a sidecar for each, Prometheus with the
``fast`` rules and Alertmanager, under one load (:data:`drills.scenarios.DISAGG_SCENARIOS`),
and checks what the engines themselves report under vLLM's names: how much of the time to first
token the KV transfer takes, which pool's queue grows, that no transfer fails. The healthy drill
also checks that no signature fires on either pod. About a minute and a half each.

The pool and transfer signatures (``InferenceKVTransferBound``, ``InferenceDecodePoolShort``)
are not in the rule pack yet; the injected drills check the engine side only, and name the
signature each one is for.
"""

from __future__ import annotations

import pytest
from drills.harness import DisaggResult, run_disagg_drill
from drills.scenarios import DISAGG_SCENARIOS, KV_SHARE_BOUND, DisaggScenario

DRILL_TIMEOUT_S = 300
DECODE_SLOTS = 16  # the decode engine's --max-num-seqs (the default)


def _explain(result: DisaggResult) -> str:
    return (
        f"\n  share: {result.transfer_share()}"
        f"\n  decode waiting: {result.gauge('decode', 'vllm:num_requests_waiting')}"
        f"\n  prefill running: {result.gauge('prefill', 'vllm:num_requests_running')}"
        f"\n  alerts: {sorted(result.fired())} on {result.pods}\n  error: {result.error or '-'}"
        f"\n  logs: {result.workdir}"
    )


def check_transfers(result: DisaggResult) -> None:
    """Every request's cache crossed the link and none failed or expired."""
    assert result.delta("decode", "vllm:nixl_xfer_time_seconds_count") >= 10, _explain(result)
    assert result.delta("decode", "vllm:nixl_bytes_transferred_sum") > 0
    assert result.delta("decode", "vllm:nixl_num_failed_transfers_total") == 0
    assert result.delta("prefill", "vllm:nixl_num_kv_expired_reqs_total") == 0


def check_healthy(result: DisaggResult) -> None:
    share = result.transfer_share()
    assert share is not None and share < KV_SHARE_BOUND / 2, _explain(result)
    waiting = result.gauge("decode", "vllm:num_requests_waiting")
    assert max(waiting) <= 3, _explain(result)
    assert not result.fired(), f"the healthy pair fired {sorted(result.fired())}" + _explain(result)


def check_kv_transfer_slow(result: DisaggResult) -> None:
    share = result.transfer_share()
    assert share is not None and share > KV_SHARE_BOUND, _explain(result)
    running = result.gauge("decode", "vllm:num_requests_running")
    assert max(running) < DECODE_SLOTS, f"decode had no free slot{_explain(result)}"


def check_decode_pool_short(result: DisaggResult) -> None:
    waiting = result.gauge("decode", "vllm:num_requests_waiting")
    assert waiting[-1] >= 5 and waiting[-1] > waiting[0], f"no decode queue{_explain(result)}"
    assert max(result.gauge("prefill", "vllm:num_requests_waiting")) == 0, _explain(result)
    prefill_running = result.gauge("prefill", "vllm:num_requests_running")
    assert sum(prefill_running) / len(prefill_running) <= 0.5, _explain(result)


CHECKS = {
    "healthy-disagg": check_healthy,
    "kv-transfer-slow": check_kv_transfer_slow,
    "decode-pool-short": check_decode_pool_short,
}


def test_every_scenario_has_its_checks() -> None:
    assert set(CHECKS) == {s.name for s in DISAGG_SCENARIOS}


@pytest.mark.timeout(DRILL_TIMEOUT_S)
@pytest.mark.parametrize("scenario", DISAGG_SCENARIOS, ids=[s.name for s in DISAGG_SCENARIOS])
def test_disagg_drill(
    scenario: DisaggScenario, tmp_path_factory: pytest.TempPathFactory, drill_tools: None
) -> None:
    result = run_disagg_drill(scenario, tmp_path_factory.mktemp(f"disagg-{scenario.name}"))
    assert not result.error, result.error + _explain(result)
    assert result.load is not None and result.load["completed"] > 0, result.load
    check_transfers(result)
    CHECKS[scenario.name](result)
