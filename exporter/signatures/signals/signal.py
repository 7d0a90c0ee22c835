"""A signal: one recording rule of the pack, declared once.

A :class:`Signal` is everything about one ``level:metric:operation`` series: its name (the
site config's windows fill the ``{rate}``-style placeholders), its unit, its rule group, and
how each layout computes it (a :class:`Rule`: the expression, the help text, the history it
needs). The alerts, ``diagnose``, the post-mortem, the dashboards and the landing page hold the
``Signal`` object and ask it for its name in a config (:meth:`Signal.record`), so a renamed or
removed signal is a type error where it is read, never an empty panel at run time.

Where the layout (the profile's source of GPU series: the sidecar's NVML, the node agent,
dcgm-exporter) changes a signal, its fill is a :class:`ByLayout`, which has one field per
layout: a new layout is a new field, and mypy then names every signal that has no expression
for it. A new profile over an existing layout (``fast``: the sidecar's, time scaled) needs
nothing here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, assert_never

from exporter.config import format_duration
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.site import SiteConfig, Source, Windows

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

#: What a signal's value counts, for the views that draw it (axis labels, Grafana units).
Unit = Literal[
    "ratio",  # 0-1, drawn as a percentage
    "seconds",
    "requests",  # requests (waiting, running)
    "requests_per_second",  # a queue's growth
    "tokens",
    "tokens_per_second",
    "bytes",
    "bytes_per_second",
    "flops",  # FLOP per second
    "celsius",
    "hertz",
    "watts",
    "joules",
    "cost",  # in the site config's currency (cost.currency)
    "count",  # engines, samples, errors, targets
    "flag",  # 1 while something holds, absent otherwise
]

#: A role of disaggregated serving with records of its own.
Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")

Text = str | Callable[["SignalContext"], str]
_WINDOW = re.compile(r"\{(" + "|".join(f.name for f in fields(Windows)) + r")\}")


def record_name(template: str, cfg: SiteConfig) -> str:
    """``template`` with each ``{<window>}`` placeholder as the config writes it (``5m``)."""
    return _WINDOW.sub(lambda m: format_duration(cfg.window_seconds(m[1])), template)


@dataclass(frozen=True)
class Rule:
    """How one layout computes a signal: PromQL over the raw series and the signals declared
    before it, and what the rule file says of it.

    ``window`` is the history (seconds) the record needs before its value can be trusted
    (:class:`~exporter.signatures.definitions.RecordingRule`): ``None`` takes the longest range
    its expression reads, or the longest window of the signals it reads; ``0`` declares a
    record right from its first sample. ``only_if`` makes the record depend on the site config
    (the cost records exist only where a GPU-hour has a price); ``None``: always.
    """

    expr: Callable[[SignalContext], str]
    help: Text
    window: float | None = None
    only_if: Callable[[SiteConfig], bool] | None = None

    def applies(self, cfg: SiteConfig) -> bool:
        """Whether the site config has this record."""
        return self.only_if is None or self.only_if(cfg)


@dataclass(frozen=True)
class Raw:
    """In this layout the signal is a raw series read as it is: no record is written, and a
    reader's query names the series (``inference_gpu_temperature_celsius``)."""

    metric: str


#: A layout's part of a signal: its rule, the raw series it is, or ``None`` where the layout
#: has no such signal.
Fill = Rule | Raw | None


@dataclass(frozen=True)
class ByLayout:
    """A signal's fill in each layout, the profile's source of GPU series
    (:data:`exporter.signatures.site.Source`)."""

    sidecar: Fill
    node: Fill
    dcgm: Fill

    def of(self, source: Source) -> Fill:
        match source:
            case "sidecar":
                return self.sidecar
            case "node":
                return self.node
            case "dcgm":
                return self.dcgm
            case _:  # pragma: no cover - mypy proves it unreachable
                assert_never(source)


@dataclass(frozen=True, eq=False)
class Signal:
    """One recording rule: name, unit, rule group, and how each layout computes it.

    ``name`` is ``level:metric:operation`` with the site config's windows as placeholders
    (``inference:gpu_utilization:mean{rate}``). ``fill`` is one :class:`Rule` where every
    layout computes it alike, else a :class:`ByLayout`. Signals compare by identity, so they
    key the views' tables.
    """

    name: str
    unit: Unit
    group: str
    fill: Rule | ByLayout
    #: What a reader calls it, short (a legend, a plot's series).
    title: str = ""

    def fill_of(self, source: Source) -> Fill:
        return self.fill if isinstance(self.fill, Rule) else self.fill.of(source)

    def exists(self, cfg: SiteConfig) -> bool:
        """Whether the configuration's layout has this signal (a record or a raw series)."""
        fill = self.fill_of(cfg.profile.source)
        return fill is not None and (not isinstance(fill, Rule) or fill.applies(cfg))

    def record(self, cfg: SiteConfig) -> str:
        """The series to query for this signal under ``cfg``: the record's name with the
        config's windows, or the raw series where the layout reads one as it is.

        Also for a layout that lacks the signal, a name that matches nothing, so a view that
        queries it shows "no data" rather than failing."""
        fill = self.fill_of(cfg.profile.source)
        if isinstance(fill, Raw):
            return fill.metric
        return record_name(self.name, cfg)

    def rule(self, ctx: SignalContext) -> RecordingRule | None:
        """The recording rule of this signal in ``ctx``'s layout (``None``: none there)."""
        fill = self.fill_of(ctx.cfg.profile.source)
        if not isinstance(fill, Rule) or not fill.applies(ctx.cfg):
            return None
        text = fill.help if isinstance(fill.help, str) else fill.help(ctx)
        return RecordingRule(
            self.record(ctx.cfg), fill.expr(ctx), text, window=fill.window, group=self.group
        )

    def members(self, cfg: SiteConfig) -> tuple[Signal, ...]:
        """The signals this declaration writes, in order: itself."""
        return (self,)


@dataclass(frozen=True, eq=False)
class PerRole:
    """A pool signal with one record per role of disaggregated serving (a record is never read
    through a label selector): ``inference_pool:{role}_queue_depth:mean{rate}``.

    ``prefill`` and ``decode`` are the two signals; :meth:`of` picks one by a role value.
    """

    name: str
    unit: Unit
    group: str
    expr: Callable[[SignalContext, Role], str]
    help: Callable[[Role], str]
    title: str = ""
    prefill: Signal = field(init=False)
    decode: Signal = field(init=False)

    def __post_init__(self) -> None:
        for role in ROLES:
            object.__setattr__(self, role, self._signal(role))

    def _signal(self, role: Role) -> Signal:
        def expr(ctx: SignalContext) -> str:
            return self.expr(ctx, role)

        title = self.title.replace("{role}", role)
        rule = Rule(expr, self.help(role))
        return Signal(self.name.replace("{role}", role), self.unit, self.group, rule, title)

    def of(self, role: Role) -> Signal:
        match role:
            case "prefill":
                return self.prefill
            case "decode":
                return self.decode
            case _:  # pragma: no cover - mypy proves it unreachable
                assert_never(role)


@dataclass(frozen=True)
class ByRole:
    """Per-role signals written role by role: every member's prefill record, then every
    member's decode record (the order the pool's rule group has)."""

    signals: tuple[PerRole, ...]

    def members(self, cfg: SiteConfig) -> tuple[Signal, ...]:
        return tuple(sig.of(role) for role in ROLES for sig in self.signals)


@dataclass(frozen=True, eq=False)
class PerWindow:
    """A family of guard signals, one per window the other signals read: the cold-start
    guard's history records (``inference:exporter_build_info:history{window}``)."""

    name: str
    group: str
    expr: Callable[[SignalContext, float], str]
    help: Callable[[str], str]

    def at(self, seconds: float) -> Signal:
        """The signal of one window (seconds)."""
        window = format_duration(seconds)

        def expr(ctx: SignalContext) -> str:
            return self.expr(ctx, seconds)

        rule = Rule(expr, self.help(window), window=0.0)
        return Signal(self.name.replace("{window}", window), "flag", self.group, rule)


@dataclass(frozen=True)
class AtWindows:
    """A :class:`PerWindow` family's signals at the given windows of the site config, shortest
    first (two windows of one length: one signal)."""

    family: PerWindow
    windows: tuple[str, ...]

    def members(self, cfg: SiteConfig) -> tuple[Signal, ...]:
        seconds = sorted({cfg.window_seconds(name) for name in self.windows})
        return tuple(self.family.at(s) for s in seconds)


#: One entry of the ordered list of declarations (:data:`exporter.signatures.signals.SIGNALS`).
Declaration = Signal | ByRole | AtWindows
