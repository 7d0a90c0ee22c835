"""The normalised engine snapshot: what every engine adapter produces.

Adapters (one module per engine in this package) turn an engine's parsed exposition into
:class:`Series` under the fixed ``inference_*`` names of the metric catalogue, with label
``model`` (empty where the engine has none) and the metric's own labels, if any (``reason``).
Units are already converted to base units.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

SeriesKind = Literal["gauge", "counter", "histogram"]
#: A server's part in disaggregated serving: prefill only, decode only, or both (colocated).
Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("both", "prefill", "decode")

#: What an endpoint is: an engine (or a server of one) or a front-end that routes to engines
#: (Dynamo's frontend), whose request metrics count the same requests again.
Layer = Literal["engine", "frontend"]


@dataclass(frozen=True, slots=True)
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
    labels: tuple[tuple[str, str], ...] = ()


@dataclass
class EngineSnapshot:
    """Everything normalised from one successful poll: the series, the series dropped over
    the limit, what the endpoint is (``layer``) and the engine's version where its metrics
    carry it (``""`` otherwise), the server's role where its metrics say it (None otherwise:
    the configured ``--engine.role`` applies), and each model name of the series with the
    raw name the engine gave and where it came from (``"metrics"``, or the API path that
    named it: :func:`exporter.engines.models.name_models`)."""

    engine: str
    series: list[Series] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)
    layer: Layer = "engine"
    version: str = ""
    role: Role | None = None
    models: dict[str, tuple[str, str]] = field(default_factory=dict)
