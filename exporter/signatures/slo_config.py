"""The site config's service-level objectives (``slo:``) and scaling advice (``scaling:``).

An objective is per model (and, with ``selector``, per pool): time to first token,
inter-token latency and end-to-end latency as ``threshold @ target`` (``500ms @ 99%``), and
availability as a target (``99.9%``) over the requests the engines finished and the requests
they or the gateway refused::

    slo:
      period: 28d               # the error budget's period (budget left on the dashboards)
      objectives:
        - name: chat            # the slo label of its records and alerts (default: the model)
          model: meta-llama/Llama-3.1-8B-Instruct   # omitted: every model no other names
          selector: 'namespace="prod"'              # more matchers, e.g. one pool
          engines: [vllm]       # whose histograms it reads (default: every engine whose
                                # bucket bounds the pack knows, exporter/signatures/slo_buckets.py)
          buckets: {ttft: [0.1, 0.25, 0.5]}         # the bounds, where the engines' are not known
          ttft: 500ms @ 99%
          itl: 50ms @ 99%
          e2e: 20s @ 99%
          availability: 99.9%
    scaling:
      queue_depth_at_least: 1   # a backlog: requests waiting ...
      kv_cache_above: 0.9       # ... or the KV cache this full
      gpu_utilization_at_least: 0.6   # with the GPUs this busy
      blocked_pods_share_at_least: 0.5  # a pool's pods a host/link/stall cause blocks
      cause_hold: 5m            # a cause blocks scaling out this long after it last held

A latency threshold must be a bucket bound of the histogram it reads for every engine it
reads (:mod:`.slo_buckets`): the config refuses another, naming the nearest bounds and the
error each would bring. Every mistake is a :class:`~.site_errors.SignatureConfigError` (one
line, exit 2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from exporter.config import format_duration, parse_duration
from exporter.engines import ENGINES
from exporter.signatures.promql_text import num, split_matchers
from exporter.signatures.site_errors import SignatureConfigError, describe
from exporter.signatures.slo_buckets import (
    HISTOGRAM,
    LATENCY_SLIS,
    NOT_KNOWN,
    SLI_TITLE,
    LatencySli,
    engines_with,
    is_bound,
    known_bounds,
    neighbours,
)

#: Every objective an entry can set: the latency ones and availability.
SliKind = Literal["ttft", "itl", "e2e", "availability"]
SLI_KINDS: tuple[SliKind, ...] = (*LATENCY_SLIS, "availability")
BurnSeverity = Literal["critical", "warning"]

_OBJECTIVE = re.compile(r"^\s*(?P<threshold>\S+)\s*@\s*(?P<target>\S+)\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
DAY = 86400.0


@dataclass(frozen=True)
class Objective:
    """``threshold @ target``: ``target`` (0-1) of the events at or under ``threshold``
    seconds; availability has no threshold."""

    target: float
    threshold: float | None = None

    @property
    def budget(self) -> float:
        """The share of events allowed to miss: ``1 - target``."""
        return 1.0 - self.target

    def text(self) -> str:
        """As the config writes it (``500ms @ 99%``, ``99.9%``)."""
        target = f"{num(round(self.target * 100, 9))}%"
        if self.threshold is None:
            return target
        return f"{format_duration(self.threshold)} @ {target}"


@dataclass(frozen=True)
class Slo:
    """One entry of ``slo.objectives``: what it selects and its objectives."""

    name: str
    model: str | None = None
    selector: tuple[str, ...] = ()
    engines: tuple[str, ...] = ()
    #: The latency objectives' bucket bounds the entry names itself (``buckets:``).
    buckets: Mapping[LatencySli, tuple[float, ...]] = field(default_factory=dict)
    ttft: Objective | None = None
    itl: Objective | None = None
    e2e: Objective | None = None
    availability: Objective | None = None

    def objective(self, kind: SliKind) -> Objective | None:
        value: Objective | None = getattr(self, kind)
        return value

    def kinds(self) -> tuple[SliKind, ...]:
        """The objectives this entry sets, in :data:`SLI_KINDS` order."""
        return tuple(kind for kind in SLI_KINDS if self.objective(kind) is not None)


@dataclass(frozen=True)
class BurnAlert:
    """One multi-window burn-rate alert: the error budget burns ``burn_rate`` times faster
    than the period allows, over both the ``long`` and the ``short`` window (seconds)."""

    long: float
    short: float
    burn_rate: float
    severity: BurnSeverity

    @property
    def budget_spent(self) -> float:
        """The share of a 30-day budget the long window spends at this burn rate (the SRE
        workbook's 2 %, 5 %, 10 %, 10 %)."""
        return self.burn_rate * self.long / (30 * DAY)


#: The Google SRE workbook's multi-window, multi-burn-rate alerts (chapter "Alerting on
#: SLOs", table 5-8): pages at 14.4x over 1h and 6x over 6h, tickets at 3x over 1d and 1x
#: over 3d, each confirmed by a window a twelfth of its length.
SRE_WORKBOOK: tuple[BurnAlert, ...] = (
    BurnAlert(3600.0, 300.0, 14.4, "critical"),
    BurnAlert(6 * 3600.0, 1800.0, 6.0, "critical"),
    BurnAlert(DAY, 2 * 3600.0, 3.0, "warning"),
    BurnAlert(3 * DAY, 6 * 3600.0, 1.0, "warning"),
)

#: The objectives of a site that sets none: an outage's, for every model of every engine
#: whose time-to-first-token bounds the pack knows (10 s is a bound of each of them).
DEFAULT_OBJECTIVES: tuple[Mapping[str, object], ...] = (
    {"name": "default", "ttft": "10s @ 99%", "availability": "99%"},
)


@dataclass(frozen=True)
class SloConfig:
    """``slo:`` of the site config, validated; durations in seconds, unscaled."""

    period: float = 28 * DAY
    burn_alerts: tuple[BurnAlert, ...] = SRE_WORKBOOK
    objectives: tuple[Slo, ...] = field(default_factory=lambda: default_objectives())  # noqa: PLW0108 (defined below)

    def windows(self) -> tuple[float, ...]:
        """Every window a burn-rate alert reads, shortest first (seconds, unscaled)."""
        return tuple(sorted({w for a in self.burn_alerts for w in (a.long, a.short)}))

    def has(self, kind: SliKind) -> bool:
        return any(slo.objective(kind) is not None for slo in self.objectives)


@dataclass(frozen=True)
class ScalingConfig:
    """``scaling:`` of the site config: when a backlog is capacity (scale out) and how long a
    cause that blocks scaling out keeps blocking it after it last held (seconds, unscaled)."""

    queue_depth_at_least: float = 1.0
    kv_cache_above: float = 0.9
    gpu_utilization_at_least: float = 0.6
    blocked_pods_share_at_least: float = 0.5
    cause_hold: float = 300.0


SCALING_HELP: Mapping[str, str] = {
    "queue_depth_at_least": "a pod has a backlog when this many requests wait in its queue",
    "kv_cache_above": "... or its KV cache is fuller than this",
    "gpu_utilization_at_least": "the backlog is capacity only while the engine's GPUs are this "
    "busy (the engine's own share)",
    "blocked_pods_share_at_least": "a pool is not scaled out while a cause that blocks it holds "
    "on this share of its pods (or on the pool)",
    "cause_hold": "a cause keeps blocking this long after it last held, so the gate does not "
    "flap with it",
}


# --- parsing ----------------------------------------------------------------------------------


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise SignatureConfigError(where, f"must be a mapping, got {describe(value)}")
    return value


def _known(section: Mapping[str, Any], where: str, known: tuple[str, ...]) -> None:
    for key in section:
        if key not in known:
            raise SignatureConfigError(f"{where}.{key}", f"unknown key (known: {', '.join(known)})")


def _seconds(value: object, where: str) -> float:
    if not isinstance(value, str):
        raise SignatureConfigError(
            where, f"must be a duration string such as 5m, got {describe(value)}"
        )
    try:
        seconds = parse_duration(value)
    except ValueError as err:
        raise SignatureConfigError(where, str(err)) from None
    if seconds <= 0:
        raise SignatureConfigError(where, "must be longer than 0s")
    return seconds


def _number(value: object, where: str, *, at_most: float | None = None) -> float:
    """A number of 0 or more (at most ``at_most`` where given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SignatureConfigError(where, f"must be a number, got {describe(value)}")
    if value < 0 or (at_most is not None and value > at_most):
        limit = f"from 0 to {num(at_most)}" if at_most is not None else "0 or more"
        raise SignatureConfigError(where, f"must be {limit}, got {value}")
    return float(value)


def _target(text: str, where: str) -> float:
    """``99%``, ``99.9 %`` or ``0.999``: a share strictly between 0 and 1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise SignatureConfigError(
            where, f"the target must be a percentage such as 99.9%, got {raw!r}"
        ) from None
    if not 0.0 < value < 1.0 or not math.isfinite(value):
        raise SignatureConfigError(
            where, f"the target must be above 0% and below 100% (a budget to spend), got {raw!r}"
        )
    return round(value, 12)


def _objective(value: object, where: str, *, latency: bool) -> Objective:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not latency:
        return Objective(_target(str(value), where))
    if not isinstance(value, str):
        form = "a string such as '500ms @ 99%'" if latency else "a percentage such as '99.9%'"
        raise SignatureConfigError(where, f"must be {form}, got {describe(value)}")
    if not latency:
        if "@" in value:
            raise SignatureConfigError(
                where, f"availability has no threshold: write only the target, got {value!r}"
            )
        return Objective(_target(value, where))
    match = _OBJECTIVE.match(value)
    if match is None:
        raise SignatureConfigError(
            where, f"must be 'threshold @ target' (500ms @ 99%), got {value!r}"
        )
    try:
        threshold = parse_duration(match["threshold"])
    except ValueError as err:
        raise SignatureConfigError(where, f"threshold: {err}") from None
    if threshold <= 0:
        raise SignatureConfigError(where, "the threshold must be longer than 0s")
    return Objective(_target(match["target"], where), threshold)


def _buckets(value: object, where: str) -> dict[LatencySli, tuple[float, ...]]:
    section = _mapping(value, where)
    _known(section, where, LATENCY_SLIS)
    out: dict[LatencySli, tuple[float, ...]] = {}
    for sli in LATENCY_SLIS:
        if sli not in section:
            continue
        items = section[sli]
        here = f"{where}.{sli}"
        if not isinstance(items, list) or not items:
            raise SignatureConfigError(
                here, f"must be a list of bucket bounds, got {describe(items)}"
            )
        bounds = tuple(_number(item, f"{here}[{i}]") for i, item in enumerate(items))
        if list(bounds) != sorted(set(bounds)):
            raise SignatureConfigError(here, "must list each bound once, in ascending order")
        out[sli] = bounds
    return out


def human_seconds(seconds: float) -> str:
    """A latency as people write it: ``450ms``, ``2.5s``, ``10s``, ``2m30s``."""
    if seconds < 1:
        return f"{num(round(seconds * 1000, 3))}ms"
    if seconds < 60:
        return f"{num(round(seconds, 3))}s"
    return format_duration(seconds)


def _error_of(threshold: float, bound: float) -> str:
    """What counting from ``bound`` instead of ``threshold`` would do."""
    gap = human_seconds(abs(bound - threshold))
    share = f"{num(round(100 * abs(bound - threshold) / threshold))} %"
    side = "slower as good" if bound > threshold else "faster as bad"
    return f"{human_seconds(bound)}, which would count requests up to {gap} ({share}) {side}"


def _check_bound(
    threshold: float, sli: LatencySli, engines: tuple[str, ...], own: tuple[float, ...] | None,
    where: str,
) -> None:  # fmt: skip
    """Refuse a threshold that is not a bucket bound of every engine's histogram."""
    for engine in engines:
        bounds = own if own is not None else known_bounds(engine, sli)
        histogram = f"{engine}'s {SLI_TITLE[sli]} histogram ({HISTOGRAM[sli]})"
        if bounds is None:
            why = NOT_KNOWN.get(engine, "no captured scrape of it has this histogram")
            raise SignatureConfigError(
                where,
                f"the bucket bounds of {histogram} are not known ({why}); "
                f"name them in buckets.{sli} of this objective",
            )
        if is_bound(threshold, bounds):
            continue
        below, above = neighbours(threshold, bounds)
        near = [_error_of(threshold, b) for b in (below, above) if b is not None and b > 0]
        nearest = (
            f"the nearest are {near[0]}, and {near[1]}"
            if len(near) == 2
            else f"the nearest is {near[0]}"
            if near
            else "it has no bound near it"
        )
        raise SignatureConfigError(
            where,
            f"{human_seconds(threshold)} is not a bucket bound of {histogram}; {nearest}: pick "
            f"a bound, or give the engine buckets that include {human_seconds(threshold)}",
        )


def _engines(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SignatureConfigError(where, f"must be a list of engine names, got {describe(value)}")
    out: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or item not in ENGINES:
            raise SignatureConfigError(
                f"{where}[{index}]",
                f"unknown engine {describe(item)} (known: {', '.join(ENGINES)})",
            )
        if item not in out:
            out.append(item)
    return tuple(out)


_ENTRY_KEYS = ("name", "model", "selector", "engines", "buckets", *SLI_KINDS)


def _slo(value: object, where: str) -> Slo:
    entry = _mapping(value, where)
    _known(entry, where, _ENTRY_KEYS)
    model = entry.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise SignatureConfigError(f"{where}.model", f"must be a model name, got {describe(model)}")
    name = entry.get("name", model if model is not None else "default")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SignatureConfigError(
            f"{where}.name", f"must be a name of letters, digits and ._:/-, got {describe(name)}"
        )
    selector_text = entry.get("selector", "")
    if not isinstance(selector_text, str):
        raise SignatureConfigError(
            f"{where}.selector", f"must be a string of matchers, got {describe(selector_text)}"
        )
    try:
        selector = tuple(split_matchers(selector_text)) if selector_text.strip() else ()
    except ValueError as err:
        raise SignatureConfigError(f"{where}.selector", str(err)) from None
    for matcher in selector:
        label = re.match(r"[a-zA-Z_][a-zA-Z0-9_]*", matcher)
        if label is not None and label[0] in ("model", "engine", "le", "role"):
            raise SignatureConfigError(
                f"{where}.selector",
                f"{label[0]!r} is set by the objective itself (model, engines), not a selector",
            )
    objectives = {
        kind: _objective(entry[kind], f"{where}.{kind}", latency=kind != "availability")
        for kind in SLI_KINDS
        if kind in entry
    }
    if not objectives:
        raise SignatureConfigError(where, f"sets no objective (any of {', '.join(SLI_KINDS)})")
    buckets = _buckets(entry["buckets"], f"{where}.buckets") if "buckets" in entry else {}
    latency = tuple(sli for sli in LATENCY_SLIS if sli in objectives)
    for sli in buckets:
        if sli not in objectives:
            raise SignatureConfigError(f"{where}.buckets.{sli}", f"the objective sets no {sli}")
    if "engines" in entry:
        engines = _engines(entry["engines"], f"{where}.engines")
    else:
        engines = engines_with(tuple(sli for sli in latency if sli not in buckets))
    for sli in latency:
        objective = objectives[sli]
        assert objective.threshold is not None
        _check_bound(objective.threshold, sli, engines, buckets.get(sli), f"{where}.{sli}")
    return Slo(
        name=name,
        model=model,
        selector=selector,
        engines=engines if latency else (),
        buckets=buckets,
        **objectives,
    )


def _objectives(value: object, where: str) -> tuple[Slo, ...]:
    if not isinstance(value, list):
        raise SignatureConfigError(where, f"must be a list of objectives, got {describe(value)}")
    slos = tuple(_slo(item, f"{where}[{index}]") for index, item in enumerate(value))
    seen: dict[str, int] = {}
    for index, slo in enumerate(slos):
        if slo.name in seen:
            raise SignatureConfigError(
                f"{where}[{index}].name",
                f"{slo.name!r} is the name of objectives[{seen[slo.name]}] too; give each a name",
            )
        seen[slo.name] = index
    return slos


def _burn_alerts(value: object, where: str) -> tuple[BurnAlert, ...]:
    if not isinstance(value, list) or not value:
        raise SignatureConfigError(
            where, f"must be a list of burn-rate alerts, got {describe(value)}"
        )
    out = []
    for index, item in enumerate(value):
        here = f"{where}[{index}]"
        entry = _mapping(item, here)
        _known(entry, here, ("long", "short", "burn_rate", "severity"))
        for key in ("long", "short", "burn_rate", "severity"):
            if key not in entry:
                raise SignatureConfigError(f"{here}.{key}", "is missing")
        long, short = (
            _seconds(entry["long"], f"{here}.long"),
            _seconds(entry["short"], f"{here}.short"),
        )
        if short >= long:
            raise SignatureConfigError(f"{here}.short", "must be shorter than long")
        rate = _number(entry["burn_rate"], f"{here}.burn_rate")
        if rate <= 0:
            raise SignatureConfigError(f"{here}.burn_rate", "must be more than 0")
        severity = entry["severity"]
        if severity not in ("critical", "warning"):
            raise SignatureConfigError(
                f"{here}.severity",
                f"must be critical (page) or warning (ticket), got {describe(severity)}",
            )
        out.append(BurnAlert(long, short, rate, severity))
    return tuple(out)


def default_objectives() -> tuple[Slo, ...]:
    """The shipped objectives, validated like a site's."""
    return _objectives(list(DEFAULT_OBJECTIVES), "slo.objectives")


def parse_slo(value: object) -> SloConfig:
    """``slo:`` of the site config; absent, the shipped objectives (:data:`DEFAULT_OBJECTIVES`)."""
    section = _mapping({} if value is None else value, "slo")
    _known(section, "slo", ("period", "burn_alerts", "objectives"))
    period = _seconds(section["period"], "slo.period") if "period" in section else 28 * DAY
    alerts = (
        _burn_alerts(section["burn_alerts"], "slo.burn_alerts")
        if "burn_alerts" in section
        else SRE_WORKBOOK
    )
    raw = section.get("objectives", list(DEFAULT_OBJECTIVES))
    objectives = _objectives(raw, "slo.objectives")
    longest = max(a.long for a in alerts)
    if period < longest:
        raise SignatureConfigError(
            "slo.period",
            f"must be at least the longest burn-rate window ({format_duration(longest)})",
        )
    return SloConfig(period=period, burn_alerts=alerts, objectives=objectives)


def parse_scaling(value: object) -> ScalingConfig:
    """``scaling:`` of the site config; every key optional."""
    section = _mapping({} if value is None else value, "scaling")
    names = tuple(SCALING_HELP)
    _known(section, "scaling", names)
    out: dict[str, float] = {}
    for key, raw in section.items():
        where = f"scaling.{key}"
        if key == "cause_hold":
            out[key] = _seconds(raw, where)
        elif key == "queue_depth_at_least":
            out[key] = _number(raw, where)
        else:
            out[key] = _number(raw, where, at_most=1.0)
    return ScalingConfig(**out)
