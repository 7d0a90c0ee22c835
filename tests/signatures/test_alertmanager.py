"""``alert_rules/alertmanager.yaml`` against the real Alertmanager 0.25 and amtool.

``amtool check-config``; ``amtool config routes test`` for every alert of the catalogue and
each severity; the inhibitions against the catalogue; and end to end: two real sidecars
(replay traces, fake engines whose queues grow), a real Prometheus evaluating the ``fast``
rule pack every second, a real Alertmanager running the generated configuration with short
timers and its PagerDuty ``url`` pointed at a local capture endpoint. The captured Events API
v2 payloads are checked field by field, including the ``dedup_key`` that Alertmanager derives
from the group key (SHA-256 of ``<route path>:<group labels>``, ``notify.Key.Hash``).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fakeengine import FakeEngine
from support.paths import ROOT
from support.process import ExporterProcess
from support.promstack import (
    JOB,
    RULES,
    Capture,
    Feeder,
    Load,
    Stack,
    address,
    binary,
    get_json,
    sidecar,
    start_alertmanager,
    start_prometheus,
    trace,
    wait_until,
)

from exporter.config import format_duration
from exporter.signatures import all_signatures, parse_config
from exporter.signatures.__main__ import profile_files
from exporter.signatures.alertmanager import alertmanager_yaml
from exporter.signatures.definitions import FAMILIES
from exporter.signatures.render import runbook_url
from exporter.signatures.signals.engine_signals import QUEUE_DEPTH, QUEUE_TREND

CONFIG = RULES / "alertmanager.yaml"
CFG = parse_config({})
SIGNATURES = all_signatures(CFG)
RECEIVER = {"critical": "pagerduty", "warning": "pagerduty-low-urgency", "info": "null"}
STARVED = "InferenceGPUStarvedQueueGrowing"
LOST = "InferenceGPULost"
ROUTE_KEY = '{}/{alertname=~"Inference.+"}/{severity="critical"}'
# The end-to-end test is about routing, inhibition and the PagerDuty events, not the pack's
# timings (tests/promtool has those): the fast profile with the windows the starved-queue alert
# reads and its `for` at 10 s (100 s before the profile's 1/10 scale), generated as a site
# would, so that its cold-start guard and `for` take 20 s of real time instead of 2 minutes.
E2E_SITE = parse_config(
    {
        "windows": {"rate": "100s", "queue_trend": "100s"},
        "signatures": {STARVED: {"for": "100s"}},
    },
    "fast",
)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("amtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def routes_test(labels: dict[str, str], expected: str) -> subprocess.CompletedProcess[str]:
    pairs = [f"{k}={v}" for k, v in labels.items()]
    return amtool(
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        f"--verify.receivers={expected}",
        *pairs,
    )


def load() -> dict[str, Any]:
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


# --- the file ---------------------------------------------------------------------------------


def test_generated_from_the_catalogue() -> None:
    assert CONFIG.read_text(encoding="utf-8") == alertmanager_yaml(CFG)


def test_amtool_check_config() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert " - 5 inhibit rules" in result.stdout
    assert " - 3 receivers" in result.stdout


def test_site_config_regenerates_grouping_and_passes_amtool(tmp_path: Path) -> None:
    cfg = parse_config({"join_labels": ["cluster", "namespace", "pod"]})
    path = tmp_path / "alertmanager.yaml"
    path.write_text(alertmanager_yaml(cfg), encoding="utf-8")
    result = amtool("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    data = yaml.safe_load(path.read_text())
    assert data["route"]["group_by"] == ["alertname", "cluster", "namespace", "pod"]
    assert all(
        rule["equal"][-3:] == ["cluster", "namespace", "pod"] for rule in data["inhibit_rules"]
    )


def test_pagerduty_receivers_use_events_v2_and_key_files() -> None:
    data = load()
    receivers = {r["name"]: r for r in data["receivers"]}
    assert set(receivers) == {"pagerduty", "pagerduty-low-urgency", "null"}
    assert set(receivers["null"]) == {"name"}
    for name in ("pagerduty", "pagerduty-low-urgency"):
        (pd,) = receivers[name]["pagerduty_configs"]
        assert pd["routing_key_file"].startswith("/etc/alertmanager/secrets/")
        assert "routing_key" not in pd and "service_key" not in pd  # v2, no secret inline
        assert pd["send_resolved"] is True
        assert "{{ .CommonAnnotations.runbook_url }}" in pd["details"]["runbook_url"]
        assert pd["links"][0]["href"] == "{{ .CommonAnnotations.runbook_url }}"
    assert data["global"]["pagerduty_url"] == "https://events.pagerduty.com/v2/enqueue"
    assert data["route"]["group_by"] == ["alertname", *CFG.join_labels]


# --- routing ----------------------------------------------------------------------------------


ROUTED = [
    pytest.param(
        {
            "alertname": sig.alert,
            "severity": rule.severity,
            "signature": sig.family,
            **dict(rule.labels),
            "instance": "10.0.0.7:10960",
            "job": JOB,
        },
        RECEIVER[rule.severity],
        id=f"{sig.alert}-{rule.severity}" + "".join(f"-{v}" for _, v in rule.labels),
    )
    for sig in SIGNATURES
    for rule in sig.rules
]


@pytest.mark.parametrize(("labels", "receiver"), ROUTED)
def test_every_alert_routes_by_its_severity(labels: dict[str, str], receiver: str) -> None:
    result = routes_test(labels, receiver)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": STARVED, "severity": "critical", "signature": "cpu"}, "pagerduty"),
        ({"alertname": "InferenceSoftirqCPUHigh", "severity": "warning"}, "pagerduty-low-urgency"),
        ({"alertname": "InferenceGPUUnderutilized", "severity": "info"}, "null"),
        # a future alert of the pack without a known severity is not dropped
        ({"alertname": "InferenceSomethingNew"}, "pagerduty-low-urgency"),
        ({"alertname": "InferenceSomethingNew", "severity": "page"}, "pagerduty-low-urgency"),
        # alerts that are not the pack's take the root receiver
        ({"alertname": "Watchdog", "severity": "info"}, "pagerduty-low-urgency"),
    ],
    ids=["critical", "warning", "info", "no-severity", "unknown-severity", "foreign"],
)
def test_severity_routes(labels: dict[str, str], receiver: str) -> None:
    result = routes_test(labels, receiver)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_each_severity_reaches_exactly_one_receiver() -> None:
    # --verify.receivers with the wrong receiver fails: the checks above are not vacuous.
    wrong = routes_test({"alertname": LOST, "severity": "critical"}, "pagerduty-low-urgency")
    assert wrong.returncode != 0


# --- inhibitions ------------------------------------------------------------------------------


def _alertnames(matchers: list[str]) -> set[str]:
    names: set[str] = set()
    for matcher in matchers:
        match = re.fullmatch(r'alertname(=~|=|!=)"([^"]*)"', matcher)
        if match and match[1] != "!=" and match[2] != "Inference.+":
            names.update(match[2].split("|"))
    return names


def test_inhibitions_name_the_catalogue() -> None:
    rules = load()["inhibit_rules"]
    alerts = {sig.alert for sig in SIGNATURES}
    for rule in rules:
        for side in ("source_matchers", "target_matchers"):
            assert _alertnames(rule[side]) <= alerts, rule
            for matcher in rule[side]:
                if matcher.startswith("signature"):
                    values = re.fullmatch(r'signature=~?"([^"]*)"', matcher)
                    assert values and set(values[1].split("|")) <= set(FAMILIES), matcher
        assert rule["equal"][-len(CFG.join_labels) :] == list(CFG.join_labels)
    by_source = {tuple(r["source_matchers"]): r for r in rules}
    lost = by_source[(f'alertname="{LOST}"',)]
    assert 'signature=~"cpu|queue|network|memory|gpu|roofline"' in lost["target_matchers"]
    down = by_source[('alertname="InferenceExporterDown"',)]
    assert 'alertname!="InferenceExporterDown"' in down["target_matchers"]
    # engine metrics down covers every alert that reads the engine's queue
    engine = [
        r for r in rules if r["source_matchers"] == ['alertname="InferenceEngineMetricsDown"']
    ]
    covered = set().union(*(_alertnames(r["target_matchers"]) for r in engine))
    assert any('signature="queue"' in r["target_matchers"] for r in engine)
    queue_records = (QUEUE_DEPTH.record(CFG), QUEUE_TREND.record(CFG))
    readers = {
        sig.alert
        for sig in SIGNATURES
        for rule in sig.rules
        if sig.family != "queue" and any(record in rule.expr for record in queue_records)
    }
    assert readers == {STARVED, "InferenceGPUContended"} and readers <= covered


# --- end to end -------------------------------------------------------------------------------


def local_config(capture: Capture, tmp: Path) -> dict[str, Any]:
    """The generated configuration with its PagerDuty URL on the capture endpoint, routing
    keys in temporary files and timers short enough for a test."""
    config = load()
    for receiver in config["receivers"]:
        for pd in receiver.get("pagerduty_configs", []):
            key = tmp / f"{receiver['name']}.key"
            key.write_text(f"routing-key-{receiver['name']}\n")
            pd["routing_key_file"] = str(key)
            pd["url"] = f"{capture.url}/{receiver['name']}"

    def fast(route: dict[str, Any]) -> None:
        for name, value in (
            ("group_wait", "1s"),
            ("group_interval", "1s"),
            ("repeat_interval", "2s"),
        ):
            if name in route or route is config["route"]:
                route[name] = value
        for child in route.get("routes", []):
            fast(child)

    fast(config["route"])
    return config


def group_key(alertname: str, instance: str) -> str:
    labels = f'alertname="{alertname}", instance="{instance}", job="{JOB}"'
    return f"{ROUTE_KEY}:{{{labels}}}"


def dedup_key(alertname: str, instance: str) -> str:
    return hashlib.sha256(group_key(alertname, instance).encode()).hexdigest()


def e2e_rules(tmp: Path) -> list[Path]:
    """The rule files of :data:`E2E_SITE`, as ``python -m exporter.signatures --profile fast
    --config`` writes them."""
    files = profile_files(E2E_SITE, tmp / "rules")
    (tmp / "rules").mkdir()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return sorted(files)


def _alerts(am_base: str, alertname: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get_json(
        f"{am_base}/api/v2/alerts?filter=alertname%3D%22{alertname}%22"
    )
    return found


@pytest.mark.timeout(150)
def test_end_to_end_pagerduty_events(
    tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    stack = Stack()
    try:
        capture = Capture()
        stack.add(capture.close)
        engines = [FakeEngine.run_in_thread(), FakeEngine.run_in_thread()]
        for engine in engines:
            stack.add(engine.stop)
        feeder = Feeder([(e, Load(queue=1, queue_growth=1.0)) for e in engines])
        stack.add(feeder.stop)
        # A: GPUs at half their usual utilisation (mean ~37 %) while the queue grows.
        starved = sidecar(
            exporter_process,
            engines[0],
            "--gpu.replay-file",
            str(trace(tmp_path, utilization=0.5, name="starved")),
        )
        # B: the same, and GPU 1 lost: its starvation is a consequence, inhibited.
        lost = sidecar(
            exporter_process,
            engines[1],
            "--gpu.replay-file",
            str(trace(tmp_path, utilization=0.5, lost_gpu=1, name="lost")),
        )
        am = start_alertmanager(tmp_path, local_config(capture, tmp_path))
        stack.add(am.stop)
        prometheus = start_prometheus(
            tmp_path,
            [address(starved), address(lost)],
            e2e_rules(tmp_path),
            alertmanager=am.url,
        )
        stack.add(prometheus.stop)
        a, b = address(starved), address(lost)

        # GPU lost (for: 6s) pages first; with repeat_interval 2s it is notified again.
        wait_until(lambda: len(capture.events("/pagerduty", LOST)) >= 2, 60, "two GPU-lost events")
        # The starved queue pages for A: once the targets have a queue-trend window (10s) of
        # history in this new Prometheus (the cold-start guard), then after its `for` (10s).
        wait_until(
            lambda: any(e["payload"]["source"] == a for e in capture.events("/pagerduty", STARVED)),
            90,
            "the starved-queue event of A",
        )

        # B's starved-queue alert reached Alertmanager and is inhibited by its lost GPU.
        def suppressed() -> bool:
            for alert in _alerts(am.url, STARVED):
                if alert["labels"].get("instance") == b:
                    return bool(
                        alert["status"]["state"] == "suppressed" and alert["status"]["inhibitedBy"]
                    )
            return False

        wait_until(suppressed, 20, "B's starved-queue alert suppressed")
        time.sleep(3)  # a few group intervals: an uninhibited notification would be here
        sources = {e["payload"]["source"] for e in capture.events(alertname=STARVED)}
        assert sources == {a}, "the inhibited signature of B was delivered"

        # --- the Events API v2 payload of the signature ---
        event = next(
            e for e in capture.events("/pagerduty", STARVED) if e["payload"]["source"] == a
        )
        runbook = runbook_url(CFG, STARVED)
        assert event["event_action"] == "trigger"
        assert event["routing_key"] == "routing-key-pagerduty"
        assert event["dedup_key"] == dedup_key(STARVED, a)
        assert event["client"] == "inference-bottleneck-exporter"
        # Alertmanager's external URL (its host name, our port)
        assert event["client_url"].rstrip("/").endswith(":" + am.url.rsplit(":", 1)[1])
        payload = event["payload"]
        assert payload["severity"] == "critical"
        assert payload["source"] == a
        assert payload["class"] == "cpu"
        assert payload["component"] == STARVED
        summary = re.fullmatch(
            rf"GPU starved while the queue grows on {re.escape(a)}: Mean GPU utilisation "
            r"(\d+) % \(below 60 %\) while the queue grew by \+(\d+) requests in "
            rf"{format_duration(E2E_SITE.window_seconds('queue_trend'))} to (\d+) "
            r"waiting: the CPU side .*",
            payload["summary"],
        )
        assert summary, payload["summary"]
        util, growth, waiting = (int(x) for x in summary.groups())
        assert 20 <= util < 60 and growth > 0 and waiting >= 1
        details = payload["custom_details"]
        assert details["alertname"] == STARVED
        assert details["severity"] == "critical"
        assert details["signature"] == "cpu"
        assert details["target"] == a
        assert details["runbook_url"] == runbook
        assert details["description"].startswith(f"Mean GPU utilisation {util} %")
        assert details["num_firing"] == "1"  # Alertmanager's own details are kept
        assert event["links"][0] == {"href": runbook, "text": f"Runbook: {STARVED}"}
        assert "/graph?g0.expr=" in event["links"][1]["href"]

        # --- the GPU-lost group: one stable dedup_key over every notification ---
        lost_events = capture.events("/pagerduty", LOST)
        assert len(lost_events) >= 2
        assert {e["dedup_key"] for e in lost_events} == {dedup_key(LOST, b)}
        first = lost_events[0]
        assert first["event_action"] == "trigger"
        assert first["payload"]["severity"] == "critical"
        assert first["payload"]["summary"].startswith(f"GPU 1 lost on {b}: GPU 1 (GPU-")
        assert first["links"][0]["href"] == runbook_url(CFG, LOST)
        # B's sidecar goes away: its series go stale, the group resolves on the same key.
        lost.terminate()
        wait_until(
            lambda: any(e["event_action"] == "resolve" for e in capture.events("/pagerduty", LOST)),
            30,
            "the GPU-lost resolve event",
        )
        resolve = next(
            e for e in capture.events("/pagerduty", LOST) if e["event_action"] == "resolve"
        )
        assert resolve["dedup_key"] == dedup_key(LOST, b)
        assert resolve["payload"]["summary"].startswith(f"[RESOLVED] GPU 1 lost on {b}: ")
        assert resolve["payload"]["custom_details"]["description"].startswith("[RESOLVED] GPU 1 (")
        # nothing of the pack went to the low-urgency service under another severity
        assert all(
            e["payload"]["severity"] == "warning" for e in capture.events("/pagerduty-low-urgency")
        )
    finally:
        stack.close()
