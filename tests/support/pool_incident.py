"""Recorded incidents of disaggregated serving, hand-written: what a Prometheus holding the
pack's records would have stored for one model served by two prefill and two decode engines
(vLLM with ``--engine.role``), backfilled with ``promtool tsdb create-blocks-from
openmetrics`` and served by a real Prometheus.

Forty minutes scraped every 15 s (the times of :mod:`support.incident`); the first twenty
healthy: time to first token 400 ms (queue 10 %, prefill 80 %, KV transfer 10 %), no queue in
either pool. At minute 20:

``kv-transfer-slow``
    each transfer takes 540 ms instead of 40 ms: the transfer is 60 % of time to first token
    while the decode pool has no queue and its KV cache is 40 % used. ``ALERTS`` says
    ``InferenceKVTransferBound`` fired from minute 30; the failure ratio reads 0.95 %, just
    under the 1 % of ``InferenceKVTransferFailing`` (a near miss).
``decode-pool-short``
    the decode pool's queue grows by a request a minute while the prefill pool's stays empty,
    and time to first token waits in it (500 ms of 860 at the end); the decode engines' queue
    wait grows to 70 % of their end-to-end latency (their own
    ``InferenceQueueWaitDominatesLatency`` holds, with a wider margin than the pool's alert:
    the pool's cause still ranks first). No ``ALERTS``.

The records' arithmetic is proven by promtool (``tests/promtool/sidecar/split.yaml``,
``pools.yaml``); these series test what ``diagnose`` makes of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exporter.lab.processes import start_prometheus
from exporter.signatures.signals import (
    HISTORY,
    POOL_HISTORY,
    engine_signals,
    gpu_signals,
    pool_signals,
)
from exporter.signatures.site import SiteConfig
from support.incident import INCIDENT_AT, MINUTES, SCRAPE_S, START, Recorded, _ramp, names
from support.promstack import backfill

MODEL = "Qwen/Qwen3-32B"
POOL = {"namespace": "llm", "job": "llm/inference-bottleneck-exporter"}
PODS = {
    "prefill-0": ("prefill", "10.0.7.1:10960"),
    "prefill-1": ("prefill", "10.0.7.2:10960"),
    "decode-0": ("decode", "10.0.8.1:10960"),
    "decode-1": ("decode", "10.0.8.2:10960"),
}
FIRING_AT = 30

Value = Callable[[float], float | None]


@dataclass(frozen=True)
class PoolSeries:
    """One incident's series: per pool (and model), per pool and role, per pod."""

    pool: dict[str, Value]
    by_role: dict[tuple[str, str], Value]  # (record, role)
    per_pod: dict[str, Value]  # the same for each pod
    per_decode_pod: dict[str, Value]  # decode pods only


def _common(cfg: SiteConfig) -> PoolSeries:
    r = names(cfg)
    windows = sorted({cfg.window_seconds(n) for n in ("rate", "latency", "queue_trend")})
    pool: dict[str, Value] = {
        r(POOL_HISTORY.at(s)): (lambda m, s=s: 1.0 if m >= s / 60 else None) for s in windows
    }
    pool |= {
        r(pool_signals.POOL_ENGINES.prefill): lambda m: 2.0,
        r(pool_signals.POOL_ENGINES.decode): lambda m: 2.0,
        r(pool_signals.POOL_QUEUE.prefill): lambda m: 0.0,
        r(pool_signals.POOL_QUEUE_TREND.prefill): lambda m: 0.0,
        r(pool_signals.POOL_QUEUE.decode): lambda m: 0.0,
        r(pool_signals.POOL_QUEUE_TREND.decode): lambda m: 0.0,
        r(pool_signals.POOL_KV_CACHE.decode): lambda m: 0.4,
        r(pool_signals.POOL_RATIO_NOW): lambda m: 1.0,
        r(pool_signals.POOL_RATIO_SUGGESTED): lambda m: 1.0,
        r(pool_signals.KV_FAILURE_RATIO): lambda m: 0.001,
        r(pool_signals.TTFT_QUEUE_MEAN): lambda m: 0.04,
        r(pool_signals.TTFT_PREFILL_MEAN): lambda m: 0.32,
        r(pool_signals.KV_TRANSFER_MEAN): lambda m: 0.04,
        r(pool_signals.TTFT_QUEUE_SHARE): lambda m: 0.1,
        r(pool_signals.TTFT_PREFILL_SHARE): lambda m: 0.8,
        r(pool_signals.TTFT_TRANSFER_SHARE): lambda m: 0.1,
    }
    by_role: dict[tuple[str, str], Value] = {
        (r(pool_signals.POOL_BUDGET_QUEUE), "prefill"): lambda m: 0.1,
        (r(pool_signals.POOL_BUDGET_PREFILL), "prefill"): lambda m: 0.85,
        (r(pool_signals.POOL_BUDGET_DECODE), "prefill"): lambda m: 0.0,
        (r(pool_signals.POOL_BUDGET_QUEUE), "decode"): lambda m: 0.01,
        (r(pool_signals.POOL_BUDGET_PREFILL), "decode"): lambda m: 0.01,
        (r(pool_signals.POOL_BUDGET_TRANSFER), "decode"): lambda m: 0.02,
        (r(pool_signals.POOL_BUDGET_DECODE), "decode"): lambda m: 0.9,
    }
    rate = cfg.window_seconds("rate")
    per_pod: dict[str, Value] = {
        r(HISTORY.at(rate)): lambda m: 1.0 if m >= rate / 60 else None,
        r(engine_signals.TRAFFIC): lambda m: 1.0,
        # the engines' GPUs busy: no GPU signature holds, and none is blind
        r(gpu_signals.GPU_UTILIZATION): lambda m: 0.8,
        r(engine_signals.QUEUE_DEPTH): lambda m: 0.0,
        r(engine_signals.QUEUE_TREND): lambda m: 0.0,
        r(engine_signals.QUEUE_WAIT_SHARE): lambda m: 0.05,
        "up": lambda m: 1.0,
        "inference_exporter_build_info": lambda m: 1.0,
    }
    return PoolSeries(pool, by_role, per_pod, {})


def _kv_transfer_slow(cfg: SiteConfig, s: PoolSeries) -> PoolSeries:
    r = names(cfg)
    s.pool.update(
        {
            r(pool_signals.KV_TRANSFER_MEAN): lambda m: _ramp(m, 0.04, 0.54),
            r(pool_signals.TTFT_QUEUE_SHARE): lambda m: _ramp(m, 0.1, 0.04 / 0.9),
            r(pool_signals.TTFT_PREFILL_SHARE): lambda m: _ramp(m, 0.8, 0.32 / 0.9),
            r(pool_signals.TTFT_TRANSFER_SHARE): lambda m: _ramp(m, 0.1, 0.6),
            r(pool_signals.KV_FAILURE_RATIO): lambda m: _ramp(m, 0.001, 0.0095),
        }
    )
    s.by_role.update(
        {
            (r(pool_signals.POOL_BUDGET_TRANSFER), "decode"): lambda m: _ramp(m, 0.02, 0.25),
            (r(pool_signals.POOL_BUDGET_DECODE), "decode"): lambda m: _ramp(m, 0.9, 0.68),
        }
    )
    return s


def _decode_pool_short(cfg: SiteConfig, s: PoolSeries) -> PoolSeries:
    r = names(cfg)

    def queue(m: float) -> float:
        return 0.0 if m < INCIDENT_AT else float(int(m - INCIDENT_AT) + 1)

    s.pool.update(
        {
            r(pool_signals.POOL_QUEUE.decode): queue,
            r(pool_signals.POOL_QUEUE_TREND.decode): lambda m: 0.0 if m < INCIDENT_AT else 1 / 60,
            r(pool_signals.POOL_RATIO_SUGGESTED): lambda m: _ramp(m, 1.0, 0.5, 0.25),
            r(pool_signals.TTFT_QUEUE_MEAN): lambda m: _ramp(m, 0.04, 0.1, 0.5),
            r(pool_signals.TTFT_QUEUE_SHARE): lambda m: _ramp(m, 0.1, 0.1 / 0.46, 0.5 / 0.86),
            r(pool_signals.TTFT_PREFILL_SHARE): lambda m: _ramp(m, 0.8, 0.32 / 0.46, 0.32 / 0.86),
            r(pool_signals.TTFT_TRANSFER_SHARE): lambda m: _ramp(m, 0.1, 0.04 / 0.46, 0.04 / 0.86),
        }
    )
    s.by_role.update(
        {
            (r(pool_signals.POOL_BUDGET_QUEUE), "decode"): lambda m: _ramp(m, 0.01, 0.3, 0.7),
            (r(pool_signals.POOL_BUDGET_DECODE), "decode"): lambda m: _ramp(m, 0.9, 0.6, 0.25),
        }
    )
    s.per_decode_pod.update(
        {
            r(engine_signals.QUEUE_DEPTH): lambda m: queue(m) / 2,
            r(engine_signals.QUEUE_TREND): lambda m: 0.0 if m < INCIDENT_AT else 1 / 120,
            r(engine_signals.QUEUE_WAIT_SHARE): lambda m: _ramp(m, 0.05, 0.7),
        }
    )
    return s


@dataclass(frozen=True)
class PoolScenario:
    """One incident, the causes diagnose must rank first (in order), the one that nearly
    holds, and when ``ALERTS`` says the first fired (None: no alerting rules loaded)."""

    name: str
    changes: Callable[[SiteConfig, PoolSeries], PoolSeries]
    order: tuple[str, ...]
    nearly: tuple[str, ...] = ()
    firing_at: float | None = None


SCENARIOS = {
    s.name: s
    for s in (
        PoolScenario(
            "kv-transfer-slow",
            _kv_transfer_slow,
            ("InferenceKVTransferBound",),
            nearly=("InferenceKVTransferFailing",),
            firing_at=FIRING_AT,
        ),
        PoolScenario(
            "decode-pool-short",
            _decode_pool_short,
            (
                "InferenceDecodePoolShort",
                "InferenceQueueWaitDominatesLatency",
                "InferenceQueueWaitDominatesLatency",
            ),
        ),
    )
}


def _labels(values: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in values.items()) + "}"


def _samples(name: str, labels: dict[str, str], value_at: Value) -> list[str]:
    out = []
    for i in range(MINUTES * 60 // SCRAPE_S + 1):
        value = value_at(i * SCRAPE_S / 60)
        if value is not None:
            out.append(f"{name}{_labels(labels)} {value!r} {START + i * SCRAPE_S}")
    return out


def openmetrics(cfg: SiteConfig, scenario: PoolScenario) -> str:
    series = scenario.changes(cfg, _common(cfg))
    pool = {**POOL, "model": MODEL}
    lines: list[str] = []
    for name, value_at in series.pool.items():
        lines += _samples(name, pool, value_at)
    for (name, role), value_at in series.by_role.items():
        lines += _samples(name, {**pool, "role": role}, value_at)
    for pod, (role, instance) in PODS.items():
        target = {"namespace": POOL["namespace"], "pod": pod, "instance": instance}
        target["job"] = POOL["job"]
        values = {**series.per_pod, **(series.per_decode_pod if role == "decode" else {})}
        for name, value_at in values.items():
            lines += _samples(name, target, value_at)
    if scenario.firing_at is not None:
        firing = {
            "alertname": scenario.order[0],
            "alertstate": "firing",
            **pool,
            "severity": "warning",
            "signature": "pool",
        }
        lines += _samples(
            "ALERTS", firing, lambda m: 1.0 if m >= (scenario.firing_at or 0) else None
        )
    lines.sort(key=lambda line: (line.rsplit(" ", 2)[0], int(line.rsplit(" ", 1)[1])))
    return "\n".join([*lines, "# EOF"]) + "\n"


def serve(cfg: SiteConfig, tmp: Path, scenario: PoolScenario) -> Recorded:
    """A real Prometheus over a backfilled pool incident."""
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
