"""Recording rules: the signals the signatures read, filled by each profile from its source.

Every record is named ``level:metric:operation`` (:class:`RecordNames`). The alert
expressions only ever read these names, so a profile can swap where a signal comes from (the
sidecar's NVML collector or dcgm-exporter) without touching them. One module per family of
records:

- :mod:`.target_records`: the join labels dcgm-exporter series borrow, the cold-start guard;
- :mod:`.engine_records`: the running batch, tokens, queue and KV cache;
- :mod:`.latency_records`: medians of the latency histograms;
- :mod:`.cpu_records`: the engine's busiest thread, softirq load;
- :mod:`.nvml_records`, :mod:`.dcgm_records` or :mod:`.node_records`: the GPUs, by the
  profile's source (the sidecar, dcgm-exporter, or the node agent attributed by pod);
- :mod:`.shared_gpu_records`: the engine's own share of GPUs other tenants use too;
- :mod:`.roofline_records`: the roofline, latency budget and workload shape (``docs/roofline.md``).

They read the site config through a :class:`RecordContext` and land in the rule groups of
:data:`RECORD_GROUPS`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from exporter.config import parse_duration
from exporter.signatures.definitions import RECORD_NAME, RecordingRule
from exporter.signatures.records.cpu_records import cpu_records
from exporter.signatures.records.dcgm_records import dcgm_gpu_records
from exporter.signatures.records.engine_records import engine_records, kv_cache_records
from exporter.signatures.records.latency_records import latency_records
from exporter.signatures.records.node_records import node_gpu_records
from exporter.signatures.records.nvml_records import nvml_gpu_records
from exporter.signatures.records.record_context import RecordContext
from exporter.signatures.records.record_groups import GPU_GROUP, GPU_STATE_GROUP, RECORD_GROUPS
from exporter.signatures.records.record_names import RecordNames
from exporter.signatures.records.roofline_records import roofline_records
from exporter.signatures.records.shared_gpu_records import shared_gpu_records
from exporter.signatures.records.target_records import history_records, join_records
from exporter.signatures.site import SiteConfig

_RANGE = re.compile(r"\[([0-9smhdwy]+)\]")


def recording_rules(cfg: SiteConfig) -> list[RecordingRule]:
    """All recording rules of the configuration's profile, in evaluation order: the groups of
    :data:`RECORD_GROUPS`, one after the other.

    Every record's ``window`` is resolved (never ``None``), and the history records of the
    cold-start guard come first, ahead of every record that reads them.
    """
    ctx = RecordContext(cfg)
    rules = resolve_windows(_family_records(ctx))
    windows = sorted(({rule.window or 0.0 for rule in rules} | ctx.history_windows) - {0.0})
    ordered = [*history_records(ctx, windows), *rules]
    return [rule for group in RECORD_GROUPS for rule in ordered if rule.group == group]


def _family_records(ctx: RecordContext) -> list[RecordingRule]:
    """Every family's records, each record after the records it reads."""
    # The KV-cache record follows the CPU records: the order the rule files have always had.
    rules = [
        *join_records(ctx),
        *engine_records(ctx),
        *latency_records(ctx),
        *cpu_records(ctx),
        *kv_cache_records(ctx),
        *roofline_records(ctx),
    ]
    if ctx.from_dcgm:
        gpu = dcgm_gpu_records(ctx)
    elif ctx.from_node:
        gpu = node_gpu_records(ctx)
    else:
        gpu = nvml_gpu_records(ctx)
    gpu += shared_gpu_records(ctx)
    records = ctx.records
    # Per-GPU state now (cheap, one sample a series) apart from the rates over windows.
    state = {
        records.memory_used,
        records.xid_new,
        records.clock_events,
        records.temperature,
        records.sm_clock,
        records.dcgm_xid_changed,
        records.dcgm_clock_reasons,
    }
    return rules + [
        replace(rule, group=GPU_STATE_GROUP if rule.record in state else GPU_GROUP) for rule in gpu
    ]


def resolve_windows(rules: Sequence[RecordingRule]) -> list[RecordingRule]:
    """``rules`` with each ``window=None`` replaced by the history the record needs: the
    longest range its expression reads, or the longest window of the records it reads
    (records are resolved in order, so a record reads only records above it)."""
    known: dict[str, float] = {}
    resolved = []
    for rule in rules:
        window = rule.window
        if window is None:
            ranges = [parse_duration(text) for text in _RANGE.findall(rule.expr)]
            inner = [known.get(name, 0.0) for name in RECORD_NAME.findall(rule.expr)]
            window = max([0.0, *ranges, *inner])
        known[rule.record] = window
        resolved.append(replace(rule, window=window))
    return resolved


def record_windows(cfg: SiteConfig) -> dict[str, float]:
    """Each record of the configuration and the history (seconds) it needs."""
    return {rule.record: rule.window or 0.0 for rule in recording_rules(cfg)}


__all__ = [
    "RECORD_GROUPS",
    "RecordContext",
    "RecordNames",
    "record_windows",
    "recording_rules",
    "resolve_windows",
]
