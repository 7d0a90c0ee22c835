"""Structured logging in logfmt (default) or JSON, one line per event, to stderr; a fault
cannot flood it.

Every line of every logger (ours, aiohttp's, asyncio's) goes through :class:`LimitingHandler`:

* a line that repeats (same logger, level, message and error) is written once; its repeats
  within the next :data:`INTERVAL_S` are counted and written as one summary line with
  ``repeated=N`` at the end of the interval, and again each interval while it goes on;
* lines of one kind (the same format string with other values: a review per pod, a failing
  collector per name) are written up to :data:`SIMILAR_PER_INTERVAL` per interval, the rest
  summarised the same way with ``similar=N``;
* whatever gets through, at most :data:`LINES_PER_INTERVAL` lines are written per interval; the
  rest are dropped and counted in one line with ``dropped=N``.

So under any fault the log grows by at most ``LINES_PER_INTERVAL + 1`` lines a minute, and a
summary says what was held back. Summaries are written on the next line logged or on
:func:`tick` (the servers call it every second) and on shutdown.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
LEVEL_NAMES = tuple(_LEVELS)
_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warn",
    logging.ERROR: "error",
}
#: The summary interval, and the window of every limit below.
INTERVAL_S = 60.0
#: Lines of one format string (with different values) written per interval.
SIMILAR_PER_INTERVAL = 10
#: All lines written per interval, summaries included; then one ``dropped=N`` line.
LINES_PER_INTERVAL = 120
#: Repeating lines tracked at once; lines past it count as dropped (bounds the memory).
MAX_TRACKED = 2048
# What a summary record carries, as the formatters write it.
_SUMMARY_FIELDS = ("repeated", "similar", "dropped", "interval")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    fields: dict[str, Any] = {
        "ts": f"{ts}.{int(record.msecs):03d}Z",
        "level": _NAMES.get(record.levelno, record.levelname.lower()),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    error = _error(record)
    if error:
        fields["err"] = error
    for name in _SUMMARY_FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            fields[name] = value
    return fields


def _error(record: logging.LogRecord) -> str:
    if record.exc_info and record.exc_info[1] is not None:
        return f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
    return ""


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), sort_keys=False)


@dataclass
class _Held:
    """What one key (a line, or a kind of line) has held back in its current interval."""

    ends: float
    count: int = 0
    written: int = 0
    last: logging.LogRecord | None = None


def _interval_text(seconds: float) -> str:
    return f"{seconds:g}s" if seconds < 60 or seconds % 60 else f"{seconds / 60:g}m"


class LimitingHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes a repeating line once, then a count per interval (see the
    module's docstring). Thread-safe: :meth:`emit` runs under the handler's lock, and so does
    :meth:`tick`."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        interval: float = INTERVAL_S,
        similar: int = SIMILAR_PER_INTERVAL,
        lines: int = LINES_PER_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(stream)
        self.interval = interval
        self.similar = similar
        self.lines = lines
        self._clock = clock
        self._exact: dict[tuple[Any, ...], _Held] = {}
        self._kinds: dict[tuple[Any, ...], _Held] = {}
        self._budget = _Held(ends=clock() + interval)
        self._next_due = float("inf")

    # --- the decision, under the lock --------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        now = self._clock()
        if now >= self._next_due or now >= self._budget.ends:
            self._summarise(now)
        if self._admit(record, now):
            self._write(record)

    def _admit(self, record: logging.LogRecord, now: float) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the formatter report it as logging does
            return True
        exact = (record.name, record.levelno, message, _error(record))
        held = self._exact.get(exact)
        if held is not None:
            held.count += 1
            held.last = record
            return False
        kind = (record.name, record.levelno, str(record.msg))
        family = self._kinds.get(kind)
        if family is None:
            if len(self._kinds) >= MAX_TRACKED:
                self._budget.count += 1
                return False
            family = self._kinds[kind] = _Held(ends=now + self.interval)
            self._next_due = min(self._next_due, family.ends)
        if family.written >= self.similar:
            family.count += 1
            family.last = record
            return False
        if len(self._exact) >= MAX_TRACKED:
            self._budget.count += 1
            return False
        family.written += 1
        self._exact[exact] = _Held(ends=now + self.interval)
        self._next_due = min(self._next_due, now + self.interval)
        return True

    def _write(self, record: logging.LogRecord, *, lines: int = 1, always: bool = False) -> None:
        """Write ``record`` within the budget; else count the ``lines`` it stands for as
        dropped."""
        if not always and self._budget.written >= self.lines:
            self._budget.count += lines
            return
        self._budget.written += 1
        super().emit(record)

    def _summary(self, held: _Held, field: str) -> None:
        assert held.last is not None
        record = logging.makeLogRecord(held.last.__dict__)
        record.created = time.time()
        record.msecs = (record.created % 1) * 1000
        setattr(record, field, held.count)
        record.interval = _interval_text(self.interval)
        self._write(record, lines=held.count)

    def _summarise(self, now: float, *, final: bool = False) -> None:
        """Write the summaries of every interval that has ended (all of them if ``final``),
        after the count of the last interval's dropped lines; a key that held nothing back is
        forgotten, one that did starts a new interval. Each table is in the order its
        intervals end (a renewed key moves to the end)."""
        if now >= self._budget.ends or final:
            self._roll_budget(now)
        for table, field in ((self._exact, "repeated"), (self._kinds, "similar")):
            while table:
                key, held = next(iter(table.items()))
                if held.ends > now and not final:
                    break
                del table[key]
                if held.count:
                    self._summary(held, field)
                    if not final:
                        table[key] = _Held(ends=now + self.interval)
        self._next_due = min(
            (next(iter(table.values())).ends for table in (self._exact, self._kinds) if table),
            default=float("inf"),
        )
        if final and self._budget.count:
            self._roll_budget(now)

    def _roll_budget(self, now: float) -> None:
        """A new interval's budget, after one line with the count of the lines dropped."""
        dropped = self._budget.count
        self._budget = _Held(ends=now + self.interval)
        if dropped:
            record = logging.LogRecord(
                __name__,
                logging.WARNING,
                __file__,
                0,
                "log lines dropped: more than %d in %s",
                (self.lines, _interval_text(self.interval)),
                None,
            )
            record.dropped = dropped
            self._write(record, always=True)

    # --- from outside ------------------------------------------------------------------------
    def tick(self) -> None:
        """Write the summaries that are due."""
        self.acquire()
        try:
            now = self._clock()
            if now >= self._next_due or now >= self._budget.ends:
                self._summarise(now)
        finally:
            self.release()

    def close(self) -> None:
        """Write every pending summary, then close."""
        self.acquire()
        try:
            self._summarise(self._clock(), final=True)
        finally:
            self.release()
        super().close()


def tick() -> None:
    """Write the repeat summaries that are due, on every limiting handler of the root logger."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LimitingHandler):
            handler.tick()


def setup(level: str, fmt: str, stream: TextIO | None = None) -> LimitingHandler:
    """Route the ``exporter`` loggers (and aiohttp's and asyncio's) to ``stream`` in the chosen
    format, through a :class:`LimitingHandler`, which is returned."""
    handler = LimitingHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, LimitingHandler):
            old.close()
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    # A full disk or a closed stderr must not print tracebacks (to that same stream) or stop
    # anything: the record is dropped.
    logging.raiseExceptions = False
    # aiohttp's access log is noise at one scrape every few seconds.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return handler
