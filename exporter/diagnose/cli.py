"""``inference-bottleneck-exporter diagnose``: flags, checks on them, exit codes.

What the subcommand does is described in :mod:`exporter.diagnose`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from exporter.config import EXIT_USAGE, ArgumentParser, parse_duration
from exporter.diagnose.datasources import metrics_url
from exporter.diagnose.diagnosis import Report
from exporter.diagnose.errors import DiagnoseError
from exporter.diagnose.evaluate import diagnose_prometheus, diagnose_target
from exporter.diagnose.postmortem import check_path, write
from exporter.diagnose.report import as_json, as_text
from exporter.signatures.site import ALL_PROFILES, SignatureConfigError, load_config

PROG = "inference-bottleneck-exporter diagnose"
EXIT_NONE, EXIT_FOUND, EXIT_ERROR = 0, 1, EXIT_USAGE


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description=(
            "Rank the bottleneck signatures that hold (or nearly hold) now, from Prometheus "
            "or from a sidecar's /metrics."
        ),
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--prometheus.url",
        dest="prometheus_url",
        metavar="URL",
        help="evaluate the catalogue through this Prometheus's HTTP API",
    )
    where.add_argument(
        "--target",
        metavar="URL",
        help="sample this sidecar's /metrics and compute the signals here (no Prometheus)",
    )
    parser.add_argument(
        "--duration", default="60s", help="--target: how long to sample (default 60s)"
    )
    parser.add_argument(
        "--interval", default="5s", help="--target: time between samples (default 5s)"
    )
    parser.add_argument("--config", type=Path, help="site config of the rule pack (YAML)")
    parser.add_argument(
        "--profile",
        choices=tuple(ALL_PROFILES),
        default="sidecar",
        help="profile of the pack loaded in Prometheus (default sidecar)",
    )
    parser.add_argument("--output", choices=("text", "json"), default="text")
    parser.add_argument(
        "--nearly",
        type=float,
        default=0.1,
        metavar="RATIO",
        help="'nearly holds': every failing condition within this share of its threshold "
        "(default 0.1)",
    )
    parser.add_argument(
        "--timeout", default="10s", help="deadline of each HTTP request (default 10s)"
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="also write a post-mortem: FILE.html (one self-contained page with plots) or "
        "FILE.md (plots as SVG files in FILE-plots/ beside it)",
    )
    parser.add_argument(
        "--report.range",
        dest="report_range",
        default="1h",
        help="--report with --prometheus.url: the window the plots show, up to the evaluation "
        "time (default 1h)",
    )
    parser.add_argument(
        "--time",
        metavar="TIME",
        help="--prometheus.url: evaluate at this time (RFC 3339 or Unix seconds) instead of now",
    )
    return parser


def _time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise DiagnoseError(f"--time: {text!r} is neither RFC 3339 nor Unix seconds") from None
    if when.tzinfo is None:
        raise DiagnoseError(f"--time: {text!r} needs a time zone (Z or +hh:mm)")
    return when.timestamp()


def _seconds(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise DiagnoseError(f"{flag}: {err}") from None
    if seconds <= 0:
        raise DiagnoseError(f"{flag}: must be longer than 0s")
    return seconds


def _run(args: argparse.Namespace) -> Report:
    timeout = _seconds(args.timeout, "--timeout")
    if not 0 <= args.nearly < 1 or math.isnan(args.nearly):
        raise DiagnoseError("--nearly: must be a ratio from 0 to below 1")
    try:
        cfg = load_config(args.config, args.profile)
    except SignatureConfigError as err:
        prefix = (
            f"{args.config}: " if args.config and not str(err).startswith(str(args.config)) else ""
        )
        raise DiagnoseError(f"{prefix}{err}") from None
    if args.prometheus_url is not None:
        url = args.prometheus_url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DiagnoseError(f"--prometheus.url: {url!r} is not an http(s) URL")
        at = None if args.time is None else _time(args.time)
        window = _seconds(args.report_range, "--report.range") if args.report else None
        return asyncio.run(
            diagnose_prometheus(url, cfg, timeout, args.nearly, at=at, window=window)
        )
    if args.time is not None:
        raise DiagnoseError("--time needs --prometheus.url (--target samples from now)")
    if cfg.profile.source != "sidecar":
        raise DiagnoseError(
            f"--target reads the sidecar only; profile {cfg.profile.name!r} needs --prometheus.url"
        )
    span = _seconds(args.duration, "--duration")
    interval = _seconds(args.interval, "--interval")
    url = metrics_url(args.target)
    if sys.stderr.isatty():
        sys.stderr.write(f"sampling {url} for {args.duration}...\n")
    return asyncio.run(
        diagnose_target(url, cfg, span=span, interval=interval, timeout=timeout, margin=args.nearly)
    )


def _config_text(path: Path | None) -> str | None:
    return None if path is None else path.read_text(encoding="utf-8", errors="replace")


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        if args.report is not None:
            try:
                check_path(args.report)
            except ValueError as err:
                raise DiagnoseError(str(err)) from None
        report = _run(args)
        if args.report is not None:
            try:
                write(args.report, report, report.timeline, _config_text(args.config))
            except OSError as err:
                raise DiagnoseError(
                    f"--report: cannot write {args.report}: {err.strerror}"
                ) from None
    except DiagnoseError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return EXIT_ERROR
    if args.output == "json":
        sys.stdout.write(json.dumps(as_json(report), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(as_text(report))
    return EXIT_FOUND if report.found else EXIT_NONE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
