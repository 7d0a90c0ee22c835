"""What every signature builder reads: the site config, the signals' names, small formatters.

A builder never writes a threshold, window or selector itself: it asks the :class:`Context`,
so a site's config regenerates the whole pack.
"""

from __future__ import annotations

from dataclasses import replace

from exporter.config import format_duration
from exporter.signatures import runbook_templates
from exporter.signatures.definitions import (
    RECORD_NAME,
    TARGET,
    AlertRule,
    Evidence,
    Runbook,
    Signature,
)
from exporter.signatures.promql_text import by, on, selector
from exporter.signatures.signals import (
    HISTORY,
    POOL_HISTORY,
    SignalContext,
    pool_labels,
    record_windows,
)
from exporter.signatures.signals.signal import Signal
from exporter.signatures.site import SiteConfig


class Context:
    """One site config as the builders need it."""

    def __init__(self, cfg: SiteConfig) -> None:
        self.cfg = cfg
        self.pool = pool_labels(cfg.join_labels)
        self.join = cfg.join_labels
        self.windows = record_windows(cfg)
        # For a condition written once for a record and an alert alike (a stalled engine).
        self.signal_context = SignalContext(cfg)

    def name(self, signal: Signal) -> str:
        """The series a signal is read from in this config (its record's name)."""
        return signal.record(self.cfg)

    def for_seconds(self, alert: str) -> float:
        """How long the alert's condition must hold before it fires."""
        return self.cfg.seconds(alert, "for")

    def for_duration(self, alert: str) -> str:
        """:meth:`for_seconds` as people and PromQL write it (``10m``)."""
        return format_duration(self.for_seconds(alert))

    def ratio(self, alert: str, name: str) -> float:
        return self.cfg.ratio(alert, name)

    def window(self, name: str) -> str:
        """A look-back window as PromQL writes it (``5m``)."""
        return format_duration(self.cfg.window_seconds(name))

    def window_seconds(self, name: str) -> float:
        return self.cfg.window_seconds(name)

    def selector(self, metric: str, *matchers: str) -> str:
        """``metric{...}`` with the site's sidecar matchers and ``matchers``."""
        return selector(metric, self.cfg.selectors.sidecar, *matchers)

    def latest(self, metric: str, *matchers: str) -> str:
        """:meth:`selector` as its last sample within the ``last_sample`` window: a state an
        alert reads as it is now (a collector's success, NVML up, a GPU lost), held through
        one failed scrape of the target, which marks all its series stale at once and would
        restart the alert's ``for`` (:meth:`SignalContext.latest` for the records)."""
        return self.signal_context.latest(metric, *matchers)

    def rate(self, metric: str) -> str:
        """``rate(metric{...}[<rate window>])`` of a sidecar counter."""
        return f"rate({self.selector(metric)}[{self.window('rate')}])"

    def by(self, *labels: str) -> str:
        """``by (<join labels>, labels...)``: one series per target (and per ``labels``)."""
        return by((*self.join, *labels))

    def history_needed(self, expr: str) -> float:
        """Seconds of history ``expr`` needs: the longest window of the records it reads."""
        return max([0.0, *(self.windows.get(name, 0.0) for name in RECORD_NAME.findall(expr))])

    def guarded(self, sig: Signature) -> Signature:
        """``sig`` with each rule behind the cold-start guard: ``(expr) and on (<join>)
        history<w>``, ``w`` the longest window its expression reads, so that it cannot even go
        pending while that window is half empty (after Prometheus restarts, on a new pod).

        Automatic: a new signature over windowed records gets the guard without asking."""
        return replace(sig, rules=tuple(self._guarded(rule) for rule in sig.rules))

    def _guarded(self, rule: AlertRule) -> AlertRule:
        need = self.history_needed(rule.expr)
        if need == 0:
            return rule
        if "inference_pool:" in rule.expr:  # a pool's alert has no pod: the pool's history
            guard = f"and {on((*self.pool, 'model'))}\n{self.name(POOL_HISTORY.at(need))}"
        else:
            guard = f"and {on(self.join)}\n{self.name(HISTORY.at(need))}"
        return replace(rule, expr=f"(\n{rule.expr}\n)\n{guard}", history=need)

    def runbook(
        self, alert: str, queries: tuple[tuple[str, str], ...] = (), **values: str
    ) -> Runbook:
        """The alert's runbook prose (``exporter/signatures/runbooks/<alert>.md``) with its
        ``{{name}}`` placeholders filled from ``values``, and the PromQL ``queries`` that
        confirm it."""
        return runbook_templates.runbook(alert, queries, **values)


def percent(key: str, label: str, record: str, fmt: str = "%.0f") -> Evidence:
    """Evidence quoting a 0-1 record of the alert's target as a percentage."""
    return Evidence(key, label, f"100 * {record}{TARGET}", "%", fmt)
