"""Structured logging in logfmt (default) or JSON, one line per event, to stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
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


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    fields: dict[str, Any] = {
        "ts": f"{ts}.{int(record.msecs):03d}Z",
        "level": _NAMES.get(record.levelno, record.levelname.lower()),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    if record.exc_info and record.exc_info[1] is not None:
        fields["err"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
    return fields


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


def setup(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Route the ``exporter`` loggers (and aiohttp's) to ``stream`` in the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    # A full disk or a closed stderr must not print tracebacks (to that same stream) or stop
    # anything: the record is dropped.
    logging.raiseExceptions = False
    # aiohttp's access log is noise at one scrape every few seconds.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
