"""The signals: every recording rule of the pack, one typed declaration each.

A signal (:class:`~.signal.Signal`) is declared once, in the module of its family, with its
name, unit, rule group and each layout's expression; the alerts, ``diagnose``, the post-mortem,
the dashboards and the landing page import the object and ask it for its name under a site
config. The alert expressions only ever read signals, so a layout swaps where a signal comes
from (the sidecar's NVML, the node agent, dcgm-exporter) without touching them. The families:

- :mod:`.guard`: the cold-start guard's history, per target and per pool;
- :mod:`.target`: the join labels GPU series from the node agent or dcgm-exporter borrow;
- :mod:`.gateway`: the gateway in front of the engines (llm-d's endpoint picker): its queue, what
  it sheds, its pool's engines and GPUs;
- :mod:`.engine`: the running batch, tokens, queue (with the gateway's share), KV cache,
  refusals, a stalled engine;
- :mod:`.latency`: medians of the latency histograms;
- :mod:`.cpu`: the engine's busiest thread, softirq load;
- :mod:`.gpu`: utilisation, driver samples, HBM, SMs, framebuffer, Xids, clock events, each
  layout from its source (:mod:`.node_join`, :mod:`.dcgm_join`);
- :mod:`.shared_gpu`: the engine's own share of GPUs other tenants use too;
- :mod:`.link`: the GPUs a pod holds and their NVLink use against its peak;
- :mod:`.power`: what holds a throttled GPU's clocks down (heat, power brake, power cap,
  smoothing), from its power draw and enforced limit;
- :mod:`.roofline`: the roofline, latency budget and workload shape (``docs/roofline.md``);
- :mod:`.energy`: energy and cost per generated and prompt token, per pod and pool, and the
  share of the GPUs' energy spent idle;
- :mod:`.pool`: the pools of disaggregated serving, across targets.

:data:`SIGNALS` lists them in evaluation order; :func:`recording_rules` writes a site
config's rules from it. ``exporter/signatures/README.md`` says how to add one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from exporter.config import parse_duration
from exporter.signatures.definitions import RECORD_NAME, RecordingRule
from exporter.signatures.signals import (
    cpu_signals,
    energy_signals,
    engine_signals,
    gateway_signals,
    gpu_signals,
    latency_signals,
    link_signals,
    pool_signals,
    power_signals,
    roofline_signals,
    shared_gpu_signals,
)
from exporter.signatures.signals.guard_signals import HISTORY, POOL_HISTORY
from exporter.signatures.signals.signal import (
    AtWindows,
    ByRole,
    Declaration,
    Signal,
    record_name,
)
from exporter.signatures.signals.signal_context import POD_LABELS, SignalContext, pool_labels
from exporter.signatures.signals.signal_groups import RECORD_GROUPS
from exporter.signatures.signals.target_signals import TARGET_INFO
from exporter.signatures.site import SiteConfig

#: Every signal, in the order the rule files write them within a group: a signal reads only
#: signals above it in its group or in an earlier group (:data:`RECORD_GROUPS`).
SIGNALS: tuple[Declaration, ...] = (
    TARGET_INFO,
    gateway_signals.GATEWAY_QUEUE,
    gateway_signals.GATEWAY_QUEUE_TREND,
    gateway_signals.GATEWAY_SHED,
    gateway_signals.POOL_ENGINES,
    gateway_signals.QUEUE_SHARE,
    gateway_signals.QUEUE_TREND_SHARE,
    engine_signals.REQUESTS_RUNNING,
    engine_signals.GENERATION_TOKENS,
    engine_signals.TOKENS_PER_REQUEST,
    engine_signals.TRAFFIC,
    engine_signals.QUEUE_DEPTH,
    engine_signals.QUEUE_TREND,
    engine_signals.QUEUE_WAIT_SHARE,
    engine_signals.REJECTED_SHARE,
    latency_signals.TOKENIZER_MEDIAN,
    latency_signals.INTER_TOKEN_MEDIAN,
    cpu_signals.HOTTEST_THREAD,
    cpu_signals.SOFTIRQ_SHARE,
    cpu_signals.SOFTIRQ_HOTTEST_CORE,
    # After the CPU records: the order the rule files have always had.
    engine_signals.KV_CACHE,
    engine_signals.ENGINE_STALLED,
    roofline_signals.MODEL_E2E_SECONDS,
    roofline_signals.MODEL_REQUESTS,
    roofline_signals.MODEL_PROMPT,
    roofline_signals.PEAK_BANDWIDTH,
    roofline_signals.PEAK_FLOPS,
    roofline_signals.KV_CACHE_BYTES,
    roofline_signals.DECODE_FLOOR,
    roofline_signals.INTER_TOKEN_MEAN,
    roofline_signals.DECODE_EFFICIENCY,
    roofline_signals.ROOFLINE_TOKENS,
    roofline_signals.ROOFLINE_THROUGHPUT,
    roofline_signals.PREFILL_EFFICIENCY,
    roofline_signals.E2E_MEAN,
    roofline_signals.BUDGET_QUEUE,
    roofline_signals.BUDGET_TRANSFER,
    roofline_signals.BUDGET_PREFILL,
    roofline_signals.BUDGET_DECODE,
    roofline_signals.BUDGET_HOST,
    roofline_signals.PROMPT_TOKENS,
    roofline_signals.OUTPUT_TOKENS,
    energy_signals.MODEL_GENERATED,
    energy_signals.MODEL_PROMPT_COMPUTED,
    energy_signals.MODEL_PREFILL,
    energy_signals.MODEL_DECODE,
    energy_signals.ENERGY_PER_GENERATED,
    energy_signals.ENERGY_PER_PROMPT,
    energy_signals.COST_PER_GENERATED,
    energy_signals.COST_PER_PROMPT,
    energy_signals.POOL_ENERGY_PER_GENERATED,
    energy_signals.POOL_ENERGY_PER_PROMPT,
    energy_signals.POOL_COST_PER_GENERATED,
    energy_signals.POOL_COST_PER_PROMPT,
    energy_signals.POOL_IDLE_ENERGY,
    AtWindows(POOL_HISTORY, ("rate", "latency", "queue_trend")),
    ByRole(pool_signals.PER_ROLE),
    pool_signals.POOL_RATIO_NOW,
    pool_signals.POOL_RATIO_SUGGESTED,
    pool_signals.KV_TRANSFER_MEAN,
    pool_signals.TTFT_QUEUE_MEAN,
    pool_signals.TTFT_PREFILL_MEAN,
    pool_signals.TTFT_QUEUE_SHARE,
    pool_signals.TTFT_PREFILL_SHARE,
    pool_signals.TTFT_TRANSFER_SHARE,
    pool_signals.POOL_BUDGET_QUEUE,
    pool_signals.POOL_BUDGET_PREFILL,
    pool_signals.POOL_BUDGET_TRANSFER,
    pool_signals.POOL_BUDGET_DECODE,
    pool_signals.KV_FAILURE_RATIO,
    gpu_signals.GPU_UTILIZATION,
    gpu_signals.UTILIZATION_SAMPLES,
    gpu_signals.DCGM_IDLE_SAMPLE,
    gpu_signals.DCGM_BUSY_SAMPLE,
    gpu_signals.IDLE_SAMPLES,
    gpu_signals.BUSY_SAMPLES,
    gpu_signals.HBM_BANDWIDTH,
    gpu_signals.SM_ACTIVE,
    gpu_signals.MEMORY_USED,
    gpu_signals.DCGM_XID_CHANGED,
    gpu_signals.XID_NEW,
    gpu_signals.DCGM_CLOCK_REASONS,
    gpu_signals.THROTTLE_REASON_MASK,
    gpu_signals.CLOCK_EVENTS,
    gpu_signals.TEMPERATURE,
    gpu_signals.SM_CLOCK,
    shared_gpu_signals.GPU_DEVICE_UTILIZATION,
    shared_gpu_signals.GPU_ENGINE_SHARE,
    shared_gpu_signals.GPU_OTHER_TENANTS,
    shared_gpu_signals.GPU_OWN_UTILIZATION,
    link_signals.NVLINK_UTILIZATION,
    energy_signals.GPU_ENERGY_SHARE,
    energy_signals.POWER,
    energy_signals.IDLE_ENERGY,
    energy_signals.COST,
    link_signals.GPUS,
    power_signals.POWER_DRAW,
    power_signals.POWER_LIMIT,
    power_signals.POWER_DEFAULT_LIMIT,
    power_signals.POWER_SMOOTHING,
    power_signals.CAUSE_BY_REASON,
    power_signals.CLOCK_CAUSE,
    gateway_signals.POOL_GPU_UTILIZATION,
)

_RANGE = re.compile(r"\[([0-9smhdwy]+)\]")


def _last_sample_reads(window: str) -> re.Pattern[str]:
    """A fact or state read as its last sample through missed scrapes (SignalContext.last,
    over the site's ``last_sample`` ``window``): its range is no history the record needs, the
    value is right from the first sample. A ``last_over_time`` over any other range is history."""
    return re.compile(rf"last_over_time\([^\[\]]*\[{re.escape(window)}\]\)")


def signals(cfg: SiteConfig) -> list[Signal]:
    """Every signal the configuration's layout has (a record or a raw series), in the order of
    :data:`SIGNALS`; the cold-start guard's history records left out."""
    return [sig for entry in SIGNALS for sig in entry.members(cfg) if sig.exists(cfg)]


def recording_rules(cfg: SiteConfig) -> list[RecordingRule]:
    """All recording rules of the configuration's profile, in evaluation order: the groups of
    :data:`RECORD_GROUPS`, one after the other.

    Every record's ``window`` is resolved (never ``None``), and the history records of the
    cold-start guard come first, ahead of every record that reads them.
    """
    ctx = SignalContext(cfg)
    built = [sig.rule(ctx) for entry in SIGNALS for sig in entry.members(cfg)]
    rules = resolve_windows([rule for rule in built if rule is not None], ctx.window("last_sample"))
    windows = sorted(({rule.window or 0.0 for rule in rules} | ctx.history_windows) - {0.0})
    history = [HISTORY.at(seconds).rule(ctx) for seconds in windows]
    ordered = [*(rule for rule in history if rule is not None), *rules]
    return [rule for group in RECORD_GROUPS for rule in ordered if rule.group == group]


def resolve_windows(rules: Sequence[RecordingRule], last_sample: str) -> list[RecordingRule]:
    """``rules`` with each ``window=None`` replaced by the history the record needs: the
    longest range its expression reads (not a ``last_over_time`` over ``last_sample``, the
    site's window of :meth:`SignalContext.last`), or the longest window of the records it reads
    (records are resolved in order, so a record reads only records above it)."""
    latest = _last_sample_reads(last_sample)
    known: dict[str, float] = {}
    resolved = []
    for rule in rules:
        window = rule.window
        if window is None:
            read = latest.sub("", rule.expr)
            ranges = [parse_duration(text) for text in _RANGE.findall(read)]
            inner = [known.get(name, 0.0) for name in RECORD_NAME.findall(rule.expr)]
            window = max([0.0, *ranges, *inner])
        known[rule.record] = window
        resolved.append(replace(rule, window=window))
    return resolved


def record_windows(cfg: SiteConfig) -> dict[str, float]:
    """Each record of the configuration and the history (seconds) it needs."""
    return {rule.record: rule.window or 0.0 for rule in recording_rules(cfg)}


__all__ = [
    "HISTORY",
    "POD_LABELS",
    "POOL_HISTORY",
    "RECORD_GROUPS",
    "SIGNALS",
    "Signal",
    "SignalContext",
    "pool_labels",
    "record_name",
    "record_windows",
    "recording_rules",
    "resolve_windows",
    "signals",
]
