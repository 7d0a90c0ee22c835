"""The signals: one typed declaration per recording rule (``exporter/signatures/signals/``).

Every declared signal is listed once in the evaluation order, its name is a recording rule's
name in every configuration, and what an expression reads is a signal declared before it, of
its own layout. The rule files themselves are checked by promtool (``test_rules.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from dataclasses import replace

import pytest

from exporter.signatures import signals as signals_package
from exporter.signatures.definitions import RECORD_NAME, RecordingRule
from exporter.signatures.signals import SIGNALS, recording_rules, resolve_windows, signals
from exporter.signatures.signals.engine_signals import QUEUE_DEPTH
from exporter.signatures.signals.gpu_signals import TEMPERATURE, UTILIZATION_SAMPLES
from exporter.signatures.signals.pool_signals import POOL_QUEUE
from exporter.signatures.signals.signal import ByLayout, PerRole, Raw, Rule, Signal
from exporter.signatures.signals.signal_groups import RECORD_GROUPS
from exporter.signatures.site import PROFILES, SiteConfig, parse_config

SITE = {
    "join_labels": ["cluster", "namespace", "pod", "instance", "job"],
    "windows": {"rate": "2m", "latency": "3m", "queue_trend": "7m", "pulsing": "4m"},
}


def _declared() -> list[Signal | PerRole]:
    """Every Signal and PerRole object at the top level of a module of the package."""
    found: list[Signal | PerRole] = []
    for info in pkgutil.iter_modules(signals_package.__path__):
        module = importlib.import_module(f"{signals_package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, (Signal, PerRole)) and value not in found:
                found.append(value)
    return found


def _listed() -> list[Signal | PerRole]:
    listed: list[Signal | PerRole] = []
    for entry in SIGNALS:
        if isinstance(entry, Signal):
            listed.append(entry)
        elif hasattr(entry, "signals"):
            listed += entry.signals
    return listed


def test_every_declared_signal_is_listed_once() -> None:
    counts = Counter(_listed())
    twice = [s.name for s, n in counts.items() if n > 1]
    assert twice == []
    missing = [s.name for s in _declared() if s not in counts]
    assert missing == [], "declared but not in SIGNALS (so no rule file has them)"
    assert len(_declared()) > 60


@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("site", [{}, SITE], ids=["shipped", "site"])
def test_names_are_records_and_reads_come_before(profile: str, site: dict[str, object]) -> None:
    cfg = parse_config(site, profile)
    rules = recording_rules(cfg)
    names = [rule.record for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert RECORD_NAME.fullmatch(rule.record), rule.record
        assert "{" not in rule.record, rule.record
        assert rule.group in RECORD_GROUPS
    position = {rule.record: (RECORD_GROUPS.index(rule.group), i) for i, rule in enumerate(rules)}
    for rule in rules:
        for read in RECORD_NAME.findall(rule.expr):
            assert read in position, f"{rule.record} reads {read}, no signal of {profile}"
            assert position[read] < position[rule.record], f"{rule.record} reads {read} later"
    # Every signal of the layout is either a record or a raw series read as it is.
    for sig in signals(cfg):
        fill = sig.fill_of(cfg.profile.source)
        assert (sig.record(cfg) in position) == isinstance(fill, Rule), sig.name


def test_a_name_follows_the_windows_and_the_layout() -> None:
    shipped, site = SiteConfig(), parse_config(SITE)
    assert QUEUE_DEPTH.record(shipped) == "inference:queue_depth:sum"
    assert UTILIZATION_SAMPLES.record(shipped) == "inference:gpu_utilization_samples:increase10m"
    assert UTILIZATION_SAMPLES.record(site) == "inference:gpu_utilization_samples:increase4m"
    assert POOL_QUEUE.decode.record(site) == "inference_pool:decode_queue_depth:mean2m"
    assert POOL_QUEUE.of("prefill") is POOL_QUEUE.prefill
    # The sidecar's temperature is its own series; the node agent's a record of the GPUs held down.
    assert TEMPERATURE.record(shipped) == "inference_gpu_temperature_celsius"
    assert (
        TEMPERATURE.record(shipped.with_profile("node")) == "inference_gpu:temperature_celsius:max"
    )
    # dcgm-exporter counts no driver samples: the signal does not exist in that layout.
    assert not UTILIZATION_SAMPLES.exists(shipped.with_profile("dcgm"))
    assert UTILIZATION_SAMPLES not in signals(shipped.with_profile("dcgm"))


def test_every_gpu_signal_says_what_each_layout_does() -> None:
    # A layout-dependent signal names every layout; Raw is a series, not a record name.
    for sig in _listed():
        if isinstance(sig, Signal) and isinstance(sig.fill, ByLayout):
            fills = (sig.fill.sidecar, sig.fill.node, sig.fill.dcgm)
            assert any(isinstance(f, Rule) for f in fills), sig.name
            for fill in fills:
                if isinstance(fill, Raw):
                    assert ":" not in fill.metric, sig.name


def test_only_the_last_sample_window_is_no_history() -> None:
    """A state read as its last sample (``last_over_time`` over the site's ``last_sample``)
    needs no history; ``last_over_time`` over any other range is history like any range, and
    a record over records takes the longest of theirs."""
    rules = resolve_windows(
        [
            RecordingRule("inference:a:last", 'max(last_over_time(x{job="j"}[1m]))', "a"),
            RecordingRule("inference:b:last1h", "max(last_over_time(x[1h]))", "b"),
            RecordingRule("inference:c:mix", "last_over_time(y[1m]) * rate(z[5m])", "c"),
            RecordingRule("inference:d:sum", "inference:a:last + inference:b:last1h", "d"),
        ],
        "1m",
    )
    assert [rule.window for rule in rules] == [0.0, 3600.0, 300.0, 3600.0]
    # With the site's last_sample at 2m, a 1m last_over_time is history again.
    assert resolve_windows([replace(rules[0], window=None)], "2m")[0].window == 60.0
