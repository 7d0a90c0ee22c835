"""The demo's screen: one terminal page that redraws in place (``rich``), telling the story.

From the top: what runs where; sparklines of the last minutes (GPU utilisation, queue, the
busiest engine thread, tokenizer against a decode step, client latency); the signatures
Prometheus evaluates (state, since when, the reason wrapped at word boundaries); the last
page. :func:`lines` lays it out for any size from 80x24 up: every line fits the width, the
whole fits the height, and a larger terminal gets longer sparklines, full addresses and
whole reasons. Keys: ``q`` quits, ``d`` runs ``diagnose`` and shows its verdict in place of
the signatures.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import termios
import textwrap
import time
import tty
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from exporter.diagnose.diagnosis import Report
from exporter.diagnose.errors import DiagnoseError
from exporter.diagnose.report import texts

BLOCKS = "▁▂▃▄▅▆▇█"
HISTORY = 600  # readings kept per sparkline: 20 minutes at the default 2 s refresh
MIN_WIDTH, MIN_HEIGHT = 80, 24


@dataclass(frozen=True)
class Gauge:
    """One sparkline: its label, how its numbers read, and its scale (None: its own max)."""

    key: str
    label: str
    unit: str  # "ratio", "seconds" or "count"
    top: float | None = None


GAUGES: tuple[Gauge, ...] = (
    Gauge("gpu", "GPU util", "ratio", 1.0),
    Gauge("queue", "queue", "count"),
    Gauge("thread", "busiest thread", "ratio", 1.0),
    Gauge("tokenizer", "tokenizer", "seconds"),
    Gauge("decode", "decode step", "seconds"),
    Gauge("latency", "client p50", "seconds"),
)
# The tokenizer and the decode step share one scale, so the two lines compare.
SHARED_SCALE = {"tokenizer": ("tokenizer", "decode"), "decode": ("tokenizer", "decode")}


@dataclass(frozen=True)
class Alert:
    state: str  # firing or pending
    severity: str
    name: str
    since: str  # HH:MM:SS UTC
    reason: str


@dataclass
class ScreenState:
    """Everything the screen shows; the demo fills it at each refresh."""

    title: str
    places: list[tuple[str, str, str]]  # (what, short address, full address)
    gpu: str
    history: dict[str, deque[float | None]] = field(
        default_factory=lambda: {g.key: deque(maxlen=HISTORY) for g in GAUGES}
    )
    load: str = ""
    alerts: list[Alert] | None = None  # None: no Prometheus
    alerts_note: str = ""
    page: str = "none yet"
    verdict: list[str] | None = None  # shown instead of the signatures after `d`
    status: str = ""

    def record(self, reading: dict[str, float | None]) -> None:
        for gauge in GAUGES:
            value = reading.get(gauge.key)
            ok = value is not None and math.isfinite(value)
            self.history[gauge.key].append(value if ok else None)


def sparkline(values: Sequence[float | None], width: int, top: float | None = None) -> str:
    """The last ``width`` values as block characters (a space for no value), scaled to
    ``top`` (default: their maximum); right-aligned so the newest is at the right edge."""
    tail = list(values)[-width:] if width > 0 else []
    finite = [v for v in tail if v is not None]
    scale = top if top is not None else max(finite, default=0.0)
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        elif scale <= 0:
            out.append(BLOCKS[0])
        else:
            level = min(max(v / scale, 0.0), 1.0)
            out.append(BLOCKS[min(int(level * len(BLOCKS)), len(BLOCKS) - 1)])
    return "".join(out).rjust(width)


def reading_text(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ratio":
        return f"{100 * value:.0f} %"
    if unit == "seconds":
        return f"{1000 * value:.1f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.0f}"


def _last(values: Iterable[float | None]) -> float | None:
    found = None
    for v in values:
        if v is not None:
            found = v
    return found


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _wrap(text: str, width: int, max_lines: int) -> list[str]:
    """``text`` wrapped at word boundaries; past ``max_lines`` the last line ends in '…'."""
    lines = textwrap.wrap(text, width=max(width, 10), break_long_words=True) or [""]
    if len(lines) <= max_lines:
        return lines
    kept = lines[:max_lines]
    last = kept[-1]
    while len(last) + 2 > width and " " in last:
        last = last.rsplit(" ", 1)[0]
    kept[-1] = last + " …"
    return kept


def _header(state: ScreenState, width: int, roomy: bool) -> list[Text]:
    out = [Text(_fit(state.title, width), style="bold")]
    if roomy:
        for what, _, full in state.places:
            out.append(Text(_fit(f" {what:<12} {full}", width)))
        out.append(Text(_fit(f" {'GPU':<12} {state.gpu}", width)))
    else:
        where = " · ".join(f"{what} {short}" for what, short, _ in state.places)
        out.append(Text(_fit(f" {where}", width), style="dim"))
        out.append(Text(_fit(f" GPU: {state.gpu}", width), style="dim"))
    return out


def _sparks(state: ScreenState, width: int) -> list[Text]:
    label_w, value_w = 17, 10
    spark_w = max(width - label_w - value_w - 2, 10)
    out = []
    for gauge in GAUGES:
        values = state.history[gauge.key]
        top = gauge.top
        if gauge.key in SHARED_SCALE:
            shared = [v for k in SHARED_SCALE[gauge.key] for v in state.history[k] if v is not None]
            top = max(shared, default=0.0)
        line = Text(f" {gauge.label:<{label_w - 1}}", style="bold")
        line.append(sparkline(values, spark_w, top), style="cyan")
        line.append(f" {reading_text(_last(values), gauge.unit):>{value_w}}")
        out.append(line)
    return out


STATE_STYLE = {"firing": "bold red", "pending": "yellow"}


def _signatures(state: ScreenState, width: int, room: int) -> list[Text]:
    """The signatures (or the verdict) in at most ``room`` lines."""
    if state.verdict is not None:
        out = [Text(" diagnose (d):", style="bold")]
        out += [Text(_fit(f" {line}", width)) for line in state.verdict]
        return out[:room]
    if state.alerts is None:
        return [Text(_fit(f" signatures: {state.alerts_note}", width), style="dim")][:room]
    if not state.alerts:
        note = state.alerts_note or "none pending or firing"
        return [Text(_fit(f" signatures: {note}", width))][:room]
    out = [Text(" state    since     signature", style="bold")]
    per_reason = max(1, (room - 1 - len(state.alerts)) // max(len(state.alerts), 1))
    indent = 20
    for i, alert in enumerate(state.alerts):
        left = room - len(out)
        if left <= 0:
            break
        rest = len(state.alerts) - i
        if left == 1 and rest > 1:
            out.append(Text(f" … {rest} more", style="dim"))
            break
        row = Text(f" {alert.state:<8} ", style=STATE_STYLE.get(alert.state, ""))
        row.append(f"{alert.since:<9} ")
        row.append(_fit(f"{alert.name} ({alert.severity})", width - indent), style="bold")
        out.append(row)
        lines = min(per_reason, room - len(out) - (rest - 1))
        if lines > 0 and alert.reason:
            out += [
                Text(" " * indent + line, style="dim")
                for line in _wrap(alert.reason, width - indent, lines)
            ]
    return out


def lines(state: ScreenState, width: int, height: int) -> list[Text]:
    """The screen for a terminal of ``width`` x ``height`` (at least 80x24): at most
    ``height`` lines, none wider than ``width`` cells."""
    width, height = max(width, MIN_WIDTH), max(height, MIN_HEIGHT)
    roomy = height >= 34
    top = _header(state, width, roomy)
    top.append(Text(""))
    top += _sparks(state, width)
    top.append(Text(_fit(f" load: {state.load}", width), style="dim"))
    top.append(Text(""))
    bottom = [Text(_fit(f" last page: {state.page}", width))]
    keys = "q quits · d runs diagnose"
    status = f"{state.status} · {keys}" if state.status else keys
    bottom.append(Text(_fit(f" {status}", width), style="dim"))
    room = height - len(top) - len(bottom)
    middle = _signatures(state, width, room)
    middle += [Text("")] * (room - len(middle))
    return top + middle + bottom


def renderable(state: ScreenState, width: int, height: int) -> Text:
    """:func:`lines` joined into one ``rich`` text."""
    return Text("\n").join(lines(state, width, height))


# --- the live screen -------------------------------------------------------------------------


VERDICT_SHOWN_S = 60.0


def verdict_lines(report: Report) -> list[str]:
    """A diagnosis in a few lines: the count, then each ranked finding and its summary."""
    held = sum(1 for f in report.findings if f.instance.holds)
    out = [f"{held} hold, {len(report.findings) - held} nearly hold ({report.checked} rules)"]
    for rank, f in enumerate(report.findings, 1):
        out.append(f"{rank}. {f.status.upper():<6} {f.rule.severity:<8} {f.sig.alert}")
        out.append(f"   {texts(f)[0]}")
    return out


class ScreenView:
    """The screen on a terminal: redrawn in place on the alternate screen, keys read from
    stdin in cbreak mode (Ctrl-C still stops); :meth:`close` gives the terminal back."""

    def __init__(self, state: ScreenState) -> None:
        self.state = state
        self.console = Console()
        self.live = Live(
            console=self.console,
            screen=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.live.start()
        self._fd: int | None = None
        self._saved: list[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._diagnose: Callable[[], Awaitable[Report]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._verdict_until = 0.0

    def attach(
        self,
        loop: asyncio.AbstractEventLoop,
        stop: asyncio.Event,
        diagnose: Callable[[], Awaitable[Report]] | None,
    ) -> None:
        """Read keys on ``loop``: ``q`` sets ``stop``, ``d`` runs ``diagnose``."""
        self._loop, self._stop, self._diagnose = loop, stop, diagnose
        if sys.stdin.isatty():
            self._fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
            loop.add_reader(self._fd, self._key)

    def _key(self) -> None:
        assert self._fd is not None and self._stop is not None and self._loop is not None
        keys = os.read(self._fd, 64).decode("utf-8", errors="ignore").lower()
        if "q" in keys:
            self._stop.set()
        elif "d" in keys and (self._task is None or self._task.done()):
            self._task = self._loop.create_task(self._run_diagnose())

    async def _run_diagnose(self) -> None:
        if self._diagnose is None:
            self.state.status = "d needs Prometheus (make tools)"
            self.draw()
            return
        self.state.status = "diagnose running..."
        self.draw()
        try:
            report = await self._diagnose()
        except DiagnoseError as err:
            self.state.verdict = [f"diagnose: {err}"]
        else:
            self.state.verdict = verdict_lines(report)
        self._verdict_until = time.monotonic() + VERDICT_SHOWN_S
        self.state.status = f"verdict of {time.strftime('%H:%M:%S')}"
        self.draw()

    def update(
        self,
        reading: dict[str, float | None],
        *,
        load: str,
        alerts: list[dict[str, Any]] | None,
        page: tuple[int, str],
        stopped: str,
    ) -> None:
        state = self.state
        state.record(reading)
        state.load = load
        if alerts is not None:
            state.alerts = [_alert(a) for a in alerts]
            state.alerts_note = ""
        elif state.alerts is not None:
            state.alerts_note = "Prometheus not answering"
            state.alerts = []
        count, text = page
        state.page = f"{text} ({count} sent)" if count else "none yet"
        if stopped:
            state.status = f"STOPPED: {stopped}"
        if state.verdict is not None and time.monotonic() > self._verdict_until:
            state.verdict = None
            state.status = ""
        self.draw()

    def draw(self) -> None:
        # The terminal's own size, read each time (a resized window redraws to fit): COLUMNS
        # and LINES in the environment, which rich would prefer, are often stale.
        try:
            width, height = os.get_terminal_size(sys.stdout.fileno())
        except (OSError, ValueError):
            width, height = self.console.size
        self.console.size = (width, height)
        self.live.update(renderable(self.state, width, height), refresh=True)

    def close(self) -> None:
        if self._fd is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            if self._saved is not None:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._fd = None
        self.live.stop()


def _alert(a: dict[str, Any]) -> Alert:
    labels = a.get("labels", {})
    return Alert(
        state=str(a.get("state", "")),
        severity=str(labels.get("severity", "")),
        name=str(labels.get("alertname", "")),
        since=str(a.get("activeAt", ""))[11:19],
        reason=str(a.get("annotations", {}).get("description", "")),
    )
