"""The normalised engine snapshot: what every engine adapter produces.

Adapters (one module per engine in this package) turn an engine's parsed exposition into
:class:`Series` under the fixed ``inference_*`` names of the metric catalogue, with label
``model`` (empty where the engine has none). Units are already converted to base units.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

SeriesKind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class Series:
    """One normalised series. Histograms carry cumulative ``buckets`` (upper bound, count),
    ending with ``+Inf``, plus ``sum`` and ``count``; gauges and counters carry ``value``."""

    name: str
    model: str
    kind: SeriesKind
    value: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()
    sum: float = 0.0
    count: float = 0.0


@dataclass
class EngineSnapshot:
    """Everything normalised from one successful poll."""

    engine: str
    series: list[Series] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
