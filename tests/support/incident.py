"""Recorded incidents, hand-written to look like three CPU drills: what a Prometheus holding
the pack's records would have stored, backfilled with ``promtool tsdb create-blocks-from
openmetrics`` and served by a real Prometheus.

Forty minutes scraped every 15 s from one sidecar; the first twenty are healthy (GPU 85 %,
busiest engine thread 45 % of a core, nothing queued, 1.5 s per request). At minute 20:

``frontend-gil``
    the front-end thread saturates: GPU at 40 %, the thread at 98 %, the queue grows by one
    request a minute, requests take up to 14 s, most of it queue wait. Prometheus's own
    ``ALERTS`` series say the critical starvation alert fired from minute 30 (its ``for``).
``tokenizer-slow``
    the tokenizer takes 45 ms against a 20 ms decode step; requests slow to 4 s. No ``ALERTS``
    (a Prometheus without the alerting rules): the report shades where the expression held.
``softirq``
    softirq takes 12 % of the node and 80 % of its busiest core. No ``ALERTS`` either.

Data-quality faults in all three: no scrape from minute 5 to 7 (``up`` has no sample) and the
tokenizer collector fails from minute 30 to 35; ``frontend-gil`` also lacks the softirq
busiest-core record.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.lab.processes import Server, start_prometheus
from exporter.signatures.signals import (
    HISTORY,
    cpu_signals,
    energy_signals,
    engine_signals,
    gpu_signals,
    latency_signals,
    roofline_signals,
    shared_gpu_signals,
)
from exporter.signatures.signals.signal import Signal
from exporter.signatures.site import SiteConfig
from support.paths import ROOT
from support.promstack import backfill

# 2026-03-02 03:00:00 UTC: a night page.
START = 1772420400
MINUTES = 40
INCIDENT_AT = 20
FIRING_AT = 30
SCRAPE_S = 15
GAP = (5, 7)  # minutes without a scrape
COLLECTOR_FAILS = (30, 35)
TARGET = {"instance": "10.0.3.7:10960", "job": "inference-bottleneck-exporter"}
LEAD = "InferenceGPUStarvedQueueGrowing"


def _ramp(minute: float, before: float, after: float, last: float | None = None) -> float:
    """``before`` until the incident; then ``after``, rising to ``last`` by the end."""
    if minute < INCIDENT_AT:
        return before
    if last is None:
        return after
    return after + (last - after) * (minute - INCIDENT_AT) / (MINUTES - INCIDENT_AT)


Series = dict[str, Callable[[float], float | None]]
#: A signal's name in the incident's site config.
Names = Callable[[Signal], str]


def names(cfg: SiteConfig) -> Names:
    return lambda signal: signal.record(cfg)


def healthy(cfg: SiteConfig) -> Series:
    """Each record (and raw series) by name: its value at a minute, None for no sample."""
    r = names(cfg)
    rate, trend = cfg.window_seconds("rate"), cfg.window_seconds("queue_trend")
    return {
        r(gpu_signals.GPU_UTILIZATION): lambda m: 0.85,
        r(shared_gpu_signals.GPU_OWN_UTILIZATION): lambda m: 0.85,
        r(gpu_signals.IDLE_SAMPLES): lambda m: 0.02,
        r(gpu_signals.BUSY_SAMPLES): lambda m: 0.60,
        r(engine_signals.QUEUE_DEPTH): lambda m: 0.0,
        r(engine_signals.QUEUE_TREND): lambda m: 0.0,
        r(engine_signals.QUEUE_WAIT_SHARE): lambda m: 0.02,
        r(roofline_signals.E2E_MEAN): lambda m: 1.5,
        r(roofline_signals.BUDGET_QUEUE): lambda m: 0.02,
        r(roofline_signals.BUDGET_PREFILL): lambda m: 0.08,
        r(roofline_signals.BUDGET_DECODE): lambda m: 0.85,
        r(roofline_signals.BUDGET_HOST): lambda m: 0.05,
        r(roofline_signals.DECODE_EFFICIENCY): lambda m: 0.62,
        r(energy_signals.POWER): lambda m: 1200.0,
        r(energy_signals.IDLE_ENERGY): lambda m: 0.12,
        r(energy_signals.ENERGY_PER_GENERATED): lambda m: 0.85,
        r(energy_signals.ENERGY_PER_PROMPT): lambda m: 0.04,
        r(latency_signals.TOKENIZER_MEDIAN): lambda m: 0.005,
        r(latency_signals.INTER_TOKEN_MEDIAN): lambda m: 0.018,
        r(cpu_signals.SOFTIRQ_SHARE): lambda m: 0.01,
        r(cpu_signals.SOFTIRQ_HOTTEST_CORE): lambda m: 0.05,
        r(cpu_signals.HOTTEST_THREAD): lambda m: 0.45,
        r(engine_signals.REQUESTS_RUNNING): lambda m: 6.0,
        r(engine_signals.TRAFFIC): lambda m: 1.0,
        r(HISTORY.at(rate)): lambda m: 1.0 if m >= rate / 60 else None,
        r(HISTORY.at(trend)): lambda m: 1.0 if m >= trend / 60 else None,
        "up": lambda m: None if GAP[0] <= m < GAP[1] else 1.0,
        "inference_exporter_build_info": lambda m: None if GAP[0] <= m < GAP[1] else 1.0,
    }


def _frontend_gil(r: Names) -> Series:
    return {
        r(gpu_signals.GPU_UTILIZATION): lambda m: _ramp(m, 0.85, 0.40),
        r(shared_gpu_signals.GPU_OWN_UTILIZATION): lambda m: _ramp(m, 0.85, 0.40),
        r(gpu_signals.IDLE_SAMPLES): lambda m: _ramp(m, 0.02, 0.10),
        r(gpu_signals.BUSY_SAMPLES): lambda m: _ramp(m, 0.60, 0.05),
        r(engine_signals.QUEUE_DEPTH): lambda m: (
            0.0 if m < INCIDENT_AT else float(int(m - INCIDENT_AT) + 1)
        ),
        r(engine_signals.QUEUE_TREND): lambda m: 0.0 if m < INCIDENT_AT else 1 / 60,
        r(engine_signals.QUEUE_WAIT_SHARE): lambda m: _ramp(m, 0.02, 0.40, 0.85),
        r(roofline_signals.E2E_MEAN): lambda m: _ramp(m, 1.5, 3.0, 14.0),
        r(roofline_signals.BUDGET_QUEUE): lambda m: _ramp(m, 0.02, 0.40, 0.85),
        r(roofline_signals.BUDGET_PREFILL): lambda m: _ramp(m, 0.08, 0.06, 0.02),
        r(roofline_signals.BUDGET_DECODE): lambda m: _ramp(m, 0.85, 0.50, 0.11),
        r(roofline_signals.BUDGET_HOST): lambda m: _ramp(m, 0.05, 0.04, 0.02),
        r(roofline_signals.DECODE_EFFICIENCY): lambda m: _ramp(m, 0.62, 0.55),
        r(latency_signals.INTER_TOKEN_MEDIAN): lambda m: _ramp(m, 0.018, 0.021),
        r(cpu_signals.HOTTEST_THREAD): lambda m: _ramp(m, 0.45, 0.98),
        r(engine_signals.REQUESTS_RUNNING): lambda m: _ramp(m, 6.0, 4.0),
    }


def _tokenizer_slow(r: Names) -> Series:
    return {
        r(latency_signals.TOKENIZER_MEDIAN): lambda m: _ramp(m, 0.005, 0.045),
        r(latency_signals.INTER_TOKEN_MEDIAN): lambda m: _ramp(m, 0.018, 0.020),
        r(roofline_signals.E2E_MEAN): lambda m: _ramp(m, 1.5, 2.0, 4.0),
        r(gpu_signals.GPU_UTILIZATION): lambda m: _ramp(m, 0.85, 0.70),
        r(shared_gpu_signals.GPU_OWN_UTILIZATION): lambda m: _ramp(m, 0.85, 0.70),
        r(roofline_signals.BUDGET_HOST): lambda m: _ramp(m, 0.05, 0.12, 0.20),
        r(roofline_signals.BUDGET_DECODE): lambda m: _ramp(m, 0.85, 0.78, 0.70),
    }


def _softirq(r: Names) -> Series:
    return {
        r(cpu_signals.SOFTIRQ_SHARE): lambda m: _ramp(m, 0.01, 0.12),
        r(cpu_signals.SOFTIRQ_HOTTEST_CORE): lambda m: _ramp(m, 0.05, 0.80),
        r(roofline_signals.E2E_MEAN): lambda m: _ramp(m, 1.5, 1.9),
    }


@dataclass(frozen=True)
class Scenario:
    """One incident: its series, the causes diagnose must rank (in order), and when
    ``ALERTS`` says the first fired (None: the alerting rules were not loaded)."""

    name: str
    changes: Callable[[Names], Series]
    order: tuple[str, ...]
    firing_at: float | None = None
    absent: tuple[Signal, ...] = ()  # signals with no samples at all
    alert_labels: dict[str, str] = field(default_factory=dict)

    @property
    def lead(self) -> str:
        return self.order[0]

    def series(self, cfg: SiteConfig) -> Series:
        r = names(cfg)
        out = {**healthy(cfg), **self.changes(r)}
        for signal in self.absent:
            out.pop(r(signal))
        return out


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "frontend-gil",
            _frontend_gil,
            (LEAD, "InferenceQueueWaitDominatesLatency", "InferenceFrontendCPUSaturated"),
            firing_at=FIRING_AT,
            absent=(cpu_signals.SOFTIRQ_HOTTEST_CORE,),
            alert_labels={"severity": "critical", "signature": "cpu"},
        ),
        Scenario("tokenizer-slow", _tokenizer_slow, ("InferenceTokenizerSlowerThanDecode",)),
        Scenario("softirq", _softirq, ("InferenceSoftirqCPUHigh",)),
    )
}


def _labels(extra: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in {**TARGET, **extra}.items()) + "}"


def openmetrics(cfg: SiteConfig, scenario: Scenario) -> str:
    lines = []
    steps = MINUTES * 60 // SCRAPE_S + 1
    for name, value_at in scenario.series(cfg).items():
        for i in range(steps):
            minute = i * SCRAPE_S / 60
            value = value_at(minute)
            if value is not None:
                lines.append(f"{name}{_labels({})} {value!r} {START + i * SCRAPE_S}")
    for collector in ("tokenizer", "engine", "nvml", "cpu", "process"):
        for i in range(steps):
            minute = i * SCRAPE_S / 60
            if GAP[0] <= minute < GAP[1]:
                continue
            failing = collector == "tokenizer" and COLLECTOR_FAILS[0] <= minute < COLLECTOR_FAILS[1]
            labels = _labels({"collector": collector})
            lines.append(
                f"inference_scrape_collector_success{labels} {0.0 if failing else 1.0} "
                f"{START + i * SCRAPE_S}"
            )
    if scenario.firing_at is not None:
        firing = _labels(
            {"alertname": scenario.lead, "alertstate": "firing", **scenario.alert_labels}
        )
        for i in range(steps):
            if i * SCRAPE_S / 60 >= scenario.firing_at:
                lines.append(f"ALERTS{firing} 1.0 {START + i * SCRAPE_S}")
    # promtool wants each series' samples together and in time order: group by series.
    lines.sort(key=lambda line: (line.rsplit(" ", 2)[0], int(line.rsplit(" ", 1)[1])))
    return "\n".join([*lines, "# EOF"]) + "\n"


@dataclass
class Recorded:
    server: Server
    end: float

    @property
    def url(self) -> str:
        return self.server.url


def serve(cfg: SiteConfig, tmp: Path, scenario: Scenario = SCENARIOS["frontend-gil"]) -> Recorded:
    """A real Prometheus over a backfilled incident (retention long enough for its date)."""
    source = tmp / "incident.om"
    source.write_text(openmetrics(cfg, scenario))
    data = tmp / "data"
    backfill(source, data)
    server = start_prometheus(
        tmp,
        "global: {}\n",
        data=data,
        args=("--storage.tsdb.retention.time=100y", "--log.level=warn"),
        timeout=60,
    )
    return Recorded(server, START + MINUTES * 60)


def run_diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    """``inference-bottleneck-exporter diagnose`` with ``args``, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
