"""What a person sees, in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) loads the post-mortem report and the sidecar's landing page, in light and dark
mode. No console error, no request beyond the page itself; the plots and sparklines render
with a size. Screenshots go to build/screenshots/ (docs/images/ holds copies for the README).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from support.incident import serve
from support.paths import ROOT, TRACE
from support.process import ExporterProcess

from exporter.diagnose.timeline import PANELS
from exporter.signatures.site import parse_config

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a browser that must not phone home or need a display or a GPU.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Visit:
    """A page opened in a fresh context: its console errors and every request it made."""

    def __init__(self, browser: Any, url: str, scheme: str, width: int = 1100) -> None:
        self.context = browser.new_context(
            viewport={"width": width, "height": 900}, color_scheme=scheme
        )
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(url, wait_until="load")

    def shot(self, name: str, **kw: Any) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / name
        self.page.screenshot(path=str(path), **kw)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rec = serve(parse_config({}), tmp_path_factory.mktemp("incident"))
    out = tmp_path_factory.mktemp("report") / "incident.html"
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter.cli",
                "diagnose",
                "--prometheus.url",
                rec.url,
                "--time",
                str(rec.end),
                "--report",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
    finally:
        rec.server.stop()
    assert result.returncode == 1, result.stderr
    return out


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_report_renders_offline(browser: Any, report: Path, scheme: str) -> None:
    visit = Visit(browser, report.as_uri(), scheme)
    try:
        assert visit.errors == []
        assert visit.requests == [report.as_uri()]
        charts = visit.page.locator("figure svg.chart")
        assert charts.count() == len(PANELS)
        for i in range(charts.count()):
            box = charts.nth(i).bounding_box()
            assert box is not None and box["width"] > 600 and box["height"] > 150
        # dark mode reaches the plots: the text colour follows the scheme
        fill = visit.page.evaluate(
            "getComputedStyle(document.querySelector('svg.chart text')).fill"
        )
        assert fill == ("rgb(230, 230, 230)" if scheme == "dark" else "rgb(27, 27, 27)")
        visit.shot(f"report-verdict-{scheme}.png", clip=_below(visit.page, "h1", 1100))
        visit.page.locator("#plots").scroll_into_view_if_needed()
        visit.shot(
            f"report-plots-{scheme}.png", clip=_below(visit.page, "#plots", 1300), full_page=True
        )
    finally:
        visit.close()


def _below(page: Page, selector: str, height: int) -> dict[str, float]:
    top = page.evaluate(
        f"document.querySelector('{selector}').getBoundingClientRect().top + scrollY"
    )
    return {"x": 0, "y": top - 10, "width": 1100, "height": height}


def test_report_prints(browser: Any, report: Path) -> None:
    visit = Visit(browser, report.as_uri(), "light")
    try:
        pdf = visit.page.pdf(format="A4")
        assert pdf.startswith(b"%PDF") and len(pdf) > 20_000
    finally:
        visit.close()


def test_landing_page(browser: Any, exporter_process: Callable[..., ExporterProcess]) -> None:
    proc = exporter_process("--gpu.replay-file", str(TRACE), "--no-collector.engine")
    proc.wait_ready()
    for _ in range(3):
        proc.get("/metrics")
    visit = Visit(browser, proc.base + "/", "light", width=900)
    try:
        assert visit.errors == []
        assert visit.requests == [proc.base + "/"]
        sparks = visit.page.locator("#history svg.spark")
        assert sparks.count() >= 1
        box = sparks.first.bounding_box()
        assert box is not None and box["width"] > 100
        visit.shot("landing.png", full_page=True)
    finally:
        visit.close()
