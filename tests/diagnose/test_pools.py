"""``diagnose`` over disaggregated serving, from a real Prometheus: the pool and transfer
signatures ranked with the rest, and the latency budget printed per pool.

Each incident (:mod:`support.pool_incident`: a slow KV transfer, a short decode pool; the
pack's records hand-written and backfilled with promtool) is diagnosed through the real CLI at
its last minute, as text, as JSON and as a post-mortem report.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.incident import Recorded
from support.paths import ROOT
from support.pool_incident import POOL, SCENARIOS, serve

from exporter.signatures.site import parse_config

POOL_NAME = f"pool namespace={POOL['namespace']} job={POOL['job']}"


def diagnose(rec: Recorded, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "diagnose",
            "--prometheus.url",
            rec.url,
            "--time",
            str(rec.end),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.fixture(scope="module", params=list(SCENARIOS))
def incident(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Recorded]]:
    name = request.param
    rec = serve(parse_config({}), tmp_path_factory.mktemp(name), SCENARIOS[name])
    try:
        yield name, rec
    finally:
        rec.server.stop()


def as_json(rec: Recorded) -> dict[str, object]:
    result = diagnose(rec, "--output", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == ""
    document: dict[str, object] = json.loads(result.stdout)
    return document


def test_the_pool_cause_ranks_first(incident: tuple[str, Recorded]) -> None:
    name, rec = incident
    scenario = SCENARIOS[name]
    findings = as_json(rec)["findings"]
    assert isinstance(findings, list)
    held = [f["alert"] for f in findings if f["status"] == "holds"]
    assert held == list(scenario.order)
    lead = findings[0]
    assert lead["rank"] == 1
    assert lead["signature"] == "pool"
    assert lead["target"] == POOL_NAME
    assert lead["labels"] == {**POOL, "model": "Qwen/Qwen3-32B"}
    assert lead["alert_state"] == ("firing" if scenario.firing_at is not None else None)
    nearly = [f["alert"] for f in findings if f["status"] == "nearly"]
    assert nearly == list(scenario.nearly)


DESCRIPTIONS = {
    "kv-transfer-slow": "The KV transfer between the prefill and decode pools takes 60 % of "
    "time to first token (threshold 30 %; 0.540 s per transfer)",
    "decode-pool-short": "21.0 requests wait in the decode pool and its queue grows, while the "
    "prefill pool has no queue: move engines from prefill to decode. Prefill:decode engines "
    "now 1.00, the queues suggest 0.25.",
}


def test_the_lead_reads_its_pool_records(incident: tuple[str, Recorded]) -> None:
    """The lead's description as Alertmanager shows it, filled from the pool's records."""
    name, rec = incident
    findings = as_json(rec)["findings"]
    assert isinstance(findings, list)
    assert DESCRIPTIONS[name] in findings[0]["description"]


def _pools(rec: Recorded) -> list[dict[str, object]]:
    pools = as_json(rec)["pools"]
    assert isinstance(pools, list)
    return pools


EXPECTED = {
    # time to first token (s, queue, prefill, transfer); each role's shares of its latency
    "kv-transfer-slow": (
        (0.9, 0.04 / 0.9, 0.32 / 0.9, 0.6),
        {
            "prefill": {"queue": 0.1, "prefill": 0.85, "transfer": None, "decode": 0.0},
            "decode": {"queue": 0.01, "prefill": 0.01, "transfer": 0.25, "decode": 0.68},
        },
        [
            "time to first token 900 ms: queue 4 %, prefill 36 %, transfer 60 %",
            "prefill pool, of its end-to-end latency: queue 10 %, prefill 85 %, transfer -, "
            "decode 0 %",
            "decode pool, of its end-to-end latency: queue 1 %, prefill 1 %, transfer 25 %, "
            "decode 68 %",
        ],
    ),
    "decode-pool-short": (
        (0.86, 0.5 / 0.86, 0.32 / 0.86, 0.04 / 0.86),
        {
            "prefill": {"queue": 0.1, "prefill": 0.85, "transfer": None, "decode": 0.0},
            "decode": {"queue": 0.7, "prefill": 0.01, "transfer": 0.02, "decode": 0.25},
        },
        [
            "time to first token 860 ms: queue 58 %, prefill 37 %, transfer 5 %",
            "prefill pool, of its end-to-end latency: queue 10 %, prefill 85 %, transfer -, "
            "decode 0 %",
            "decode pool, of its end-to-end latency: queue 70 %, prefill 1 %, transfer 2 %, "
            "decode 25 %",
        ],
    ),
}


def test_budget_per_pool_in_json(incident: tuple[str, Recorded]) -> None:
    name, rec = incident
    (seconds, queue, prefill, transfer), roles, _ = EXPECTED[name]
    pools = _pools(rec)
    assert len(pools) == 1
    pool = pools[0]
    assert pool["pool"] == POOL_NAME
    assert pool["model"] == "Qwen/Qwen3-32B"
    ttft = pool["time_to_first_token"]
    assert isinstance(ttft, dict)
    assert ttft["seconds"] == pytest.approx(seconds)
    assert ttft["queue"] == pytest.approx(queue)
    assert ttft["prefill"] == pytest.approx(prefill)
    assert ttft["transfer"] == pytest.approx(transfer)
    assert ttft["queue"] + ttft["prefill"] + ttft["transfer"] == pytest.approx(1.0)
    got = pool["roles"]
    assert isinstance(got, dict)
    assert list(got) == ["prefill", "decode"]
    for role, shares in roles.items():
        assert got[role] == pytest.approx(shares), role


def test_budget_per_pool_in_text(incident: tuple[str, Recorded]) -> None:
    name, rec = incident
    result = diagnose(rec)
    assert result.returncode == 1, result.stdout + result.stderr
    section = result.stdout.split("Latency budget per pool:\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    assert lines[0] == f"  {POOL_NAME} Qwen/Qwen3-32B"
    assert [line.strip() for line in lines[1:]] == EXPECTED[name][2]
    # the ranked verdict names the pool, not a pod
    lead = SCENARIOS[name].order[0]
    assert f"1. HOLDS  warning  {lead} [pool]" in result.stdout


def test_post_mortem_of_a_pool(incident: tuple[str, Recorded], tmp_path: Path) -> None:
    name, rec = incident
    lead = SCENARIOS[name].order[0]
    for suffix in (".html", ".md"):
        out = tmp_path / f"incident{suffix}"
        result = diagnose(rec, "--report", str(out))
        assert result.returncode == 1, result.stdout + result.stderr
        page = out.read_text()
        assert f"{lead} on {POOL_NAME}" in page
        for line in EXPECTED[name][2]:
            assert line in page
    html = (tmp_path / "incident.html").read_text()
    # the plots of a pool's incident show the pool's targets: the queue of every pod
    queue = html.split('<figure data-panel="queue">', 1)[1].split("</figure>", 1)[0]
    assert queue.count("data-series=") == 4, queue
    # and where the pool's first token waits, against the transfer-bound threshold
    ttft = html.split('<figure data-panel="ttft">', 1)[1].split("</figure>", 1)[0]
    names = re.findall(r'data-series="([^"]+)"', ttft)
    assert names == [f"{part} model=Qwen/Qwen3-32B" for part in ("queue", "prefill", "KV transfer")]
    assert 'data-threshold="0.3"' in ttft
    counts = [int(n) for n in re.findall(r'data-points="(\d+)"', ttft)]
    assert counts and min(counts) > 100, counts
