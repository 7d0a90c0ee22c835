"""Small SVG charts written by hand: time-series plots for ``diagnose --report`` and the
sparklines of the sidecar's landing page.

Why no plotting library: the sidecar draws its landing page's sparklines and must not import
one (the image stays small, a scrape costs nothing more), and a report's plots are inline SVG
styled by the page's own CSS classes, so one stylesheet gives them light, dark
(``prefers-color-scheme``) and print colours. A library's SVG hard-codes its colours, and
the handful of shapes needed here (polylines, stacked areas, shaded bands, three axis labels)
are a few lines each. Standalone files (the Markdown report's) carry :data:`STYLE` inside.

Every drawn series carries ``data-series`` and ``data-points``; every shaded band
``data-start`` and ``data-end`` (Unix seconds): the report's tests read them.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Colours by CSS class, for a page or a standalone file; custom properties keep dark mode and
# print in one place. Eight series colours, chosen to stay apart for the common colour
# blindnesses (Okabe-Ito), each readable on white and on the dark background.
STYLE = """
svg.chart, svg.spark { --fg: #1b1b1b; --muted: #6b6b6b; --grid: #d9d9d9; --incident: #d7301f;
  --baseline: #2b8cbe; --threshold: #b35806;
  --c0: #0072b2; --c1: #d55e00; --c2: #009e73; --c3: #cc79a7; --c4: #e69f00; --c5: #56b4e9;
  --c6: #7a7a7a; --c7: #8c510a; font: 11px system-ui, sans-serif; }
@media (prefers-color-scheme: dark) {
  svg.chart, svg.spark { --fg: #e6e6e6; --muted: #a0a0a0; --grid: #444; --incident: #ff6b5b;
    --baseline: #6cb6ff; --threshold: #f0a050;
    --c0: #56b4e9; --c1: #ff8c42; --c2: #3ddc97; --c3: #f0a0d0; --c4: #f5c242; --c5: #9ad0f5;
    --c6: #bbbbbb; --c7: #d8a060; }
}
@media print {
  svg.chart, svg.spark { --fg: #000; --muted: #444; --grid: #bbb; }
}
svg text { fill: var(--fg); }
svg .axis { stroke: var(--muted); stroke-width: 1; }
svg .grid { stroke: var(--grid); stroke-width: 1; }
svg .muted { fill: var(--muted); }
svg .incident { fill: var(--incident); fill-opacity: 0.16; }
svg .incident-edge { stroke: var(--incident); stroke-width: 1; stroke-dasharray: 3 2; }
svg .firing { fill: var(--incident); fill-opacity: 0.32; }
svg .baseline { fill: var(--baseline); fill-opacity: 0.08; }
svg .threshold { stroke: var(--threshold); stroke-width: 1.2; stroke-dasharray: 6 3; }
svg .threshold-label { fill: var(--threshold); }
svg .line { fill: none; stroke-width: 1.6; stroke-linejoin: round; }
svg .area { stroke: none; fill-opacity: 0.75; }
"""
COLOURS = 8

Point = tuple[float, float]


@dataclass(frozen=True)
class Line:
    """One series: a name for the legend and its (time, value) points, time-ordered."""

    name: str
    points: Sequence[Point]


@dataclass(frozen=True)
class Band:
    """A shaded time interval: ``kind`` is its CSS class (``baseline``, ``incident`` or
    ``firing``)."""

    start: float
    end: float
    kind: str
    label: str


@dataclass(frozen=True)
class Chart:
    """What one plot shows; :func:`render` draws it."""

    title: str
    lines: Sequence[Line]
    start: float
    end: float
    unit: str = ""  # "ratio" draws 0-100 %, else the unit follows the numbers
    stacked: bool = False
    bands: Sequence[Band] = ()
    threshold: float | None = None
    threshold_label: str = ""
    step: float = 0.0  # points further apart than 2.5 steps leave a gap
    y_max: float | None = None
    extra_classes: tuple[str, ...] = field(default_factory=tuple)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") if math.isfinite(value) else "0"


def _clock(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%H:%M")


def format_tick(value: float, unit: str) -> str:
    """An axis label: percentages for ratios, milliseconds under a second, else 3 digits."""
    if unit == "ratio":
        return f"{100 * value:.0f} %"
    if unit == "seconds":
        return f"{1000 * value:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    return f"{value:.3g}"


def _segments(points: Sequence[Point], step: float) -> list[list[Point]]:
    """The points in runs without a gap (a missing stretch or NaN breaks the line)."""
    runs: list[list[Point]] = [[]]
    last: float | None = None
    for t, v in points:
        if not math.isfinite(v):
            runs.append([])
            last = None
            continue
        if last is not None and step > 0 and t - last > 2.5 * step:
            runs.append([])
        runs[-1].append((t, v))
        last = t
    return [run for run in runs if run]


def _stack(lines: Sequence[Line]) -> list[list[tuple[float, float, float]]]:
    """Per line, (t, bottom, top) of its stacked area on the union of the lines' times."""
    times = sorted({t for line in lines for t, v in line.points if math.isfinite(v)})
    base = dict.fromkeys(times, 0.0)
    out = []
    for line in lines:
        values = {t: v for t, v in line.points if math.isfinite(v)}
        layer = []
        for t in times:
            bottom = base[t]
            top = bottom + max(values.get(t, 0.0), 0.0)
            base[t] = top
            layer.append((t, bottom, top))
        out.append(layer)
    return out


def _y_top(chart: Chart) -> float:
    if chart.y_max is not None:
        return chart.y_max
    if chart.stacked:
        tops = [top for layer in _stack(chart.lines) for _, _, top in layer]
    else:
        tops = [v for line in chart.lines for _, v in line.points if math.isfinite(v)]
    if chart.threshold is not None:
        tops.append(chart.threshold)
    high = max(tops, default=1.0)
    if chart.unit == "ratio":
        return 1.0 if high <= 1.0 + 1e-6 else high * 1.05
    return high * 1.1 if high > 0 else 1.0


def render(chart: Chart, *, width: int = 640, height: int = 190, standalone: bool = False) -> str:
    """The chart as an ``<svg>`` element (a whole SVG document when ``standalone``)."""
    left, right, top, bottom = 58, 12, 22, 34
    legend_rows = (len(chart.lines) + 2) // 3
    height += 14 * max(legend_rows - 1, 0)
    plot_w, plot_h = width - left - right, height - top - bottom - 14 * legend_rows
    span = max(chart.end - chart.start, 1e-9)
    y_top = _y_top(chart)

    def x(t: float) -> float:
        return left + plot_w * (min(max(t, chart.start), chart.end) - chart.start) / span

    def y(v: float) -> float:
        return top + plot_h * (1 - min(max(v, 0.0), y_top) / y_top)

    parts = [f'<text x="{left}" y="14" font-weight="600">{_esc(chart.title)}</text>']
    parts += _bands(chart, x, top, plot_h)
    for i in range(3):
        value = y_top * i / 2
        parts.append(
            f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{_num(y(value))}" '
            f'y2="{_num(y(value))}"/>'
            f'<text x="{left - 4}" y="{_num(y(value) + 4)}" text-anchor="end" class="muted">'
            f"{_esc(format_tick(value, chart.unit))}</text>"
        )
    for i in range(5):
        t = chart.start + span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(
            f'<text x="{_num(x(t))}" y="{top + plot_h + 14}" text-anchor="{anchor}" '
            f'class="muted">{_clock(t)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" '
        f'y2="{top + plot_h}"/>'
    )
    parts += _series(chart, x, y)
    if chart.threshold is not None:
        ty = _num(y(chart.threshold))
        parts.append(
            f'<line class="threshold" data-threshold="{chart.threshold!r}" x1="{left}" '
            f'x2="{left + plot_w}" y1="{ty}" y2="{ty}"/>'
            f'<text class="threshold-label" x="{left + plot_w - 2}" '
            f'y="{_num(y(chart.threshold) - 3)}" text-anchor="end">'
            f"{_esc(chart.threshold_label)}</text>"
        )
    parts += _legend(chart, left, top + plot_h + 30)
    classes = " ".join(("chart", *chart.extra_classes))
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{classes}" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{_esc(chart.title)}">'
    )
    style = f"<style>{STYLE}</style>" if standalone else ""
    body = f"{head}<title>{_esc(chart.title)}</title>{style}{''.join(parts)}</svg>"
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n") if standalone else body


def _bands(chart: Chart, x: Callable[[float], float], top: int, plot_h: int) -> list[str]:
    out = []
    for band in chart.bands:
        x0, x1 = x(band.start), x(band.end)
        out.append(
            f'<rect class="{_esc(band.kind)}" data-start="{band.start:.3f}" '
            f'data-end="{band.end:.3f}" x="{_num(x0)}" y="{top}" width="{_num(max(x1 - x0, 1))}" '
            f'height="{plot_h}"><title>{_esc(band.label)}</title></rect>'
        )
        if band.kind != "baseline":
            out.append(
                f'<line class="incident-edge" x1="{_num(x0)}" x2="{_num(x0)}" y1="{top}" '
                f'y2="{top + plot_h}"/>'
            )
    return out


def _series(chart: Chart, x: Callable[[float], float], y: Callable[[float], float]) -> list[str]:
    out = []
    if chart.stacked:
        for i, (line, layer) in enumerate(zip(chart.lines, _stack(chart.lines), strict=True)):
            if not layer:
                continue
            upper = " ".join(f"{_num(x(t))},{_num(y(hi))}" for t, _, hi in layer)
            lower = " ".join(f"{_num(x(t))},{_num(y(lo))}" for t, lo, _ in reversed(layer))
            count = sum(1 for _, v in line.points if math.isfinite(v))
            out.append(
                f'<polygon class="area" data-series="{_esc(line.name)}" data-points="{count}" '
                f'style="fill: var(--c{i % COLOURS})" points="{upper} {lower}"/>'
            )
        return out
    for i, line in enumerate(chart.lines):
        count = sum(1 for _, v in line.points if math.isfinite(v))
        paths = [
            "M" + " L".join(f"{_num(x(t))},{_num(y(v))}" for t, v in run)
            for run in _segments(line.points, chart.step)
        ]
        out.append(
            f'<path class="line" data-series="{_esc(line.name)}" data-points="{count}" '
            f'style="stroke: var(--c{i % COLOURS})" d="{" ".join(paths)}"/>'
        )
    return out


def _legend(chart: Chart, left: int, y0: int) -> list[str]:
    out = []
    for i, line in enumerate(chart.lines):
        row, col = divmod(i, 3)
        lx, ly = left + col * 190, y0 + row * 14
        out.append(
            f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" '
            f'style="fill: var(--c{i % COLOURS})"/>'
            f'<text x="{lx + 14}" y="{ly + 1}">{_esc(line.name[:34])}</text>'
        )
    return out


def sparkline(
    values: Sequence[float],
    *,
    width: int = 160,
    height: int = 28,
    y_max: float | None = None,
    label: str = "",
) -> str:
    """A bare line of ``values`` (oldest first) over the full width, with no axes: an inline
    ``<svg class="spark">`` for a table cell. NaN leaves a gap; ``y_max`` defaults to the
    largest value."""
    finite = [v for v in values if math.isfinite(v)]
    top = y_max if y_max is not None else max(finite, default=1.0) or 1.0
    n = max(len(values) - 1, 1)
    runs: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if not math.isfinite(v):
            runs.append([])
            continue
        px = width * i / n
        py = 2 + (height - 4) * (1 - min(max(v, 0.0), top) / top)
        runs[-1].append(f"{_num(px)},{_num(py)}")
    d = " ".join("M" + " L".join(run) for run in runs if run)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="spark" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{_esc(label)}">'
        f'<line class="grid" x1="0" x2="{width}" y1="{height - 1}" y2="{height - 1}"/>'
        f'<path class="line" data-points="{len(finite)}" style="stroke: var(--c0)" d="{d}"/></svg>'
    )
