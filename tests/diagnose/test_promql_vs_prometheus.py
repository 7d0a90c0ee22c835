"""``diagnose --target``'s PromQL evaluator against a real Prometheus, on the same samples.

Every recording rule, every alert expression, every sub-expression of both and every evidence
query of the pack, for each profile ``diagnose --target`` evaluates (those whose source is the
sidecar: ``sidecar`` and ``fast``), plus the rest of the evaluator's subset (:data:`EXTRA`),
is evaluated twice for each of the series sets in :data:`SETS` (counter resets, missing and
appearing series, stale series, gaps, histograms, NaN, infinities, zero divisions, several
targets and GPUs, irregular scrape intervals): by :mod:`exporter.diagnose.promql_eval`, fed the
way ``diagnose`` feeds it, and by Prometheus over TSDB blocks that ``promtool tsdb
create-blocks-from openmetrics`` wrote from the same pages. Both must give the same label
sets with values equal to 1e-9 relative (NaN equals NaN), or both refuse the expression.

How the two are made to look at the same samples:

* **Pages.** Each set describes, per target and per scrape, the sidecar's ``/metrics`` page
  (built with the metric catalogue's own family builders). The evaluator gets each page as
  ``diagnose`` does: the text through :func:`exporter.diagnose.datasources.scrape_samples`, one
  :class:`Scrape` per page, :func:`exporter.diagnose.datasources.target_evaluator` computing the
  recording rules. Prometheus gets every sample of the same text, with the labels a scrape
  attaches (``instance``, ``job``; ``namespace`` and ``pod`` for Kubernetes targets) and an
  ``up`` series of 1, timestamped with the scrape's time in whole milliseconds.
* **Windows.** ``diagnose`` evaluates every window over the sampling span. Each set's pack is
  generated with a site config whose windows all equal the set's span, and everything is
  evaluated at the last scrape ``T``: Prometheus 2.x's range ``[T - span, T]`` (both ends
  included) then holds exactly the samples the evaluator holds. The baseline window keeps the
  profile's default, which samples cannot reach: the evaluator must refuse what reads it.
* **Staleness.** A real scrape writes a staleness marker when a series disappears, so an
  instant query no longer sees it. Backfilled blocks cannot carry markers (OpenMetrics text
  cannot write their NaN bit pattern), so Prometheus runs with ``--query.lookback-delta=1s``,
  shorter than every scrape interval here: an instant selector at a scrape time sees exactly
  the series of that scrape, as with markers, and as the evaluator (which reads the last
  scrape) does.
* **Targets.** The evaluator sees one target at a time and no target labels; Prometheus's
  answer for a target is its samples carrying that target's labels, those labels removed.
* **Recording rules.** Prometheus evaluates recording rules only in real time, so the
  comparison runs in two phases. Phase 1 queries each rule's expression at ``T`` over the raw
  samples (a record used by another rule inlined as its parenthesised expression, which is
  what the record's sample at ``T`` holds) and writes the answers back as series at ``T``.
  Phase 2 starts Prometheus over raw samples and records and queries everything else: the
  alerts read Prometheus's own records, the evaluator's alerts its own.

No tolerance beyond the relative 1e-9 is needed: both evaluate Prometheus 2.x's arithmetic
(extrapolated ``rate``/``increase``, Kahan-summed ``avg_over_time`` and ``deriv``) over the
same millisecond timestamps; what is left is the order of floating-point additions.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import math
import random
import re
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString
from support.promstack import backfill as promtool_backfill

from exporter.config import format_duration
from exporter.diagnose.datasources import TargetBackend, scrape_samples, target_evaluator
from exporter.diagnose.evaluate import instances
from exporter.diagnose.promql_eval import (
    NAME,
    Evaluator,
    Labels,
    NeedsHistoryError,
    Sample,
    Scrape,
)
from exporter.diagnose.promql_syntax import (
    Node,
    Num,
    Paren,
    PromQLError,
    Range,
    Str,
    parse,
    source,
)
from exporter.lab.processes import start_prometheus
from exporter.metrics import (
    BY_NAME,
    CLOCK_EVENT_BITS,
    THROTTLE_REASONS,
    TOKENIZER_BUCKETS,
    UTILIZATION_BUCKETS,
)
from exporter.metrics import counter as counter_family
from exporter.metrics import gauge as gauge_family
from exporter.metrics import histogram as histogram_family
from exporter.signatures import all_signatures, parse_config, recording_rules
from exporter.signatures.promql_text import matchers
from exporter.signatures.signals.signal_groups import POOL_GROUP
from exporter.signatures.site import SiteConfig

REL = 1e-9
# 2024-01-01T00:00:00Z; sets lie two hours apart, so no window or offset reaches another set.
EPOCH_MS = 1_704_067_200_000
SET_SPACING_MS = 2 * 3600 * 1000
LOOKBACK_MS = 1000  # Prometheus' lookback, shorter than every scrape interval of every set
JOB = "inference-bottleneck-exporter"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_DIRECTORY = "meta-llama__Llama-3.1-8B-Instruct"
UUIDS = (
    "GPU-5f1c6a2e-0d4b-4c1e-9a51-1c0f3e2b7d10",
    "GPU-8b2e4d71-3a9c-4f62-b8e0-2d5a6c9f0e21",
    "GPU-c3d9f0a4-7e15-4b28-a6c3-9f8e7d6c5b32",
    "GPU-e4a1b2c3-d4e5-4f60-8a7b-6c5d4e3f2a43",
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TARGET_LABELS = ("namespace", "pod", "instance", "job")

Hist = tuple[list[tuple[float, float]], float]  # (upper bound, cumulative count) and sum
PageValues = dict[str, dict[tuple[str, ...], float | Hist]]


# --- what a sidecar shows ---------------------------------------------------------------------


def hist(bounds: tuple[float, ...], observations: list[tuple[float, float]]) -> Hist:
    """Cumulative bucket counts and sum of ``(value, count)`` observations."""
    buckets = [(b, sum(n for v, n in observations if v <= b)) for b in bounds]
    total = sum(n for _, n in observations)
    return [*buckets, (math.inf, total)], sum(v * n for v, n in observations)


@dataclass(frozen=True)
class Xid:
    gpu: int
    xid: str
    counts: Callable[[int], float | None]  # scrape index -> counter value (None: absent)


@dataclass(frozen=True)
class Sidecar:
    """The numbers one sidecar's page shows, as functions of the scrape index ``k`` and the
    time ``t`` (seconds since the set's first scrape). Counters run at the given rates and
    restart from 0 when the sidecar (``restart_at``) or the engine restarts before scrape k."""

    gpus: int = 2
    util: tuple[float, ...] = (0.55, 0.65)
    dram: tuple[float, ...] = (0.3, 0.35)
    idle_share: float = 0.1  # utilisation samples at or below 5 %
    busy_share: float = 0.1  # utilisation samples above 90 %
    mem_used: tuple[float, ...] = (0.7, 0.75)
    temperature: float = 62.0
    sm_clock: float = 1.755e9
    clock_events: tuple[str, ...] = ()  # reasons active on GPU 0
    gpu_up: tuple[float, ...] = (1, 1, 1, 1)
    xids: tuple[Xid, ...] = ()
    nvml: bool = True
    engine: str | None = "vllm"
    engine_up: float = 1
    running: float = 4
    queue: Callable[[float], float] = lambda t: 1.0
    tokens: float = 400.0
    itl: tuple[tuple[float, float], ...] = ((0.018, 1.0),)  # (latency, share)
    tokenizer: tuple[tuple[float, float], ...] | None = ((0.004, 1.0),)
    queue_share: float = 0.1
    kv: float = 0.5
    softirq: float = 0.02
    softirq_core: float = 0.2
    thread: float = 0.5
    failing: tuple[str, ...] = ()  # collectors that fail
    poll_failures: float = 0.0  # per second
    restart_at: int | None = None
    engine_restart_at: int | None = None
    uptime: float = 7200.0
    shows: Callable[[str, int], bool] = lambda part, k: True  # "gpu<i>", "engine", "cpu"
    edit: Callable[[PageValues, int, float], object] | None = None
    # roofline: the GPUs' peaks and SM activity, the model facts (None: no --model.path), the
    # engine's KV pool, its estimated read bytes (per second; None: not reported), prompt tokens
    # per request (a fifth of them cached), and the shares of a request's time in prefill and
    # decode (the queue's is queue_share; the rest is the host's)
    peak_bandwidth: float = 3.35e12
    peak_bf16: float = 9.89e14
    sm_active: tuple[float, ...] = (0.6, 0.7)
    facts: tuple[float, float, float] | None = (1.606e10, 131072.0, 1.396e10)
    kv_capacity: float | None = 400000.0
    read_bytes: float | None = None
    prompt_tokens: float = 3000.0
    cached_tokens: bool = True
    prefill_share: float = 0.1
    decode_share: float = 0.7
    # disaggregated serving: the share of a request's time reading its KV cache from a
    # prefill engine (vLLM's decode engine: inside its queue time; None: no transfers)
    transfer_share: float | None = None
    # a GPU shared by time-slicing or MPS: the engine's own share of each GPU and the other
    # tenants' processes on it (None: the sidecar cannot tell processes apart)
    engine_share: tuple[float, ...] | None = None
    other_processes: int = 0
    # the engine's processes on each GPU (read with the shares above)
    engine_processes: tuple[int, ...] = (1,)
    # how the sidecar chose its GPUs (inference_gpu_attribution_info): every GPU it sees
    attribution: str = "all-visible"
    # NVLink: each GPU's transmit and receive bytes per second as shares of its links' peak
    # (an HGX board's 18 links; None: a GPU without NVLink)
    nvlink: tuple[float, float] | None = (0.15, 0.14)
    nvlink_peak: float = 4.78116e11
    # each GPU's board power and the limit it enforces (W)
    power: float = 350.0
    power_limit: float = 700.0


def _elapsed(restart: int | None, times: list[float], k: int, uptime: float) -> float:
    """Seconds a counter has run at scrape k: since half-way between the scrapes around the
    restart, or ``uptime`` before the first scrape."""
    t = times[k]
    if restart is not None and k >= restart:
        return t - (times[restart - 1] + times[restart]) / 2
    return uptime + t


def page(s: Sidecar, times: list[float], k: int) -> PageValues:
    t = times[k]
    up = _elapsed(s.restart_at, times, k, s.uptime)
    eng = min(up, _elapsed(s.engine_restart_at, times, k, s.uptime))
    out: PageValues = defaultdict(dict)
    out["inference_exporter_build_info"][("0.1.0",)] = 1
    for collector in ("cpu", "engine", "nvml", "tokenizer"):
        out["inference_scrape_collector_success"][(collector,)] = float(collector not in s.failing)
        out["inference_scrape_collector_duration_seconds"][(collector,)] = 0.002 + 0.001 * k
    if s.shows("cpu", k):
        for mode, share in (("softirq", s.softirq), ("user", 0.3), ("idle", 0.68 - s.softirq)):
            out["inference_cpu_seconds_total"][(mode,)] = 16 * share * up
        out["inference_cpu_all_modes_seconds_total"][()] = 16 * 0.98 * up
        out["inference_cpu_softirq_hottest_core_ratio"][()] = s.softirq_core
        out["inference_engine_hottest_thread_cpu_ratio"][()] = s.thread
    out["inference_nvml_up"][()] = float(s.nvml)
    if s.nvml:  # as the nvml collector says how it chose its GPUs whenever NVML is up
        out["inference_gpu_attribution_info"][(s.attribution,)] = 1.0
    for i in range(s.gpus if s.nvml else 0):
        if not s.shows(f"gpu{i}", k):
            continue
        key = (str(i), UUIDS[i])
        out["inference_gpu_up"][key] = s.gpu_up[i % len(s.gpu_up)]
        out["inference_gpu_busy_seconds_total"][key] = s.util[i % len(s.util)] * up
        out["inference_gpu_dram_active_seconds_total"][key] = s.dram[i % len(s.dram)] * up
        samples = 10 * up
        middle = 1 - s.idle_share - s.busy_share
        out["inference_gpu_utilization_samples"][key] = hist(
            UTILIZATION_BUCKETS,
            [
                (0.0, s.idle_share * samples),
                (0.55, middle * samples),
                (1.0, s.busy_share * samples),
            ],
        )
        out["inference_gpu_memory_total_bytes"][key] = 80e9
        out["inference_gpu_memory_used_bytes"][key] = s.mem_used[i % len(s.mem_used)] * 80e9
        out["inference_gpu_temperature_celsius"][key] = s.temperature + i
        out["inference_gpu_peak_memory_bandwidth_bytes_per_second"][key] = s.peak_bandwidth
        out["inference_gpu_peak_flops"][(*key, "bf16")] = s.peak_bf16
        out["inference_gpu_peak_flops"][(*key, "fp8")] = 2 * s.peak_bf16
        out["inference_gpu_sm_active_ratio"][key] = s.sm_active[i % len(s.sm_active)]
        out["inference_gpu_sm_clock_hertz"][key] = s.sm_clock
        out["inference_gpu_power_watts"][key] = s.power + 10 * i
        out["inference_gpu_power_limit_watts"][key] = s.power_limit
        out["inference_gpu_power_default_limit_watts"][key] = 700.0
        out["inference_gpu_power_smoothing_enabled"][key] = 0.0
        # the energy counters: the board power since the start, a tenth of it idle
        out["inference_gpu_energy_joules_total"][key] = (s.power + 10 * i) * up
        out["inference_gpu_idle_energy_joules_total"][key] = 0.1 * s.power * up
        if s.nvlink is not None:
            transmit, receive = s.nvlink
            out["inference_gpu_nvlink_transmit_bytes_total"][key] = transmit * s.nvlink_peak * up
            out["inference_gpu_nvlink_receive_bytes_total"][key] = receive * s.nvlink_peak * up
            out["inference_gpu_nvlink_peak_bytes_per_second"][key] = s.nvlink_peak
        if s.engine_share is not None:
            out["inference_gpu_engine_utilization_ratio"][key] = s.engine_share[
                i % len(s.engine_share)
            ]
            engine_processes = s.engine_processes[i % len(s.engine_processes)]
            out["inference_gpu_processes"][(*key, "engine")] = float(engine_processes)
            out["inference_gpu_processes"][(*key, "other")] = float(s.other_processes)
        mask = 0
        for reason in ("hw_slowdown", "sw_thermal", "sw_power_cap"):
            active = float(i == 0 and reason in s.clock_events)
            out["inference_gpu_clock_event_active"][(*key, reason)] = active
            if active and reason in THROTTLE_REASONS:
                mask |= CLOCK_EVENT_BITS[reason]
        out["inference_gpu_clock_throttle_reasons"][key] = float(mask)
    for x in s.xids:
        count = x.counts(k)
        if count is not None and s.shows(f"gpu{x.gpu}", k):
            out["inference_gpu_xid_errors_total"][(str(x.gpu), UUIDS[x.gpu], x.xid)] = count
    if s.engine is not None and s.shows("engine", k):
        e = s.engine
        out["inference_engine_up"][(e,)] = s.engine_up
        out["inference_engine_poll_failures_total"][(e, "timeout")] = s.poll_failures * up
        if s.engine_up:
            m = (e, MODEL)
            out["inference_queue_depth"][m] = s.queue(t)
            out["inference_requests_running"][m] = s.running
            out["inference_kv_cache_usage_ratio"][m] = s.kv
            tokens = s.tokens * eng
            out["inference_generation_tokens_total"][m] = tokens
            out["inference_inter_token_latency_seconds"][m] = hist(
                ITL_BUCKETS, [(v, share * tokens) for v, share in s.itl]
            )
            requests = 2 * eng
            e2e = 4.0
            out["inference_e2e_request_latency_seconds"][m] = hist(
                REQUEST_BUCKETS, [(e2e, requests)]
            )
            out["inference_queue_time_seconds"][m] = hist(
                REQUEST_BUCKETS, [(e2e * s.queue_share, requests)]
            )
            out["inference_prefill_time_seconds"][m] = hist(
                REQUEST_BUCKETS, [(e2e * s.prefill_share, requests)]
            )
            out["inference_decode_time_seconds"][m] = hist(
                REQUEST_BUCKETS, [(e2e * s.decode_share, requests)]
            )
            if s.transfer_share is not None:
                out["inference_kv_transfer_seconds"][m] = hist(
                    REQUEST_BUCKETS, [(e2e * s.transfer_share, requests)]
                )
            out["inference_prompt_tokens_total"][m] = s.prompt_tokens * requests
            if s.cached_tokens:
                out["inference_prompt_tokens_cached_total"][m] = s.prompt_tokens * requests / 5
            if s.kv_capacity is not None:
                out["inference_kv_cache_capacity_tokens"][m] = s.kv_capacity
            if s.read_bytes is not None:
                out["inference_estimated_read_bytes_total"][m] = s.read_bytes * eng
        if s.tokenizer is not None:
            probes = up
            out["inference_tokenizer_latency_seconds"][(e, "probe")] = hist(
                TOKENIZER_BUCKETS, [(v, share * probes) for v, share in s.tokenizer]
            )
    if s.facts is not None:
        # The model collector reports without an engine too: under engine "unknown" and the
        # model directory's name.
        owner = (s.engine, MODEL) if s.engine is not None else ("unknown", MODEL_DIRECTORY)
        weights, per_token, flops = s.facts
        out["inference_model_weight_bytes"][owner] = weights
        out["inference_model_kv_cache_bytes_per_token"][owner] = per_token
        out["inference_model_flops_per_token"][owner] = flops
    if s.edit is not None:
        s.edit(out, k, t)
    return out


class _Page:
    def __init__(self, values: PageValues) -> None:
        self.values = values

    def collect(self) -> Iterator[Metric]:
        for name, series in self.values.items():
            kind = BY_NAME[name].type
            if kind == "gauge":
                family: Metric = gauge_family(name)
            elif kind == "counter":
                family = counter_family(name)
            else:
                family = histogram_family(name)
            for labels, value in series.items():
                if isinstance(value, tuple):
                    buckets, total = value
                    family.add_metric(  # type: ignore[attr-defined]
                        list(labels),
                        buckets=[(floatToGoString(b), c) for b, c in buckets],
                        sum_value=total,
                    )
                else:
                    family.add_metric(list(labels), value)  # type: ignore[attr-defined]
            yield family


def exposition(values: PageValues) -> str:
    """The page as the sidecar's text exposition."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Page(values))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


# --- series sets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    labels: dict[str, str]
    sidecar: Sidecar


@dataclass(frozen=True)
class SeriesSet:
    name: str
    profile: str
    times_ms: tuple[int, ...]  # scrape times, milliseconds after the set's start
    targets: tuple[Target, ...]
    site: dict[str, Any] = field(default_factory=dict)

    @property
    def span(self) -> float:
        return (self.times_ms[-1] - self.times_ms[0]) / 1000


def every(interval: float, count: int, jitter: float = 0.0, seed: int = 0) -> tuple[int, ...]:
    """``count`` scrape times ``interval`` seconds apart, each moved by up to ``jitter``."""
    rng = random.Random(seed)
    return tuple(
        round(1000 * (i * interval + (rng.uniform(0, jitter) if 0 < i < count - 1 else 0)))
        for i in range(count)
    )


def plain(n: int = 1, **labels: str) -> dict[str, str]:
    return {"instance": f"10.0.0.{n}:10960", "job": JOB, **labels}


def pod(n: int, namespace: str = "llm") -> dict[str, str]:
    return {
        "instance": f"10.1.0.{n}:10960",
        "job": f"{namespace}/{JOB}",
        "namespace": namespace,
        "pod": f"vllm-{n}",
    }


def one(name: str, profile: str, times: tuple[int, ...], sidecar: Sidecar, **kw: Any) -> SeriesSet:
    return SeriesSet(name, profile, times, (Target(plain(), sidecar),), **kw)


def _nan(name: str, at: Callable[[int], bool]) -> Callable[[PageValues, int, float], None]:
    def edit(values: PageValues, k: int, t: float) -> None:
        if at(k):
            for labels, value in values[name].items():
                if isinstance(value, tuple):
                    buckets, total = value
                    broken = [(b, math.nan if b == 0.025 else c) for b, c in buckets]
                    values[name][labels] = (broken, total)
                else:
                    values[name][labels] = math.nan

    return edit


Edit = Callable[[PageValues, int, float], object]


def edits(*each: Edit) -> Edit:
    def edit(values: PageValues, k: int, t: float) -> None:
        for one_edit in each:
            one_edit(values, k, t)

    return edit


def _xid_from(first: int, *steps: tuple[int, float]) -> Callable[[int], float | None]:
    def count(k: int) -> float | None:
        if k < first:
            return None
        value = 0.0
        for at, n in steps:
            if k >= at:
                value = n
        return value

    return count


def _refused(per_second: float) -> Edit:
    """vLLM refusing ``per_second`` requests at admission (its queue limit)."""

    def edit(values: PageValues, k: int, t: float) -> None:
        key = ("vllm", MODEL, "engine", "queue_full")
        values["inference_requests_rejected_total"][key] = per_second * (7200.0 + t)

    return edit


def _gateway(values: PageValues, k: int, t: float) -> None:
    """The sidecar of llm-d's endpoint picker: its queue grows, three endpoints' metrics are
    stale, it dispatches 20 requests a second and refuses 2 for capacity."""
    qwen = "Qwen/Qwen3-0.6B"
    values["inference_engine_info"][("llmd-epp", "", qwen, "both")] = 1.0
    for priority, depth in (("0", 30 + 0.2 * t), ("-10", 5.0)):
        values["inference_gateway_queue_depth"][("llmd-epp", qwen, "qwen-pool", priority)] = depth
    values["inference_gateway_stale_endpoints"][("llmd-epp", qwen)] = 3.0
    for outcome, rate in (("dispatched", 20.0), ("rejected_capacity", 2.0), ("evicted_ttl", 0.5)):
        key = ("llmd-epp", qwen, "qwen-pool", outcome)
        values["inference_gateway_requests_total"][key] = rate * (7200.0 + t)
    key = ("llmd-epp", qwen, "gateway", "capacity")
    values["inference_requests_rejected_total"][key] = 2.0 * (7200.0 + t)


def _without_nvml_collector(values: PageValues, k: int, t: float) -> None:
    """A sidecar whose nvml collector is off: no NVML series at all."""
    values.pop("inference_nvml_up", None)
    values.pop("inference_gpu_attribution_info", None)


STEADY = Sidecar()
STARVED = Sidecar(util=(0.35, 0.45), queue=lambda t: 2 + 0.05 * t)

SETS: tuple[SeriesSet, ...] = (
    one("steady", "sidecar", every(5, 13), STEADY),
    one("steady-fast-profile", "fast", every(2, 16), STEADY),
    one("starved-queue-growing", "sidecar", every(5, 13), STARVED),
    # time-sliced GPUs: busy (80 %, 85 %), the engine's own share 5 % and 40 %, two other
    # tenants' processes, the queue growing: starved on its own share, a noisy neighbour
    one(
        "shared-gpu-noisy-neighbour",
        "sidecar",
        every(5, 13),
        replace(STARVED, util=(0.8, 0.85), engine_share=(0.05, 0.4), other_processes=2),
    ),
    one("sidecar-restart-resets-counters", "sidecar", every(5, 13), replace(STARVED, restart_at=6)),
    one(
        "engine-restart-resets-its-counters",
        "fast",
        every(3, 12),
        replace(STEADY, engine_restart_at=4, poll_failures=0.5),
    ),
    one("two-scrapes", "sidecar", every(10, 2), STARVED),
    one(
        "irregular-intervals",
        "sidecar",
        every(5, 13, jitter=1.7, seed=7),
        replace(STEADY, queue=lambda t: 3 - 0.01 * t * t),
    ),
    # disaggregated decode engines (vLLM): the queue time holds the KV transfer (10.0.0.1), or
    # the transfer is longer than the queue time (10.0.0.2: an engine whose queue clock starts
    # after it)
    SeriesSet(
        "disaggregated-decode",
        "sidecar",
        every(5, 13),
        (
            Target(plain(1), replace(STEADY, queue_share=0.12, transfer_share=0.08)),
            Target(plain(2), replace(STEADY, queue_share=0.02, transfer_share=0.05)),
        ),
    ),
    # no engine: with per-process reads, none of its processes on the GPUs and no share
    one(
        "no-engine",
        "sidecar",
        every(5, 10),
        replace(
            STEADY, engine=None, failing=("engine",), engine_share=(0.0,), engine_processes=(0,)
        ),
    ),
    # every GPU of the node visible (all-visible); GPU 1 runs another pod's process and none
    # of the engine's: it is not the engine's
    one(
        "all-visible-foreign-gpu",
        "sidecar",
        every(5, 13),
        replace(STEADY, engine_share=(0.6, 0.0), engine_processes=(1, 0), other_processes=1),
    ),
    one(
        "engine-down",
        "fast",
        every(2, 10),
        replace(STEADY, engine="sglang", engine_up=0, poll_failures=1.0, failing=("engine",)),
    ),
    one("nvml-down", "sidecar", every(5, 10), replace(STEADY, nvml=False, failing=("nvml",))),
    one(
        "gpu-appears-mid-window",
        "sidecar",
        every(5, 13),
        replace(STEADY, gpus=3, util=(0.5, 0.6, 0.9), shows=lambda p, k: p != "gpu2" or k >= 5),
    ),
    one(
        "gpu-vanishes-stale",
        "sidecar",
        every(4, 14),
        replace(STEADY, shows=lambda p, k: p != "gpu1" or k <= 9),
    ),
    one(
        "engine-gap-mid-window",
        "fast",
        every(3, 14),
        replace(STARVED, shows=lambda p, k: p != "engine" or not 4 <= k <= 7),
    ),
    one(
        "nan-gauges",
        "sidecar",
        every(5, 12),
        replace(
            STEADY,
            edit=edits(
                _nan("inference_kv_cache_usage_ratio", lambda k: True),
                _nan("inference_engine_hottest_thread_cpu_ratio", lambda k: k == 3),
                _nan("inference_gpu_temperature_celsius", lambda k: k == 11),
            ),
        ),
    ),
    one(
        "nan-counter-and-bucket",
        "sidecar",
        every(5, 12),
        replace(
            STEADY,
            edit=edits(
                _nan("inference_gpu_busy_seconds_total", lambda k: k == 4),
                _nan("inference_tokenizer_latency_seconds", lambda k: k == 11),
            ),
        ),
    ),
    # a tensor-parallel pod bound by its links: NVLink at 88 % of its peak, SMs 8 % active
    one(
        "interconnect-bound",
        "sidecar",
        every(5, 13),
        replace(STEADY, util=(0.96, 0.96), sm_active=(0.08, 0.08), nvlink=(0.88, 0.85)),
    ),
    one(
        "tokenizer-slower-than-decode",
        "sidecar",
        every(5, 13),
        replace(STEADY, tokenizer=((0.03, 0.7), (0.2, 0.3)), itl=((0.02, 0.9), (0.06, 0.1))),
    ),
    one(
        "histograms-standing-still",
        "fast",
        every(2, 12),
        replace(STEADY, tokens=0.0, running=0.0, tokenizer=((5.0, 1.0),), uptime=0.0),
    ),
    one(
        "pulsing-utilization",
        "sidecar",
        every(6, 11),
        replace(STEADY, idle_share=0.45, busy_share=0.35, util=(0.5, 0.5)),
    ),
    one(
        "xid-errors-old-new-and-appearing",
        "sidecar",
        every(5, 13),
        replace(
            STEADY,
            xids=(
                Xid(0, "48", _xid_from(0, (0, 2.0))),  # standing still: not new
                Xid(0, "79", _xid_from(0, (0, 1.0), (7, 2.0))),  # increases
                Xid(1, "13", _xid_from(5, (5, 1.0))),  # appears once
                Xid(1, "31", _xid_from(3, (3, 1.0), (9, 3.0))),  # appears, then increases
            ),
        ),
    ),
    one(
        "throttled-and-hot",
        "fast",
        every(2, 10),
        replace(STEADY, clock_events=("hw_slowdown", "sw_thermal"), temperature=88, sm_clock=1.2e9),
    ),
    # a hardware slowdown while GPU 0 draws 697 W of its 700 W limit: the power cap
    one(
        "throttled-at-power-cap",
        "sidecar",
        every(5, 10),
        replace(STEADY, clock_events=("hw_slowdown",), power=697.0, sm_clock=1.4e9),
    ),
    one(
        "memory-headroom",
        "sidecar",
        every(5, 10),
        replace(STEADY, kv=0.95, mem_used=(0.985, 0.5)),
    ),
    one(
        "memory-full-engine-without-kv",
        "sidecar",
        every(5, 10),
        replace(
            STEADY,
            engine="triton",
            mem_used=(0.99, 0.98),
            edit=lambda v, k, t: v.pop("inference_kv_cache_usage_ratio"),
        ),
    ),
    one(
        "cpu-softirq-frontend-queue-wait",
        "fast",
        every(2, 11),
        replace(STARVED, softirq=0.08, softirq_core=0.7, thread=0.97, queue_share=0.6),
    ),
    one(
        "gpu-lost-collector-failing",
        "sidecar",
        every(5, 10),
        replace(STEADY, gpu_up=(1, 0, 1, 1), failing=("tokenizer",), tokenizer=None),
    ),
    one(
        "zero-traffic-zero-division",
        "sidecar",
        every(5, 10),
        replace(
            STEADY,
            running=0,
            tokens=0,
            queue_share=0.0,
            uptime=0.0,
            edit=lambda v, k, t: v["inference_gpu_memory_total_bytes"].update(
                {key: 0.0 for key in list(v["inference_gpu_memory_total_bytes"])}
            ),
        ),
    ),
    SeriesSet(
        "three-pods-different-gpus",
        "sidecar",
        every(5, 13),
        (
            Target(pod(1), STARVED),
            Target(pod(2), replace(STEADY, gpus=4, util=(0.9, 0.8, 0.7, 0.2))),
            Target(pod(3), replace(STEADY, gpus=1, util=(0.1,), dram=(0.05,))),
        ),
    ),
    SeriesSet(
        "two-targets-irregular-fast",
        "fast",
        every(2, 15, jitter=0.6, seed=3),
        (
            Target(plain(1), replace(STARVED, restart_at=9)),
            Target(plain(2), replace(STEADY, shows=lambda p, k: p != "gpu0" or k >= 2)),
        ),
    ),
    one(
        "roofline-overhead-bound-sms-idle-host-heavy",
        "sidecar",
        every(5, 13),
        replace(
            STEADY,
            util=(0.95, 0.96),
            dram=(0.3, 0.3),
            sm_active=(0.2, 0.25),
            itl=((0.045, 1.0),),
            queue_share=0.02,
            prefill_share=0.04,
            decode_share=0.5,
        ),
    ),
    one(
        "roofline-engine-read-bytes-without-model-facts",
        "fast",
        every(2, 12),
        replace(STEADY, facts=None, read_bytes=0.2 * 3.35e12, cached_tokens=False),
    ),
    one(
        "engine-stalled",
        "sidecar",
        every(5, 13),
        replace(STEADY, running=0, tokens=0.0, kv=0.01, queue=lambda t: 6 + 0.02 * t),
    ),
    one(
        "refusals-at-admission",
        "fast",
        every(2, 12),
        replace(STARVED, edit=_refused(0.4)),
    ),
    # a gateway's sidecar: its own series only (the engines of its pool are other targets)
    one(
        "gateway-queueing-on-stale-endpoints",
        "sidecar",
        every(5, 12),
        replace(STEADY, engine=None, nvml=False, tokenizer=None, facts=None, edit=_gateway),
    ),
    one(
        "engine-without-gpu-series",
        "sidecar",
        every(5, 10),
        replace(STEADY, nvml=False, edit=_without_nvml_collector),
    ),
    SeriesSet(
        "site-selectors-and-cluster-label",
        "sidecar",
        every(5, 12),
        (
            Target(plain(1, cluster="prod"), STARVED),
            Target(plain(2, cluster="prod"), replace(STEADY, kv=0.93)),
        ),
        site={"selectors": {"sidecar": 'cluster="prod"'}},
    ),
)


def site_config(s: SeriesSet) -> SiteConfig:
    """The pack for this set: every window (but the baseline) is the sampling span."""
    scale = parse_config({}, s.profile).profile.time_scale
    span = format_duration(s.span / scale)
    windows = {name: span for name in ("rate", "latency", "queue_trend", "pulsing", "xid")}
    return parse_config({**s.site, "windows": windows}, s.profile)


# --- what each side is asked ------------------------------------------------------------------


def _children(node: Node) -> list[Node]:
    return [v for v in vars(node).values() if isinstance(v, Node)] + [
        n for v in vars(node).values() if isinstance(v, tuple) for n in v if isinstance(n, Node)
    ]


def subexpressions(text: str) -> list[str]:
    """``text`` and each of its sub-expressions that evaluates to an instant vector or scalar."""
    out: list[str] = []

    def walk(node: Node) -> None:
        if not isinstance(node, Num | Str | Range | Paren):
            out.append(source(text, node))
        for child in _children(node):
            walk(child)

    walk(parse(text))
    return out


# The rest of what the evaluator supports, which the pack does not use (yet): functions,
# NaN and infinities through operators, vector matching modifiers. ``W`` is the window.
EXTRA = (
    "max_over_time(inference_gpu_temperature_celsius[W])",
    "changes(inference_queue_depth[W])",
    "avg_over_time(inference_kv_cache_usage_ratio[W])",
    "clamp(inference_kv_cache_usage_ratio, 0.2, 0.45)",
    "clamp(inference_kv_cache_usage_ratio, 1, 0)",
    "clamp_max(inference_kv_cache_usage_ratio, 0.4)",
    "floor(inference_queue_depth) + ceil(inference_queue_depth) - abs(-inference_queue_depth)",
    "inference_gpu_memory_used_bytes / ignoring (uuid) inference_gpu_memory_total_bytes",
    "inference_gpu_busy_seconds_total > on (instance, gpu) inference_gpu_dram_active_seconds_total",
    "inference_gpu_memory_used_bytes > bool on (instance, gpu) 0.9 * inference_gpu_memory_total_bytes",
    "inference_gpu_temperature_celsius * on (instance) group_left () inference_nvml_up",
    "inference_nvml_up * on (instance) group_right (version) inference_exporter_build_info",
    "1 > 0",
    'label_replace(inference_gpu_up, "card", "gpu-$1", "gpu", "(.*)")',
    'absent(inference_engine_up{engine="tgi"})',
    "(-inference_queue_depth) ^ 0.5 + inference_queue_depth % 3",
    "inference_gpu_up / 0",
    "inference_nvml_up * 10 ^ 400",
    "0.5 < inference_gpu_up",
    "count by (collector) (inference_scrape_collector_success == 0)",
    "group without (collector) (inference_scrape_collector_success)",
    "min without (mode) (rate(inference_cpu_seconds_total[W]))",
    "avg by (instance) (inference_gpu_temperature_celsius)\n- max by (instance) (inference_gpu_temperature_celsius)",
    "histogram_quantile(0.9, rate(inference_inter_token_latency_seconds_bucket[W]))",
    "histogram_quantile(0.25, inference_tokenizer_latency_seconds_bucket)",
    "histogram_quantile(2, inference_gpu_utilization_samples_bucket)",
)


def expressions(cfg: SiteConfig) -> list[str]:
    """Every recording rule (its expression and its series), every alert expression, their
    sub-expressions, and :data:`EXTRA`, once each.

    Not the pools' (records of group ``inference.records.pool``, signatures of family
    ``pool``): they aggregate the targets of a pool, which Prometheus sees together and the
    evaluator, one target at a time, cannot (``diagnose`` on a sidecar reads a pool of one)."""
    texts: list[str] = []
    for rule in recording_rules(cfg):
        if rule.group == POOL_GROUP:
            continue
        texts += [rule.record, *subexpressions(rule.expr)]
    for sig in all_signatures(cfg):
        if sig.family == "pool":
            continue
        for alert in sig.rules:
            texts += subexpressions(alert.expr)
    window = format_duration(cfg.window_seconds("rate"))
    texts += [text.replace("[W]", f"[{window}]") for text in EXTRA]
    return list(dict.fromkeys(texts))


def evidence_queries(
    cfg: SiteConfig, evaluator: Evaluator, target: Target
) -> list[tuple[str, str]]:
    """Each evidence query ``diagnose`` would send for each instance of each alert rule (all
    instances, not only those that hold): for Prometheus with the target's labels, for the
    evaluator with the instance's (which have none of them)."""
    out = []
    for sig in all_signatures(cfg):
        if sig.family == "pool":  # across targets: see expressions()
            continue
        for rule in sig.rules:
            try:
                found = asyncio.run(
                    instances(TargetBackend(evaluator), rule.expr, parse(rule.expr), 0.1)
                )
            except NeedsHistoryError:
                continue
            for inst in found:
                for item in rule.evidence:
                    if item.expr is None:
                        continue
                    scope = rule.scope if item.scope is None else item.scope
                    mine = {label: inst.get(label) for label in (*cfg.join_labels, *scope)}
                    theirs = {**mine, **{k: target.labels.get(k, "") for k in cfg.join_labels}}
                    out.append((item.query(matchers(theirs)), item.query(matchers(mine))))
    return list(dict.fromkeys(out))


def inlined(expr: str, records: dict[str, str]) -> str:
    """``expr`` with each record it reads replaced by that record's parenthesised expression."""
    while True:
        before = expr
        for name, body in records.items():
            pattern = re.compile(rf"(?<![\w:]){re.escape(name)}(?![\w:])")
            for match in pattern.finditer(expr):
                following = expr[match.end() :].lstrip()
                assert not following.startswith(("{", "[", "offset")), (name, expr)
            expr = pattern.sub(f"({body})".replace("\\", "\\\\"), expr)
        if expr == before:
            return expr


# --- Prometheus over backfilled blocks --------------------------------------------------------


def om_timestamp(ms: int) -> str:
    """Seconds as OpenMetrics text that Prometheus reads back as ``ms`` (it truncates)."""
    text = f"{ms // 1000}.{ms % 1000:03d}"
    if int(float(text) * 1000) != ms:
        text = repr(math.nextafter(float(text), math.inf))
    assert int(float(text) * 1000) == ms
    return text


def om_value(value: float) -> str:
    return floatToGoString(value)


def om_labels(labels: Labels) -> str:
    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{escaped(v)}"' for k, v in labels if k != NAME)
    return f"{{{body}}}"


Series = dict[Labels, list[tuple[int, float]]]


def write_openmetrics(series: Series, path: Path) -> None:
    lines = []
    for labels in sorted(series):
        name = dict(labels)[NAME]
        for ms, value in sorted(series[labels]):
            lines.append(f"{name}{om_labels(labels)} {om_value(value)} {om_timestamp(ms)}")
    path.write_text("\n".join([*lines, "# EOF"]) + "\n")


def backfill(series: Series, tmp: Path, name: str) -> Path:
    data = tmp / name
    source_file = tmp / f"{name}.om"
    write_openmetrics(series, source_file)
    promtool_backfill(source_file, data, timeout=60)
    return data


class Prometheus:
    """A Prometheus over ``data`` on loopback, asked instant queries on one connection."""

    def __init__(self, data: Path, tmp: Path) -> None:
        self.server = start_prometheus(
            tmp,
            "global: {}\n",
            name=data.name,
            data=data,
            args=(
                "--storage.tsdb.retention.time=100y",
                # Stands in for staleness markers (see the module docstring).
                f"--query.lookback-delta={LOOKBACK_MS}ms",
                "--log.level=warn",
            ),
            timeout=30,
        )
        port = urllib.parse.urlsplit(self.server.url).port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def query(self, expr: str, at_ms: int) -> list[Sample] | float | str:
        """A vector, a scalar, or the error Prometheus answered."""
        params = urllib.parse.urlencode(
            {"query": expr, "time": f"{at_ms // 1000}.{at_ms % 1000:03d}"}
        )
        self.conn.request(
            "POST",
            "/api/v1/query",
            body=params,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        answer = json.loads(self.conn.getresponse().read())
        if answer["status"] != "success":
            return str(answer.get("error"))
        data = answer["data"]
        if data["resultType"] == "scalar":
            return float(data["result"][1])
        assert data["resultType"] == "vector", data
        return [
            Sample(tuple(sorted(item["metric"].items())), float(item["value"][1]))
            for item in data["result"]
        ]

    def stop(self) -> None:
        self.conn.close()
        self.server.stop()


# --- both sides over every set ----------------------------------------------------------------


@dataclass
class Prepared:
    """One set: its pack, its targets' scrapes and evaluators, its evaluation time."""

    series_set: SeriesSet
    start_ms: int
    cfg: SiteConfig
    scrapes: list[list[Scrape]]  # per target
    evaluators: list[Evaluator]

    @property
    def at_ms(self) -> int:
        return self.start_ms + self.series_set.times_ms[-1]


def prepare(index: int, s: SeriesSet, raw: Series) -> Prepared:
    start_ms = EPOCH_MS + index * SET_SPACING_MS
    assert all(b - a > LOOKBACK_MS for a, b in itertools.pairwise(s.times_ms)), s.name
    cfg = site_config(s)
    times = [(ms - s.times_ms[0]) / 1000 for ms in s.times_ms]
    all_scrapes = []
    for target in s.targets:
        scrapes = []
        for k, ms in enumerate(s.times_ms):
            text = exposition(page(target.sidecar, times, k))
            at_ms = start_ms + ms
            scrapes.append(Scrape(at_ms / 1000, scrape_samples(text)))
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    labels = {**sample.labels, **target.labels, NAME: sample.name}
                    raw[tuple(sorted(labels.items()))].append((at_ms, float(sample.value)))
            up = {**target.labels, NAME: "up"}
            raw[tuple(sorted(up.items()))].append((at_ms, 1.0))
        all_scrapes.append(scrapes)
    evaluators = [target_evaluator(scrapes, cfg) for scrapes in all_scrapes]
    return Prepared(s, start_ms, cfg, all_scrapes, evaluators)


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Prometheus, list[Prepared]]]:
    tmp = tmp_path_factory.mktemp("promql-vs-prometheus")
    raw: Series = defaultdict(list)
    prepared = [prepare(i, s, raw) for i, s in enumerate(SETS)]
    first = Prometheus(backfill(raw, tmp, "raw"), tmp)
    records: Series = defaultdict(list)
    try:
        for p in prepared:
            rules = recording_rules(p.cfg)
            bodies = {r.record: r.expr for r in rules}
            for rule in rules:
                answer = first.query(inlined(rule.expr, bodies), p.at_ms)
                assert isinstance(answer, list), (rule.record, answer)
                for sample in answer:
                    labels = tuple(sorted((*sample.without_name(), (NAME, rule.record))))
                    records[labels].append((p.at_ms, sample.value))
    finally:
        first.stop()
    both: Series = defaultdict(list, {**raw, **records})
    second = Prometheus(backfill(both, tmp, "raw-and-records"), tmp)
    try:
        yield second, prepared
    finally:
        second.stop()


def for_target(answer: list[Sample], target: Target) -> dict[Labels, float]:
    """Prometheus's samples of one target, without the labels the scrape attached (a sample
    without any such label belongs to every target)."""
    out: dict[Labels, float] = {}
    for s in answer:
        attached = {k: v for k, v in s.labels if k in TARGET_LABELS or k in target.labels}
        if all(target.labels.get(k) == v for k, v in attached.items()):
            key = tuple(item for item in s.labels if item[0] not in attached)
            assert key not in out, (key, answer)
            out[key] = s.value
    return out


def same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=REL, abs_tol=0.0)


def differences(want: dict[Labels, float] | float, got: dict[Labels, float] | float) -> str:
    if isinstance(want, float) or isinstance(got, float):
        if isinstance(want, float) and isinstance(got, float) and same(want, got):
            return ""
        return f"Prometheus {want!r}, evaluator {got!r}"
    if set(want) != set(got):
        return f"label sets: Prometheus {sorted(want)}, evaluator {sorted(got)}"
    bad = {k: (want[k], got[k]) for k in want if not same(want[k], got[k])}
    return f"values (Prometheus, evaluator): {bad}" if bad else ""


Answer = list[Sample] | float | str


def evaluated(evaluator: Evaluator, text: str) -> dict[Labels, float] | float:
    value = evaluator.eval(parse(text))
    if isinstance(value, float):
        return value
    out = {}
    for s in value:
        assert s.labels not in out, (text, value)
        out[s.labels] = s.value
    return out


# Sub-expressions that read the baseline window, which samples cannot reach.
def needs_history(text: str, cfg: SiteConfig) -> bool:
    return f"offset {format_duration(cfg.window_seconds('baseline'))}" in text


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", [s.name for s in SETS])
def test_evaluator_equals_prometheus(
    name: str, prometheus: tuple[Prometheus, list[Prepared]]
) -> None:
    server, prepared = prometheus
    p = next(p for p in prepared if p.series_set.name == name)
    problems: list[str] = []
    compared = nonempty = 0

    def check(target: Target, evaluator: Evaluator, ours: str, answer: Answer) -> None:
        nonlocal compared, nonempty
        where = f"{target.labels['instance']}: {ours}"
        try:
            got = evaluated(evaluator, ours)
        except PromQLError as err:
            if not isinstance(answer, str):
                problems.append(f"{where}: evaluator refused ({err}), Prometheus did not")
            return
        except NeedsHistoryError:
            if not needs_history(ours, p.cfg):
                problems.append(f"{where}: refused")
            return
        except Exception as err:  # a crash is one more difference to list
            problems.append(f"{where}: evaluator raised {err!r}")
            return
        if needs_history(ours, p.cfg):
            problems.append(f"{where}: not refused")
            return
        if isinstance(answer, str):
            problems.append(f"{where}: Prometheus refused ({answer}), evaluator {got}")
            return
        want = answer if isinstance(answer, float) else for_target(answer, target)
        compared += 1
        nonempty += bool(want)
        diff = differences(want, got)
        if diff:
            problems.append(f"{where}\n    {diff}")

    pairs = list(zip(p.series_set.targets, p.evaluators, strict=True))
    for text in expressions(p.cfg):
        answer = server.query(text, p.at_ms)
        for target, evaluator in pairs:
            check(target, evaluator, text, answer)
    for target, evaluator in pairs:
        for theirs, ours in evidence_queries(p.cfg, evaluator, target):
            check(target, evaluator, ours, server.query(theirs, p.at_ms))
    assert problems == [], "\n".join(problems)
    # Without an engine (or with its metrics down) every engine record is empty (more than half
    # the pack's expressions).
    engineless = all(
        t.sidecar.engine is None or not t.sidecar.engine_up for t in p.series_set.targets
    )
    # A gateway's sidecar reads neither an engine's series nor a GPU: its own records only (the
    # GPU, link, power and energy records are empty there: about one expression in seven has
    # data).
    gateway = all(t.sidecar.engine is None and not t.sidecar.nvml for t in p.series_set.targets)
    share = 8 if gateway else 4 if engineless else 3
    assert compared > 150 and nonempty > compared / share, (compared, nonempty)


# The records and the alert that join a gateway's target to its pool's engine targets.
ACROSS_TARGETS = (
    "record inference_gateway:pool_engines:count",
    "record inference:gateway_queue_depth_share:sum",
    "record inference:gateway_queue_depth_share:derivW",
    "record inference_gateway:pool_gpu_utilization:meanW",
    "alert InferenceGatewayStaleEndpoints 0",
)


def test_every_rule_and_alert_returns_data_in_some_set(
    prometheus: tuple[Prometheus, list[Prepared]],
) -> None:
    """The sets are not vacuous: every recording rule and every alert expression returns
    something in at least one set (both sides agree on every set, so the evaluator's results
    stand for Prometheus's). Except: the HBM signature and the latency arm of the contended-GPU
    signature read an hour-old baseline, refused everywhere; a target ``diagnose`` samples is up (``up`` is 1 here), so ``InferenceExporterDown``
    never holds, in Prometheus either (every set's targets are up); and what joins a gateway
    to the engines of its pool (:data:`ACROSS_TARGETS`) needs both, which the evaluator, one
    target at a time, never sees together (the promtool tests and the vmalert replay prove
    them: ``tests/promtool/sidecar/gateway.yaml``)."""
    _, prepared = prometheus
    outcomes: dict[str, set[str]] = defaultdict(set)
    for p in prepared:
        # The same rule in every set (in the same place), whatever its windows are called.
        # Not the pools': no set holds a disaggregated pool (tests/promtool/sidecar/pools.yaml
        # and the vmalert replay prove them).
        texts = {
            f"record {r.record}": r.expr for r in recording_rules(p.cfg) if r.group != POOL_GROUP
        }
        texts |= {
            f"alert {sig.alert} {i}": a.expr
            for sig in all_signatures(p.cfg)
            if sig.family != "pool"
            for i, a in enumerate(sig.rules)
        }
        for name, text in texts.items():
            key = re.sub(r"(?<!\d)(?:\d+(?:ms|[smhdwy]))+(?!\w)", "W", name)
            for evaluator in p.evaluators:
                try:
                    value = evaluator.eval(parse(text))
                except NeedsHistoryError:
                    outcomes[key].add("refused")
                    continue
                outcomes[key].add("data" if value else "empty")
    without_data = [shape for shape, seen in outcomes.items() if "data" not in seen]
    assert len(outcomes) == len(texts), sorted(outcomes)
    assert sorted(without_data) == sorted(
        [
            "alert InferenceExporterDown 0",
            "alert InferenceExporterDown 1",
            "alert InferenceGPUContended 0",
            "alert InferenceHBMBandwidthSaturated 0",
            *ACROSS_TARGETS,
        ]
    )
    for baseline in ("alert InferenceGPUContended 0", "alert InferenceHBMBandwidthSaturated 0"):
        assert outcomes[baseline] == {"refused"}, baseline
    assert outcomes["alert InferenceHBMBandwidthSaturated 0"] == {"refused"}
