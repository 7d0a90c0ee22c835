"""Parse an engine's ``/metrics`` body with prometheus_client's text parser, defensively.

What an engine (or anything answering on its port) may send and what becomes of it:

* malformed text: :class:`ValueError` with a short message (the parser's own, cut to a line);
* a family split in several blocks or repeated (``# TYPE`` twice, samples after other
  families, a ``# TYPE x counter`` line followed by ``x_total`` samples, which the parser
  reads as an untyped family of its own): blocks with the same name are merged into one
  family, typed by the first block that has a type, and a series repeated with the same
  labels keeps its first value;
* NaN and +/-Inf: dropped from gauges, counters and untyped families; a histogram or summary
  series with any non-finite ``_sum``, ``_count`` or bucket count is dropped whole;
* ``_created`` samples and families: kept as the parser gives them; the adapters never read
  them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from exporter.priority import no_pause

_MAX_MESSAGE = 120
_WITH_SERIES_PARTS = {"histogram", "gaugehistogram", "summary"}


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def parse_exposition(text: str, pause: Callable[[], None] = no_pause) -> list[Metric]:
    """Families of a Prometheus text exposition, merged by name and cleaned as described in
    the module docstring. Raises :class:`ValueError` when the text is not an exposition.

    ``pause`` is called before each family (the engine poller passes
    :meth:`exporter.priority.ScrapeGate.step_aside`)."""
    raw: list[Metric] = []
    try:
        for family in text_string_to_metric_families(text):
            raw.append(family)
            pause()
    # The parser raises ValueError for most garbage, but hostile bytes can reach other
    # exceptions inside it (index and type errors); all of them mean "not an exposition".
    except Exception as exc:
        raise ValueError(f"malformed exposition: {_short(exc)}") from exc
    return _merged([_clean(family) for family in raw])


def _merged(raw: list[Metric]) -> list[Metric]:
    by_name: dict[str, Metric] = {}
    seen: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = defaultdict(set)
    for family in raw:
        incoming = family.samples
        merged = by_name.get(family.name)
        if merged is None:
            merged = by_name[family.name] = family
            merged.samples = []
        elif merged.type == "unknown" and family.type != "unknown":
            merged.type = family.type
            merged.documentation = merged.documentation or family.documentation
        for sample in incoming:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key not in seen[family.name]:
                seen[family.name].add(key)
                merged.samples.append(sample)
    return list(by_name.values())


def _finite(value: float) -> bool:
    # An integer too large for a float (a 400-digit value) is as unusable as +Inf.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _clean(family: Metric) -> Metric:
    if family.type not in _WITH_SERIES_PARTS:
        family.samples = [s for s in family.samples if _finite(s.value)]
        return family
    bad = {_series_key(s) for s in family.samples if not _finite(s.value)}
    if bad:
        family.samples = [s for s in family.samples if _series_key(s) not in bad]
    return family


def _series_key(sample: Sample) -> tuple[tuple[str, str], ...]:
    """The series a histogram/summary sample belongs to: its labels without le/quantile."""
    return tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("le", "quantile")))
