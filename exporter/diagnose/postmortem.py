"""``diagnose --report FILE``: the diagnosis as a post-mortem to attach to an incident.

``FILE.html`` is one self-contained page: its plots are inline SVG, its only style is inline,
and a Content-Security-Policy forbids it every request (no script, font, image or style from
elsewhere). ``FILE.md`` is the same in Markdown, its plots as SVG files in ``FILE-plots/``
beside it (each carrying its own style, light and dark).

Order: the verdict (ranked causes with their observed values against the thresholds, the
PromQL that shows each, what was checked and did not hold), the plots of the window with the
first cause's interval shaded against the baseline before it, the data quality, the inputs.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.config import format_duration as duration
from exporter.diagnose.advice import scaling_advice
from exporter.diagnose.diagnosis import Report
from exporter.diagnose.findings import Condition, Finding, format_value
from exporter.diagnose.report import energy_line, pool_lines, roofline_summary, texts
from exporter.diagnose.timeline import Interval, Panel, Timeline
from exporter.signatures.catalogue import all_signatures
from exporter.signatures.render import runbook_url
from exporter.svgchart import STYLE, Band, Chart, Line, format_tick, render

SUFFIXES = (".html", ".md")
HELD = ("holds", "held")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

PAGE_STYLE = """
:root { color-scheme: light dark; --fg: #1b1b1b; --bg: #ffffff; --muted: #6b6b6b;
  --rule: #d9d9d9; --holds: #b3261e; --nearly: #8a5a00; --code: #f3f3f3; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6e6e6; --bg: #161616; --muted: #a0a0a0; --rule: #3a3a3a; --holds: #ff8a80;
    --nearly: #f5c242; --code: #242424; }
}
@media print { :root { --fg: #000; --bg: #fff; --code: #f3f3f3; } figure { break-inside: avoid; }
  details { display: block; } details > * { display: block; } }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg);
  max-width: 1000px; margin: 1.5em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid var(--rule);
  padding-bottom: 0.2em; margin-top: 1.8em; } .muted { color: var(--muted); }
table { border-collapse: collapse; margin: 0.4em 0 0.8em; } td, th { border-bottom: 1px solid
  var(--rule); padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
code, pre { background: var(--code); font: 12px ui-monospace, monospace; }
pre { padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
.status-holds { color: var(--holds); font-weight: 600; }
.status-nearly { color: var(--nearly); font-weight: 600; }
section.cause { border-left: 3px solid var(--rule); padding-left: 0.8em; margin: 1em 0; }
figure { margin: 1em 0 1.4em; } figure svg { max-width: 100%; height: auto; }
"""


def check_path(path: Path) -> None:
    """Raise ``ValueError`` (one line) unless ``path`` names a report diagnose can write."""
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"--report: {path} must end in .html or .md")
    if not path.parent.is_dir():
        raise ValueError(f"--report: directory {path.parent} does not exist")


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# --- what both formats say -----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One condition: the PromQL, the observed value, what it is compared with, the result."""

    expr: str
    observed: str
    against: str
    result: str


def condition_row(c: Condition) -> Row:
    if c.op is None:
        return Row(
            c.expr,
            "no data" if c.value is None else "present",
            "",
            "held" if c.holds else "no data",
        )
    if c.op == "unless":
        return Row(c.expr, "present", "", "excluded the alert")
    value = format_value("%.4g", c.value)
    threshold = format_value("%.4g", c.threshold)
    against = (
        f"{c.op} {c.threshold_expr} = {threshold}" if c.threshold_expr else f"{c.op} {threshold}"
    )
    if c.holds:
        result = "holds"
    elif c.nearly and c.gap is not None:
        result = f"does not hold: {100 * c.gap:.0f} % short"
    else:
        result = "does not hold"
    return Row(c.expr, value, against, result)


def _energy_lines(report: Report) -> list[str]:
    """One line per served model with an energy figure: what its tokens cost."""
    currency = report.cfg.cost.currency
    out = []
    for r in report.roofline:
        line = energy_line(r, currency)
        if line is not None:
            out.append(f"{' '.join(filter(None, (r.target, r.model)))}: {line}")
    return out


def ruled_out(report: Report) -> list[tuple[str, str]]:
    """Signatures evaluated with data that neither held nor nearly held: (alert, title)."""
    seen = {f.sig.alert for f in report.findings}
    skipped = set(report.not_evaluated) | set(report.no_data)
    return [
        (sig.alert, sig.title)
        for sig in all_signatures(report.cfg)
        if sig.alert not in seen and sig.alert not in skipped
    ]


def headline(report: Report) -> str:
    held = [f for f in report.findings if f.instance.holds]
    if held:
        lead = held[0]
        return f"{lead.sig.alert} on {lead.target}"
    if report.findings:
        return f"nothing holds; {report.findings[0].sig.alert} nearly holds"
    return "no bottleneck signature holds"


def _window(interval: Interval) -> str:
    length = duration(interval.end - interval.start)
    return f"{_iso(interval.start)} to {_iso(interval.end)} ({length})"


def chart_of(panel: Panel, tl: Timeline) -> Chart:
    bands = []
    baseline = tl.baseline
    if baseline is not None:
        bands.append(Band(baseline.start, baseline.end, "baseline", "baseline"))
    if tl.incident is not None:
        alert = tl.incident.alert
        bands += [Band(i.start, i.end, "incident", f"{alert} held") for i in tl.incident.held]
        bands += [Band(i.start, i.end, "firing", f"{alert} firing") for i in tl.incident.firing]
    threshold_label = ""
    if panel.threshold is not None:
        threshold_label = (
            f"{panel.spec.threshold_label} {format_tick(panel.threshold, panel.spec.unit)}"
        )
    return Chart(
        title=panel.spec.title,
        lines=[Line(s.name, s.points) for s in panel.series],
        start=tl.start,
        end=tl.end,
        unit=panel.spec.unit,
        stacked=panel.spec.stacked,
        bands=bands,
        threshold=panel.threshold,
        threshold_label=threshold_label,
        step=tl.step,
    )


def _stat(value: float | None, unit: str) -> str:
    return "-" if value is None else format_tick(value, unit)


def panel_rows(panel: Panel, tl: Timeline) -> Iterator[tuple[str, str, str, str]]:
    """(series, baseline mean, incident mean, last value) per series of a plot."""
    baseline, incident = tl.baseline, tl.incident
    for s in panel.series:
        base = s.mean(baseline.start, baseline.end) if baseline else None
        during = s.mean(incident.start, incident.end + tl.step) if incident else None
        last = s.points[-1][1] if s.points else None
        unit = panel.spec.unit
        yield s.name, _stat(base, unit), _stat(during, unit), _stat(last, unit)


def quality_lines(report: Report, tl: Timeline | None) -> list[str]:
    """The data-quality findings, one sentence each (plain text)."""
    out = []
    if tl is None:
        out.append(
            "No time series: plots and scrape history need --prometheus.url (--target samples "
            "one span)."
        )
    else:
        q = tl.quality
        for panel in tl.panels:
            out += [f"missing series: {query} ({panel.spec.title})" for query in panel.missing]
            if panel.more:
                out.append(f"{panel.spec.title}: {panel.more} more series not drawn")
        out += [f"scrape gap on {t}: {_window(i)}" for t, i in q.scrape_gaps]
        out += [f"target {t} down (up == 0): {_window(i)}" for t, i in q.down]
        out += [f"collector {c} failing on {t}: {_window(i)}" for t, c, i in q.failing]
        out += [f"could not read: {e}" for e in q.errors]
        if not q.targets:
            out.append("no scrape target (up) found for the window")
    out += [f"not evaluated: {alert}: {reason}" for alert, reason in report.not_evaluated.items()]
    out += [f"no data for {alert} (its inputs are absent)" for alert in report.no_data]
    out += [f"missing input: {line}" for line in report.missing_inputs]
    return out


def inputs(report: Report, tl: Timeline | None, config_text: str | None) -> list[tuple[str, str]]:
    rows = [
        ("source", f"{report.source} ({report.mode})"),
        ("evaluated at", _iso(report.evaluated_at)),
        ("profile", report.cfg.profile.name),
        ("nearly holds within", f"{100 * report.margin:g} % of a threshold"),
        ("alert rules checked", str(report.checked)),
    ]
    if report.mode == "target":
        rows.append(("samples", f"{report.samples} over {report.span:.0f} s"))
    if tl is not None:
        rows += [
            ("time range", f"{_iso(tl.start)} to {_iso(tl.end)} (step {duration(tl.step)})"),
            ("targets", ", ".join(tl.quality.targets) or "-"),
            ("queries narrowed to", ", ".join(f"{k}={v!r}" for k, v in tl.scope.items()) or "-"),
        ]
        if tl.baseline is not None:
            rows.append(("baseline", _window(tl.baseline)))
        if tl.incident is not None:
            held = "; ".join(_window(i) for i in tl.incident.held) or "-"
            firing = "; ".join(_window(i) for i in tl.incident.firing) or "-"
            rows.append((f"{tl.incident.alert} held", held))
            rows.append((f"{tl.incident.alert} fired", firing))
    rows.append(("site config", "defaults" if config_text is None else "below"))
    return rows


# --- HTML -----------------------------------------------------------------------------------------


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]], code_col: int = -1) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for row in rows:
        tds = "".join(
            f"<td><code>{_e(c)}</code></td>" if i == code_col else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        body.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _cause_html(rank: int, f: Finding, report: Report) -> str:
    summary, description = texts(f)
    state = f", alert {f.state}" if f.state else ""
    evidence = [(e.label, f"{e.text} {e.unit}".strip()) for e in f.evidence]
    rows = [condition_row(c) for c in f.instance.conditions]
    held = [(r.expr, r.observed, r.against, r.result) for r in rows if r.result in HELD]
    failed = [(r.expr, r.observed, r.against, r.result) for r in rows if r.result not in HELD]
    parts = [
        f'<section class="cause" data-alert="{_e(f.sig.alert)}" data-rank="{rank}" '
        f'data-status="{f.status}">',
        f'<h3>{rank}. {_e(f.sig.alert)} <span class="status-{f.status}">{f.status}</span> '
        f'<span class="muted">{_e(f.rule.severity)} · {_e(f.sig.family)}{_e(state)} · '
        f"{_e(f.target)}</span></h3>",
        f"<p><strong>{_e(summary)}</strong></p><p>{_e(description)}</p>",
    ]
    if evidence:
        parts.append(_table(("evidence", "value"), evidence))
    head = ("PromQL", "observed", "threshold", "result")
    if held:
        parts.append("<p>Observed against the thresholds:</p>" + _table(head, held, 0))
    if failed:
        parts.append("<p>Checked and did not hold:</p>" + _table(head, failed, 0))
    wait = f"fires after holding for {duration(f.rule.for_seconds)}; " if f.rule.for_seconds else ""
    url = runbook_url(report.cfg, f.sig.alert)
    parts += [
        f"<details><summary>The alert's PromQL</summary><pre>{_e(f.rule.expr)}</pre></details>",
        f'<p class="muted">{_e(wait)}runbook: <a href="{_e(url)}">{_e(url)}</a></p>',
        "</section>",
    ]
    return "".join(parts)


def _panel_html(panel: Panel, tl: Timeline, svg: str) -> str:
    rows = list(panel_rows(panel, tl))
    table = _table(("series", "baseline mean", "incident mean", "last"), rows) if rows else ""
    queries = "".join(
        f"<li><code>{_e(q)}</code></li>" for q in dict.fromkeys(s.query for s in panel.series)
    )
    missing = (
        f'<p class="muted">no data: {", ".join(f"<code>{_e(q)}</code>" for q in panel.missing)}</p>'
        if panel.missing
        else ""
    )
    return (
        f'<figure data-panel="{_e(panel.spec.key)}">{svg}{table}{missing}'
        f"<details><summary>PromQL</summary><ul>{queries}</ul></details></figure>"
    )


def as_html(report: Report, tl: Timeline | None, config_text: str | None = None) -> str:
    """The whole report as one HTML document."""
    held = sum(1 for f in report.findings if f.instance.holds)
    verdict = (
        f"{held} cause(s) hold, {len(report.findings) - held} nearly hold; "
        f"{report.checked} alert rules checked."
    )
    body = [
        f"<h1>Post-mortem: {_e(headline(report))}</h1>",
        f'<p class="muted">diagnose of {_e(report.source)} at {_e(_iso(report.evaluated_at))}, '
        f"profile {_e(report.cfg.profile.name)}</p>",
        '<h2 id="verdict">Verdict</h2>',
        f"<p>{_e(verdict)}</p>",
    ]
    advice = scaling_advice(report.findings)
    if advice:
        items = "".join(
            f'<li data-action="{_e(a.action)}">{_e(a.target)}: {_e(a.text())}</li>' for a in advice
        )
        body.append(f'<h3>Scaling advice</h3><ul id="scaling-advice">{items}</ul>')
    body += [_cause_html(rank, f, report) for rank, f in enumerate(report.findings, 1)]
    if not report.findings:
        body.append("<p>No signature holds or nearly holds.</p>")
    out = ruled_out(report)
    if out:
        items = "".join(f'<li>{_e(a)} <span class="muted">{_e(t)}</span></li>' for a, t in out)
        body.append(f'<h3>Checked and did not hold</h3><ul id="ruled-out">{items}</ul>')
    if report.roofline:
        items = "".join(
            f"<li>{_e(r.target)} {_e(r.model)}: {_e(roofline_summary(r))}</li>"
            for r in report.roofline
        )
        body.append(f"<h3>Roofline and latency budget now</h3><ul>{items}</ul>")
        energy = _energy_lines(report)
        if energy:
            items = "".join(f"<li>{_e(line)}</li>" for line in energy)
            body.append(f'<h3>Energy and cost per token now</h3><ul id="energy">{items}</ul>')
    if report.pools:
        items = "".join(
            f'<li data-pool="{_e(p.name)}">{_e(p.name)} {_e(p.model)}<ul>'
            + "".join(f"<li>{_e(line)}</li>" for line in pool_lines(p))
            + "</ul></li>"
            for p in report.pools
        )
        body.append(f'<h3>Latency budget per pool now</h3><ul id="pools">{items}</ul>')
    body.append('<h2 id="plots">The window</h2>')
    if tl is None:
        body.append("<p>No time series: plots need <code>--prometheus.url</code>.</p>")
    else:
        body.append(f"<p>{_e(_legend_text(tl))}</p>")
        body += [_panel_html(p, tl, render(chart_of(p, tl), width=940)) for p in tl.panels]
    body.append('<h2 id="data-quality">Data quality</h2>')
    lines = quality_lines(report, tl)
    body.append(
        "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>"
        if lines
        else "<p>No missing series, scrape gap or failing collector in the window.</p>"
    )
    body.append(
        '<h2 id="inputs">Inputs</h2>' + _table(("input", "value"), inputs(report, tl, config_text))
    )
    if config_text is not None:
        body.append(f"<pre>{_e(config_text)}</pre>")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Post-mortem: {_e(headline(report))}</title>"
        f"<style>{PAGE_STYLE}{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _legend_text(tl: Timeline) -> str:
    if tl.incident is None:
        return "No cause held in the window: nothing is shaded."
    base = "; blue, the baseline before it" if tl.baseline else ""
    fired = "; darker red, where its alert fired" if tl.incident.firing else ""
    return (
        f"Shaded red: where {tl.incident.alert}'s condition held{fired}{base}. "
        "Dashed: a signature's threshold."
    )


# --- Markdown -------------------------------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def as_markdown(
    report: Report, tl: Timeline | None, plot_dir: str, config_text: str | None = None
) -> tuple[str, dict[str, str]]:
    """The report as Markdown and its plots: ``{file name: standalone SVG}``."""
    files: dict[str, str] = {}
    held = sum(1 for f in report.findings if f.instance.holds)
    lines = [
        f"# Post-mortem: {headline(report)}",
        "",
        f"diagnose of {report.source} at {_iso(report.evaluated_at)}, profile "
        f"{report.cfg.profile.name}",
        "",
        "## Verdict",
        "",
        f"{held} cause(s) hold, {len(report.findings) - held} nearly hold; {report.checked} "
        "alert rules checked.",
        "",
    ]
    advice = scaling_advice(report.findings)
    if advice:
        lines += ["### Scaling advice", ""]
        lines += [f"- {_md(a.target)}: {_md(a.text())}" for a in advice] + [""]
    for rank, f in enumerate(report.findings, 1):
        lines += _cause_md(rank, f, report)
    if not report.findings:
        lines += ["No signature holds or nearly holds.", ""]
    out = ruled_out(report)
    if out:
        lines += ["### Checked and did not hold", ""]
        lines += [f"- {a}: {t}" for a, t in out] + [""]
    if report.roofline:
        lines += ["### Roofline and latency budget now", ""]
        lines += [f"- {r.target} {r.model}: {roofline_summary(r)}" for r in report.roofline] + [""]
        energy = _energy_lines(report)
        if energy:
            lines += ["### Energy and cost per token now", ""]
            lines += [f"- {line}" for line in energy] + [""]
    if report.pools:
        lines += ["### Latency budget per pool now", ""]
        for p in report.pools:
            lines.append(f"- {p.name} {p.model}")
            lines += [f"  - {line}" for line in pool_lines(p)]
        lines.append("")
    lines += ["## The window", ""]
    if tl is None:
        lines += ["No time series: plots need `--prometheus.url`.", ""]
    else:
        lines += [_legend_text(tl), ""]
        for i, panel in enumerate(tl.panels, 1):
            name = f"{i:02d}-{panel.spec.key}.svg"
            files[name] = render(chart_of(panel, tl), standalone=True)
            lines += [f"![{panel.spec.title}]({plot_dir}/{name})", ""]
            rows = list(panel_rows(panel, tl))
            if rows:
                lines += _md_table(("series", "baseline mean", "incident mean", "last"), rows)
            queries = dict.fromkeys(f"`{s.query}`" for s in panel.series)
            lines += [
                f"PromQL: {', '.join(queries)}",
                "",
            ]
    lines += ["## Data quality", ""]
    quality = quality_lines(report, tl)
    lines += (
        [f"- {q}" for q in quality]
        if quality
        else ["No missing series, scrape gap or failing collector in the window."]
    )
    lines += ["", "## Inputs", ""]
    lines += _md_table(("input", "value"), inputs(report, tl, config_text))
    if config_text is not None:
        lines += ["```yaml", config_text.rstrip("\n"), "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n", files


def _cause_md(rank: int, f: Finding, report: Report) -> list[str]:
    summary, description = texts(f)
    state = f", alert {f.state}" if f.state else ""
    lines = [
        f"### {rank}. {f.sig.alert} ({f.status}, {f.rule.severity}{state}) on {f.target}",
        "",
        f"**{summary}**",
        "",
        description,
        "",
    ]
    if f.evidence:
        lines += _md_table(
            ("evidence", "value"), [(e.label, f"{e.text} {e.unit}".strip()) for e in f.evidence]
        )
    rows = [condition_row(c) for c in f.instance.conditions]
    lines += _md_table(
        ("PromQL", "observed", "threshold", "result"),
        [(f"`{r.expr}`", r.observed, r.against, r.result) for r in rows],
    )
    lines += [
        "```promql",
        f.rule.expr,
        "```",
        "",
        f"runbook: {runbook_url(report.cfg, f.sig.alert)}",
        "",
    ]
    return lines


def write(
    path: Path, report: Report, tl: Timeline | None, config_text: str | None = None
) -> list[Path]:
    """Write the report (and, for Markdown, its plots); the paths written."""
    if path.suffix.lower() == ".html":
        path.write_text(as_html(report, tl, config_text), encoding="utf-8")
        return [path]
    plot_dir = path.with_name(path.stem + "-plots")
    text, files = as_markdown(report, tl, plot_dir.name, config_text)
    written = [path]
    if files:
        plot_dir.mkdir(exist_ok=True)
        for name, svg in files.items():
            (plot_dir / name).write_text(svg, encoding="utf-8")
            written.append(plot_dir / name)
    path.write_text(text, encoding="utf-8")
    return written
