"""docs/drills.md from a drill run's results, without a stack: made-up results in, the page out.

What is checked: each drill's row says its layout, what it measured, its deadline and that
deadline's parts, when its alert fired and where ``diagnose`` ranked it; a run writes its own
speed's section and keeps the other one; the saved results render the same page again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from drills.calibrate import Calibration, Measured
from drills.harness import AlertSeen, DisaggResult, DrillResult, Sized, layout, noting_failure
from drills.report import Session, load, main, render, save
from drills.scenarios import BY_NAME, DISAGG_BY_NAME, GATEWAY_BY_NAME, STALE_ENDPOINTS, deadline
from drills.slo import Sample, SloWatch


def _sized(name: str, *, factor: float = 1.0, disagg: bool = False) -> Sized:
    scenario = DISAGG_BY_NAME[name] if disagg else {**BY_NAME, **GATEWAY_BY_NAME}[name]
    wait = deadline(scenario)
    one = Measured(1, 3, 256, 16, 0.045, 0.0028 * factor, 0.09, 1.0)
    cal = Calibration(one=one, tokenizer_s=0.0012, probe_tokens=840, took_s=6.5)
    cal.extra = {"load_average": 3.4, "node_softirq": 0.012}
    return Sized(
        slowdown=factor,
        calibration=cal.to_json(),
        plan={
            "load": {"rate": 7.5, "prompt_tokens": 256, "output_tokens": 64},
            "sizes": {"flood_max_num_seqs": 1.0},
            "served": 2.5,
            "how": ["3x what 1 admitted serve"],
        },
        deadline_s=wait.seconds,
        deadline_how=wait.how,
        layout=layout(scenario),
    )


def _flood(factor: float = 1.0, *, ranked_second: bool = False) -> DrillResult:
    expected = "InferenceQueueWaitDominatesLatency"
    findings = [
        {"alert": expected, "status": "holds"},
        {"alert": "InferenceTokenizerSlow", "status": "clear"},
    ]
    if ranked_second:
        findings.reverse()
    burn = "InferenceTTFTBudgetBurn"
    watch = SloWatch(
        objectives="TTFT 100ms, ITL 10ms @ 95%",
        how="...",
        samples=[
            Sample(2.0, False, ["none (no_capacity_backlog)"], ["none (no_capacity_backlog)"],
                   0.0, 0.0, {"ttft 1m": 0.5, "ttft 15s": 2.0}),
            Sample(84.0, True, ["scale_out (capacity)"], ["scale_out (capacity)"], 1.0, 1.0,
                   {"ttft 1m": 17.5, "ttft 15s": 20.0, "itl 1m": 1.0}),
        ],
    )  # fmt: skip
    return DrillResult(
        scenario="queue-flood",
        expected=expected,
        started="2026-12-05 12:00:00",
        duration_s=151.0,
        alerts={
            expected: AlertSeen(pending_at=40.0, firing_at=71.0, severity="warning"),
            burn: AlertSeen(
                pending_at=62.0,
                firing_at=62.0,
                severity="warning",
                summary="TTFT budget of m (drill) burning at 17.5x over 1m — cause: "
                "InferenceQueueWaitDominatesLatency on 1 of 1 pod",
            ),
        },
        diagnose={"findings": findings},
        sized=_sized("queue-flood", factor=factor),
        slo=watch.to_json(),
    )


def _session(factor: float = 1.0, **kw: object) -> Session:
    disagg = DisaggResult(
        scenario="healthy-disagg",
        signature=None,
        started="2026-12-05 12:00:00",
        duration_s=99.0,
        diagnose={"findings": []},
        sized=_sized("healthy-disagg", factor=factor, disagg=True),
    )
    return Session(
        machine="2 CPUs (test)",
        total_s=1500.0,
        when="2026-12-05 12:00",
        factor=factor,
        results={"queue-flood": _flood(factor, **kw)},  # type: ignore[arg-type]
        disagg={"healthy-disagg": disagg},
    )


def _section(page: str, key: str) -> str:
    start = page.index(f"<!-- drills:speed {key} -->")
    return page[start : page.index(f"<!-- drills:end {key} -->", start)]


def test_a_drill_row_says_layout_measured_capacity_deadline_and_rank() -> None:
    page = render(_session())
    natural = _section(page, "natural")
    flood = [line for line in natural.splitlines() if line.startswith("| queue-flood |")]
    matrix, sizing, _signals, objectives = flood
    assert "| yes | 71 s (by " in matrix
    assert "| TTFT 100ms, ITL 10ms @ 95% |" in objectives
    assert "| 1 of 2 |" in matrix
    assert "one host: reference engine (1 of 16 slots)" in sizing
    assert "step 2.8 ms (1)" in sizing and "tokenizer 1.2 ms (840 tokens)" in sizing
    assert "node: load 3.4" in sizing
    wait = deadline(BY_NAME["queue-flood"])
    assert f"| {wait.seconds:.0f} s: {wait.how} |" in sizing
    assert "`for`" in wait.how and "window" in wait.how and "lag" in wait.how
    assert "load average as each drill calibrated: 3.4 to 3.4 (median 3.4" in natural
    assert "shared with other work" not in natural  # 3.4 on 2 CPUs
    healthy_pool = [line for line in natural.splitlines() if line.startswith("| healthy-disagg |")]
    assert len(healthy_pool) == 3 and "prefill + decode" in healthy_pool[2]
    assert "not recorded" in healthy_pool[0]  # a result without the advice read
    assert "Not run yet" in _section(page, "slow-8x")


def test_the_slo_row_says_objectives_burn_cause_advice_and_gates() -> None:
    row = next(
        line
        for line in render(_session()).splitlines()
        if line.startswith("| queue-flood | TTFT 100ms")
    )
    assert "| TTFT 17.5x / 20.0x; ITL 1.0x / -x |" in row
    assert (
        "| `InferenceTTFTBudgetBurn` (62 s) | InferenceQueueWaitDominatesLatency on 1 of 1 pod |"
        in row
    )
    assert "| `scale_out (capacity)` (1 of 2 looks) | `scale_out (capacity)` |" in row
    assert "| open 1 / 1 of 1 looks | yes, from 84 s |" in row


def test_the_slo_row_of_another_drill_says_when_it_scaled_out() -> None:
    session = _session()
    flood = session.results.pop("queue-flood")
    flood.scenario = "tokenizer-slow"
    session.results["tokenizer-slow"] = flood
    row = next(
        line
        for line in render(session).splitlines()
        if line.startswith("| tokenizer-slow | TTFT 100ms")
    )
    assert row.endswith("| NO: at 84 s while the cause held |"), row
    flood.slo["samples"][1]["cause_holds"] = False
    flood.slo["samples"].append(
        {**flood.slo["samples"][0], "at": 90.0, "cause_holds": True, "burn": {}}
    )
    row = next(
        line
        for line in render(session).splitlines()
        if line.startswith("| tokenizer-slow | TTFT 100ms")
    )
    assert row.endswith("| closed (1 looks) | never (before the cause held: from 84 s) |"), row


def test_a_busy_machine_is_called_shared() -> None:
    session = _session()
    session.results["queue-flood"].sized.calibration["extra"]["load_average"] = 15.0  # type: ignore[index]
    assert "more than twice the machine's 2 CPUs, a machine shared" in render(session)


def test_an_expected_alert_ranked_below_another_says_which_was_first() -> None:
    page = render(_session(ranked_second=True))
    assert "| 2 of 2; first `InferenceTokenizerSlow` |" in page


def test_a_drill_whose_check_failed_says_so_though_its_alert_fired() -> None:
    session = _session()
    session.results["queue-flood"].failed = "expected a page and its repeat, got 1"
    row = next(line for line in render(session).splitlines() if line.startswith("| queue-flood"))
    assert "| yes; FAILED: expected a page and its repeat, got 1 | 71 s" in row


def test_a_run_keeps_the_other_speeds_section() -> None:
    natural = render(_session())
    both = render(_session(8.0), previous=natural)
    assert _section(both, "natural") == _section(natural, "natural")
    slow = _section(both, "slow-8x")
    assert "model worker 8x slower" in slow and "step 22.4 ms (1)" in slow
    # ... and the natural run after it keeps the slowed one
    again = render(_session(), previous=both)
    assert _section(again, "slow-8x") == slow


def test_saved_results_render_the_same_page(tmp_path: Path) -> None:
    session = _session(8.0)
    saved = tmp_path / "results-slow-8x.json"
    save(session, saved)
    assert load(saved) == session
    previous = tmp_path / "drills.md"
    previous.write_text(render(_session()), "utf-8")
    out = tmp_path / "out.md"
    assert main([str(saved), "--previous", str(previous), "--out", str(out)]) == 0
    assert out.read_text("utf-8") == render(session, previous=previous.read_text("utf-8"))
    assert main([str(tmp_path / "missing.json"), "--out", str(out)]) == 2


def test_a_failed_check_keeps_its_first_line_in_the_result() -> None:
    result = _flood()
    with pytest.raises(AssertionError), noting_failure(result):
        raise AssertionError("\n  share: 0.002\n  alerts: {}")
    assert result.failed == "share: 0.002"


def _gateway(other_advice: float | None = None) -> DrillResult:
    page = {
        "alertname": STALE_ENDPOINTS,
        "receiver": "pagerduty",
        "body": {"event_action": "trigger", "dedup_key": "k", "payload": {"severity": "critical"}},
    }
    return DrillResult(
        scenario="gateway-stale-endpoints",
        expected=STALE_ENDPOINTS,
        started="2026-12-05 12:00:00",
        duration_s=90.6,
        alerts={
            STALE_ENDPOINTS: AlertSeen(pending_at=33.0, firing_at=63.1, severity="critical"),
            "InferenceGPUStarvedQueueGrowing": AlertSeen(pending_at=63.1, severity="critical"),
        },
        pages=[page, page],
        diagnose={
            "findings": [
                {"alert": STALE_ENDPOINTS, "status": "holds"},
                {"alert": "InferenceGPUStarvedQueueGrowing", "status": "holds"},
            ]
        },
        signals={
            "gateway_queue": 54.0,
            "gateway_saturation": 1.0,
            "gateway_shed_per_s": 2.07,
            "pool_gpu_util": 0.40,
            "engine_advice_fix_gateway_scrape": 1.0,
            "engine_advice_other": other_advice,
        },
        sized=_sized("gateway-stale-endpoints"),
    )


def test_the_gateway_drill_has_its_row_layout_and_deadline() -> None:
    """The gateway drill's own section, in each speed's: when it fired against its deadline,
    the gateway's queue and what the pack advised on the engine behind it; its sizing row
    says the gateway's layout and its deadline's parts."""
    session = _session()
    session.results["gateway-stale-endpoints"] = _gateway()
    natural = _section(render(session), "natural")
    assert "### A gateway in front of the engine (llm-d's endpoint picker)" in natural
    rows = [x for x in natural.splitlines() if x.startswith("| gateway-stale-endpoints |")]
    matrix, sizing = rows
    wait = deadline(GATEWAY_BY_NAME["gateway-stale-endpoints"])
    assert (
        f"| `stale-endpoints` | `{STALE_ENDPOINTS}` | yes | 63 s (by {wait.seconds:.0f} s) |"
        in (matrix)
    )
    assert "| 91 s | - | 1 of 2 | pagerduty (critical), 2 events, dedup_key stable |" in matrix
    assert "| 54 (saturation 1.00, shed 2.07/s) | 0.40 | `fix_gateway_scrape` |" in matrix
    assert "a stand-in llm-d gateway and its sidecar, reference engine" in sizing
    assert f"| {wait.seconds:.0f} s: {wait.how} |" in sizing
    assert "- **gateway-stale-endpoints**: the gateway's reads" in natural
    # a second advice on the engine's pod shows, and a drill that did not run says so
    session.results["gateway-stale-endpoints"] = _gateway(other_advice=1.0)
    assert "| `fix_gateway_scrape` + 1 other! |" in render(session)
    del session.results["gateway-stale-endpoints"]
    assert (
        "| gateway-stale-endpoints | `stale-endpoints` | `InferenceGatewayStaleEndpoints` | not run |"
        in (render(session))
    )


def test_the_slo_row_of_a_healthy_drill_counts_every_look() -> None:
    session = _session()
    flood = session.results.pop("queue-flood")
    flood.scenario, flood.expected = "healthy", None
    session.results["healthy"] = flood
    row = next(
        line for line in render(session).splitlines() if line.startswith("| healthy | TTFT 100ms")
    )
    assert "| `none (no_capacity_backlog)`, `scale_out (capacity)` |" in row, row
    assert row.endswith("| open 1 / 1 of 2 looks | NO: at 84 s |"), row
