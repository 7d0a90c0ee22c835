"""``diagnose --report``: the post-mortem of a recorded incident, from a real Prometheus.

Each incident (:mod:`support.incident`: frontend-gil, tokenizer-slow and softirq look-alikes,
hand-written records backfilled with promtool) is diagnosed through the real CLI at its last
minute; the HTML and Markdown reports are parsed and checked: the causes in the verdict's
order, every plot drawn with data, the shaded windows where the cause held and where its
alert fired, the data-quality faults, the inputs. One-line errors for bad ``--report`` paths and ``--time``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support.incident import (
    COLLECTOR_FAILS,
    GAP,
    INCIDENT_AT,
    LEAD,
    MINUTES,
    SCENARIOS,
    SCRAPE_S,
    START,
    Recorded,
    run_diagnose,
    serve,
)
from support.paths import TRACE
from support.process import ExporterProcess

from exporter.diagnose.timeline import PANELS
from exporter.signatures.signals.cpu_signals import SOFTIRQ_HOTTEST_CORE
from exporter.signatures.site import parse_config

PROG = "inference-bottleneck-exporter diagnose"
ORDER = list(SCENARIOS["frontend-gil"].order)


diagnose = run_diagnose


def render(rec: Recorded, out: Path) -> str:
    result = diagnose("--prometheus.url", rec.url, "--time", str(rec.end), "--report", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == ""
    return out.read_text()


@pytest.fixture(scope="module")
def html_report(recorded: Recorded, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The frontend-gil incident's report."""
    return render(recorded, tmp_path_factory.mktemp("report") / "incident.html")


@pytest.fixture(scope="module")
def reports(html_report: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every incident's report, by scenario."""
    out = {"frontend-gil": html_report}
    for name, scenario in SCENARIOS.items():
        if name in out:
            continue
        rec = serve(parse_config({}), tmp_path_factory.mktemp(name), scenario)
        try:
            out[name] = render(rec, tmp_path_factory.mktemp(f"{name}-report") / "incident.html")
        finally:
            rec.server.stop()
    return out


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Elements:
    parser = Elements()
    parser.feed(page)
    return parser


def figures(page: str) -> dict[str, str]:
    """Each plot's HTML by its panel key."""
    return dict(re.findall(r'<figure data-panel="([a-z]+)">(.*?)</figure>', page, re.S))


def at_minute(minute: float) -> float:
    return START + minute * 60


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_verdict_ranks_the_causes(reports: dict[str, str], name: str) -> None:
    causes = [a for t, a in parse(reports[name]).tags if t == "section" and "data-alert" in a]
    held = [a["data-alert"] for a in causes if a["data-status"] == "holds"]
    assert held == list(SCENARIOS[name].order)
    assert [a["data-rank"] for a in causes] == [str(i) for i in range(1, len(causes) + 1)]


def test_verdict_comes_first(html_report: str) -> None:
    assert html_report.index('id="verdict"') < html_report.index('id="plots"')
    assert html_report.index('id="plots"') < html_report.index('id="data-quality"')
    assert html_report.index('id="data-quality"') < html_report.index('id="inputs"')
    assert "<title>Post-mortem: InferenceGPUStarvedQueueGrowing on 10.0.3.7:10960</title>" in (
        html_report
    )


def test_energy_and_cost_per_token_now(
    html_report: str, recorded: Recorded, tmp_path: Path
) -> None:
    """The incident's energy records (no price in its site config: no cost figures) make one
    line per served model, in the page and in the Markdown."""
    line = (
        "10.0.3.7:10960: energy: 0.85 J per generated token, 0.04 J per prompt token "
        "(1200 W, 12 % of the energy idle)"
    )
    energy = re.search(r'<ul id="energy"><li>(.*?)</li></ul>', html_report)
    assert energy, "no energy section"
    assert energy[1] == line
    assert html_report.index('id="energy"') < html_report.index('id="plots"')
    out = tmp_path / "incident.md"
    result = diagnose(
        "--prometheus.url", recorded.url, "--time", str(recorded.end), "--report", str(out)
    )
    assert result.returncode == 1, result.stderr
    assert f"### Energy and cost per token now\n\n- {line}\n" in out.read_text()


def test_each_cause_shows_observed_against_threshold_and_its_promql(html_report: str) -> None:
    lead = html_report.split(f'data-alert="{LEAD}"')[1].split("</section>", maxsplit=1)[0]
    # the observed value, the threshold and the PromQL of each condition
    assert re.search(
        r"<code>inference:gpu_own_utilization:mean5m</code></td><td>0\.4</td><td>&lt; 0\.6</td>"
        r"<td>holds</td>",
        lead,
    ), lead
    assert "<code>inference:queue_depth:sum</code></td><td>21</td><td>&gt;= 1</td>" in lead
    assert "alert firing" in lead
    assert "inference:gpu_own_utilization:mean5m &lt; 0.6" in lead  # the alert's expression
    assert "Mean GPU utilisation 40 % (below 60 %)" in lead
    # counter-evidence: signatures checked with data that did not hold
    ruled = html_report.split('id="ruled-out"')[1].split("</ul>", maxsplit=1)[0]
    for alert in ("InferenceTokenizerSlowerThanDecode", "InferenceDecodeOverheadBound"):
        assert alert in ruled
    assert LEAD not in ruled


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_plot_is_drawn_with_data(reports: dict[str, str], name: str) -> None:
    plots = figures(reports[name])
    assert list(plots) == [p.key for p in PANELS]
    # 40 minutes in a 1h window at 15 s: about 160 points per series
    for key, body in plots.items():
        counts = [int(n) for n in re.findall(r'data-points="(\d+)"', body)]
        assert counts, key
        assert min(counts) > 100, (key, counts)
    names = {key: re.findall(r'data-series="([^"]+)"', body) for key, body in plots.items()}
    assert names["budget"] == ["queue", "prefill", "decode", "host"]
    assert names["tokenizer"] == ["tokenizer", "decode step"]
    absent = SOFTIRQ_HOTTEST_CORE in SCENARIOS[name].absent
    assert names["softirq"] == (["node"] if absent else ["node", "busiest core"])
    assert 'data-threshold="0.9"' in plots["thread"]
    assert 'data-threshold="0.33"' in plots["roofline"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_shading_where_the_cause_held_and_its_alert_fired(
    reports: dict[str, str], name: str
) -> None:
    scenario = SCENARIOS[name]
    for key, body in figures(reports[name]).items():
        bands = {
            kind: (float(a), float(b))
            for kind, a, b in re.findall(
                r'<rect class="(\w+)" data-start="([\d.]+)" data-end="([\d.]+)"', body
            )
        }
        fired = scenario.firing_at is not None
        assert set(bands) == {"baseline", "incident", *(["firing"] if fired else [])}, key
        # The condition held from the incident's start (within one plot step: the records
        # change at minute 20), the alert fired from when ALERTS says so.
        held_from, held_to = bands["incident"]
        assert at_minute(INCIDENT_AT) <= held_from <= at_minute(INCIDENT_AT) + 60, key
        assert held_to >= at_minute(MINUTES) - SCRAPE_S
        if scenario.firing_at is not None:
            fired_from, fired_to = bands["firing"]
            assert abs(fired_from - at_minute(scenario.firing_at)) <= SCRAPE_S, key
            assert fired_to >= at_minute(MINUTES) - SCRAPE_S
        assert bands["baseline"] == (at_minute(-20), held_from)


def test_baseline_and_incident_means_tell_the_story(html_report: str) -> None:
    thread = figures(html_report)["thread"]
    row = re.search(r"<td>busiest thread</td><td>([^<]+)</td><td>([^<]+)</td>", thread)
    assert row is not None
    assert (row[1], row[2]) == ("45 %", "98 %")
    gpu = figures(html_report)["gpu"]
    assert "<td>utilisation</td><td>85 %</td><td>40 %</td>" in gpu


def test_data_quality_and_inputs(html_report: str) -> None:
    quality = html_report.split('id="data-quality"')[1].split('id="inputs"', maxsplit=1)[0]

    def clock(minute: float) -> str:
        return dt.datetime.fromtimestamp(at_minute(minute), dt.UTC).strftime("%H:%M")

    assert re.search(rf"scrape gap on 10\.0\.3\.7:10960: 2026-03-02 03:0{GAP[0] - 1}:45", quality)
    assert (
        f"collector tokenizer failing on 10.0.3.7:10960: 2026-03-02 {clock(COLLECTOR_FAILS[0])}"
        in quality
    )
    assert "missing series: inference:cpu_softirq_hottest_core:mean5m" in quality
    inputs = html_report.split('id="inputs"')[1]
    assert "2026-03-02 02:40:00 UTC to 2026-03-02 03:40:00 UTC" in inputs
    assert "<td>targets</td><td>10.0.3.7:10960</td>" in inputs
    assert "<td>site config</td><td>defaults</td>" in inputs


def test_self_contained(html_report: str) -> None:
    tags = parse(html_report).tags
    assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe", "object")]
    assert not re.search(r"""(src|href)=["']?(?!https://github\.com/)[a-z]+:""", html_report)
    assert "url(" not in html_report and "@import" not in html_report
    csp = next(a["content"] for t, a in tags if a.get("http-equiv") == "Content-Security-Policy")
    assert csp.startswith("default-src 'none'")
    assert "prefers-color-scheme: dark" in html_report and "@media print" in html_report


def test_markdown_with_svg_files(recorded: Recorded, tmp_path: Path) -> None:
    out = tmp_path / "incident.md"
    config = tmp_path / "site.yaml"
    config.write_text(
        "# the defaults, written out\nrunbook_url: https://runbooks.example/{alertname}\n"
    )
    result = diagnose(
        "--prometheus.url",
        recorded.url,
        "--time",
        dt.datetime.fromtimestamp(recorded.end, dt.UTC).isoformat(),
        "--config",
        str(config),
        "--report",
        str(out),
        "--output",
        "json",
    )
    assert result.returncode == 1, result.stderr
    ranked = [f["alert"] for f in json.loads(result.stdout)["findings"]]
    assert ranked == ORDER
    text = out.read_text()
    headings = re.findall(r"^### \d\. (\w+)", text, re.M)
    assert headings == ORDER
    images = re.findall(r"!\[[^\]]*\]\((incident-plots/[\w.-]+\.svg)\)", text)
    assert len(images) == len(PANELS)
    for image in images:
        svg = (tmp_path / image).read_text()
        assert svg.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns=')
        assert "<style>" in svg and "prefers-color-scheme: dark" in svg
        assert 'class="firing"' in svg
    assert "runbook: https://runbooks.example/InferenceGPUStarvedQueueGrowing" in text
    assert "```yaml\n# the defaults, written out" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--report", "x.pdf"), "--report: x.pdf must end in .html or .md"),
        (
            ("--report", "/nonexistent/dir/x.html"),
            "--report: directory /nonexistent/dir does not exist",
        ),
        (("--time", "yesterday"), "--time: 'yesterday' is neither RFC 3339 nor Unix seconds"),
        (("--time", "2026-03-02T03:00:00"), "--time: '2026-03-02T03:00:00' needs a time zone"),
        (("--report", "x.html", "--report.range", "0s"), "--report.range: must be longer than 0s"),
    ],
)
def test_bad_flags_one_line(recorded: Recorded, args: tuple[str, ...], message: str) -> None:
    result = diagnose("--prometheus.url", recorded.url, *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{PROG}: error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1


def test_target_mode_report_has_the_verdict_and_says_why_no_plots(
    exporter_process: Callable[..., ExporterProcess], tmp_path: Path
) -> None:
    proc = exporter_process("--gpu.replay-file", str(TRACE), "--no-collector.engine")
    proc.wait_ready()
    out = tmp_path / "target.html"
    result = diagnose(
        "--target", proc.base, "--duration", "2s", "--interval", "1s", "--report", str(out)
    )
    assert result.returncode in (0, 1), result.stderr
    page = out.read_text()
    assert f"diagnose of {proc.base}/metrics at " in page
    assert 'id="verdict"' in page and "<figure" not in page
    assert "No time series: plots need <code>--prometheus.url</code>." in page
    assert "<td>samples</td><td>3 over 2 s</td>" in page
