"""Faster encoders for the Prometheus text format (``text/plain; version=0.0.4``) and for
OpenMetrics 1.0 (``application/openmetrics-text``), which Prometheus asks for.

prometheus_client's ``generate_latest`` validates and escapes every label of every sample on
every scrape; that was three quarters of the exporter's CPU per scrape with 8 GPUs. Label sets
repeat from scrape to scrape, so :class:`TextEncoder` and :class:`OpenMetricsEncoder` render
each ``name{labels}`` prefix once (with prometheus_client's own escaping functions) and cache it.
Their output is byte-for-byte what prometheus_client's ``generate_latest`` and
``openmetrics.exposition.generate_latest`` write (tests compare them, with prometheus-client
0.26.0 and later, the pinned minimum). prometheus_client itself renders only OpenMetrics requests
for the ``dots`` or ``values`` escaping (``Exporter.render``) and families with exemplars or
native histograms, which the exporter never emits.
"""

from __future__ import annotations

import math
import re
from typing import Protocol, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om
from prometheus_client.samples import Sample

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TYPES = {
    "counter": "counter",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_CACHE_LIMIT = 20_000


def go_float(value: float) -> str:
    """A sample value as Go (and prometheus_client's floatToGoString) writes it."""
    if math.isnan(value):
        return "NaN"
    if value == _INF:
        return "+Inf"
    if value == -_INF:
        return "-Inf"
    text = repr(float(value))
    if value > 0:
        dot = text.find(".")
        # Go switches to exponents sooner than Python (only positive values matter here).
        if dot > 6:
            mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
    return text


_INF = float("inf")


class _Series:
    """One series' cached ``name{labels} `` and the last value written after it, with its text.

    Most values (bucket counts, gauges read every few seconds) are the same on the next scrape,
    so their text is reused. ``last`` is replaced in one assignment (scrapes may run
    concurrently). Zero is never reused (``0.0 == -0.0`` but they print differently), NaN
    never equals itself."""

    __slots__ = ("last", "prefix")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.last: tuple[float, str] = (0.0, "")

    def text(self, value: float) -> str:
        last = self.last
        if value and last[0] == value:
            return last[1]
        text = go_float(value)
        self.last = (value, text)
        return text


class _Source(Protocol):
    def collect(self) -> object: ...


def _name(name: str) -> str:
    if _LEGACY_NAME.match(name):
        return name
    return om.escape_metric_name(name, om.UNDERSCORES)


def _label_name(name: str) -> str:
    if _LEGACY_LABEL.match(name):
        return name
    return om.escape_label_name(name, om.UNDERSCORES)


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class TextEncoder:
    """Renders a registry in the text format, caching sample prefixes between calls."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}

    def _new_series(self, name: str, labels: dict[str, str]) -> _Series:
        # A family always builds its label dicts in the same order, so the unsorted items
        # are a stable key; the rendering sorts them as generate_latest does.
        key = (name, tuple(labels.items()))
        if len(self._series) >= _CACHE_LIMIT:
            self._series.clear()
        rendered = ",".join(f'{_label_name(k)}="{_label_value(v)}"' for k, v in sorted(key[1]))
        series = _Series(f"{_name(name)}{{{rendered}}} " if rendered else f"{_name(name)} ")
        self._series[key] = series
        return series

    def _lines(self, samples: list[Sample], out: list[str]) -> None:
        cache = self._series
        for name, labels, value, timestamp, _exemplar, _native in samples:
            series = cache.get((name, tuple(labels.items())))
            if series is None:
                series = self._new_series(name, labels)
            if timestamp is None:
                out.append(f"{series.prefix}{series.text(value)}\n")
            else:
                when = int(float(timestamp) * 1000)
                out.append(f"{series.prefix}{series.text(value)} {when:d}\n")

    def encode(self, registry: _Source) -> bytes:
        out: list[str] = []
        for metric in cast(list[Metric], registry.collect()):
            mname, mtype = metric.name, metric.type
            if mtype == "counter":
                mname += "_total"
            elif mtype == "info":
                mname += "_info"
            mtype = _TYPES.get(mtype, mtype)
            help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {_name(mname)} {help_text}\n")
            out.append(f"# TYPE {_name(mname)} {mtype}\n")
            extra: dict[str, list[Sample]] = {}
            plain: list[Sample] = []
            suffixed = {metric.name + suffix: suffix for suffix in _OM_SUFFIXES}
            for sample in metric.samples:
                suffix = suffixed.get(sample.name)
                if suffix is None:
                    plain.append(sample)
                else:
                    extra.setdefault(suffix, []).append(sample)
            self._lines(plain, out)
            for suffix, samples in sorted(extra.items()):
                out.append(f"# HELP {_name(metric.name + suffix)} {help_text}\n")
                out.append(f"# TYPE {_name(metric.name + suffix)} gauge\n")
                self._lines(samples, out)
        return "".join(out).encode("utf-8")


class _Collected:
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


class OpenMetricsEncoder:
    """Renders a registry as OpenMetrics 1.0, byte for byte what prometheus_client's
    ``openmetrics.exposition.generate_latest`` writes, caching each sample's
    ``name{labels}`` prefix (per escaping scheme) between calls. Exemplars and native
    histograms, which the exporter never emits, go through prometheus_client."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Series] = {}

    def _new_series(self, escaping: str, name: str, labels: dict[str, str]) -> _Series:
        key = (escaping, name, tuple(labels.items()))
        if len(self._series) >= _CACHE_LIMIT:
            self._series.clear()
        # The same steps as generate_latest, once per distinct series.
        head, labelstr = name, ""
        if escaping == om.ALLOWUTF8 and not _LEGACY_NAME.match(name):
            head, labelstr = "", om.escape_metric_name(name, escaping)
            if labels:
                labelstr += ","
        else:
            head = om._escape(name, escaping, om._is_legacy_labelname_rune)
        if labels:
            labelstr += ",".join(
                f'{om.escape_label_name(k, escaping)}="{_label_value(v)}"'
                for k, v in sorted(labels.items())
            )
        series = _Series(f"{head}{{{labelstr}}} " if labelstr else f"{head} ")
        self._series[key] = series
        return series

    def encode(self, registry: _Source, escaping: str = om.UNDERSCORES) -> bytes:
        out: list[str] = []
        cache = self._series
        metrics = list(cast(list[Metric], registry.collect()))
        for metric in metrics:
            mname = om.escape_metric_name(metric.name, escaping)
            help_text = _label_value(metric.documentation)
            out.append(f"# HELP {mname} {help_text}\n# TYPE {mname} {metric.type}\n")
            if metric.unit:
                out.append(f"# UNIT {mname} {metric.unit}\n")
            for name, labels, value, timestamp, exemplar, native in metric.samples:
                if exemplar is not None or native is not None:
                    # Collected once: the same families, rendered by prometheus_client.
                    again = _Collected(metrics)
                    return cast(bytes, om.generate_latest(again, escaping=escaping))  # type: ignore[no-untyped-call]
                series = cache.get((escaping, name, tuple(labels.items())))
                if series is None:
                    series = self._new_series(escaping, name, labels)
                if timestamp is None:
                    out.append(f"{series.prefix}{series.text(value)}\n")
                else:
                    out.append(f"{series.prefix}{series.text(value)} {timestamp}\n")
        out.append("# EOF\n")
        return "".join(out).encode("utf-8")
